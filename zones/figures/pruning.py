"""Figures of the depth-pruning chapter. Each takes the tables of ``zones.pruning``.

Where a summary carries the 95% paired intervals of ``zones.pruning.summarize_pruning``
(``delta_ppl_low``, ``delta_ppl_high``), the charts draw them as error bars (on a log axis an
end at or below 0 is drawn at the axis floor); the crossover chart draws the ratio's interval
and marks a collapsed ratio at the top of the chart instead of plotting its value.
"""
from __future__ import annotations

import math
from typing import Sequence

import altair as alt
import pandas as pd

from zones.figures import COLUMN_WIDTH, SI_AXIS, SI_LABELS, phone_layout, stack, wide_only  # charts fit the column; SI axis labels

# Ours in blue, the heuristic it is measured against in orange, chance in grey.
COLORS = {"zone_aware": "#1f77b4", "last_n": "#ff7f0e", "random": "#7f7f7f", "alpha_lowest": "#9467bd",
          "block_influence": "#2ca02c", "angular": "#17becf", "ablation_rank": "#8c564b", "greedy": "#d62728",
          "zone_aware_no_protection": "#e377c2", "zone_aware_no_spreading": "#bcbd22",
          "zone_aware_one_zone": "#393b79", "last_n_keep_last": "#ffbb78", "random_protected": "#c7c7c7",
          "protect_spread": "#aec7e8", "protect_spread_random": "#9edae5"}
