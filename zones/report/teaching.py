"""The teachers' page: each chapter's measured time in the last build at a budget (the class
budget by default), read from the book's own timing record.

``zones book`` stores, after each chapter it executes, that chapter's seconds in one cache
entry per set of build parameters (``cache_dir()/book/<key>.seconds``, its sidecar naming the
parameters; a build at a budget other than the default carries ``budget`` among them). This
module reads those entries back, checksums verified (``zones.core.entries.read_entry``): a
damaged one is reported and skipped, never read. Nothing here is typed by hand: a chapter the
record does not hold is *not measured*, and the page says so.

``run(...)`` returns a ``ChapterResult`` with the table ``times``: ``chapter, seconds,
minutes, share`` (of the measured total), ``note`` (why a time is missing), one row per chapter
of ``chapters`` (the book's order), written as CSV with ``summary.json``; and ``times_shown``, the
same with the budget in its column names.
"""
from __future__ import annotations

import datetime as dt
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from zones.core.cache import CacheError, cache_dir, sidecar_path
from zones.core.entries import ENTRY, read_entry
from zones.core.glossary import DEFAULT_BUDGET  # a build at this budget carries no ``budget`` in its parameters
from zones.core.hardware import cpu_capability
from zones.report.common import ChapterResult, save
from zones.report.format import fmt_num

TIMINGS_KIND = "book_timings"   # the parts' ``kind`` of zones.book's timing entries
TIME_COLUMNS = ["chapter", "seconds", "minutes", "share", "note"]
PAGE = "teaching"   # this page: it reads the record while it runs, so its own time is not in it yet
# zones.book runs this page after every other chapter (its RUN_LAST, which this floor cannot import; tests/
# test_teaching.py holds it last), so this build's record holds every other chapter's time when it runs


def time_note(chapter: str, measured: bool) -> str:
    """Why a chapter has no time in the record this page reads (``""`` when it has one): this page
    itself on the first build of its parameters (a later build reads the time the earlier one
    recorded), or a chapter the record does not hold."""
    if measured:
        return ""
    if chapter == PAGE:
        return "this page: still running when it reads the record (the next build shows its time)"
    return "not measured: no build here has run it"


def timing_records(folder: Path | None = None) -> list[dict]:
    """Every verified timing record of the book in the cache: ``path``, ``parameters`` (the
    build's), ``timings`` (chapter → seconds) and ``written`` (the entry's modification time,
    UTC), oldest first. A damaged entry is reported on stderr and left out."""
    folder = Path(folder) if folder is not None else cache_dir() / "book"
    records = []
    for path in sorted(folder.glob("*.seconds")):
        sidecar = sidecar_path(path)
        try:
            parts = json.loads(sidecar.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(parts, dict) or parts.get("kind") != TIMINGS_KIND:
            continue
        parts = {k: v for k, v in parts.items() if k != ENTRY}  # what the entry was computed from
        try:
            found = read_entry(path, parts)
        except CacheError as err:
            print(f"zones: {err}; its times are left out", file=sys.stderr)
            continue
        if found is None:
            continue
        record = json.loads(found[0])
        if not isinstance(record, dict):
            continue
        # zones.book's record: {"chapters": {name: {"seconds": s, ...}}, "reference_seconds": ..., "machine": ...};
        # an older zones wrote {name: seconds}
        chapters = record.get("chapters") if isinstance(record.get("chapters"), dict) else \
            {k: dict(seconds=v) for k, v in record.items()}
        records.append(dict(path=str(path), parameters=parts.get("parameters") or {},
                            timings={str(k): float(v["seconds"]) for k, v in chapters.items()},
                            reference_seconds=record.get("reference_seconds"), machine=record.get("machine"),
                            written=dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc)))
    return sorted(records, key=lambda r: r["written"])


def budget_record(timed_budget: str = "class", records: Sequence[dict] | None = None) -> dict | None:
    """The most recently written timing record of a build at ``timed_budget`` (its parameters'
    ``budget``; the default budget's builds carry none), or None when there is none."""
    records = timing_records() if records is None else records
    chosen = [r for r in records if (r["parameters"].get("budget") or DEFAULT_BUDGET) == timed_budget]
    return chosen[-1] if chosen else None


def chapter_times(timings: dict[str, float], chapters: Sequence[str]) -> pd.DataFrame:
    """One row per chapter of ``chapters`` (then any other chapter the record holds):
    ``chapter, seconds`` (NaN where not measured), ``minutes``, ``share`` of the measured total and
    ``note``: why a chapter has no time (:func:`time_note`)."""
    names = list(chapters) + [c for c in timings if c not in chapters]
    seconds = pd.Series([timings.get(c, float("nan")) for c in names], dtype=float)
    total = seconds.sum(skipna=True)
    return pd.DataFrame(dict(chapter=names, seconds=seconds, minutes=seconds / 60,
                             share=seconds / total if total > 0 else float("nan"),
                             note=[time_note(c, c in timings) for c in names]))[TIME_COLUMNS]


def times_shown(times: pd.DataFrame, budget: str) -> pd.DataFrame:
    """The times as the page shows them: the budget they were measured at in the column names
    (``seconds (cpu budget)``), so a page that asked for another budget cannot pass them off as its."""
    return times.rename(columns={"seconds": f"seconds ({budget} budget)", "minutes": f"minutes ({budget} budget)"})


def run(timed_budget: str = "class", chapters: Sequence[str] | None = None,
        out_dir: str = "results/teaching") -> ChapterResult:
    """The page's numbers: the chapters' times in the last ``timed_budget`` build on this machine
    (``budget_record``), or the statement that no such build is recorded here."""
    budget = timed_budget
    chapters = list(chapters or [])
    records = timing_records()
    record = budget_record(budget, records)
    fallback = ""
    if record is None and records:   # no build at that budget here: the latest build's measured times, said so
        record = records[-1]
        fallback = budget
        budget = record["parameters"].get("budget") or DEFAULT_BUDGET
    timings = record["timings"] if record else {}
    times = chapter_times(timings, chapters)
    measured = times.dropna(subset=["seconds"])
    missing = [c for c in times["chapter"] if c not in timings]
    if record:
        status = (f"measured in the last {budget} build on this machine (CPU kernels {cpu_capability()}), "
                  f"recorded {record['written']:%Y-%m-%d %H:%M} UTC")
        if fallback:
            status += (f"; no {fallback} build is recorded here, so these are the {budget} budget's times (a "
                       f"{fallback} build takes less)")
        total = float(measured["seconds"].sum() / 60)
        longest = str(measured.loc[measured["seconds"].idxmax(), "chapter"]) if len(measured) else "none"
        times_text = (f"The {len(measured)} measured chapters took {fmt_num(total)} minutes together; the longest "
                      f"was {longest}. Chapters the record does not hold: {', '.join(missing) or 'none'}.")
    else:
        status = f"not measured on this machine: its cache holds no record of a {budget} build"
        times_text = (f"Build the book once at the {budget} budget (the first step of the plan below) and this "
                      f"page shows each chapter's time.")
    numbers = dict(budget=budget, measured=bool(record), status=status, times_text=times_text,
                   n_measured=len(measured), not_measured=", ".join(missing) if missing else "none")
    summary = dict(budget=budget, record=record["path"] if record else None,
                   parameters=record["parameters"] if record else None, timings=timings)
    out = save(out_dir, dict(times=times), summary)
    return ChapterResult(dict(times=times, times_shown=times_shown(times, budget)), numbers, summary, out)
