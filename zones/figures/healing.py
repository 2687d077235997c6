"""Figures of the healing chapter. Each takes a table of ``zones.report.healing.interval_tables``
and draws the 95% paired intervals as whiskers (linear axes: a healed Δloss can be near 0)."""
from __future__ import annotations

from typing import Sequence

import altair as alt
import pandas as pd

from zones.figures import panel_width
from zones.figures.pruning import COLORS

STAGE_COLORS = {"pruned": "#bdbdbd", "bridge": "#1f77b4", "lora": "#2ca02c"}


def _stage_scale(stages: Sequence[str]) -> alt.Scale:
    return alt.Scale(domain=list(stages), range=[STAGE_COLORS.get(s, "#9467bd") for s in stages])


def delta_before_after(delta: pd.DataFrame, strategies: Sequence[str], stages: Sequence[str],
                       title: str | None = None) -> alt.HConcatChart:
    """Δloss (nats) of each strategy before (``pruned``) and after each healing method, one
    panel per k, bars with 95% whiskers; random_protected: the median over seeds."""
    ks = sorted(delta["k"].unique())
    tips = ["strategy:N", "stage:N", "k:O", alt.Tooltip("delta_loss:Q", format=".3f", title="Δloss (nats)"),
            alt.Tooltip("delta_loss_low:Q", format=".3f", title="95% low"),
            alt.Tooltip("delta_loss_high:Q", format=".3f", title="95% high"), "n_seeds:Q"]
    panels = []
    for k in ks:
        df = delta[delta["k"] == k]
        base = alt.Chart(df).encode(x=alt.X("strategy:N", sort=list(strategies), title=None),
                                    xOffset=alt.XOffset("stage:N", sort=list(stages)))
        bars = base.mark_bar().encode(
            y=alt.Y("delta_loss:Q", title="Δloss vs the full model (nats)"),
            color=alt.Color("stage:N", scale=_stage_scale(stages), sort=list(stages), title="stage"),
            tooltip=tips)
        whiskers = base.mark_rule(color="black").encode(y="delta_loss_low:Q", y2="delta_loss_high:Q", tooltip=tips)
        panels.append((bars + whiskers).properties(width=panel_width(len(ks)), height=240, title=f"k = {k}"))
    return alt.hconcat(*panels, title=title or "Δloss before and after healing").resolve_scale(y="shared")


def healing_gain(gain: pd.DataFrame, strategies: Sequence[str], title: str | None = None) -> alt.LayerChart:
    """The gain of healing (Δloss after − before, nats; below 0: healing helped) per strategy,
    k and method, with its 95% whisker."""
    df = gain.assign(arm=gain["strategy"] + ", k = " + gain["k"].astype(str) + " (" + gain["method"] + ")")
    order = [a for s in strategies for a in df.sort_values("k")["arm"] if a.startswith(s + ",")]
    tips = ["strategy:N", "k:O", "method:N", alt.Tooltip("gain:Q", format=".3f", title="gain (nats)"),
            alt.Tooltip("gain_low:Q", format=".3f", title="95% low"),
            alt.Tooltip("gain_high:Q", format=".3f", title="95% high")]
    base = alt.Chart(df).encode(y=alt.Y("arm:N", sort=order, title=None))
    color = alt.Color("strategy:N", scale=alt.Scale(domain=list(strategies),
                                                     range=[COLORS.get(s, "#637939") for s in strategies]))
    points = base.mark_point(filled=True, size=60).encode(x=alt.X("gain:Q", title="Δloss after − before (nats)"),
                                                          color=color, tooltip=tips)
    whiskers = base.mark_rule().encode(x="gain_low:Q", x2="gain_high:Q", color=color, tooltip=tips)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 4], color="grey").encode(x="x:Q")
    return (whiskers + points + zero).properties(width="container", height=22 * max(len(df), 4),
                                                 title=title or "What healing bought")
