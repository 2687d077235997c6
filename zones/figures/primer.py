"""Figures of the primer: spectra against Marchenko–Pastur, the pictures α is fitted on, and a
slider over the tail index of a random matrix. Tables from ``zones.report.primer`` in, Altair
charts out; the slider is a Vega-Lite parameter over a precomputed grid, so it works in the
static page with no kernel."""
from __future__ import annotations

import math

import altair as alt
import numpy as np
import pandas as pd

from zones.figures import fit, panel_width, wrap

TAIL_COLOR = "#d62728"   # what a fit uses: the tail (power-law α) or the rank window (α_shape)
REST_COLOR = "#9ecae9"   # what it leaves out
LINE_COLOR = "#222222"   # the fitted line
MP_COLOR = "#2ca02c"     # Marchenko–Pastur: the density and its bulk edge
PANEL_HEIGHT = 170
# A log axis: labels only at 1, 2 and 5 times a power of ten (Vega labels every 1…9 multiple,
# which crowd), those that would still overlap dropped, and very small or large values written
# as powers of ten ("1e-6"), never as "0.000001".
_MANTISSA = "datum.value / pow(10, floor(log(datum.value) / LN10 + 1e-9))"
LOG_LABELS = (f"indexof([1, 2, 5], round({_MANTISSA})) < 0 || abs({_MANTISSA} - round({_MANTISSA})) > 1e-6 ? '' : "
              "(abs(datum.value) >= 1e4 || abs(datum.value) < 1e-2 ? format(datum.value, '.0e') "
              ": format(datum.value, '~g'))")


def log_axis(title: str) -> alt.Axis:
    return alt.Axis(title=title, labelOverlap="greedy", labelExpr=LOG_LABELS)


def _check_columns(table: pd.DataFrame, columns, name: str) -> None:
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"the {name} table has no column(s) {', '.join(missing)}; columns: {', '.join(table.columns)}")


def _fmt(value, digits: int = 3) -> str:
    return "–" if value is None or not math.isfinite(float(value)) else f"{float(value):.{digits}g}"


def _nu(df: float) -> str:
    return "∞" if math.isinf(df) else f"{df:g}"


def mp_histogram(eigenvalues: pd.DataFrame, mp_curve: pd.DataFrame, matrix: str, bins: int = 40) -> alt.LayerChart:
    """The eigenvalues of one matrix (scaled, x = λ / max(rows, cols)) as a density histogram,
    with the Marchenko–Pastur density of its q and σ² drawn over it."""
    _check_columns(eigenvalues, ["matrix", "x"], "eigenvalues")
    x = eigenvalues.loc[eigenvalues["matrix"] == matrix, "x"].to_numpy(float)
    if x.size == 0:
        raise ValueError(f"no eigenvalues of {matrix!r}; matrices: {', '.join(eigenvalues['matrix'].unique())}")
    counts, edges = np.histogram(x, bins=bins)
    hist = pd.DataFrame(dict(x_low=edges[:-1], x_high=edges[1:], density=counts / (x.size * np.diff(edges)),
                             count=counts))
    curve = mp_curve[mp_curve["matrix"] == matrix]
    bars = alt.Chart(hist).mark_rect(color=REST_COLOR, stroke="white", strokeWidth=0.5).encode(
        x=alt.X("x_low:Q", title="eigenvalue λ / max(rows, cols)"), x2="x_high:Q",
        y=alt.Y("density:Q", title="density"), y2=alt.datum(0),
        tooltip=[alt.Tooltip("x_low:Q", format=".3f", title="from"), alt.Tooltip("x_high:Q", format=".3f", title="to"),
                 alt.Tooltip("count:Q", title="eigenvalues")])
    law = alt.Chart(curve).mark_line(color=MP_COLOR, strokeWidth=2.5).encode(x="x:Q", y="density:Q")
    return fit(alt.layer(bars, law, title=f"{matrix}: eigenvalues and the Marchenko–Pastur law"), height=220)


