"""The spectral-lifecycle chapter: the compression wave, the α gradient, the Q/K–V/O
asymmetry and Δα against depth, read from the depth series' snapshots, with the verdicts
and the intervals the claims need.

Intervals resample layers or snapshot steps (``common.unit_bootstrap``):

* the wave: the layers of the early half and of the late half, each resampled on its own;
* the asymmetry: the layers of the final profile (the same layers for Q/K and V/O);
* the Δα exponent: the snapshots of the last quarter of training of each depth, resampled
  per depth; Δα of a depth is its mean over those snapshots.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from zones.analysis import lifecycle
from zones.measure.stats import N_RESAMPLES
from zones.report.alpha_profile import _slope, qk_vo_asymmetry
from zones.report.common import NAN, ChapterResult, interval_side, save, unit_bootstrap
from zones.report.format import fmt_interval
from zones.report.verdicts import BLOCKS, SEEDS, Verdict, from_word, verdict_phrase
from zones.series import series_snapshots, series_summary, train_series
from zones.series.checkpoints import lifecycle_snapshots

WAVE_TOLERANCE = 0.02        # a half "leads" when the gradient exceeds this (zones.analysis.lifecycle.wave_summary)
TRANSIENT_SHARE = 0.5        # the rank gradient is a transient if it ends below half its peak magnitude
LASTING_SHARE = 0.7          # the α gradient formed early if it is above 70% of its final value halfway
LATE_FRACTION = 0.75         # the late snapshots: steps ≥ 0.75 · the last step


def zero_crossings(gradient: pd.DataFrame, depth: int, group: str = "Q/K") -> list[int]:
    """The steps (after initialisation) at which the wave gradient of (depth, group) changes
    sign: the first step of each new sign (steps where it is exactly 0 are skipped)."""
    part = gradient[(gradient["depth"] == depth) & (gradient["group"] == group)].sort_values("step")
    part = part[part["step"] > part["step"].min()]
    signs = np.sign(part["gradient"].to_numpy(float))
    steps = part["step"].to_numpy()
    kept = signs != 0
    signs, steps = signs[kept], steps[kept]
    return [int(steps[i]) for i in range(1, len(signs)) if signs[i] != signs[i - 1]]


def wave_sentence(waves: pd.DataFrame, gradient: pd.DataFrame, depth: int, group: str = "Q/K") -> str:
    """What the ``zones.analysis.lifecycle.wave_summary`` row of (depth, group) and the gradient's
    zero crossings (:func:`zero_crossings`) say, in words: a crossing is reported even where
    the other half never leads by more than the tolerance."""
    row = waves[(waves["depth"] == depth) & (waves["group"] == group)].iloc[0]
    crossings = zero_crossings(gradient, depth, group)
    crossed = (f"the gradient crossed zero at step{'s' if len(crossings) > 1 else ''} "
               f"{', '.join(map(str, crossings))}" if crossings else "the gradient never crossed zero")
    if row["leader"] == "none":
        return f"neither half of the layers led the {group} compression by more than {WAVE_TOLERANCE}, and {crossed}"
    lead_step = int(row["peak_step"] if row["leader"] == "early" else row["trough_step"])
    other = "late" if row["leader"] == "early" else "early"
    if row["reversed"]:
        after = f"{crossed}, and the {other} layers then led by more than {WAVE_TOLERANCE}: the gradient reversed"
    elif crossings:
        after = (f"{crossed}, but the {other} layers never led by more than {WAVE_TOLERANCE}: a reversal within "
                 f"the tolerance")
    else:
        after = f"{crossed}: no reversal"
    return (f"the {row['leader']} layers' {group} matrices compressed first, their lead was largest at step "
            f"{lead_step}; {after}")


def peak_shape(peak_position: float) -> str:
    """An interior maximum of the α profile (0 < relative depth < 1) is an inverted U."""
    return ("an interior maximum, an inverted U" if 0 < peak_position < 1
            else "its maximum at an end, not an inverted U")


def asymmetry_sentence(claims_table: pd.DataFrame) -> str:
    """What the per-depth ``asymmetry_claim`` rows (``alpha_profile.qk_vo_asymmetry`` of each
    final profile: ``depth, ratio, ratio_low, ratio_high, asymmetry``) say together: only an
    interval that excludes 1 counts for either group."""
    def depths(word):
        part = claims_table[claims_table["asymmetry"] == word]
        return [f"{int(r.depth)} ({fmt_interval(r.ratio, r.ratio_low, r.ratio_high)})" for r in part.itertuples()]

    qk, vo, tied = depths("Q/K larger"), depths("V/O larger"), depths("not separable") + depths("undefined")
    n = len(claims_table)
    parts = []
    if qk:
        parts.append(f"Q/K vary more than V/O at depth {', '.join(qk)}")
    if vo:
        parts.append(f"V/O vary more than Q/K at depth {', '.join(vo)}")
    if tied:
        parts.append(f"the two are not separable at depth {', '.join(tied)} (the interval includes 1)")
    verdict = ("as the paper reports" if len(qk) == n else
               "the opposite of the paper's asymmetry" if len(vo) == n else
               "so this series neither confirms nor contradicts the asymmetry at every depth")
    return ("By the ratio std(Q/K) / std(V/O) of the final α profile, with layers resampled: " + "; ".join(parts)
            + f": {verdict}.")


def dissociation(gradient: pd.DataFrame, snapshots: pd.DataFrame, depth: int, estimator: str,
                 group: str = lifecycle.ALL) -> dict:
    """Rank gradient a transient, α gradient lasting? For the run of ``depth``:
    ``wave_share`` (|final Q/K wave gradient| / its largest magnitude), ``alpha_share`` (Δα of
    ``group`` halfway through training / at the end), ``halfway_step`` and the sentence
    ``dissociation_text``. Rule: the paper's dissociation shows if wave_share <
    ``TRANSIENT_SHARE`` and alpha_share > ``LASTING_SHARE``."""
    wave = gradient[(gradient["depth"] == depth) & (gradient["group"] == "Q/K")].sort_values("step")
    wave_share = float(abs(wave["gradient"].iloc[-1]) / max(wave["gradient"].abs().max(), 1e-12))
    spread = lifecycle.spread_over_time(snapshots, estimator, (group,))
    spread = spread[spread["depth"] == depth].sort_values("step")
    steps = int(spread["step"].max())
    halfway = spread.iloc[int((spread["step"] - steps / 2).abs().argmin())]
    final = float(spread["spread"].iloc[-1])
    alpha_share = float(halfway["spread"] / final) if final > 0 else NAN
    shows = wave_share < TRANSIENT_SHARE and alpha_share > LASTING_SHARE
    text = ("the rank gradient was a transient and the α gradient formed early and stayed: the dissociation the "
            "paper reports" if shows else
            "rank and α did not separate into a transient and a lasting gradient as clearly as in the paper")
    return dict(wave_share=100 * wave_share, alpha_share=100 * alpha_share, halfway_step=int(halfway["step"]),
                dissociation_text=text)


def _wave_stats(grid: np.ndarray):
    """Statistics of a (layer, step) compression grid given resampled early/late layer indices:
    the largest gradient, the smallest, and the smallest from the largest one's step on."""
    def gradient(early, late):
        return grid[early.astype(int)].mean(axis=-2) - grid[late.astype(int)].mean(axis=-2)  # (..., steps)

    def peak(early, late, axis=-1):
        return gradient(early, late).max(axis=-1)

    def trough(early, late, axis=-1):
        return gradient(early, late).min(axis=-1)

    def after_peak(early, late, axis=-1):
        g = gradient(early, late)
        t = np.arange(g.shape[-1])
        at = g.argmax(axis=-1)[..., None]
        return np.where(t >= at, g, np.inf).min(axis=-1)

    return peak, trough, after_peak


