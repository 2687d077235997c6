"""The task_accuracy chapter: does a pruned and healed model still answer?

Protocol. The healing chapter's arms, at its largest k: each strategy plans its removals on
the calibration windows (``zones.pruning.plan_arms``; ``random_protected`` once per
seed), and each removal set is healed by the healing chapter's first method with its budget
(``zones.pruning.heal``, the same call: the healed weights come from the cache the healing
chapter filled). The full model and every healed model then answer the same examples of
zones' offline multiple-choice tasks (``zones.measure.tasks``: the first ``limit`` examples of
each), scored by lm-evaluation-harness on lm-eval's own wrapper of the model; an example is
right when the true continuation has the highest log-likelihood per byte (lm-eval's
``acc_norm``, :data:`DEFAULT_METRIC`; ``metric="acc"`` takes the summed log-likelihood).

Evidence. One paired bootstrap over examples (``zones.analysis.accuracy.accuracy_intervals``, on
``zones.measure.bootstrap.paired_bootstrap``; every variant answered the same examples) gives every
interval of the chapter: the accuracy of each
variant (the median over seeds for ``random_protected``), per task and over all the chapter's
examples; the difference of each strategy from the full model; and the difference between
every two strategies.

Beside every paired difference of two variants that each ran once (not the median over seeds),
the exact McNemar test (``zones.analysis.paired.mcnemar_exact``): ``b`` examples only the first
answers right, ``c`` only the second, and the exact two-sided p of b among the b + c
discordant examples. With few discordant examples the bootstrap interval is too narrow (7
against 1 of 40 examples: interval [+0.02, +0.28], exact p = 0.070); the exact test decides.

Verdict (``zones.report.verdicts.score_task_accuracy``, its rule written there once): d =
accuracy(zone-aware) − accuracy(Last-N keeping the last block), both healed, over all the
chapter's examples; holds if d > 0 and the exact McNemar p < 0.05, does not hold if d < 0 and
p < 0.05, inconclusive (examples) otherwise. The power of that rule at the chapter's number of
examples, for a true difference of :data:`POWER_EFFECT` at the observed discordance
(``zones.analysis.paired.mcnemar_power``), is reported beside it, with the examples other
budgets would give (``zones.analysis.accuracy.power_table``). The scorecard reads the chapter's verdict table.

The chapter also checks lm-eval against zones (:func:`zones.measure.tasks.loglik_agreement`):
lm-eval's log-likelihood of every choice of the first few examples against zones' own loss
routine on the same tokens, and reports the largest difference.
"""
from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from zones.analysis.accuracy import ALL, FULL, accuracy_intervals, power_rate, power_table
from zones.analysis.unit_intervals import interval_side
from zones.analysis.paired import mcnemar_power
from zones.core.adapters import get_adapter
from zones.core.checks import check_models
from zones.core.data import corpus_windows, load_corpus
from zones.core.glossary import default
from zones.core.models import load_model
from zones.core.progress import bars_shown
from zones.measure.bootstrap import N_RESAMPLES
from zones.measure.tasks import check_tasks, evaluate_tasks, loglik_agreement
from zones.pruning import (
    DEFAULT_CALIBRATION_TOKENS,
    PruningContext,
    canonical_removed,
    check_strategy_names,
    plan_arms,
)
from zones.pruning.heal import DEFAULT_BRIDGES, DEFAULT_LR, DEFAULT_RANK, METHODS, heal
from zones.report.common import ChapterResult, save
from zones.report.format import fmt_interval, fmt_list, fmt_num, fmt_p, plural, seeds_phrase
from zones.report.verdicts import LAST_N_KEEP_LAST, OURS, score_task_accuracy
from zones.spectra import alpha_table

