"""The depth-series chapter: train (or load) D8/D12/D16 at several seeds, ablate every block of
every run with paired intervals, and ρ(ΔLoss, α) per run and pooled per depth.

``run(...)`` returns a ``ChapterResult`` whose tables are written as CSV:

* ``series``: one row per run (``zones.series.series_summary``, with the flattening rule);
* ``history``: the loss curves (``depth, seed, step, ...``);
* ``importance``: every run's single-block ablation with α (``model`` = ``"depth D, seed S"``,
  ``depth``, ``seed``, the ``zones.measure.ablation.ablation_table`` columns, ``alpha``);
* ``rho``: ρ for a few estimators and roles per run (``zones.analysis.importance.RHO_COLUMNS`` plus
  ``depth, seed, model``: what the claims page scores, one row per run);
* ``rho_runs``: the tidy per-(depth, seed) ρ of the chosen α (``zones.analysis.pooled.rho_by_run``);
* ``rho_pooled``: ρ pooled over the seeds of each depth and over every run (``zones.analysis.pooled.rho_pooled``);
* ``seed_agreement``: per depth, how alike the seeds' ablation profiles are.
"""
from __future__ import annotations

from typing import Mapping

import pandas as pd

from zones.analysis.bootstrap import interval_side
from zones.analysis.importance import importance_frame, rho_table
from zones.analysis.pooled import rho_by_run, rho_pooled, seed_agreement
from zones.measure.stats import N_PERMUTATIONS, N_RESAMPLES
from zones.report.common import ChapterResult, save
from zones.report.format import fmt_rho
from zones.report.verdicts import rho_verdict
from zones.series import (
    FLAT_IMPROVEMENT,
    LATE_FRACTION,
    series_history,
    series_importance,
    series_summary,
    train_series,
)

SERIES_ESTIMATORS = ("alpha_shape", "alpha_esd", "stable_rank")
SERIES_ROLES = ("weighted", "q", "k", "v", "o")


def _with_run_columns(frame: pd.DataFrame, runs) -> pd.DataFrame:
    labels = {f"depth {r.config.depth}, seed {r.config.seed}": (r.config.depth, r.config.seed) for r in runs}
    frame = frame.copy()
    frame.insert(1, "depth", [labels[m][0] for m in frame["model"]])
    frame.insert(2, "seed", [labels[m][1] for m in frame["model"]])
    return frame


def depth_verdict(pooled: Mapping, runs: pd.DataFrame, alpha_name: str) -> str:
    """The chapter's sentence on one depth: ρ pooled over its seeds (a ``rho_pooled`` row) read
    beside each seed's own ρ (its ``rho_by_run`` rows).

    Rule: a tendency is stated only when the pooled interval excludes 0 and, with several
    seeds, every seed's own interval excludes 0 on the same side; when the pooled interval
    excludes 0 but a seed's does not, the sentence says the seeds disagree; with one seed it
    says that run-to-run variation is not measured. The intervals resample blocks."""
    depth, n_runs = pooled["depth"], len(runs)
    side = interval_side(pooled["ci_low"], pooled["ci_high"], 0.0)
    pooled_rho = fmt_rho(pooled["rho"], pooled["ci_low"], pooled["ci_high"])
    if side == "undefined":
        return f"On depth {depth} ρ cannot be computed (too few blocks, or a constant α or ΔLoss)."
    if n_runs < 2:
        return (rho_verdict(dict(pooled), f"depth {depth}", alpha_name)[:-1]
                + " (one training run: whether another seed agrees is not measured).")
    seeds = "; ".join(f"seed {int(r.seed)}: {fmt_rho(r.rho, r.ci_low, r.ci_high)}" for r in runs.itertuples())
    if side == "straddles":
        return (f"On depth {depth}, pooled over its {n_runs} seeds ({pooled_rho}), the interval includes zero: the "
                f"block's {alpha_name} does not detectably predict its importance ({seeds}).")
    agree = all(interval_side(r.ci_low, r.ci_high, 0.0) == side for r in runs.itertuples())
    direction = "larger" if side == "above" else "smaller"
    if agree:
        return (f"On depth {depth}, pooled over its {n_runs} seeds ({pooled_rho}) and in every seed alone ({seeds}), "
                f"the interval excludes zero: blocks with a {direction} {alpha_name} tend to matter more.")
    return (f"On depth {depth}, pooled over its {n_runs} seeds, the interval excludes zero ({pooled_rho}), but not "
            f"every seed's does ({seeds}): the seeds disagree, so a tendency across training runs is not shown.")


