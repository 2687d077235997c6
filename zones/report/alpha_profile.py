"""The α-profile chapter: the profile of one role, the spread of every role, and two
claims with intervals (the profile rises with depth; Q/K vary with depth more than V/O).

Intervals resample *blocks* (``common.unit_bootstrap``): the blocks of one model are the
units, and a resample draws as many blocks as the model has, with replacement.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..spectra import depth_spread, estimator_correlation, role_group
from .common import NAN, ChapterResult, interval_side, save, unit_bootstrap

TREND_COLUMNS = ["role", "group", "first_fit", "last_fit", "rise", "rise_low", "rise_high", "trend", "n_blocks"]


def _slope(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Least-squares slope of y on x along ``axis`` (NaN where x is constant)."""
    x = x - x.mean(axis=axis, keepdims=True)
    y = y - y.mean(axis=axis, keepdims=True)
    sxx = (x * x).sum(axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sxx > 0, (x * y).sum(axis=axis) / sxx, np.nan)


def trend_word(low: float, high: float) -> str:
    """``rises`` (interval above 0), ``falls`` (below 0), ``flat within noise`` or ``undefined``."""
    return {"above": "rises", "below": "falls", "straddles": "flat within noise",
            "undefined": "undefined"}[interval_side(low, high, 0.0)]


def depth_trend(table: pd.DataFrame, estimator: str = "alpha_shape", *, n_boot: int = 2000,
                seed: int = 0) -> pd.DataFrame:
    """How each role's value changes from the first block to the last, with a 95% interval.

    One row per role: ``role, group``; ``first_fit, last_fit`` (the least-squares line of the
    value against relative depth layer / (L − 1), at 0 and 1); ``rise`` (last_fit −
    first_fit, the fitted change over the whole depth) and its bootstrap interval
    ``rise_low, rise_high`` (blocks resampled); ``trend`` (:func:`trend_word`: ``rises`` when the
    interval lies above 0, ``falls`` below, ``flat within noise`` when it includes 0);
    ``n_blocks``. Blocks with a NaN value are left out.
    """
    rows = []
    for role, part in table.groupby("role", sort=False):
        part = part[["layer", estimator]].dropna().sort_values("layer")
        n_blocks = int(table["layer"].nunique())
        x = part["layer"].to_numpy(float) / max(n_blocks - 1, 1)
        y = part[estimator].to_numpy(float)
        if len(part) >= 2:
            rise, low, high = unit_bootstrap([x, y], _slope, n_boot=n_boot, seed=seed)
            first = float(y.mean() - rise * x.mean())
        else:
            rise = low = high = first = NAN
        rows.append(dict(role=role, group=role_group(role), first_fit=first, last_fit=first + rise, rise=rise,
                         rise_low=low, rise_high=high, trend=trend_word(low, high), n_blocks=int(len(part))))
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


def group_profile(table: pd.DataFrame, estimator: str = "alpha_shape") -> pd.DataFrame:
    """Per (layer, group): the mean ``value`` over the group's roles (Q/K, V/O, MLP)."""
    df = table.assign(group=table["role"].map(role_group))
    return df.groupby(["layer", "group"], as_index=False)[estimator].mean().rename(columns={estimator: "value"})


