"""The α profile over depth, with intervals that resample blocks: its trend, its shape (line
and parabola), and whether Q/K vary with depth more than V/O.

Intervals resample *blocks* (``zones.analysis.unit_intervals.unit_bootstrap``): the blocks of one
model are the units, and a resample draws as many blocks as the model has, with replacement.
Each function labels its result by where the interval lies (``interval_side``); the verdicts
that read those labels are the report's (``zones.report.verdicts``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from zones.analysis.importance import spearman
from zones.analysis.unit_intervals import NAN, interval_side, slope, unit_bootstrap
from zones.measure.bootstrap import N_RESAMPLES
from zones.spectra import role_group

TREND_COLUMNS = ["role", "group", "first_fit", "last_fit", "rise", "rise_low", "rise_high", "trend", "n_blocks"]
SHAPE_COLUMNS = ["role", "shape", "rise", "rise_low", "rise_high", "rank_trend", "rank_trend_low", "rank_trend_high",
                 "rank_trend_p", "curvature", "curvature_low", "curvature_high", "vertex", "top_block", "top_value",
                 "n_blocks", "peak_lift", "peak_lift_low", "peak_lift_high"]


def trend_word(low: float, high: float) -> str:
    """``rises`` (interval above 0), ``falls`` (below 0), ``flat within noise`` or ``undefined``."""
    return {"above": "rises", "below": "falls", "straddles": "flat within noise",
            "undefined": "undefined"}[interval_side(low, high, 0.0)]


def depth_trend(table: pd.DataFrame, alpha_estimator: str = "alpha_shape", *, n_resamples: int = N_RESAMPLES,
                seed: int = 0) -> pd.DataFrame:
    """How each role's value changes from the first block to the last, with a 95% interval.

    One row per role: ``role, group``; ``first_fit, last_fit`` (the least-squares line of the
    value against relative depth layer / (L − 1), at 0 and 1); ``rise`` (last_fit −
    first_fit, the fitted change over the whole depth) and its bootstrap interval
    ``rise_low, rise_high`` (blocks resampled); ``trend`` (:func:`trend_word`: ``rises`` when the
    interval lies above 0, ``falls`` below, ``flat within noise`` when it includes 0);
    ``n_blocks``. Blocks with a NaN value are left out.
    """
    rows = []
    for role, part in table.groupby("role", sort=False):
        part = part[["layer", alpha_estimator]].dropna().sort_values("layer")
        n_blocks = int(table["layer"].nunique())
        x = part["layer"].to_numpy(float) / max(n_blocks - 1, 1)
        y = part[alpha_estimator].to_numpy(float)
        if len(part) >= 2:
            rise, low, high = unit_bootstrap([x, y], slope, n_resamples=n_resamples, seed=seed)
            first = float(y.mean() - rise * x.mean())
        else:
            rise = low = high = first = NAN
        rows.append(dict(role=role, group=role_group(role), first_fit=first, last_fit=first + rise, rise=rise,
                         rise_low=low, rise_high=high, trend=trend_word(low, high), n_blocks=int(len(part))))
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


def quadratic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Least-squares ``(a, b, c)`` of y = a + b·x + c·x² along the last axis: shape (..., 3)."""
    moments = np.stack([(x ** k).sum(axis=axis) for k in range(5)], axis=-1)
    gram = np.stack([moments[..., i:i + 3] for i in range(3)], axis=-2)
    rhs = np.stack([(x ** k * y).sum(axis=axis) for k in range(3)], axis=-1)
    with np.errstate(all="ignore"):
        singular = np.abs(np.linalg.det(gram)) < 1e-12
        gram = np.where(singular[..., None, None], np.eye(3), gram)
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    return np.where(singular[..., None], np.nan, coef)


