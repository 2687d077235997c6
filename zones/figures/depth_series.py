"""Figures of the depth-series chapter in the paper's form: one panel per depth, the seeds of
a depth side by side (bars) or as coloured points.

All take the chapter's tidy tables (``zones.report.depth_series``): ``importance`` (``model,
depth, seed, layer, delta_loss, delta_loss_low, delta_loss_high, alpha``), ``history``
(``depth, seed, step, heldout_loss``) and ``rho_runs`` / ``rho_pooled``.
"""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import fit, panel_width, wrap
from zones.figures.layer_ablation import log_floor

SEED_TITLE = "training seed"


def _plot_values(frame: pd.DataFrame) -> pd.DataFrame:
    df = frame.copy()
    floor = log_floor(df["delta_loss"])
    df["raises_loss"] = df["delta_loss"] > 0
    for column in ("delta_loss", "delta_loss_low", "delta_loss_high"):
        if column in df:
            df[f"{column}_plot"] = df[column].where(df[column] > floor, floor)
    return df


def _domain(df: pd.DataFrame) -> list[float]:
    top = df["delta_loss_high_plot"].max() if "delta_loss_high_plot" in df else df["delta_loss_plot"].max()
    return [float(df["delta_loss_plot"].min()) / 1.5, float(top) * 1.5]


def ablation_by_depth(importance: pd.DataFrame, *, height: int = 220) -> alt.ConcatChart:
    """ΔLoss when each block is removed alone (log axis), bars per block with the seeds side
    by side and each bar's paired 95 % interval; one panel per depth. A block whose removal
    lowers the loss is drawn at the axis floor (its value is in the tooltip)."""
    df = _plot_values(importance)
    domain = _domain(df)
    y = alt.Y("delta_loss_plot:Q", title="ΔLoss when removed (nats, log)", scale=alt.Scale(type="log", domain=domain))
    tooltip = ["model:N", alt.Tooltip("layer:O", title="block"), alt.Tooltip("delta_loss:Q", format=".4f"),
               alt.Tooltip("delta_loss_low:Q", format=".4f"), alt.Tooltip("delta_loss_high:Q", format=".4f"),
               alt.Tooltip("alpha:Q", format=".3f")]
    panels = []
    depths = sorted(df["depth"].unique())
    for depth in depths:
        part = df[df["depth"] == depth]
        base = alt.Chart(part).encode(x=alt.X("layer:O", title="block"), xOffset="seed:N", tooltip=tooltip)
        bars = base.mark_bar().encode(y=y, y2=alt.datum(domain[0]), color=alt.Color("seed:N", title=SEED_TITLE),
                                      opacity=alt.condition("datum.raises_loss", alt.value(1.0), alt.value(0.35)))
        rules = base.mark_rule(color="#212121").encode(
            y=alt.Y("delta_loss_low_plot:Q", scale=alt.Scale(type="log", domain=domain)), y2="delta_loss_high_plot:Q")
        panels.append(alt.layer(bars, rules, title=f"depth {depth}")
                      .properties(width=panel_width(1) if depth == max(depths) else panel_width(2), height=height))
    return wrap(panels, columns=2).resolve_scale(y="shared", color="shared")


def importance_by_depth(importance: pd.DataFrame, *, alpha_title: str = "α", height: int = 220) -> alt.ConcatChart:
    """ΔLoss (log) of each block against its α, the seeds as colours; one panel per depth."""
    df = _plot_values(importance)
    domain = _domain(df)
    panels = []
    for depth in sorted(df["depth"].unique()):
        part = df[df["depth"] == depth]
        panels.append(alt.Chart(part, title=f"depth {depth}").mark_point(filled=True, size=50).encode(
            x=alt.X("alpha:Q", title=alpha_title, scale=alt.Scale(zero=False)),
            y=alt.Y("delta_loss_plot:Q", title="ΔLoss (nats, log)", scale=alt.Scale(type="log", domain=domain)),
            color=alt.Color("seed:N", title=SEED_TITLE),
            tooltip=["model:N", alt.Tooltip("layer:O", title="block"), alt.Tooltip("alpha:Q", format=".3f"),
                     alt.Tooltip("delta_loss:Q", format=".4f")]).properties(width=panel_width(3), height=height))
    return alt.hconcat(*panels).resolve_scale(y="shared", color="shared")


def loss_curves_by_seed(history: pd.DataFrame) -> alt.Chart:
    """Held-out loss against training step: colour by depth, one line per seed."""
    df = history.dropna(subset=["heldout_loss"]).assign(run=lambda d: "D" + d["depth"].astype(str) + " s" +
                                                        d["seed"].astype(str))
    return fit(alt.Chart(df, title="Held-out loss during training").mark_line(point=True).encode(
        x=alt.X("step:Q", title="training step"),
        y=alt.Y("heldout_loss:Q", title="held-out loss (nats/token)", scale=alt.Scale(zero=False)),
        color=alt.Color("depth:O", title="depth"), detail="run:N",
        strokeDash=alt.StrokeDash("seed:N", title=SEED_TITLE),
        tooltip=["run:N", "step:Q", alt.Tooltip("heldout_loss:Q", format=".3f")]), height=240)


def rho_intervals(rho_runs: pd.DataFrame, rho_pooled: pd.DataFrame) -> alt.Chart:
    """ρ(α, ΔLoss) with its 95 % interval: each run, and each depth's seeds pooled."""
    runs = rho_runs.assign(row=lambda d: "D" + d["depth"].astype(str) + ", seed " + d["seed"].astype(str),
                           kind="one run")
    pooled = rho_pooled.assign(row=lambda d: "D" + d["depth"].astype(str) + ", pooled", kind="pooled")
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
