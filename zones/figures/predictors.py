"""Figure of the "is α special?" chapter: ρ(importance, predictor) with its 95% interval."""
from __future__ import annotations

import altair as alt
import pandas as pd

from zones.figures import fit

KIND_COLORS = {"spectral": "#1f77b4", "simple": "#ff7f0e"}


def rho_intervals(rhos: pd.DataFrame) -> alt.LayerChart:
    """One row per predictor: ρ (point) and its bootstrap 95% interval (rule), spectral
    predictors blue, simple ones orange, sorted by |ρ|; a zero line. ``rhos``:
    ``zones.analysis.predictors.predictor_rho`` (one model)."""
    df = rhos.sort_values("abs_rho", ascending=False)
    order = list(df["predictor"])
    y = alt.Y("predictor:N", sort=order, title=None)
    color = alt.Color("kind:N", title="predictor", scale=alt.Scale(domain=list(KIND_COLORS),
                                                                    range=list(KIND_COLORS.values())))
    base = alt.Chart(df)
    rules = base.mark_rule(strokeWidth=2).encode(x=alt.X("ci_low:Q", title="Spearman ρ with ΔLoss",
                                                         scale=alt.Scale(domain=[-1, 1])), x2="ci_high:Q", y=y,
                                                 color=color)
    points = base.mark_point(filled=True, size=70).encode(
        x="rho:Q", y=y, color=color,
        tooltip=["predictor:N", "kind:N", alt.Tooltip("rho:Q", format=".2f"), alt.Tooltip("ci_low:Q", format=".2f"),
                 alt.Tooltip("ci_high:Q", format=".2f"), alt.Tooltip("p_value:Q", format=".3g")])
    zero = alt.Chart(pd.DataFrame({"x": [0.0]})).mark_rule(color="#666", strokeDash=[3, 3]).encode(x="x:Q")
    return fit(alt.layer(rules, points, zero), height=28 * len(df) + 40)
