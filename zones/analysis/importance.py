"""Does a block's α predict its importance? Spearman ρ, with its uncertainty.

Importance is a block's single-block ablation ΔLoss (``zones.measure.ablation``); α is one value per
block from ``zones.spectra.layer_alpha`` (a single role's, or the parameter-weighted mean over
the block's matrices). With only tens of blocks per model, ρ comes with

* a **bootstrap 95% interval**: blocks resampled with replacement (pairs kept together), ρ
  recomputed, the 2.5th and 97.5th percentiles of the resampled ρ (``zones.measure.bootstrap.paired_bootstrap``,
  i.e. ``scipy.stats.bootstrap``);
* a **permutation p-value** (two-sided): the α values shuffled against ΔLoss, p = (1 + #{|ρ_perm|
  ≥ |ρ|}) / (1 + n_permutations) (``scipy.stats.permutation_test``; all n! pairings when n! ≤ n_permutations).

Every draw comes from a seeded generator, so the numbers are reproducible.

Depth. α tends to rise with depth and importance to fall with it, so ρ(α, ΔLoss) can be large
for reasons of position alone. :func:`depth_controlled` gives, beside the raw ρ, ρ *partialled*
on block index (:func:`partial_spearman`: the Pearson correlation of the residuals of rank(α)
and rank(ΔLoss) after a least-squares line on rank(block index); on relative depth when models
are pooled, :func:`pooled_partial`) and ρ with the first and last blocks left out
(:func:`without_ends`), each with a block-resampled interval (``zones.analysis.unit_intervals.unit_bootstrap``).
"""
from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
import scipy.stats
from scipy.stats import rankdata

from zones.analysis.unit_intervals import MAX_UNDEFINED, WindowNoise, unit_window_bootstrap
from zones.core.checks import check_int
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import load_model
from zones.measure.ablation import DEFAULT_EVAL_TOKENS, ablation_window_losses, summarize
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES, check_level, paired_bootstrap, seeded
from zones.measure.subject import DEFAULT_DTYPE, as_subject
from zones.spectra import alpha_table, layer_alpha

# Per-matrix columns of ``zones.spectra.alpha_table`` worth correlating with importance, in
# the order the ρ table lists them; those missing from a table are left out.
ESTIMATORS = ("alpha_shape", "alpha_esd", "alpha_hill", "alpha_weighted", "stable_rank",
              "log_lambda_max", "entropy")
RHO_COLUMNS = ["estimator", "role", "rho", "ci_low", "ci_high", "p_value", "n_layers"]


# --- Spearman ρ ----------------------------------------------------------------------------------

def _corr_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation of each row of ``a`` with the same row of ``b`` (NaN if one is flat)."""
    a = a - a.mean(axis=-1, keepdims=True)
    b = b - b.mean(axis=-1, keepdims=True)
    denominator = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 1e-12, (a * b).sum(-1) / denominator, np.nan)


def _paired(x, y) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in length: {x.size} and {y.size}")
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def spearman_rho(x, y) -> float:
    """Spearman's rank correlation (ties get their average rank); pairs with a NaN are dropped."""
    x, y = _paired(x, y)
    if x.size < 3:
        return float("nan")
    return float(_corr_rows(rankdata(x), rankdata(y)))


@dataclass(frozen=True)
class Correlation:
    """Spearman ρ of ``n`` pairs, its bootstrap interval and permutation p-value; ``undefined``:
    the share of resamples in which ρ was undefined (counted as 0 in the interval)."""

    rho: float
    ci_low: float
    ci_high: float
    p_value: float
    n: int
    undefined: float = 0.0

    @property
    def estimable(self) -> bool:
        """At most :data:`~zones.analysis.unit_intervals.MAX_UNDEFINED` of the resamples undefined."""
        return self.undefined <= MAX_UNDEFINED

    def as_dict(self) -> dict:
        return dict(rho=self.rho, ci_low=self.ci_low, ci_high=self.ci_high, p_value=self.p_value, n=self.n,
                    undefined=self.undefined)


