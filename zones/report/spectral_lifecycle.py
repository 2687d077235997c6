"""The spectral-lifecycle chapter: the compression wave, the α gradient, the Q/K–V/O
asymmetry and Δα against depth, read from the depth series' snapshots, with the verdicts
and the intervals the claims need.

The statistics are ``zones.analysis.lifecycle``'s and ``zones.analysis.profile``'s; their
intervals resample layers or snapshot steps, or rest on training runs:

* the wave (``wave_reversal``): the layers of the early half and of the late half, each
  resampled on its own;
* the asymmetry (``qk_vo_asymmetry``): the layers of the final profile (the same layers for
  Q/K and V/O);
* the Δα exponent (``delta_alpha_exponent``): one point per training run (its Δα averaged over
  its last quarter's snapshots), and the slope's exact t interval over the runs.

The verdicts are ``zones.report.verdicts``' rules (``score_wave``, ``score_exponent``).
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping

import numpy as np
import pandas as pd

from zones.analysis import lifecycle
from zones.analysis.lifecycle import delta_alpha_exponent, wave_reversal, zero_crossings
from zones.analysis.profile import qk_vo_asymmetry
from zones.analysis.unit_intervals import interval_side
from zones.measure.bootstrap import N_RESAMPLES
from zones.report.common import NAN, ChapterResult, save
from zones.report.format import fmt_interval, fmt_list
from zones.report.verdicts import (
    PAPER_EXPONENT,
    Verdict,
    from_word,
    SEEDS,
    score_exponent,
    score_wave,
    verdict_phrase,
)
from zones.series import series_configs, series_snapshots, series_summary, train_series
from zones.series.checkpoints import lifecycle_snapshots

WAVE_TOLERANCE = 0.02        # a half "leads" when the gradient exceeds this (zones.analysis.lifecycle.wave_summary)
TRANSIENT_SHARE = 0.5        # the rank gradient is a transient if it ends below half its peak magnitude
LASTING_SHARE = 0.7          # the α gradient formed early if it is above 70% of its final value halfway


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


def _span(values) -> str:
    """``"8–16"`` (or ``"8"`` for one value)."""
    low, high = min(values), max(values)
    return f"{low}" if low == high else f"{low}–{high}"


def dissociation(gradient: pd.DataFrame, snapshots: pd.DataFrame, depth: int, alpha_estimator: str,
                 group: str = lifecycle.ALL, exponent: Mapping | None = None) -> dict:
    """Rank gradient a transient, α gradient lasting? For the run of ``depth``
    (``zones.analysis.lifecycle.gradient_persistence``): ``wave_share`` and ``alpha_share`` in
    percent, ``halfway_step``, ``halfway_text`` (which step of how many) and the sentence
    ``dissociation_text``. Rule: the pattern of the paper's dissociation shows if wave_share <
    ``TRANSIENT_SHARE`` and alpha_share > ``LASTING_SHARE``; the sentence says it is one run
    with so many snapshots, and, given the Δα ``exponent`` row, whether b's interval lies on
    the paper's side of 0."""
    shares = lifecycle.gradient_persistence(gradient, snapshots, depth, alpha_estimator, group)
    wave_share, alpha_share = shares["wave_share"], shares["alpha_share"]
    n_snapshots = int(snapshots.loc[snapshots["depth"] == depth, "step"].nunique())
    one_run = f"one run of depth {depth}, {n_snapshots} snapshots"
    if wave_share < TRANSIENT_SHARE and alpha_share > LASTING_SHARE:
        text = (f"in {one_run}, the rank gradient faded and the α gradient formed early and stayed: the pattern "
                f"the paper calls a dissociation, seen once, not yet a finding across runs")
    else:
        text = (f"in {one_run}, rank and α did not separate into a transient and a lasting gradient as the "
                f"paper's dissociation would")
    if exponent is not None and interval_side(exponent["low"], exponent["high"], 0.0) == "below":
        b = fmt_interval(exponent["exponent"], exponent["low"], exponent["high"])
        text += f"; and Δα here shrinks with depth (b = {b}), the opposite sign of the paper's {PAPER_EXPONENT}"
    halfway = f"step {shares['halfway_step']} of {shares['steps']} (the snapshot nearest the middle of training)"
    return dict(wave_share=100 * wave_share, alpha_share=100 * alpha_share, halfway_step=shares["halfway_step"],
                halfway_text=halfway, dissociation_text=text)


