"""Scoring precision: float32 against bfloat16 on the same windows, for the chapters that score.

One run, one model, the same eval windows (the chapters' own, read from and kept in the per-window
loss store, so a later book build reuses every forward pass this bench makes). For each part:

* ``ablation``: the single-block ablation (``zones.measure.ablation.ablation_table``), one row
  per block;
* ``pruning``: every removal set the pruning chapter scores (its strategies planned in float32 on
  its calibration windows; whether bfloat16 planning picks the same sets is printed too), one row
  per set: Δloss against the full model on the same windows;
* ``healing``: every set of the healing chapter, pruned and healed (the healing itself runs in
  float32), one row per (stage, set).

For each part it prints ρ (Spearman) of the two orderings by ΔLoss and, per row, |ΔLoss(bf16) −
ΔLoss(fp32)| against that row's own float32 95% paired-interval half-width. The rule
(:func:`adopt_bfloat16`): a chapter may score in bfloat16 only if ρ ≥ 0.99 and every row's
difference is at most a tenth of its own half-width (the change of precision moves no estimate by
more than a tenth of its uncertainty). ``--speed`` also times one batch's ablation in each
precision, interleaved, in process CPU time.

    .venv/bin/python benchmarks/bench_dtype.py [--parts ablation,pruning,healing] [--speed]
    .venv/bin/python benchmarks/bench_dtype.py --model RUN_DIR --device cuda --seq-len 128 --parts ablation,pruning
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd
import torch
from scipy.stats import spearmanr

from zones.core.data import corpus_windows, load_corpus
from zones.core.hardware import native_bf16
from zones.core.models import load_model
from zones.measure.ablation import DEFAULT_EVAL_TOKENS, ablation_table
from zones.measure.bootstrap import delta_loss_interval
from zones.measure.scoring import evaluate_loss, score_windows
from zones.measure.subject import as_subject

RHO_MIN = 0.99
SHARE_OF_HALF_WIDTH = 0.1  # every |difference| ≤ this fraction of the row's own half-width


def adopt_bfloat16(rho: float, differences, half_widths) -> bool:
    """The chapters' rule for scoring in bfloat16: ρ of the orderings ≥ 0.99 and every row's
    |ΔLoss difference| ≤ a tenth of that row's own float32 interval half-width."""
    differences, half_widths = np.abs(np.asarray(differences, float)), np.asarray(half_widths, float)
    return bool(rho >= RHO_MIN and np.all(differences <= SHARE_OF_HALF_WIDTH * half_widths))


def deltas(nll: np.ndarray, tokens: np.ndarray) -> pd.DataFrame:
    """ΔLoss of each row of ``nll`` (rows 1.. against row 0) with its 95% paired interval."""
    iv = delta_loss_interval(nll[1:], nll[0], tokens)
    return pd.DataFrame(dict(delta=iv.estimate, half_width=(iv.high - iv.low) / 2))


def compare(name: str, labels: list[str], fp32: pd.DataFrame, bf16: pd.DataFrame) -> dict:
    difference = (bf16["delta"].to_numpy() - fp32["delta"].to_numpy())
    ratio = np.abs(difference) / fp32["half_width"].to_numpy()
    rho = float(spearmanr(fp32["delta"], bf16["delta"])[0]) if len(fp32) > 2 else float("nan")
    worst = int(np.nanargmax(ratio))
    verdict = adopt_bfloat16(rho, difference, fp32["half_width"])
    print(f"{name}: {len(labels)} rows; ρ of the orderings {rho:.4f}; largest |ΔLoss difference| "
          f"{np.abs(difference).max():.5f} nats; largest |difference| / own half-width {ratio[worst]:.3f} "
          f"({labels[worst]}: Δ {fp32['delta'].iloc[worst]:.4f} ± {fp32['half_width'].iloc[worst]:.4f}); "
          f"rows above a tenth: {int((ratio > SHARE_OF_HALF_WIDTH).sum())}; half-widths median "
          f"{fp32['half_width'].median():.4f}, smallest {fp32['half_width'].min():.4f} → bfloat16 "
          f"{'agrees' if verdict else 'does not agree'}", flush=True)
    return dict(part=name, rows=len(labels), rho=rho, largest_difference=float(np.abs(difference).max()),
                largest_ratio=float(ratio[worst]), worst=labels[worst], adopt=verdict)


