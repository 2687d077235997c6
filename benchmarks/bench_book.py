"""The book's time budget on this machine: each chapter cold, in seconds and in reference forwards.

Each chapter (``_toc.yml`` order, ``zones.book.execution_order``; ``--only`` picks some) is
executed with its default parameters through ``zones.book.run_notebook`` into a temporary
folder, with a temporary, empty ``ZONES_CACHE`` shared by the chapters of the run (so the
first chapter pays the model's conversion, as in a cold ``make book``). The same run times a
reference forward — SmolLM2-135M (the default model) on 2,048 tokens (8 windows of 256) in
float32, ``zones.book.timing.reference_forward_seconds`` — before and after the chapters, so a chapter's
time divided by the reference is comparable across machines and loads. It prints the CPU
(``zones.book.timing.machine_line``: model name, PyTorch's dispatch capability, native bf16, threads),
and per chapter the seconds, the reference forwards (seconds / reference), the work the chapter
counted (``zones.core.progress``, in reference forwards: the same on every machine and under any
load), the overhead (seconds / (counted × the reference's seconds): what the count misses, 1 when
it misses nothing; :func:`chapter_table`) and its expected cost at the budget
(``zones.book.estimate.book_costs``, as ``zones book`` estimates it; a chapter that took longer is flagged
"slower than expected": an estimate of time, not the budget, which is on counted work), plus the
process CPU seconds of the chapter's kernel and its children; the total row gives the chapters'
overhead as a whole. ``--budget class`` runs the chapters with that budget's values (as ``zones book --budget``).

``--head`` instead measures the LM head's token chunk (``zones.measure.scoring.HEAD_CHUNK``) and, after a
colon, the rows its vocabulary-wide passes read at a time (``ROW_BLOCK_BYTES``, given in rows of the
model's logits; default: the library's): per-window NLL (``head_nll_windows``) and NLL, KL and
top-1 (``head_metrics``, of block 3 removed against the full model) of one batch with each setting,
interleaved, with the largest difference from the first setting (chunks and row blocks change only which tokens share a call, not the numbers).

    .venv/bin/python benchmarks/bench_book.py --only pruning,layer_ablation
    .venv/bin/python benchmarks/bench_book.py --only alpha_profile --budget class
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 .venv/bin/python benchmarks/bench_book.py --only pruning
    .venv/bin/python benchmarks/bench_book.py --head 2048,512
    .venv/bin/python benchmarks/bench_book.py --head 512:512,512:16
    .venv/bin/python benchmarks/bench_book.py --cache DIR   # a warm cache instead: what a rebuild costs

``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` makes an AVX-512 machine run the AVX2
kernels (the other machine kind the book must fit); the capability line shows which ran.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from zones.book import (
    chapter_source,
    chapters,
    copy_project,
    declared_parameters,
    execution_order,
    project_root,
    run_notebook,
)
from zones.book.estimate import book_costs
from zones.book.parameters import chapter_values
from zones.book.timing import machine_line, reference_forward_seconds
from zones.core.adapters import get_adapter
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import DEFAULT_MODEL, load_model
from zones.core.progress import PROGRESS_ENV, read_progress
from zones.figures import BOOK_MODE_ENV
from zones.measure import scoring
from zones.measure.blocks import BlockTrace, skip_blocks

REFERENCE_TOKENS = 2048
SEQ_LEN = 256


def reference_windows(loaded):
    tokens = SEQ_LEN * (REFERENCE_TOKENS // SEQ_LEN) - REFERENCE_TOKENS // SEQ_LEN
    return corpus_windows(load_corpus("stdlib"), loaded.tokenizer, SEQ_LEN, "eval", tokens)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_chapters(names: list[str], root: Path, budget: str = "cpu") -> dict[str, dict[str, float]]:
    """Per chapter, run with ``budget``'s values: wall ``seconds``, ``cpu`` (its kernel's CPU
    seconds) and counted ``work``."""
    out = {}
    quiet = {BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    os.environ.update(quiet)  # as zones.book.execute.execute_chapter runs them (inherited by the kernel)
    with tempfile.TemporaryDirectory(prefix="zones-bench-book-") as tmp:
        # Run where zones book runs them, in a copy's book/chapters: a chapter that reads the
        # project (the teaching chapter's list of chapters) finds it; this checkout is not touched.
        folder = copy_project(Path(tmp) / "project", root=root) / "book" / "chapters"
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            target = folder / f"{name}.ipynb"
            os.environ[PROGRESS_ENV] = str(Path(tmp) / f"{name}.work")
            print(f"executing {name} ...", file=sys.stderr, flush=True)
            start, cpu = time.perf_counter(), _children_cpu()
            source = chapter_source(root, name)
            values = chapter_values(name, declared_parameters(source), budget, {}, {})
            run_notebook(source, target, values, cwd=folder)
            out[name] = dict(seconds=time.perf_counter() - start, cpu=_children_cpu() - cpu,
                             work=read_progress(os.environ[PROGRESS_ENV]))
            print(f"  {name}: {out[name]['seconds']:.0f} s", file=sys.stderr, flush=True)
    os.environ.pop(PROGRESS_ENV, None)
    return out


def chapter_table(timed: dict[str, dict[str, float]], reference: float,
                  expected: dict[str, float | None] | None = None) -> list[dict]:
    """One row per chapter: ``seconds``, ``forwards`` (seconds / ``reference``, a reference
    forward's seconds), counted ``work``, ``overhead`` = seconds / (work × reference) (None when
    nothing was counted), ``cpu`` and ``expected`` (its entry in ``expected``; None: no estimate)."""
    rows = []
    for name, t in timed.items():
        work = t["work"]
        rows.append(dict(chapter=name, seconds=t["seconds"], forwards=t["seconds"] / reference, work=work,
                         overhead=t["seconds"] / (work * reference) if work > 0 else None, cpu=t.get("cpu", 0.0),
                         expected=(expected or {}).get(name)))
    return rows


def bench_head(settings: list[str], repeats: int) -> None:
    loaded = load_model(DEFAULT_MODEL)
    windows = reference_windows(loaded)
    ids = windows.input_ids[:REFERENCE_TOKENS // SEQ_LEN]
    adapter = get_adapter(loaded.model)
    saved = scoring.HEAD_CHUNK, scoring.ROW_BLOCK_BYTES
    row = loaded.model.config.vocab_size * 4  # one row of float32 logits
    parsed = {s: (int(s.split(":")[0]), int(s.split(":")[1]) * row if ":" in s else saved[1]) for s in settings}
    times = {s: dict(nll=[], metrics=[]) for s in settings}
    results = {}
    with torch.inference_mode():
        trace = BlockTrace(loaded.model, ids)
        with skip_blocks(loaded.model, [3]):
            reduced = BlockTrace(loaded.model, ids).final_hidden
        base = scoring.base_log_probs(adapter, trace.final_hidden)
        try:
            for _ in range(repeats + 1):  # the first round warms up
                for setting, (chunk, rows) in parsed.items():
                    scoring.HEAD_CHUNK, scoring.ROW_BLOCK_BYTES = chunk, rows
                    start = time.perf_counter()
                    nll = scoring.head_nll_windows(adapter, trace.final_hidden, ids)
                    times[setting]["nll"].append(time.perf_counter() - start)
                    start = time.perf_counter()
                    metrics = scoring.head_metrics(adapter, reduced, trace.final_hidden, ids,
                                                   base if chunk == saved[0] else None)
                    times[setting]["metrics"].append(time.perf_counter() - start)
                    results[setting] = [nll, *metrics.values()]
        finally:
            scoring.HEAD_CHUNK, scoring.ROW_BLOCK_BYTES = saved
    print(machine_line())
    print(f"LM head of {ids.numel() - ids.shape[0]} tokens ({DEFAULT_MODEL}), median of {repeats} "
          f"(chunk:rows; head_metrics reuses the full model's log-probabilities at chunk {saved[0]}):")
    first = settings[0]
    for setting in settings:
        t = {k: statistics.median(v[1:]) for k, v in times[setting].items()}
        t0 = {k: statistics.median(v[1:]) for k, v in times[first].items()}
        diff = max(float(abs(a - b).max()) for a, b in zip(results[setting], results[first]))
        print(f"  {setting:>10s}: NLL {t['nll']:6.3f} s ({t['nll'] / t0['nll']:.2f} x {first}), NLL+KL+top-1 "
              f"{t['metrics']:6.3f} s ({t['metrics'] / t0['metrics']:.2f} x); largest per-window difference {diff:.3g}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated chapters (default: every chapter)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: PyTorch's choice)")
    parser.add_argument("--head", default=None, help="compare LM-head chunk sizes (and row blocks after a colon) instead, e.g. 2048,512 or 512:512,512:16")
    parser.add_argument("--cache", default=None, help="use this ZONES_CACHE (default: a new, empty one: cold)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--budget", default="cpu", choices=("class", "cpu", "gpu"),
                        help="run the chapters with this budget's values (default: cpu, the notebooks' own)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.head:
        bench_head(args.head.split(","), args.repeats)
        return
    root = project_root()
    names = execution_order(chapters(root))
    if args.only:
        wanted = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in wanted if n not in names]
        if unknown:
            raise SystemExit(f"bench_book: unknown chapter(s) {unknown}; the book has {names}")
        names = [n for n in names if n in wanted]
    os.environ["ZONES_CACHE"] = args.cache or tempfile.mkdtemp(prefix="zones-bench-cache-")  # cold by default
    print(machine_line(), flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    start = time.perf_counter()
    before = reference_forward_seconds(repeats=3)  # converts the model in a cold cache, as zones book does
    setup = time.perf_counter() - start
    timed = time_chapters(names, root, args.budget)
    after = reference_forward_seconds(repeats=3)
    reference = statistics.mean([before, after])
    print(f"reference: {DEFAULT_MODEL} float32 forward of {REFERENCE_TOKENS} tokens: {before:.3f} s before, "
          f"{after:.3f} s after the chapters (their mean is the unit); load average now {os.getloadavg()[0]:.1f}")
    print(f"{'chapter':22s} {'seconds':>8s} {'ref. fwd':>9s} {'counted':>8s} {'overhead':>8s} {'CPU s':>7s} "
          f"{args.budget + ' exp.':>9s}")
    print(f"{'(setup: model, ref.)':22s} {setup:8.0f} {setup / reference:9.1f}")
    costs = book_costs(root, names, budget=args.budget)  # what zones book --budget expects of them
    expected = {n: c["reference_forwards"] if c["estimated"] else None for n, c in costs.items()}
    for row in chapter_table(timed, reference, expected):
        expected = row["expected"]
        # the estimate zones book starts from (time, in reference forwards); the budget is on counted work
        flag = "" if expected is None or row["forwards"] <= expected else "  slower than expected"
        overhead = f"{row['overhead']:8.2f}" if row["overhead"] is not None else f"{'-':>8s}"
        print(f"{row['chapter']:22s} {row['seconds']:8.0f} {row['forwards']:9.1f} {row['work']:8.1f} {overhead} "
              f"{row['cpu']:7.0f} {f'{expected:.0f}' if expected is not None else '-':>9s}{flag}")
    total = setup + sum(t["seconds"] for t in timed.values())
    chapters_seconds = sum(t["seconds"] for t in timed.values())
    work = sum(t["work"] for t in timed.values())
    overhead = f"{chapters_seconds / (work * reference):8.2f}" if work > 0 else f"{'-':>8s}"
    print(f"{'total':22s} {total:8.0f} {total / reference:9.1f} {work:8.1f} {overhead}  (overhead of the chapters, "
          f"setup excluded)")


if __name__ == "__main__":
    main()