def wave_reversal(compression: pd.DataFrame, depth: int, group: str = "Q/K", *, n_resamples: int = N_RESAMPLES,
                  seed: int = 0) -> dict:
    """Does the compression wave run from early to late layers, then reverse?

    ``compression``: ``zones.analysis.lifecycle.group_grid(snapshots, "compression")``. The wave
    gradient g(t) is the mean compression of the first half of the layers minus that of the
    second half, at every snapshot *after initialisation* (at step 0 nothing has compressed and
    g = 0, which would pin the peak's lower bound at 0). ``peak`` = max of g (the early layers'
    largest lead), ``trough`` = min of g (the late layers' largest lead), ``after`` = the
    minimum of g from the peak's step on. Intervals: the early and the late layers are
    resampled, each half on its own.

    ``leader``: ``early`` if the peak's interval lies above 0 and, where the trough's also lies
    below 0, the peak came first; ``late`` likewise for the trough; ``neither`` otherwise.
    Rule: ``holds`` if the early half led and the later minimum's interval lies below 0 (the
    late layers overtook); ``does not hold`` if the late half led (the wave ran the other
    way) or the early half led and the later minimum's interval lies above 0 (no reversal);
    ``inconclusive`` otherwise (``reason``: ``blocks``, the halves have too few layers to
    separate; the units resampled are layers).
    """
    part = compression[(compression["depth"] == depth) & (compression["group"] == group)]
    grid = part.pivot_table(index="layer", columns="step", values="value").sort_index()
    grid = grid.loc[:, [c for c in grid.columns if c > min(grid.columns)]] if grid.shape[1] > 1 else grid
    layers = grid.index.to_numpy()
    early = np.flatnonzero(layers < depth / 2).astype(float)
    late = np.flatnonzero(layers >= depth / 2).astype(float)
    values = grid.to_numpy(float)
    peak, trough, after = _wave_stats(values)
    p, p_low, p_high = unit_bootstrap([early, late], peak, paired=False, n_resamples=n_resamples, seed=seed)
    t, t_low, t_high = unit_bootstrap([early, late], trough, paired=False, n_resamples=n_resamples, seed=seed)
    a, a_low, a_high = unit_bootstrap([early, late], after, paired=False, n_resamples=n_resamples, seed=seed)
    g = values[early.astype(int)].mean(axis=0) - values[late.astype(int)].mean(axis=0)
    steps = grid.columns.to_numpy()
    peak_step, trough_step = int(steps[int(np.argmax(g))]), int(steps[int(np.argmin(g))])
    early_led, late_led = interval_side(p_low, p_high, 0.0) == "above", interval_side(t_low, t_high, 0.0) == "below"
    if early_led and late_led:
        leader = "early" if peak_step <= trough_step else "late"
    else:
        leader = "early" if early_led else "late" if late_led else "neither"
    after_side = interval_side(a_low, a_high, 0.0)
    if leader == "early" and after_side == "below":
        verdict = "holds"
    elif leader == "late" or (leader == "early" and after_side == "above"):
        verdict = "does not hold"
    else:
        verdict = "inconclusive"
    return dict(depth=int(depth), group=group, leader=leader, peak=p, peak_low=p_low, peak_high=p_high,
                peak_step=peak_step, trough=t, trough_low=t_low, trough_high=t_high, trough_step=trough_step,
                after=a, after_low=a_low, after_high=a_high, n_early=int(early.size), n_late=int(late.size),
                verdict=verdict, reason=BLOCKS if verdict == "inconclusive" else "")


