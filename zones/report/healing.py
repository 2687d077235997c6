"""The healing chapter: does spectral-guided pruning still beat Last-N once the pruned model is healed?

Protocol. Each strategy plans its removals at every k of ``k_values`` on the calibration
windows (as in the pruning chapter; ``random_protected`` once per seed). Every removal set is
then healed by each method of ``methods`` (``zones.pruning.heal``: the closed-form linear ``bridge``,
or ``lora``) with the same budget of ``heal_tokens`` calibration tokens, and scored on the
same eval windows, which neither planning nor healing ever sees, before and after healing.

Evidence. One paired bootstrap over eval windows (``zones.measure.stats.paired_bootstrap``) gives, from
the same resamples, every interval of the chapter: Δloss against the full model of each
strategy at each k before and after healing (the median over seeds for ``random_protected``),
the gain of healing (Δloss after − Δloss before), and the difference that the verdict reads.

Verdict (:func:`score_after_healing`, rule :data:`HEALING_RULE`): d = Δloss(Last-N keeping the
last block) − Δloss(zone-aware), both healed by the same method and budget, at the largest k;
holds if its 95% interval lies above 0; does not hold if it lies below 0; inconclusive
(budget) otherwise. :func:`healing_rows` turns the chapter's tables into rows of the claims
scorecard.
"""
from __future__ import annotations

import os
import time
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from zones.core.adapters import get_adapter
from zones.core.checks import check_models
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import load_model
from zones.figures import BOOK_MODE_ENV
from zones.measure.evaluate import evaluate_loss, evaluate_removals
from zones.measure.stats import paired_bootstrap
from zones.pruning import DEFAULT_CALIBRATION_TOKENS, PruningContext, check_strategy_names, format_removed, get_strategy
from zones.pruning.heal import DEFAULT_LR, DEFAULT_RANK, METHODS, heal
from zones.report.common import ChapterResult, interval_side, save
from zones.report.format import fmt_interval, fmt_num
from zones.report.verdicts import BUDGET, OURS, Verdict, interval_text, side_verdict
from zones.spectra import alpha_table

REFERENCE = "last_n_keep_last"   # Last-N as practitioners (and Lu et al.) use it: the final block stays
DEFAULT_STRATEGIES = (OURS, REFERENCE, "greedy", "random_protected")
DEFAULT_K = (4, 8)
DEFAULT_SEEDS = 2
DEFAULT_METHODS = ("bridge",)
DEFAULT_EVAL_TOKENS = 6 * 255
DEFAULT_HEAL_TOKENS = 4 * 255
PRUNED = "pruned"                # the stage before healing
CLAIM = "spectral-guided pruning beats Last-N after healing"
HEALING_RULE = ("d = Δloss(Last-N keeping the last block) − Δloss(zone-aware), both healed by the same method "
                "and token budget, at the largest k, on the same eval windows; holds if its 95% interval lies "
                "above 0; does not hold if it lies below 0; inconclusive otherwise")
PAPER = "1.1×–3.6× lower ΔPPL than Last-N (before healing; the paper does not heal)"


def score_after_healing(low: float, high: float) -> Verdict:
    """The verdict of :data:`HEALING_RULE` from the 95% interval of d = Δloss(Last-N keeping the
    last block) − Δloss(zone-aware) after healing: ``holds`` if it lies above 0 (zone-aware's
    healed model is better), ``does not hold`` if below 0, inconclusive (budget) otherwise."""
    return side_verdict(interval_side(low, high, 0.0), "above", BUDGET)


# --------------------------------------------------------------------------------------------
# Plans, scores and intervals
# --------------------------------------------------------------------------------------------

