"""Budgets by measured precision: how the 95% interval half-widths shrink with eval tokens,
and what a scored token costs, for the ablation sweep and the pruning comparison.

On one model (default SmolLM2-135M), in one run, without the cache:

* the single-block ablation sweep on ``--ablation-tokens`` eval tokens; from its per-window
  table, the median over blocks of the ΔLoss half-width when only 1/4, 1/2 or all of the
  windows are kept (nested, evenly spaced subsets, same resampling as the chapters);
* the pruning comparison of ``--strategies`` for k = 1..max(--k) on ``--pruning-tokens``
  eval tokens; the half-width of Δloss = ln(PPL_pruned / PPL_base) of each strategy at each
  k in ``--k``, for the same subsets of windows;
* seconds per scored eval token of each sweep (wall and CPU), and the prefix-tree work of the
  default strategies' removal sets with 5 and with 20 seeds of the random strategies.

Half-widths fall roughly as 1/√tokens; the last table extrapolates the tokens a target
half-width needs at the measured rate. Prints the machine's load: on a shared machine wall
times drift with it.

    .venv/bin/python benchmarks/bench_precision.py [--ablation-tokens 2040] [--pruning-tokens 2040]
"""
from __future__ import annotations

import argparse
import math
import os
import time

import numpy as np
import pandas as pd
import torch

from zones import pruning
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import load_model
from zones.measure import ablation
from zones.measure.scoring import prefix_tree_work
from zones.pruning import STRATEGIES, PruningContext
from zones.spectra import alpha_table


def subsets(n_windows: int) -> list[list[int]]:
    """Nested, evenly spaced subsets of the windows: a quarter, a half, all."""
    sizes = sorted({max(2, n_windows // 4), max(2, n_windows // 2), n_windows})
    return [np.unique(np.linspace(0, n_windows - 1, size).round().astype(int)).tolist() for size in sizes]


def timed(function):
    start, start_cpu = time.perf_counter(), time.process_time()
    result = function()
    return result, time.perf_counter() - start, time.process_time() - start_cpu


def seed_work(n_blocks: int, k_max: int, seeds: int) -> dict:
    """Prefix-tree work of the data-free default strategies' removal sets (plus the random ones)."""
    ctx = PruningContext.__new__(PruningContext)
    ctx.n_blocks = n_blocks
    sets = set()
    for name in ("last_n", "last_n_keep_last", "random", "random_protected"):
        strategy = STRATEGIES[name]
        for seed in (range(seeds) if strategy.seeded else [0]):
            sets.update(tuple(sorted(p)) for p in strategy.plan(ctx, k_max, seed))
    return dict(prefix_tree_work(sorted(sets), n_blocks), sets=len(sets))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--ablation-tokens", type=int, default=2040)
    parser.add_argument("--pruning-tokens", type=int, default=2040)
    parser.add_argument("--strategies", default="zone_aware,last_n_keep_last,alpha_lowest")
    parser.add_argument("--k", default="2,4,8")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.k.split(",")]
    names = args.strategies.split(",")

    loaded = load_model(args.model)
    text = load_corpus(args.corpus)
    print(f"model {args.model}, seq_len {args.seq_len}, {args.threads} threads, dtype {args.dtype}, "
          f"load average {os.getloadavg()[0]:.1f} at the start")

    ab_windows = corpus_windows(text, loaded.tokenizer, args.seq_len, "eval", args.ablation_tokens)
    long, ab_wall, ab_cpu = timed(lambda: ablation.ablation_window_losses(
        loaded.model, ab_windows, batch_size=args.batch_size, cache=False, progress=False, dtype=args.dtype))
    rows = []
    for subset in subsets(ab_windows.n_windows):
        table = ablation.summarize(long[long["window"].isin(subset)])
        half = (table["delta_loss_high"] - table["delta_loss_low"]) / 2
        rows.append(dict(sweep="ablation ΔLoss (median over blocks)", k="", tokens=int(table["n_tokens"].iloc[0]),
                         half_width=float(half.median())))

    pr_windows = corpus_windows(text, loaded.tokenizer, args.seq_len, "eval", args.pruning_tokens)
    alpha = alpha_table(loaded.model)
    result, pr_wall, pr_cpu = timed(lambda: pruning.pruning_sweep(
        loaded.model, pr_windows, strategies=names, k_max=max(ks), alpha=alpha, batch_size=args.batch_size,
        cache=False, progress=False, dtype=args.dtype))
    n_sets = result.window_losses["removed"].nunique()
    for subset in subsets(pr_windows.n_windows):
        part = result.window_losses[result.window_losses["window"].isin(subset)]
        summary = pruning.summarize_pruning(result.table, part)
        for k in ks:
            for name in names:
                row = summary[(summary["strategy"] == name) & (summary["k"] == k)].iloc[0]
                rows.append(dict(sweep=f"pruning Δloss {name}", k=k, tokens=len(subset) * (args.seq_len - 1),
                                 half_width=float((row["delta_loss_high"] - row["delta_loss_low"]) / 2)))
    table = pd.DataFrame(rows)
    pd.set_option("display.width", 160)
    print("\n95% half-widths (nats) by scored eval tokens")
    print(table.pivot_table(index=["sweep", "k"], columns="tokens", values="half_width", sort=False)
          .round(4).to_string())

    top = table[table["tokens"] == table.groupby("sweep")["tokens"].transform("max")]
    print("\nextrapolated at 1/√tokens: eval tokens for a target half-width")
    out = []
    for _, row in top.iterrows():
        c = row.half_width * math.sqrt(row.tokens)
        out.append(dict(sweep=row.sweep, k=row.k, **{f"for {t} nats": int(round((c / t) ** 2, -1))
                                                      for t in (0.02, 0.01, 0.005)}))
    print(pd.DataFrame(out).to_string(index=False))

    n_blocks = len(long["layer"].unique())
    print("\ncost per scored eval token")
    print(f"  ablation sweep ({n_blocks} blocks, {ab_windows.n_scored_tokens} tokens): "
          f"{ab_wall / ab_windows.n_scored_tokens * 1e3:.1f} ms wall, {ab_cpu / ab_windows.n_scored_tokens * 1e3:.1f} ms "
          f"CPU ({ab_wall:.0f} s)")
    print(f"  pruning comparison ({', '.join(names)}, k ≤ {max(ks)}: {n_sets} removal sets, "
          f"{pr_windows.n_scored_tokens} tokens): {pr_wall / pr_windows.n_scored_tokens * 1e3:.1f} ms wall, "
          f"{pr_cpu / pr_windows.n_scored_tokens * 1e3:.1f} ms CPU ({pr_wall:.0f} s; "
          f"{pr_wall / n_sets / pr_windows.n_scored_tokens * 1e3:.2f} ms per set and token)")
    print("\nseeds of the random strategies (last_n, last_n_keep_last, random, random_protected; k ≤ 8), "
          "prefix-tree work per batch in full-model forwards")
    for seeds in (5, 20):
        work = seed_work(n_blocks, min(8, n_blocks - 2), seeds)
        print(f"  {seeds:>2} seeds: {work['sets']} removal sets, {work['tree']:.1f} forwards of blocks "
              f"(naive {work['naive']:.1f}) + {work['heads']} LM heads")
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