def _log_density_panel(density: pd.DataFrame, line: pd.DataFrame, edge: float | None, title: str,
                       width, curve: pd.DataFrame | None = None, tail: bool = True) -> alt.LayerChart:
    """One log–log density panel: the histogram's bins as points (the tail red), the fitted
    power law, the Marchenko–Pastur edge as a dashed rule (and its density, if given)."""
    color = (alt.Color("in_tail:N", scale=alt.Scale(domain=[True, False], range=[TAIL_COLOR, REST_COLOR]),
                       legend=None) if tail else alt.value(REST_COLOR))
    points = alt.Chart(density).mark_point(filled=True, size=28).encode(
        x=alt.X("x:Q", scale=alt.Scale(type="log"), axis=log_axis("λ / max(rows, cols)")),
        y=alt.Y("density:Q", scale=alt.Scale(type="log"), axis=log_axis("density")),
        color=color,
        tooltip=[alt.Tooltip("x:Q", format=".3g", title="λ / m"), alt.Tooltip("density:Q", format=".3g"),
                 alt.Tooltip("count:Q", title="eigenvalues"), alt.Tooltip("in_tail:N", title="in the fitted tail")])
    layers = [points]
    if curve is not None and len(curve):
        positive = curve[curve["density"] > 0]
        layers.append(alt.Chart(positive).mark_line(color=MP_COLOR, strokeWidth=2).encode(x="x:Q", y="density:Q"))
    if tail and len(line):
        layers.append(alt.Chart(line).mark_line(color=LINE_COLOR, strokeDash=[5, 3], strokeWidth=2).encode(
            x="x:Q", y="density:Q"))
    if edge is not None and math.isfinite(edge):
        layers.append(alt.Chart(pd.DataFrame({"x": [edge]})).mark_rule(color=MP_COLOR, strokeDash=[2, 2]).encode(
            x="x:Q", tooltip=[alt.Tooltip("x:Q", format=".3g", title="Marchenko–Pastur edge")]))
    return alt.layer(*layers, title=title).properties(width=width, height=PANEL_HEIGHT)


def _rows_of(matrices: pd.DataFrame, names) -> list:
    _check_columns(matrices, ["matrix", "alpha_shape", "alpha_esd", "mp_edge"], "matrices")
    names = list(matrices["matrix"]) if names is None else list(names)
    by_name = matrices.set_index("matrix")
    unknown = [n for n in names if n not in by_name.index]
    if unknown:
        raise ValueError(f"unknown matrices {unknown}; the table has {', '.join(by_name.index)}")
    return [(n, by_name.loc[n]) for n in names]


def twin_comparison(density: pd.DataFrame, mp_curve: pd.DataFrame, matrices: pd.DataFrame, names,
                    columns: int = 2) -> alt.ConcatChart:
    """For each matrix of ``names``: its eigenvalue density on log–log axes with the
    Marchenko–Pastur density of its own q and mean squared entry (green) and that law's edge
    (dashed): a matrix with no structure ends at the edge."""
    _check_columns(density, ["matrix", "x", "density", "in_tail"], "density")
    panels = [_log_density_panel(density[density["matrix"] == n], pd.DataFrame(), row["mp_edge"],
                                 f"{n}: {int(row['n_beyond_edge'])} beyond the edge",
                                 panel_width(columns, legend=False),
                                 curve=mp_curve[mp_curve["matrix"] == n], tail=False)
              for n, row in _rows_of(matrices, names)]
    return wrap(panels, columns)


def density_fits(density: pd.DataFrame, line: pd.DataFrame, matrices: pd.DataFrame, names=None,
                 columns: int = 2) -> alt.ConcatChart:
    """The picture the power-law α reads, one panel per matrix: the eigenvalue density on
    log–log axes (log-spaced bins), the tail λ ≥ x_min the fit uses in red, the fitted density
    (dashed) and the Marchenko–Pastur edge of the matrix's random twin (green, dotted)."""
    _check_columns(density, ["matrix", "x", "density", "in_tail"], "density")
    panels = [_log_density_panel(density[density["matrix"] == n], line[line["matrix"] == n] if len(line) else line,
                                 row["mp_edge"], f"{n}: α = {_fmt(row['alpha_esd'])}",
                                 panel_width(columns, legend=False))
              for n, row in _rows_of(matrices, names)]
    return wrap(panels, columns)


