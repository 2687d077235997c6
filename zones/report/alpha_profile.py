"""The α-profile chapter: the profile of one role, the spread of every role, and two
claims with intervals (the profile rises with depth; Q/K vary with depth more than V/O).

Intervals resample *blocks* (``common.unit_bootstrap``): the blocks of one model are the
units, and a resample draws as many blocks as the model has, with replacement.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from zones.core.checks import check_models
from zones.core.models import load_model
from zones.measure.stats import N_RESAMPLES
from zones.report.common import NAN, ChapterResult, interval_side, save, unit_bootstrap
from zones.report.format import fmt_interval, fmt_num
from zones.spectra import alpha_table, depth_spread, estimator_correlation, role_group

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


def depth_trend(table: pd.DataFrame, estimator: str = "alpha_shape", *, n_resamples: int = N_RESAMPLES,
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
            rise, low, high = unit_bootstrap([x, y], _slope, n_resamples=n_resamples, seed=seed)
            first = float(y.mean() - rise * x.mean())
        else:
            rise = low = high = first = NAN
        rows.append(dict(role=role, group=role_group(role), first_fit=first, last_fit=first + rise, rise=rise,
                         rise_low=low, rise_high=high, trend=trend_word(low, high), n_blocks=int(len(part))))
    return pd.DataFrame(rows, columns=TREND_COLUMNS)


def _quadratic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Least-squares ``(a, b, c)`` of y = a + b·x + c·x² along the last axis: shape (..., 3)."""
    moments = np.stack([(x ** k).sum(axis=axis) for k in range(5)], axis=-1)
    gram = np.stack([moments[..., i:i + 3] for i in range(3)], axis=-2)
    rhs = np.stack([(x ** k * y).sum(axis=axis) for k in range(3)], axis=-1)
    with np.errstate(all="ignore"):
        singular = np.abs(np.linalg.det(gram)) < 1e-12
        gram = np.where(singular[..., None, None], np.eye(3), gram)
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    return np.where(singular[..., None], np.nan, coef)