def _numbers(profile, series, frame, rho_runs, pooled, agreement, config, alpha_role, alpha_estimator) -> dict:
    alpha_name = f"{alpha_role} {alpha_estimator}"
    top = frame.loc[frame.groupby("model", sort=False)["delta_loss"].idxmax()]
    deepest = pooled[pooled["depth"] == str(int(series["depth"].max()))].iloc[0]
    deepest_runs = rho_runs[rho_runs["depth"] == rho_runs["depth"].max()]
    return dict(
        depths=", ".join(str(int(d)) for d in series["depth"].drop_duplicates()), profile=profile,
        seeds_text="; ".join(f"depth {int(d)}: {', '.join(str(int(s)) for s in part['seed'])}"
                             for d, part in series.groupby("depth", sort=True)),
        n_runs=len(series), steps=int(config.steps), tokens_k=config.steps * config.tokens_per_step / 1000,
        width_per_layer=int(config.width_per_layer), vocab_size=int(config.vocab_size),
        train_minutes=float(series["total_seconds"].sum() / 60), corpus=str(config.corpus),
        loss_text="; ".join(f"depth {int(r.depth)}, seed {int(r.seed)}: {r.final_heldout_loss:.3f}"
                            for r in series.itertuples()),
        initial_loss=float(series["initial_heldout_loss"].mean()),
        late_percent=100 * LATE_FRACTION, flat_percent=100 * FLAT_IMPROVEMENT,
        max_late_improvement_percent=float(100 * series["late_improvement"].max()),
        n_flattened=int(series["flattened"].sum()),
        n_tokens=int(frame["n_tokens"].iloc[0]),
        top_text="; ".join(f"{m}: block {int(l)}" for m, l in zip(top["model"], top["layer"])),
        rho_text="; ".join(f"{r.model}: {fmt_rho(r.rho, r.ci_low, r.ci_high, r.p_value)}"
                           for r in rho_runs.itertuples()),
        pooled_text="; ".join(f"depth {r.depth} ({r.n_runs} runs): {fmt_rho(r.rho, r.ci_low, r.ci_high, r.p_value)}"
                              for r in pooled.itertuples() if r.depth != "all"),
        pooled_all_text=fmt_rho(*pooled.loc[pooled["depth"] == "all", ["rho", "ci_low", "ci_high", "p_value"]].iloc[0]),
        deepest_half_width=float(deepest["half_width"]),
        deepest_run_half_width=float(deepest_runs["half_width"].mean()),
        deepest_depth=int(series["depth"].max()),
        agreement_text="; ".join(f"depth {r.depth}: profiles ρ = {r.profile_rho:.2f}, costliest blocks "
                                 f"{r.costliest_blocks}, ρ(α, ΔLoss) from {r.rho_min:.2f} to {r.rho_max:.2f}"
                                 for r in agreement.itertuples() if r.n_seeds > 1) or "one seed per depth",
        n_positive=int((rho_runs["rho"] > 0).sum()), n_detected=int((rho_runs["ci_low"] > 0).sum()),
        alpha_role_name=alpha_role, alpha_estimator_name=alpha_estimator,
        verdict=" ".join(depth_verdict(r._asdict(), rho_runs[rho_runs["depth"] == int(r.depth)], alpha_name)
                         for r in pooled.itertuples() if r.depth != "all"))


def _shown_runs(series: pd.DataFrame) -> pd.DataFrame:
    shown = series.assign(seconds=series["total_seconds"], parameters_m=series["parameters"] / 1e6,
                          late_percent=100 * series["late_improvement"])
    return shown[["depth", "seed", "width", "heads", "parameters_m", "tokens_seen", "seconds", "final_heldout_loss",
                  "late_percent"]].rename(columns={
                      "parameters_m": "parameters (M)", "tokens_seen": "tokens", "seconds": "training (s)",
                      "final_heldout_loss": "held-out loss", "late_percent": "last 20 % gain (%)"}).round(3)


def run(profile: str = "cpu", depths=None, seeds: int | None = None, train_overrides: dict | None = None,
        eval_tokens: int | None = 8128, batch_size: int = 16, alpha_estimator: str = "alpha_shape",
        alpha_role: str = "weighted", out_dir: str = "results/depth_series", *, n_resamples: int = N_RESAMPLES,
        n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> ChapterResult:
    """The chapter (see the module's docstring for its tables); ``summary.json`` holds one
    record per run with its ρ and interval, and the pooled ρ per depth."""
    runs = train_series(depths, profile, seeds=seeds, progress=False, **(train_overrides or {}))  # no bars in pages
    series = series_summary(runs)
    history = series_history(runs)
    results = series_importance(runs, eval_tokens=eval_tokens, batch_size=batch_size, progress=False)
    frame = _with_run_columns(importance_frame(results, alpha_estimator, alpha_role), runs)
    rho_runs = rho_by_run(frame, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    pooled = rho_pooled(frame, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    agreement = seed_agreement(frame, rho_runs)
    per_run = pd.concat([rho_table(r.ablation, r.alphas, estimators=list(SERIES_ESTIMATORS), roles=list(SERIES_ROLES),
                                   n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
                         .assign(depth=run.config.depth, seed=run.config.seed, model=r.label)
                         for r, run in zip(results, runs)], ignore_index=True)
    config = runs[0].config
    numbers = _numbers(profile, series, frame, rho_runs, pooled, agreement, config, alpha_role, alpha_estimator)
    record = dict(profile=profile, corpus=str(config.corpus), depths=sorted({int(d) for d in series["depth"]}),
                  eval_tokens=eval_tokens, alpha_estimator=alpha_estimator, alpha_role=alpha_role,
                  runs=[dict(depth=int(row.depth), seed=int(row.seed), parameters=int(row.parameters),
                             total_seconds=float(row.total_seconds), snapshot_fraction=float(row.snapshot_fraction),
                             final_heldout_loss=float(row.final_heldout_loss),
                             late_improvement=float(row.late_improvement),
                             **rho_runs.iloc[i][["rho", "ci_low", "ci_high", "p_value"]].astype(float).to_dict())
                        for i, row in enumerate(series.itertuples())],
                  pooled=pooled.to_dict("records"))
    tables = dict(series=series, history=history, importance=frame, rho=per_run, rho_runs=rho_runs,
                  rho_pooled=pooled, seed_agreement=agreement)
    out = save(out_dir, tables, record)
    wide = per_run.pivot_table(index=["estimator", "role"], columns=["depth", "seed"], values="rho").round(2)
    wide.columns = [f"ρ, D{d} s{s}" for d, s in wide.columns]
    titles = {r.model: f"{r.model}: {fmt_rho(r.rho, r.ci_low, r.ci_high)}" for r in rho_runs.itertuples()}
    return ChapterResult(dict(tables, rho_wide=wide.reset_index(), runs_shown=_shown_runs(series)), numbers, record,
                         out, extra=dict(titles=titles, alpha_title=f"{alpha_role} {alpha_estimator}"))
