"""The book's time budget on this machine: each chapter cold, and a reference forward to compare machines.

Each chapter (``_toc.yml`` order, ``zones.book.execution_order``; ``--only`` picks some) is
executed with its default parameters through ``zones.book.run_notebook`` into a temporary
folder, with a temporary, empty ``ZONES_CACHE`` shared by the chapters of the run (so the
first chapter pays the model's conversion, as in a cold ``make book``). The same run times a
reference forward: SmolLM2-135M (the default model) on 2,048 tokens (8 windows of 256) in
float32, before and after the chapters, so a chapter's time divided by the reference is
comparable across machines and loads. It prints the CPU (model name, PyTorch's dispatch
capability ``zones.core.hardware.cpu_capability``, native bf16), the threads, and per chapter the
seconds, the ratio to the reference and the budget (``zones.book.EXPECTED_SECONDS``).

``--head`` instead measures the LM head's token chunk (``zones.measure.evaluate.HEAD_CHUNK``): per-window
NLL of one batch through ``head_nll_windows`` with each chunk size, interleaved, with the largest
difference from the first size (the chunks change only which tokens share a call, not the numbers).

    .venv/bin/python benchmarks/bench_book.py --only pruning,layer_ablation
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/bench_book.py --only pruning
    .venv/bin/python benchmarks/bench_book.py --head 2048,512

``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an AVX-512 machine run the AVX2
kernels (the other machine kind the book must fit); the capability line shows which ran.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from zones.book import EXPECTED_SECONDS, chapter_source, chapters, execution_order, project_root, run_notebook
from zones.core.adapters import get_adapter
from zones.core.data import corpus_windows, load_corpus
from zones.core.hardware import cpu_capability, native_bf16
from zones.core.models import DEFAULT_MODEL, load_model
from zones.figures import BOOK_MODE_ENV
from zones.measure import evaluate
from zones.measure.blocks import BlockTrace

REFERENCE_TOKENS = 2048
SEQ_LEN = 256


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return "unknown CPU"


def reference_windows(loaded):
    tokens = SEQ_LEN * (REFERENCE_TOKENS // SEQ_LEN) - REFERENCE_TOKENS // SEQ_LEN
    return corpus_windows(load_corpus("stdlib"), loaded.tokenizer, SEQ_LEN, "eval", tokens)


def reference_forward(loaded, windows, repeats: int = 3) -> float:
    """Median seconds of one float32 forward (body and LM head) of 2,048 tokens."""
    ids = windows.input_ids[:REFERENCE_TOKENS // SEQ_LEN]
    times = []
    with torch.inference_mode():
        loaded.model(input_ids=ids, use_cache=False)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            loaded.model(input_ids=ids, use_cache=False)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine_line() -> str:
    return (f"CPU: {cpu_name()}; PyTorch capability {cpu_capability()}; native bf16: {native_bf16('cpu')}; "
            f"threads {torch.get_num_threads()}; torch {torch.__version__}")


def time_chapters(names: list[str], root: Path) -> dict[str, float]:
    seconds = {}
    quiet = {BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    os.environ.update(quiet)  # as zones.book.execute_chapter runs them (inherited by the kernel)
    with tempfile.TemporaryDirectory(prefix="zones-bench-book-") as tmp:
        for name in names:
            target = Path(tmp) / f"{name}.ipynb"
            print(f"executing {name} ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            run_notebook(chapter_source(root, name), target, cwd=Path(tmp))
            seconds[name] = time.perf_counter() - start
            print(f"  {name}: {seconds[name]:.0f} s", file=sys.stderr, flush=True)
    return seconds


def bench_head(chunks: list[int], repeats: int) -> None:
    loaded = load_model(DEFAULT_MODEL)
    windows = reference_windows(loaded)
    ids = windows.input_ids[:REFERENCE_TOKENS // SEQ_LEN]
    adapter = get_adapter(loaded.model)
    saved = evaluate.HEAD_CHUNK
    times = {c: [] for c in chunks}
    results = {}
    with torch.inference_mode():
        hidden = BlockTrace(loaded.model, ids).final_hidden
        try:
            for _ in range(repeats + 1):  # the first round warms up
                for chunk in chunks:
                    evaluate.HEAD_CHUNK = chunk
                    start = time.perf_counter()
                    results[chunk] = evaluate.head_nll_windows(adapter, hidden, ids)
                    times[chunk].append(time.perf_counter() - start)
        finally:
            evaluate.HEAD_CHUNK = saved
    print(machine_line())
    print(f"LM head + log-sum-exp of {ids.numel() - ids.shape[0]} tokens ({DEFAULT_MODEL}), median of {repeats}:")
    first = chunks[0]
    for chunk in chunks:
        t = statistics.median(times[chunk][1:])
        diff = float(abs(results[chunk] - results[first]).max())
        print(f"  HEAD_CHUNK {chunk:5d}: {t:6.3f} s  ({t / statistics.median(times[first][1:]):.2f} x chunk {first}); "
              f"largest per-window NLL difference {diff:.3g}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated chapters (default: every chapter)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    parser.add_argument("--head", default=None, help="compare LM-head chunk sizes instead, e.g. 2048,512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.head:
        bench_head([int(c) for c in args.head.split(",")], args.repeats)
        return
    root = project_root()
    names = execution_order(chapters(root))
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise SystemExit(f"bench_book: unknown chapter(s) {unknown}; the book has {names}")
        names = [n for n in names if n in wanted]
    os.environ["ZONES_CACHE"] = tempfile.mkdtemp(prefix="zones-bench-cache-")  # cold, for every chapter
    print(machine_line(), flush=True)
    seconds = time_chapters(names, root)
    loaded = load_model(DEFAULT_MODEL)  # converted by the chapters already, in the same cold cache
    windows = reference_windows(loaded)
    reference = reference_forward(loaded, windows)
    print(f"reference: {DEFAULT_MODEL} float32 forward of {REFERENCE_TOKENS} tokens: {reference:.3f} s")
    print(f"{'chapter':22s} {'seconds':>8s} {'/ reference':>12s} {'budget s':>9s}")
    for name, s in seconds.items():
        budget = EXPECTED_SECONDS.get(name)
        flag = "" if budget is None or s <= budget else "  over budget"
        print(f"{name:22s} {s:8.0f} {s / reference:12.1f} {budget if budget is not None else '-':>9}{flag}")
    print(f"{'total':22s} {sum(seconds.values()):8.0f} {sum(seconds.values()) / reference:12.1f}")


if __name__ == "__main__":
    main()