def late_delta_alpha(snapshots: pd.DataFrame, estimator: str = "alpha_shape", group: str = lifecycle.ALL,
                     fraction: float = LATE_FRACTION) -> pd.DataFrame:
    """Δα (max − min over layers of the group's mean α) at each snapshot of the late part of
    training (steps ≥ ``fraction`` · the run's last step): ``depth, step, delta_alpha``."""
    spread = lifecycle.spread_over_time(snapshots, estimator, (group,))
    last = spread.groupby("depth")["step"].transform("max")
    late = spread[spread["step"] >= fraction * last]
    return late.rename(columns={"spread": "delta_alpha"})[["depth", "step", "delta_alpha"]].reset_index(drop=True)


def delta_alpha_exponent(snapshots: pd.DataFrame, estimator: str = "alpha_shape", group: str = lifecycle.ALL, *,
                         n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """The exponent b of Δα ∝ L^b, with a 95% interval.

    Δα of each depth L is its mean over the late snapshots (:func:`late_delta_alpha`); b is
    the least-squares slope of log Δα on log L. The interval resamples each depth's late
    snapshots on its own. Rule (against the paper's b = 0.26): ``holds`` if the interval
    contains 0.26 and lies above 0; ``does not hold`` if it excludes 0.26; ``inconclusive``
    otherwise (it contains 0.26 and 0, or is undefined: fewer than two depths or two late
    snapshots per depth). Returns ``exponent, low, high, depths, n_late, verdict``.
    """
    late = late_delta_alpha(snapshots, estimator, group)
    depths = sorted(int(d) for d in late["depth"].unique())
    samples = [late.loc[late["depth"] == d, "delta_alpha"].to_numpy(float) for d in depths]
    log_depth = np.log(np.asarray(depths, dtype=float))

    def exponent(*per_depth, axis=-1):
        means = np.stack([s.mean(axis=axis) for s in per_depth], axis=-1)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.where(means > 0, np.log(means), np.nan)
        return _slope(np.broadcast_to(log_depth, logs.shape), logs)

    if len(depths) < 2:
        b, low, high = NAN, NAN, NAN
    else:
        b, low, high = unit_bootstrap(samples, exponent, paired=False, n_resamples=n_resamples, seed=seed)
    paper = lifecycle.PAPER_DELTA_ALPHA_EXPONENT
    side = interval_side(low, high, paper)
    if side == "undefined":
        verdict = "inconclusive"
    elif side != "straddles":
        verdict = "does not hold"
    else:
        verdict = "holds" if low > 0 else "inconclusive"
    return dict(exponent=float(b), low=low, high=high, depths=depths, n_late=[int(s.size) for s in samples],
                group=group, verdict=verdict, interval_covers="snapshot jitter only (one training run per depth)")


def _series_snapshots(profile, depths, train_overrides, checkpoints) -> tuple[pd.DataFrame, dict]:
    """The snapshot table and the run facts the prose cites: from the cached depth series, or,
    with ``checkpoints``, from any checkpoint series (``zones.series.checkpoints.lifecycle_snapshots``)."""
    if checkpoints:
        snapshots = lifecycle_snapshots(checkpoints, progress=False)
        if "depth" not in snapshots.columns:
            snapshots.insert(0, "depth", int(snapshots["layer"].max()) + 1)
        steps = sorted(int(s) for s in snapshots["step"].unique())
        gaps = np.diff(steps)
        return snapshots, dict(depths=sorted(int(d) for d in snapshots["depth"].unique()), steps=steps[-1],
                               snapshot_every=int(np.median(gaps)) if len(gaps) else 0,
                               snapshot_fraction=NAN, final_heldout_loss={})
    # one training run per depth (seed 0: the depth series' first seed, read from its cache);
    # mixing seeds within a depth would blur the snapshots' trajectory
    overrides = dict(train_overrides or {})
    seeds = None if "seed" in overrides else 1
    runs = train_series(depths, profile, seeds=seeds, progress=False, **overrides)
    series = series_summary(runs)
    return series_snapshots(runs), dict(
        depths=[int(d) for d in series["depth"]], steps=int(runs[0].config.steps),
        snapshot_every=int(runs[0].config.snapshot_every), snapshot_fraction=float(series["snapshot_fraction"].max()),
        final_heldout_loss={int(d): float(v) for d, v in zip(series["depth"], series["final_heldout_loss"])})


def run(profile: str = "cpu", depths=None, train_overrides: dict | None = None, alpha_estimator: str = "alpha_shape",
        delta_group: str = "all", out_dir: str = "results/spectral_lifecycle", *, checkpoints=None,
        n_resamples: int = N_RESAMPLES, seed: int = 0) -> ChapterResult:
    """The chapter, from the cached depth series: ``snapshots.csv``, ``compression.csv``,
    ``wave_gradient.csv``, ``wave_summary.csv``, ``alpha_grid.csv``, ``final_profile.csv``,
    ``delta_alpha.csv``, ``asymmetry.csv``, ``delta_alpha_fits.csv``, and the claims' tables
    ``wave_claim.csv`` (:func:`wave_reversal` per depth, Q/K), ``asymmetry_claim.csv``
    (``alpha_profile.qk_vo_asymmetry`` of each depth's final profile) and
    ``delta_alpha_claim.csv`` (:func:`delta_alpha_exponent`); ``summary.json``."""
    estimator = alpha_estimator
    snapshots, facts = _series_snapshots(profile, depths, train_overrides, checkpoints)
    depth_list = facts["depths"]
    deepest = max(depth_list)
    steps = facts["steps"]

    compression = lifecycle.group_grid(snapshots, "compression")
    gradient = lifecycle.wave_gradient(snapshots)
    waves = lifecycle.wave_summary(gradient, WAVE_TOLERANCE)
    alpha_grid = lifecycle.group_grid(snapshots, estimator)
    final = lifecycle.final_profile(snapshots, estimator)
    deltas = lifecycle.delta_alpha(snapshots, estimator)
    spreads = lifecycle.asymmetry(snapshots, estimator)
    fits = lifecycle.delta_alpha_fits(deltas)

    wave_claim = pd.DataFrame([wave_reversal(compression, d, "Q/K", n_resamples=n_resamples, seed=seed) for d in depth_list])
    asym_claim = pd.DataFrame([dict(depth=d, **qk_vo_asymmetry(final[(final["depth"] == d)], n_resamples=n_resamples, seed=seed))
                               for d in depth_list])
    exponent = delta_alpha_exponent(snapshots, estimator, delta_group, n_resamples=n_resamples, seed=seed)
    exponent_claim = pd.DataFrame([dict(exponent, depths=",".join(map(str, exponent["depths"])),
                                        n_late=",".join(map(str, exponent["n_late"])),
                                        paper_exponent=lifecycle.PAPER_DELTA_ALPHA_EXPONENT)])

    peak = deltas[(deltas["depth"] == deepest) & (deltas["group"] == delta_group)].iloc[0]
    peaks = {group: ", ".join(f"{int(r.depth)}: {r.peak_position:.2f}" for r in deltas[deltas["group"] == group].itertuples())
             for group in dict.fromkeys([delta_group, "Q/K"])}
    by_group = spreads.groupby("group")[["compression_spread_max", "alpha_spread_final"]].mean()
    fit = fits[fits["group"] == delta_group].iloc[0]
    chosen = deltas[deltas["group"] == delta_group]
    deep_wave = wave_claim.set_index("depth").loc[deepest]
    numbers = dict(depths=", ".join(map(str, depth_list)), steps=steps,
                   snapshot_every=facts["snapshot_every"], n_snapshots=int(snapshots["step"].nunique()),
                   snapshot_percent=100 * facts["snapshot_fraction"], deepest=deepest,
                   wave_text=wave_sentence(waves, gradient, deepest), n_reversed=int(waves["reversed"].sum()),
                   n_waves=int(len(waves)),
                   wave_peak=float(deep_wave["peak"]), wave_peak_low=float(deep_wave["peak_low"]),
                   wave_peak_high=float(deep_wave["peak_high"]), wave_after=float(deep_wave["after"]),
                   wave_after_low=float(deep_wave["after_low"]), wave_after_high=float(deep_wave["after_high"]),
                   wave_verdict=verdict_phrase(from_word(str(deep_wave["verdict"]), BLOCKS)),
                   wave_leader=str(deep_wave["leader"]),
                   peak_position=float(peak["peak_position"]), delta_group_name=delta_group,
                   peak_shape=peak_shape(float(peak["peak_position"])),
                   peaks_text="; ".join(f"{group} matrices at depth {text}" for group, text in peaks.items()),
                   qk_comp_spread=float(by_group.loc["Q/K", "compression_spread_max"]),
                   vo_comp_spread=float(by_group.loc["V/O", "compression_spread_max"]),
                   qk_alpha_spread=float(by_group.loc["Q/K", "alpha_spread_final"]),
                   vo_alpha_spread=float(by_group.loc["V/O", "alpha_spread_final"]),
                   asymmetry_text=asymmetry_sentence(asym_claim),
                   exponent=float(fit["exponent"]), r2=float(fit["r2"]), paper_exponent=float(fit["paper_exponent"]),
                   late_exponent=exponent["exponent"], late_exponent_low=exponent["low"],
                   late_exponent_high=exponent["high"], exponent_verdict=verdict_phrase(from_word(exponent["verdict"], SEEDS)),
                   exponent_scorecard=verdict_phrase(Verdict("inconclusive", SEEDS)),
                   **dissociation(gradient, snapshots, deepest, estimator, delta_group))
    summary = dict(profile=profile, depths=depth_list, steps=steps, estimator=estimator, delta_group=delta_group,
                   exponent=float(fit["exponent"]), r2=float(fit["r2"]), paper_exponent=float(fit["paper_exponent"]),
                   late_exponent=exponent,
                   delta_alpha={int(d): float(v) for d, v in zip(chosen["depth"], chosen["delta_alpha"])},
                   final_heldout_loss=facts["final_heldout_loss"], snapshot_fraction_max=facts["snapshot_fraction"],
                   source="checkpoints" if checkpoints else f"zones train --profile {profile}")
    tables = dict(snapshots=snapshots, compression=compression, wave_gradient=gradient, wave_summary=waves,
                  alpha_grid=alpha_grid, final_profile=final, delta_alpha=deltas, asymmetry=spreads,
                  delta_alpha_fits=fits, wave_claim=wave_claim, asymmetry_claim=asym_claim,
                  delta_alpha_claim=exponent_claim)
    out = save(out_dir, tables, summary)
    return ChapterResult(tables, numbers, summary, out,
                         extra=dict(chosen=chosen, prefactor=float(fit["prefactor"])))