def _std_ratio(qk: np.ndarray, vo: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.std(qk, axis=axis, ddof=1) / np.std(vo, axis=axis, ddof=1)


def qk_vo_asymmetry(profile: pd.DataFrame, *, n_boot: int = 2000, seed: int = 0) -> dict:
    """Does Q/K vary with depth more than V/O? ``profile``: ``layer, group, value`` (one
    value per layer and group, e.g. :func:`group_profile` or ``zones.lifecycle.final_profile``).

    The statistic is the ratio of standard deviations over layers, std(Q/K) / std(V/O), with a
    bootstrap interval that resamples layers (the same layers for both groups). Returns
    ``ratio, ratio_low, ratio_high, qk_std, vo_std, n_layers`` and ``asymmetry``: ``Q/K larger``
    (interval above 1), ``V/O larger`` (below 1), ``not separable`` or ``undefined``.
    """
    wide = profile.pivot_table(index="layer", columns="group", values="value").dropna(
        subset=[g for g in ("Q/K", "V/O") if g in set(profile["group"])])
    if not {"Q/K", "V/O"} <= set(wide.columns):
        return dict(ratio=NAN, ratio_low=NAN, ratio_high=NAN, qk_std=NAN, vo_std=NAN, n_layers=0,
                    asymmetry="undefined")
    qk, vo = wide["Q/K"].to_numpy(float), wide["V/O"].to_numpy(float)
    ratio, low, high = unit_bootstrap([qk, vo], _std_ratio, n_boot=n_boot, seed=seed)
    word = {"above": "Q/K larger", "below": "V/O larger", "straddles": "not separable",
            "undefined": "undefined"}[interval_side(low, high, 1.0)]
    return dict(ratio=float(ratio), ratio_low=low, ratio_high=high, qk_std=float(np.std(qk, ddof=1)),
                vo_std=float(np.std(vo, ddof=1)), n_layers=int(len(wide)), asymmetry=word)


def profile_numbers(table: pd.DataFrame, role: str, estimator: str) -> dict:
    """The numbers the chapter cites about one role's profile (plain Python values)."""
    profile = table[table["role"] == role].sort_values("layer")
    value = profile[estimator].astype(float)
    return dict(n_blocks=int(table["layer"].nunique()), n_matrices=int(len(table)),
                n_noted=int((table["note"].fillna("") != "").sum()),
                alpha_first=float(value.iloc[0]), alpha_last=float(value.iloc[-1]),
                alpha_min=float(value.min()), alpha_max=float(value.max()),
                r2_min=float(profile["alpha_shape_r2"].min()), r2_median=float(profile["alpha_shape_r2"].median()),
                esd_first=float(profile["alpha_esd"].iloc[0]), esd_last=float(profile["alpha_esd"].iloc[-1]),
                hill_first=float(profile["alpha_hill"].iloc[0]), hill_last=float(profile["alpha_hill"].iloc[-1]),
                shape_esd_corr=estimator_correlation(table, role, "alpha_shape", "alpha_esd"),
                esd_hill_corr=estimator_correlation(table, role, "alpha_esd", "alpha_hill"))


def asymmetry_sentence(asym: dict) -> str:
    """The chapter's sentence on the Q/K–V/O asymmetry, from :func:`qk_vo_asymmetry`."""
    numbers = f"std(Q/K) / std(V/O) = {asym['ratio']:.2f} [{asym['ratio_low']:.2f}, {asym['ratio_high']:.2f}]"
    return {"Q/K larger": f"Q/K vary more with depth than V/O ({numbers}), as the paper reports.",
            "V/O larger": f"V/O vary more with depth than Q/K ({numbers}): the opposite of the paper's asymmetry.",
            "not separable": f"The two groups' variation over depth is not separable ({numbers}; the interval "
                             f"includes 1).",
            "undefined": "The asymmetry is undefined here (too few blocks, or a flat group)."}[asym["asymmetry"]]


def run(model: str = "smollm2-135m", role: str = "q", estimator: str = "alpha_shape",
        out_dir: str = "results/alpha_profile", *, n_boot: int = 2000, seed: int = 0) -> ChapterResult:
    """The chapter: α table of ``model`` → ``alpha.csv``, ``spread.csv`` (``zones.spectra.
    depth_spread``), ``trend.csv`` (:func:`depth_trend`), ``group_profile.csv``,
    ``asymmetry_claim.csv`` (:func:`qk_vo_asymmetry`) and ``summary.json``; numbers for the page."""
    from ..models import load_model
    from ..spectra import alpha_table

    loaded = load_model(model)
    table = alpha_table(loaded.model)
    if role not in set(table["role"]):
        raise ValueError(f"role {role!r} is not in this model; roles: {', '.join(dict.fromkeys(table['role']))}")
    spread = depth_spread(table, estimator)
    trend = depth_trend(table, estimator, n_boot=n_boot, seed=seed)
    groups = group_profile(table, estimator)
    asym = qk_vo_asymmetry(groups, n_boot=n_boot, seed=seed)
    chosen = trend.set_index("role").loc[role]
    by_group = spread.groupby("group")["range"].mean()
    numbers = dict(model_name=model, role_name=role, estimator_name=estimator,
                   **profile_numbers(table, role, estimator),
                   rise=float(chosen["rise"]), rise_low=float(chosen["rise_low"]),
                   rise_high=float(chosen["rise_high"]), trend=str(chosen["trend"]),
                   first_fit=float(chosen["first_fit"]), last_fit=float(chosen["last_fit"]),
                   qk_range=float(by_group.get("Q/K", NAN)), vo_range=float(by_group.get("V/O", NAN)),
                   mlp_range=float(by_group.get("MLP", NAN)),
                   std_ratio=asym["ratio"], std_ratio_low=asym["ratio_low"], std_ratio_high=asym["ratio_high"],
                   asymmetry=asym["asymmetry"], asymmetry_text=asymmetry_sentence(asym))
    summary = dict(model=model, fingerprint=loaded.fingerprint, role=role, estimator=estimator, n_boot=n_boot,
                   seed=seed, **{k: v for k, v in numbers.items() if k not in ("model_name", "role_name",
                                                                                "estimator_name")},
                   first=numbers["alpha_first"], last=numbers["alpha_last"])
    tables = dict(alpha=table, spread=spread, trend=trend, group_profile=groups,
                  asymmetry_claim=pd.DataFrame([asym]))
    out = save(out_dir, tables, summary)
    return ChapterResult(tables, numbers, summary, out)
