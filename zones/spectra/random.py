"""Random matrices and the Marchenko–Pastur law: what the spectrum of a matrix with no structure looks like.

A rows × cols matrix W whose entries are independent, with mean 0 and variance σ², has (with
n = min(rows, cols), m = max(rows, cols) and the aspect ratio q = n / m in (0, 1]) Gram
eigenvalues λ_1 … λ_n (the squared singular values) whose scaled values x = λ / m follow, as n
and m grow at a fixed q, the Marchenko–Pastur law (Marchenko and Pastur, 1967)::

    p(x) = √((x₊ − x)(x − x₋)) / (2π σ² q x)  on  x₋ = σ²(1 − √q)² ≤ x ≤ x₊ = σ²(1 + √q)².

For q ≤ 1 it has no atom at zero: it is a probability density on [x₋, x₊]. Its mean is σ², so
the σ² of any matrix's own "random twin" is its mean squared entry (:func:`entry_variance`).

- :func:`marchenko_pastur_density`, :func:`marchenko_pastur_cdf`, :func:`marchenko_pastur_edges`;
- :func:`gaussian_matrix`, :func:`student_t_matrix`: seeded samples (Student-t entries with ν
  degrees of freedom have tails P(|w| > t) ∝ t^(−ν): heavy for small ν, Gaussian as ν → ∞);
- :func:`scaled_eigenvalues`: a matrix's x = λ / m, with its q and σ²;
- :func:`marchenko_pastur_fit`: how far a matrix's spectrum is from its random twin's (the
  Kolmogorov–Smirnov distance, and the eigenvalues beyond the bulk edge x₊).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from zones.core.checks import check_float, check_int
from zones.spectra.gram import gram_eigenvalues

_CDF_NODES = 4097  # the CDF table's nodes in the angle variable (error ~1e-10: the integrand is smooth)


def check_aspect_ratio(q) -> float:
    """The aspect ratio q = min(rows, cols) / max(rows, cols) as a float in (0, 1]."""
    return check_float(q, "aspect ratio q (min(rows, cols) / max(rows, cols))", min=0.0, max=1.0,
                       min_inclusive=False)


def _check_variance(sigma2) -> float:
    return check_float(sigma2, "sigma2 (the entries' variance)", min=0.0, min_inclusive=False)


def marchenko_pastur_edges(q: float, sigma2: float = 1.0) -> tuple[float, float]:
    """The support [x₋, x₊] = [σ²(1 − √q)², σ²(1 + √q)²] of the Marchenko–Pastur law."""
    q, sigma2 = check_aspect_ratio(q), _check_variance(sigma2)
    root = math.sqrt(q)
    return sigma2 * (1 - root) ** 2, sigma2 * (1 + root) ** 2


def marchenko_pastur_density(x, q: float, sigma2: float = 1.0) -> np.ndarray:
    """The Marchenko–Pastur density at ``x`` (scaled eigenvalues λ / max(rows, cols)); 0 outside
    the support. For q = 1 it diverges as x^(−1/2) at x = 0 (a finite value at every x > 0)."""
    lo, hi = marchenko_pastur_edges(q, sigma2)
    x = np.asarray(x, dtype=np.float64)
    inside = (x > lo) & (x < hi) & (x > 0)
    safe = np.where(inside, x, 1.0)
    value = np.sqrt(np.clip((hi - safe) * (safe - lo), 0.0, None)) / (2 * math.pi * sigma2 * q * safe)
    return np.where(inside, value, 0.0)


def _cdf_table(q: float, sigma2: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, F(x)) on a grid fine enough to interpolate. With x = x₋ + (x₊ − x₋)(1 − cos θ)/2 the
    square root becomes a sine and p(x) dx a smooth function of θ ∈ [0, π], so the cumulative
    trapezoid rule converges fast; the total is then exactly 1 up to its rounding."""
    lo, hi = marchenko_pastur_edges(q, sigma2)
    theta = np.linspace(0.0, math.pi, _CDF_NODES)
    half = (hi - lo) / 2
    x = lo + half * (1 - np.cos(theta))
    with np.errstate(divide="ignore", invalid="ignore"):
        integrand = np.where(x > 0, (half * np.sin(theta)) ** 2 / (2 * math.pi * sigma2 * q * x), 0.0)
    if q == 1.0:  # x₋ = 0: p dx = half² sin²θ / (2π σ² half (1 − cos θ)) dθ = half (1 + cos θ) / (2π σ²) dθ
        integrand = half * (1 + np.cos(theta)) / (2 * math.pi * sigma2)
    steps = (integrand[1:] + integrand[:-1]) / 2 * np.diff(theta)
    cdf = np.concatenate([[0.0], np.cumsum(steps)])
    return x, cdf


def marchenko_pastur_cdf(x, q: float, sigma2: float = 1.0) -> np.ndarray:
    """P(X ≤ x) under the Marchenko–Pastur law (0 below x₋, 1 above x₊)."""
    q, sigma2 = check_aspect_ratio(q), _check_variance(sigma2)
    grid, cdf = _cdf_table(q, sigma2)
    return np.interp(np.asarray(x, dtype=np.float64), grid, cdf, left=0.0, right=1.0)


def _generator(seed) -> np.random.Generator:
    return np.random.default_rng(check_int(seed, "seed", min=0))


