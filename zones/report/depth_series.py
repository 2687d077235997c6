"""The depth-series chapter: train (or load) D8/D12/D16 at several seeds, ablate every block of
every run with paired intervals, and ρ(ΔLoss, α) per run and pooled per depth.

``run(...)`` returns a ``ChapterResult`` whose tables are written as CSV:

* ``series``: one row per run (``zones.series.series_summary``, with the flattening rule);
* ``history``: the loss curves (``depth, seed, step, ...``);
* ``importance``: every run's single-block ablation with α (``model`` = ``"depth D, seed S"``,
  ``depth``, ``seed``, the ``zones.measure.ablation.ablation_table`` columns, ``alpha``);
* ``rho``: ρ for a few estimators and roles per run (``zones.analysis.importance.RHO_COLUMNS`` plus
  ``depth, seed, model``: what the claims page scores, one row per run);
* ``rho_runs``: the tidy per-(depth, seed) ρ of the chosen α (``rho_by_run``);
* ``rho_pooled``: ρ pooled over the seeds of each depth and over every run (``rho_pooled``);
* ``seed_agreement``: per depth, how alike the seeds' ablation profiles are.
"""
from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from zones.analysis.importance import importance_frame, rho_table, spearman
from zones.measure.stats import N_PERMUTATIONS, N_RESAMPLES
from zones.report.common import ChapterResult, save
from zones.report.importance_vs_alpha import rho_verdict
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
RHO_RUN_COLUMNS = ["depth", "seed", "model", "n_blocks", "rho", "ci_low", "ci_high", "half_width", "p_value"]
POOLED_COLUMNS = ["depth", "n_runs", "n_blocks", "rho", "ci_low", "ci_high", "half_width", "p_value"]


def _with_run_columns(frame: pd.DataFrame, runs) -> pd.DataFrame:
    labels = {f"depth {r.config.depth}, seed {r.config.seed}": (r.config.depth, r.config.seed) for r in runs}
    frame = frame.copy()
    frame.insert(1, "depth", [labels[m][0] for m in frame["model"]])
    frame.insert(2, "seed", [labels[m][1] for m in frame["model"]])
    return frame


