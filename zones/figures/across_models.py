"""Figures of the across-models chapter: every model side by side.

* :func:`rho_by_model`: ρ(α, ΔLoss) of each model with its 95 % interval, against the paper's
  band (``zones.report.verdicts.PAPER_RHO``, passed in as ``band``) and 0;
* :func:`profiles_on_depth`: the α profiles and the ΔLoss profiles of all models on relative depth
  (0 = first block, 1 = last), two panels (one under the other on a phone).

They take the chapter's tidy tables (``zones.report.across_models``): ``models`` (``model, rho,
rho_low, rho_high, rho_p, rho_claim``), ``alpha_profiles`` (``model, layer, relative_depth, alpha``)
and ``delta_profiles`` (``model, layer, relative_depth, delta_loss, delta_loss_low, delta_loss_high``).
"""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import fit, panel_width, wrap

BAND_COLOR = "#c6dbef"


def rho_by_model(models: pd.DataFrame, band: tuple[float, float], *, height_per_model: int = 26) -> alt.LayerChart:
    """ρ of each model (a point) with its 95 % interval (a line), the paper's band shaded and 0
    dashed; the point's colour is the scorecard's reading of the paper's claim on that model."""
    df = models[["model", "rho", "rho_low", "rho_high", "rho_p", "rho_claim"]].copy()
    order = list(df["model"])
    y = alt.Y("model:N", title=None, sort=order)
    x_scale = alt.Scale(domain=[-1, 1])
    shaded = alt.Chart(pd.DataFrame({"low": [band[0]], "high": [band[1]],
                                     "what": [f"the paper's ρ = {band[0]}–{band[1]}"]})).mark_rect(
        color=BAND_COLOR, opacity=0.8).encode(x=alt.X("low:Q", scale=x_scale), x2="high:Q",
                                              tooltip=alt.Tooltip("what:N", title="band"))
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 3], color="#757575").encode(x="x:Q")
    base = alt.Chart(df)
    rules = base.mark_rule(strokeWidth=2, color="#424242").encode(
        x=alt.X("rho_low:Q", title="Spearman ρ(α, ΔLoss), 95% interval", scale=x_scale), x2="rho_high:Q", y=y)
    points = base.mark_point(filled=True, size=70).encode(
        x="rho:Q", y=y, color=alt.Color("rho_claim:N", title="paper's ρ claim",
                                        scale=alt.Scale(domain=["holds", "inconclusive", "does not hold"],
                                                        range=["#2ca02c", "#ff7f0e", "#d62728"])),
        tooltip=["model:N", alt.Tooltip("rho:Q", format=".2f"), alt.Tooltip("rho_low:Q", format=".2f"),
                 alt.Tooltip("rho_high:Q", format=".2f"), alt.Tooltip("rho_p:Q", format=".2g", title="p"),
                 alt.Tooltip("rho_claim:N", title="paper's claim")])
    return fit(alt.layer(shaded, zero, rules, points, title="ρ(α, ΔLoss) per model, the paper's band shaded"),
               height=height_per_model * len(df) + 40)


def profiles_on_depth(alpha_profiles: pd.DataFrame, delta_profiles: pd.DataFrame, *, alpha_title: str = "α",
                      height: int = 230) -> alt.ConcatChart:
    """Two panels on relative depth (0 = first block, 1 = last), one line per model: the α profile
    (``alpha_title``), and ΔLoss when each block is removed alone (nats, symmetric-log axis: a block
    whose removal lowers the loss stays on the chart, below 0)."""
    depth = alt.X("relative_depth:Q", title="relative depth (0 = first block, 1 = last)",
                  scale=alt.Scale(domain=[0, 1]))
    color = alt.Color("model:N", title="model", sort=list(dict.fromkeys(alpha_profiles["model"])))
    alpha = alt.Chart(alpha_profiles, title=f"α profile ({alpha_title})").mark_line(point=True).encode(
        x=depth, y=alt.Y("alpha:Q", title=alpha_title, scale=alt.Scale(zero=False)), color=color,
        tooltip=["model:N", "layer:Q", alt.Tooltip("alpha:Q", format=".3f")])
    delta = alt.Chart(delta_profiles, title="ΔLoss when the block is removed").mark_line(point=True).encode(
        x=depth, y=alt.Y("delta_loss:Q", title="ΔLoss (nats, symlog)", scale=alt.Scale(type="symlog")), color=color,
        tooltip=["model:N", "layer:Q", alt.Tooltip("delta_loss:Q", format=".4f"),
                 alt.Tooltip("delta_loss_low:Q", format=".4f"), alt.Tooltip("delta_loss_high:Q", format=".4f")])
    panels = [c.properties(width=panel_width(2), height=height) for c in (alpha, delta)]
    return wrap(panels, columns=2).resolve_scale(color="shared")
