"""Figures of the sublayers chapter: sublayer ΔLoss against the sublayer's α, and Δloss against
parameters removed for block and sublayer strategies.

ΔLoss is drawn on a log axis; a sublayer whose removal does not raise the loss is drawn at the
axis floor in grey (its true value in the tooltip), as in ``zones.figures.layer_ablation``.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import DASH_LEGEND, SI_AXIS, fit, panel_width, wrap
from zones.figures.layer_ablation import log_floor

PART_TITLES = {"attn": "attention", "mlp": "MLP"}
KIND_DASH = {"block": [1, 0], "sublayer": [5, 3]}


def sublayer_scatter(importance: pd.DataFrame, *, alpha_title: str = "α") -> alt.ConcatChart:
    """One panel per part (attention, MLP): each block's sublayer ΔLoss (log y) against the
    part's α (x). ``importance``: ``zones.analysis.sublayer_importance.sublayer_importance`` (plus ``model``)."""
    panels = []
    for part, df in importance.groupby("part", sort=False):
        df = df.copy()
        floor = log_floor(df["delta_loss"])
        df["raises_loss"] = df["delta_loss"] > 0
        df["delta_loss_plot"] = df["delta_loss"].where(df["raises_loss"], floor)
        chart = alt.Chart(df).mark_circle(size=60).encode(
            x=alt.X("alpha:Q", title=f"{PART_TITLES.get(part, part)} {alpha_title}", scale=alt.Scale(zero=False)),
            y=alt.Y("delta_loss_plot:Q", title="ΔLoss when removed (nats, log)", scale=alt.Scale(type="log"),
                    axis=SI_AXIS),
            color=alt.condition("datum.raises_loss", alt.value("#1f77b4"), alt.value("#9e9e9e")),
            tooltip=[alt.Tooltip("layer:O", title="block"), alt.Tooltip("delta_loss:Q", format=".4f", title="ΔLoss"),
                     alt.Tooltip("delta_loss_low:Q", format=".4f", title="95% low"),
                     alt.Tooltip("delta_loss_high:Q", format=".4f", title="95% high"),
                     alt.Tooltip("alpha:Q", format=".3f", title=alpha_title)])
        panels.append(chart.properties(width=panel_width(2, legend=False), height=240,
                                       title=f"{PART_TITLES.get(part, part)} removed"))
    return wrap(panels, 2)


def params_tradeoff(plans: pd.DataFrame) -> alt.LayerChart:
    """Δloss (nats, log y) against parameters removed (millions), one line per strategy (solid:
    block strategies, dashed: sublayer strategies), with the paired 95% interval as error bars.
    ``plans``: ``zones.pruning.sublayer_pruning.score_plans``' first table."""
    df = plans.copy()
    df["params_m"] = df["n_params"] / 1e6
    floor = log_floor(df["delta_loss"])
    for c in ("delta_loss", "delta_loss_low", "delta_loss_high"):
        df[f"{c}_plot"] = df[c].where(df[c] > floor, floor)
    x = alt.X("params_m:Q", title="parameters removed (millions)")
    color = alt.Color("strategy:N", title="strategy")
    dash = alt.StrokeDash("kind:N", title="removes", legend=DASH_LEGEND, scale=alt.Scale(domain=list(KIND_DASH),
                                                                       range=list(KIND_DASH.values())))
    base = alt.Chart(df).encode(
        x=x, y=alt.Y("delta_loss_plot:Q", title="Δloss (nats, log)", scale=alt.Scale(type="log"), axis=SI_AXIS),
        color=color,
        tooltip=["strategy:N", "kind:N", "k:O", "removed:N", alt.Tooltip("n_params:Q", format=",.0f"),
                 alt.Tooltip("delta_loss:Q", format=".4f", title="Δloss"),
                 alt.Tooltip("delta_loss_low:Q", format=".4f", title="95% low"),
                 alt.Tooltip("delta_loss_high:Q", format=".4f", title="95% high"),
                 alt.Tooltip("kl:Q", format=".4f", title="KL (nats/token)"),
                 alt.Tooltip("top1:Q", format=".3f", title="top-1 agreement")])
    # the dash on the lines alone, so that its legend draws each dash (not one black dot for both)
    lines = alt.layer(base.mark_line().encode(strokeDash=dash), base.mark_point(filled=True))
    bars = alt.Chart(df).mark_errorbar().encode(x=x, y=alt.Y("delta_loss_low_plot:Q", title=""),
                                       y2="delta_loss_high_plot:Q", color=color)
    return fit(alt.layer(lines, bars), height=300)
