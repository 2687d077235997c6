"""Spectral estimators of weight matrices, and the per-matrix α table of a model.

Every estimator reads the spectrum of one matrix W (rows × cols, n = min(rows, cols)): the
eigenvalues λ_1 ≤ … ≤ λ_n of the smaller Gram matrix (W Wᵀ or Wᵀ W), i.e. the squared singular
values σ_k². The formulas are in ``book/methods/spectra.md``. One module per job:

- :mod:`~zones.spectra.gram`: the spectra of many matrices, in float64 on the weights' device
  (Gram ``eigvalsh``, ``svdvals`` where that is too coarse; a thread pool on a CPU, batches on a
  GPU), and the numerical rank judged in the matrix's own precision.
- :mod:`~zones.spectra.shape`: spectral-shape α (the paper's) ``alpha_shape``, ``alpha_shape_r2``
  over a window of ranks, and the companions ``stable_rank``, ``log_lambda_max``, ``entropy``.
- :mod:`~zones.spectra.esd`: power-law fits of the eigenvalue density's tail: WeightWatcher
  0.7.7's ``alpha_esd``, ``xmin``, ``ks_distance``, ``n_tail``, ``alpha_esd_sigma``, and the
  median-x_min Hill α ``alpha_hill``.
- :mod:`~zones.spectra.table`: ``spectral_table`` (matrices in) and ``alpha_table`` (a model in,
  cached), one row per matrix, ``alpha_weighted`` = α_esd · log10 λ_max.
- :mod:`~zones.spectra.summary`: tables in, tables out: ``layer_alpha`` (one value per block),
  ``depth_spread``, ``estimator_correlation``, ``role_group``.
- :mod:`~zones.spectra.random`: the Marchenko–Pastur law of a random matrix and seeded Gaussian and
  Student-t matrices; :mod:`~zones.spectra.pictures`: the pictures the α fits read (the primer's);
  :mod:`~zones.spectra.described`: matrices described as the primer shows them (a tail-index grid).

Degenerate matrices give NaN in the affected columns and a ``note`` that says why; they never
raise in the middle of a sweep.
"""
from __future__ import annotations

from zones.spectra.esd import (
                    EVALS_THRESHOLD,
                    MIN_SINGULAR_VALUES,
                    SMALL_N,
                    SMALL_N_MIN_TAIL,
                    EsdFit,
                    alpha_hill,
                    fit_esd,
)
from zones.spectra.gram import gram_eigenvalues, unit_roundoff
from zones.spectra.shape import DEFAULT_WINDOW, alpha_shape, check_window, fit_alpha_shape
from zones.spectra.summary import ROLE_GROUPS, depth_spread, estimator_correlation, layer_alpha, role_group
from zones.spectra.table import (
                    ALPHA_COLUMNS,
                    COLUMNS,
                    ESTIMATOR_COLUMNS,
                    ESTIMATORS,
                    VALUE_COLUMNS,
                    VERSION,
                    alpha_table,
                    check_estimators,
                    matrix_module_names,
                    spectral_table,
)

__all__ = [
    "ALPHA_COLUMNS", "COLUMNS", "DEFAULT_WINDOW", "ESTIMATOR_COLUMNS", "ESTIMATORS", "EVALS_THRESHOLD",
    "MIN_SINGULAR_VALUES", "ROLE_GROUPS", "SMALL_N", "SMALL_N_MIN_TAIL", "VALUE_COLUMNS", "VERSION",
    "EsdFit", "alpha_hill", "alpha_shape", "alpha_table", "check_estimators", "check_window", "depth_spread",
    "estimator_correlation", "fit_alpha_shape", "fit_esd", "gram_eigenvalues", "layer_alpha",
    "matrix_module_names", "role_group", "spectral_table", "unit_roundoff",
]
