"""Random matrices described as the primer shows them: the library's numbers for one matrix, a grid of tail indices, a draw's spread.

* :func:`describe`: one matrix's estimators (``spectral_table``), its spectrum on the
  Marchenko–Pastur scale against its random twin's (``zones.spectra.random``) and the pictures
  the fits read (``zones.spectra.pictures``); :func:`describe_all` of several, their pictures
  stacked (:func:`stack_pictures`); :func:`mp_curves`: each random matrix's Marchenko–Pastur density;
* :func:`tail_grid`: a Student-t matrix per tail index ν (one shape, one seed), described, with the
  heavy-tailed prediction 1 + ν/2 beside it up to ν = :data:`HEAVY_TAIL_LIMIT`;
* :func:`compare`: named matrices side by side against their twins; :func:`tail_seeds`: the
  estimators over seeds at each ν, and :func:`relative_spread`: how much a number moves between draws.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from zones.core.checks import check_float, check_int
from zones.core.glossary import default
from zones.spectra.pictures import density_picture, rank_picture
from zones.spectra.random import (
    marchenko_pastur_density,
    marchenko_pastur_edges,
    marchenko_pastur_fit,
    scaled_eigenvalues,
    student_t_matrix,
)
from zones.spectra.shape import DEFAULT_WINDOW, check_window
from zones.spectra.table import spectral_table

TAIL_DFS = tuple(default("tail_dfs"))  # the slider's grid: ν = 1, 1.5, …, 8 (the glossary's)
HEAVY_TAIL_LIMIT = 2.0  # up to ν = 2, heavy-tailed random-matrix theory predicts a density tail λ^(−(1 + ν/2))
WEAK_TAIL_LIMIT = 4.0   # above ν = 4 the entries' fourth moment is finite: the bulk is Marchenko–Pastur's
MP_COLUMNS = ["mp_edge", "mp_ks_distance", "n_beyond_edge", "beyond_edge_fraction", "top_over_edge"]
DROP_LOWEST = 0.01  # the density pictures leave out the smallest 1 % (a square matrix's reach towards 0)


def describe(matrix, *, window=DEFAULT_WINDOW, bins: int = 40) -> dict:
    """Everything the page shows of one matrix: its estimators (``spectral_table``, one row),
    its spectrum on the Marchenko–Pastur scale and the comparison with its random twin, and the
    two pictures (``rank``, ``density``, ``density_line``)."""
    row = spectral_table([matrix], window=window).iloc[0].to_dict()
    spectrum = scaled_eigenvalues(matrix)
    twin = marchenko_pastur_fit(spectrum)
    m = max(spectrum.rows, spectrum.cols)
    rank, _, _ = rank_picture(spectrum.eigenvalues, window)
    density, line, _ = density_picture(spectrum.eigenvalues, bins=bins, scale=1.0 / m, drop_lowest=DROP_LOWEST)
    row.update(q=spectrum.q, sigma2=spectrum.sigma2, xmin_scaled=row["xmin"] / m, mp_edge=twin.edge,
               mp_ks_distance=twin.ks_distance, n_beyond_edge=twin.n_beyond,
               beyond_edge_fraction=twin.beyond_fraction, top_over_edge=twin.top_over_edge)
    return dict(row=row, spectrum=spectrum, rank=rank, density=density, line=line)


def stack_pictures(pictures: Iterable[tuple[dict, pd.DataFrame]]) -> pd.DataFrame:
    """Pictures of several matrices as one table, each under its labels (``{"df": 2.0}``: ``df`` first)."""
    frames = [frame.assign(**labels)[[*labels, *frame.columns]] for labels, frame in pictures if len(frame)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def tail_grid(rows: int, cols: int, dfs: Sequence[float] = TAIL_DFS, *, seed: int = 0, window=DEFAULT_WINDOW,
              bins: int = 40) -> dict[str, pd.DataFrame]:
    """A Student-t matrix per tail index ν in ``dfs`` (same shape and seed), described as
    :func:`describe` does: ``tail_grid`` (one row each, with ``reference_alpha``) and the
    pictures ``tail_density``, ``tail_line``, ``tail_rank`` (``df`` first)."""
    dfs = [check_float(d, "tail_dfs (Student-t degrees of freedom)", min=0.0, min_inclusive=False) for d in dfs]
    if not dfs:
        raise ValueError("tail_dfs must list at least one tail index ν; got []")
    rows_out, density, line, rank = [], [], [], []
    for df in dfs:
        d = describe(student_t_matrix(rows, cols, df, seed=seed), window=window, bins=bins)
        rows_out.append(dict(df=df, reference_alpha=1 + df / 2 if df <= HEAVY_TAIL_LIMIT else math.nan, **d["row"]))
        density.append(({"df": df}, d["density"]))
        line.append(({"df": df}, d["line"]))
        rank.append(({"df": df}, d["rank"]))
    return dict(tail_grid=pd.DataFrame(rows_out), tail_density=stack_pictures(density), tail_line=stack_pictures(line),
                tail_rank=stack_pictures(rank))


COMPARE_COLUMNS = ["matrix", "rows", "cols", "q", "sigma2", "x_smallest", "x_largest", "mp_low", "mp_edge",
                   "n_beyond_edge", "mp_ks_distance", "alpha_shape", "alpha_shape_r2", "alpha_esd", "alpha_esd_sigma",
                   "n_tail"]


def compare(matrices: Mapping[str, object], *, window=DEFAULT_WINDOW) -> pd.DataFrame:
    """One row per named matrix (``{"name": matrix, ...}``): its shape, q, mean squared entry
    σ², smallest and largest scaled eigenvalue x = λ / max(rows, cols), the Marchenko–Pastur
    support [``mp_low``, ``mp_edge``] of its random twin with the eigenvalues beyond it and the
    KS distance, and the estimators. Columns ``COMPARE_COLUMNS``."""
    if not matrices:
        raise ValueError("compare needs at least one matrix, as {'name': matrix}")
    window = check_window(window)
    rows = []
    for name, matrix in matrices.items():
        d = describe(matrix, window=window)
        spectrum = d["spectrum"]
        low, _ = marchenko_pastur_edges(spectrum.q, spectrum.sigma2)
        rows.append(dict(d["row"], matrix=str(name), x_smallest=float(spectrum.x.min()),
                         x_largest=float(spectrum.x.max()), mp_low=low))
    return pd.DataFrame(rows)[COMPARE_COLUMNS]


SEED_COLUMNS = ["seed", "df", "alpha_shape", "alpha_shape_r2", "alpha_esd", "alpha_esd_sigma", "n_tail", "xmin"]


def tail_seeds(rows: int, cols: int, dfs, seeds: int = 5, *, window=DEFAULT_WINDOW) -> pd.DataFrame:
    """The estimators of ``seeds`` Student-t matrices (seeds 0 … seeds − 1) of one shape for each
    tail index ν of ``dfs`` (one number or a list): how much of an α is the draw. Columns
    ``SEED_COLUMNS``, ν by ν."""
    seeds = check_int(seeds, "seeds (a count: seeds 0 … seeds − 1)", min=1)
    dfs = [dfs] if isinstance(dfs, (int, float)) else list(dfs)
    dfs = [check_float(d, "dfs (Student-t degrees of freedom)", min=0.0, min_inclusive=False, finite=False)
           for d in dfs]
    if not dfs:
        raise ValueError("dfs must list at least one tail index ν; got []")
    matrices = [student_t_matrix(rows, cols, df, seed=s) for df in dfs for s in range(seeds)]
    table = spectral_table(matrices, window=check_window(window))
    table.insert(0, "df", [df for df in dfs for _ in range(seeds)])
    table.insert(0, "seed", [s for _ in dfs for s in range(seeds)])
    return table[SEED_COLUMNS]


def describe_all(entries: list[dict], window, bins) -> tuple[list[dict], dict[str, pd.DataFrame]]:
    """:func:`describe` of each entry's ``matrix`` (a dict with its ``matrix_label`` and the row's other
    labels): the rows (labels first) and the pictures ``eigenvalues``, ``density``, ``density_line``,
    ``rank`` (``matrix`` first)."""
    rows, eig, density, line, rank = [], [], [], [], []
    for entry in entries:
        d = describe(entry.pop("matrix"), window=window, bins=bins)
        label = {"matrix": entry["matrix_label"]}
        rows.append(dict(matrix=entry.pop("matrix_label"), **entry, **d["row"]))
        eig.append((label, pd.DataFrame({"x": d["spectrum"].x})))
        density.append((label, d["density"]))
        line.append((label, d["line"]))
        rank.append((label, d["rank"]))
    return rows, dict(eigenvalues=stack_pictures(eig), density=stack_pictures(density), density_line=stack_pictures(line), rank=stack_pictures(rank))


def mp_curves(matrices: pd.DataFrame, points: int = 400) -> pd.DataFrame:
    """The Marchenko–Pastur density of each random matrix's q and mean squared entry."""
    parts = []
    for r in matrices[matrices["kind"].isin(["gaussian", "heavy-tailed"])].itertuples():
        lo, hi = marchenko_pastur_edges(r.q, r.sigma2)
        x = np.linspace(lo, hi, points)[1:-1]
        density = marchenko_pastur_density(x, r.q, r.sigma2)
        parts.append(({"matrix": r.matrix}, pd.DataFrame({"x": x, "density": density})))
    return stack_pictures(parts)


def relative_spread(values) -> float:
    """(max − min) / |mean| of the finite values: how much a number moves between draws, relative
    to its size (NaN with fewer than two finite values or a zero mean)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    if len(values) < 2 or values.mean() == 0:
        return math.nan
    return float((values.max() - values.min()) / abs(values.mean()))