def _thin(rank: pd.DataFrame, points: int = 150) -> pd.DataFrame:
    """At most ``points`` ranks per spectrum, spread evenly on the log axis (display only)."""
    n = int(rank["rank"].max())
    keep = set(np.unique(np.round(np.geomspace(1, n, points)).astype(int)))
    return rank[rank["rank"].isin(keep)]


def _rank_panel(rank: pd.DataFrame, title: str, width) -> alt.LayerChart:
    rank = _thin(rank)
    base = alt.Chart(rank).encode(x=alt.X("rank:Q", scale=alt.Scale(type="log"), axis=log_axis("rank k")))
    points = base.mark_point(filled=True, size=18).encode(
        y=alt.Y("sigma:Q", scale=alt.Scale(type="log"), axis=log_axis("singular value σ_k")),
        color=alt.Color("in_window:N", scale=alt.Scale(domain=[True, False], range=[TAIL_COLOR, REST_COLOR]),
                        legend=None),
        tooltip=["rank:Q", alt.Tooltip("sigma:Q", format=".3g", title="σ_k"),
                 alt.Tooltip("in_window:N", title="in the fitted window")])
    line = base.transform_filter("isValid(datum.fitted)").mark_line(
        color=LINE_COLOR, strokeDash=[5, 3], strokeWidth=2).encode(y="fitted:Q")
    return alt.layer(points, line, title=title).properties(width=width, height=PANEL_HEIGHT)


def rank_fits(rank: pd.DataFrame, matrices: pd.DataFrame, names=None, columns: int = 2) -> alt.ConcatChart:
    """The picture α_shape reads, one panel per matrix: singular values against rank on log–log
    axes, the rank window the fit uses in red and the fitted line (dashed); α is its negative slope."""
    _check_columns(rank, ["matrix", "rank", "sigma", "in_window", "fitted"], "rank")
    panels = [_rank_panel(rank[rank["matrix"] == n], f"{n}: α_shape = {_fmt(row['alpha_shape'])}",
                          panel_width(columns, legend=False))
              for n, row in _rows_of(matrices, names)]
    return wrap(panels, columns)


def _slider(values: list[float], value: float):
    """A Vega-Lite parameter ``nu`` bound to a slider over evenly spaced ``values`` (a drop-down
    when they are not evenly spaced)."""
    steps = np.diff(values)
    if len(values) > 1 and np.allclose(steps, steps[0]):
        binding = alt.binding_range(min=values[0], max=values[-1], step=float(steps[0]), name="tail index ν ")
    else:
        binding = alt.binding_select(options=values, name="tail index ν ")
    return alt.param(name="nu", value=value, bind=binding)