def wave_claim_row(wave: dict) -> dict:
    """``zones.analysis.lifecycle.wave_reversal``'s statistics with the verdict of
    ``zones.report.verdicts.score_wave`` (``verdict``, ``reason``): a row of ``wave_claim.csv``."""
    verdict = wave_verdict(wave)
    return dict(wave, verdict=str(verdict), reason=verdict.reason)


def wave_verdict(wave: Mapping) -> Verdict:
    """``zones.report.verdicts.score_wave`` of a ``wave_claim`` row (its layers: both halves)."""
    return score_wave(str(wave["leader"]), wave["after_low"], wave["after_high"],
                      n_layers=int(wave["n_early"]) + int(wave["n_late"]))


def seeds_text(seeds_trained: Mapping[int, int]) -> str:
    """``"8:2,12:2,16:1"``: the runs the series has at each depth (a table cell)."""
    return ",".join(f"{int(d)}:{int(n)}" for d, n in sorted(seeds_trained.items()))


def runs_text(runs: Mapping[int, int]) -> str:
    """``"2 at depth 8, 1 at depth 12 and 1 at depth 16"``."""
    return fmt_list(f"{n} at depth {d}" for d, n in sorted(runs.items()))


def exponent_claim_row(exponent: dict, seeds_trained: Mapping[int, int]) -> dict:
    """``zones.analysis.lifecycle.delta_alpha_exponent``'s b with the scorecard's verdict
    (``verdict``: ``zones.report.verdicts.score_exponent``), what its interval covers
    (``interval_covers``) and the runs the series has per depth (``seeds_trained``, :func:`seeds_text`)."""
    runs = dict(zip(exponent["depths"], exponent["runs"]))
    verdict = score_exponent(exponent["low"], exponent["high"], runs=runs)
    covers = (f"the spread of {exponent['n_runs']} training runs about the power law ({runs_text(runs)}; "
              f"{exponent['df']} degrees of freedom)" if runs else "no training run")
    return dict(exponent, verdict=str(verdict), reason=verdict.reason, detail=verdict.detail, interval_covers=covers,
                runs=",".join(map(str, exponent["runs"])), seeds_trained=seeds_text(seeds_trained))


def group_phrase(group: str) -> str:
    """The matrices of a group as a sentence names them: ``"all matrices"`` (never "the all
    matrices"), ``"the Q/K matrices"``."""
    return "all matrices" if group == lifecycle.ALL else f"the {group} matrices"


def exponent_shown(row: dict) -> str:
    """b and its interval as the text and the figure's legend write it: ``−0.50 [−0.86, −0.15]``."""
    return fmt_interval(row["exponent"], row["low"], row["high"], signed=True)


def exponent_sentence(row: dict) -> str:
    """How b's interval was made, the interval, what it covers and the claim's word by it."""
    shown = exponent_shown(row)
    verdict = verdict_phrase(from_word(row["verdict"], row.get("reason", SEEDS), row.get("detail", "")))
    return (f"to see how loosely, each training run is one point (its Δα averaged over the snapshots of its last "
            f"quarter of training) and the slope through them has a t interval: b = {shown}, an interval that covers "
            f"{row['interval_covers']}. By it the claim {verdict}")