REFERENCE = LAST_N_KEEP_LAST    # Last-N as practitioners use it: the final block stays
# the healing chapter's arms, so that its healed models are read from the cache, not healed again
DEFAULT_STRATEGIES = tuple(default("strategies", context="task_accuracy"))
DEFAULT_K = tuple(default("k_values"))
CHAPTER_DTYPE = default("dtype", context="task_accuracy")   # the chapter's scoring precision
DEFAULT_SEEDS = default("seeds", context="task_accuracy")
DEFAULT_METHOD = default("method", context="task_accuracy")
DEFAULT_HEAL_TOKENS = default("heal_tokens", context="task_accuracy")
DEFAULT_TASKS = tuple(default("tasks", context="task_accuracy"))
DEFAULT_LIMIT = default("limit", context="task_accuracy")  # examples per task: 200 in all give the exact test power 0.88 for +0.10 (Methods)
# lm-eval's acc_norm: the choice with the highest log-likelihood per byte. The distractors' lengths
# differ from the answer's by up to 25%, which plain acc (summed log-likelihood) rewards or punishes:
# on SmolLM2-135M's first 50 next-sentence examples acc is 0.40, acc_norm 0.58.
DEFAULT_METRIC = default("metric", context="task_accuracy")
AGREEMENT_EXAMPLES = default("agreement_examples")  # examples whose every choice is scored by lm-eval and by zones
POWER_EFFECT = 0.10              # the true accuracy difference the chapter's power is stated for
POWER_SIZES = (40, 100, 200, 400, 1000)   # numbers of examples the power table sets beside the chapter's own
VERDICT_COLUMNS = ["model", "k", "method", "difference", "difference_low", "difference_high", "n", "b", "c",
                   "p_exact", "discordance", "power", "power_effect", "verdict", "reason"]


def verdict_table(between: pd.DataFrame, model: str, k: int, method: str) -> pd.DataFrame:
    """One row, :data:`VERDICT_COLUMNS` (:func:`score_task_accuracy` of zone-aware − Last-N over
    all examples: ``b`` examples only zone-aware answers right, ``c`` only Last-N, ``p_exact``
    the exact McNemar p; the bootstrap interval of d beside them; ``power`` of the rule at ``n``
    for a true difference of ``power_effect`` at ``discordance``, ``zones.analysis.accuracy.power_rate``), or none
    when the chapter did not run both."""
    pair = between[(between["task"] == ALL) & between["strategy"].isin([OURS, REFERENCE])
                   & between["reference"].isin([OURS, REFERENCE])]
    if pair.empty:
        return pd.DataFrame([], columns=VERDICT_COLUMNS)
    r = pair.iloc[0]
    sign = 1.0 if r["strategy"] == OURS else -1.0   # d is always zone-aware − Last-N
    d, lo, hi = sign * r["difference"], *sorted((sign * r["difference_low"], sign * r["difference_high"]))
    b, c = (r["b"], r["c"]) if sign > 0 else (r["c"], r["b"])
    n = int(r["n"])
    verdict = score_task_accuracy(b, c, n_examples=n, effect=POWER_EFFECT)
    rate = power_rate(b, c, n, POWER_EFFECT) if np.isfinite([b, c]).all() else np.nan
    power = mcnemar_power(POWER_EFFECT, rate, n) if np.isfinite(rate) else np.nan
    return pd.DataFrame([dict(model=model, k=int(k), method=method, difference=d, difference_low=lo,
                              difference_high=hi, n=n, b=b, c=c, p_exact=r["p_exact"], discordance=rate,
                              power=power, power_effect=POWER_EFFECT, verdict=str(verdict), reason=verdict.reason)],
                        columns=VERDICT_COLUMNS)


# --------------------------------------------------------------------------------------------
# Sentences
# --------------------------------------------------------------------------------------------

def _acc(est, low, high, signed: bool = False) -> str:
    return fmt_interval(est, low, high, signed=signed)


def _exact(b, c, p) -> str:
    """The exact test beside an interval: ``"7 vs 1, p = 0.070"`` (``""`` without counts)."""
    return f"{int(b)} vs {int(c)}, {fmt_p(p)}" if np.isfinite([b, c, p]).all() else ""


