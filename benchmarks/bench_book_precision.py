"""The book in two precisions: every chapter built cold in float32 and at its default precision,
side by side, and every table compared.

Two copies of the project, each with its own empty ``ZONES_CACHE`` (both cold), run the chapters
in the book's order, interleaved: chapter 1 in float32, chapter 1 at the default, chapter 2 ...,
so that both builds see the same machine and the same load. The float32 build passes
``dtype="float32"`` to every chapter that declares ``dtype``; the default build passes nothing
(each chapter's own value: ``auto`` is bfloat16 where this CPU runs it natively,
``zones.core.hardware.native_bf16``). A reference forward (float32, ``zones.book``) is timed
before and after.

The rule (:func:`compare_chapter`), per chapter, over every CSV it writes, rows in the same order:
every ``verdict`` cell identical; every estimate ``X`` that has an interval (``X_low``,
``X_high``) within a tenth of its float32 interval's half-width; the tables of the same shape
and the same non-numeric cells (the same blocks, removal sets, strategies). A chapter that fails
keeps float32 (its notebook's ``dtype``), named in the README.

    .venv/bin/python benchmarks/bench_book_precision.py                 # every chapter, cpu budget
    .venv/bin/python benchmarks/bench_book_precision.py --budget class
    .venv/bin/python benchmarks/bench_book_precision.py --only layer_ablation,pruning --keep /tmp/two
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from zones.book import chapter_source, chapters, copy_project, declared_parameters, execution_order, project_root
from zones.book import run_notebook
from zones.book.parameters import chapter_values
from zones.book.timing import _store_timing, machine_line, reference_forward_seconds
from zones.core.hardware import auto_precision
from zones.core.progress import PROGRESS_ENV, read_progress
from zones.figures import BOOK_MODE_ENV

SHARE = 0.1          # |estimate(default) − estimate(float32)| ≤ this share of the float32 half-width
PRECISIONS = ("float32", "default")
QUIET = {BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def _estimates(frame: pd.DataFrame) -> list[tuple[str, str, str]]:
    """``(X, low, high)`` for every estimate of ``frame`` with an interval: ``X_low``/``X_high``, and a
    ρ table's ``rho`` with ``ci_low``/``ci_high``."""
    found = [(c, f"{c}_low", f"{c}_high") for c in frame.columns if f"{c}_low" in frame.columns
             and f"{c}_high" in frame.columns and pd.api.types.is_numeric_dtype(frame[c])]
    if {"rho", "ci_low", "ci_high"} <= set(frame.columns):
        found.append(("rho", "ci_low", "ci_high"))
    return found


def _text(column: pd.Series) -> pd.Series:
    """A column as text, missing cells as "" (a missing cell equals a missing cell)."""
    return column.astype(object).where(column.notna(), "").astype(str)


def compare_table(reference: pd.DataFrame, other: pd.DataFrame, name: str) -> dict:
    """One table in two precisions: ``share`` (the largest |Δ estimate| over its float32
    half-width, NaN when the table has no interval), ``where`` (file:column:row of it),
    ``verdicts_differ`` (cells of ``verdict`` columns that differ) and ``problem`` (a table that
    cannot be compared row by row: another shape or other non-numeric cells)."""
    out = dict(table=name, share=float("nan"), where="", verdicts_differ=0, problem="")
    if reference.shape != other.shape or list(reference.columns) != list(other.columns):
        out["problem"] = f"{name}: shape {reference.shape} against {other.shape}"
        return out
    verdicts = [c for c in reference.columns if c == "verdict" or c.endswith("_verdict")]
    for column in verdicts:
        out["verdicts_differ"] += int((_text(reference[column]) != _text(other[column])).sum())
    labels = [c for c in reference.columns if not pd.api.types.is_numeric_dtype(reference[c])
              and c not in verdicts and not c.endswith(("text", "why", "reason", "note", "notes", "by_k"))]
    for column in labels:
        differ = _text(reference[column]) != _text(other[column])
        if differ.any():
            row = int(np.flatnonzero(differ.to_numpy())[0])
            out["problem"] = (f"{name}: {column} differs (row {row}: {reference[column].iloc[row]!r} against "
                              f"{other[column].iloc[row]!r})")
            return out
    best = -1.0
    for column, low, high in _estimates(reference):
        half = (reference[high] - reference[low]).to_numpy(float) / 2
        moved = np.abs(other[column].to_numpy(float) - reference[column].to_numpy(float))
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(moved == 0, 0.0, moved / half)
        share = np.where(np.isnan(moved), np.nan, share)   # not measured in either: not judged
        if np.all(np.isnan(share)):
            continue
        row = int(np.nanargmax(share))
        if share[row] > best:
            best, out["where"] = float(share[row]), f"{name}:{column}:row {row}"
    out["share"] = best if best >= 0 else float("nan")
    return out


def compare_chapter(reference_dir: Path, other_dir: Path) -> dict:
    """Every CSV of a chapter's results in two precisions (:func:`compare_table`): ``tables``,
    the largest ``share`` and its ``where``, ``verdicts_differ``, ``problems`` and ``agree``
    (every verdict identical, no problem, every share ≤ :data:`SHARE`)."""
    rows = []
    for path in sorted(Path(reference_dir).rglob("*.csv")):
        twin = Path(other_dir) / path.relative_to(reference_dir)
        name = str(path.relative_to(reference_dir))
        if not twin.exists():
            rows.append(dict(table=name, share=float("nan"), where="", verdicts_differ=0, problem=f"{name}: missing"))
            continue
        rows.append(compare_table(pd.read_csv(path), pd.read_csv(twin), name))
    shares = [r for r in rows if not math.isnan(r["share"])]
    top = max(shares, key=lambda r: r["share"]) if shares else dict(share=float("nan"), where="")
    problems = [r["problem"] for r in rows if r["problem"]]
    differ = sum(r["verdicts_differ"] for r in rows)
    agree = not problems and differ == 0 and (math.isnan(top["share"]) or top["share"] <= SHARE)
    return dict(tables=len(rows), share=top["share"], where=top["where"], verdicts_differ=differ,
                problems=problems, agree=agree)


