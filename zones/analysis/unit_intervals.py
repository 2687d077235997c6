"""Intervals over *units* (blocks, layers, snapshot steps), and where an interval lies.

* :func:`unit_bootstrap`: a percentile-bootstrap interval of a statistic, resampling units:
  paired columns through ``zones.measure.bootstrap.paired_bootstrap`` (the same procedure as the
  eval-window intervals), independent strata through ``scipy.stats.bootstrap(paired=False)``.
* :func:`unit_window_bootstrap`: blocks and eval windows resampled together (a block's ΔLoss is a
  mean over windows, :class:`WindowNoise`), undefined resamples counted, never dropped.
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

from zones.measure.bootstrap import LEVEL, N_RESAMPLES, paired_bootstrap, percentile_tails

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


# --- blocks and eval windows resampled together ---------------------------------------------------

MAX_UNDEFINED = 0.10   # above this share of undefined resamples a statistic is "not estimable at this design"
CHUNK = 250            # resamples drawn at once


class WindowNoise:
    """The measurement noise of a per-block value that is a mean over eval windows (a block's ΔLoss).

    ``delta`` (blocks, windows): each block's summed NLL difference (removed − full) on each window;
    ``tokens`` (blocks, windows): the tokens scored there (0 where a block was not scored on a window,
    as when several models' blocks are pooled and each has its own windows); ``strata`` (windows,):
    the group each window is resampled within (one per model). A block's value is
    ``delta[b] · c / tokens[b] · c`` for window counts ``c`` (all ones: the value the table holds)."""

    def __init__(self, delta, tokens, strata=None):
        self.delta = np.atleast_2d(np.asarray(delta, dtype=float))
        tokens = np.asarray(tokens, dtype=float)
        self.tokens = np.broadcast_to(tokens, self.delta.shape).copy()
        self.strata = np.zeros(self.delta.shape[1], dtype=int) if strata is None else np.asarray(strata, dtype=int)
        if self.strata.shape != (self.delta.shape[1],):
            raise ValueError(f"strata must give one group per window ({self.delta.shape[1]}); got {self.strata.shape}")

    @property
    def n_blocks(self) -> int:
        return int(self.delta.shape[0])

    def values(self, counts: np.ndarray | None = None) -> np.ndarray:
        """Each block's value for window ``counts`` (resamples, windows): (resamples, blocks); without
        counts, the value on the windows as scored (blocks,)."""
        if counts is None:
            return self.delta.sum(1) / self.tokens.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return (counts @ self.delta.T) / (counts @ self.tokens.T)

    def rows(self, keep) -> "WindowNoise":
        """The blocks ``keep`` (a boolean mask or indices) only."""
        return WindowNoise(self.delta[keep], self.tokens[keep], self.strata)

    def counts(self, rng: np.random.Generator, n_resamples: int) -> np.ndarray:
        """Window counts of ``n_resamples`` resamples (resamples, windows): each stratum's windows drawn
        with replacement within it, as many as it has."""
        out = np.zeros((n_resamples, self.strata.size))
        rows = np.arange(n_resamples)[:, None]
        for group in np.unique(self.strata):
            members = np.flatnonzero(self.strata == group)
            drawn = members[rng.integers(0, members.size, (n_resamples, members.size))]
            np.add.at(out, (np.broadcast_to(rows, drawn.shape), drawn), 1.0)
        return out

    @classmethod
    def stack(cls, parts: Sequence["WindowNoise"]) -> "WindowNoise":
        """Several models' blocks as one (block-diagonal: a block is scored on its own model's windows,
        each model's windows a stratum of their own)."""
        n_windows = [p.delta.shape[1] for p in parts]
        delta = np.zeros((sum(p.n_blocks for p in parts), sum(n_windows)))
        tokens = np.zeros_like(delta)
        strata, row, col = [], 0, 0
        for i, p in enumerate(parts):
            b, w = p.delta.shape
            delta[row:row + b, col:col + w], tokens[row:row + b, col:col + w] = p.delta, p.tokens
            strata.append(np.full(w, i))
            row, col = row + b, col + w
        return cls(delta, tokens, np.concatenate(strata))


class UnitInterval(tuple):
    """``(estimate, low, high)`` with ``undefined``: the share of resamples whose statistic was undefined
    (counted as 0 in the percentiles, never dropped)."""

    undefined: float

    def __new__(cls, estimate: float, low: float, high: float, undefined: float = 0.0):
        self = super().__new__(cls, (estimate, low, high))
        self.undefined = float(undefined)
        return self


def unit_window_bootstrap(columns: Sequence[np.ndarray], statistic: Callable[..., np.ndarray], *,
                          noise: WindowNoise | None = None, response: int = 1, n_resamples: int = N_RESAMPLES,
                          level: float = LEVEL, seed: int = 0) -> UnitInterval:
    """``statistic`` of paired ``columns`` (one entry per block) and its percentile interval, blocks
    resampled with replacement and, with ``noise``, the eval windows too: in every resample the
    column ``response`` (a block's ΔLoss) is recomputed from a resample of the windows (the same
    windows for every block: :class:`WindowNoise`), then the blocks are drawn. So the interval
    carries both the few blocks and the measurement noise of each block's value.

    A resample whose statistic is undefined (a flat resample: with α nearly monotone in depth, a
    partial ρ often is) is counted as 0, no association, and its share returned as
    ``undefined``, so an interval never rests on the resamples that happened to be defined.
    ``statistic(*columns, axis=-1)`` must be vectorized over the last axis. The percentiles are
    read at ``zones.measure.bootstrap.expanded_level`` of the blocks (few of them: wider). With
    fewer than three blocks, or a statistic that is not finite on the data, the interval is NaN."""
    columns = [np.asarray(c, dtype=float).ravel() for c in columns]
    if len({c.size for c in columns}) != 1:
        raise ValueError(f"paired columns differ in length: {[c.size for c in columns]}")
    n = columns[0].size
    if noise is not None and noise.n_blocks != n:
        raise ValueError(f"the window noise has {noise.n_blocks} blocks, the columns {n}")
    with np.errstate(all="ignore"):
        estimate = float(statistic(*columns, axis=-1))
    if n < 3 or not math.isfinite(estimate):
        return UnitInterval(estimate, NAN, NAN, 1.0 if n >= 3 else 0.0)
    rng = np.random.default_rng(seed)
    boot = []
    for start in range(0, n_resamples, CHUNK):
        r = min(CHUNK, n_resamples - start)
        blocks = rng.integers(0, n, (r, n))
        values = [np.broadcast_to(c, (r, n)) for c in columns]
        if noise is not None:
            values[response] = noise.values(noise.counts(rng, r))
        with np.errstate(all="ignore"):
            boot.append(statistic(*(np.take_along_axis(v, blocks, -1) for v in values), axis=-1))
    boot = np.concatenate(boot)
    defined = np.isfinite(boot)
    low, high = np.percentile(np.where(defined, boot, 0.0), percentile_tails(level, n))   # few blocks: wider
    return UnitInterval(estimate, float(low), float(high), float(1 - defined.mean()))