def _ranked_rho(a, b, axis=-1):
    """Spearman ρ along the last axis, every resample ranked again (its ties)."""
    return _corr_rows(rankdata(a, axis=-1), rankdata(b, axis=-1))


def spearman(x, y, *, noise: WindowNoise | None = None, n_resamples: int = N_RESAMPLES,
             n_permutations: int = N_PERMUTATIONS, level: float = 0.95, seed: int = 0) -> Correlation:
    """Spearman ρ of (x, y) with a percentile-bootstrap interval and a permutation p-value.

    Pairs with a NaN are dropped. Without ``noise`` the pairs are resampled and resamples whose
    ranks are all tied are skipped. With ``noise`` (y is a block's ΔLoss, a mean over eval windows:
    :class:`~zones.analysis.unit_intervals.WindowNoise`, one row per pair) blocks and windows are
    resampled together and undefined resamples counted as 0 (``undefined``: their share).
    With fewer than 3 pairs, or a constant x or y, every field but ``n`` is NaN.
    """
    n_resamples = check_int(n_resamples, "n_resamples", min=1)
    n_permutations = check_int(n_permutations, "n_permutations", min=1)
    level = check_level(level)
    if noise is not None:
        x, y, keep = _finite_columns(x, y)
        noise = noise.rows(keep)
    else:
        x, y = _paired(x, y)
    n = int(x.size)
    nan = float("nan")
    rho = spearman_rho(x, y)
    if np.isnan(rho):
        return Correlation(nan, nan, nan, nan, n)
    undefined = 0.0
    if noise is not None:
        _, low, high = interval = unit_window_bootstrap([x, y], _ranked_rho, noise=noise, n_resamples=n_resamples,
                                                        level=level, seed=seed)
        undefined = interval.undefined
    else:   # resampled blocks are ranked again; resamples with all ranks tied are rare and left out
        interval = paired_bootstrap(lambda a, b: _ranked_rho(a, b), (x, y), n_resamples=n_resamples, level=level,
                                    seed=seed)
        low, high = interval.low, interval.high
    # Under the null every pairing of the ranks is equally likely; |ρ| makes the test two-sided.
    p_value = seeded(scipy.stats.permutation_test, (rankdata(x), rankdata(y)),
                     lambda a, b, axis=-1: np.abs(_corr_rows(a, b)), permutation_type="pairings",
                     vectorized=True, n_resamples=n_permutations, alternative="greater", seed=seed).pvalue
    return Correlation(rho, float(low), float(high), float(p_value), n, undefined)


def _finite_columns(*values) -> tuple:
    """The columns as float arrays without the rows where one is not finite, and the kept mask."""
    columns = [np.asarray(v, dtype=float).ravel() for v in values]
    if len({c.size for c in columns}) != 1:
        raise ValueError(f"the columns differ in length: {[c.size for c in columns]}")
    keep = np.logical_and.reduce([np.isfinite(c) for c in columns])
    return (*(c[keep] for c in columns), keep)


# --- controlling for depth -----------------------------------------------------------------------

DEPTH_COLUMNS = ["model", "kind", "rho", "ci_low", "ci_high", "p_value", "n_blocks", "undefined"]
DEPTH_KINDS = {"raw": "raw ρ (the paper's figure)", "partial_depth": "ρ partialled on block index",
               "without_ends": "ρ without the first and last blocks",
               "partial_relative_depth": "ρ partialled on relative depth (models pooled)"}