def plan_arms(ctx: PruningContext, strategies: Sequence[str], k_values: Sequence[int], seeds: int) -> pd.DataFrame:
    """``strategy, seed, k, removed`` (``removed``: blocks in the strategy's order)."""
    rows = []
    for name in strategies:
        strategy = get_strategy(name)
        for seed in range(seeds if strategy.seeded else 1):
            plans = strategy.plan(ctx, max(k_values), seed)
            rows += [dict(strategy=name, seed=seed, k=int(k), removed=format_removed(plans[k - 1])) for k in k_values]
    return pd.DataFrame(rows, columns=["strategy", "seed", "k", "removed"])


def _set(removed: str) -> str:
    return format_removed(sorted(int(b) for b in str(removed).split(",") if b.strip()))


def interval_tables(arms: pd.DataFrame, window_losses: pd.DataFrame, stages: Sequence[str], *,
                    reference: str = REFERENCE, ours: str = OURS) -> dict[str, pd.DataFrame]:
    """Every interval of the chapter from one paired bootstrap over the eval windows.

    ``window_losses``: ``stage, removed, window, nll, n_tokens`` (``stage`` ``"full"`` for the
    full model, :data:`PRUNED` before healing, else the healing method). Returns

    * ``delta``: ``strategy, k, stage, delta_loss, delta_loss_low, delta_loss_high, delta_ppl,
      n_seeds`` (Δloss in nats against the full model; the median over seeds);
    * ``gain``: ``strategy, k, method, gain, gain_low, gain_high`` (Δloss after − before;
      negative: healing helped);
    * ``comparison``: ``k, stage, reference, ours, difference, difference_low,
      difference_high, winner`` (difference = Δloss(reference) − Δloss(ours); winner is the
      strategy whose interval side it is on, or ``"neither"``).
    """
    full = window_losses[window_losses["stage"] == "full"].sort_values("window")
    tokens = full["n_tokens"].to_numpy(dtype=np.float64)
    pivot = window_losses[window_losses["stage"] != "full"].pivot_table(
        index=["stage", "removed"], columns="window", values="nll")
    keys = list(pivot.index)
    data = np.vstack([full["nll"].to_numpy()[None], pivot.to_numpy()])
    row = {key: i + 1 for i, key in enumerate(keys)}
    groups, labels = [], []
    for (strategy, k), part in arms.groupby(["strategy", "k"], sort=False):
        for stage in stages:
            groups.append([row[(stage, _set(r))] for r in part["removed"]])
            labels.append(("delta", strategy, int(k), stage, len(part)))
    index = {label[1:4]: i for i, label in enumerate(labels)}
    pairs = []
    for (strategy, k, stage, _), i in ((label[1:], i) for i, label in enumerate(labels)):
        if stage != PRUNED:
            pairs.append((("gain", strategy, k, stage), i, index[(strategy, k, PRUNED)]))
    for k in sorted(arms["k"].unique()):
        for stage in stages:
            if (reference, int(k), stage) in index and (ours, int(k), stage) in index:
                pairs.append((("comparison", None, int(k), stage), index[(reference, int(k), stage)],
                              index[(ours, int(k), stage)]))

    def statistic(nll, n):
        # (variants, [resamples,] windows): the resamples sit between variants and windows
        loss = nll.sum(-1) / n.sum(-1)                       # (variants, [resamples])
        delta = loss[1:] - loss[:1]
        medians = np.stack([np.median(delta[[g - 1 for g in group]], axis=0) for group in groups])
        diffs = np.stack([medians[a] - medians[b] for _, a, b in pairs]) if pairs else medians[:0]
        return np.concatenate([medians, diffs])

    interval = paired_bootstrap(statistic, (data, np.broadcast_to(tokens, data.shape)))
    est, low, high = interval.estimate, interval.low, interval.high
    base = float(full["nll"].sum() / tokens.sum())
    delta = pd.DataFrame([dict(strategy=s, k=k, stage=stage, delta_loss=est[i], delta_loss_low=low[i],
                               delta_loss_high=high[i], delta_ppl=float(np.exp(base + est[i]) - np.exp(base)),
                               n_seeds=n) for i, (_, s, k, stage, n) in enumerate(labels)])
    offset = len(labels)
    gain = pd.DataFrame([dict(strategy=s, k=k, method=stage, gain=est[offset + j], gain_low=low[offset + j],
                              gain_high=high[offset + j])
                         for j, ((kind, s, k, stage), _, _) in enumerate(pairs) if kind == "gain"],
                        columns=["strategy", "k", "method", "gain", "gain_low", "gain_high"])
    comparison = []
    for j, ((kind, _, k, stage), _, _) in enumerate(pairs):
        if kind != "comparison":
            continue
        side = interval_side(low[offset + j], high[offset + j], 0.0)
        comparison.append(dict(k=k, stage=stage, reference=reference, ours=ours, difference=est[offset + j],
                               difference_low=low[offset + j], difference_high=high[offset + j],
                               winner={"above": ours, "below": reference}.get(side, "neither")))
    comparison = pd.DataFrame(comparison, columns=["k", "stage", "reference", "ours", "difference",
                                                   "difference_low", "difference_high", "winner"])
    return dict(delta=delta, gain=gain, comparison=comparison)


