"""The α table against WeightWatcher: time and agreement on the same model, in one run.

Times WeightWatcher 0.7.7's default ``analyze()`` (every Linear and Embedding module: for
SmolLM2-135M the 210 block matrices plus the embedding and the tied LM head), then the same
with its BLAS limited to one thread (on a busy machine multi-threaded BLAS slows down badly;
one thread is WeightWatcher's best case there, and its CPU time is comparable to ours), and
with ``--blocks-only`` also ``analyze(layers=...)`` restricted to the block matrices ``zones``
covers. ``zones.spectra.alpha_table`` (all estimators, no cache) runs before and after, so that
drifting load affects both; then spectral shape only. Matches WeightWatcher's rows to ours by
module (``matrix_module_names``) and prints the times (wall and process CPU), the ratios, and
the largest relative difference of α and the other shared columns. Also compares the two ways
of getting the spectra (Gram eigenvalues vs ``svdvals``), both as one single-threaded job per
matrix.

Targets: ≥ 20× faster than ``analyze()``, max |Δα|/α ≤ 1e-6, spectral-shape α of
every SmolLM2-135M matrix in < 2 s.

    .venv/bin/python benchmarks/bench_spectra.py [--model smollm2-135m] [--repeats 3] [--blocks-only]
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from zones import spectra
from zones.core.adapters import get_adapter
from zones.core.models import load_model
from zones.spectra import alpha_table, matrix_module_names

SHARED = {"alpha_esd": "alpha", "xmin": "xmin", "ks_distance": "D", "n_tail": "num_pl_spikes",
          "alpha_esd_sigma": "sigma", "stable_rank": "stable_rank", "log_lambda_max": "log_spectral_norm",
          "alpha_weighted": "alpha_weighted", "entropy": "entropy"}


def timed(fn):
    """(wall seconds, result)."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def timed_cpu(fn):
    """(wall seconds, process CPU seconds, result)."""
    cpu = time.process_time()
    wall, out = timed(fn)
    return wall, time.process_time() - cpu, out


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def spectra_routes(matrices: list[torch.Tensor]) -> tuple[float, float]:
    """Seconds for all spectra by the Gram route (as alpha_table does) and by float64 svdvals,
    each as one single-threaded job per matrix on the same pool."""
    workers = torch.get_num_threads()

    def svd_job(m):
        return torch.linalg.svdvals(m.detach().double())

    gram, _ = timed(lambda: spectra.gram_eigenvalues(matrices))
    saved = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
            svd, _ = timed(lambda: list(pool.map(svd_job, matrices)))
    finally:
        torch.set_num_threads(saved)
    return gram, svd


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu", help="where the weights live (default: cpu)")
    parser.add_argument("--repeats", type=int, default=3, help="zones runs before and after WeightWatcher")
    parser.add_argument("--blocks-only", action="store_true",
                        help="also time WeightWatcher on the block matrices only")
    args = parser.parse_args()

    import weightwatcher as ww
    from threadpoolctl import threadpool_limits

    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    print(f"load average at start: {load()} on {os.cpu_count()} CPUs; torch threads {torch.get_num_threads()}")
    model = load_model(args.model, device=args.device).model
    names = matrix_module_names(model)
    matrices = [m for _, _, m in get_adapter(model).iter_matrices()]
    alpha_table(model, cache=False)  # warm up (imports, allocator)

    def ours(estimators=None):
        return timed_cpu(lambda: alpha_table(model, cache=False, estimators=estimators))

    runs = [ours()[:2] for _ in range(args.repeats)]
    t_ww, c_ww, details = timed_cpu(lambda: ww.WeightWatcher(model=model).analyze())
    with threadpool_limits(1, user_api="blas"):
        t_ww1, c_ww1, _ = timed_cpu(lambda: ww.WeightWatcher(model=model).analyze())
    t_ww_blocks = None
    if args.blocks_only:
        by_name = details.set_index("longname")["layer_id"]
        ids = [int(by_name[m]) for m in names["module"].dropna()]
        t_ww_blocks, _ = timed(lambda: ww.WeightWatcher(model=model).analyze(layers=ids))
    runs += [ours()[:2] for _ in range(args.repeats - 1)]
    t_table, c_table, table = ours()
    runs.append((t_table, c_table))
    shape_times = [ours(["shape"])[0] for _ in range(args.repeats)]
    t_gram, t_svd = spectra_routes(matrices)

    matched = table.assign(module=names["module"]).dropna(subset=["module"])
    theirs = details.set_index("longname").loc[matched["module"]]
    wall = statistics.median(t for t, _ in runs)
    cpu = statistics.median(c for _, c in runs)
    print(f"model {args.model}: {len(table)} block matrices in the zones table; WeightWatcher analyze() "
          f"rows: {len(details)}; compared: {len(matched)}")
    print(f"{'':40s}{'wall s':>9s}{'CPU s':>9s}")
    print(f"{'WeightWatcher analyze()':40s}{t_ww:9.2f}{c_ww:9.2f}")
    print(f"{'WeightWatcher analyze(), 1 BLAS thread':40s}{t_ww1:9.2f}{c_ww1:9.2f}")
    if t_ww_blocks is not None:
        print(f"{'WeightWatcher analyze(block matrices)':40s}{t_ww_blocks:9.2f}")
    print(f"{'zones alpha_table, all estimators':40s}{wall:9.2f}{cpu:9.2f}  (medians of {len(runs)}; wall: "
          f"{', '.join(f'{t:.2f}' for t, _ in runs)})")
    print(f"{'zones alpha_table, spectral shape only':40s}{statistics.median(shape_times):9.2f}"
          f"{'':9s}  (median of {len(shape_times)}; target < 2 s)")
    print(f"speed-up vs analyze(), wall              {t_ww / wall:8.1f}x  (target >= 20x)")
    print(f"speed-up vs analyze() 1 thread, wall     {t_ww1 / wall:8.1f}x")
    print(f"speed-up vs analyze() 1 thread, CPU      {c_ww1 / cpu:8.1f}x  (less sensitive to load)")
    if t_ww_blocks is not None:
        print(f"speed-up vs analyze(block matrices)      {t_ww_blocks / wall:8.1f}x")
    print(f"spectra: Gram eigvalsh {t_gram:.2f} s vs svdvals {t_svd:.2f} s ({t_svd / t_gram:.1f}x), "
          f"one single-threaded job per matrix")
    for col, ww_col in SHARED.items():
        a, b = matched[col].to_numpy(float), theirs[ww_col].to_numpy(float)
        rel = np.abs(a - b) / np.abs(b)
        label = "max |Δα|/α (alpha_esd)" if col == "alpha_esd" else f"max relative Δ {col}"
        print(f"{label:40s}{rel.max():10.2e}" + ("  (target <= 1e-6)" if col == "alpha_esd" else ""))
    q = table[table["role"] == "q"].sort_values("layer")["alpha_shape"]
    print(f"Q-projection spectral-shape α: first block {q.iloc[0]:.4f}, last block {q.iloc[-1]:.4f}")
    print(f"load average at end: {load()}")


if __name__ == "__main__":
    main()
