"""Figures of the layer-ablation and importance-vs-α chapters: one panel per model, side by side.

Both take the tidy table of ``zones.analysis.importance.importance_frame``: ``model, layer, delta_loss,
alpha`` (and whatever other ablation columns, shown in tooltips). ΔLoss is drawn on a log
axis; a block whose removal does not raise the loss (ΔLoss ≤ 0) cannot sit on it, so it is
drawn at the axis floor in grey and its true value is in the tooltip. When the table has the
interval columns of ``zones.measure.ablation.ablation_table`` (``delta_loss_low``, ``delta_loss_high``),
the bars carry them as error bars (an end below the axis floor is drawn at the floor).
"""
from __future__ import annotations

from typing import Mapping

import altair as alt
import numpy as np
import pandas as pd

from zones.figures import SI_AXIS
from zones.figures import panel_width as fitted_panel_width

ALPHA_SCHEME = "viridis"
HIGHLIGHT = {"most important": "#d62728", "least important": "#1f77b4", "other": "#9e9e9e"}


def _models(frame: pd.DataFrame) -> list[str]:
    missing = {"model", "layer", "delta_loss", "alpha"} - set(frame.columns)
    if missing:
        raise ValueError(f"the table lacks column(s) {sorted(missing)}; build it with "
                         f"zones.analysis.importance.importance_frame")
    if frame.empty:
        raise ValueError("the table is empty")
    return list(dict.fromkeys(frame["model"]))


def log_floor(values: pd.Series) -> float:
    """Where a non-positive ΔLoss is drawn on a log axis: a third of the smallest positive one."""
    positive = values[values > 0]
    return float(positive.min() / 3) if len(positive) else 1e-6


INTERVAL = ("delta_loss_low", "delta_loss_high")


def _has_interval(df: pd.DataFrame) -> bool:
    return all(c in df.columns for c in INTERVAL) and bool(df[list(INTERVAL)].notna().any().all())


def _with_plot_value(frame: pd.DataFrame) -> pd.DataFrame:
    df = frame.copy()
    floor = log_floor(df["delta_loss"])
    df["raises_loss"] = df["delta_loss"] > 0
    df["delta_loss_plot"] = df["delta_loss"].where(df["raises_loss"], floor)
    if _has_interval(df):  # ends of the error bar on the log axis: never below its floor
        for column in INTERVAL:
            df[f"{column}_plot"] = df[column].where(df[column] > floor, floor)
    return df


def _tooltip(df: pd.DataFrame, alpha_title: str) -> list:
    tips = [alt.Tooltip("model:N"), alt.Tooltip("layer:O", title="block"),
            alt.Tooltip("delta_loss:Q", title="ΔLoss (nats)", format=".4f"),
            alt.Tooltip("alpha:Q", title=alpha_title, format=".3f")]
    for column, title in (("loss", "loss without it"), ("base_loss", "full model's loss"),
                          ("delta_loss_attn", "ΔLoss, attention only"), ("delta_loss_mlp", "ΔLoss, MLP only")):
        if column in df.columns:
            tips.append(alt.Tooltip(f"{column}:Q", title=title, format=".4f"))
    if _has_interval(df):
        tips[3:3] = [alt.Tooltip("delta_loss_low:Q", title="95% interval, low", format=".4f"),
                     alt.Tooltip("delta_loss_high:Q", title="95% interval, high", format=".4f")]
    return tips


def _log_domain(df: pd.DataFrame) -> list[float]:
    """The log axis' range: every drawn value inside it, the error bars' ends included (a
    whisker never leaves its panel)."""
    drawn = [c for c in ("delta_loss_plot", "delta_loss_low_plot", "delta_loss_high_plot") if c in df]
    values = df[drawn].stack()
    return [float(values.min()) / 1.5, float(values.max()) * 1.5]


def _y(domain: list[float], title: str = "ΔLoss when removed (nats, log)") -> alt.Y:
    return alt.Y("delta_loss_plot:Q", title=title, scale=alt.Scale(type="log", domain=domain), axis=SI_AXIS)


def _panel_title(model: str, titles: Mapping[str, str] | None) -> str:
    return titles.get(model, model) if titles else model


