"""Figures of the depth-pruning chapter. Each takes the tables of ``zones.pruning``."""
from __future__ import annotations

import math
from typing import Sequence

import altair as alt
import pandas as pd

# Ours in blue, the heuristic it is measured against in orange, chance in grey.
COLORS = {"zone_aware": "#1f77b4", "last_n": "#ff7f0e", "random": "#7f7f7f", "alpha_lowest": "#9467bd",
          "block_influence": "#2ca02c", "angular": "#17becf", "ablation_rank": "#8c564b", "greedy": "#d62728",
          "zone_aware_no_protection": "#e377c2", "zone_aware_no_spreading": "#bcbd22",
          "zone_aware_one_zone": "#393b79"}
FALLBACK = ["#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"]


def _color(strategies: Sequence[str]) -> alt.Scale:
    extra = iter(FALLBACK * 4)
    return alt.Scale(domain=list(strategies), range=[COLORS.get(s) or next(extra) for s in strategies])


def _positive(summary: pd.DataFrame, strategies: Sequence[str] | None) -> pd.DataFrame:
    df = summary if strategies is None else summary[summary["strategy"].isin(strategies)]
    return df[df["delta_ppl"] > 0].copy()  # a log axis cannot show ΔPPL ≤ 0


def delta_ppl_bars(summary: pd.DataFrame, strategies: Sequence[str] = ("zone_aware", "last_n", "random"),
                   title: str | None = None) -> alt.LayerChart:
    """Grouped bars of ΔPPL (log y) per k; seeded strategies show their seed mean with a
    min–max whisker."""
    df = _positive(summary, strategies)
    order = [s for s in strategies if s in set(df["strategy"])]
    base = alt.Chart(df).encode(
        x=alt.X("k:O", title="blocks removed (k)"),
        xOffset=alt.XOffset("strategy:N", sort=order),
        color=alt.Color("strategy:N", scale=_color(order), sort=order, title="strategy"),
    )
    floor = df[["delta_ppl", "delta_ppl_min"]].where(lambda d: d > 0).min().min() if len(df) else 1.0
    # bars grow from a power of ten below the smallest value, so every bar is visible
    y_scale = alt.Scale(type="log", domainMin=10 ** math.floor(math.log10(floor)) if floor == floor else 1.0)
    bars = base.mark_bar(clip=True).encode(
        y=alt.Y("delta_ppl:Q", scale=y_scale, title="ΔPPL (log scale)", stack=None),
        tooltip=["strategy:N", "k:O", alt.Tooltip("delta_ppl:Q", format=".2f", title="ΔPPL (mean)"),
                 alt.Tooltip("delta_ppl_min:Q", format=".2f", title="min"),
                 alt.Tooltip("delta_ppl_max:Q", format=".2f", title="max"), "n_seeds:Q"],
    )
    whiskers = base.transform_filter("datum.n_seeds > 1").mark_rule(color="black").encode(
        y=alt.Y("delta_ppl_min:Q", scale=y_scale), y2="delta_ppl_max:Q")
    return (bars + whiskers).properties(width=560, height=260, title=title or "ΔPPL by number of blocks removed")


def delta_ppl_lines(summary: pd.DataFrame, strategies: Sequence[str] | None = None,
                    title: str | None = None, dashed: Sequence[str] = ()) -> alt.LayerChart:
    """ΔPPL (log y) against k, one line per strategy (``dashed`` ones dashed, so lines that
    coincide stay visible); click the legend to pick out one."""
    df = _positive(summary, strategies)
    df["line"] = df["strategy"].isin(list(dashed)).map({True: "dashed", False: "solid"})
    order = list(dict.fromkeys(s for s in (strategies or summary["strategy"]) if s in set(df["strategy"])))
    pick = alt.selection_point(fields=["strategy"], bind="legend")
    base = alt.Chart(df).encode(
        x=alt.X("k:Q", title="blocks removed (k)", axis=alt.Axis(tickMinStep=1)),
        y=alt.Y("delta_ppl:Q", scale=alt.Scale(type="log"), title="ΔPPL (log scale)"),
        color=alt.Color("strategy:N", scale=_color(order), sort=order, title="strategy (click)"),
        opacity=alt.condition(pick, alt.value(1.0), alt.value(0.12)),
        strokeDash=alt.StrokeDash("line:N", scale=alt.Scale(domain=["solid", "dashed"], range=[[1, 0], [6, 3]]),
                                  legend=None),
        tooltip=["strategy:N", "k:Q", alt.Tooltip("delta_ppl:Q", format=".2f", title="ΔPPL"),
                 alt.Tooltip("ppl:Q", format=".2f", title="PPL")],
    )
    return (base.mark_line() + base.mark_point(filled=True, size=40)).add_params(pick).properties(
        width=560, height=280, title=title or "ΔPPL of every strategy")


