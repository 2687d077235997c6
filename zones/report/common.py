"""What every chapter module shares: its result, and writing it.

* :class:`ChapterResult`: the tables a chapter wrote and the numbers it glues.
* :func:`glue_all`: every number of a result glued for the page, in the book's one format.
* :func:`save`: tables as CSV and the summary as strict JSON (NaN becomes ``null``), atomically.
* :func:`plain`: numpy scalars and containers as plain Python (what ``glue`` and JSON want).

The statistics the chapters read (intervals over units, where an interval lies) live on the
analysis floor (``zones.analysis.unit_intervals``).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from zones.core.atomic import atomic_write_text
from zones.core.glossary import RETIRED
from zones.core.tables import write_table
from zones.report.format import for_glue

NAN = float("nan")


@dataclass
class ChapterResult:
    """A chapter's output: ``tables`` (name -> DataFrame, each written as ``<name>.csv``),
    ``numbers`` (plain values and sentences for ``glue``), ``summary`` (``summary.json``) and
    ``extra`` (what the figures need besides tables: panel titles, a zone table, ...)."""

    tables: dict[str, pd.DataFrame]
    numbers: dict[str, Any]
    summary: dict[str, Any] = field(default_factory=dict)
    out_dir: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> pd.DataFrame:
        return self.tables[name]

    def glue_items(self) -> list[tuple[str, Any]]:
        """``(name, value)`` for ``myst_nb.glue``: ``None`` shown as ``"none"``."""
        return [(k, "none" if v is None else v) for k, v in self.numbers.items()]


def glue_all(result: ChapterResult | None = None, **extra: Any) -> None:
    """Glue every number and sentence of ``result`` and each ``extra`` value for the page's
    ``{glue:text}`` roles, written as ``zones.report.format.for_glue`` writes them (the one glue loop
    of the book: every chapter calls this)."""
    from myst_nb import glue  # loads Sphinx (about a second); only the notebooks need it

    items = (result.glue_items() if result is not None else []) + list(extra.items())
    for name, value in items:
        glue(name, for_glue("none" if value is None else value), display=False)


def plain(value: Any) -> Any:
    """numpy scalars/arrays, tuples and dicts as plain Python values (floats stay floats)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray, pd.Index, pd.Series)):
        return [plain(v) for v in list(value)]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    return value


def json_safe(value: Any) -> Any:
    """:func:`plain`, with NaN and ±inf as ``None`` (strict JSON has neither)."""
    value = plain(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save(out_dir: str | os.PathLike, tables: Mapping[str, pd.DataFrame], summary: Mapping[str, Any]) -> Path:
    """Write each table as ``out_dir/<name>.csv`` and ``summary`` as ``out_dir/summary.json``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        write_table(table, out / f"{name}.csv")
    atomic_write_text(out / "summary.json", json.dumps(json_safe(dict(summary)), indent=2, allow_nan=False))
    return out


class SummaryError(ValueError):
    """A ``summary.json`` that cannot be read (cut short, edited): the message names it."""


class StaleSummaryError(ValueError):
    """A ``summary.json`` written under a name the glossary has retired: its chapter must run again."""


def read_summary(folder: str | os.PathLike) -> dict:
    """``folder/summary.json`` (``{}`` if there is none). A key the glossary has retired
    (``zones.core.glossary.RETIRED``: an older version's name) is an error naming the chapter to
    run again, never a value read under the wrong name or a default read in its place."""
    path = Path(folder) / "summary.json"
    try:
        summary = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    except (ValueError, UnicodeDecodeError) as err:  # a cut or edited file: named, never a bare JSONDecodeError
        raise SummaryError(f"{path} is not valid JSON ({err}); run its chapter again to rewrite it") from None
    if not isinstance(summary, dict):
        raise SummaryError(f"{path} holds a {type(summary).__name__}, not a summary; run its chapter again to "
                           f"rewrite it")
    stale = sorted(set(summary) & set(RETIRED))
    if stale:
        raise StaleSummaryError(f"{path} was written by an older zones ({', '.join(stale)} is now "
                                f"{', '.join(RETIRED[k] for k in stale)}); run its chapter again")
    return summary


def precision_text(requested: str, resolved: str) -> str:
    """How a page states the precision that scored it: ``"float32"``, or ``"bfloat16 (dtype
    'auto': this CPU runs bf16 natively)"``, so that no number depends silently on the CPU."""
    if requested == "auto":
        why = "runs bf16 natively" if resolved == "bfloat16" else "has no native bf16"
        return f"{resolved} (dtype 'auto': this machine {why})"
    return resolved