def verdict_table(comparison: pd.DataFrame, methods: Sequence[str], model: str, corpus: str) -> pd.DataFrame:
    """One row per healing method at the largest k: ``model, corpus, method, k, difference,
    difference_low, difference_high, verdict, reason`` (:func:`score_after_healing`)."""
    rows = []
    if comparison.empty:
        return pd.DataFrame(rows, columns=["model", "corpus", "method", "k", "difference", "difference_low",
                                           "difference_high", "verdict", "reason"])
    k_max = int(comparison["k"].max())
    for method in methods:
        r = comparison[(comparison["k"] == k_max) & (comparison["stage"] == method)]
        if r.empty:
            continue
        r = r.iloc[0]
        verdict = score_after_healing(float(r["difference_low"]), float(r["difference_high"]))
        rows.append(dict(model=model, corpus=corpus, method=method, k=k_max, difference=float(r["difference"]),
                         difference_low=float(r["difference_low"]), difference_high=float(r["difference_high"]),
                         verdict=str(verdict), reason=verdict.reason))
    return pd.DataFrame(rows)


def healing_rows(tables: Mapping[str, Mapping[str, Any]]) -> list[dict]:
    """Rows of the claims scorecard (``ours, interval, model, corpus, chapter, verdict``) from
    ``claims.load_tables``' dict: one per healing method, read from ``healing/verdict.csv``;
    ``[]`` when the chapter did not run."""
    found = tables.get("healing", {})
    if "verdict" not in found:
        return []
    rows = []
    for r in found["verdict"].to_dict("records"):
        verdict = score_after_healing(float(r["difference_low"]), float(r["difference_high"]))
        ours = (f"Δloss({REFERENCE}) − Δloss({OURS}) after {r['method']} healing at k = {int(r['k'])}: "
                f"{fmt_num(r['difference'], 3, signed=True)} nats")
        rows.append(dict(ours=ours, interval=interval_text(r["difference_low"], r["difference_high"]),
                         model=str(r["model"]), corpus=str(r["corpus"]), chapter="healing", verdict=verdict))
    return rows


# --------------------------------------------------------------------------------------------
# Sentences
# --------------------------------------------------------------------------------------------

def _nats(est, low, high) -> str:
    return fmt_interval(est, low, high, unit="nats", signed=True)


