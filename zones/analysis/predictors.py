"""Is α special? Spectral columns against simple predictors of a block's importance.

Importance is a block's single-block ablation ΔLoss on the EVAL windows (``zones.measure.ablation``).
Each predictor gives one number per block:

* spectral (weights only): every column of ``zones.spectra.alpha_table`` in
  ``zones.analysis.importance.ESTIMATORS`` (``alpha_shape``, ``alpha_esd``, ``alpha_hill``,
  ``alpha_weighted``, ``stable_rank``, ``log_lambda_max``, ``entropy``), aggregated per block
  as the importance chapter does: the parameter-weighted mean over the block's matrices
  (``zones.spectra.layer_alpha(role="weighted")``);
* simple baselines: ``frobenius`` (the block's weights' Frobenius norm, √Σ‖W‖²_F, weights
  only), ``block_influence`` (ShortGPT's 1 − mean cos(input, output) on the calibration
  windows), ``angular`` (Gromov et al.'s arccos(cos)/π between a block's input and output at
  the last token, calibration), ``calibration_ablation`` (the single-block ΔLoss on the
  calibration windows, which never overlap the eval windows); and, added on demand by
  ``position_predictors``, ``depth`` and ``edge_distance`` (where the block sits: no weights, no data).

``predictor_rho`` gives Spearman ρ(importance, predictor) with a bootstrap 95% interval over
blocks and a permutation p-value (``zones.analysis.importance.spearman``). Every interval uses the same
seed and the same blocks, so all are computed on the SAME bootstrap resamples of blocks
(``zones.measure.stats``: one index matrix per seed and size), and ``rho_difference`` gives the
interval of |ρ_a| − |ρ_b| on those resamples. |ρ| because a predictor's direction is not the
question (a block with little influence on its stream matters less: ρ > 0; a flatter spectrum
may go either way): how well it ORDERS the blocks is.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import nn

from zones.analysis.importance import ESTIMATORS, _corr_rows, relative_depth, spearman
from zones.core.adapters import get_adapter
from zones.measure.stats import N_PERMUTATIONS, N_RESAMPLES, paired_bootstrap
from zones.spectra import layer_alpha

SIMPLE = ("frobenius", "block_influence", "angular", "calibration_ablation", "block_index", "relative_depth",
          "edge_distance")
RHO_COLUMNS = ["predictor", "kind", "rho", "ci_low", "ci_high", "p_value", "abs_rho", "n_blocks"]


def block_frobenius(model: nn.Module) -> pd.Series:
    """√(Σ ‖W‖²_F) over each block's weight matrices (``zones.core.adapters``): a Series by layer."""
    sums: dict[int, float] = {}
    with torch.no_grad():
        for layer, _role, matrix in get_adapter(model).iter_matrices():
            sums[layer] = sums.get(layer, 0.0) + float(matrix.double().pow(2).sum())
    series = pd.Series({k: math.sqrt(v) for k, v in sums.items()}, name="frobenius").sort_index()
    series.index.name = "layer"
    return series