def gaussian_matrix(rows: int, cols: int, *, sigma: float = 1.0, seed: int = 0) -> torch.Tensor:
    """A rows × cols float64 matrix of independent N(0, σ²) entries, from NumPy's generator seeded by ``seed``."""
    rows, cols = check_int(rows, "rows", min=1), check_int(cols, "cols", min=1)
    sigma = check_float(sigma, "sigma", min=0.0, min_inclusive=False)
    return torch.from_numpy(sigma * _generator(seed).standard_normal((rows, cols)))


def student_t_matrix(rows: int, cols: int, df: float, *, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    """A rows × cols float64 matrix of independent ``scale`` · t_ν entries (ν = ``df`` degrees of
    freedom; ``df=inf`` gives Gaussian entries). P(|w| > t) falls as t^(−ν): the variance is
    infinite for ν ≤ 2, and the smaller ν, the heavier the tail."""
    rows, cols = check_int(rows, "rows", min=1), check_int(cols, "cols", min=1)
    df = check_float(df, "df (Student-t degrees of freedom)", min=0.0, min_inclusive=False, finite=False)
    scale = check_float(scale, "scale", min=0.0, min_inclusive=False)
    rng = _generator(seed)
    values = rng.standard_normal((rows, cols)) if math.isinf(df) else rng.standard_t(df, (rows, cols))
    return torch.from_numpy(scale * values)


def student_t_variance(df: float, scale: float = 1.0) -> float:
    """The variance of ``scale`` · t_ν: scale² ν / (ν − 2) for ν > 2, infinite for ν ≤ 2."""
    df = check_float(df, "df (Student-t degrees of freedom)", min=0.0, min_inclusive=False, finite=False)
    if math.isinf(df):
        return scale ** 2
    return scale ** 2 * df / (df - 2) if df > 2 else math.inf


def entry_variance(matrix) -> float:
    """The mean squared entry ‖W‖²_F / (rows · cols): the σ² of the matrix's random twin (the
    Marchenko–Pastur law with the same mean eigenvalue)."""
    w = torch.as_tensor(matrix).detach().to(torch.float64)
    return float((w * w).mean())


@dataclass(frozen=True)
class ScaledSpectrum:
    """A matrix's Gram eigenvalues (``eigenvalues``, ascending, float64) and their scaled values
    ``x = eigenvalues / m``, with m = max(rows, cols), q = min / max and σ² = mean squared entry."""

    eigenvalues: np.ndarray
    x: np.ndarray
    rows: int
    cols: int
    q: float
    sigma2: float


def scaled_eigenvalues(matrix) -> ScaledSpectrum:
    """The spectrum of ``matrix`` on the Marchenko–Pastur scale (see :class:`ScaledSpectrum`);
    the eigenvalues are the library's own (``zones.spectra.gram.gram_eigenvalues``)."""
    w = torch.as_tensor(matrix).detach()
    if w.dim() != 2 or w.numel() == 0:
        raise ValueError(f"expected a non-empty 2-D matrix, got shape {tuple(w.shape)}")
    lam = gram_eigenvalues([w])[0]
    if lam is None:
        raise ValueError("the matrix has non-finite entries: it has no spectrum")
    rows, cols = (int(s) for s in w.shape)
    m = max(rows, cols)
    lam = lam.cpu().numpy()
    return ScaledSpectrum(lam, lam / m, rows, cols, min(rows, cols) / m, entry_variance(w))


@dataclass(frozen=True)
class MarchenkoPasturFit:
    """How a spectrum compares with the Marchenko–Pastur law of its own q and σ²: ``ks_distance``
    (the largest gap between the two CDFs), ``edge`` (x₊), ``n_beyond`` (eigenvalues above x₊)
    and ``beyond_fraction`` (their share of the n), and ``top_over_edge`` (x_max / x₊)."""

    q: float
    sigma2: float
    ks_distance: float
    edge: float
    n_beyond: int
    beyond_fraction: float
    top_over_edge: float


def ks_distance(x, q: float, sigma2: float = 1.0) -> float:
    """Kolmogorov–Smirnov distance sup |F_n − F| between the empirical CDF of the scaled
    eigenvalues ``x`` and the Marchenko–Pastur CDF (checked on both sides of every jump)."""
    x = np.sort(np.asarray(x, dtype=np.float64))
    n = len(x)
    if n == 0:
        return math.nan
    cdf = marchenko_pastur_cdf(x, q, sigma2)
    steps = np.arange(1, n + 1) / n
    return float(max(np.max(np.abs(steps - cdf)), np.max(np.abs(steps - 1 / n - cdf))))


def marchenko_pastur_fit(spectrum: ScaledSpectrum, sigma2: float | None = None) -> MarchenkoPasturFit:
    """The spectrum against the Marchenko–Pastur law of its q and σ² (its own mean squared
    entry unless ``sigma2`` is given: the variance the entries were drawn with, say)."""
    sigma2 = spectrum.sigma2 if sigma2 is None else _check_variance(sigma2)
    _, edge = marchenko_pastur_edges(spectrum.q, sigma2)
    beyond = int(np.sum(spectrum.x > edge))
    return MarchenkoPasturFit(spectrum.q, sigma2, ks_distance(spectrum.x, spectrum.q, sigma2), edge, beyond,
                              beyond / len(spectrum.x), float(spectrum.x.max() / edge))
