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

from .. import lifecycle
from .alpha_profile import qk_vo_asymmetry
from .claims import verdict_phrase
from .common import NAN, ChapterResult, interval_side, save, unit_bootstrap

WAVE_TOLERANCE = 0.02        # a half "leads" when the gradient exceeds this (zones.lifecycle.wave_summary)
TRANSIENT_SHARE = 0.5        # the rank gradient is a transient if it ends below half its peak magnitude
LASTING_SHARE = 0.7          # the α gradient formed early if it is above 70% of its final value halfway
LATE_FRACTION = 0.75         # the late snapshots: steps ≥ 0.75 · the last step


def wave_sentence(waves: pd.DataFrame, depth: int, group: str = "Q/K") -> str:
    """What the ``zones.lifecycle.wave_summary`` row of (depth, group) says, in words."""
    row = waves[(waves["depth"] == depth) & (waves["group"] == group)].iloc[0]
    if row["leader"] == "none":
        return f"neither half of the layers led the {group} compression by more than {WAVE_TOLERANCE}"
    lead_step = int(row["peak_step"] if row["leader"] == "early" else row["trough_step"])
    return (f"the {row['leader']} layers' {group} matrices compressed first, their lead was largest at step "
            f"{lead_step}, and the gradient {'did' if row['reversed'] else 'did not'} reverse afterwards")


def peak_shape(peak_position: float) -> str:
    """An interior maximum of the α profile (0 < relative depth < 1) is an inverted U."""
    return ("an interior maximum, an inverted U" if 0 < peak_position < 1
            else "its maximum at an end, not an inverted U")


def asymmetry_sentence(by_group: pd.DataFrame) -> str:
    """Which of the two Q/K spreads (compression at its height, final α) exceed V/O's
    (means over depths of ``zones.lifecycle.asymmetry``)."""
    larger = [name for name, column in (("compression", "compression_spread_max"), ("α", "alpha_spread_final"))
              if by_group.loc["Q/K", column] > by_group.loc["V/O", column]]
    if len(larger) == 2:
        return "Here both Q/K spreads are the larger, as in the paper."
    if not larger:
        return "Here neither is: at this scale V/O varies over depth at least as much as Q/K."
    return f"Here only the {larger[0]} spread of Q/K is the larger."


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
    """Statistics of a (layer, step) compression grid given resampled early/late layer indices."""
    def gradient(early, late):
        return grid[early.astype(int)].mean(axis=-2) - grid[late.astype(int)].mean(axis=-2)  # (..., steps)

    def peak(early, late, axis=-1):
        return gradient(early, late).max(axis=-1)

    def after_peak(early, late, axis=-1):
        g = gradient(early, late)
        t = np.arange(g.shape[-1])
        at = g.argmax(axis=-1)[..., None]
        return np.where(t >= at, g, np.inf).min(axis=-1)

    return peak, after_peak