def ablation_bars(frame: pd.DataFrame, *, alpha_title: str = "α", titles: Mapping[str, str] | None = None,
                  width: int | None = None, height: int = 240) -> alt.HConcatChart:
    """ΔLoss per block as bars on a log axis, coloured by the block's α; one panel per model.

    The y scale and the α colour scale are shared by the panels, so models compare directly.
    """
    models = _models(frame)
    df = _with_plot_value(frame)
    domain = _log_domain(df)
    y = _y(domain)
    color_domain = [float(np.nanmin(df["alpha"])), float(np.nanmax(df["alpha"]))]
    panel_width = width or fitted_panel_width(len(models))  # the row fits the book's column
    panels = []
    for model in models:
        part = df[df["model"] == model]
        base = alt.Chart(part).encode(
            # A log axis has no zero: bars rise from the bottom of the axis.
            x=alt.X("layer:O", title="block"), y=y, y2=alt.datum(domain[0]),
            tooltip=_tooltip(part, alpha_title))
        bars = base.transform_filter("datum.raises_loss").mark_bar().encode(
            color=alt.Color("alpha:Q", title=alpha_title,
                            scale=alt.Scale(scheme=ALPHA_SCHEME, domain=color_domain)))
        # Blocks whose removal lowers the loss: a grey stub at the axis floor.
        lowers = base.transform_filter("!datum.raises_loss").mark_bar(color="#bdbdbd")
        layers = [bars, lowers]
        if _has_interval(part):  # the 95% paired bootstrap interval of each block's ΔLoss
            layers.append(alt.Chart(part).mark_rule(color="#212121", strokeWidth=1.2, clip=True).encode(
                x=alt.X("layer:O"), y=alt.Y("delta_loss_low_plot:Q", scale=alt.Scale(type="log", domain=domain)), y2="delta_loss_high_plot:Q",
                tooltip=_tooltip(part, alpha_title)))
        panels.append(alt.layer(*layers, title=_panel_title(model, titles))
                      .properties(width=panel_width, height=height))
    return alt.hconcat(*panels).resolve_scale(y="shared", color="shared")


def importance_scatter(frame: pd.DataFrame, *, alpha_title: str = "α", titles: Mapping[str, str] | None = None,
                       width: int | None = None, height: int = 280) -> alt.HConcatChart:
    """ΔLoss (log y) against the block's α (x), points labelled by block; one panel per model.

    In each panel the most and the least important block are highlighted. ``titles`` maps a
    model to its panel title (e.g. with ρ and its interval).
    """
    models = _models(frame)
    df = _with_plot_value(frame)
    df["highlight"] = "other"
    for model in models:
        rows = df.index[df["model"] == model]
        df.loc[df.loc[rows, "delta_loss"].idxmax(), "highlight"] = "most important"
        df.loc[df.loc[rows, "delta_loss"].idxmin(), "highlight"] = "least important"
    y = _y(_log_domain(df))
    panel_width = width or fitted_panel_width(len(models))  # the row fits the book's column
    panels = []
    for model in models:
        part = df[df["model"] == model]
        base = alt.Chart(part).encode(
            x=alt.X("alpha:Q", title=alpha_title, scale=alt.Scale(zero=False, padding=12)), y=y)
        points = base.mark_circle(opacity=0.9).encode(
            color=alt.Color("highlight:N", title=None, scale=alt.Scale(domain=list(HIGHLIGHT),
                                                                       range=list(HIGHLIGHT.values()))),
            size=alt.condition("datum.highlight != 'other'", alt.value(140), alt.value(45)),
            tooltip=_tooltip(part, alpha_title))
        labels = base.mark_text(align="left", dx=6, dy=-5, fontSize=10).encode(
            text=alt.Text("layer:O"),
            color=alt.condition("datum.highlight != 'other'", alt.value("#000000"), alt.value("#616161")))
        panels.append(alt.layer(points, labels, title=_panel_title(model, titles))
                      .properties(width=panel_width, height=height))
    return alt.hconcat(*panels).resolve_scale(y="shared", color="shared")
