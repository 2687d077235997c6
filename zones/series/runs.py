"""A trained series (one run per depth and seed) as tables: the runs, their loss curves, their
spectral snapshots, and the single-block ablation with α of every run (``series_importance``)."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from zones.analysis.importance import ModelImportance
from zones.measure.ablation import ablation_table
from zones.series.config import series_configs
from zones.series.io import HISTORY_COLUMNS, SNAPSHOT_COLUMNS, TrainedRun
from zones.series.loop import train_model
from zones.series.tokenizer import heldout_windows
from zones.spectra import alpha_table

LATE_FRACTION = 0.2   # the flattening rule looks at the last 20 % of the steps ...
FLAT_IMPROVEMENT = 0.02  # ... and calls the curve flat when they improve held-out loss by < 2 %


def run_label(run: TrainedRun) -> str:
    """How tables and figures name a run: ``"depth 8, seed 1"``."""
    return f"depth {run.config.depth}, seed {run.config.seed}"


def train_series(depths: Iterable[int] | None = None, profile: str = "cpu", *, seeds: int | None = None,
                 device: str | None = None, refresh: bool = False, progress: bool = True,
                 **overrides) -> list[TrainedRun]:
    """Train (or load) one model per depth and seed of a profile (its depths and seeds unless
    given; ``seeds`` is a count, seeds 0..n-1); every ``TrainConfig`` field may be overridden
    (e.g. ``steps=200``, ``width=64``)."""
    configs = series_configs(profile, depths, seeds, **overrides)
    return [train_model(c, device=device, refresh=refresh, progress=progress) for c in configs]


def late_improvement(history: pd.DataFrame, fraction: float = LATE_FRACTION) -> float:
    """Relative fall of the held-out loss over the last ``fraction`` of the steps:
    (loss at (1 - fraction)·steps, interpolated, minus the final loss) / that loss."""
    steps = history["step"].to_numpy(float)
    losses = history["heldout_loss"].to_numpy(float)
    before = float(np.interp((1 - fraction) * steps[-1], steps, losses))
    return (before - losses[-1]) / before


def series_summary(runs: list[TrainedRun]) -> pd.DataFrame:
    """One row per run: ``depth, width, heads, seed, parameters, steps, tokens_seen,
    total_seconds, train_seconds, eval_seconds, snapshot_seconds, snapshot_fraction,
    initial_heldout_loss, final_heldout_loss, device`` (see ``TrainedRun``), then
    ``late_improvement`` (relative held-out improvement over the last 20 % of steps),
    ``flattened`` (it is below 2 %) and ``path``."""
    rows = []
    for run in runs:
        improvement = late_improvement(run.history)
        rows.append(dict(run.summary, seed=run.config.seed, late_improvement=improvement,
                         flattened=bool(improvement < FLAT_IMPROVEMENT), path=str(run.path)))
    return pd.DataFrame(rows)


def series_history(runs: list[TrainedRun]) -> pd.DataFrame:
    """The loss histories of a series stacked, with ``depth, seed`` columns first."""
    return pd.concat([run.history.assign(depth=run.config.depth, seed=run.config.seed) for run in runs],
                     ignore_index=True)[["depth", "seed", *HISTORY_COLUMNS]]


def series_snapshots(runs: list[TrainedRun]) -> pd.DataFrame:
    """The spectral snapshots of a series stacked, with ``depth, seed`` columns first."""
    return pd.concat([run.snapshots.assign(depth=run.config.depth, seed=run.config.seed) for run in runs],
                     ignore_index=True)[["depth", "seed", *SNAPSHOT_COLUMNS]]


def series_importance(runs: list[TrainedRun], *, eval_tokens: int | None = 8128, batch_size: int = 16,
                      device: str | None = None, progress: bool = True) -> list[ModelImportance]:
    """Single-block ablation (``zones.measure.ablation.ablation_table``) and α table of every run on
    its own held-out windows, as ``zones.analysis.importance.ModelImportance`` labelled
    ``"depth N, seed S"``; both tables are cached like any model's."""
    results = []
    for run in runs:
        loaded = run.load(device=device)
        windows = heldout_windows(run, eval_tokens)
        ablation = ablation_table(loaded.model, windows, batch_size=batch_size, progress=progress)
        results.append(ModelImportance(str(run.path), run_label(run), loaded.fingerprint,
                                       run.config.depth, ablation, alpha_table(loaded.model)))
    return results
