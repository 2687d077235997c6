"""Is α special? Spectral columns against simple predictors of a block's importance.

Importance is a block's single-block ablation ΔLoss on the EVAL windows (``zones.measure.ablation``).
Each predictor gives one number per block:

* spectral (weights only): every column of ``zones.spectra.alpha_table`` in
  ``zones.analysis.importance.ESTIMATORS`` (``alpha_shape``, ``alpha_esd``, ``alpha_hill``,
  ``alpha_weighted``, ``stable_rank``, ``log_lambda_max``, ``entropy``), aggregated per block
  as the importance chapter does: the parameter-weighted mean over the block's matrices
  (``zones.spectra.layer_alpha(alpha_role="weighted")``);
* simple baselines: ``frobenius`` (the block's weights' Frobenius norm, √Σ‖W‖²_F, weights
  only), ``block_influence`` (ShortGPT's 1 − mean cos(input, output) on the calibration
  windows), ``angular`` (Gromov et al.'s arccos(cos)/π between a block's input and output at
  the last token, calibration), ``calibration_ablation`` (the single-block ΔLoss on the
  calibration windows, which never overlap the eval windows); and, added on demand by
  ``position_predictors``, ``depth`` and ``edge_distance`` (where the block sits: no weights, no data).

Predictors are registered, as pruning strategies are (``zones.pruning.register_strategy``):
``register_predictor(name)`` decorates a function of :class:`PredictorInputs` that returns one
number per block (or None when what it reads was not given), ``available_predictors()`` lists
them, and :func:`predictor_table` has one column per registered predictor, in the order they were
registered (the built-in ones above first)::

    @register_predictor("mlp_norm", description="Frobenius norm of the MLP's matrices")
    def mlp_norm(inputs):
        ...  # inputs.model, inputs.alphas, inputs.layers, ...: a Series by layer

``predictor_rho`` gives Spearman ρ(importance, predictor) with a bootstrap 95% interval over
blocks and a permutation p-value (``zones.analysis.importance.spearman``). Every interval uses the same
seed and the same blocks, so all are computed on the SAME bootstrap resamples of blocks
(``zones.measure.bootstrap``: one index matrix per seed and size), and ``rho_difference`` gives the
interval of |ρ_a| − |ρ_b| on those resamples. |ρ| because a predictor's direction is not the
question (a block with little influence on its stream matters less: ρ > 0; a flatter spectrum
may go either way): how well it ORDERS the blocks is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import nn

from zones.analysis.importance import ESTIMATORS, _corr_rows, relative_depth, spearman
from zones.core.adapters import get_adapter
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES, paired_bootstrap
from zones.spectra import layer_alpha

SIMPLE = ("frobenius", "block_influence", "angular", "calibration_ablation", "block_index", "relative_depth",
          "edge_distance")
RHO_COLUMNS = ["predictor", "kind", "rho", "ci_low", "ci_high", "p_value", "abs_rho", "n_blocks"]
KINDS = ("spectral", "simple")  # weights' spectra, or anything else (norms, data, position)


# --- the registry ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PredictorInputs:
    """What a predictor may read, for one model: ``layers`` (the blocks of the importance table, in
    its order), ``alphas`` (``zones.spectra.alpha_table``), and, when the caller has them,
    ``model``, ``frobenius`` (:func:`block_frobenius`), ``hidden_stats``
    (``zones.pruning.PruningContext.hidden_stats``), ``calibration_ablation`` (an ablation table
    on the calibration windows) and ``calibration`` (those windows). Never the eval importance."""

    layers: pd.Index
    alphas: pd.DataFrame
    model: nn.Module | None = None
    frobenius: pd.Series | None = None
    hidden_stats: pd.DataFrame | None = None
    calibration_ablation: pd.DataFrame | None = None
    calibration: Any = None


@dataclass(frozen=True)
class Predictor:
    """A registered predictor: ``function(inputs)`` gives one number per block (a Series indexed by
    layer, or a sequence in the order of ``inputs.layers``), or None when its inputs are missing."""

    name: str
    function: Callable[[PredictorInputs], Any]
    kind: str
    description: str


PREDICTORS: dict[str, Predictor] = {}


def register_predictor(name: str, *, kind: str = "simple", description: str = "", replace: bool = False):
    """Decorator: register ``function(inputs: PredictorInputs)`` as predictor ``name`` of ``kind``
    (``spectral`` or ``simple``): a column of :func:`predictor_table` and a row of
    :func:`predictor_rho` from then on. A name already registered is refused unless ``replace``."""
    if not name or not isinstance(name, str) or name != name.strip() or name in ("layer", "importance"):
        raise ValueError(f"predictor name {name!r} must be a non-empty name without outer spaces, other than "
                         f"layer and importance")
    if kind not in KINDS:
        raise ValueError(f"predictor kind must be one of {', '.join(KINDS)}; got {kind!r}")

    def decorator(function):
        if name in PREDICTORS and not replace:
            raise ValueError(f"predictor {name!r} is already registered (pass replace=True to override)")
        doc = description or (function.__doc__ or "").strip().split("\n")[0]
        PREDICTORS[name] = Predictor(name, function, kind, doc)
        return function

    return decorator


def available_predictors() -> pd.DataFrame:
    """The registry as a table: ``predictor, kind, description``, in the order of the table's columns."""
    return pd.DataFrame([dict(predictor=p.name, kind=p.kind, description=p.description) for p in PREDICTORS.values()],
                        columns=["predictor", "kind", "description"])