def wave_reversal(compression: pd.DataFrame, depth: int, group: str = "Q/K", *, n_boot: int = 2000,
                  seed: int = 0) -> dict:
    """Does the compression wave run from early to late layers, then reverse?

    ``compression``: ``zones.lifecycle.group_grid(snapshots, "compression")``. The wave
    gradient g(t) is the mean compression of the first half of the layers minus that of the
    second half. ``peak`` = max over steps of g (early layers' largest lead); ``after`` = the
    minimum of g from that step on. Intervals: the early and the late layers are resampled,
    each half on its own. Rule: ``holds`` if the peak's interval lies above 0 and the later
    minimum's below 0 (the early layers led, then the late ones did); ``does not hold`` if the
    peak's interval does not reach above 0 (g starts at 0, so the early layers never led) or
    the later minimum's lies above 0 (no reversal); ``inconclusive`` otherwise.
    """
    part = compression[(compression["depth"] == depth) & (compression["group"] == group)]
    grid = part.pivot_table(index="layer", columns="step", values="value").sort_index()
    layers = grid.index.to_numpy()
    early = np.flatnonzero(layers < depth / 2).astype(float)
    late = np.flatnonzero(layers >= depth / 2).astype(float)
    peak, after = _wave_stats(grid.to_numpy(float))
    p, p_low, p_high = unit_bootstrap([early, late], peak, paired=False, n_boot=n_boot, seed=seed)
    a, a_low, a_high = unit_bootstrap([early, late], after, paired=False, n_boot=n_boot, seed=seed)
    peak_side, after_side = interval_side(p_low, p_high, 0.0), interval_side(a_low, a_high, 0.0)
    if peak_side == "above" and after_side == "below":
        verdict = "holds"
    elif p_high <= 0 or after_side == "above":
        verdict = "does not hold"
    else:
        verdict = "inconclusive"
    return dict(depth=int(depth), group=group, peak=p, peak_low=p_low, peak_high=p_high, after=a,
                after_low=a_low, after_high=a_high, n_early=int(early.size), n_late=int(late.size), verdict=verdict)


def late_delta_alpha(snapshots: pd.DataFrame, estimator: str = "alpha_shape", group: str = lifecycle.ALL,
                     fraction: float = LATE_FRACTION) -> pd.DataFrame:
    """Δα (max − min over layers of the group's mean α) at each snapshot of the late part of
    training (steps ≥ ``fraction`` · the run's last step): ``depth, step, delta_alpha``."""
    spread = lifecycle.spread_over_time(snapshots, estimator, (group,))
    last = spread.groupby("depth")["step"].transform("max")
    late = spread[spread["step"] >= fraction * last]
    return late.rename(columns={"spread": "delta_alpha"})[["depth", "step", "delta_alpha"]].reset_index(drop=True)


def delta_alpha_exponent(snapshots: pd.DataFrame, estimator: str = "alpha_shape", group: str = lifecycle.ALL, *,
                         n_boot: int = 2000, seed: int = 0) -> dict:
    """The exponent b of Δα ∝ L^b, with a 95% interval.

    Δα of each depth L is its mean over the late snapshots (:func:`late_delta_alpha`); b is
    the least-squares slope of log Δα on log L. The interval resamples each depth's late
    snapshots on its own. Rule (against the paper's b = 0.26): ``holds`` if the interval
    contains 0.26 and lies above 0; ``does not hold`` if it excludes 0.26; ``inconclusive``
    otherwise (it contains 0.26 and 0, or is undefined: fewer than two depths or two late
    snapshots per depth). Returns ``exponent, low, high, depths, n_late, verdict``.
    """
    from .alpha_profile import _slope

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
        b, low, high = unit_bootstrap(samples, exponent, paired=False, n_boot=n_boot, seed=seed)
    paper = lifecycle.PAPER_DELTA_ALPHA_EXPONENT
    side = interval_side(low, high, paper)
    if side == "undefined":
        verdict = "inconclusive"
    elif side != "straddles":
        verdict = "does not hold"
    else:
        verdict = "holds" if low > 0 else "inconclusive"
    return dict(exponent=float(b), low=low, high=high, depths=depths, n_late=[int(s.size) for s in samples],
                group=group, verdict=verdict)