def bench_ablation(loaded, windows, batch_size: int) -> dict:
    tables = {d: ablation_table(loaded.model, windows, batch_size=batch_size, progress=False, dtype=d)
              for d in ("float32", "bfloat16")}
    frames = {d: t.rename(columns={"delta_loss": "delta"}).assign(
        half_width=(t["delta_loss_high"] - t["delta_loss_low"]) / 2) for d, t in tables.items()}
    return compare("ablation", [f"block {b}" for b in tables["float32"]["layer"]], frames["float32"],
                   frames["bfloat16"])


def pruning_sets(loaded, text, dtype: str, seq_len: int = 256):
    from zones.pruning import (
        DEFAULT_CALIBRATION_TOKENS,
        DEFAULT_SEEDS,
        RECIPE_ABLATIONS,
        PruningContext,
        get_strategy,
        plan_strategies,
    )
    from zones.pruning import DEFAULT_STRATEGIES as STRATEGIES
    from zones.spectra import alpha_table

    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", DEFAULT_CALIBRATION_TOKENS)
    ctx = PruningContext(loaded.model, calibration, alpha=alpha_table(loaded.model), progress=False, dtype=dtype)
    k_max = min(8, min(s.max_k(ctx.n_blocks) for s in map(get_strategy, STRATEGIES + RECIPE_ABLATIONS)))
    plans = plan_strategies(ctx, list(STRATEGIES + RECIPE_ABLATIONS), k_max, DEFAULT_SEEDS)
    return plans.assign(set=[",".join(map(str, sorted(int(b) for b in r.split(",")))) for r in plans["removed"]])


def bench_pruning(loaded, text, windows, batch_size: int) -> dict:
    plans = {d: pruning_sets(loaded, text, d, windows.seq_len) for d in ("float32", "bfloat16")}
    same = (plans["float32"]["set"].to_numpy() == plans["bfloat16"]["set"].to_numpy())
    print(f"pruning: bfloat16 planning picks the float32 sets for {int(same.sum())} of {len(same)} "
          f"(strategy, seed, k); differing: "
          f"{sorted(set(plans['float32'].loc[~same, 'strategy']))}", flush=True)
    sets = sorted(set(plans["float32"]["set"]))
    tokens = np.full(windows.n_windows, windows.seq_len - 1)
    frames = {d: deltas(score_windows(loaded.model, windows, [""] + sets, batch_size=batch_size, dtype=d,
                                      cache=True, progress=False)["nll"], tokens)
              for d in ("float32", "bfloat16")}
    return compare("pruning", sets, frames["float32"], frames["bfloat16"])


