"""Intervals over *units* (blocks, layers, snapshot steps), and where an interval lies.

* :func:`unit_bootstrap`: a percentile-bootstrap interval of a statistic, resampling units:
  paired columns through ``zones.measure.bootstrap.paired_bootstrap`` (the same procedure as the
  eval-window intervals), independent strata through ``scipy.stats.bootstrap(paired=False)``.
* :func:`interval_side`: a 95% interval against a threshold (``above``, ``below``,
  ``straddles``, ``undefined``), the reading every rule of the book starts from.
* :func:`slope` and :func:`slope_interval`: a least-squares slope, and its exact t interval
  (for few units, such as training runs, where a bootstrap cannot reach 95%).
"""
from __future__ import annotations

import math
import warnings
from typing import Callable, Sequence

import numpy as np
from scipy import stats

from zones.measure.bootstrap import LEVEL, N_RESAMPLES, paired_bootstrap

NAN = float("nan")


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


def slope(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Least-squares slope of y on x along ``axis`` (NaN where x is constant)."""
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    sxx = (x * x).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sxx > 0, (x * y).sum(axis=axis) / sxx, np.nan)


def slope_interval(x: np.ndarray, y: np.ndarray, level: float = LEVEL, axis: int = -1):
    """``(slope, low, high)`` of y on x along ``axis`` with its t interval (n − 2 degrees of
    freedom: exact when the points scatter normally and independently about a line). NaN
    bounds with fewer than three points or a constant x."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.shape[axis]
    b = slope(x, y, axis)
    if n < 3:
        nan = np.full(np.shape(b), np.nan)
        return b, nan, nan
    xc = x - x.mean(axis=axis, keepdims=True)
    yc = y - y.mean(axis=axis, keepdims=True)
    sxx = (xc * xc).sum(axis=axis)
    residual = yc - np.expand_dims(b, axis) * xc
    with np.errstate(invalid="ignore", divide="ignore"):
        se = np.sqrt((residual * residual).sum(axis=axis) / (n - 2) / sxx)
    half = stats.t.ppf(0.5 + level / 2, n - 2) * se
    return b, b - half, b + half
