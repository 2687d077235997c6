"""The pictures the estimators read, as tidy tables: what α_shape and the power-law α are fits *of*.

- :func:`rank_picture`: the singular values against their rank, log–log, with the rank window
  the spectral-shape fit uses and its fitted line log σ_k = c − α log k
  (``zones.spectra.shape.fit_alpha_shape``);
- :func:`density_picture`: the eigenvalue density on log-spaced bins, log–log, with the tail
  λ ≥ x_min the power-law fit uses and its fitted density
  (``zones.spectra.esd.fit_esd``, WeightWatcher's fit).

Both call the library's estimators and only add what a chart needs (the intercept, the bins,
the fitted curve); the α they return is the estimator's own.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from zones.core.checks import check_float, check_int
from zones.spectra.esd import EVALS_THRESHOLD, EsdFit, fit_esd
from zones.spectra.shape import DEFAULT_WINDOW, _window_bounds, check_window, fit_alpha_shape

RANK_COLUMNS = ["rank", "sigma", "in_window", "fitted"]
DENSITY_COLUMNS = ["x", "x_low", "x_high", "density", "count", "in_tail"]
LINE_COLUMNS = ["x", "density"]


def _ascending(eigenvalues) -> np.ndarray:
    lam = np.sort(np.asarray(eigenvalues, dtype=np.float64))
    if lam.ndim != 1 or lam.size == 0 or not np.all(np.isfinite(lam)):
        raise ValueError("eigenvalues must be a non-empty 1-D array of finite numbers")
    return lam


def rank_picture(eigenvalues, window: tuple[float, float] = DEFAULT_WINDOW) -> tuple[pd.DataFrame, float, float]:
    """``(table, alpha, r2)``: one row per singular value σ_k = √λ_k in descending order.

    Columns ``RANK_COLUMNS``: ``rank`` k (1 = the largest), ``sigma``, ``in_window`` (the ranks
    the fit uses: ⌊lo·n⌋+1 … ⌊hi·n⌋), ``fitted`` (the least-squares line exp(c − α log k) on the
    window, NaN elsewhere). α and R² are ``fit_alpha_shape``'s; the intercept c is the line's
    through the window's means (ȳ = c − α x̄, a property of least squares).
    """
    window = check_window(window)
    sv = np.sqrt(np.clip(_ascending(eigenvalues), 0.0, None))[::-1]
    n = len(sv)
    alpha, r2 = fit_alpha_shape(sv, window)
    lo, hi = _window_bounds(window, n)
    rank = np.arange(1, n + 1)
    in_window = (rank > lo) & (rank <= hi)
    fitted = np.full(n, np.nan)
    if math.isfinite(alpha):
        x, y = np.log(rank[in_window]), np.log(sv[in_window])
        intercept = y.mean() + alpha * x.mean()
        fitted[in_window] = np.exp(intercept - alpha * x)
    table = pd.DataFrame(dict(rank=rank, sigma=sv, in_window=in_window, fitted=fitted))
    return table, float(alpha), float(r2)


def density_picture(eigenvalues, *, bins: int = 40, scale: float = 1.0, threshold: float = EVALS_THRESHOLD,
                    line_points: int = 50, drop_lowest: float = 0.0) -> tuple[pd.DataFrame, pd.DataFrame, EsdFit]:
    """``(histogram, line, fit)``: the eigenvalue density the power-law fit reads, on log axes.

    ``fit`` is ``fit_esd(eigenvalues, threshold)`` (WeightWatcher's: eigenvalues ≤ ``threshold``
    dropped, x_min chosen by the Kolmogorov–Smirnov distance). The chart shows x = ``scale`` · λ
    (e.g. 1 / max(rows, cols), the Marchenko–Pastur scale); α does not depend on the scale.

    ``histogram`` (``DENSITY_COLUMNS``): ``bins`` log-spaced bins over the kept eigenvalues (all
    of them, or all but the smallest ``drop_lowest`` fraction: a square matrix's smallest
    eigenvalues reach down many decades and would squeeze the rest of the picture),
    ``x`` (the geometric centre), ``x_low, x_high``, ``density`` (count / (N · width), N the kept
    eigenvalues, so the bars integrate to the fraction drawn; empty bins are left out: a log axis
    has no 0),
    ``count``, ``in_tail`` (the bin holds eigenvalues at or above x_min). ``line`` (``LINE_COLUMNS``): the
    fitted density (n_tail / N) · (α − 1) / x_min · (x / x_min)^(−α) from x_min to the largest
    eigenvalue (empty when there is no fit).
    """
    bins = check_int(bins, "bins", min=2)
    scale = check_float(scale, "scale", min=0.0, min_inclusive=False)
    line_points = check_int(line_points, "line_points", min=2)
    drop_lowest = check_float(drop_lowest, "drop_lowest", min=0.0, max=1.0, max_inclusive=False)
    lam = _ascending(eigenvalues)
    fit = fit_esd(lam, threshold)
    kept = lam[lam > threshold] * scale
    drawn = kept[math.floor(drop_lowest * kept.size):]
    if drawn.size < 2 or drawn[0] == drawn[-1]:
        return pd.DataFrame(columns=DENSITY_COLUMNS), pd.DataFrame(columns=LINE_COLUMNS), fit
    edges = np.geomspace(drawn[0], drawn[-1], bins + 1)
    counts, _ = np.histogram(drawn, edges)
    width = np.diff(edges)
    xmin = fit.xmin * scale if math.isfinite(fit.xmin) else math.inf
    histogram = pd.DataFrame(dict(x=np.sqrt(edges[:-1] * edges[1:]), x_low=edges[:-1], x_high=edges[1:],
                                  density=counts / (kept.size * width), count=counts,
                                  in_tail=edges[1:] > xmin * (1 + 1e-12)))
    histogram = histogram[histogram["count"] > 0].reset_index(drop=True)
    if not math.isfinite(fit.alpha):
        return histogram, pd.DataFrame(columns=LINE_COLUMNS), fit
    x = np.geomspace(xmin, kept[-1], line_points)
    share = fit.n_tail / kept.size
    line = pd.DataFrame(dict(x=x, density=share * (fit.alpha - 1) / xmin * (x / xmin) ** (-fit.alpha)))
    return histogram, line, fit
