"""Summaries of an α table (``alpha_table``): one value per block, spread over depth, agreement of estimators.

Tables in, tables out: nothing here touches a model.
"""
from __future__ import annotations

import pandas as pd

from zones.spectra.table import VALUE_COLUMNS

ROLE_GROUPS = {"q": "Q/K", "k": "Q/K", "v": "V/O", "o": "V/O"}  # every other role: "MLP"


def layer_alpha(table: pd.DataFrame, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted") -> pd.Series:
    """One value per block: a single role's value, or ``alpha_role="weighted"``: the mean over the
    block's matrices weighted by their parameter counts (rows · cols), NaNs skipped.

    Returns a Series indexed by ``layer`` and named ``estimator``.
    """
    if alpha_estimator not in table.columns or alpha_estimator in ("layer", "role", "rows", "cols", "note"):
        raise ValueError(f"unknown estimator {alpha_estimator!r}; choose from {', '.join(VALUE_COLUMNS)}")
    if alpha_role == "weighted":
        value = table[alpha_estimator].astype(float)
        weight = (table["rows"] * table["cols"]).astype(float).where(value.notna(), 0.0)
        frame = pd.DataFrame({"layer": table["layer"], "wv": (value * weight).fillna(0.0), "w": weight})
        sums = frame.groupby("layer")[["wv", "w"]].sum()
        series = (sums["wv"] / sums["w"].where(sums["w"] > 0)).astype(float)
    else:
        rows = table[table["role"] == alpha_role]
        if rows.empty:
            raise ValueError(f"no rows for role {alpha_role!r}; roles present: {sorted(table['role'].unique())} "
                             f"or 'weighted'")
        series = rows.set_index("layer")[alpha_estimator].astype(float)
    series = series.sort_index()
    series.index.name = "layer"
    series.name = alpha_estimator
    return series


def role_group(role: str) -> str:
    """Q/K, V/O or MLP."""
    return ROLE_GROUPS.get(role, "MLP")


def depth_spread(table: pd.DataFrame, alpha_estimator: str = "alpha_shape") -> pd.DataFrame:
    """How much each role's value moves with depth: one row per role.

    Columns: ``role, group`` (Q/K, V/O, MLP); ``first, last`` (the value at the first and last
    block); ``min, max, range`` (max − min over blocks); ``std`` (over blocks); ``depth_corr``
    (Spearman correlation of the value with the block index). NaN values are skipped.
    """
    if alpha_estimator not in VALUE_COLUMNS or alpha_estimator not in table.columns:
        raise ValueError(f"unknown estimator {alpha_estimator!r}; choose from {', '.join(VALUE_COLUMNS)}")
    rows = []
    for role, part in table.groupby("role", sort=False):
        part = part.sort_values("layer")
        value = part[alpha_estimator].astype(float)
        ok = value.notna()
        corr = part.loc[ok, "layer"].rank().corr(value[ok].rank()) if ok.sum() > 2 else float("nan")
        rows.append(dict(role=role, group=role_group(role), first=float(value.iloc[0]),
                         last=float(value.iloc[-1]), min=float(value.min()), max=float(value.max()),
                         range=float(value.max() - value.min()), std=float(value.std()),
                         depth_corr=float(corr)))
    return pd.DataFrame(rows, columns=["role", "group", "first", "last", "min", "max", "range", "std",
                                       "depth_corr"])


def estimator_correlation(table: pd.DataFrame, role: str = "q", first: str = "alpha_shape",
                          second: str = "alpha_esd") -> float:
    """Spearman correlation across depth between two estimators of one role (NaNs skipped)."""
    for name in (first, second):
        if name not in VALUE_COLUMNS:
            raise ValueError(f"unknown estimator {name!r}; choose from {', '.join(VALUE_COLUMNS)}")
    rows = table[table["role"] == role][[first, second]].astype(float).dropna()
    if len(rows) < 3:
        return float("nan")
    return float(rows[first].rank().corr(rows[second].rank()))