def crossover_chart(comparison: pd.DataFrame, numerator: str = "last_n",
                    denominator: str = "zone_aware") -> alt.LayerChart:
    """ΔPPL(numerator) / ΔPPL(denominator) against k (log y), with the line at 1 and the
    region where each strategy wins shaded."""
    df = comparison.dropna(subset=["ratio"])
    lo = min(float(df["ratio"].min()) if len(df) else 1.0, 1.0) / 1.6
    hi = max(float(df["ratio"].max()) if len(df) else 1.0, 1.0) * 1.6
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
        color=alt.Color("region:N", scale=alt.Scale(domain=[f"{denominator} wins", f"{numerator} wins"],
                                                    range=[COLORS.get(denominator, "#1f77b4"),
                                                           COLORS.get(numerator, "#ff7f0e")]),
                        legend=None))
    labels = alt.Chart(regions).mark_text(align="left", dx=4, fontWeight="bold", opacity=0.6).encode(
        x=alt.X("x:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)),
        y=alt.Y("label_y:Q", scale=y_scale), text="region:N")
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(strokeDash=[4, 3], color="black").encode(
        y=alt.Y("y:Q", scale=y_scale))
    line = alt.Chart(df).mark_line(point=True, color="black").encode(
        x=alt.X("k:Q", scale=alt.Scale(domain=[k_lo, k_hi], nice=False)),
        y=alt.Y("ratio:Q", scale=y_scale, title=f"ΔPPL {numerator} / ΔPPL {denominator} (log scale)",
                axis=alt.Axis(grid=False)),
        tooltip=["k:Q", alt.Tooltip("ratio:Q", format=".2f"), alt.Tooltip(f"{numerator}:Q", format=".2f"),
                 alt.Tooltip(f"{denominator}:Q", format=".2f"), "winner:N"])
    return (shade + labels + one + line).properties(width=560, height=260,
                                                    title=f"{numerator} / {denominator}: above 1, {denominator} wins")


def removed_on_profile(zones: pd.DataFrame, plans: pd.DataFrame, k: int,
                       strategies: Sequence[str] | None = None, value_title: str = "α") -> alt.VConcatChart:
    """The α profile (bars coloured by zone, lowest-α zone darkest) above a grid of the blocks
    each strategy removes at ``k`` (a square per removed block; the number is its turn)."""
    layers = sorted(zones["layer"].astype(int))
    x = alt.X("layer:O", sort=layers, scale=alt.Scale(domain=layers), title="block")
    profile = alt.Chart(zones.assign(zone_label=zones["zone_rank"].map(lambda r: f"zone {r + 1}"))).mark_bar().encode(
        x=x, y=alt.Y("alpha:Q", title=value_title),
        color=alt.Color("zone_label:N", title="zone (1 = lowest mean α)", scale=alt.Scale(scheme="blues", reverse=True)),
        tooltip=["layer:O", alt.Tooltip("alpha:Q", format=".3f"), "zone_label:N",
                 alt.Tooltip("zone_mean:Q", format=".3f", title="zone mean α")],
    ).properties(width=560, height=150, title=f"Blocks removed at k = {k}, on the α profile")
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
    turns = base.mark_text(fontSize=8, color="white").encode(text="turn:Q")
    grid = (squares + turns).properties(width=560, height=18 * len(order))
    return alt.vconcat(profile, grid).resolve_scale(color="independent")