def tail_slider(grid: pd.DataFrame, density: pd.DataFrame, line: pd.DataFrame, rank: pd.DataFrame,
                start: float | None = None, columns: int = 2) -> alt.VConcatChart:
    """The interactive figure: a slider over the tail index ν of a Student-t random matrix (a
    precomputed grid, one matrix per ν). For the chosen ν: its eigenvalue density with the
    power-law fit, its singular values with the α_shape fit, and where ν sits on the curves of
    both α against ν (with 1 + ν/2, the heavy-tailed prediction up to ν = 2)."""
    _check_columns(grid, ["df", "alpha_shape", "alpha_esd", "alpha_esd_sigma", "reference_alpha", "mp_edge"],
                   "tail_grid")
    values = sorted(float(v) for v in grid["df"])
    start = values[len(values) // 2] if start is None else float(start)
    if start not in values:
        raise ValueError(f"start ν = {start} is not in the grid {values}")
    nu = _slider(values, start)
    chosen = alt.datum.df == nu
    width = panel_width(columns, legend=False)
    labels = grid.assign(label=[f"ν = {_nu(r.df)}: power-law α = {_fmt(r.alpha_esd)} ± {_fmt(r.alpha_esd_sigma, 2)}, "
                                f"α_shape = {_fmt(r.alpha_shape)}" for r in grid.itertuples()])
    label = alt.Chart(labels).transform_filter(chosen).mark_text(
        align="left", baseline="middle", fontSize=13, fontWeight="bold").encode(
        text="label:N", x=alt.value(0), y=alt.value(10)).properties(width=width, height=20,
                                                                     view=alt.ViewBackground(stroke=None))

    edges = grid[["df", "mp_edge"]].rename(columns={"mp_edge": "x"})
    esd = alt.layer(
        alt.Chart(density).transform_filter(chosen).mark_point(filled=True, size=28).encode(
            x=alt.X("x:Q", scale=alt.Scale(type="log"), axis=log_axis("λ / max(rows, cols)")),
            y=alt.Y("density:Q", scale=alt.Scale(type="log"), axis=log_axis("density")),
            color=alt.Color("in_tail:N", scale=alt.Scale(domain=[True, False], range=[TAIL_COLOR, REST_COLOR]),
                            legend=None),
            tooltip=[alt.Tooltip("x:Q", format=".3g", title="λ / m"), alt.Tooltip("density:Q", format=".3g")]),
        alt.Chart(line).transform_filter(chosen).mark_line(color=LINE_COLOR, strokeDash=[5, 3], strokeWidth=2)
        .encode(x="x:Q", y="density:Q"),
        alt.Chart(edges).transform_filter(chosen).mark_rule(color=MP_COLOR, strokeDash=[2, 2]).encode(x="x:Q"),
        title="the density and its power-law fit").properties(width=width, height=PANEL_HEIGHT)

    thin = pd.concat([_thin(part) for _, part in rank.groupby("df")], ignore_index=True)
    base = alt.Chart(thin).transform_filter(chosen).encode(
        x=alt.X("rank:Q", scale=alt.Scale(type="log"), axis=log_axis("rank k")))
    shape = alt.layer(
        base.mark_point(filled=True, size=18).encode(
            y=alt.Y("sigma:Q", scale=alt.Scale(type="log"), axis=log_axis("singular value σ_k")),
            color=alt.Color("in_window:N", scale=alt.Scale(domain=[True, False], range=[TAIL_COLOR, REST_COLOR]),
                            legend=None)),
        base.transform_filter("isValid(datum.fitted)").mark_line(color=LINE_COLOR, strokeDash=[5, 3], strokeWidth=2)
        .encode(y="fitted:Q"),
        title="the singular values and the α_shape fit").properties(width=width, height=PANEL_HEIGHT)

    def against_nu(column: str, axis: str, title: str, reference: bool, sigma: str | None = None):
        base = alt.Chart(grid).encode(x=alt.X("df:Q", title="tail index ν"))
        layers = [base.mark_line(color="#777").encode(y=alt.Y(f"{column}:Q", title=axis, scale=alt.Scale(zero=False)))]
        if sigma:  # ± one standard error of the fit
            layers.append(base.transform_calculate(low=f"datum.{column} - datum.{sigma}",
                                                   high=f"datum.{column} + datum.{sigma}")
                          .mark_rule(color="#bbb").encode(y="low:Q", y2="high:Q"))
        layers.append(base.mark_point(filled=True).encode(
            y=f"{column}:Q",
            color=alt.condition(chosen, alt.value(TAIL_COLOR), alt.value("#777")),
            size=alt.condition(chosen, alt.value(110), alt.value(25)),
            tooltip=[alt.Tooltip("df:Q", title="ν"), alt.Tooltip(f"{column}:Q", format=".3g")]))
        if reference:
            layers.append(base.transform_filter("isValid(datum.reference_alpha)").mark_line(
                color=MP_COLOR, strokeDash=[4, 3]).encode(y="reference_alpha:Q"))
        return alt.layer(*layers, title=title).properties(width=width, height=140)

    panels = wrap([esd, shape,
                   against_nu("alpha_esd", "power-law α", "power-law α against ν (± σ_α)", True, "alpha_esd_sigma"),
                   against_nu("alpha_shape", "α_shape", "α_shape against ν", False)], columns)
    return alt.vconcat(label, panels).add_params(nu)