def rho_by_run(importance: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ(α, ΔLoss) of each run, the tidy table the claims page scores.

    ``importance`` is the chapter's ``importance`` table (``model, depth, seed, layer,
    delta_loss, alpha``). Columns ``RHO_RUN_COLUMNS``: ``depth, seed, model, n_blocks, rho,
    ci_low, ci_high`` (bootstrap 95 % over blocks), ``half_width`` ((high − low) / 2), ``p_value``
    (two-sided permutation)."""
    rows = []
    for (depth, run_seed, model), part in importance.groupby(["depth", "seed", "model"], sort=True):
        c = spearman(part["alpha"], part["delta_loss"], n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
        rows.append(dict(depth=int(depth), seed=int(run_seed), model=model, n_blocks=c.n, rho=c.rho,
                         ci_low=c.ci_low, ci_high=c.ci_high, half_width=(c.ci_high - c.ci_low) / 2,
                         p_value=c.p_value))
    return pd.DataFrame(rows, columns=RHO_RUN_COLUMNS)


def within_model_ranks(importance: pd.DataFrame) -> pd.DataFrame:
    """``importance`` with ``alpha_rank`` and ``delta_rank``: each block's rank within its own
    model, scaled to (0, 1) as (rank − ½) / n so models of different depths pool."""
    out = importance.copy()
    for column, name in (("alpha", "alpha_rank"), ("delta_loss", "delta_rank")):
        out[name] = out.groupby("model")[column].transform(lambda v: (rankdata(v) - 0.5) / len(v))
    return out


def rho_pooled(importance: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """ρ pooled over runs: per depth (its seeds) and over every run (``depth = "all"``).

    Ranks are taken within each model first (``within_model_ranks``), so pooling compares
    blocks only with blocks of their own model; ρ is then Spearman's over the pooled blocks, its
    interval resamples blocks and its p permutes them. Columns ``POOLED_COLUMNS``."""
    ranked = within_model_ranks(importance)
    groups = [(str(int(d)), part) for d, part in ranked.groupby("depth", sort=True)] + [("all", ranked)]
    rows = []
    for depth, part in groups:
        c = spearman(part["alpha_rank"], part["delta_rank"], n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
        rows.append(dict(depth=depth, n_runs=int(part["model"].nunique()), n_blocks=c.n, rho=c.rho, ci_low=c.ci_low,
                         ci_high=c.ci_high, half_width=(c.ci_high - c.ci_low) / 2, p_value=c.p_value))
    return pd.DataFrame(rows, columns=POOLED_COLUMNS)


def seed_agreement(importance: pd.DataFrame, rho_runs: pd.DataFrame) -> pd.DataFrame:
    """Per depth with several seeds: Spearman ρ between the seeds' ΔLoss profiles (block by
    block; the mean over seed pairs), whether every seed's costliest block is the same, and
    the spread of ρ(α, ΔLoss) between seeds. Columns ``depth, n_seeds, profile_rho,
    costliest_blocks, same_costliest, rho_min, rho_max, rho_spread``."""
    rows = []
    for depth, part in importance.groupby("depth", sort=True):
        profiles = part.pivot_table(index="layer", columns="seed", values="delta_loss")
        seeds = list(profiles.columns)
        pairs = [spearman(profiles[a], profiles[b], n_resamples=1, n_permutations=1).rho for a, b in itertools.combinations(seeds, 2)]
        costliest = [int(profiles[s].idxmax()) for s in seeds]
        rhos = rho_runs.loc[rho_runs["depth"] == depth, "rho"]
        rows.append(dict(depth=int(depth), n_seeds=len(seeds), profile_rho=float(np.mean(pairs)) if pairs else np.nan,
                         costliest_blocks=", ".join(map(str, costliest)), same_costliest=len(set(costliest)) == 1,
                         rho_min=float(rhos.min()), rho_max=float(rhos.max()),
                         rho_spread=float(rhos.max() - rhos.min())))
    return pd.DataFrame(rows)


def _interval_text(r) -> str:
    return f"ρ = {r.rho:.2f} (95% interval {r.ci_low:.2f} to {r.ci_high:.2f}, p = {r.p_value:.2g})"


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
        rho_text="; ".join(f"{r.model}: {_interval_text(r)}" for r in rho_runs.itertuples()),
        pooled_text="; ".join(f"depth {r.depth} ({r.n_runs} runs): {_interval_text(r)}"
                              for r in pooled.itertuples() if r.depth != "all"),
        pooled_all_text=_interval_text(pooled[pooled["depth"] == "all"].iloc[0]),
        deepest_half_width=float(deepest["half_width"]),
        deepest_run_half_width=float(deepest_runs["half_width"].mean()),
        deepest_depth=int(series["depth"].max()),
        agreement_text="; ".join(f"depth {r.depth}: profiles ρ = {r.profile_rho:.2f}, costliest blocks "
                                 f"{r.costliest_blocks}, ρ(α, ΔLoss) from {r.rho_min:.2f} to {r.rho_max:.2f}"
                                 for r in agreement.itertuples() if r.n_seeds > 1) or "one seed per depth",
        n_positive=int((rho_runs["rho"] > 0).sum()), n_detected=int((rho_runs["ci_low"] > 0).sum()),
        alpha_role_name=alpha_role, alpha_estimator_name=alpha_estimator,
        verdict=" ".join(rho_verdict(dict(ci_low=r.ci_low, ci_high=r.ci_high), f"depth {r.depth} (pooled seeds)",
                                     alpha_name) for r in pooled.itertuples() if r.depth != "all"))


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
    titles = {r.model: f"{r.model}: ρ = {r.rho:.2f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" for r in rho_runs.itertuples()}
    return ChapterResult(dict(tables, rho_wide=wide.reset_index(), runs_shown=_shown_runs(series)), numbers, record,
                         out, extra=dict(titles=titles, alpha_title=f"{alpha_role} {alpha_estimator}"))
