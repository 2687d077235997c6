"""Figures of the depth-series and spectral-lifecycle chapters."""
from __future__ import annotations

import altair as alt
import numpy as np
import pandas as pd

from zones.figures import DASH_LEGEND, balanced_columns, fit, panel_width

GROUP_ORDER = ["Q/K", "V/O", "MLP", "all"]


def lifecycle_heatmap(grid: pd.DataFrame, title: str, value_title: str,
                      scheme: str = "viridis", reverse: bool = False) -> alt.FacetChart:
    """Layer × step heatmaps of a ``group_grid`` table, one panel per depth and group: a row of
    groups per depth on a laptop, one panel under the other on a phone. Each panel has its own
    layer axis (the depths have different numbers of layers)."""
    groups = [g for g in GROUP_ORDER if g in set(grid["group"])]
    depths = sorted(grid["depth"].unique())
    df = grid.assign(panel=grid["depth"].map(lambda d: f"depth {d}") + " · " + grid["group"])
    order = [f"depth {d} · {g}" for d in depths for g in groups]
    base = alt.Chart(df).mark_rect().encode(
        x=alt.X("step:O", title="training step", axis=alt.Axis(labelAngle=-90, labelOverlap=True)),
        # a panel is 110 px high: with more than ~10 layers their labels would overlap, so those
        # that would are hidden (every other, …)
        y=alt.Y("layer:O", title="layer", sort="descending",
                axis=alt.Axis(labelOverlap="parity", labelSeparation=2, labelFontSize=10, labelPadding=2)),
        color=alt.Color("value:Q", title=value_title, scale=alt.Scale(scheme=scheme, reverse=reverse)),
        tooltip=["depth:O", "group:N", "layer:O", "step:Q", alt.Tooltip("value:Q", format=".3f")],
    ).properties(width=panel_width(len(groups)) - 15, height=110)
    return base.facet(facet=alt.Facet("panel:N", title=None, sort=order), columns=len(groups),
                      title=title).resolve_scale(y="independent")


def wave_gradient_lines(gradient: pd.DataFrame, columns: int | None = None) -> alt.FacetChart:
    """Early-minus-late compression against step, one panel per group (``columns`` to a row:
    by default as many as leave no empty place in the grid), one line per depth."""
    groups = [g for g in GROUP_ORDER if g in set(gradient["group"])]
    columns = columns or balanced_columns(len(groups))
    base = alt.Chart(gradient)
    lines = base.mark_line(point=True).encode(
        x=alt.X("step:Q", title="training step"),
        y=alt.Y("gradient:Q", title="compression: early − late layers"),
        color=alt.Color("depth:O", title="depth"),
        tooltip=["depth:O", "group:N", "step:Q", alt.Tooltip("gradient:Q", format=".3f")],
    )
    zero = base.mark_rule(color="gray", strokeDash=[4, 4]).encode(y=alt.datum(0))
    return alt.layer(lines, zero).properties(width=panel_width(columns), height=180).facet(
        facet=alt.Facet("group:N", title=None, sort=groups), columns=columns)


def final_profiles(profile: pd.DataFrame, value_title: str = "α", columns: int | None = None) -> alt.FacetChart:
    """The final α profile against relative depth, one line per depth, one panel per group
    (``columns`` to a row: by default as many as leave no empty place in the grid)."""
    groups = [g for g in GROUP_ORDER if g in set(profile["group"])]
    columns = columns or balanced_columns(len(groups))
    return alt.Chart(profile).mark_line(point=True).encode(
        x=alt.X("relative_depth:Q", title="relative depth"),
        y=alt.Y("value:Q", title=value_title, scale=alt.Scale(zero=False)),
        color=alt.Color("depth:O", title="depth"),
        tooltip=["depth:O", "group:N", "layer:O", alt.Tooltip("value:Q", format=".3f")],
    ).properties(width=panel_width(columns), height=180).facet(
        facet=alt.Facet("group:N", title=None, sort=groups), columns=columns)


def delta_alpha_scaling(runs: pd.DataFrame, exponent: float, fit_text: str,
                        paper_exponent: float = 0.26, title: str | None = None) -> alt.LayerChart:
    """Δα against depth on log-log axes: each training run a point (``runs``: ``depth, seed,
    delta_alpha``, ``zones.analysis.lifecycle.run_delta_alpha``), the power law of slope
    ``exponent`` the chapter fitted through those points (solid; the least-squares line passes
    through their mean in log-log, so the chart refits nothing) and a line of the paper's slope
    through the same point (dashed). ``fit_text`` is the fit's legend entry as the chapter's text
    writes it (e.g. ``"fit: b = −0.50 [−0.86, −0.15]"``), so legend and text report one number.
    A run whose Δα is not positive has no logarithm: it is not drawn (nor fitted)."""
    table = runs[runs["delta_alpha"] > 0]
    depths = np.geomspace(table["depth"].min(), table["depth"].max(), 20)
    anchor_x = float(np.exp(np.log(table["depth"].astype(float)).mean()))
    anchor_y = float(np.exp(np.log(table["delta_alpha"].astype(float)).mean()))
    paper = pd.DataFrame(dict(depth=depths, delta_alpha=anchor_y * (depths / anchor_x) ** paper_exponent,
                              line=f"paper: b = {paper_exponent:.2f}"))
    fitted = (pd.DataFrame(dict(depth=depths, delta_alpha=anchor_y * (depths / anchor_x) ** exponent, line=fit_text))
              if np.isfinite(exponent) else paper.iloc[:0])
    lines = pd.concat([fitted, paper])
    values = pd.concat([lines["delta_alpha"], table["delta_alpha"]])
    x = alt.X("depth:Q", title="depth L (blocks)", axis=alt.Axis(values=sorted(table["depth"].unique().tolist())),
              scale=alt.Scale(type="log", nice=False, domain=[depths[0] / 1.15, depths[-1] * 1.15]))
    y = alt.Y("delta_alpha:Q", title="Δα (max − min over layers)",
              scale=alt.Scale(type="log", nice=False, domain=[float(values.min()) / 1.3, float(values.max()) * 1.3]))
    names = list(dict.fromkeys(lines["line"]))
    drawn = alt.Chart(lines).mark_line().encode(
        x=x, y=y, color=alt.value("#555"),
        strokeDash=alt.StrokeDash("line:N", title="Δα ∝ Lᵇ", sort=names, legend=DASH_LEGEND,
                                  scale=alt.Scale(domain=names, range=[[1, 0], [6, 4]][-len(names):])))
    points = alt.Chart(table).mark_point(filled=True, size=90, color="#d62728").encode(
        x=x, y=y, tooltip=["depth:Q", "seed:Q", alt.Tooltip("delta_alpha:Q", format=".3f")])
    return fit(alt.layer(drawn, points).properties(title=title or "Δα against depth"), height=260)
