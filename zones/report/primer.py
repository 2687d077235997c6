"""The primer chapter: what the spectrum of a weight matrix is, and what α reads off it.

Five kinds of matrix, each one row of ``matrices``: a Gaussian random matrix (the
Marchenko–Pastur law's own case), a heavy-tailed random matrix (Student-t entries), one matrix
of each trained model of ``models``, and the same matrix of a depth-series model at
initialisation and after training (the depth-series chapter's cached run: seed 0 of the
shallowest depth of ``profile``; ``zones.series.build_model`` rebuilds its initial weights, the
same seed). Every number is the library's: ``zones.spectra.described`` describes each matrix
(``zones.spectra.spectral_table``: α_shape, the power-law α and the rest; ``zones.spectra.random``:
Marchenko–Pastur; ``zones.spectra.pictures``: the pictures the fits read) and builds the tail-index
grid; this module picks the matrices and writes the words. No forward pass: only weights.

``run(...)`` returns a ``ChapterResult`` whose tables are written as CSV:

* ``matrices``: one row per matrix: ``matrix`` (its label), ``kind`` (``gaussian``,
  ``heavy-tailed``, ``trained``, ``initialised``), ``source``, ``layer``, ``role``, ``rows, cols,
  q`` (min/max), ``sigma2`` (mean squared entry), the ``zones.spectra.VALUE_COLUMNS``, and its
  random twin's Marchenko–Pastur comparison ``mp_edge, mp_ks_distance, n_beyond_edge,
  beyond_edge_fraction, top_over_edge`` (``zones.spectra.random.marchenko_pastur_fit``);
* ``eigenvalues``: ``matrix, x`` (every eigenvalue on the Marchenko–Pastur scale λ / max(rows, cols));
* ``mp_curve``: ``matrix, x, density``: each random matrix's Marchenko–Pastur density;
* ``density``, ``density_line``, ``rank``: the pictures of ``zones.spectra.pictures`` for every
  matrix (``matrix`` first);
* ``tail_grid``: one row per tail index ν of ``tail_dfs`` (a Student-t matrix each, same
  seed): ``df``, ``reference_alpha`` (1 + ν/2, the heavy-tailed random-matrix prediction for
  ν ≤ 2; NaN above), the estimators and the Marchenko–Pastur comparison;
  ``tail_density``, ``tail_line``, ``tail_rank``: its pictures (``df`` first), for the slider.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from zones.core.adapters import get_adapter
from zones.core.checks import check_float, check_int, check_models
from zones.core.models import load_model
from zones.report.common import ChapterResult, save
from zones.report.format import fmt_num
from zones.series import build_model, series_configs, train_series
from zones.spectra import DEFAULT_WINDOW, check_window
from zones.spectra.described import (
    HEAVY_TAIL_LIMIT,
    MP_COLUMNS,
    TAIL_DFS,
    WEAK_TAIL_LIMIT,
    describe_all,
    mp_curves,
    relative_spread,
    tail_grid,
)
from zones.spectra.random import gaussian_matrix, marchenko_pastur_edges, student_t_matrix, student_t_variance

KINDS = ("gaussian", "heavy-tailed", "trained", "initialised")


def _nu(df: float) -> str:
    """A tail index as the page writes it: ``2``, ``2.5``, ``∞``."""
    return "∞" if math.isinf(df) else f"{df:g}"


def block_at(n_blocks: int, position: float) -> int:
    """The block at relative depth ``position`` (0 = the first block, 1 = the last), halves
    rounded up (the middle of 30 blocks is block 15)."""
    position = check_float(position, "position (0 = the first block, 1 = the last)", min=0.0, max=1.0)
    return math.floor(position * (n_blocks - 1) + 0.5)


def model_matrix(model: torch.nn.Module, role: str, position: float) -> tuple[int, torch.Tensor]:
    """``(layer, matrix)``: the ``role`` matrix of the block at relative depth ``position``."""
    adapter = get_adapter(model)
    layer = block_at(adapter.n_blocks, position)
    matrices = adapter.block_matrices(adapter.blocks()[layer])
    if role not in matrices:
        raise ValueError(f"role {role!r} is not one of this model's matrices: {', '.join(matrices)}")
    return layer, matrices[role].detach().to("cpu", torch.float32).clone()


def series_run_config(profile: str, depths=None, train_overrides: dict | None = None):
    """The depth-series run the primer reads: seed 0 (or the ``seed`` override) of the shallowest
    depth, the series' cheapest run, built exactly as the depth-series chapter builds it
    (``series_configs``), so both chapters read one cached run. The primer trains the whole
    series (its runs side by side: ``zones.series.pool``), which the later chapters read."""
    configs = series_configs(profile, depths, None, **dict(train_overrides or {}))  # the profile's seeds: 0, 1, …
    shallowest = min(c.depth for c in configs)
    return min((c for c in configs if c.depth == shallowest), key=lambda c: c.seed)


def tail_start(xmin_scaled: float, edge: float) -> str:
    """Where the power-law fit's tail starts against the Marchenko–Pastur edge x₊ of the matrix's
    random twin: ``beyond the twin's edge`` (x_min > x₊: the fit reads only eigenvalues that a
    random matrix of that variance would not have), ``below the twin's edge`` (x_min ≤ x₊: it
    fits, at least in part, where a random matrix has eigenvalues too), or ``no fit`` (NaN)."""
    if not (math.isfinite(xmin_scaled) and math.isfinite(edge)):
        return "no fit"
    return "beyond the twin's edge" if xmin_scaled > edge else "below the twin's edge"


REFERENCE_SIGMAS = 3  # the power-law α agrees with 1 + ν/2 when within this many standard errors σ(α)


def reference_agreement(grid: pd.DataFrame) -> str:
    """For each ν of the grid with a heavy-tailed prediction (``reference_alpha``): whether the
    power-law α lies within ``REFERENCE_SIGMAS`` standard errors σ(α) of 1 + ν/2 (the fit's own
    σ(α) = (α − 1)/√n_tail), as ``within 3 σ(α) at ν = 1, 1.5; not at ν = 2``."""
    rows = grid.dropna(subset=["reference_alpha"]).sort_values("df")
    if rows.empty:
        return "no ν of the grid has a prediction"
    close = (rows["alpha_esd"] - rows["reference_alpha"]).abs() <= REFERENCE_SIGMAS * rows["alpha_esd_sigma"]
    yes = ", ".join(_nu(d) for d in rows.loc[close, "df"])
    no = ", ".join(_nu(d) for d in rows.loc[~close, "df"])
    parts = ([f"within {REFERENCE_SIGMAS} σ(α) at ν = {yes}"] if yes else []) + ([f"not at ν = {no}"] if no else [])
    return "; ".join(parts)


def _start_text(r) -> str:
    return (f"{r['matrix']}: from x = {fmt_num(r['xmin_scaled'])}, {tail_start(r['xmin_scaled'], r['mp_edge'])} "
            f"(x₊ = {fmt_num(r['mp_edge'])})")


def grid_trend(grid: pd.DataFrame, column: str = "alpha_shape") -> str:
    """How ``column`` moves as the tail lightens along the grid (ν ascending): ``falls at every
    step`` / ``rises at every step`` (monotone), ``falls overall, not at every step`` /
    ``rises overall, not at every step`` (last below / above first), ``ends where it started``,
    or ``undefined`` (fewer than two values, or a NaN)."""
    values = grid.sort_values("df")[column].to_numpy(float)
    if len(values) < 2 or not np.all(np.isfinite(values)):
        return "undefined"
    steps = np.diff(values)
    if np.all(steps < 0):
        return "falls at every step"
    if np.all(steps > 0):
        return "rises at every step"
    if values[-1] < values[0]:
        return "falls overall, not at every step"
    return "rises overall, not at every step" if values[-1] > values[0] else "ends where it started"


def seed_reading(draws: pd.DataFrame) -> str:
    """For each ν of ``draws`` (``tail_seeds``' table): which exponent moves more between the
    draws relative to its size (:func:`relative_spread` of ``alpha_esd`` against ``alpha_shape``),
    with the tail sizes the power-law fit read, which say why."""
    parts = []
    for df, part in draws.groupby("df", sort=True):
        esd, shape = relative_spread(part["alpha_esd"]), relative_spread(part["alpha_shape"])
        tails = f"{int(part['n_tail'].min())} to {int(part['n_tail'].max())}"
        where = f"at ν = {_nu(float(df))}"
        if not (math.isfinite(esd) and math.isfinite(shape)):
            parts.append(f"{where}, too few finite values to compare")
        elif esd > shape:
            parts.append(f"{where} the power-law α moves more (its range is {fmt_num(100 * esd, 2)} % of its mean, "
                         f"α_shape's {fmt_num(100 * shape, 2)} %), its fitted tail holding {tails} eigenvalues")
        else:
            parts.append(f"{where} α_shape moves more ({fmt_num(100 * shape, 2)} % against "
                         f"{fmt_num(100 * esd, 2)} %), the power-law fit reading a tail of {tails} eigenvalues")
    return "; ".join(parts)


def gaussian_tail_sentence(n_tail: int, n_beyond: int, where: str) -> str:
    """What the power-law fit found on the Gaussian matrix: with no eigenvalue beyond the
    Marchenko–Pastur edge, its "tail" can only be the law's own steep upper edge."""
    if n_beyond == 0:
        return (f"The power-law fit still finds a \"tail\" of {n_tail} eigenvalues, but all of them lie inside "
                f"the Marchenko–Pastur bulk: it fits the steep fall at the law's edge, not a power law, and a "
                f"large α here means no heavy tail.")
    return (f"The power-law fit finds a tail of {n_tail} eigenvalues starting {where}; {n_beyond} eigenvalues "
            f"lie beyond the Marchenko–Pastur edge.")


def tail_reading(inside: int, total: int) -> str:
    """What the power-law α of matrices with light tails (ν ≥ 4) measures, by where their fitted
    tails start: when most (more than half) start below the random twin's edge, the fit reads the
    steep fall of the Marchenko–Pastur edge and its α says "no heavy tail"; otherwise it reads
    the few eigenvalues pushed beyond the edge."""
    if total == 0:
        return "the grid holds no such matrix"
    if inside > total / 2:
        return ("the fit then reads the steep fall of the Marchenko–Pastur edge, and its large α says "
                "\"no heavy tail here\" rather than describing one")
    return ("the fit then reads the few eigenvalues that the largest entries push beyond the edge, "
            "a tail of a handful of points")


def _alpha_text(r) -> str:
    return (f"α_shape = {fmt_num(r['alpha_shape'])} (R² = {fmt_num(r['alpha_shape_r2'], 2)}), "
            f"power-law α = {fmt_num(r['alpha_esd'])} ± {fmt_num(r['alpha_esd_sigma'], 2)}")


def _numbers(matrices: pd.DataFrame, grid: pd.DataFrame, facts: dict) -> dict:
    by_kind = {k: matrices[matrices["kind"] == k] for k in KINDS}
    g, t = by_kind["gaussian"].iloc[0], by_kind["heavy-tailed"].iloc[0]
    trained = by_kind["trained"]
    first = trained.iloc[0]
    series_trained = trained[trained["source"] == "depth series"].iloc[0]
    init = by_kind["initialised"].iloc[0]
    lo, hi = marchenko_pastur_edges(g["q"], g["sigma2"])  # the law of its own mean squared entry, as every twin
    ordered = grid.sort_values("df")
    heavy = ordered[ordered["df"] <= HEAVY_TAIL_LIMIT]
    light = ordered[ordered["df"] >= WEAK_TAIL_LIMIT]
    numbers = dict(
        gauss_rows=int(g["rows"]), gauss_cols=int(g["cols"]), gauss_q=float(g["q"]),
        gauss_sigma=facts["gaussian_sigma"], gauss_sigma2=float(g["sigma2"]), mp_low=lo, mp_high=hi,
        gauss_ks=float(g["mp_ks_distance"]), gauss_beyond=int(g["n_beyond_edge"]),
        gauss_top_ratio=float(g["top_over_edge"]),
        gauss_alpha_shape=float(g["alpha_shape"]), gauss_alpha_esd=float(g["alpha_esd"]),
        gauss_alpha_text=_alpha_text(g), gauss_n_tail=int(g["n_tail"]),
        tail_df=_nu(facts["tail_df"]), tail_variance=("infinite" if math.isinf(facts["tail_variance"])
                                                 else fmt_num(facts["tail_variance"])),
        tail_ks=float(t["mp_ks_distance"]), tail_beyond=int(t["n_beyond_edge"]),
        tail_top_ratio=float(t["top_over_edge"]),
        tail_alpha_shape=float(t["alpha_shape"]), tail_alpha_esd=float(t["alpha_esd"]), tail_alpha_text=_alpha_text(t),
        tail_reference=1 + facts["tail_df"] / 2,
        trained_name=str(first["matrix"]), trained_alpha_text=_alpha_text(first),
        trained_beyond=int(first["n_beyond_edge"]), trained_beyond_percent=100 * float(first["beyond_edge_fraction"]),
        trained_top_ratio=float(first["top_over_edge"]), trained_ks=float(first["mp_ks_distance"]),
        trained_rows=int(first["rows"]), trained_cols=int(first["cols"]),
        trained_list="; ".join(f"{r.matrix}: {_alpha_text(r._asdict())}" for r in trained.itertuples()),
        series_depth=facts["series_depth"], series_width=facts["series_width"], series_steps=facts["series_steps"],
        series_layer=int(init["layer"]), series_role=str(init["role"]), series_init_sigma=facts["init_sigma"],
        series_rows=int(init["rows"]), series_cols=int(init["cols"]),
        init_alpha_text=_alpha_text(init), init_ks=float(init["mp_ks_distance"]),
        init_beyond=int(init["n_beyond_edge"]),
        series_alpha_text=_alpha_text(series_trained), series_ks=float(series_trained["mp_ks_distance"]),
        series_beyond=int(series_trained["n_beyond_edge"]),
        series_shape_moved=("raised" if series_trained["alpha_shape"] > init["alpha_shape"] else "lowered"),
        series_shape_change_abs=abs(float(series_trained["alpha_shape"] - init["alpha_shape"])),
        gauss_tail_sentence=gaussian_tail_sentence(int(g["n_tail"]), int(g["n_beyond_edge"]),
                                                   tail_start(float(g["xmin_scaled"]), float(g["mp_edge"]))),
        grid_min_df=_nu(grid["df"].min()), grid_max_df=_nu(grid["df"].max()), grid_n=len(grid),
        grid_shape_first=float(ordered["alpha_shape"].iloc[0]), grid_shape_last=float(ordered["alpha_shape"].iloc[-1]),
        grid_heavy_text="; ".join(f"ν = {_nu(r.df)}: α = {fmt_num(r.alpha_esd)} "
                                  f"(1 + ν/2 = {fmt_num(r.reference_alpha)})"
                                  for r in heavy.itertuples()) or "none in the grid",
        grid_light_min=float(light["alpha_esd"].min()) if len(light) else math.nan,
        grid_light_max=float(light["alpha_esd"].max()) if len(light) else math.nan,
        window_low=facts["window"][0], window_high=facts["window"][1],
        start_text="; ".join(_start_text(r) for _, r in matrices.iterrows()),
        grid_shape_trend=grid_trend(grid, "alpha_shape"), grid_esd_trend=grid_trend(grid, "alpha_esd"),
        grid_light_inside=int(sum(tail_start(r.xmin_scaled, r.mp_edge) == "below the twin's edge"
                                  for r in light.itertuples())),
        grid_light_n=len(light),
        grid_light_reading=tail_reading(int(sum(tail_start(r.xmin_scaled, r.mp_edge) == "below the twin's edge"
                                                for r in light.itertuples())), len(light)),
        grid_reference_text=reference_agreement(ordered),
    )
    return numbers


def run(models="smollm2-135m", role: str = "q", position: float = 0.5, rows: int = 500, cols: int = 1000,
        tail_df: float = 1.5, tail_dfs: Sequence[float] = list(TAIL_DFS), profile: str = "cpu", depths=None,
        train_overrides: dict | None = None, seed: int = 0, bins: int = 40, window=DEFAULT_WINDOW,
        out_dir: str = "results/primer", *, device: str | None = None) -> ChapterResult:
    """The chapter (see the module's docstring for its tables); ``summary.json`` holds one
    record per matrix (its α's and Marchenko–Pastur comparison) and the tail grid's α's.

    ``models``: trained models (a name or a list), each giving its ``role`` matrix at relative
    depth ``position``; ``rows × cols``: the random matrices' shape (``seed``: their seed),
    ``tail_df`` the heavy-tailed example's ν and ``tail_dfs`` the slider's grid; ``profile,
    depths, train_overrides``: the depth series, as the depth-series chapter takes them.
    """
    models = check_models(models)
    rows, cols = check_int(rows, "rows", min=10), check_int(cols, "cols", min=10)
    tail_df = check_float(tail_df, "tail_df", min=0.0, min_inclusive=False)
    window = check_window(window)
    seed = check_int(seed, "seed", min=0)

    entries = [dict(matrix_label=f"Gaussian {rows}×{cols}", kind="gaussian", source="N(0, 1) entries", layer=-1,
                    role="", matrix=gaussian_matrix(rows, cols, seed=seed)),
               dict(matrix_label=f"Student-t ν = {_nu(tail_df)}", kind="heavy-tailed",
                    source=f"t entries, ν = {_nu(tail_df)}", layer=-1, role="",
                    matrix=student_t_matrix(rows, cols, tail_df, seed=seed))]
    for name in models:
        loaded = load_model(name, device=device or "cpu", load_tokenizer=False)
        layer, matrix = model_matrix(loaded.model, role, position)
        entries.append(dict(matrix_label=f"{name}, block {layer} {role}", kind="trained", source=name, layer=layer,
                            role=role, matrix=matrix))
        del loaded
    config = series_run_config(profile, depths, train_overrides)
    # the whole series trains here, side by side on a CPU (zones.series.pool): later chapters read it
    runs = train_series(depths, profile, device=device, progress=False, **dict(train_overrides or {}))
    run_ = next(r for r in runs if r.config == config)
    trained = run_.load(device="cpu").model
    initial = build_model(config)
    layer, init_matrix = model_matrix(initial, role, position)
    _, trained_matrix = model_matrix(trained, role, position)
    label = f"depth {config.depth}, block {layer} {role}"
    entries += [dict(matrix_label=f"{label}, initialised", kind="initialised", source="depth series", layer=layer,
                     role=role, matrix=init_matrix),
                dict(matrix_label=f"{label}, trained", kind="trained", source="depth series", layer=layer, role=role,
                     matrix=trained_matrix)]

    described, pictures = describe_all(entries, window, bins)
    matrices = pd.DataFrame(described)
    grid = tail_grid(rows, cols, tail_dfs, seed=seed, window=window, bins=bins)
    tables = dict(matrices=matrices, mp_curve=mp_curves(matrices), **pictures, **grid)
    facts = dict(gaussian_sigma=1.0, tail_df=tail_df, tail_variance=student_t_variance(tail_df),
                 series_depth=int(config.depth), series_width=int(config.hidden_size), series_steps=int(config.steps),
                 init_sigma=float(getattr(initial.config, "initializer_range", math.nan)), window=window)
    numbers = _numbers(matrices, grid["tail_grid"], facts)
    record = dict(models=models, role=role, position=position, rows=rows, cols=cols, tail_df=tail_df, seed=seed,
                  window=list(window), series=dict(profile=profile, depth=int(config.depth), seed=int(config.seed),
                                                   path=str(run_.path)),
                  matrices=matrices[["matrix", "kind", "rows", "cols", "alpha_shape", "alpha_shape_r2", "alpha_esd",
                                     "alpha_esd_sigma", "n_tail", *MP_COLUMNS]].to_dict("records"),
                  tail_grid=grid["tail_grid"][["df", "alpha_shape", "alpha_esd", "reference_alpha"]].to_dict("records"))
    out = save(out_dir, tables, record)
    shown = matrices[["matrix", "rows", "cols", "alpha_shape", "alpha_shape_r2", "alpha_esd", "alpha_esd_sigma",
                      "n_tail", "alpha_hill", "n_beyond_edge", "mp_ks_distance"]].rename(columns={
                          "alpha_shape": "α_shape", "alpha_shape_r2": "R²", "alpha_esd": "power-law α",
                          "alpha_esd_sigma": "σ(α)", "n_tail": "tail size", "alpha_hill": "Hill α",
                          "n_beyond_edge": "beyond MP edge", "mp_ks_distance": "KS to MP"})
    return ChapterResult(dict(tables, matrices_shown=shown), numbers, record, out,
                         extra=dict(order=list(matrices["matrix"])))