def findings(delta: pd.DataFrame, gain: pd.DataFrame, comparison: pd.DataFrame, verdicts: pd.DataFrame,
             methods: Sequence[str]) -> dict[str, Any]:
    """The numbers and sentences the page glues."""
    out: dict[str, Any] = {}
    k_max = int(delta["k"].max())
    for stage in [PRUNED, *methods]:
        for strategy in delta["strategy"].unique():
            r = delta[(delta["strategy"] == strategy) & (delta["k"] == k_max) & (delta["stage"] == stage)]
            if len(r):
                r = r.iloc[0]
                out[f"dloss_{strategy}_{stage}_kmax"] = _nats(r["delta_loss"], r["delta_loss_low"],
                                                              r["delta_loss_high"])
    texts: list[str] = []
    for stage in [PRUNED, *methods]:
        part = comparison[comparison["stage"] == stage].sort_values("k")
        said = "; ".join(f"k = {int(r['k'])}: d = {_nats(r['difference'], r['difference_low'], r['difference_high'])}"
                         f" ({'neither separable' if r['winner'] == 'neither' else r['winner'] + ' ahead'})"
                         for r in part.to_dict("records"))
        out[f"comparison_{stage}_text"] = said or "not measured"
        if stage != PRUNED:
            texts.append(f"{stage}: {said or 'not measured'}")
    out["comparison_healed_text"] = "; ".join(texts) or "not measured"
    helped = gain[gain["gain_high"] < 0]
    out["n_helped"] = int(len(helped))
    out["n_healed"] = int(len(gain))
    if len(verdicts):
        v = verdicts.iloc[0]
        out["verdict"] = str(v["verdict"])
        phrase = {"holds": "holds", "does not hold": "does not hold"}.get(v["verdict"], "is inconclusive at this budget")
        out["verdict_text"] = (f"at k = {int(v['k'])} after {v['method']} healing, d = "
                               f"{_nats(v['difference'], v['difference_low'], v['difference_high'])}: the claim "
                               f"{phrase}")
    else:
        out["verdict"], out["verdict_text"] = "not measured", "not measured (no healing method ran)"
    return out


# --------------------------------------------------------------------------------------------
# The chapter
# --------------------------------------------------------------------------------------------