def predictor_table(ablation: pd.DataFrame, alphas: pd.DataFrame, *, frobenius: pd.Series | None = None,
                    hidden_stats: pd.DataFrame | None = None,
                    calibration_ablation: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per block: ``layer, importance`` (the eval ablation's ΔLoss), every spectral
    column of ``ESTIMATORS`` present in ``alphas`` (weighted per block), and the simple
    predictors given: ``frobenius`` (:func:`block_frobenius`), ``block_influence`` and
    ``angular`` (from ``zones.pruning.PruningContext.hidden_stats``, span 1),
    ``calibration_ablation`` (``delta_loss`` of an ablation table on calibration windows); always
    ``block_index`` and ``relative_depth`` (``zones.analysis.importance.relative_depth``)."""
    table = ablation[["layer", "delta_loss"]].rename(columns={"delta_loss": "importance"}).astype({"layer": int})
    table = table.set_index("layer")
    for estimator in ESTIMATORS:
        if estimator in alphas.columns and alphas[estimator].notna().any():
            table[estimator] = layer_alpha(alphas, estimator=estimator, role="weighted").reindex(table.index)
    if frobenius is not None:
        table["frobenius"] = frobenius.reindex(table.index)
    if hidden_stats is not None:
        one = hidden_stats[hidden_stats["span"] == 1].set_index("start")
        table["block_influence"] = (1.0 - one["mean_cos"]).reindex(table.index)
        table["angular"] = one["angular_last"].reindex(table.index)
    if calibration_ablation is not None:
        table["calibration_ablation"] = calibration_ablation.set_index("layer")["delta_loss"].reindex(table.index)
    table["block_index"] = table.index.to_numpy(dtype=float)
    table["relative_depth"] = relative_depth(table.index.to_numpy())
    return table.reset_index()


def position_predictors(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` (one row per block, as :func:`predictor_table` returns it) with one more simple
    predictor that knows only where a block sits: ``edge_distance`` (blocks between it and the
    nearer end of the stack: 0 for the first and the last block; the table already holds
    ``block_index`` and ``relative_depth``).

    The bar a spectral predictor must clear if it is to say more than "the ends matter": an α
    profile that is merely U-shaped over depth orders the blocks through their position alone.
    """
    if "layer" not in table.columns:
        raise ValueError("the predictor table lacks its layer column (one row per block)")
    layer = table["layer"].astype(int)
    first, last = int(layer.min()), int(layer.max())
    return table.assign(edge_distance=np.minimum(layer - first, last - layer))


def predictor_columns(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if c not in ("layer", "importance")]


def predictor_rho(table: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ(importance, predictor) for every predictor column of :func:`predictor_table`.

    Columns: ``predictor, kind`` (``spectral`` or ``simple``), ``rho, ci_low, ci_high``
    (bootstrap over blocks, the same resamples for every predictor), ``p_value``
    (permutation, two-sided), ``abs_rho``, ``n_blocks``.
    """
    rows = []
    for name in predictor_columns(table):
        c = spearman(table[name].to_numpy(dtype=float), table["importance"].to_numpy(dtype=float), n_resamples=n_resamples,
                     n_permutations=n_permutations, seed=seed)
        rows.append(dict(predictor=name, kind="simple" if name in SIMPLE else "spectral", rho=c.rho, ci_low=c.ci_low,
                         ci_high=c.ci_high, p_value=c.p_value, abs_rho=abs(c.rho), n_blocks=c.n))
    return pd.DataFrame(rows, columns=RHO_COLUMNS)


def rho_difference(table: pd.DataFrame, first: str, second: str, *, n_resamples: int = N_RESAMPLES, level: float = 0.95,
                   seed: int = 0) -> dict:
    """|ρ(importance, first)| − |ρ(importance, second)| with its bootstrap interval, the blocks
    resampled together (the same resamples as :func:`predictor_rho` with the same ``seed``).
    Blocks where either predictor is NaN are dropped. Returns ``first, second, difference,
    low, high``."""
    data = pd.DataFrame({"importance": table["importance"], "a": table[first], "b": table[second]}).astype(float)
    data = data.dropna()
    x, a, b = (data[c].to_numpy() for c in ("importance", "a", "b"))

    def statistic(imp, p, q):
        r = rankdata(imp, axis=-1)
        return np.abs(_corr_rows(rankdata(p, axis=-1), r)) - np.abs(_corr_rows(rankdata(q, axis=-1), r))

    if len(data) < 3:
        nan = float("nan")
        return dict(first=first, second=second, difference=nan, low=nan, high=nan)
    iv = paired_bootstrap(statistic, (x, a, b), n_resamples=n_resamples, level=level, seed=seed)
    return dict(first=first, second=second, difference=float(iv.estimate), low=float(iv.low), high=float(iv.high))


def best_simple(rhos: pd.DataFrame) -> str | None:
    """The simple predictor with the largest |ρ| (``None`` if none is finite)."""
    simple = rhos[(rhos["kind"] == "simple") & rhos["rho"].notna()]
    return None if simple.empty else str(simple.loc[simple["abs_rho"].idxmax(), "predictor"])


def alpha_vs_best(table: pd.DataFrame, rhos: pd.DataFrame, alpha: str = "alpha_shape", **kwargs) -> dict:
    """:func:`rho_difference` of ``alpha`` against :func:`best_simple`, with a ``verdict``:
    ``"α orders blocks better"`` / ``"the simple predictor orders blocks better"`` when the
    interval excludes 0, ``"not separable"`` when it includes it, ``"undefined"`` otherwise."""
    best = best_simple(rhos)
    if best is None or alpha not in table.columns:
        nan = float("nan")
        return dict(first=alpha, second=best, difference=nan, low=nan, high=nan, verdict="undefined")
    result = rho_difference(table, alpha, best, **kwargs)
    if not (np.isfinite(result["low"]) and np.isfinite(result["high"])):
        verdict = "undefined"
    elif result["low"] > 0:
        verdict = "α orders blocks better"
    elif result["high"] < 0:
        verdict = "the simple predictor orders blocks better"
    else:
        verdict = "not separable"
    return dict(result, verdict=verdict)
