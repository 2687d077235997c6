"""The per-matrix α table: every estimator for a list of matrices, or for every weight matrix of a model.

``spectral_table(matrices)`` is one row per 2-D matrix; ``alpha_table(model)`` is one row per
(layer, role) of every decoder block, cached under the model's fingerprint. Columns: see
``alpha_table``. Degenerate matrices (non-finite entries, all zeros, rank ≤ 1, fewer than 10
singular values, too few eigenvalues above the threshold) give NaN in the affected columns and a
``note`` that says why; they never raise in the middle of a sweep.
"""
from __future__ import annotations

import contextlib
import math
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from zones.core.adapters import get_adapter
from zones.core.entries import cached_table
from zones.core.hardware import torch_threads
from zones.core.models import model_fingerprint
from zones.spectra.esd import EVALS_THRESHOLD, MIN_SINGULAR_VALUES, esd_fits, hill_alphas
from zones.spectra.gram import gram_eigenvalues, numerical_rank, unit_roundoff
from zones.spectra.shape import DEFAULT_WINDOW, check_window, companion_values, shape_alphas

VERSION = "spectra-3"  # bump when any estimator's arithmetic changes (invalidates cached tables)
ESTIMATORS = ("shape", "esd", "hill", "companions")
ESTIMATOR_COLUMNS = {
    "shape": ["alpha_shape", "alpha_shape_r2"],
    "esd": ["alpha_esd", "xmin", "ks_distance", "n_tail", "alpha_esd_sigma", "alpha_weighted"],
    "hill": ["alpha_hill"],
    "companions": ["stable_rank", "log_lambda_max", "entropy"],
}
VALUE_COLUMNS = ["alpha_shape", "alpha_shape_r2", "alpha_esd", "xmin", "ks_distance", "n_tail",
                 "alpha_esd_sigma", "alpha_hill", "stable_rank", "log_lambda_max", "alpha_weighted",
                 "entropy"]
ALPHA_COLUMNS = ["alpha_shape", "alpha_esd", "alpha_hill"]
COLUMNS = ["layer", "role", "rows", "cols", *VALUE_COLUMNS, "note"]


def check_estimators(estimators: Iterable[str] | None) -> tuple[str, ...]:
    """The chosen estimators in ``ESTIMATORS`` order, duplicates dropped (all of them for None)."""
    if estimators is None:
        return ESTIMATORS
    if isinstance(estimators, str):
        estimators = [estimators]
    chosen = tuple(dict.fromkeys(estimators))
    unknown = [e for e in chosen if e not in ESTIMATORS]
    if unknown or not chosen:
        raise ValueError(f"unknown estimators {unknown or '(none)'}; choose from {', '.join(ESTIMATORS)}")
    return tuple(e for e in ESTIMATORS if e in chosen)


def spectral_table(matrices: Sequence[torch.Tensor | np.ndarray], *,
                   window: tuple[float, float] = DEFAULT_WINDOW,
                   estimators: Iterable[str] | None = None,
                   threshold: float = EVALS_THRESHOLD, progress: bool = False) -> pd.DataFrame:
    """Every estimator for each 2-D matrix, one row per matrix in order.

    Columns: ``rows, cols`` and ``VALUE_COLUMNS`` (see ``alpha_table``; columns of
    estimators not asked for are NaN), and ``note`` (empty, or why a value is NaN).
    """
    window = check_window(window)
    chosen = check_estimators(estimators)
    mats = [torch.as_tensor(m) for m in matrices]
    for k, m in enumerate(mats):
        if m.dim() != 2:
            raise ValueError(f"matrix {k} has shape {tuple(m.shape)}; expected a 2-D matrix")

    # Many small CPU ops: one thread each is faster than a contended pool (the spectra are
    # computed on a pool of single-threaded jobs).
    on_cpu = all(m.device.type == "cpu" for m in mats)
    workers = torch.get_num_threads()
    with torch_threads(1) if on_cpu else contextlib.nullcontext():
        return _spectral_table(mats, window, chosen, threshold, progress, workers)