def _series_snapshots(profile, depths, train_overrides, checkpoints, seeds=None) -> tuple[pd.DataFrame, dict]:
    """The snapshot table and the run facts the prose cites: from the cached depth series, or,
    with ``checkpoints``, from any checkpoint series (``zones.series.checkpoints.lifecycle_snapshots``).
    ``seeds``: the depth series' training seeds (a count, as the depth-series chapter takes it;
    None: the profile's), read only to say how many runs per depth the series has."""
    if checkpoints:
        snapshots = lifecycle_snapshots(checkpoints, progress=False)
        if "depth" not in snapshots.columns:
            snapshots.insert(0, "depth", int(snapshots["layer"].max()) + 1)
        steps = sorted(int(s) for s in snapshots["step"].unique())
        gaps = np.diff(steps)
        depth_list = sorted(int(d) for d in snapshots["depth"].unique())
        return snapshots, dict(depths=depth_list, steps=steps[-1],
                               snapshot_every=int(np.median(gaps)) if len(gaps) else 0,
                               snapshot_schedule=f"every {int(np.median(gaps)) if len(gaps) else 0} steps (the median gap)",
                               snapshot_fraction=NAN, final_heldout_loss={}, seeds_trained={d: 1 for d in depth_list},
                               tokens_per_run=None, every_run=None)
    # one training run per depth (seed 0: the depth series' first seed, read from its cache);
    # mixing seeds within a depth would blur the snapshots' trajectory
    overrides = dict(train_overrides or {})
    one_seed = "seed" in overrides
    runs = train_series(depths, profile, seeds=None if one_seed else 1, progress=False, **overrides)
    series = series_summary(runs)
    # the runs the series has at each depth (the depth-series chapter trains them all), read from its configs
    trained = Counter(c.depth for c in series_configs(profile, depths, None if one_seed else seeds, **overrides))
    # the exponent reads every run the series has (the depth-series chapter trained them)
    every_run = (series_snapshots(train_series(depths, profile, seeds=seeds, progress=False, **overrides))
                 if not one_seed and max(trained.values()) >= 2 else None)
    return series_snapshots(runs), dict(every_run=every_run,
        depths=[int(d) for d in series["depth"]], steps=int(runs[0].config.steps),
        snapshot_every=int(runs[0].config.snapshot_every), snapshot_schedule=runs[0].config.snapshot_text(),
        snapshot_fraction=float(series["snapshot_fraction"].max()),
        final_heldout_loss={int(d): float(v) for d, v in zip(series["depth"], series["final_heldout_loss"])},
        seeds_trained={int(d): int(n) for d, n in trained.items()},
        tokens_per_run=int(runs[0].config.steps * runs[0].config.tokens_per_step))