def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256,
        eval_tokens: int = DEFAULT_EVAL_TOKENS, calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS,
        heal_tokens: int = DEFAULT_HEAL_TOKENS, k_values: Sequence[int] = DEFAULT_K, seeds: int = DEFAULT_SEEDS,
        strategies: Sequence[str] = DEFAULT_STRATEGIES, methods: Sequence[str] = DEFAULT_METHODS,
        batch_size: int = 8, lr: float = DEFAULT_LR, rank: int = DEFAULT_RANK, out_dir: str = "results/healing", *,
        progress: bool | None = None) -> ChapterResult:
    """The chapter: plan, heal, score → ``arms.csv`` (strategy, seed, k, removed), ``window_losses.csv``
    (per stage, removal set and eval window), ``delta.csv``, ``gain.csv``, ``comparison.csv``
    (:func:`interval_tables`), ``verdict.csv`` (:func:`verdict_table`), ``healing.csv`` (the
    calibration loss before and after each healing) and ``summary.json``. ``models``: a list (or
    one model); this chapter shows the first in detail."""
    started = time.time()
    model = check_models(models)[0]
    strategies = check_strategy_names(strategies)
    missing = [s for s in (OURS, REFERENCE) if s not in strategies]
    if missing:
        raise ValueError(f"the healing chapter compares {OURS} with {REFERENCE}; add {missing} to strategies")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty list of {METHODS}; got {list(methods)}")
    k_values = sorted({int(k) for k in k_values})
    progress = os.environ.get(BOOK_MODE_ENV) != "1" if progress is None else progress
    loaded = load_model(model)
    text = load_corpus(corpus)
    eval_windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    heal_windows = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", heal_tokens)
    ctx = PruningContext(loaded.model, calibration, alpha=alpha_table(loaded.model), batch_size=batch_size,
                         progress=progress)
    arms = plan_arms(ctx, strategies, k_values, seeds)
    sets = sorted({_set(r) for r in arms["removed"]})
    as_list = lambda s: [int(b) for b in s.split(",")]  # noqa: E731
    scored = evaluate_removals(loaded.model, eval_windows, [[]] + [as_list(s) for s in sets],
                               batch_size=batch_size, progress=progress, desc="scoring before healing")
    n_tok = eval_windows.seq_len - 1
    long = [dict(stage="full", removed="", window=w, nll=float(v), n_tokens=n_tok)
            for w, v in enumerate(scored[0].window_nll)]
    long += [dict(stage=PRUNED, removed=s, window=w, nll=float(v), n_tokens=n_tok)
             for s, result in zip(sets, scored[1:]) for w, v in enumerate(result.window_nll)]
    healing_log = []
    for method in methods:
        for s in sets:
            healed = heal(loaded.model, as_list(s), heal_windows, method=method, tokens=heal_tokens, lr=lr, rank=rank,
                          progress=progress, fingerprint=loaded.fingerprint)
            result = evaluate_loss(healed.model, eval_windows, batch_size)
            long += [dict(stage=method, removed=s, window=w, nll=float(v), n_tokens=n_tok)
                     for w, v in enumerate(result.window_nll)]
            healing_log.append(dict(method=method, removed=s, calibration_before=healed.calibration_before,
                                    calibration_after=healed.calibration_after, notes="; ".join(healed.notes)))
            del healed
    window_losses = pd.DataFrame(long)
    stages = [PRUNED, *methods]
    found = interval_tables(arms, window_losses, stages)
    verdicts = verdict_table(found["comparison"], methods, model, corpus)
    numbers = dict(findings(found["delta"], found["gain"], found["comparison"], verdicts, methods),
                   model_name=model, n_blocks=get_adapter(loaded.model).n_blocks,
                   base_loss=fmt_num(scored[0].loss, 4), n_windows=eval_windows.n_windows,
                   n_tokens=eval_windows.n_scored_tokens, heal_tokens=heal_windows.n_scored_tokens,
                   calibration_tokens=calibration.n_scored_tokens, k_values=", ".join(map(str, k_values)),
                   k_max=max(k_values), seeds=seeds, methods=", ".join(methods),
                   seconds=float(round(time.time() - started, 1)))
    record = dict(numbers, corpus=corpus, seq_len=seq_len, strategies=list(strategies), methods=list(methods),
                  lr=lr, rank=rank)
    tables = dict(arms=arms, window_losses=window_losses, healing=pd.DataFrame(healing_log),
                  verdict=verdicts, **found)
    out = save(out_dir, tables, record)
    shown = dict(delta_shown=shown_delta(found["delta"], strategies, stages),
                 gain_shown=shown_gain(found["gain"], strategies))
    return ChapterResult(dict(tables, **shown), numbers, record, out,
                         extra=dict(stages=stages, strategies=list(strategies)))


def shown_delta(delta: pd.DataFrame, strategies: Sequence[str], stages: Sequence[str]) -> pd.DataFrame:
    """Δloss with its interval as text: one row per strategy, one column per (k, stage)."""
    df = delta.assign(text=[_nats(a, b, c) for a, b, c in
                            zip(delta["delta_loss"], delta["delta_loss_low"], delta["delta_loss_high"])],
                      column=[f"k = {k}, {stage}" for k, stage in zip(delta["k"], delta["stage"])])
    columns = [f"k = {k}, {stage}" for k in sorted(delta["k"].unique()) for stage in stages]
    return df.pivot(index="strategy", columns="column", values="text").reindex(index=list(strategies),
                                                                              columns=columns)


def shown_gain(gain: pd.DataFrame, strategies: Sequence[str]) -> pd.DataFrame:
    """The gain of healing with its interval as text: one row per strategy, one column per (k, method)."""
    df = gain.assign(text=[_nats(a, b, c) for a, b, c in zip(gain["gain"], gain["gain_low"], gain["gain_high"])],
                     column=[f"k = {k}, {m}" for k, m in zip(gain["k"], gain["method"])])
    columns = list(dict.fromkeys(f"k = {k}, {m}" for k, m in sorted(zip(gain["k"], gain["method"]))))
    return df.pivot(index="strategy", columns="column", values="text").reindex(index=list(strategies),
                                                                              columns=columns)