def findings(accuracy: pd.DataFrame, versus_full: pd.DataFrame, between: pd.DataFrame,
             verdicts: pd.DataFrame) -> dict[str, Any]:
    """The numbers and sentences the page glues."""
    out: dict[str, Any] = {}
    pooled = accuracy[accuracy["task"] == ALL]
    for r in pooled.to_dict("records"):
        out[f"acc_{r['strategy']}"] = _acc(r["accuracy"], r["accuracy_low"], r["accuracy_high"])
    if len(pooled):
        out["n_examples"] = int(pooled["n"].iloc[0])
        out["half_width"] = fmt_num(float((pooled["accuracy_high"] - pooled["accuracy_low"]).median() / 2), 2)
    worse = versus_full[(versus_full["task"] == ALL) & (versus_full["difference_high"] < 0)]
    out["n_below_full"] = int(len(worse))
    out["n_strategies"] = int(versus_full[versus_full["task"] == ALL]["strategy"].nunique())
    separable = between[(between["task"] == ALL) & ((between["difference_low"] > 0) | (between["difference_high"] < 0))]
    out["separable_pairs"] = ("; ".join(f"{r['strategy']} − {r['reference']} = "
                                        f"{_acc(r['difference'], r['difference_low'], r['difference_high'], True)}"
                                        for r in separable.to_dict("records")) or "none")
    if len(verdicts):
        v = verdicts.iloc[0]
        out["verdict"] = str(v["verdict"])
        phrase = {"holds": "holds", "does not hold": "does not hold"}.get(v["verdict"], "is inconclusive at this budget")
        interval = fmt_interval(None, v["difference_low"], v["difference_high"], signed=True)
        exact = (f"{plural(int(v['b']), 'example')} only {OURS} answered right against {int(v['c'])} only {REFERENCE}, "
                 f"{fmt_p(v['p_exact'])}" if np.isfinite([v["b"], v["c"]]).all() else "not run")
        out["verdict_text"] = (f"at k = {int(v['k'])} after {v['method']} healing, d = "
                               f"{fmt_num(v['difference'], 2, signed=True)} on {int(v['n'])} examples, bootstrap "
                               f"interval {interval}; the exact McNemar test, which decides: {exact}, so the claim "
                               f"{phrase}")
        out.update(power_numbers(v))
        out["power_text"] = power_sentence(str(v["verdict"]), float(v["power"]), float(v["power_effect"]))
    else:
        out["verdict"], out["verdict_text"] = "not measured", f"not measured ({OURS} and {REFERENCE} not both run)"
        out.update(power_numbers(dict(b=np.nan, c=np.nan, n=0, power_effect=POWER_EFFECT)),
                   power_text=power_sentence("not measured", np.nan))
    return out


CHANCE = 0.25   # four choices per question


def chance_text(accuracy: pd.DataFrame, task: str = ALL, chance: float = CHANCE) -> str:
    """Which variants answer ``task`` better than chance, judged by their intervals (rule: better
    when the interval's lower end lies above ``chance``, worse when its upper end lies below it,
    not shown otherwise), as one sentence."""
    rows = accuracy[accuracy["task"] == task]
    groups = {"above": [], "below": [], "straddles": [], "undefined": []}
    for r in rows.itertuples():
        groups[interval_side(r.accuracy_low, r.accuracy_high, chance)].append(
            f"{r.strategy} ({_acc(r.accuracy, r.accuracy_low, r.accuracy_high)})")
    parts = []
    if groups["above"]:
        parts.append(f"better than chance by their intervals: {fmt_list(groups['above'])}")
    if groups["straddles"] + groups["undefined"]:
        parts.append(f"not shown to beat chance (the interval includes {fmt_num(chance, 2)}): "
                     f"{fmt_list(groups['straddles'] + groups['undefined'])}")
    if groups["below"]:
        parts.append(f"worse than chance: {fmt_list(groups['below'])}")
    if not parts:
        return "No variant was scored on these examples."
    text = "; ".join(parts)
    return text[0].upper() + text[1:] + "."


POWER_ENOUGH = 0.8   # the power at which an inconclusive verdict starts to say something


def power_sentence(verdict: str, power: float, effect: float = POWER_EFFECT) -> str:
    """What the power says beside the verdict it stands next to (rule: a verdict that holds or
    does not hold is decided whatever the power; an inconclusive one says little when the power
    is under :data:`POWER_ENOUGH`, and at or above it is some evidence against a true difference
    as large as ``effect``; without the test, no power)."""
    if not np.isfinite(power):
        return "The power is not computed: the exact test was not run."
    shown, size = fmt_num(power, 2), fmt_num(effect, 2, signed=True)
    if verdict in ("holds", "does not hold"):
        return (f"The verdict ({verdict}) is decided by the exact test; the power says only how often a true "
                f"difference of {size} would have been detected at this budget: {shown}.")
    if power < POWER_ENOUGH:
        return (f"An inconclusive verdict at a power this low ({shown}) says little about the claim; set `limit` "
                f"for a power near {fmt_num(POWER_ENOUGH, 1)} or more.")
    return (f"At a power of {shown} a true difference of {size} would usually have been detected, so this "
            f"inconclusive verdict is some evidence against a difference that large.")