FALLBACK = ["#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


def _color(strategies: Sequence[str]) -> alt.Scale:
    extra = iter(FALLBACK * 4)
    return alt.Scale(domain=list(strategies), range=[COLORS.get(s) or next(extra) for s in strategies])


def _positive(summary: pd.DataFrame, strategies: Sequence[str] | None) -> pd.DataFrame:
    df = summary if strategies is None else summary[summary["strategy"].isin(strategies)]
    return df[df["delta_ppl"] > 0].copy()  # a log axis cannot show ΔPPL ≤ 0


def _has_interval(df: pd.DataFrame) -> bool:
    return {"delta_ppl_low", "delta_ppl_high"} <= set(df.columns) and bool(df["delta_ppl_high"].notna().any())


def _interval_ends(df: pd.DataFrame, floor: float) -> pd.DataFrame:
    """The interval's ends where a log axis can draw them (an end ≤ 0 at ``floor``)."""
    df = df.copy()
    for column in ("delta_ppl_low", "delta_ppl_high"):
        df[f"{column}_plot"] = df[column].where(df[column] > floor, floor)
    return df


def _interval_tooltips() -> list:
    return [alt.Tooltip("delta_ppl_low:Q", format=".3g", title="95% interval, low"),
            alt.Tooltip("delta_ppl_high:Q", format=".3g", title="95% interval, high")]


def delta_ppl_bars(summary: pd.DataFrame, strategies: Sequence[str] = ("zone_aware", "last_n", "random"),
                   title: str | None = None) -> alt.LayerChart:
    """Grouped bars of ΔPPL (log y) per k, with the 95% paired interval as a whisker when the
    summary has it (seeded strategies: their median over seeds); without intervals, seeded
    strategies show their seed min–max."""
    df = _positive(summary, strategies)
    order = [s for s in strategies if s in set(df["strategy"])]
    base = alt.Chart(df).encode(
        x=alt.X("k:O", title="blocks removed (k)"),
        xOffset=alt.XOffset("strategy:N", sort=order),
        color=alt.Color("strategy:N", scale=_color(order), sort=order, title="strategy"),
    )
    floor = df[["delta_ppl", "delta_ppl_min"]].where(lambda d: d > 0).min().min() if len(df) else 1.0
    interval = _has_interval(df)
    # bars grow from a power of ten below the smallest value, so every bar is visible; the axis
    # reaches above the highest whisker, so no error bar leaves it
    tops = ["delta_ppl", "delta_ppl_max"] + (["delta_ppl_high"] if interval else [])
    top = df[[c for c in tops if c in df]].max().max() if len(df) else 1.0
    ends = dict(domainMin=10 ** math.floor(math.log10(floor)) if floor == floor else 1.0)
    if top == top and top > 0:
        ends["domainMax"] = 10 ** math.ceil(math.log10(top * 1.2))
    y_scale = alt.Scale(type="log", **ends)
    tips = ["strategy:N", "k:O", alt.Tooltip("delta_ppl:Q", format=".3g", title="ΔPPL (at the median Δloss over seeds)")]
    tips += _interval_tooltips() if interval else []
    tips += [alt.Tooltip("delta_ppl_min:Q", format=".3g", title="min over seeds"),
             alt.Tooltip("delta_ppl_max:Q", format=".3g", title="max over seeds"), "n_seeds:Q"]
    bars = base.mark_bar(clip=True).encode(
        y=alt.Y("delta_ppl:Q", scale=y_scale, title="ΔPPL (log scale)", stack=None, axis=SI_AXIS), tooltip=tips)
    if interval:
        low_end = 10 ** math.floor(math.log10(floor)) if floor == floor else 1.0
        whiskers = alt.Chart(_interval_ends(df, low_end)).mark_rule(color="black", clip=True).encode(
            x=alt.X("k:O"), xOffset=alt.XOffset("strategy:N", sort=order),
            y=alt.Y("delta_ppl_low_plot:Q", scale=y_scale), y2="delta_ppl_high_plot:Q", tooltip=tips)
    else:
        whiskers = base.transform_filter("datum.n_seeds > 1").mark_rule(color="black", clip=True).encode(
            y=alt.Y("delta_ppl_min:Q", scale=y_scale), y2="delta_ppl_max:Q")
    return (bars + whiskers).properties(width="container", height=260, title=title or "ΔPPL by number of blocks removed")


def delta_ppl_lines(summary: pd.DataFrame, strategies: Sequence[str] | None = None,
                    title: str | None = None, dashed: Sequence[str] = ()) -> alt.LayerChart:
    """ΔPPL (log y) against k, one line per strategy (``dashed`` ones dashed, so lines that
    coincide stay visible), with the 95% paired interval as a vertical rule at each point when
    the summary has it; click the legend to pick out one."""
    df = _positive(summary, strategies)
    df["line"] = df["strategy"].isin(list(dashed)).map({True: "dashed", False: "solid"})
    order = list(dict.fromkeys(s for s in (strategies or summary["strategy"]) if s in set(df["strategy"])))
    pick = alt.selection_point(fields=["strategy"], bind="legend")
    base = alt.Chart(df).encode(
        x=alt.X("k:Q", title="blocks removed (k)", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("delta_ppl:Q", scale=alt.Scale(type="log"), title="ΔPPL (log scale)", axis=SI_AXIS),
        color=alt.Color("strategy:N", scale=_color(order), sort=order, title="strategy (click or tap)"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        strokeDash=alt.StrokeDash("line:N", scale=alt.Scale(domain=["solid", "dashed"], range=[[1, 0], [6, 3]]),
                                  legend=None),
        tooltip=["strategy:N", "k:Q", alt.Tooltip("delta_ppl:Q", format=".3g", title="ΔPPL")]
                + (_interval_tooltips() if _has_interval(df) else []) + [alt.Tooltip("ppl:Q", format=".2f", title="PPL")],
    )
    chart = base.mark_line() + base.mark_point(filled=True, size=40)
    if _has_interval(df):
        floor = float(df["delta_ppl"].min()) / 3
        rules = alt.Chart(_interval_ends(df, floor)).mark_rule(strokeWidth=1.5, clip=True).encode(
            x="k:Q", y=alt.Y("delta_ppl_low_plot:Q", scale=alt.Scale(type="log")), y2="delta_ppl_high_plot:Q",
            color=alt.Color("strategy:N", scale=_color(order), sort=order),
            opacity=alt.condition(pick, alt.value(0.6), alt.value(0.06)))
        chart = chart + rules
    return chart.add_params(pick).properties(
        width="container", height=280, title=title or "ΔPPL of every strategy")


def region_scale(denominator: str, numerators: Sequence[str]) -> alt.Scale:
    """The one colour scale of the shaded regions "X wins" of every crossover chart drawn
    together: each strategy's region in its own colour (charts stacked in one figure share a
    scale, so each must carry the whole domain and range, or Vega-Lite keeps the first chart's
    range and paints another strategy's region in it)."""
    names = list(dict.fromkeys([denominator, *numerators]))
    extra = iter(FALLBACK * 4)
    return alt.Scale(domain=[f"{name} wins" for name in names], range=[COLORS.get(name) or next(extra) for name in names])


def crossover_chart(comparison: pd.DataFrame, numerator: str = "last_n",
                    denominator: str = "zone_aware", numerators: Sequence[str] | None = None) -> alt.LayerChart:
    """ΔPPL(numerator) / ΔPPL(denominator) against k (log y), with the line at 1 and the
    region where each strategy wins shaded (colours: :func:`region_scale` over ``numerators``,
    every numerator of the figure; default: this one).

    With the columns of ``zones.pruning.compare_strategies`` (``ratio_low``, ``ratio_high``,
    ``status``), each ratio carries its 95% interval, and a ratio whose status is
    ``"collapsed"`` is not plotted as a value: a triangle at the top of the chart marks it
    ("collapsed": one arm's ΔPPL interval reaches 0, or the ratio exceeds 10³).
    """
    status = comparison["status"] if "status" in comparison else pd.Series("ratio", index=comparison.index)
    df = comparison[(status == "ratio") & comparison["ratio"].notna()].copy()
    collapsed = comparison[status == "collapsed"].copy()
    has_interval = {"ratio_low", "ratio_high"} <= set(df.columns) and bool(df["ratio_high"].notna().any())
    values = [df["ratio"]] + ([df["ratio_low"].where(df["ratio_low"] > 0), df["ratio_high"]] if has_interval else [])
    values = pd.concat(values).dropna()
    lo = min(float(values.min()) if len(values) else 1.0, 1.0) / 1.6
    hi = max(float(values.max()) if len(values) else 1.0, 1.0) * 1.6
    k_lo, k_hi = float(comparison["k"].min()) - 0.5, float(comparison["k"].max()) + 0.5
    regions = pd.DataFrame([
        dict(x=k_lo, x2=k_hi, y=1.0, y2=hi, region=f"{denominator} wins", label_y=hi ** 0.5),
        dict(x=k_lo, x2=k_hi, y=lo, y2=1.0, region=f"{numerator} wins", label_y=lo ** 0.5),
    ])
    x = alt.X("x:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False), title="blocks removed (k)",
              axis=alt.Axis(tickMinStep=1))
    y_scale = alt.Scale(type="log", domain=[lo, hi], nice=False)
    shade = alt.Chart(regions).mark_rect(opacity=0.12).encode(
        x=x, x2="x2:Q", y=alt.Y("y:Q", scale=y_scale), y2="y2:Q",
        color=alt.Color("region:N", scale=region_scale(denominator, numerators or [numerator]), legend=None))
    labels = alt.Chart(regions).mark_text(align="left", dx=4, fontWeight="bold", opacity=0.6).encode(
        x=alt.X("x:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)),
        y=alt.Y("label_y:Q", scale=y_scale), text="region:N")
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 3], color="black").encode(
        y=alt.Y("y:Q", scale=y_scale))
    line = alt.Chart(df).mark_line(point=True, color="black").encode(
        x=alt.X("k:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)),
        y=alt.Y("ratio:Q", scale=y_scale, title=f"ΔPPL {numerator} / ΔPPL {denominator} (log scale)",
                axis=alt.Axis(grid=False, labelExpr=SI_LABELS)),
        tooltip=["k:Q", alt.Tooltip("ratio:Q", format=".3g")]
                + ([alt.Tooltip("ratio_low:Q", format=".3g", title="95% interval, low"),
                    alt.Tooltip("ratio_high:Q", format=".3g", title="95% interval, high")] if has_interval else [])
                + [alt.Tooltip(f"{numerator}:Q", format=".3g"), alt.Tooltip(f"{denominator}:Q", format=".3g"),
                   "winner:N"])
    chart = shade + labels + one + line
    if has_interval:
        ends = df.assign(low_plot=df["ratio_low"].where(df["ratio_low"] > lo, lo),
                         high_plot=df["ratio_high"].where(df["ratio_high"] < hi, hi))
        chart = chart + alt.Chart(ends).mark_rule(color="black", strokeWidth=1.5, clip=True).encode(
            x=alt.X("k:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)),
            y=alt.Y("low_plot:Q", scale=y_scale), y2="high_plot:Q")
    if len(collapsed):
        marks = collapsed.assign(y=hi / 1.25, label="collapsed")
        tips = ["k:Q", alt.Tooltip("ratio:Q", format=".3g", title="ratio (not meaningful)"),
                alt.Tooltip(f"{numerator}:Q", format=".3g"), alt.Tooltip(f"{denominator}:Q", format=".3g"), "winner:N"]
        at = dict(x=alt.X("k:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)), y=alt.Y("y:Q", scale=y_scale))
        chart = (chart + alt.Chart(marks).mark_point(shape="triangle-up", filled=True, size=90, color="#b71c1c")
                 .encode(tooltip=tips, **at)
                 # one word, over the first: over every triangle the words run together on a phone
                 + alt.Chart(marks[marks["k"] == marks["k"].min()]).mark_text(
                     dy=-11, align="left", dx=-6, fontSize=10, color="#b71c1c").encode(text="label:N", **at))
    return chart.properties(width="container", height=260,
                                                    title=f"{numerator} / {denominator}: above 1, {denominator} wins")


def removed_on_profile(zones: pd.DataFrame, plans: pd.DataFrame, k: int,
                       strategies: Sequence[str] | None = None, value_title: str = "α") -> alt.VConcatChart:
    """The α profile (bars coloured by zone, lowest-α zone darkest) above a grid of the blocks
    each strategy removes at ``k`` (a square per removed block; the number is its turn)."""
    layers = sorted(zones["layer"].astype(int))
    # every block labelled where there is room; on a phone's narrow panel the labels that would
    # overlap are hidden (every other, then every fourth, …), upright
    x = alt.X("layer:O", sort=layers, scale=alt.Scale(domain=layers), title="block",
              axis=alt.Axis(labelOverlap="parity", labelSeparation=6, labelAngle=0, labelFontSize=10))
    profile = alt.Chart(zones.assign(zone_label=zones["zone_rank"].map(lambda r: f"zone {r + 1}"))).mark_bar().encode(
        x=x, y=alt.Y("alpha:Q", title=value_title),
        color=alt.Color("zone_label:N", title="zone (1 = lowest mean α)", scale=alt.Scale(scheme="blues", reverse=True)),
        tooltip=["layer:O", alt.Tooltip("alpha:Q", format=".3f"), "zone_label:N",
                 alt.Tooltip("zone_mean:Q", format=".3f", title="zone mean α")],
    ).properties(width=COLUMN_WIDTH - 200, height=150, title=f"Blocks removed at k = {k}, on the α profile")
    rows = []
    chosen = plans[plans["k"] == k]
    if "seed" in chosen:
        chosen = chosen[chosen["seed"] == chosen.groupby("strategy")["seed"].transform("min")]
    for _, plan in chosen.iterrows():
        blocks = [int(b) for b in str(plan["removed"]).split(",") if b.strip()]
        rows += [dict(strategy=plan["strategy"], layer=b, turn=i + 1) for i, b in enumerate(blocks)]
    grid_df = pd.DataFrame(rows)
    order = list(dict.fromkeys(strategies or grid_df["strategy"]))
    grid_df = grid_df[grid_df["strategy"].isin(order)]
    base = alt.Chart(grid_df).encode(x=x, y=alt.Y("strategy:N", sort=order, title=None))
    squares = base.mark_square(size=150).encode(
        color=alt.Color("strategy:N", scale=_color(order), legend=None),
        tooltip=["strategy:N", "layer:O", alt.Tooltip("turn:Q", title="removed as number")])
    # the turn in the square: on a phone a block's column is a few px wide, so the number (which
    # the tooltip gives on a tap) is left out there
    turns = wide_only(base.mark_text(fontSize=10, color="white").encode(text="turn:Q"), "turns")
    grid = alt.layer(squares, turns).properties(width=COLUMN_WIDTH - 200, height=18 * len(order))
    # on a phone the strategies' names beside the grid leave less room for the panels
    return phone_layout(alt.vconcat(profile, grid).resolve_scale(color="independent"), panel_width=190)


def crossover_stack(comparison: pd.DataFrame, denominator: str = "zone_aware") -> alt.VConcatChart:
    """One :func:`crossover_chart` per reference strategy of ``comparison`` (the chapter's
    ``crossover`` table: ``reference``, ``reference_delta_ppl``, ``ours_delta_ppl``, …), one above
    the other, their shaded regions on one colour scale."""
    references = list(dict.fromkeys(comparison["reference"]))
    return stack([crossover_chart(comparison[comparison["reference"] == reference].rename(
                      columns={"reference_delta_ppl": reference, "ours_delta_ppl": denominator}),
                                  reference, denominator, numerators=references)
                  for reference in references])
