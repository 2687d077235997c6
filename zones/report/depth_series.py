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
* ``seed_agreement``: per depth, how alike the seeds' ablation profiles are;
* ``quant_summary``, ``quant_blocks``, ``quant_matrices``: every run against its block matrices
  round-tripped through ``quant_type`` (Q4_1, the default model's 4-bit format;
  ``zones.series.series_quantization``): α per matrix, ΔLoss per block and ρ(α, ΔLoss) before
  and after, with intervals (empty when ``quant_type`` is None).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import pandas as pd

from zones.analysis.importance import importance_frame, rho_table
from zones.analysis.pooled import rho_by_run, rho_pooled, seed_agreement
from zones.analysis.quantization import SUMMARY_COLUMNS as QUANT_SUMMARY_COLUMNS
from zones.analysis.unit_intervals import interval_side
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.report.common import ChapterResult, save
from zones.report.format import fmt_interval, fmt_list, fmt_num, fmt_rho, plural
from zones.report.verdicts import rho_verdict, rule
from zones.series import (
    FLAT_IMPROVEMENT,
    LATE_FRACTION,
    series_history,
    series_importance,
    series_quantization,
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


ALPHA_ORDER_KEPT = 0.9  # Q4_1 "keeps α's order" when every run's ρ(α before, α after) interval lies above this


@rule(f"per run, ρ(α, ΔLoss) of the Q4_1 round trip minus that of the float32 weights, with its 95% interval "
      f"over blocks (both models' blocks resampled together): Q4_1 moves ρ when some run's interval excludes 0, "
      f"does not detectably move it when every run's includes 0 (the widest interval bounds the change), and the "
      f"change is not measured when an interval is undefined; α's order over the matrices is kept when every "
      f"run's ρ(α before, α after) interval lies above {ALPHA_ORDER_KEPT}; a run whose ρ(α, ΔLoss) interval excludes "
      f"0 before the round trip but not after it, or after it but not before, is named: there, whether ρ is told "
      f"apart from zero depends on the 4-bit rounding")
def quantization_text(summary: pd.DataFrame, quant_type: str = "Q4_1") -> str:
    """What a ``quant_type`` round trip of the trained runs (``zones.series.series_quantization``'s
    ``summary``: one row per run) implies for the default model's numbers, which are those of
    Q4_1 weights (SmolLM2-135M)."""
    if summary.empty:
        return (f"The {quant_type} round trip was not measured (quant_type is None): what 4-bit weights change in "
                f"SmolLM2's numbers is not shown on this page.")
    n = len(summary)
    runs = "run" if n == 1 else f"{n} runs"
    alpha = (f"moved one matrix's α by at most {fmt_num(summary['alpha_max_change'].abs().max(), 2)} "
             f"(median {fmt_num(summary['alpha_median_abs_change'].median(), 2)})")
    kept = bool((summary["alpha_rho_low"] > ALPHA_ORDER_KEPT).all())
    lowest = summary.loc[summary["alpha_rho"].idxmin(), ["alpha_rho", "alpha_rho_low", "alpha_rho_high"]]
    order = (f"kept α's order over the matrices (ρ(α before, α after) above {ALPHA_ORDER_KEPT} in every run, "
             f"interval included)" if kept else
             f"changed α's order over the matrices in some run (ρ(α before, α after) as low as "
             f"{fmt_interval(*lowest)})")
    moved = int(summary["n_blocks_moved"].sum())
    blocks = (f"and changed the ΔLoss of {moved} of {int(summary['n_blocks'].sum())} blocks beyond its interval "
              f"(by at most {fmt_num(summary['delta_loss_max_change'].abs().max(), 2)} nats)")
    head = f"Round-tripping every block matrix of the {runs} through {quant_type} {alpha}, {order}, {blocks}."
    low, high = summary["rho_change_low"], summary["rho_change_high"]
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return (f"{head} The change of ρ(α, ΔLoss) is undefined in some run (too few blocks, or a constant α or "
                f"ΔLoss), so what {quant_type} does to SmolLM2's ρ is not measured here.")
    changes = ", ".join(f"{r.model}: {fmt_interval(r.rho_change, r.rho_change_low, r.rho_change_high, signed=True)}"
                        for r in summary.itertuples())
    apart = summary[(low > 0) | (high < 0)]
    if len(apart):
        return (f"{head} It moved ρ(α, ΔLoss) beyond its interval in {len(apart)} of {plural(n, 'run')} ({changes}): a 4-bit "
                f"round trip can change the ρ this book reads, so SmolLM2's ρ, measured on {quant_type} weights, is "
                f"the ρ of the 4-bit model and may differ from its bfloat16 weights' by as much.{_flipped(summary, quant_type)}")
    widest = float(max(high.max(), -low.min()))
    return (f"{head} Its change of ρ(α, ΔLoss) includes zero in every run ({changes}): on these runs 4-bit weights "
            f"do not detectably move ρ, so SmolLM2's ρ is unlikely to be an artefact of its {quant_type} weights "
            f"beyond about ±{fmt_num(widest, 2)} (the widest interval) — as far as models this small, trained "
            f"briefly in float32, speak for a 135M model (an interval that includes zero bounds the change; it "
            f"does not show there is none).{_flipped(summary, quant_type)}")


def _flipped(summary: pd.DataFrame, quant_type: str = "Q4_1") -> str:
    """The runs whose ρ(α, ΔLoss) interval excludes 0 before the round trip and not after, or
    after and not before (``""`` when none): their verdict on ρ changes with 4-bit weights."""
    lost, gained = [], []
    for r in summary.itertuples():
        before = interval_side(r.rho_before_low, r.rho_before_high, 0.0) != "straddles"
        after = interval_side(r.rho_after_low, r.rho_after_high, 0.0) != "straddles"
        if before != after:
            (lost if before else gained).append(str(r.model))
    if not lost and not gained:
        return ""
    parts = ([f"on {fmt_list(lost)} ρ's interval excludes zero with the float32 weights but includes it after the "
              f"{quant_type} round trip"] if lost else [])
    parts += ([f"on {fmt_list(gained)} ρ's interval includes zero with the float32 weights but excludes it after "
               f"the {quant_type} round trip"] if gained else [])
    return (f" Yet {'; '.join(parts)}. So where ρ's interval ends this close to zero, rounding the weights to 4 bits "
            f"is enough to change whether ρ is told apart from zero; the same holds for a SmolLM2 ρ whose interval "
            f"ends near zero.")


def _quant_shown(summary: pd.DataFrame, quant_type: str) -> pd.DataFrame:
    """The per-run table of the 4-bit comparison, one row per run, as the page shows it."""
    columns = ["run", "largest α change (matrix)", "ρ(α before, α after)", "loss change (nats)",
               "blocks whose ΔLoss moved", "ρ(α, ΔLoss) float32", f"ρ(α, ΔLoss) {quant_type}", "ρ change"]
    rows = [[r.model, f"{fmt_num(r.alpha_max_change, 2, signed=True)} (block {r.alpha_max_layer}, {r.alpha_max_role})",
             fmt_interval(r.alpha_rho, r.alpha_rho_low, r.alpha_rho_high),
             fmt_interval(r.base_loss_change, r.base_loss_change_low, r.base_loss_change_high, signed=True),
             f"{r.n_blocks_moved} of {r.n_blocks}",
             fmt_interval(r.rho_before, r.rho_before_low, r.rho_before_high),
             fmt_interval(r.rho_after, r.rho_after_low, r.rho_after_high),
             fmt_interval(r.rho_change, r.rho_change_low, r.rho_change_high, signed=True)]
            for r in summary.itertuples()]
    return pd.DataFrame(rows, columns=columns)


def pooled_text(pooled: pd.DataFrame, rho_runs: pd.DataFrame) -> str:
    """Each depth's ρ pooled over its runs, ``"depth 8 (2 runs): ρ = …"``; a depth with one run
    has nothing to pool, so it shows that run's own ρ, interval and p (``rho_by_run``'s row, not
    the pooling's, which is computed another way), named as one run."""
    parts = []
    for r in pooled.itertuples():
        if r.depth == "all":
            continue
        runs = rho_runs[rho_runs["depth"] == int(r.depth)]
        if int(r.n_runs) == 1 and len(runs) == 1:
            one = runs.iloc[0]
            parts.append(f"depth {r.depth} (one run, seed {int(one['seed'])}, nothing to pool): "
                         f"{fmt_rho(one['rho'], one['ci_low'], one['ci_high'], one['p_value'])}")
        else:
            parts.append(f"depth {r.depth} (pooled over {plural(int(r.n_runs), 'run')}): "
                         f"{fmt_rho(r.rho, r.ci_low, r.ci_high, r.p_value)}")
    return "; ".join(parts)


def agreement_shown(agreement: pd.DataFrame) -> pd.DataFrame:
    """``seed_agreement`` as the page shows it: for a depth with one seed, what compares seeds
    (``profile_rho``, ``same_costliest``, ``rho_spread``) is not applicable — NaN, never "True"
    or "0" as if two seeds had agreed."""
    shown = agreement.copy()
    one = shown["n_seeds"] < 2
    shown["same_costliest"] = shown["same_costliest"].astype(object).where(~one, np.nan)
    for column in ("profile_rho", "rho_spread"):
        shown[column] = shown[column].where(~one, np.nan)
    return shown


# How a page states the series' precision (TrainConfig.precision; the runs are scored as they trained)
TRAINING_PRECISION = {"fp32": "float32 (trained and scored; Methods, Training, says why not bfloat16 at these widths)",
                      "bf16": "bfloat16 autocast with float32 weights and optimizer state (scored in bfloat16)"}


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
        precision=TRAINING_PRECISION[config.precision],
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
        pooled_text=pooled_text(pooled, rho_runs),
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
        alpha_role: str = "weighted", quant_type: str | None = "Q4_1", out_dir: str = "results/depth_series", *,
        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> ChapterResult:
    """The chapter (see the module's docstring for its tables); ``summary.json`` holds one
    record per run with its ρ and interval, the pooled ρ per depth, and the per-run summary of
    the ``quant_type`` round trip (None: not measured)."""
    runs = train_series(depths, profile, seeds=seeds, progress=False, **(train_overrides or {}))  # no bars in pages
    series = series_summary(runs)
    history = series_history(runs)
    results = series_importance(runs, eval_tokens=eval_tokens, batch_size=batch_size, progress=False)
    frame = _with_run_columns(importance_frame(results, alpha_estimator, alpha_role), runs)
    windows = {r.label: r.windows for r in results}   # every ρ's interval resamples blocks and eval windows
    rho_runs = rho_by_run(frame, windows=windows, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    pooled = rho_pooled(frame, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    agreement = seed_agreement(frame, rho_runs)
    per_run = pd.concat([rho_table(r.ablation, r.alphas, estimators=list(SERIES_ESTIMATORS), roles=list(SERIES_ROLES),
                                   windows=r.windows, n_resamples=n_resamples, n_permutations=n_permutations,
                                   seed=seed)
                         .assign(depth=run.config.depth, seed=run.config.seed, model=r.label)
                         for r, run in zip(results, runs)], ignore_index=True)
    if quant_type is None:
        quant = dict(summary=pd.DataFrame(columns=["model", "depth", "seed", *QUANT_SUMMARY_COLUMNS]),
                     blocks=pd.DataFrame(), matrices=pd.DataFrame())
    else:  # the unquantised ablation is the one above, read from the loss store
        quant = series_quantization(runs, quant_type=quant_type, eval_tokens=eval_tokens, batch_size=batch_size,
                                    alpha_estimator=alpha_estimator, alpha_role=alpha_role, n_resamples=n_resamples,
                                    n_permutations=n_permutations, seed=seed)
    config = runs[0].config
    numbers = _numbers(profile, series, frame, rho_runs, pooled, agreement, config, alpha_role, alpha_estimator)
    numbers.update(quant_type=str(quant_type), quant_text=quantization_text(quant["summary"], str(quant_type)))
    record = dict(profile=profile, corpus=str(config.corpus), depths=sorted({int(d) for d in series["depth"]}),
                  eval_tokens=eval_tokens, alpha_estimator=alpha_estimator, alpha_role=alpha_role,
                  runs=[dict(depth=int(row.depth), seed=int(row.seed), parameters=int(row.parameters),
                             total_seconds=float(row.total_seconds), snapshot_fraction=float(row.snapshot_fraction),
                             final_heldout_loss=float(row.final_heldout_loss),
                             late_improvement=float(row.late_improvement),
                             **rho_runs.iloc[i][["rho", "ci_low", "ci_high", "p_value"]].astype(float).to_dict())
                        for i, row in enumerate(series.itertuples())],
                  pooled=pooled.to_dict("records"), quant_type=quant_type,
                  quantization=quant["summary"].to_dict("records"))
    tables = dict(series=series, history=history, importance=frame, rho=per_run, rho_runs=rho_runs,
                  rho_pooled=pooled, seed_agreement=agreement_shown(agreement), quant_summary=quant["summary"],
                  quant_blocks=quant["blocks"], quant_matrices=quant["matrices"])
    out = save(out_dir, tables, record)
    wide = per_run.pivot_table(index=["estimator", "role"], columns=["depth", "seed"], values="rho").round(2)
    wide.columns = [f"ρ, D{d} s{s}" for d, s in wide.columns]
    titles = {r.model: f"{r.model}: {fmt_rho(r.rho, r.ci_low, r.ci_high)}" for r in rho_runs.itertuples()}
    return ChapterResult(dict(tables, rho_wide=wide.reset_index(), runs_shown=_shown_runs(series),
                              quant_shown=_quant_shown(quant["summary"], str(quant_type))), numbers, record,
                         out, extra=dict(titles=titles, alpha_title=f"{alpha_role} {alpha_estimator}"))
