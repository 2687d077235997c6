"""Figures of the α-profile chapter: tables from ``zones.spectra`` in, Altair charts out."""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import COLUMN_WIDTH, fit, panel_width
from zones.spectra import role_group

GROUP_COLORS = alt.Scale(domain=["Q/K", "V/O", "MLP"], range=["#d62728", "#1f77b4", "#7f7f7f"])
ESTIMATOR_TITLES = {"alpha_shape": "spectral-shape α", "alpha_esd": "ESD α (WeightWatcher)",
                    "alpha_hill": "Hill α (median x_min)"}


def _check(table: pd.DataFrame, value: str) -> None:
    if value not in table.columns:
        raise ValueError(f"no column {value!r} in the table; columns: {', '.join(table.columns)}")


def alpha_profile_bars(table: pd.DataFrame, role: str = "q", value: str = "alpha_shape",
                       title: str | None = None) -> alt.Chart:
    """α by layer for one role as bars; the first and last layer highlighted."""
    _check(table, value)
    df = table[table["role"] == role].copy()
    if df.empty:
        raise ValueError(f"no rows for role {role!r}; roles present: {sorted(table['role'].unique())}")
    last = df["layer"].max()
    df["position"] = df["layer"].map(lambda l: "first" if l == 0 else "last" if l == last else "middle")
    return fit(alt.Chart(df, title=title or f"{value} of the {role} projection by layer").mark_bar().encode(
        x=alt.X("layer:O", title="layer"),
        y=alt.Y(f"{value}:Q", title=value),
        color=alt.Color("position:N", scale=alt.Scale(domain=["first", "middle", "last"],
                                                     range=["#d62728", "#9ecae9", "#d62728"]),
                        legend=None),
        tooltip=["layer:O", "role:N", alt.Tooltip(f"{value}:Q", format=".3f")],
    ), height=220)


def alpha_by_role(table: pd.DataFrame, value: str = "alpha_shape", columns: int = 3) -> alt.FacetChart:
    """Small multiples: ``value`` against depth, one panel per role (``columns`` to a row), on a shared y scale
    (so that a flat panel and a steep one can be compared), coloured by Q/K, V/O, MLP."""

    _check(table, value)
    df = table[["layer", "role", value]].copy()
    df["group"] = df["role"].map(role_group)
    roles = list(dict.fromkeys(table["role"]))
    base = alt.Chart(df).encode(
        x=alt.X("layer:Q", title="layer"),
        y=alt.Y(f"{value}:Q", title=ESTIMATOR_TITLES.get(value, value), scale=alt.Scale(zero=False)),
        color=alt.Color("group:N", scale=GROUP_COLORS, title="group"),
        tooltip=["role:N", "layer:O", alt.Tooltip(f"{value}:Q", format=".3f")],
    )
    return (base.mark_line() + base.mark_point(size=18, filled=True)).properties(
        width=panel_width(columns), height=120).facet(
        facet=alt.Facet("role:N", title=None, sort=roles), columns=columns,
        title=f"{ESTIMATOR_TITLES.get(value, value)} by depth, every role")


def estimators_by_depth(table: pd.DataFrame, role: str = "q",
                        alpha_columns: tuple[str, ...] = ("alpha_shape", "alpha_esd", "alpha_hill")) -> alt.VConcatChart:
    """The estimators of one role against depth, one panel each (own y scale); the ESD panel
    carries ±σ_α bars and the shape panel the fit's R² in its tooltip."""
    df = table[table["role"] == role].sort_values("layer")
    if df.empty:
        raise ValueError(f"no rows for role {role!r}; roles present: {sorted(table['role'].unique())}")
    panels = []
    for value in alpha_columns:
        _check(table, value)
        part = df.assign(low=df["alpha_esd"] - df["alpha_esd_sigma"], high=df["alpha_esd"] + df["alpha_esd_sigma"])
        tips = ["layer:O", alt.Tooltip(f"{value}:Q", format=".3f")]
        if value == "alpha_shape":
            tips.append(alt.Tooltip("alpha_shape_r2:Q", format=".3f", title="R²"))
        if value == "alpha_esd":
            tips += [alt.Tooltip("alpha_esd_sigma:Q", format=".3f", title="σ_α"),
                     alt.Tooltip("n_tail:Q", title="tail size")]
        base = alt.Chart(part, title=ESTIMATOR_TITLES.get(value, value)).encode(
            x=alt.X("layer:Q", title="layer"),
            y=alt.Y(f"{value}:Q", title="α", scale=alt.Scale(zero=False)), tooltip=tips)
        chart = base.mark_line(color="#444") + base.mark_point(filled=True, color="#d62728", size=30)
        if value == "alpha_esd":
            chart = alt.Chart(part).mark_rule(color="#bbb").encode(x="layer:Q", y="low:Q", y2="high:Q") + chart
        panels.append(chart.properties(width=COLUMN_WIDTH - 60, height=130))
    return alt.vconcat(*panels, title=f"The estimators side by side: the {role} projection")