def _curvature(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return _quadratic(x, y, axis)[..., 2]


SHAPE_COLUMNS = ["role", "shape", "rise", "rise_low", "rise_high", "curvature", "curvature_low", "curvature_high",
                 "vertex", "top_block", "top_value", "n_blocks"]


def profile_shape(table: pd.DataFrame, role: str = "q", estimator: str = "alpha_shape", *, n_resamples: int = N_RESAMPLES,
                  seed: int = 0) -> dict:
    """The shape of one role's α profile over relative depth x = layer / (L − 1), with intervals
    (blocks resampled).

    ``rise`` (the least-squares line's change from x = 0 to 1, as :func:`depth_trend`) and
    ``curvature`` (c of the least-squares y = a + b·x + c·x²), each with ``_low, _high``;
    ``vertex`` = −b / 2c (where the parabola turns); ``top_block, top_value`` (the block with the
    largest value). ``shape`` (first rule that applies): ``inverted U`` (curvature interval below
    0 and 0 < vertex < 1), ``rises`` (rise interval above 0), ``falls`` (below 0), ``U-shaped``
    (curvature interval above 0, 0 < vertex < 1), ``not separable`` (intervals include 0),
    ``undefined`` (fewer than three blocks).
    """
    part = table[table["role"] == role][["layer", estimator]].dropna().sort_values("layer")
    n_blocks = int(table["layer"].nunique())
    x = part["layer"].to_numpy(float) / max(n_blocks - 1, 1)
    y = part[estimator].to_numpy(float)
    if len(part) < 3:
        return dict(role=role, shape="undefined", rise=NAN, rise_low=NAN, rise_high=NAN, curvature=NAN,
                    curvature_low=NAN, curvature_high=NAN, vertex=NAN, top_block=-1, top_value=NAN,
                    n_blocks=int(len(part)))
    rise, rise_low, rise_high = unit_bootstrap([x, y], _slope, n_resamples=n_resamples, seed=seed)
    curvature, c_low, c_high = unit_bootstrap([x, y], _curvature, n_resamples=n_resamples, seed=seed)
    _, b, c = _quadratic(x, y)
    vertex = float(-b / (2 * c)) if c != 0 else NAN
    interior = 0 < vertex < 1
    curve, line = interval_side(c_low, c_high, 0.0), interval_side(rise_low, rise_high, 0.0)
    if curve == "below" and interior:
        shape = "inverted U"
    elif line == "above":
        shape = "rises"
    elif line == "below":
        shape = "falls"
    elif curve == "above" and interior:
        shape = "U-shaped"
    else:
        shape = "undefined" if "undefined" in (curve, line) else "not separable"
    top = int(np.argmax(y))
    return dict(role=role, shape=shape, rise=float(rise), rise_low=rise_low, rise_high=rise_high,
                curvature=float(curvature), curvature_low=c_low, curvature_high=c_high, vertex=vertex,
                top_block=int(part["layer"].iloc[top]), top_value=float(y[top]), n_blocks=int(len(part)))


def shape_sentence(shape: dict, first_block: int = 0) -> str:
    """The chapter's sentence on the profile's shape, from :func:`profile_shape`: where its
    largest value sits, and what the fitted line and parabola say (with intervals)."""
    rise = fmt_interval(shape["rise"], shape["rise_low"], shape["rise_high"], signed=True)
    curve = fmt_interval(shape["curvature"], shape["curvature_low"], shape["curvature_high"], signed=True)
    top = f"block {shape['top_block']} ({fmt_num(shape['top_value'])})"
    where = (f"The first block has the largest value of all ({fmt_num(shape['top_value'])}); "
             if shape["top_block"] == first_block else f"The largest value is at {top}; ")
    lead = {"inverted U": f"the profile is an inverted U: the fitted parabola's curvature is {curve} and it "
                          f"turns at relative depth {fmt_num(shape['vertex'], 2)}",
            "rises": f"the profile rises: the fitted line changes by {rise} from the first block to the last",
            "falls": f"the profile falls: the fitted line changes by {rise} from the first block to the last",
            "U-shaped": f"the profile is U-shaped (curvature {curve}), the opposite of an inverted U",
            "not separable": f"neither a rise ({rise}) nor a curvature ({curve}) is separable from zero",
            "undefined": "the shape is undefined (fewer than three blocks)"}[shape["shape"]]
    if shape["top_block"] == first_block and shape["shape"] == "rises":
        lead += ", so the rise is carried by the later blocks and the first block stands above the line"
    return where + lead + "."


def group_profile(table: pd.DataFrame, estimator: str = "alpha_shape") -> pd.DataFrame:
    """Per (layer, group): the mean ``value`` over the group's roles (Q/K, V/O, MLP)."""
    df = table.assign(group=table["role"].map(role_group))
    return df.groupby(["layer", "group"], as_index=False)[estimator].mean().rename(columns={estimator: "value"})


def _std_ratio(qk: np.ndarray, vo: np.ndarray, axis: int = -1) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.std(qk, axis=axis, ddof=1) / np.std(vo, axis=axis, ddof=1)


def qk_vo_asymmetry(profile: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Does Q/K vary with depth more than V/O? ``profile``: ``layer, group, value`` (one
    value per layer and group, e.g. :func:`group_profile` or ``zones.analysis.lifecycle.final_profile``).

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
    ratio, low, high = unit_bootstrap([qk, vo], _std_ratio, n_resamples=n_resamples, seed=seed)
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


GOOD_FIT_R2 = 0.9   # a power law "describes" the top half of a spectrum when its median R² reaches this


def fit_sentence(r2_median: float, r2_min: float) -> str:
    """Whether the shape fit's power law describes the spectra, from the R² over blocks."""
    if not r2_median == r2_median:
        return "The shape fit's R² is undefined here."
    word = "a fair description" if r2_median >= GOOD_FIT_R2 else "only a rough description"
    return (f"The power law of the shape fit is {word} here: its R² has median {fmt_num(r2_median)} and minimum "
            f"{fmt_num(r2_min)} over the blocks (a fair description needs a median of at least {GOOD_FIT_R2}).")


def asymmetry_sentence(asym: dict) -> str:
    """The chapter's sentence on the Q/K–V/O asymmetry, from :func:`qk_vo_asymmetry`."""
    numbers = f"std(Q/K) / std(V/O) = {asym['ratio']:.2f} [{asym['ratio_low']:.2f}, {asym['ratio_high']:.2f}]"
    return {"Q/K larger": f"Q/K vary more with depth than V/O ({numbers}), as the paper reports.",
            "V/O larger": f"V/O vary more with depth than Q/K ({numbers}): the opposite of the paper's asymmetry.",
            "not separable": f"The two groups' variation over depth is not separable ({numbers}; the interval "
                             f"includes 1).",
            "undefined": "The asymmetry is undefined here (too few blocks, or a flat group)."}[asym["asymmetry"]]


def run(models=("smollm2-135m",), role: str = "q", alpha_estimator: str = "alpha_shape",
        out_dir: str = "results/alpha_profile", *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> ChapterResult:
    """The chapter: α table of ``model`` → ``alpha.csv``, ``spread.csv`` (``zones.spectra.
    depth_spread``), ``trend.csv`` (:func:`depth_trend`), ``group_profile.csv``,
    ``asymmetry_claim.csv`` (:func:`qk_vo_asymmetry`), ``shape_claim.csv`` (:func:`profile_shape`) and ``summary.json``; numbers for the page.
    ``models``: a list (or one model); this chapter shows the first in detail."""
    model, estimator = check_models(models)[0], alpha_estimator
    loaded = load_model(model)
    table = alpha_table(loaded.model)
    if role not in set(table["role"]):
        raise ValueError(f"role {role!r} is not in this model; roles: {', '.join(dict.fromkeys(table['role']))}")
    spread = depth_spread(table, estimator)
    trend = depth_trend(table, estimator, n_resamples=n_resamples, seed=seed)
    groups = group_profile(table, estimator)
    asym = qk_vo_asymmetry(groups, n_resamples=n_resamples, seed=seed)
    chosen = trend.set_index("role").loc[role]
    shape = profile_shape(table, role, estimator, n_resamples=n_resamples, seed=seed)
    by_group = spread.groupby("group")["range"].mean()
    numbers = dict(model_name=model, role_name=role, estimator_name=estimator,
                   **profile_numbers(table, role, estimator),
                   rise=float(chosen["rise"]), rise_low=float(chosen["rise_low"]),
                   rise_high=float(chosen["rise_high"]), trend=str(chosen["trend"]),
                   first_fit=float(chosen["first_fit"]), last_fit=float(chosen["last_fit"]),
                   qk_range=float(by_group.get("Q/K", NAN)), vo_range=float(by_group.get("V/O", NAN)),
                   mlp_range=float(by_group.get("MLP", NAN)),
                   std_ratio=asym["ratio"], std_ratio_low=asym["ratio_low"], std_ratio_high=asym["ratio_high"],
                   asymmetry=asym["asymmetry"], asymmetry_text=asymmetry_sentence(asym),
                   shape=shape["shape"], shape_text=shape_sentence(shape, int(table["layer"].min())))
    numbers["fit_text"] = fit_sentence(numbers["r2_median"], numbers["r2_min"])
    summary = dict(model=model, fingerprint=loaded.fingerprint, role=role, estimator=estimator, n_resamples=n_resamples,
                   seed=seed, **{k: v for k, v in numbers.items() if k not in ("model_name", "role_name",
                                                                                "estimator_name")},
                   first=numbers["alpha_first"], last=numbers["alpha_last"])
    tables = dict(alpha=table, spread=spread, trend=trend, group_profile=groups,
                  asymmetry_claim=pd.DataFrame([asym]), shape_claim=pd.DataFrame([shape], columns=SHAPE_COLUMNS))
    out = save(out_dir, tables, summary)
    return ChapterResult(tables, numbers, summary, out)