def _series_snapshots(profile, depths, train_overrides, checkpoints) -> tuple[pd.DataFrame, dict]:
    """The snapshot table and the run facts the prose cites: from the cached depth series, or,
    with ``checkpoints``, from any checkpoint series (``zones.checkpoints.lifecycle_snapshots``)."""
    if checkpoints:
        from ..checkpoints import lifecycle_snapshots

        snapshots = lifecycle_snapshots(checkpoints, progress=False)
        if "depth" not in snapshots.columns:
            snapshots.insert(0, "depth", int(snapshots["layer"].max()) + 1)
        steps = sorted(int(s) for s in snapshots["step"].unique())
        gaps = np.diff(steps)
        return snapshots, dict(depths=sorted(int(d) for d in snapshots["depth"].unique()), steps=steps[-1],
                               snapshot_every=int(np.median(gaps)) if len(gaps) else 0,
                               snapshot_fraction=NAN, final_heldout_loss={})
    from ..train import series_snapshots, series_summary, train_series

    runs = train_series(depths, profile, progress=False, **(train_overrides or {}))
    series = series_summary(runs)
    return series_snapshots(runs), dict(
        depths=[int(d) for d in series["depth"]], steps=int(runs[0].config.steps),
        snapshot_every=int(runs[0].config.snapshot_every), snapshot_fraction=float(series["snapshot_fraction"].max()),
        final_heldout_loss={int(d): float(v) for d, v in zip(series["depth"], series["final_heldout_loss"])})


def run(profile: str = "cpu", depths=None, train_overrides: dict | None = None, estimator: str = "alpha_shape",
        delta_group: str = "all", out_dir: str = "results/spectral_lifecycle", *, checkpoints=None,
        n_boot: int = 2000, seed: int = 0) -> ChapterResult:
    """The chapter, from the cached depth series: ``snapshots.csv``, ``compression.csv``,
    ``wave_gradient.csv``, ``wave_summary.csv``, ``alpha_grid.csv``, ``final_profile.csv``,
    ``delta_alpha.csv``, ``asymmetry.csv``, ``delta_alpha_fits.csv``, and the claims' tables
    ``wave_claim.csv`` (:func:`wave_reversal` per depth, Q/K), ``asymmetry_claim.csv``
    (``alpha_profile.qk_vo_asymmetry`` of each depth's final profile) and
    ``delta_alpha_claim.csv`` (:func:`delta_alpha_exponent`); ``summary.json``."""
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

    wave_claim = pd.DataFrame([wave_reversal(compression, d, "Q/K", n_boot=n_boot, seed=seed) for d in depth_list])
    asym_claim = pd.DataFrame([dict(depth=d, **qk_vo_asymmetry(final[(final["depth"] == d)], n_boot=n_boot, seed=seed))
                               for d in depth_list])
    exponent = delta_alpha_exponent(snapshots, estimator, delta_group, n_boot=n_boot, seed=seed)
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
                   wave_text=wave_sentence(waves, deepest), n_reversed=int(waves["reversed"].sum()),
                   n_waves=int(len(waves)),
                   wave_peak=float(deep_wave["peak"]), wave_peak_low=float(deep_wave["peak_low"]),
                   wave_peak_high=float(deep_wave["peak_high"]), wave_after=float(deep_wave["after"]),
                   wave_after_low=float(deep_wave["after_low"]), wave_after_high=float(deep_wave["after_high"]),
                   wave_verdict=verdict_phrase(str(deep_wave["verdict"])),
                   peak_position=float(peak["peak_position"]), delta_group_name=delta_group,
                   peak_shape=peak_shape(float(peak["peak_position"])),
                   peaks_text="; ".join(f"{group} matrices at depth {text}" for group, text in peaks.items()),
                   qk_comp_spread=float(by_group.loc["Q/K", "compression_spread_max"]),
                   vo_comp_spread=float(by_group.loc["V/O", "compression_spread_max"]),
                   qk_alpha_spread=float(by_group.loc["Q/K", "alpha_spread_final"]),
                   vo_alpha_spread=float(by_group.loc["V/O", "alpha_spread_final"]),
                   asymmetry_text=asymmetry_sentence(by_group),
                   exponent=float(fit["exponent"]), r2=float(fit["r2"]), paper_exponent=float(fit["paper_exponent"]),
                   late_exponent=exponent["exponent"], late_exponent_low=exponent["low"],
                   late_exponent_high=exponent["high"], exponent_verdict=verdict_phrase(exponent["verdict"]),
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
