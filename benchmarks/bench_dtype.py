"""Scoring precision: float32 against bfloat16 ablation tables on the same windows.

One run, one model, the same eval windows: the single-block ablation sweep
(``zones.measure.ablation.ablation_table``, prefix reuse, no cache) in float32 and with the blocks
under bfloat16 autocast (``dtype="bfloat16"``; the final norm, LM head and NLL stay in
float32/float64). Prints, for each precision, the sweep's time and its throughput in scored
token-forwards per second (blocks + 1 forwards of the eval tokens), then

* the largest |ΔLoss(bfloat16) − ΔLoss(float32)| over blocks (nats),
* the Spearman ρ of the two block orderings (by ΔLoss),
* the float32 table's 95% bootstrap half-width of ΔLoss (median and smallest over blocks),

and the rule the chapters follow: bfloat16 may be their default only if ρ ≥ 0.99 and the
largest difference is at most a quarter of the median half-width ("well inside").

    .venv/bin/python benchmarks/bench_dtype.py [--model smollm2-135m] [--eval-tokens 2040] [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import time

import torch
from scipy.stats import spearmanr

from zones.core.data import corpus_windows
from zones.core.models import load_model
from zones.measure.ablation import ablation_table

RHO_MIN = 0.99
WELL_INSIDE = 0.25  # largest |difference| ≤ this fraction of the median half-width


def adopt_bfloat16(rho: float, largest_difference: float, median_half_width: float) -> bool:
    """The chapters' rule for defaulting to bfloat16 scoring."""
    return bool(rho >= RHO_MIN and largest_difference <= WELL_INSIDE * median_half_width)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="stdlib")
    parser.add_argument("--eval-tokens", type=int, default=2040, help="scored tokens (default: 8 windows of 256)")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    loaded = load_model(args.model)
    windows = corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "eval", args.eval_tokens)
    print(f"model {args.model}, {windows.n_windows} windows of {args.seq_len} ({windows.n_scored_tokens} scored "
          f"tokens), {args.threads} threads, load average {os.getloadavg()[0]:.1f}")
    tables, seconds, cpu = {}, {}, {}
    for dtype in ("float32", "bfloat16"):
        start, start_cpu = time.perf_counter(), time.process_time()
        tables[dtype] = ablation_table(loaded.model, windows, batch_size=args.batch_size, cache=False,
                                       progress=False, dtype=dtype)
        seconds[dtype], cpu[dtype] = time.perf_counter() - start, time.process_time() - start_cpu
    n_blocks = len(tables["float32"])
    forwards = (n_blocks + 1) * windows.n_scored_tokens
    for dtype in tables:
        print(f"{dtype:>9}: {seconds[dtype]:7.1f} s wall ({cpu[dtype]:7.1f} s CPU), "
              f"{forwards / seconds[dtype]:7.0f} token-forwards/s, "
              f"base loss {tables[dtype]['base_loss'].iloc[0]:.5f}")
    fp32, bf16 = tables["float32"], tables["bfloat16"]
    difference = (bf16["delta_loss"] - fp32["delta_loss"]).abs()
    rho = float(spearmanr(fp32["delta_loss"], bf16["delta_loss"])[0])
    half = (fp32["delta_loss_high"] - fp32["delta_loss_low"]) / 2
    print(f"speed-up bfloat16 / float32: {seconds['float32'] / seconds['bfloat16']:.2f}x wall, "
          f"{cpu['float32'] / cpu['bfloat16']:.2f}x CPU time; load average now {os.getloadavg()[0]:.1f}")
    print(f"largest |ΔLoss difference|: {difference.max():.5f} nats (block {int(fp32['layer'][difference.idxmax()])}); "
          f"base loss moved {abs(bf16['base_loss'].iloc[0] - fp32['base_loss'].iloc[0]):.5f}")
    print(f"Spearman ρ of the block orderings: {rho:.4f}")
    print(f"float32 95% half-width of ΔLoss: median {half.median():.5f}, smallest {half.min():.5f} nats")
    relative = difference / half
    print(f"largest |difference| / the block's own half-width: {relative.max():.3f} "
          f"(block {int(fp32['layer'][relative.idxmax()])})")
    verdict = adopt_bfloat16(rho, float(difference.max()), float(half.median()))
    print(f"bfloat16 holds (ρ ≥ {RHO_MIN} and largest difference ≤ {WELL_INSIDE} × median half-width): "
          f"{'yes' if verdict else 'no'}")


if __name__ == "__main__":
    main()