def _spectral_table(mats, window, chosen, threshold, progress, workers) -> pd.DataFrame:
    """``spectral_table`` on checked arguments: spectra first, then each estimator on the usable
    matrices grouped by spectrum length, and a note for every NaN."""
    spec = gram_eigenvalues(mats, progress=progress, workers=workers)
    n_rows = len(mats)
    values = {c: np.full(n_rows, np.nan) for c in VALUE_COLUMNS}
    values["n_tail"] = np.full(n_rows, -1, dtype=np.int64)
    notes: list[list[str]] = [[] for _ in range(n_rows)]

    usable: dict[tuple[int, object], list[int]] = {}
    for k, (m, lam) in enumerate(zip(mats, spec)):
        if lam is None:
            notes[k].append("non-finite entries")
        elif m.numel() == 0:
            notes[k].append("empty matrix")
        elif float(lam[-1]) == 0.0:
            notes[k].append("all-zero matrix")
        else:
            usable.setdefault((lam.shape[0], lam.device), []).append(k)

    for (n, _), idx in usable.items():
        lam = torch.stack([spec[k] for k in idx])
        big = torch.tensor([max(mats[k].shape) for k in idx], device=lam.device)
        roundoff = torch.tensor([unit_roundoff(mats[k].dtype) for k in idx], device=lam.device)
        rank = numerical_rank(lam, big, roundoff)
        rank_np = rank.cpu().numpy()
        few = n < MIN_SINGULAR_VALUES
        for pos, k in enumerate(idx):
            if few:
                notes[k].append(f"fewer than {MIN_SINGULAR_VALUES} singular values ({n})")
            elif rank_np[pos] <= 1:
                notes[k].append(f"rank {int(rank_np[pos])}")
        no_alpha = few | (rank_np <= 1)
        kept = (lam > threshold).sum(1).cpu().numpy()
        if "esd" in chosen or "hill" in chosen:
            for pos, k in enumerate(idx):
                if not no_alpha[pos] and kept[pos] < MIN_SINGULAR_VALUES:
                    notes[k].append(f"only {kept[pos]} eigenvalues above {threshold:g} "
                                    f"(need {MIN_SINGULAR_VALUES})")

        if "companions" in chosen or "esd" in chosen:
            stable, log_top, entropy = companion_values(lam, rank)
            values["log_lambda_max"][idx] = log_top
            if "companions" in chosen:
                values["stable_rank"][idx] = stable
                values["entropy"][idx] = entropy
        if few:  # no α for any of them; the companions above still hold
            continue
        if "shape" in chosen:
            a, r2 = shape_alphas(lam, window, rank)
            for pos, k in enumerate(idx):
                if not no_alpha[pos] and not math.isfinite(a[pos]):
                    notes[k].append("shape: numerically zero singular values in the rank window"
                                    if rank_np[pos] < n else "shape: rank window too small")
            values["alpha_shape"][idx] = np.where(no_alpha, np.nan, a)
            values["alpha_shape_r2"][idx] = np.where(no_alpha, np.nan, r2)
        if "hill" in chosen:
            values["alpha_hill"][idx] = np.where(no_alpha, np.nan, hill_alphas(lam, threshold))
        if "esd" in chosen:
            for pos, (k, fit) in enumerate(zip(idx, esd_fits(lam, threshold))):
                if no_alpha[pos]:
                    continue
                if fit.note and kept[pos] >= MIN_SINGULAR_VALUES:
                    notes[k].append(fit.note)
                values["alpha_esd"][k], values["xmin"][k] = fit.alpha, fit.xmin
                values["ks_distance"][k], values["n_tail"][k] = fit.ks_distance, fit.n_tail
                values["alpha_esd_sigma"][k] = fit.sigma
            values["alpha_weighted"][idx] = values["alpha_esd"][idx] * values["log_lambda_max"][idx]

    if "companions" not in chosen:
        values["log_lambda_max"][:] = np.nan

    table = pd.DataFrame({"rows": [int(m.shape[0]) for m in mats], "cols": [int(m.shape[1]) for m in mats]})
    for c in VALUE_COLUMNS:
        table[c] = values[c]
    table["n_tail"] = pd.array([int(v) if v >= 0 else pd.NA for v in values["n_tail"]], dtype="Int64")
    table["note"] = ["; ".join(n) for n in notes]
    return table


# --- a model -----------------------------------------------------------------------------------

def alpha_table(model: nn.Module, *, window: tuple[float, float] = DEFAULT_WINDOW,
                estimators: Iterable[str] | None = None, cache: bool = True, refresh: bool = False,
                progress: bool = False) -> pd.DataFrame:
    """Every estimator for every weight matrix of every decoder block: one row per (layer, role).

    Columns (``COLUMNS``): ``layer, role, rows, cols`` (the matrix as (out, in) features);
    ``alpha_shape, alpha_shape_r2`` (spectral-shape α over the rank ``window`` and its R²);
    ``alpha_esd, xmin, ks_distance, n_tail, alpha_esd_sigma`` (WeightWatcher's power-law fit of
    the eigenvalue density: α, the x_min chosen, the KS distance D, the eigenvalues in the tail,
    (α−1)/√n_tail); ``alpha_hill`` (median-x_min Hill α); ``stable_rank``; ``log_lambda_max``;
    ``alpha_weighted`` (α_esd · log10 λ_max); ``entropy``; ``note`` (why a value is NaN).

    ``estimators`` picks a subset of ``ESTIMATORS`` ("shape", "esd", "hill", "companions");
    the others' columns are NaN. With ``cache=True`` the table is stored under the model's
    fingerprint, the window, the estimators and ``VERSION``. Runs where the weights are.
    """
    window = check_window(window)
    chosen = check_estimators(estimators)
    adapter = get_adapter(model)

    def compute() -> pd.DataFrame:
        with torch.no_grad():
            entries = list(adapter.iter_matrices())
            table = spectral_table([m for _, _, m in entries], window=window, estimators=chosen,
                                   progress=progress)
        table.insert(0, "role", [role for _, role, _ in entries])
        table.insert(0, "layer", [layer for layer, _, _ in entries])
        return table[COLUMNS]

    if not cache:
        return compute()
    parts = dict(kind="alpha_table", version=VERSION, model=model_fingerprint(model), window=list(window),
                 estimators=list(chosen), threshold=EVALS_THRESHOLD)
    table = cached_table("alpha", parts, compute, refresh=refresh)
    table["note"] = table["note"].fillna("")
    table["n_tail"] = table["n_tail"].astype("Int64")
    return table


def matrix_module_names(model: nn.Module) -> pd.DataFrame:
    """For each (layer, role), the qualified name of the module whose whole weight the matrix is.

    Columns: ``layer, role, module`` (None where the matrix is a slice of a fused weight, as
    GPT-2's and GPT-NeoX's Q/K/V). Lets other tools' per-module results be matched to ours.
    """
    owners = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            owners.setdefault((weight.untyped_storage().data_ptr(), weight.data_ptr()), []).append(
                (name, tuple(weight.shape)))
    rows = []
    for layer, role, matrix in get_adapter(model).iter_matrices():
        found = None
        key = (matrix.untyped_storage().data_ptr(), matrix.data_ptr())
        for name, shape in owners.get(key, []):
            if shape in (tuple(matrix.shape), tuple(matrix.shape)[::-1]):
                found = name
                break
        rows.append(dict(layer=layer, role=role, module=found))
    return pd.DataFrame(rows, columns=["layer", "role", "module"])