def _residuals(a: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``a`` minus its least-squares line on ``z``, along the last axis (NaN where z is constant)."""
    zc = z - z.mean(axis=-1, keepdims=True)
    ac = a - a.mean(axis=-1, keepdims=True)
    szz = (zc * zc).sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = np.where(szz > 0, (zc * ac).sum(axis=-1, keepdims=True) / szz, np.nan)
    return ac - slope * zc


def _partial_rows(x: np.ndarray, y: np.ndarray, z: np.ndarray, axis: int = -1) -> np.ndarray:
    """Partial Spearman ρ along the last axis: every variable ranked again (a resample's ties),
    rank(x) and rank(y) each regressed on rank(z), the Pearson correlation of the residuals."""
    rx, ry, rz = (rankdata(v, axis=-1) for v in (x, y, z))
    return _corr_rows(_residuals(rx, rz), _residuals(ry, rz))


def partial_spearman(x, y, z, *, noise: WindowNoise | None = None, n_resamples: int = N_RESAMPLES,
                     n_permutations: int = N_PERMUTATIONS, level: float = 0.95, seed: int = 0) -> Correlation:
    """Spearman ρ of (x, y) partialled on z (block index, or relative depth), with a percentile
    interval and a permutation p-value: the residuals of rank(y) shuffled against those of rank(x)
    (Kennedy's test; two-sided).

    The interval resamples the triples (ranks recomputed in each resample) and, with ``noise``
    (y a block's ΔLoss: :class:`~zones.analysis.unit_intervals.WindowNoise`, one row per triple),
    the eval windows behind y as well. A resample in which the partial ρ is undefined (x's ranks
    wholly explained by z's: α monotone in depth among the blocks drawn) counts as 0, and its
    share is ``undefined``: above :data:`~zones.analysis.unit_intervals.MAX_UNDEFINED` the partial
    ρ is not estimable at this design (:attr:`Correlation.estimable`). Triples with a NaN are
    dropped; with fewer than 4, or a residual that is constant, every field but ``n`` is NaN."""
    n_resamples = check_int(n_resamples, "n_resamples", min=1)
    n_permutations = check_int(n_permutations, "n_permutations", min=1)
    level = check_level(level)
    x, y, z, keep = _finite_columns(x, y, z)
    noise = noise.rows(keep) if noise is not None else None
    n = int(x.size)
    nan = float("nan")
    rho = float(_partial_rows(x, y, z)) if n >= 4 else nan
    if not np.isfinite(rho):
        return Correlation(nan, nan, nan, nan, n)
    interval = unit_window_bootstrap([x, y, z], _partial_rows, noise=noise, n_resamples=n_resamples, level=level,
                                     seed=seed)
    rz = rankdata(z)
    ex, ey = _residuals(rankdata(x), rz), _residuals(rankdata(y), rz)
    p_value = seeded(scipy.stats.permutation_test, (ex, ey),
                     lambda a, b, axis=-1: np.abs(_corr_rows(a, b)), permutation_type="pairings",
                     vectorized=True, n_resamples=n_permutations, alternative="greater", seed=seed).pvalue
    return Correlation(rho, float(interval[1]), float(interval[2]), float(p_value), n, interval.undefined)


def without_ends(table: pd.DataFrame, n_blocks: int | None = None) -> pd.DataFrame:
    """The rows of a per-block table (``layer`` column) without the model's first and last block
    (block 0 and block ``n_blocks − 1``; by default the table's largest layer)."""
    if "layer" not in table.columns:
        raise ValueError("the table has no layer column")
    last = int(table["layer"].max()) if n_blocks is None else int(n_blocks) - 1
    return table[(table["layer"] != 0) & (table["layer"] != last)]


def window_noise(windows: pd.DataFrame | None, layers) -> WindowNoise | None:
    """The per-window ΔLoss of ``layers`` (in that order) from an ablation's long table
    (``zones.measure.ablation.ablation_window_losses``: ``layer, window, nll, base_nll, n_tokens``),
    as :class:`~zones.analysis.unit_intervals.WindowNoise`; None without a table."""
    if windows is None:
        return None
    missing = {"layer", "window", "nll", "base_nll", "n_tokens"} - set(windows.columns)
    if missing:
        raise ValueError(f"the per-window ablation table lacks column(s) {sorted(missing)}")
    wide = windows.assign(delta=windows["nll"] - windows["base_nll"]).pivot(index="layer", columns="window")
    layers = [int(v) for v in layers]
    absent = sorted(set(layers) - set(int(i) for i in wide.index))
    if absent:
        raise ValueError(f"the per-window ablation table has no rows for block(s) {absent}")
    return WindowNoise(wide["delta"].loc[layers].to_numpy(float), wide["n_tokens"].loc[layers].to_numpy(float))


def depth_controlled(table: pd.DataFrame, *, label: str = "", windows: pd.DataFrame | None = None,
                     n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS,
                     seed: int = 0) -> pd.DataFrame:
    """One model's ρ(α, ΔLoss) three ways (rows ``kind``): ``raw`` (:func:`spearman`, the
    paper's figure), ``partial_depth`` (:func:`partial_spearman` on block index) and
    ``without_ends`` (:func:`spearman` without the first and last blocks), each with its
    interval and permutation p (the same seed). ``table``: ``layer, alpha, delta_loss``
    (:func:`importance_table`); ``windows``: the ablation's per-window table, so that every
    interval resamples the eval windows behind ΔLoss as well as the blocks (:func:`window_noise`).
    Columns :data:`DEPTH_COLUMNS` (``undefined``: the share of resamples left undefined)."""
    missing = {"layer", "alpha", "delta_loss"} - set(table.columns)
    if missing:
        raise ValueError(f"the importance table lacks column(s) {sorted(missing)}")
    options = dict(n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    inner = without_ends(table)
    results = {"raw": spearman(table["alpha"], table["delta_loss"], noise=window_noise(windows, table["layer"]),
                               **options),
               "partial_depth": partial_spearman(table["alpha"], table["delta_loss"], table["layer"],
                                                 noise=window_noise(windows, table["layer"]), **options),
               "without_ends": spearman(inner["alpha"], inner["delta_loss"],
                                        noise=window_noise(windows, inner["layer"]), **options)}
    return pd.DataFrame([dict(model=label, kind=kind, rho=c.rho, ci_low=c.ci_low, ci_high=c.ci_high,
                              p_value=c.p_value, n_blocks=c.n, undefined=c.undefined) for kind, c in results.items()],
                        columns=DEPTH_COLUMNS)


ATTRIBUTION_COLUMNS = ["model", "alpha_role", "kind", "rho", "ci_low", "ci_high", "p_value", "n_blocks", "undefined"]


def attribution(result: "ModelImportance", alpha_estimator: str = "alpha_shape", roles: Sequence[str] = ("weighted", "q"),
                **options) -> pd.DataFrame:
    """Where one model's ρ(α, ΔLoss) comes from: :func:`depth_controlled` (raw, partialled on
    block index, without the end blocks; blocks and eval windows resampled) for the α of each of
    ``roles`` (the weighted α the paper's ρ reads, and the Q-projection α of its profile).
    Columns :data:`ATTRIBUTION_COLUMNS`."""
    parts = [depth_controlled(result.importance(alpha_estimator, role), label=result.label, windows=result.windows,
                              **options).assign(alpha_role=role) for role in roles]
    return pd.concat(parts, ignore_index=True)[ATTRIBUTION_COLUMNS]


def relative_depth(layers) -> np.ndarray:
    """Block index / (number of blocks − 1): 0 for the first block, 1 for the last."""
    layers = np.asarray(layers, dtype=float)
    span = layers.max() if layers.size else 0.0
    return layers / span if span > 0 else np.zeros_like(layers)


def pooled_partial(frame: pd.DataFrame, *, windows: Mapping[str, pd.DataFrame | None] | None = None,
                   n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Every model's blocks pooled (``model, layer, alpha, delta_loss``): ρ(α, ΔLoss)
    partialled on each block's relative depth in its own model (:func:`relative_depth`),
    blocks resampled across models and, with every model's per-window table in ``windows``
    (label → table), each model's eval windows within it. One row (``model="pooled"``,
    ``kind="partial_relative_depth"``), columns :data:`DEPTH_COLUMNS`."""
    depth = frame.groupby("model", sort=False)["layer"].transform(lambda s: pd.Series(relative_depth(s), index=s.index))
    parts = [window_noise((windows or {}).get(str(label)), part["layer"])
             for label, part in frame.groupby("model", sort=False)]
    noise = WindowNoise.stack(parts) if parts and all(p is not None for p in parts) else None
    ordered = pd.concat([part for _, part in frame.groupby("model", sort=False)])   # the noise's row order
    c = partial_spearman(ordered["alpha"], ordered["delta_loss"], depth.loc[ordered.index], noise=noise,
                         n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    return pd.DataFrame([dict(model="pooled", kind="partial_relative_depth", rho=c.rho, ci_low=c.ci_low,
                              ci_high=c.ci_high, p_value=c.p_value, n_blocks=c.n, undefined=c.undefined)],
                        columns=DEPTH_COLUMNS)


def depth_table(frame: pd.DataFrame, *, windows: Mapping[str, pd.DataFrame | None] | None = None,
                **options) -> pd.DataFrame:
    """:func:`depth_controlled` for each model of an :func:`importance_frame` (``model`` column;
    ``windows``: label → the model's per-window ablation table), and with several models one
    :func:`pooled_partial` row."""
    windows = windows or {}
    parts = [depth_controlled(part, label=str(label), windows=windows.get(str(label)), **options)
             for label, part in frame.groupby("model", sort=False)]
    if frame["model"].nunique() > 1:
        parts.append(pooled_partial(frame, windows=windows, **options))
    return pd.concat(parts, ignore_index=True)


# --- importance against α ------------------------------------------------------------------------

def importance_table(ablation: pd.DataFrame, alpha: pd.Series) -> pd.DataFrame:
    """The ablation table with the block's α beside it: its columns plus ``alpha``.

    ``alpha`` is indexed by layer (``zones.spectra.layer_alpha``); blocks missing from either
    side are dropped.
    """
    missing = {"layer", "delta_loss"} - set(ablation.columns)
    if missing:
        raise ValueError(f"the ablation table lacks column(s) {sorted(missing)}")
    values = pd.Series(alpha, dtype=float).rename("alpha")
    values.index = values.index.astype(int)
    table = ablation.merge(values.rename_axis("layer").reset_index(), on="layer", how="inner")
    return table.sort_values("layer").reset_index(drop=True)


def rho_table(ablation: pd.DataFrame, alphas: pd.DataFrame, *, estimators: Sequence[str] | None = None,
              roles: Sequence[str] | None = None, value: str = "delta_loss", windows: pd.DataFrame | None = None,
              n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ between a block's ``value`` (ΔLoss) and its α, for each estimator × role.

    ``windows``: the ablation's per-window table, so that each interval resamples the eval windows
    behind ΔLoss with the blocks (:func:`window_noise`; for ``value="delta_loss"`` only).
    ``alphas`` is ``zones.spectra.alpha_table(model)``; ``estimators`` default to the columns of
    ``ESTIMATORS`` it has with any finite value, ``roles`` to ``"weighted"`` and then each role.
    Columns: ``estimator, role, rho, ci_low, ci_high, p_value, n_layers``.
    """
    if value not in ablation.columns:
        raise ValueError(f"the ablation table has no column {value!r}")
    if estimators is None:
        estimators = [e for e in ESTIMATORS if e in alphas.columns and alphas[e].notna().any()]
    if roles is None:
        roles = ["weighted", *alphas["role"].drop_duplicates()]
    importance = ablation.set_index("layer")[value]
    noise = window_noise(windows, importance.index) if value == "delta_loss" else None
    rows = []
    for alpha_estimator in estimators:
        for role in roles:
            alpha = layer_alpha(alphas, alpha_estimator=alpha_estimator, alpha_role=role).reindex(importance.index)
            result = spearman(alpha.to_numpy(), importance.to_numpy(), noise=noise, n_resamples=n_resamples,
                              n_permutations=n_permutations, seed=seed)
            rows.append(dict(estimator=alpha_estimator, role=role, rho=result.rho, ci_low=result.ci_low,
                             ci_high=result.ci_high, p_value=result.p_value, n_layers=result.n))
    return pd.DataFrame(rows, columns=RHO_COLUMNS)


# --- several models ------------------------------------------------------------------------------

@dataclass
class ModelImportance:
    """One model's ablation and α tables, as the chapters use them."""

    name: str          # as given: alias, directory, .gguf file or hub id
    label: str         # short and unique, for panels and legends
    fingerprint: str
    n_blocks: int
    ablation: pd.DataFrame   # zones.measure.ablation.ablation_table
    alphas: pd.DataFrame     # zones.spectra.alpha_table
    dtype: str = "float32"   # the precision the ablation was scored in (resolved: never "auto")
    windows: pd.DataFrame | None = None   # zones.measure.ablation.ablation_window_losses: ΔLoss per eval window

    def importance(self, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted") -> pd.DataFrame:
        """``importance_table`` with this model's α, plus a ``model`` column (the label)."""
        table = importance_table(self.ablation, layer_alpha(self.alphas, alpha_estimator=alpha_estimator, alpha_role=alpha_role))
        table.insert(0, "model", self.label)
        return table


def model_labels(names: Sequence[str]) -> list[str]:
    """Short unique labels: an alias or hub id as given, a path by its last part."""
    labels = []
    for name in names:
        path = Path(str(name))
        label = path.name if (path.exists() or str(name).startswith((".", "/", "~"))) else str(name)
        base, i = label, 2
        while label in labels:
            label, i = f"{base} ({i})", i + 1
        labels.append(label)
    return labels


def measure_models(models: Sequence[str] | str, *, corpus: str = "stdlib", seq_len: int = 256,
                   eval_tokens: int | None = DEFAULT_EVAL_TOKENS, batch_size: int = 8,
                   parts: bool = False, split: str = "eval", device: str | None = None,
                   progress: bool = True, dtype: str = DEFAULT_DTYPE) -> list[ModelImportance]:
    """Ablation and α tables of each model in turn, on the same corpus and token budget.

    Both tables are cached, so a second chapter with the same parameters only reads them (and
    one on fewer tokens reads the first batches). ``eval_tokens=None`` scores the whole split;
    ``dtype`` is the ablation's scoring precision (``"auto"``: bfloat16 where native).
    """
    names = [models] if isinstance(models, str) else list(models)
    if not names:
        raise ValueError("models is empty: give at least one model name")
    text = load_corpus(corpus)  # an unknown or empty corpus fails before any model loads
    results = []
    for name, label in zip(names, model_labels(names)):
        loaded = load_model(name, device=device)
        windows = corpus_windows(text, loaded.tokenizer, seq_len, split, eval_tokens)
        subject = as_subject(loaded.model, dtype, fingerprint=loaded.fingerprint)  # precision resolved once
        long = ablation_window_losses(subject, windows, parts=parts, batch_size=batch_size, progress=progress)
        table = summarize(long, parts)
        alphas = alpha_table(loaded.model)
        results.append(ModelImportance(name, label, loaded.fingerprint, len(table), table, alphas, subject.dtype,
                                       long))
        del loaded
        gc.collect()
    return results


def importance_frame(results: Iterable[ModelImportance], alpha_estimator: str = "alpha_shape",
                     alpha_role: str = "weighted") -> pd.DataFrame:
    """One tidy table for every model: ``model`` (label), the ablation columns, ``alpha``."""
    return pd.concat([r.importance(alpha_estimator, alpha_role) for r in results], ignore_index=True)


# --- reading ρ tables and ablation tables --------------------------------------------------------

def delta_loss_bounds(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """An ablation table's ΔLoss interval (``delta_loss_low, delta_loss_high``), NaN where the
    table has no interval columns (no verdict is drawn from it then)."""
    if {"delta_loss_low", "delta_loss_high"} <= set(table.columns):
        return table["delta_loss_low"].astype(float), table["delta_loss_high"].astype(float)
    nan = pd.Series(float("nan"), index=table.index)
    return nan, nan


RESOLVED_SHARE = 1 / 3   # a block's place is resolved when its half-width is at most this share of the gap


def ranking_resolution(table: pd.DataFrame) -> pd.DataFrame:
    """Whether each block's place in the ranking by ΔLoss rests on window noise: blocks ranked
    by ΔLoss (largest first), ``gap`` to the nearest-ranked block (the smaller of the gaps above
    and below), ``half_width`` of its ΔLoss interval, and ``resolved``: half-width ≤
    :data:`RESOLVED_SHARE` × gap (NaN without intervals). Columns ``layer, rank, delta_loss,
    gap, half_width, resolved``."""
    low, high = delta_loss_bounds(table)
    ranked = pd.DataFrame(dict(layer=table["layer"].astype(int).to_numpy(),
                               delta_loss=table["delta_loss"].astype(float).to_numpy(),
                               half_width=((high - low) / 2).to_numpy()))
    ranked = ranked.sort_values("delta_loss", ascending=False, ignore_index=True)
    values = ranked["delta_loss"].to_numpy()
    above = np.r_[np.inf, values[:-1] - values[1:]]
    below = np.r_[values[:-1] - values[1:], np.inf]
    ranked["gap"] = np.minimum(above, below)
    ranked["rank"] = np.arange(1, len(ranked) + 1)
    resolved = ranked["half_width"] <= RESOLVED_SHARE * ranked["gap"]
    ranked["resolved"] = resolved.where(ranked["half_width"].notna())
    return ranked[["layer", "rank", "delta_loss", "gap", "half_width", "resolved"]]


def holm(p_values) -> list[float]:
    """Holm–Bonferroni adjusted p-values (same order as given; NaN stays NaN): the i-th smallest
    of m p-values is multiplied by m − i + 1, then made monotone and capped at 1."""
    values = [float(p) for p in p_values]
    order = sorted((i for i, p in enumerate(values) if p == p), key=lambda i: values[i])
    m = len(order)
    adjusted = [float("nan")] * len(values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * values[i]))
        adjusted[i] = running
    return adjusted


def strongest(rhos: pd.DataFrame) -> dict | None:
    """The (estimator, role) with the largest |ρ| in a :func:`rho_table`, with an allowance for
    having picked it: ``n_tested`` pairs were looked at, so its p-value is Holm-adjusted over all
    of them (``p_holm``; for the smallest p this is Bonferroni, n · p), and ``n_significant``
    pairs have a Holm-adjusted p below 0.05. Also how many others are *not separable* from it:
    their interval contains its ρ (a conservative check). ``None`` if no ρ is finite.

    Returns ``estimator, role, rho, ci_low, ci_high, p_value, p_holm, n_tested, n_significant,
    n_close`` and ``close`` (the others, as ``"estimator (role)"`` strings)."""
    table = rhos.dropna(subset=["rho"])
    if table.empty:
        return None
    adjusted = pd.Series(holm(table["p_value"]), index=table.index) if "p_value" in table else None
    best = table.loc[table["rho"].abs().idxmax()]
    others = table.drop(index=best.name)
    close = others[(others["ci_low"] <= best["rho"]) & (best["rho"] <= others["ci_high"])]
    return dict(estimator=str(best["estimator"]), role=str(best["role"]), rho=float(best["rho"]),
                ci_low=float(best["ci_low"]), ci_high=float(best["ci_high"]),
                p_value=float(best["p_value"]) if adjusted is not None else float("nan"),
                p_holm=float(adjusted[best.name]) if adjusted is not None else float("nan"),
                n_tested=int(len(table)),
                n_significant=int((adjusted < 0.05).sum()) if adjusted is not None else 0,
                n_close=int(len(close)), close=[f"{e} ({r})" for e, r in zip(close["estimator"], close["role"])])
