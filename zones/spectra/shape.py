"""Estimators of a spectrum's shape: the spectral-shape α (the paper's) and its companions.

- ``alpha_shape``, ``alpha_shape_r2``: the negative slope of log σ_k against log k over a
  window of ranks (default the top half: fractions ``(lo, hi)`` of n), and the fit's R².
- ``stable_rank`` Σλ/λ_max, ``log_lambda_max`` log10 λ_max, and ``entropy`` (the spectral
  entropy normalised by the log of the numerical rank).

``fit_alpha_shape`` / ``alpha_shape`` take one spectrum of singular values (a reference
implementation); ``shape_alphas`` and ``companion_values`` work on a batch: the rows of ``lam``
are ascending eigenvalue spectra (λ = σ²) of equal length. The formulas are in
``book/methods/spectra.md``.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from zones.core.glossary import default

DEFAULT_WINDOW = tuple(default("window"))


def check_window(window: tuple[float, float]) -> tuple[float, float]:
    """The rank window as a pair of floats with 0 <= lo < hi <= 1 (ValueError otherwise)."""
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair of fractions (lo, hi), got {window!r}") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"window must satisfy 0 <= lo < hi <= 1, got {window!r}")
    return lo, hi


def _window_bounds(window: tuple[float, float], n: int) -> tuple[int, int]:
    return int(math.floor(window[0] * n)), int(math.floor(window[1] * n))


def fit_alpha_shape(sv: np.ndarray, window: tuple[float, float] = DEFAULT_WINDOW) -> tuple[float, float]:
    """(α, R²) of the least-squares line log σ_k ≈ c − α log k over the rank window.

    The window is a pair of fractions of n = len(sv): ranks k = ⌊lo·n⌋+1 … ⌊hi·n⌋. NaN when the
    window holds fewer than two ranks or a zero singular value.
    """
    sv = np.sort(np.asarray(sv, dtype=np.float64))[::-1]
    n = len(sv)
    lo, hi = _window_bounds(window, n)
    values = sv[lo:hi]
    if hi - lo < 2 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        return float("nan"), float("nan")
    x = np.log(np.arange(lo + 1, hi + 1, dtype=np.float64))
    y = np.log(values)
    xc, yc = x - x.mean(), y - y.mean()
    sxy, sxx, syy = float(xc @ yc), float(xc @ xc), float(yc @ yc)
    r2 = sxy * sxy / (sxx * syy) if syy > 0 else float("nan")
    return -sxy / sxx, r2


def alpha_shape(sv: np.ndarray, window: tuple[float, float] = DEFAULT_WINDOW) -> float:
    """Spectral-shape α: negative slope of log σ_k vs log k over the rank window (fractions of n)."""
    return fit_alpha_shape(sv, window)[0]


def shape_alphas(lam: torch.Tensor, window: tuple[float, float],
                 rank: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Spectral-shape (α, R²) per row; NaN where the window reaches numerically zero σ."""
    n = lam.shape[1]
    lo, hi = _window_bounds(window, n)
    nan = np.full(lam.shape[0], np.nan)
    if hi - lo < 2:
        return nan, nan.copy()
    sv = lam.flip(1)[:, lo:hi].sqrt()
    x = torch.log(torch.arange(lo + 1, hi + 1, dtype=lam.dtype, device=lam.device))
    xc = x - x.mean()
    y = torch.log(sv.clamp_min(torch.finfo(lam.dtype).tiny))
    yc = y - y.mean(1, keepdim=True)
    sxy, sxx, syy = yc @ xc, xc @ xc, (yc * yc).sum(1)
    alpha = -sxy / sxx
    r2 = torch.where(syy > 0, sxy * sxy / (sxx * syy), torch.full_like(syy, math.nan))
    bad = rank < hi  # a numerically zero singular value inside the window
    alpha = torch.where(bad, torch.full_like(alpha, math.nan), alpha)
    r2 = torch.where(bad, torch.full_like(r2, math.nan), r2)
    return alpha.cpu().numpy(), r2.cpu().numpy()


def companion_values(lam: torch.Tensor, rank: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable rank, log10 λ_max and entropy per row (NaN for an all-zero spectrum or rank ≤ 1)."""
    top = lam[:, -1]
    total = lam.sum(1)
    nan = torch.full_like(top, math.nan)
    stable = torch.where(top > 0, total / top, nan)
    log_top = torch.where(top > 0, torch.log10(top.clamp_min(torch.finfo(lam.dtype).tiny)), nan)
    p = lam / total.clamp_min(torch.finfo(lam.dtype).tiny)[:, None]
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(lam.dtype).tiny)), torch.zeros_like(p))
    entropy = torch.where(rank > 1, -plogp.sum(1) / torch.log(rank.to(lam.dtype).clamp_min(2)), nan)
    return stable.cpu().numpy(), log_top.cpu().numpy(), entropy.cpu().numpy()