def power_numbers(verdict: Mapping[str, Any], sizes: Sequence[int] = POWER_SIZES) -> dict[str, Any]:
    """The glued numbers of the exact test and its power, from a row of :func:`verdict_table`:
    ``exact_b``, ``exact_c``, ``p_exact``, ``discordance``, ``power_effect``, ``power`` (at the chapter's
    examples) and ``power_sizes_text`` (the power at each of ``sizes``)."""
    b, c, n = verdict["b"], verdict["c"], int(verdict["n"])
    if not np.isfinite([b, c]).all():
        return dict(exact_b="n/a", exact_c="n/a", p_exact="n/a", discordance="n/a", power="n/a", power_sizes_text="n/a",
                    power_effect=fmt_num(verdict["power_effect"], 2, signed=True))
    table = power_table(verdict["discordance"], sizes, verdict["power_effect"])
    return dict(exact_b=int(b), exact_c=int(c), p_exact=fmt_p(verdict["p_exact"]).removeprefix("p = "),
                discordance=fmt_num(verdict["discordance"], 2), power=fmt_num(verdict["power"], 2),
                power_effect=fmt_num(verdict["power_effect"], 2, signed=True),
                power_sizes_text="; ".join(f"{m:,} examples: {fmt_num(p, 2)}"
                                           for m, p in zip(table["n_examples"], table["power"]) if m != n))


# --------------------------------------------------------------------------------------------
# The chapter
# --------------------------------------------------------------------------------------------

def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256,
        calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS, heal_tokens: int = DEFAULT_HEAL_TOKENS,
        k_values: Sequence[int] = DEFAULT_K, seeds: int = DEFAULT_SEEDS,
        strategies: Sequence[str] = DEFAULT_STRATEGIES, method: str = DEFAULT_METHOD,
        tasks: Sequence[str] = DEFAULT_TASKS, limit: int = DEFAULT_LIMIT, batch_size: int = 8,
        dtype: str = CHAPTER_DTYPE, lr: float = DEFAULT_LR, rank: int = DEFAULT_RANK, bridges: str = DEFAULT_BRIDGES,
        metric: str = DEFAULT_METRIC, agreement_examples: int = AGREEMENT_EXAMPLES, n_resamples: int = N_RESAMPLES,
        out_dir: str = "results/task_accuracy", *, progress: bool | None = None) -> ChapterResult:
    """The chapter: plan, heal (from the healing chapter's cache), answer → ``arms.csv``,
    ``tasks.csv`` (lm-eval's table of every variant), ``examples.csv`` (every answer),
    ``accuracy.csv``, ``versus_full.csv``, ``between.csv`` (``zones.analysis.accuracy.accuracy_intervals``),
    ``verdict.csv`` (:func:`verdict_table`), ``power.csv`` (``zones.analysis.accuracy.power_table``: the rule's power
    at the chapter's examples and at :data:`POWER_SIZES`), ``agreement.csv`` (lm-eval against
    zones) and ``summary.json``. ``bridges``: the healing chapter's (one d×d bridge per pruned
    model, the default). The defaults are the healing chapter's; of its ``k_values`` this chapter
    takes the largest (the k of the healing chapter's verdict). ``models``: a list (or one model);
    this chapter evaluates the first."""
    started = time.time()
    model = check_models(models)[0]
    strategies = check_strategy_names(strategies)
    tasks = check_tasks(tasks)
    k = max(int(v) for v in k_values)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}; got {method!r}")
    progress = bars_shown(progress)
    loaded = load_model(model)
    text = load_corpus(corpus)
    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    heal_windows = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", heal_tokens)
    ctx = PruningContext(loaded.model, calibration, alpha=alpha_table(loaded.model), batch_size=batch_size,
                         progress=progress)
    arms = plan_arms(ctx, strategies, [int(k)], seeds)
    common = dict(limit=limit, batch_size=batch_size, dtype=dtype, model_name=model)
    answering = time.time()
    results = [evaluate_tasks(loaded.model, loaded.tokenizer, tasks, fingerprint=loaded.fingerprint, **common)]
    answering = time.time() - answering
    healing_log = []
    for s in sorted({canonical_removed(r) for r in arms["removed"]}):
        removed = [int(b) for b in s.split(",")]
        healed = heal(loaded.model, removed, heal_windows, method=method, heal_tokens=heal_tokens, lr=lr, rank=rank,
                      bridges=bridges, progress=progress, fingerprint=loaded.fingerprint)
        started_answer = time.time()
        results.append(evaluate_tasks(healed.model, loaded.tokenizer, tasks, removed=s, **common))
        answering += time.time() - started_answer
        healing_log.append(dict(removed=s, method=method, from_cache=healed.from_cache,
                                calibration_before=healed.calibration_before,
                                calibration_after=healed.calibration_after))
        del healed
    table = pd.concat([r.table for r in results], ignore_index=True)
    examples = pd.concat([r.examples for r in results], ignore_index=True)
    found = accuracy_intervals(examples, arms.assign(removed=arms["removed"].map(canonical_removed)), tasks,
                               metric=metric, n_resamples=n_resamples)
    verdicts = verdict_table(found["between"], model, k, method)
    power = (power_table(float(verdicts["discordance"].iloc[0]), [*POWER_SIZES, int(verdicts["n"].iloc[0])],
                         POWER_EFFECT)
             if len(verdicts) and np.isfinite(verdicts["discordance"].iloc[0]) else
             pd.DataFrame(columns=["n_examples", "power"]))
    agreement = (loglik_agreement(loaded.model, loaded.tokenizer, tasks[0], agreement_examples, batch_size)
                 if agreement_examples else pd.DataFrame())
    largest = float(agreement["difference"].abs().max()) if len(agreement) else float("nan")
    numbers = dict(findings(found["accuracy"], found["versus_full"], found["between"], verdicts),
                   model_name=model, n_blocks=get_adapter(loaded.model).n_blocks, k=int(k), method=method,
                   task_rule=score_task_accuracy.rule,
                   heal_tokens=heal_windows.n_scored_tokens, seeds=seeds, seeds_phrase=seeds_phrase(seeds), limit=limit, tasks=", ".join(tasks),
                   n_tasks=len(tasks), n_variants=len(results), n_healed_from_cache=sum(r["from_cache"] for r in healing_log),
                   agreement_n=int(len(agreement)), agreement_max=f"{largest:.1e}",
                   agreement_tokens=int(agreement["n_tokens"].sum()) if len(agreement) else 0,
                   seconds=float(round(time.time() - started, 1)), seconds_answering=float(round(answering, 1)))
    record = dict(numbers, corpus=corpus, seq_len=seq_len, strategies=list(strategies), dtype=dtype, metric=metric,
                  calibration_tokens=calibration.n_scored_tokens, lr=lr, rank=rank, bridges=bridges,
                  agreement_max_nats=largest)
    tables = dict(arms=arms, tasks=table, examples=examples, healing=pd.DataFrame(healing_log), verdict=verdicts,
                  agreement=agreement, power=power, **found)
    out = save(out_dir, tables, record)
    shown = dict(accuracy_shown=shown_accuracy(found["accuracy"], strategies, tasks),
                 versus_shown=shown_differences(found["versus_full"], tasks),
                 between_shown=shown_differences(found["between"], tasks))
    return ChapterResult(dict(tables, **shown), numbers, record, out,
                         extra=dict(strategies=[FULL, *strategies], tasks=[ALL, *tasks]))


