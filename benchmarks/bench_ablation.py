"""Single-block ablation sweep: prefix reuse against one full forward per ablation.

The sweeps score the same windows of the same model in one run, without the cache,
alternating batch by batch so that a drifting machine load affects them alike:

* ``naive``: ``ablation_table(ablation_method="naive")``, one full forward per ablation scored as
  ``zones.measure.scoring.evaluate_loss`` does (the model's body, then the LM head in chunks);
* ``prefix``: ``ablation_table(ablation_method="prefix")``, the shared prefix reused, the LM head
  applied in chunks with a log-sum-exp;
* ``naive, chunked head`` (with ``--breakdown``): the same written out by hand (since
  ``evaluate_loss`` adopted the chunked head, it equals ``naive``; kept as a check).

Prints the times, the ratios (target: prefix ≤ 0.6 × naive) and the largest difference in
ΔLoss. Blocks alone bound the ratio by (L + L(L−1)/2) / (L + L(L−1)) ≈ 0.52 for L = 30; the LM
head, evaluated once per ablation by every sweep, raises the bound (for SmolLM2-135M, whose
head is about a fifth of a forward, to about 0.62 at equal head cost).

    .venv/bin/python benchmarks/bench_ablation.py [--model smollm2-135m] [--tokens 1020] [--threads 1]

Wall time is what a user waits; on a machine shared with other work it drifts with the load.
CPU time with ``--threads 1`` counts only this process's work and is the steadier comparison
there (with several threads, a thread waiting for a busy core still burns CPU time).
"""
from __future__ import annotations

import argparse
import os
import time
from contextlib import nullcontext

import pandas as pd
import torch

from zones.core.adapters import get_adapter
from zones.core.data import Windows, corpus_windows
from zones.core.models import load_model
from zones.measure.ablation import ablation_table
from zones.measure.blocks import skip_blocks
from zones.measure.scoring import head_nll_windows


def naive_chunked_head(model, windows: Windows, batch_size: int) -> pd.DataFrame:
    """One full forward per ablation, scored with the prefix sweep's chunked head."""
    adapter = get_adapter(model)
    device = next(model.parameters()).device
    removals = [None, *range(adapter.n_blocks)]
    sums = dict.fromkeys(removals, 0.0)
    n_tokens = 0
    for ids in windows.input_ids.split(batch_size):
        ids = ids.to(device)
        n_tokens += ids[:, 1:].numel()
        for layer in removals:
            with (nullcontext() if layer is None else skip_blocks(model, [layer])), torch.inference_mode():
                hidden = model.base_model(input_ids=ids, use_cache=False).last_hidden_state
                sums[layer] += float(head_nll_windows(adapter, hidden, ids, normed=True).sum())
    base = sums[None] / n_tokens
    loss = [sums[i] / n_tokens for i in range(adapter.n_blocks)]
    return pd.DataFrame(dict(layer=range(adapter.n_blocks), loss=loss, base_loss=base, n_tokens=n_tokens,
                             delta_loss=[value - base for value in loss]))


def combine(tables: list[pd.DataFrame]) -> pd.DataFrame:
    """Per-batch ablation tables -> one, weighting each batch's losses by its tokens."""
    frame = pd.concat(tables)
    for column in ("loss", "base_loss"):
        frame[column] = frame[column] * frame["n_tokens"]
    sums = frame.groupby("layer")[["loss", "base_loss", "n_tokens"]].sum()
    out = sums[["loss", "base_loss"]].div(sums["n_tokens"], axis=0)
    out["delta_loss"] = out["loss"] - out["base_loss"]
    return out.reset_index()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib")
    parser.add_argument("--tokens", type=int, default=1020, help="scored tokens (default: 4 windows of 256)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads; 1 makes CPU time a fair measure on a busy machine")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time a naive sweep with the chunked head (a third sweep)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    loaded = load_model(args.model, device=args.device)
    model = loaded.model
    windows = corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "eval", args.tokens)
    with torch.inference_mode():  # warm up kernels and allocator before any timing
        model(input_ids=windows.input_ids[:1].to(next(model.parameters()).device), use_cache=False)

    sweeps = {
        "naive": lambda w: ablation_table(model, w, ablation_method="naive", batch_size=args.batch_size,
                                          cache=False, progress=False),
        "prefix": lambda w: ablation_table(model, w, ablation_method="prefix", batch_size=args.batch_size,
                                           cache=False, progress=False),
    }
    if args.breakdown:
        sweeps["naive, chunked head"] = lambda w: naive_chunked_head(model, w, args.batch_size)
    wall = dict.fromkeys(sweeps, 0.0)
    cpu = dict.fromkeys(sweeps, 0.0)
    tables = {name: [] for name in sweeps}
    load_before = os.getloadavg()[0]
    names = list(sweeps)
    for g, ids in enumerate(windows.input_ids.split(args.batch_size)):
        part = Windows(ids, windows.corpus, windows.split, f"{windows.fingerprint}:{g}")
        for name in names[g % len(names):] + names[:g % len(names)]:  # rotate who goes first
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start, cpu_start = time.perf_counter(), time.process_time()
            tables[name].append(sweeps[name](part))
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            wall[name] += time.perf_counter() - start
            cpu[name] += time.process_time() - cpu_start
    results = {name: combine(t) for name, t in tables.items()}

    print(f"model {args.model} ({len(results['naive'])} blocks), {windows.n_windows} windows x "
          f"{windows.seq_len} tokens = {windows.n_scored_tokens} scored tokens, batch {args.batch_size}, "
          f"device {next(model.parameters()).device}, torch threads {torch.get_num_threads()}")
    print(f"{'':38s} {'wall time':>10s} {'CPU time':>10s}")
    for name in sweeps:
        print(f"{name:38s} {wall[name]:8.1f} s {cpu[name]:8.1f} s")
    for name in sweeps:
        if name != "prefix":
            print(f"{'ratio prefix / ' + name:38s} {wall['prefix'] / wall[name]:10.3f} "
                  f"{cpu['prefix'] / cpu[name]:10.3f}   (target <= 0.6 against naive)")
    for name in sweeps:
        if name != "prefix":
            diff = float((results[name]["delta_loss"] - results["prefix"]["delta_loss"]).abs().max())
            print(f"{'max |ΔLoss ' + name + ' - prefix|':38s} {diff:10.2e} nats")
    print(f"load average (1 min) before / after: {load_before:.1f} / {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