def bench_healing(loaded, text, windows, batch_size: int) -> dict:
    from zones.pruning import DEFAULT_CALIBRATION_TOKENS, PruningContext, plan_arms
    from zones.pruning.heal import heal
    from zones.report.healing import DEFAULT_HEAL_TOKENS, DEFAULT_K, DEFAULT_SEEDS
    from zones.report.healing import DEFAULT_STRATEGIES as STRATEGIES
    from zones.spectra import alpha_table

    calibration = corpus_windows(text, loaded.tokenizer, windows.seq_len, "calibration", DEFAULT_CALIBRATION_TOKENS)
    heal_windows = corpus_windows(text, loaded.tokenizer, windows.seq_len, "calibration", DEFAULT_HEAL_TOKENS)
    ctx = PruningContext(loaded.model, calibration, alpha=alpha_table(loaded.model), progress=False)
    arms = plan_arms(ctx, STRATEGIES, [k for k in DEFAULT_K if k <= ctx.n_blocks - 2], DEFAULT_SEEDS)
    sets = sorted({",".join(map(str, sorted(int(b) for b in r.split(",")))) for r in arms["removed"]})
    tokens = np.full(windows.n_windows, windows.seq_len - 1)
    rows, labels = {d: [] for d in ("float32", "bfloat16")}, []
    for d in rows:
        rows[d] = list(score_windows(loaded.model, windows, [""] + sets, batch_size=batch_size, dtype=d, cache=True,
                                     progress=False)["nll"])
    labels = [f"pruned {s}" for s in sets]
    for s in sets:
        healed = heal(loaded.model, [int(b) for b in s.split(",")], heal_windows, method="bridge",
                      tokens=DEFAULT_HEAL_TOKENS, progress=False, fingerprint=loaded.fingerprint)
        for d in rows:
            rows[d].append(evaluate_loss(healed.model, windows, batch_size, dtype=d, cache=True).window_nll)
        labels.append(f"healed {s}")
    frames = {d: deltas(np.stack(v), tokens) for d, v in rows.items()}
    return compare("healing", labels, frames["float32"], frames["bfloat16"])


def bench_speed(loaded, windows, batch_size: int, repeats: int = 2) -> None:
    one = windows  # the first batch only, uncached, both precisions interleaved
    ids = one.input_ids[:batch_size]
    from zones.core.data import Windows

    batch = Windows(ids, one.corpus, one.split, one.fingerprint + "-first-batch")
    cpu = {d: [] for d in ("float32", "bfloat16")}
    for _ in range(repeats):
        for d in cpu:
            start = time.process_time()
            ablation_table(loaded.model, batch, batch_size=batch_size, cache=False, progress=False, dtype=d)
            cpu[d].append(time.process_time() - start)
    f, b = min(cpu["float32"]), min(cpu["bfloat16"])
    print(f"speed (one batch's ablation, process CPU seconds, best of {repeats}): float32 {f:.1f}, "
          f"bfloat16 {b:.1f}: {f / b:.2f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib")
    parser.add_argument("--eval-tokens", type=int, default=DEFAULT_EVAL_TOKENS,
                        help="scored tokens (default: the ablation chapter's; a prefix serves the others)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--parts", default="ablation,pruning,healing")
    parser.add_argument("--speed", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--device", default="cpu", help="cpu or cuda: where both precisions run")
    parser.add_argument("--seq-len", type=int, default=256, help="window length (a small trained model: its positions)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if not native_bf16(args.device):
        raise SystemExit(f"bench_dtype: {args.device} has no native bf16; there is nothing to compare")
    loaded = load_model(args.model, device=args.device)
    as_subject(loaded.model, "bfloat16")  # refuses early where bf16 is emulated
    text = load_corpus(args.corpus)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    print(f"model {args.model}, load average {os.getloadavg()[0]:.1f}", flush=True)
    results = []
    for part in parts:
        budget = dict(ablation=args.eval_tokens, pruning=None, healing=None)[part]
        if part == "pruning":
            from zones.pruning import DEFAULT_EVAL_TOKENS as budget
        if part == "healing":
            from zones.report.healing import DEFAULT_EVAL_TOKENS as budget
        windows = corpus_windows(text, loaded.tokenizer, args.seq_len, "eval", budget)
        print(f"{part}: {windows.n_windows} windows of {args.seq_len} ({windows.n_scored_tokens} scored tokens) on "
              f"{args.device}", flush=True)
        runner = dict(ablation=lambda: bench_ablation(loaded, windows, args.batch_size),
                      pruning=lambda: bench_pruning(loaded, text, windows, args.batch_size),
                      healing=lambda: bench_healing(loaded, text, windows, args.batch_size))[part]
        results.append(runner())
    if args.speed:
        bench_speed(loaded, corpus_windows(text, loaded.tokenizer, args.seq_len, "eval", args.eval_tokens),
                    args.batch_size)
    print(pd.DataFrame(results).to_string(index=False))


if __name__ == "__main__":
    main()