def curvature(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """c of the least-squares parabola y = a + b·x + c·x² (:func:`quadratic`)."""
    return quadratic(x, y, axis)[..., 2]


def peak_lift(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """How far the least-squares parabola rises from its value at x = 0 to its highest point on
    [0, 1] (the vertex when it lies inside, else the end): an inverted U's size, in α units."""
    a, b, c = np.moveaxis(quadratic(x, y, axis), -1, 0)
    with np.errstate(all="ignore"):
        vertex = np.clip(np.where(c != 0, -b / (2 * c), 1.0), 0.0, 1.0)
        top = np.maximum(np.maximum(a + b * vertex + c * vertex ** 2, a + b + c), a)
    return top - a


def profile_shape(table: pd.DataFrame, role: str = "q", alpha_estimator: str = "alpha_shape", *,
                  n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """The shape of one role's α profile over relative depth x = layer / (L − 1), with intervals
    (blocks resampled).

    ``rise`` (the least-squares line's change from x = 0 to 1, as :func:`depth_trend`: its size,
    in α units), ``rank_trend`` (Spearman ρ of the value with the block index, its permutation p
    ``rank_trend_p``: whether it rises, robust to one outlying block, which drags a line) and
    ``curvature`` (c of the least-squares y = a + b·x + c·x²), each with ``_low, _high``;
    ``vertex`` = −b / 2c (where the parabola turns); ``top_block, top_value`` (the block with the
    largest value). ``shape`` (first rule that applies): ``inverted U`` (curvature interval below
    0 and 0 < vertex < 1), ``rises`` (rank-trend interval above 0), ``falls`` (below 0),
    ``U-shaped`` (curvature interval above 0, 0 < vertex < 1), ``not separable`` (intervals
    include 0), ``undefined`` (fewer than three blocks). ``peak_lift`` (:func:`peak_lift`, with its
    interval): the parabola's rise from the first block to its top, the size of an inverted U.
    """
    part = table[table["role"] == role][["layer", alpha_estimator]].dropna().sort_values("layer")
    n_blocks = int(table["layer"].nunique())
    x = part["layer"].to_numpy(float) / max(n_blocks - 1, 1)
    y = part[alpha_estimator].to_numpy(float)
    if len(part) < 3:
        return dict(role=role, shape="undefined", rise=NAN, rise_low=NAN, rise_high=NAN, rank_trend=NAN,
                    rank_trend_low=NAN, rank_trend_high=NAN, rank_trend_p=NAN, curvature=NAN,
                    curvature_low=NAN, curvature_high=NAN, vertex=NAN, top_block=-1, top_value=NAN,
                    n_blocks=int(len(part)), peak_lift=NAN, peak_lift_low=NAN, peak_lift_high=NAN)
    rise, rise_low, rise_high = unit_bootstrap([x, y], slope, n_resamples=n_resamples, seed=seed)
    trend = spearman(x, y, n_resamples=n_resamples, seed=seed)
    bend, c_low, c_high = unit_bootstrap([x, y], curvature, n_resamples=n_resamples, seed=seed)
    lift, lift_low, lift_high = unit_bootstrap([x, y], peak_lift, n_resamples=n_resamples, seed=seed)
    _, b, c = quadratic(x, y)
    vertex = float(-b / (2 * c)) if c != 0 else NAN
    interior = 0 < vertex < 1
    curve, line = interval_side(c_low, c_high, 0.0), interval_side(trend.ci_low, trend.ci_high, 0.0)
    if curve == "below" and interior:
        shape = "inverted U"
    elif line == "above":
        shape = "rises"
    elif line == "below":
        shape = "falls"
    elif curve == "above" and interior:
        shape = "U-shaped"
    else:
        shape = "undefined" if "undefined" in (curve, line) else "not separable"
    top = int(np.argmax(y))
    return dict(role=role, shape=shape, rise=float(rise), rise_low=rise_low, rise_high=rise_high,
                rank_trend=trend.rho, rank_trend_low=trend.ci_low, rank_trend_high=trend.ci_high,
                rank_trend_p=trend.p_value, curvature=float(bend), curvature_low=c_low, curvature_high=c_high, vertex=vertex,
                top_block=int(part["layer"].iloc[top]), top_value=float(y[top]), n_blocks=int(len(part)),
                peak_lift=float(lift), peak_lift_low=lift_low, peak_lift_high=lift_high)


def group_profile(table: pd.DataFrame, alpha_estimator: str = "alpha_shape") -> pd.DataFrame:
    """Per (layer, group): the mean ``value`` over the group's roles (Q/K, V/O, MLP)."""
    df = table.assign(group=table["role"].map(role_group))
    return df.groupby(["layer", "group"], as_index=False)[alpha_estimator].mean().rename(columns={alpha_estimator: "value"})


def std_ratio(qk: np.ndarray, vo: np.ndarray, axis: int = -1) -> np.ndarray:
    """std(Q/K) / std(V/O) over layers (ddof = 1), vectorized over ``axis``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.std(qk, axis=axis, ddof=1) / np.std(vo, axis=axis, ddof=1)


def qk_vo_asymmetry(profile: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Does Q/K vary with depth more than V/O? ``profile``: ``layer, group, value`` (one
    value per layer and group, e.g. :func:`group_profile` or ``zones.analysis.lifecycle.final_profile``).

    The statistic is the ratio of standard deviations over layers, std(Q/K) / std(V/O), with a
    bootstrap interval that resamples layers (the same layers for both groups). Returns
    ``ratio, ratio_low, ratio_high, qk_std, vo_std, n_layers`` and ``asymmetry``: ``Q/K larger``
    (interval above 1), ``V/O larger`` (below 1), ``not separable`` or ``undefined``.
    """
    wide = profile.pivot_table(index="layer", columns="group", values="value").dropna(
        subset=[g for g in ("Q/K", "V/O") if g in set(profile["group"])])
    if not {"Q/K", "V/O"} <= set(wide.columns):
        return dict(ratio=NAN, ratio_low=NAN, ratio_high=NAN, qk_std=NAN, vo_std=NAN, n_layers=0,
                    asymmetry="undefined")
    qk, vo = wide["Q/K"].to_numpy(float), wide["V/O"].to_numpy(float)
    ratio, low, high = unit_bootstrap([qk, vo], std_ratio, n_resamples=n_resamples, seed=seed)
    word = {"above": "Q/K larger", "below": "V/O larger", "straddles": "not separable",
            "undefined": "undefined"}[interval_side(low, high, 1.0)]
    return dict(ratio=float(ratio), ratio_low=low, ratio_high=high, qk_std=float(np.std(qk, ddof=1)),
                vo_std=float(np.std(vo, ddof=1)), n_layers=int(len(wide)), asymmetry=word)