def _spectral(alpha_estimator: str):
    def predictor(inputs: PredictorInputs):
        alphas = inputs.alphas
        if alpha_estimator not in alphas.columns or not alphas[alpha_estimator].notna().any():
            return None
        return layer_alpha(alphas, alpha_estimator=alpha_estimator, alpha_role="weighted")

    return predictor


for _estimator in ESTIMATORS:  # the spectral columns, aggregated per block as the importance chapter does
    register_predictor(_estimator, kind="spectral", description=f"{_estimator}, parameter-weighted mean over the "
                       f"block's matrices")(_spectral(_estimator))


@register_predictor("frobenius")
def _frobenius(inputs: PredictorInputs):
    """the block's weights' Frobenius norm, √Σ‖W‖²_F (weights only)"""
    if inputs.frobenius is not None:
        return inputs.frobenius
    return None if inputs.model is None else block_frobenius(inputs.model)


def _one_block(inputs: PredictorInputs) -> pd.DataFrame | None:
    stats = inputs.hidden_stats
    return None if stats is None else stats[stats["span"] == 1].set_index("start")


@register_predictor("block_influence")
def _block_influence(inputs: PredictorInputs):
    """ShortGPT's 1 − mean cos(input, output) on the calibration windows"""
    one = _one_block(inputs)
    return None if one is None else 1.0 - one["mean_cos"]


@register_predictor("angular")
def _angular(inputs: PredictorInputs):
    """Gromov et al.'s arccos(cos)/π between a block's input and output at the last token (calibration)"""
    one = _one_block(inputs)
    return None if one is None else one["angular_last"]


@register_predictor("calibration_ablation")
def _calibration_ablation(inputs: PredictorInputs):
    """the single-block ΔLoss on the calibration windows (disjoint from the eval windows)"""
    table = inputs.calibration_ablation
    return None if table is None else table.set_index("layer")["delta_loss"]


@register_predictor("block_index")
def _block_index(inputs: PredictorInputs):
    """where the block sits: its index"""
    return inputs.layers.to_numpy(dtype=float)


@register_predictor("relative_depth")
def _relative_depth(inputs: PredictorInputs):
    """where the block sits: index / last index"""
    return relative_depth(inputs.layers.to_numpy())


def _per_block(values, layers: pd.Index, name: str) -> np.ndarray:
    """A predictor's values in the order of ``layers``: a Series is aligned by layer (blocks it
    lacks are NaN), anything else must hold one number per block."""
    if isinstance(values, pd.Series):
        return values.reindex(layers).to_numpy(dtype=float)
    array = np.asarray(values, dtype=float)
    if array.ndim != 1:
        raise ValueError(f"predictor {name} gave an array of shape {array.shape}, not one value per block "
                         f"({len(layers)} blocks); return a 1-D sequence in block order (or a Series indexed by layer)")
    if len(array) != len(layers):
        raise ValueError(f"predictor {name} gave {len(array)} values for {len(layers)} blocks; return one per "
                         f"block (or a Series indexed by layer)")
    return array


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
                    hidden_stats: pd.DataFrame | None = None, calibration_ablation: pd.DataFrame | None = None,
                    model: nn.Module | None = None, calibration=None) -> pd.DataFrame:
    """One row per block: ``layer, importance`` (the eval ablation's ΔLoss), then one column per
    registered predictor (``PREDICTORS``, in registration order) whose inputs are given
    (:class:`PredictorInputs`): every spectral column of ``ESTIMATORS`` present in ``alphas``
    (weighted per block); ``frobenius`` (given, or :func:`block_frobenius` of ``model``);
    ``block_influence`` and ``angular`` (from ``zones.pruning.PruningContext.hidden_stats``, span
    1); ``calibration_ablation`` (``delta_loss`` of an ablation table on calibration windows);
    always ``block_index`` and ``relative_depth`` (``zones.analysis.importance.relative_depth``);
    then any predictor registered with :func:`register_predictor`."""
    table = ablation[["layer", "delta_loss"]].rename(columns={"delta_loss": "importance"}).astype({"layer": int})
    table = table.set_index("layer")
    inputs = PredictorInputs(table.index, alphas, model=model, frobenius=frobenius, hidden_stats=hidden_stats,
                             calibration_ablation=calibration_ablation, calibration=calibration)
    for predictor in PREDICTORS.values():
        values = predictor.function(inputs)
        if values is not None:
            table[predictor.name] = _per_block(values, table.index, predictor.name)
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


def predictor_kind(name: str) -> str:
    """``spectral`` or ``simple``: the registered predictor's kind (a column no predictor registered,
    such as :func:`position_predictors`' ``edge_distance``: ``simple`` for the names of ``SIMPLE``)."""
    if name in PREDICTORS:
        return PREDICTORS[name].kind
    return "simple" if name in SIMPLE else "spectral"


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
        rows.append(dict(predictor=name, kind=predictor_kind(name), rho=c.rho, ci_low=c.ci_low,
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