def build_both(names: list[str], root: Path, budget: str, work: Path) -> dict[str, dict[str, float]]:
    """Run ``names`` in two project copies under ``work`` (``float32/``, ``default/``), each with
    its own empty cache, interleaved per chapter; returns chapter → precision → seconds."""
    folders = {p: copy_project(work / p, root=root) / "book" / "chapters" for p in PRECISIONS}
    caches = {p: work / f"cache-{p}" for p in PRECISIONS}
    seconds: dict[str, dict[str, float]] = {}
    os.environ.update(QUIET)
    for name in names:
        source = chapter_source(root, name)
        declared = declared_parameters(source)
        seconds[name] = {}
        for precision in PRECISIONS:
            folders[precision].mkdir(parents=True, exist_ok=True)
            forced = {"dtype": "float32"} if precision == "float32" else {}
            values = chapter_values(name, declared, budget, {}, forced)
            os.environ["ZONES_CACHE"] = str(caches[precision])
            os.environ[PROGRESS_ENV] = str(work / f"{name}-{precision}.work")
            print(f"executing {name} ({precision}) ...", file=sys.stderr, flush=True)
            start = time.perf_counter()
            try:
                run_notebook(source, folders[precision] / f"{name}.ipynb", values, cwd=folders[precision])
            except Exception as err:   # said, and the other chapters still run: one failure costs no build
                print(f"  {name} ({precision}) FAILED: {str(err).strip().splitlines()[-1][:300]}", file=sys.stderr,
                      flush=True)
            seconds[name][precision] = time.perf_counter() - start
            seconds[name][f"{precision} work"] = read_progress(os.environ[PROGRESS_ENV])
            # the build's timing record, as zones book keeps it (the teachers' page, run last, reads it)
            _store_timing(forced, name, seconds[name][precision], work=seconds[name][f"{precision} work"])
            print(f"  {name} ({precision}): {seconds[name][precision]:.0f} s", file=sys.stderr, flush=True)
    return seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated chapters (default: every chapter)")
    parser.add_argument("--budget", default="cpu", choices=("class", "cpu", "gpu"))
    parser.add_argument("--keep", default=None, help="build in this folder and keep it (default: a temporary one)")
    parser.add_argument("--html", action="store_true", help="then build the default copy's HTML (zones book "
                        "--no-execute), to look at")
    args = parser.parse_args(argv)
    root = project_root()
    names = execution_order(chapters(root))
    if args.only:
        wanted = {n.strip() for n in args.only.split(",") if n.strip()}
        names = [n for n in names if n in wanted]
    work = Path(args.keep or tempfile.mkdtemp(prefix="zones-bench-precision-"))
    work.mkdir(parents=True, exist_ok=True)
    print(machine_line(), flush=True)
    print(f"default precision here: {auto_precision('cpu')} (dtype auto); load average {os.getloadavg()[0]:.1f}")
    reference_forward_seconds(repeats=1)   # loads (and in a cold cache converts) the model: not a timing
    before = reference_forward_seconds(repeats=3)
    seconds = build_both(names, root, args.budget, work)
    after = reference_forward_seconds(repeats=3)
    print(f"reference forward (float32): {before:.2f} s before, {after:.2f} s after; builds in {work}")
    print(f"| chapter | float32 s | default s | default / float32 | tables | largest share of half-width | "
          f"verdicts equal | agree |")
    print("| --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    totals = dict.fromkeys(PRECISIONS, 0.0)
    for name in names:
        results = {p: work / p / "book" / "chapters" / "results" / name for p in PRECISIONS}
        found = (compare_chapter(results["float32"], results["default"]) if results["float32"].exists()
                 else dict(tables=0, share=float("nan"), where="", verdicts_differ=0, problems=[], agree=True))
        for p in PRECISIONS:
            totals[p] += seconds[name][p]
        share = "—" if math.isnan(found["share"]) else f"{found['share']:.3f} ({found['where']})"
        ratio = seconds[name]["default"] / seconds[name]["float32"]
        print(f"| {name} | {seconds[name]['float32']:.0f} | {seconds[name]['default']:.0f} | {ratio:.2f} | "
              f"{found['tables']} | {share} | {'yes' if found['verdicts_differ'] == 0 else found['verdicts_differ']} | "
              f"{'yes' if found['agree'] else 'NO'} |")
        for problem in found["problems"]:
            print(f"    {problem}")
    print(f"| total | {totals['float32']:.0f} | {totals['default']:.0f} | {totals['default'] / totals['float32']:.2f} | "
          f"| | | |")
    print(f"reference forwards: float32 build {totals['float32'] / statistics.mean([before, after]):.0f}, default "
          f"build {totals['default'] / statistics.mean([before, after]):.0f}")
    if args.html:
        os.environ["ZONES_CACHE"] = str(work / "cache-default")
        subprocess.run([sys.executable, "-m", "zones", "book", "--no-execute"], cwd=work / "default", check=True)
        print(f"HTML: {work / 'default' / 'book' / '_build' / 'html' / 'index.html'}")


if __name__ == "__main__":
    main()
