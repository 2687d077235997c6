"""A trained series (one run per depth and seed) as tables: the runs, their loss curves, their
spectral snapshots, the single-block ablation with α of every run (``series_importance``), the
sublayer ρ of every run (``series_sublayer_rho``), and what a Q4_1 round trip of every run's
block matrices changes (``series_quantization``)."""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd

from zones.analysis.importance import ModelImportance
from zones.analysis.quantization import TABLES as QUANTIZATION_TABLES
from zones.analysis.quantization import quantization_effect
from zones.analysis.sublayer_importance import sublayer_rho_table
from zones.measure.ablation import ablation_window_losses, summarize
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.series.config import series_configs
from zones.series.io import HISTORY_COLUMNS, SNAPSHOT_COLUMNS, TrainedRun
from zones.series.pool import train_runs
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
    (e.g. ``steps=200``, ``width=64``). On a CPU the runs train side by side
    (``zones.series.pool.train_runs``)."""
    configs = series_configs(profile, depths, seeds, **overrides)
    return train_runs(configs, device=device, refresh=refresh, progress=progress)


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
        long = ablation_window_losses(loaded.model, windows, batch_size=batch_size, progress=progress)
        results.append(ModelImportance(str(run.path), run_label(run), loaded.fingerprint, run.config.depth,
                                       summarize(long), alpha_table(loaded.model), windows=long))
    return results


SUBLAYER_RHO_COLUMNS = ["model", "depth", "seed", "part", "n_blocks", "rho", "ci_low", "ci_high", "p_value"]


def series_sublayer_rho(profile: str = "cpu", depths=None, train_overrides: dict | None = None, *,
                        eval_tokens: int, alpha_estimator: str = "alpha_shape", batch_size: int = 16,
                        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0,
                        progress: bool = False) -> pd.DataFrame:
    """ρ(sublayer ΔLoss, the sublayer's weighted α) of every model of a trained depth series
    (:func:`train_series` ``(depths, profile, **train_overrides)``: with the same arguments, the
    depth-series chapter's runs, read from the cache), each on ``eval_tokens`` of its own
    held-out windows (``zones.analysis.sublayer_importance.sublayer_rho_table``). Columns
    :data:`SUBLAYER_RHO_COLUMNS`: one row per run and part (``attn``, ``mlp``)."""
    rows = []
    for run in train_series(depths, profile, progress=progress, **(train_overrides or {})):
        loaded = run.load()
        long = ablation_window_losses(loaded.model, heldout_windows(run, eval_tokens), parts=True,
                                      batch_size=batch_size, progress=progress)
        rho = sublayer_rho_table(long, alpha_table(loaded.model), n_resamples=n_resamples,
                                 n_permutations=n_permutations, seed=seed)
        for part in ("attn", "mlp"):
            r = rho[(rho["part"] == part) & (rho["estimator"] == alpha_estimator) & (rho["role"] == "weighted")].iloc[0]
            rows.append(dict(model=run_label(run), depth=run.config.depth, seed=run.config.seed, part=part,
                             n_blocks=int(long["layer"].nunique()), rho=r["rho"], ci_low=r["ci_low"],
                             ci_high=r["ci_high"], p_value=r["p_value"]))
    return pd.DataFrame(rows, columns=SUBLAYER_RHO_COLUMNS)


def series_quantization(runs: list[TrainedRun], *, quant_type: str = "Q4_1", eval_tokens: int | None = 8128,
                        batch_size: int = 16, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted",
                        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0,
                        device: str | None = None, progress: bool = False) -> dict[str, pd.DataFrame]:
    """Every run (float32 weights) against its ``quant_type`` round trip on its own held-out
    windows (``zones.analysis.quantization.quantization_effect``, cached per run), as three
    tables with ``model`` (``"depth D, seed S"``), ``depth``, ``seed`` first: ``matrices`` (α of
    every block matrix before and after), ``blocks`` (ΔLoss of every block before and after, and
    its change with a paired interval over windows) and ``summary`` (one row per run: the
    largest α change, ρ(α before, α after), the loss change, ρ(α, ΔLoss) before and after and
    their change, with intervals). With the chapter's ``eval_tokens`` and ``batch_size`` the
    unquantised ablation is the one ``series_importance`` stored: only the round trip is new."""
    tables: dict[str, list[pd.DataFrame]] = {name: [] for name in QUANTIZATION_TABLES}
    for run in runs:
        loaded = run.load(device=device)
        effect = quantization_effect(loaded.model, heldout_windows(run, eval_tokens), quant_type=quant_type,
                                     alpha_estimator=alpha_estimator, alpha_role=alpha_role, batch_size=batch_size, n_resamples=n_resamples,
                                     n_permutations=n_permutations, seed=seed, progress=progress)
        for name, table in effect.items():
            table = table.copy()
            for i, (column, value) in enumerate(dict(model=run_label(run), depth=run.config.depth,
                                                     seed=run.config.seed).items()):
                table.insert(i, column, value)
            tables[name].append(table)
    return {name: pd.concat(parts, ignore_index=True) for name, parts in tables.items()}