def run(profile: str = "cpu", depths=None, train_overrides: dict | None = None, alpha_estimator: str = "alpha_shape",
        delta_group: str = "all", out_dir: str = "results/spectral_lifecycle", *, checkpoints=None,
        seeds: int | None = None, n_resamples: int = N_RESAMPLES, seed: int = 0) -> ChapterResult:
    """The chapter, from the cached depth series: ``snapshots.csv``, ``compression.csv``,
    ``wave_gradient.csv``, ``wave_summary.csv``, ``alpha_grid.csv``, ``final_profile.csv``,
    ``delta_alpha.csv``, ``asymmetry.csv``, ``delta_alpha_fits.csv``, and the claims' tables
    ``wave_claim.csv`` (:func:`wave_reversal` per depth, Q/K), ``asymmetry_claim.csv``
    (``alpha_profile.qk_vo_asymmetry`` of each depth's final profile) and
    ``delta_alpha_claim.csv`` (:func:`delta_alpha_exponent`); ``summary.json``."""
    snapshots, facts = _series_snapshots(profile, depths, train_overrides, checkpoints, seeds)
    depth_list = facts["depths"]
    deepest = max(depth_list)
    steps = facts["steps"]

    compression = lifecycle.group_grid(snapshots, "compression")
    gradient = lifecycle.wave_gradient(snapshots)
    waves = lifecycle.wave_summary(gradient, WAVE_TOLERANCE)
    alpha_grid = lifecycle.group_grid(snapshots, alpha_estimator)
    final = lifecycle.final_profile(snapshots, alpha_estimator)
    deltas = lifecycle.delta_alpha(snapshots, alpha_estimator)
    spreads = lifecycle.asymmetry(snapshots, alpha_estimator)
    fits = lifecycle.delta_alpha_fits(deltas)

    wave_claim = pd.DataFrame([wave_claim_row(wave_reversal(compression, d, "Q/K", n_resamples=n_resamples, seed=seed))
                               for d in depth_list])
    asym_claim = pd.DataFrame([dict(depth=d, **qk_vo_asymmetry(final[(final["depth"] == d)], n_resamples=n_resamples, seed=seed))
                               for d in depth_list])
    runs = snapshots if facts["every_run"] is None else facts["every_run"]
    exponent = exponent_claim_row(delta_alpha_exponent(runs, alpha_estimator, delta_group), facts["seeds_trained"])
    exponent_claim = pd.DataFrame([dict(exponent, depths=",".join(map(str, exponent["depths"])),
                                        paper_exponent=PAPER_EXPONENT)])
    peak = deltas[(deltas["depth"] == deepest) & (deltas["group"] == delta_group)].iloc[0]
    peaks = {group: ", ".join(f"{int(r.depth)}: {r.peak_position:.2f}" for r in deltas[deltas["group"] == group].itertuples())
             for group in dict.fromkeys([delta_group, "Q/K"])}
    by_group = spreads.groupby("group")[["compression_spread_max", "alpha_spread_final"]].mean()
    fit = fits[fits["group"] == delta_group].iloc[0]
    chosen = deltas[deltas["group"] == delta_group]
    deep_wave = wave_claim.set_index("depth").loc[deepest]
    numbers = dict(depths=", ".join(map(str, depth_list)), steps=steps,
                   snapshot_every=facts["snapshot_every"], snapshot_schedule=facts["snapshot_schedule"], n_snapshots=int(snapshots["step"].nunique()),
                   snapshot_percent=100 * facts["snapshot_fraction"], deepest=deepest,
                   wave_text=wave_sentence(waves, gradient, deepest), n_reversed=int(waves["reversed"].sum()),
                   n_waves=int(len(waves)),
                   wave_peak=float(deep_wave["peak"]), wave_peak_low=float(deep_wave["peak_low"]),
                   wave_peak_high=float(deep_wave["peak_high"]), wave_after=float(deep_wave["after"]),
                   wave_after_low=float(deep_wave["after_low"]), wave_after_high=float(deep_wave["after_high"]),
                   wave_verdict=verdict_phrase(wave_verdict(deep_wave)),
                   wave_leader=str(deep_wave["leader"]),
                   peak_position=float(peak["peak_position"]), delta_group_name=group_phrase(delta_group),
                   peak_shape=peak_shape(float(peak["peak_position"])),
                   peaks_text="; ".join(f"{group} matrices at depth {text}" for group, text in peaks.items()),
                   qk_comp_spread=float(by_group.loc["Q/K", "compression_spread_max"]),
                   vo_comp_spread=float(by_group.loc["V/O", "compression_spread_max"]),
                   qk_alpha_spread=float(by_group.loc["Q/K", "alpha_spread_final"]),
                   vo_alpha_spread=float(by_group.loc["V/O", "alpha_spread_final"]),
                   asymmetry_text=asymmetry_sentence(asym_claim),
                   exponent=float(fit["exponent"]), r2=float(fit["r2"]), paper_exponent=float(fit["paper_exponent"]),
                   late_exponent=exponent["exponent"], late_exponent_low=exponent["low"],
                   late_exponent_high=exponent["high"], exponent_scorecard=verdict_phrase(
                       from_word(exponent["verdict"], exponent["reason"], exponent["detail"])),
                   exponent_covers=exponent["interval_covers"], exponent_text=exponent_sentence(exponent), depth_range=_span(depth_list), n_depths=len(depth_list),
                   tokens_per_run=facts["tokens_per_run"],
                   **dissociation(gradient, snapshots, deepest, alpha_estimator, delta_group, exponent))
    summary = dict(profile=profile, depths=depth_list, steps=steps, alpha_estimator=alpha_estimator, delta_group=delta_group,
                   exponent=float(fit["exponent"]), r2=float(fit["r2"]), paper_exponent=float(fit["paper_exponent"]),
                   late_exponent=exponent,
                   delta_alpha={int(d): float(v) for d, v in zip(chosen["depth"], chosen["delta_alpha"])},
                   final_heldout_loss=facts["final_heldout_loss"], snapshot_fraction_max=facts["snapshot_fraction"],
                   seeds_trained=facts["seeds_trained"],
                   source="checkpoints" if checkpoints else f"zones train --profile {profile}")
    tables = dict(snapshots=snapshots, compression=compression, wave_gradient=gradient, wave_summary=waves,
                  alpha_grid=alpha_grid, final_profile=final, delta_alpha=deltas, asymmetry=spreads,
                  delta_alpha_fits=fits, wave_claim=wave_claim, asymmetry_claim=asym_claim,
                  delta_alpha_claim=exponent_claim)
    out = save(out_dir, tables, summary)
    return ChapterResult(tables, numbers, summary, out,
                         extra=dict(chosen=chosen, prefactor=float(fit["prefactor"]),
                                    # the Δα figure: the runs b is fitted through, and b as the text gives it
                                    runs_delta_alpha=lifecycle.run_delta_alpha(runs, alpha_estimator, delta_group),
                                    fit_text=f"fit: b = {exponent_shown(exponent)}"))
