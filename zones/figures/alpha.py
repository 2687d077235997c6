"""Figures of the α-profile chapter."""
from __future__ import annotations

import altair as alt
import pandas as pd


def alpha_profile_bars(table: pd.DataFrame, role: str = "q", value: str = "alpha_shape",
                       title: str | None = None) -> alt.Chart:
    """α by layer for one role as bars; the first and last layer highlighted."""
    df = table[table["role"] == role].copy()
    if df.empty:
        raise ValueError(f"no rows for role {role!r}; roles present: {sorted(table['role'].unique())}")
    last = df["layer"].max()
    df["position"] = df["layer"].map(lambda l: "first" if l == 0 else "last" if l == last else "middle")
    return alt.Chart(df, title=title or f"{value} of the {role} projection by layer").mark_bar().encode(
        x=alt.X("layer:O", title="layer"),
        y=alt.Y(f"{value}:Q", title=value),
        color=alt.Color("position:N", scale=alt.Scale(domain=["first", "middle", "last"],
                                                     range=["#d62728", "#9ecae9", "#d62728"]),
                        legend=None),
        tooltip=["layer:O", "role:N", alt.Tooltip(f"{value}:Q", format=".3f")],
    ).properties(width=520, height=220)
