"""Figures of the task_accuracy chapter. Each takes a table of
``zones.report.task_accuracy.interval_tables`` and draws the 95% paired intervals as whiskers."""
from __future__ import annotations

from typing import Sequence

import altair as alt
import pandas as pd

from zones.figures import NARROW_WIDTH, panel_width, phone_layout, stack
from zones.figures.pruning import COLORS

FULL_COLOR = "#000000"


def _colors(strategies: Sequence[str]) -> alt.Scale:
    return alt.Scale(domain=list(strategies), range=[FULL_COLOR if s == "full" else COLORS.get(s, "#637939")
                                                     for s in strategies])


def accuracy_bars(accuracy: pd.DataFrame, strategies: Sequence[str], tasks: Sequence[str],
                  chance: float = 0.25, title: str | None = None) -> alt.HConcatChart:
    """Accuracy of the full model and of each healed strategy, one panel per task (and all
    examples pooled), points with 95% whiskers; the dashed line is chance (one in four)."""
    tips = ["strategy:N", "task:N", alt.Tooltip("accuracy:Q", format=".3f"),
            alt.Tooltip("accuracy_low:Q", format=".3f", title="95% low"),
            alt.Tooltip("accuracy_high:Q", format=".3f", title="95% high"), "n:Q", "n_seeds:Q"]
    panels = []
    for task in tasks:
        df = accuracy[accuracy["task"] == task]
        base = alt.Chart(df).encode(x=alt.X("strategy:N", sort=list(strategies), title=None))
        color = alt.Color("strategy:N", scale=_colors(strategies), sort=list(strategies), legend=None)
        points = base.mark_point(filled=True, size=70).encode(
            y=alt.Y("accuracy:Q", title="accuracy", scale=alt.Scale(domain=[0, 1])), color=color, tooltip=tips)
        whiskers = base.mark_rule().encode(y="accuracy_low:Q", y2="accuracy_high:Q", color=color, tooltip=tips)
        line = alt.Chart(pd.DataFrame({"y": [chance]})).mark_rule(strokeDash=[4, 4], color="grey").encode(y="y:Q")
        panels.append((whiskers + points + line).properties(width=panel_width(len(tasks)), height=240, title=task))
    return alt.hconcat(*panels, title=title or "Task accuracy, full and healed").resolve_scale(y="shared")


def difference_whiskers(differences: pd.DataFrame, task: str = "all", title: str | None = None,
                        colour_order: Sequence[str] | None = None) -> alt.LayerChart:
    """Paired differences of accuracy (one row per pair: a strategy minus the full model, or minus
    another strategy) with their 95% whiskers; right of the dashed line, the first one answers better.
    ``colour_order``: the colour scale's strategies (default: those of the rows), the same for every
    panel drawn beside it (panels of one figure share the scale)."""
    df = differences[differences["task"] == task].assign(
        pair=lambda d: d["strategy"] + " − " + d["reference"])
    order = list(df["pair"])
    tips = ["pair:N", alt.Tooltip("difference:Q", format="+.3f"),
            alt.Tooltip("difference_low:Q", format="+.3f", title="95% low"),
            alt.Tooltip("difference_high:Q", format="+.3f", title="95% high"), "n:Q"]
    base = alt.Chart(df).encode(y=alt.Y("pair:N", sort=order, title=None))
    names = list(colour_order) if colour_order is not None else list(dict.fromkeys(df["strategy"]))
    color = alt.Color("strategy:N", scale=alt.Scale(domain=names, range=[COLORS.get(s, "#637939") for s in names]),
                      legend=None)
    points = base.mark_point(filled=True, size=60).encode(x=alt.X("difference:Q", title="Δaccuracy"), color=color,
                                                          tooltip=tips)
    whiskers = base.mark_rule().encode(x="difference_low:Q", x2="difference_high:Q", color=color, tooltip=tips)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 4], color="grey").encode(x="x:Q")
    return (whiskers + points + zero).properties(width="container", height=24 * max(len(df), 3),
                                                 title=title or "Paired differences of accuracy")


LABEL_PX_PER_CHAR = 5  # px of a y-axis label per character (Vega's 10 px sans-serif)


def differences(versus_full: pd.DataFrame, between: pd.DataFrame, task: str = "all") -> alt.VConcatChart:
    """:func:`difference_whiskers` of the healed strategies minus the full model above those of
    every strategy minus every other: one figure. On a phone its panels narrow to leave the
    longest pair's label ("last_n_keep_last − random_protected") its room."""
    tables = [versus_full[versus_full["task"] == task], between[between["task"] == task]]
    longest = max((len(f"{s} − {r}") for t in tables for s, r in zip(t["strategy"], t["reference"])), default=0)
    names = list(dict.fromkeys(s for t in tables for s in t["strategy"]))   # one colour scale for both panels
    chart = stack([difference_whiskers(versus_full, task, title="Healed minus full", colour_order=names),
                   difference_whiskers(between, task, title="Between strategies", colour_order=names)])
    return phone_layout(chart, panel_width=max(100, NARROW_WIDTH - LABEL_PX_PER_CHAR * longest - 20))