def shown_accuracy(accuracy: pd.DataFrame, strategies: Sequence[str], tasks: Sequence[str]) -> pd.DataFrame:
    """Accuracy with its interval as text: one row per variant, one column per task (and all)."""
    df = accuracy.assign(text=[_acc(a, b, c) for a, b, c in
                               zip(accuracy["accuracy"], accuracy["accuracy_low"], accuracy["accuracy_high"])])
    return df.pivot(index="strategy", columns="task", values="text").reindex(
        index=[FULL, *strategies], columns=[ALL, *tasks])


def shown_differences(differences: pd.DataFrame, tasks: Sequence[str]) -> pd.DataFrame:
    """Differences with their bootstrap intervals as text, and beside each the exact McNemar test
    where both variants ran once (``"+0.15 [+0.02, +0.28]; 7 vs 1, p = 0.070"``): one row per
    pair, one column per task (and all)."""
    texts = []
    for r in differences.to_dict("records"):
        exact = _exact(r["b"], r["c"], r["p_exact"])
        texts.append(_acc(r["difference"], r["difference_low"], r["difference_high"], True)
                     + (f"; {exact}" if exact else ""))
    df = differences.assign(pair=differences["strategy"] + " − " + differences["reference"], text=texts)
    return df.pivot(index="pair", columns="task", values="text").reindex(
        index=list(dict.fromkeys(df["pair"])), columns=[ALL, *tasks])
