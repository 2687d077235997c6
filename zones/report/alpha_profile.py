"""The α-profile chapter: the profile of one role, the spread of every role, and two
claims with intervals (the profile rises with depth; Q/K vary with depth more than V/O).

The statistics (trend, shape, Q/K–V/O asymmetry, their block-resampled intervals) are
``zones.analysis.profile``'s; this module states them in words and writes the chapter.
"""
from __future__ import annotations

import pandas as pd

from zones.analysis.profile import SHAPE_COLUMNS, depth_trend, group_profile, profile_shape, qk_vo_asymmetry
from zones.core.checks import check_models
from zones.core.models import load_model
from zones.measure.bootstrap import N_RESAMPLES
from zones.report.common import NAN, ChapterResult, save
from zones.report.format import fmt_interval, fmt_num
from zones.spectra import alpha_table, depth_spread, estimator_correlation


def shape_sentence(shape: dict, first_block: int = 0) -> str:
    """The chapter's sentence on the profile's shape, from ``zones.analysis.profile.profile_shape``: where its
    largest value sits, and what the fitted line and parabola say (with intervals)."""
    rise = fmt_interval(shape["rise"], shape["rise_low"], shape["rise_high"], signed=True)
    ranked = (f"its rank trend (Spearman ρ with the block index) is "
              f"{fmt_interval(shape['rank_trend'], shape['rank_trend_low'], shape['rank_trend_high'], signed=True)}")
    curve = fmt_interval(shape["curvature"], shape["curvature_low"], shape["curvature_high"], signed=True)
    top = f"block {shape['top_block']} ({fmt_num(shape['top_value'])})"
    where = (f"The first block has the largest value of all ({fmt_num(shape['top_value'])}); "
             if shape["top_block"] == first_block else f"The largest value is at {top}; ")
    lead = {"inverted U": f"the profile is an inverted U: the fitted parabola's curvature is {curve} and it "
                          f"turns at relative depth {fmt_num(shape['vertex'], 2)}",
            "rises": f"the profile rises: {ranked}, and the fitted line changes by {rise} from the first block to "
                     f"the last",
            "falls": f"the profile falls: {ranked}, and the fitted line changes by {rise} from the first block to "
                     f"the last",
            "U-shaped": f"the profile is U-shaped (curvature {curve}), the opposite of an inverted U",
            "not separable": f"neither a rank trend ({ranked.split(' is ')[1]}) nor a curvature ({curve}) is "
                             f"separable from zero (the fitted line changes by {rise})",
            "undefined": "the shape is undefined (fewer than three blocks)"}[shape["shape"]]
    if shape["top_block"] == first_block and shape["shape"] == "rises":
        lead += ", so the rise is carried by the later blocks and the first block stands above the line"
    return where + lead + "."


def profile_numbers(table: pd.DataFrame, role: str, alpha_estimator: str) -> dict:
    """The numbers the chapter cites about one role's profile (plain Python values)."""
    profile = table[table["role"] == role].sort_values("layer")
    value = profile[alpha_estimator].astype(float)
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
    """The chapter's sentence on the Q/K–V/O asymmetry, from ``zones.analysis.profile.qk_vo_asymmetry``."""
    numbers = f"std(Q/K) / std(V/O) = {asym['ratio']:.2f} [{asym['ratio_low']:.2f}, {asym['ratio_high']:.2f}]"
    return {"Q/K larger": f"Q/K vary more with depth than V/O ({numbers}), as the paper reports.",
            "V/O larger": f"V/O vary more with depth than Q/K ({numbers}): the opposite of the paper's asymmetry.",
            "not separable": f"The two groups' variation over depth is not separable ({numbers}; the interval "
                             f"includes 1).",
            "undefined": "The asymmetry is undefined here (too few blocks, or a flat group)."}[asym["asymmetry"]]


def run(models=("smollm2-135m",), role: str = "q", alpha_estimator: str = "alpha_shape",
        out_dir: str = "results/alpha_profile", *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> ChapterResult:
    """The chapter: α table of ``model`` → ``alpha.csv``, ``spread.csv`` (``zones.spectra.
    depth_spread``), ``trend.csv`` (``zones.analysis.profile.depth_trend``), ``group_profile.csv``,
    ``asymmetry_claim.csv`` (``qk_vo_asymmetry``), ``shape_claim.csv`` (``profile_shape``) and ``summary.json``;
    numbers for the page. ``models``: a list (or one model); this chapter shows the first in detail."""
    model = check_models(models)[0]
    loaded = load_model(model)
    table = alpha_table(loaded.model)
    if role not in set(table["role"]):
        raise ValueError(f"role {role!r} is not in this model; roles: {', '.join(dict.fromkeys(table['role']))}")
    spread = depth_spread(table, alpha_estimator)
    trend = depth_trend(table, alpha_estimator, n_resamples=n_resamples, seed=seed)
    groups = group_profile(table, alpha_estimator)
    asym = qk_vo_asymmetry(groups, n_resamples=n_resamples, seed=seed)
    chosen = trend.set_index("role").loc[role]
    shape = profile_shape(table, role, alpha_estimator, n_resamples=n_resamples, seed=seed)
    by_group = spread.groupby("group")["range"].mean()
    numbers = dict(model_name=model, role_name=role, estimator_name=alpha_estimator,
                   **profile_numbers(table, role, alpha_estimator),
                   rise=float(chosen["rise"]), rise_low=float(chosen["rise_low"]),
                   rise_high=float(chosen["rise_high"]), trend=str(chosen["trend"]),
                   first_fit=float(chosen["first_fit"]), last_fit=float(chosen["last_fit"]),
                   qk_range=float(by_group.get("Q/K", NAN)), vo_range=float(by_group.get("V/O", NAN)),
                   mlp_range=float(by_group.get("MLP", NAN)),
                   std_ratio=asym["ratio"], std_ratio_low=asym["ratio_low"], std_ratio_high=asym["ratio_high"],
                   asymmetry=asym["asymmetry"], asymmetry_text=asymmetry_sentence(asym),
                   shape=shape["shape"], shape_text=shape_sentence(shape, int(table["layer"].min())))
    numbers["fit_text"] = fit_sentence(numbers["r2_median"], numbers["r2_min"])
    summary = dict(model=model, fingerprint=loaded.fingerprint, role=role, alpha_estimator=alpha_estimator, n_resamples=n_resamples,
                   seed=seed, **{k: v for k, v in numbers.items() if k not in ("model_name", "role_name",
                                                                                "estimator_name")},
                   first=numbers["alpha_first"], last=numbers["alpha_last"])
    tables = dict(alpha=table, spread=spread, trend=trend, group_profile=groups,
                  asymmetry_claim=pd.DataFrame([asym]), shape_claim=pd.DataFrame([shape], columns=SHAPE_COLUMNS))
    out = save(out_dir, tables, summary)
    return ChapterResult(tables, numbers, summary, out)
