"""Figures of the depth-series chapter in the paper's form: one panel per depth.

The per-block bars are coloured by the block's α (as the SmolLM2 chart,
``zones.figures.layer_ablation.ablation_bars``), the seeds of a depth side by side and told
apart by their opacity (seed 0 solid, the next seeds pale). The
ΔLoss-against-α panels label each point with its block (``L0``, ``L1``, …) and mark each run's
most important block with a red diamond and its least important with a blue square, as the
paper's figure does.

All take the chapter's tidy tables (``zones.report.depth_series``): ``importance`` (``model,
depth, seed, layer, delta_loss, delta_loss_low, delta_loss_high, alpha``), ``history``
(``depth, seed, step, heldout_loss``) and ``rho_runs`` / ``rho_pooled``.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import DASH_LEGEND, fit, panel_width, wide_only, wrap
from zones.figures.layer_ablation import ALPHA_SCHEME, log_floor

SEED_TITLE = "training seed"
# the paper's marks: the most important block a red diamond, the least important a blue square
MARKS = {"most important": ("diamond", "#d62728"), "least important": ("square", "#1f77b4"),
         "other": ("circle", "#757575")}


SEED_LEGEND = alt.Legend(symbolType="square", symbolFillColor="#616161", symbolStrokeColor="#616161")
PALE = 0.45  # the opacity of the seeds after the first


def _plot_values(frame: pd.DataFrame) -> pd.DataFrame:
    """``*_plot`` columns a log axis can draw: a value ≤ 0 (a block whose removal lowers the
    loss, or an interval's end) at the axis floor; the true values stay for the tooltips."""
    df = frame.copy()
    floor = log_floor(df["delta_loss"])
    df["raises_loss"] = df["delta_loss"] > 0
    for column in ("delta_loss", "delta_loss_low", "delta_loss_high"):
        if column in df:
            df[f"{column}_plot"] = df[column].where(df[column] > floor, floor)
    df["block"] = "L" + df["layer"].astype(int).astype(str)
    df["seed_label"] = "seed " + df["seed"].astype(str)
    return df


def _domain(df: pd.DataFrame) -> list[float]:
    """The log axis' range: every drawn value inside it, interval ends included (a whisker never
    leaves its panel)."""
    drawn = [c for c in ("delta_loss_plot", "delta_loss_low_plot", "delta_loss_high_plot") if c in df]
    values = df[drawn].stack()
    return [float(values.min()) / 1.5, float(values.max()) * 1.5]


def _seed_opacity(df: pd.DataFrame) -> alt.Opacity:
    """The seed as opacity (seed 0 solid, the others pale): colour and shape carry α and the marks."""
    seeds = sorted(df["seed_label"].unique(), key=lambda s: int(s.split()[-1]))
    scale = alt.Scale(domain=seeds, range=[1.0] + [PALE] * (len(seeds) - 1))
    return alt.Opacity("seed_label:O", title=SEED_TITLE, scale=scale, legend=SEED_LEGEND)


def ablation_by_depth(importance: pd.DataFrame, *, alpha_title: str = "α", height: int = 220) -> alt.ConcatChart:
    """ΔLoss when each block is removed alone (log axis) with its paired 95 % interval, one
    panel per depth: bars coloured by the block's α (one colour scale for every panel), the
    seeds side by side (seed 0 solid, others pale). A block whose removal
    lowers the loss is a grey stub at the axis floor (its value is in the tooltip)."""
    df = _plot_values(importance)
    domain = _domain(df)
    scale = alt.Scale(type="log", domain=domain)
    y = alt.Y("delta_loss_plot:Q", title="ΔLoss when removed (nats, log)", scale=scale)
    tooltip = ["model:N", alt.Tooltip("block:N"), alt.Tooltip("seed:N", title=SEED_TITLE),
               alt.Tooltip("delta_loss:Q", format=".4f"), alt.Tooltip("delta_loss_low:Q", format=".4f"),
               alt.Tooltip("delta_loss_high:Q", format=".4f"), alt.Tooltip("alpha:Q", format=".3f", title=alpha_title)]
    alpha_color = alt.Color("alpha:Q", title=alpha_title,
                            scale=alt.Scale(scheme=ALPHA_SCHEME, domain=[float(df["alpha"].min()), float(df["alpha"].max())]))
    panels = []
    for depth in sorted(df["depth"].unique()):
        part = df[df["depth"] == depth]
        base = alt.Chart(part).encode(x=alt.X("layer:O", title="block"), xOffset="seed_label:N", tooltip=tooltip)
        bars = base.transform_filter("datum.raises_loss").mark_bar(clip=True).encode(
            y=y, y2=alt.datum(domain[0]), color=alpha_color, opacity=_seed_opacity(df))
        lowers = base.transform_filter("!datum.raises_loss").mark_bar(color="#bdbdbd", clip=True).encode(
            y=y, y2=alt.datum(domain[0]))
        rules = base.mark_rule(color="#212121", clip=True).encode(
            y=alt.Y("delta_loss_low_plot:Q", scale=scale), y2="delta_loss_high_plot:Q")
        panels.append(alt.layer(bars, lowers, rules, title=f"depth {depth}")
                      .properties(width=panel_width(2), height=height))
    return wrap(panels, columns=2).resolve_scale(y="shared", color="shared", opacity="shared")


def _marked(df: pd.DataFrame) -> pd.DataFrame:
    """Each run's most and least important block (largest and smallest ΔLoss) named in ``mark``."""
    df = df.copy()
    df["mark"] = "other"
    for _, run in df.groupby(["depth", "seed"]):
        df.loc[run["delta_loss"].idxmax(), "mark"] = "most important"
        df.loc[run["delta_loss"].idxmin(), "mark"] = "least important"
    return df


def importance_by_depth(importance: pd.DataFrame, *, alpha_title: str = "α", height: int = 240) -> alt.ConcatChart:
    """ΔLoss (log) of each block against its α, one panel per depth, in the paper's form: each
    point labelled with its block (``L0``, ``L1``, …), each run's most important block a red
    diamond and its least important a blue square; the seeds told apart by opacity (seed 0
    solid, others pale)."""
    df = _marked(_plot_values(importance))
    domain = _domain(df)
    marks = alt.Scale(domain=list(MARKS), range=[shape for shape, _ in MARKS.values()])
    colors = alt.Scale(domain=list(MARKS), range=[color for _, color in MARKS.values()])
    tooltip = ["model:N", alt.Tooltip("block:N"), alt.Tooltip("seed:N", title=SEED_TITLE),
               alt.Tooltip("alpha:Q", format=".3f", title=alpha_title), alt.Tooltip("delta_loss:Q", format=".4f"),
               alt.Tooltip("mark:N", title="in this run")]
    panels = []
    for depth in sorted(df["depth"].unique()):
        part = df[df["depth"] == depth]
        base = alt.Chart(part).encode(
            x=alt.X("alpha:Q", title=alpha_title, scale=alt.Scale(zero=False, padding=14)),
            y=alt.Y("delta_loss_plot:Q", title="ΔLoss (nats, log)", scale=alt.Scale(type="log", domain=domain)))
        points = base.mark_point(filled=True, clip=True).encode(
            shape=alt.Shape("mark:N", title="block", scale=marks),
            color=alt.Color("mark:N", title="block", scale=colors),
            opacity=_seed_opacity(df),
            size=alt.condition("datum.mark != 'other'", alt.value(120), alt.value(40)),
            tooltip=tooltip)
        # the marked blocks' labels always; the others' only where a panel is wide (on a phone's
        # panel they pile on each other in clusters; a tap's tooltip names the block)
        text = base.mark_text(align="left", dx=6, dy=-6, fontSize=10, clip=True).encode(text="block:N")
        marked = text.transform_filter("datum.mark != 'other'").encode(color=alt.value("#000000"))
        others = wide_only(text.transform_filter("datum.mark == 'other'").encode(color=alt.value("#616161")),
                           f"labels_{depth}")
        panels.append(alt.layer(points, marked, others, title=f"depth {depth}")
                      .properties(width=panel_width(2), height=height))
    return wrap(panels, columns=2).resolve_scale(y="shared", color="shared", shape="shared", opacity="shared")


def loss_curves_by_seed(history: pd.DataFrame) -> alt.Chart:
    """Held-out loss against training step: colour by depth, one line per seed."""
    df = history.dropna(subset=["heldout_loss"]).assign(run=lambda d: "D" + d["depth"].astype(str) + " s" +
                                                        d["seed"].astype(str))
    base = alt.Chart(df).encode(
        x=alt.X("step:Q", title="training step"),
        y=alt.Y("heldout_loss:Q", title="held-out loss (nats/token)", scale=alt.Scale(zero=False)),
        color=alt.Color("depth:O", title="depth"), detail="run:N",
        tooltip=["run:N", "step:Q", alt.Tooltip("heldout_loss:Q", format=".3f")])
    # the dash on the lines alone: its legend then draws a line of each dash (with the points it
    # would draw a dot for every seed, the same black dot)
    lines = base.mark_line().encode(strokeDash=alt.StrokeDash("seed:N", title=SEED_TITLE, legend=DASH_LEGEND))
    return fit(alt.layer(lines, base.mark_point(filled=True), title="Held-out loss during training"), height=240)


def rho_intervals(rho_runs: pd.DataFrame, rho_pooled: pd.DataFrame) -> alt.Chart:
    """ρ(α, ΔLoss) with its 95 % interval: each run, and each depth's seeds pooled — only where a
    depth has several runs (one run has nothing to pool: its row is the run's own) — and every run
    pooled."""
    runs = rho_runs.assign(row=lambda d: "D" + d["depth"].astype(str) + ", seed " + d["seed"].astype(str),
                           kind="one run")
    several = rho_pooled["n_runs"] > 1 if "n_runs" in rho_pooled else pd.Series(True, index=rho_pooled.index)
    pooled = rho_pooled[several].assign(
        row=lambda d: d["depth"].astype(str).map(lambda depth: "all runs, pooled" if depth == "all"
                                                 else f"D{depth}, pooled"), kind="pooled")
    df = pd.concat([runs, pooled], ignore_index=True)[["row", "kind", "rho", "ci_low", "ci_high", "p_value"]]
    order = list(df["row"])
    y = alt.Y("row:N", title=None, sort=order)
    base = alt.Chart(df)
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(strokeDash=[4, 3], color="#757575").encode(x="x:Q")
    rules = base.mark_rule().encode(x=alt.X("ci_low:Q", title="Spearman ρ(α, ΔLoss), 95% interval",
                                            scale=alt.Scale(domain=[-1, 1])), x2="ci_high:Q", y=y,
                                    color=alt.Color("kind:N", title=None))
    points = base.mark_point(filled=True, size=60).encode(
        x="rho:Q", y=y, color="kind:N",
        tooltip=["row:N", alt.Tooltip("rho:Q", format=".2f"), alt.Tooltip("ci_low:Q", format=".2f"),
                 alt.Tooltip("ci_high:Q", format=".2f"), alt.Tooltip("p_value:Q", format=".2g")])
    return fit(alt.layer(zero, rules, points, title="ρ per run and pooled per depth"), height=22 * len(df) + 40)
