"""What every chapter module shares: its result, writing it, and a bootstrap over units.

* :class:`ChapterResult`: the tables a chapter wrote and the numbers it glues.
* :func:`glue_all`: every number of a result glued for the page, in the book's one format.
* :func:`save`: tables as CSV and the summary as strict JSON (NaN becomes ``null``), atomically.
* :func:`plain`: numpy scalars and containers as plain Python (what ``glue`` and JSON want).
* :func:`unit_bootstrap`: a percentile-bootstrap interval of a statistic, resampling *units*
  (blocks, layers, snapshot steps): paired columns through ``zones.measure.stats.paired_bootstrap``
  (the same procedure as the eval-window intervals), independent strata through
  ``scipy.stats.bootstrap(paired=False)``.
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from zones.core.cache import atomic_write_text, write_table
from zones.measure.stats import N_RESAMPLES, paired_bootstrap
from zones.report.format import for_glue

LEVEL = 0.95        # every interval in the book is a 95% interval
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


def read_summary(folder: str | os.PathLike) -> dict:
    """``folder/summary.json`` (``{}`` if there is none)."""
    path = Path(folder) / "summary.json"
    return json.loads(path.read_text()) if path.exists() else {}


def unit_bootstrap(columns: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], *,
                   paired: bool = True, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
                   seed: int = 0) -> tuple[float, float, float]:
    """``(estimate, low, high)``: ``statistic`` of ``columns`` and its percentile-bootstrap
    interval, units resampled with replacement by ``scipy.stats.bootstrap``.

    ``paired=True``: the columns have one entry per unit (block, layer) and every column gets
    the same resample. ``paired=False``: each column is its own sample (a stratum: the layers
    of one half, the snapshots of one depth), resampled on its own. ``statistic(*columns,
    axis=-1)`` must be vectorized over the last axis. With fewer than three paired units (two
    per stratum), or a statistic that is not finite on the data, the interval is NaN;
    resamples whose statistic is not finite are dropped (NaN if more than half are).
    """
    columns = [np.asarray(c, dtype=float) for c in columns]
    if paired and len({c.shape for c in columns}) != 1:
        raise ValueError(f"paired columns differ in length: {[c.size for c in columns]}")
    with np.errstate(all="ignore"):
        estimate = float(statistic(*columns, axis=-1))
    too_few = columns[0].size < 3 if paired else min(c.size for c in columns) < 2
    if too_few or not math.isfinite(estimate):
        return estimate, NAN, NAN
    if paired:  # the project's one paired bootstrap (it also serves the eval windows)
        interval = paired_bootstrap(statistic, columns, n_resamples=n_resamples, level=level, seed=seed)
        return estimate, float(interval.low), float(interval.high)
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate resamples are dropped below
        options = dict(paired=False, vectorized=True, n_resamples=n_resamples, confidence_level=level,
                       method="percentile")
        try:  # the generator is ``rng`` since scipy 1.15, ``random_state`` before
            result = stats.bootstrap(columns, statistic, rng=np.random.default_rng(seed), **options)
        except TypeError:
            result = stats.bootstrap(columns, statistic, random_state=np.random.default_rng(seed), **options)
    dist = np.asarray(result.bootstrap_distribution, dtype=float)
    dist = dist[np.isfinite(dist)]
    if dist.size < n_resamples // 2:
        return estimate, NAN, NAN
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(dist, [tail, 100 - tail])
    return estimate, float(low), float(high)


def interval_side(low: float, high: float, threshold: float) -> str:
    """Where a 95% interval lies against ``threshold``: ``"above"`` (low > threshold),
    ``"below"`` (high < threshold), ``"straddles"``, or ``"undefined"`` (a NaN bound)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "undefined"
    if low > threshold:
        return "above"
    if high < threshold:
        return "below"
    return "straddles"


def precision_text(requested: str, resolved: str) -> str:
    """How a page states the precision that scored it: ``"float32"``, or ``"bfloat16 (dtype
    'auto': this CPU runs bf16 natively)"``, so that no number depends silently on the CPU."""
    if requested == "auto":
        why = "runs bf16 natively" if resolved == "bfloat16" else "has no native bf16"
        return f"{resolved} (dtype 'auto': this machine {why})"
    return resolved
