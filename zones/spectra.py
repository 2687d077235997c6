"""Spectral estimators of weight matrices, and the per-matrix α table of a model.

Spectral-shape α (the paper's): singular values σ_1 ≥ σ_2 ≥ … of a matrix decay roughly as
σ_k ∝ k^(-α); α is the negative least-squares slope of log σ_k against log k over a window
of ranks, by default the top half (k = 1..⌊n/2⌋, n = min(rows, cols)).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import nn

from .adapters import get_adapter


def singular_values(matrix: torch.Tensor) -> np.ndarray:
    """Singular values in descending order, computed in float64."""
    return torch.linalg.svdvals(matrix.detach().to(torch.float64)).cpu().numpy()


def alpha_shape(sv: np.ndarray, window: tuple[float, float] = (0.0, 0.5)) -> float:
    """Negative slope of log σ_k vs log k over the rank window (fractions of n)."""
    sv = np.sort(np.asarray(sv, dtype=np.float64))[::-1]
    n = len(sv)
    lo, hi = int(np.floor(window[0] * n)), int(np.floor(window[1] * n))
    ranks = np.arange(1, n + 1)[lo:hi]
    values = sv[lo:hi]
    if len(values) < 2 or np.any(values <= 0):
        return float("nan")
    slope = np.polyfit(np.log(ranks), np.log(values), 1)[0]
    return float(-slope)


def alpha_table(model: nn.Module, window: tuple[float, float] = (0.0, 0.5)) -> pd.DataFrame:
    """One row per (layer, role): ``layer, role, rows, cols, alpha_shape``."""
    rows = []
    for layer, role, matrix in get_adapter(model).iter_matrices():
        rows.append(dict(layer=layer, role=role, rows=matrix.shape[0], cols=matrix.shape[1],
                         alpha_shape=alpha_shape(singular_values(matrix), window)))
    return pd.DataFrame(rows)
