"""The healing chapter: does spectral-guided pruning still beat Last-N once the pruned model is healed?

Protocol. Each strategy plans its removals at every k of ``k_values`` on the calibration
windows (as in the pruning chapter; ``random_protected`` once per seed). Every removal set is
then healed by each method of ``methods`` (``zones.pruning.heal``: the closed-form linear ``bridge``,
or ``lora``) with the same budget of ``heal_tokens`` calibration tokens, and scored on the
same eval windows, which neither planning nor healing ever sees, before and after healing.

Matched repair. Every strategy gets the same repair capacity: with ``bridges="one"`` (the
default) one bridge of d × d parameters per pruned model, in the MLP of its last kept block,
fitted on the same calibration tokens to pull the pruned model's last hidden state towards the
full model's, whether its removals are contiguous (Last-N) or scattered (zone-aware); LoRA is
matched already (the same rank on every projection of the L − k kept blocks).
``bridges="per_span"`` fits one bridge per removed span instead (unequal capacity: k scattered
removals get up to k bridges, a contiguous run one), and the page says so. ``healing.csv``
records each healed model's trainable parameters, and :func:`capacity_text` states them.

Evidence. One paired bootstrap over eval windows (``zones.measure.bootstrap.paired_bootstrap``) gives, from
the same resamples, every interval of the chapter: Δloss against the full model of each
strategy at each k before and after healing (the median over seeds for ``random_protected``),
the gain of healing (Δloss after − Δloss before), and the difference that the verdict reads.

The intervals are ``zones.pruning.compare.healing_intervals``'. Verdict: the rule of
``zones.report.verdicts.score_after_healing`` (its words: ``score_after_healing.rule``), which
the claims scorecard applies to ``verdict.csv`` too.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import pandas as pd

from zones.core.adapters import get_adapter
from zones.core.checks import check_choice, check_models
from zones.core.data import corpus_windows, load_corpus
from zones.core.glossary import default
from zones.core.models import load_model
from zones.core.progress import bars_shown
from zones.measure.scoring import evaluate_loss, evaluate_removals
from zones.measure.subject import as_subject
from zones.pruning import (
    DEFAULT_CALIBRATION_TOKENS,
    PruningContext,
    canonical_removed,
    check_strategy_names,
    plan_arms,
)
from zones.pruning.compare import PRUNED, healing_intervals
from zones.pruning.heal import BRIDGES, DEFAULT_BRIDGES, DEFAULT_LR, DEFAULT_RANK, METHODS, heal
from zones.report.common import ChapterResult, precision_text, save
from zones.report.format import fmt_int, fmt_interval, fmt_num, seeds_phrase
from zones.analysis.unit_intervals import interval_side
from zones.report.verdicts import LAST_N_KEEP_LAST, OURS, score_after_healing
from zones.spectra import alpha_table

REFERENCE = LAST_N_KEEP_LAST   # Last-N as practitioners (and Lu et al.) use it: the final block stays
DEFAULT_STRATEGIES = tuple(default("strategies", context="healing"))
DEFAULT_K = tuple(default("k_values"))
DEFAULT_SEEDS = default("seeds", context="healing")
DEFAULT_METHODS = tuple(default("methods"))
DEFAULT_EVAL_TOKENS = default("eval_tokens", context="healing")   # the eval set's first batch: the pruning chapter's sets there are read, not scored
DEFAULT_HEAL_TOKENS = default("heal_tokens", context="healing")
DEFAULT_HOLDOUT_TOKENS = default("heal_holdout_tokens", context="healing")
DEFAULT_DTYPE = default("dtype", context="healing")   # the chapter's scoring precision (bench_book_precision holds it)


# --------------------------------------------------------------------------------------------
# Plans, scores and intervals
# --------------------------------------------------------------------------------------------

VERDICT_COLUMNS = ["model", "corpus", "method", "k", "difference", "difference_low", "difference_high", "ks", "by_k",
                   "verdict", "reason"]


def verdict_table(comparison: pd.DataFrame, methods: Sequence[str], model: str, corpus: str) -> pd.DataFrame:
    """One row per healing method, over every k (``zones.report.verdicts.score_after_healing``):
    ``model, corpus, method``; ``k, difference, difference_low, difference_high``: the k that
    decided (the first where zone-aware trails, else the first not separable, else the k with
    the smallest lower bound) and d there; ``ks`` (every k), ``by_k`` (d at every k, in words),
    ``verdict, reason``."""
    rows = []
    for method in methods:
        part = comparison[comparison["stage"] == method].sort_values("k") if not comparison.empty else comparison
        if part.empty:
            continue
        by_k = {int(r.k): (float(r.difference_low), float(r.difference_high)) for r in part.itertuples()}
        differences = {int(r.k): float(r.difference) for r in part.itertuples()}
        verdict = score_after_healing(by_k, differences=differences)
        sides = {k: interval_side(low, high, 0.0) for k, (low, high) in by_k.items()}
        deciding = next((k for k, side in sides.items() if side == "below"),
                        next((k for k, side in sides.items() if side != "above"),
                             min(by_k, key=lambda k: by_k[k][0])))
        r = part[part["k"] == deciding].iloc[0]
        words = "; ".join(f"k = {k}: {fmt_interval(differences[k], *by_k[k], signed=True)}" for k in by_k)
        rows.append(dict(model=model, corpus=corpus, method=method, k=deciding, difference=float(r["difference"]),
                         difference_low=float(r["difference_low"]), difference_high=float(r["difference_high"]),
                         ks=",".join(map(str, by_k)), by_k=words, verdict=str(verdict), reason=verdict.why))
    return pd.DataFrame(rows, columns=VERDICT_COLUMNS)


# --------------------------------------------------------------------------------------------
# Sentences
# --------------------------------------------------------------------------------------------

def capacity_text(healing_log: pd.DataFrame, bridges: str, hidden_size: int, heal_tokens: int,
                  rank: int = DEFAULT_RANK) -> str:
    """The repair every arm got, in words, from ``healing.csv`` (``method, parameters`` per healed
    model): for the bridge with ``bridges="one"`` "every strategy gets one bridge of d×d
    parameters fitted on the same N calibration tokens", with ``"per_span"`` the range of
    parameters per model (unequal capacity), for LoRA its parameters per model (matched when every
    arm has the same)."""
    parts = []
    tokens = fmt_int(heal_tokens)
    for method, rows in healing_log.groupby("method", sort=False):
        counts = sorted({int(n) for n in rows["parameters"]})
        same = len(counts) == 1
        if method == "bridge" and bridges == "one" and same:
            parts.append(f"every strategy gets one bridge of d×d parameters (d = {hidden_size}: "
                         f"{fmt_int(hidden_size ** 2)}) fitted on the same {tokens} calibration tokens")
        elif method == "bridge":
            parts.append(f"per-span bridges, unequal capacity: one d×d bridge per removed span (d = {hidden_size}), "
                         f"from {fmt_int(counts[0])} to {fmt_int(counts[-1])} parameters per pruned model, fitted on "
                         f"the same {tokens} calibration tokens")
        else:
            spread = fmt_int(counts[0]) if same else f"from {fmt_int(counts[0])} to {fmt_int(counts[-1])}"
            parts.append(f"LoRA of rank {rank} on every projection of every kept block: {spread} trainable "
                         f"parameters per pruned model{' for every strategy' if same else ''}, on the same "
                         f"{tokens} calibration tokens")
    return "; ".join(parts) or "no healing ran"


def held_out_text(healing_log: pd.DataFrame, holdout_tokens: int) -> str:
    """Whether the repair fitted its own tokens, in words, from ``healing.csv`` (``method,
    held_out_before, held_out_after`` per healed model): how many healed models' loss on the
    calibration tokens no healing saw fell, and the largest change."""
    parts = []
    for method, rows in healing_log.groupby("method", sort=False):
        rise = rows["held_out_after"] - rows["held_out_before"]
        worst = rise.idxmax()
        fell = int((rise < 0).sum())
        change = f"{float(rise[worst]):+.3f} nats ({rows.loc[worst, 'held_out_before']:.3f} → " \
                 f"{rows.loc[worst, 'held_out_after']:.3f})"
        if fell == len(rows):
            smallest = f"{-float(rise[worst]):.3f} nats ({rows.loc[worst, 'held_out_before']:.3f} → " \
                       f"{rows.loc[worst, 'held_out_after']:.3f})"
            parts.append(f"{method}: the loss on {fmt_int(holdout_tokens)} held-out calibration tokens fell for all "
                         f"{len(rows)} healed models (the smallest fall {smallest})")
        else:
            parts.append(f"{method}: the loss on {fmt_int(holdout_tokens)} held-out calibration tokens rose for "
                         f"{len(rows) - fell} of the {len(rows)} healed models (the largest rise {change}): the "
                         f"repair fitted its own calibration tokens, so heal on more")
    return "; ".join(parts) or "no healing ran"


def findings(delta: pd.DataFrame, gain: pd.DataFrame, comparison: pd.DataFrame, verdicts: pd.DataFrame,
             methods: Sequence[str], bridges: str = DEFAULT_BRIDGES) -> dict[str, Any]:
    """The numbers and sentences the page glues (with ``bridges="per_span"`` the verdict says
    that the bridges' capacity was unequal)."""
    out: dict[str, Any] = {}
    k_max = int(delta["k"].max())
    for stage in [PRUNED, *methods]:
        for strategy in delta["strategy"].unique():
            r = delta[(delta["strategy"] == strategy) & (delta["k"] == k_max) & (delta["stage"] == stage)]
            if len(r):
                r = r.iloc[0]
                out[f"dloss_{strategy}_{stage}_kmax"] = fmt_interval(r["delta_loss"], r["delta_loss_low"],
                                                                     r["delta_loss_high"], unit="nats", signed=True)
    texts: list[str] = []
    for stage in [PRUNED, *methods]:
        parts = []
        for r in comparison[comparison["stage"] == stage].sort_values("k").to_dict("records"):
            d = fmt_interval(r["difference"], r["difference_low"], r["difference_high"], unit="nats", signed=True)
            ahead = "neither separable" if r["winner"] == "neither" else r["winner"] + " ahead"
            parts.append(f"k = {int(r['k'])}: d = {d} ({ahead})")
        said = "; ".join(parts)
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
        phrase = {"holds": "holds", "does not hold": "does not hold"}.get(
            v["verdict"], "is inconclusive at this budget (the interval resamples eval windows)")
        d = fmt_interval(v["difference"], v["difference_low"], v["difference_high"], unit="nats", signed=True)
        unequal = " (per-span bridges: unequal capacity)" if v["method"] == "bridge" and bridges == "per_span" else ""
        out["verdict_text"] = (f"after {v['method']} healing{unequal}, d at every k ({v['by_k']} nats); it decided at "
                               f"k = {int(v['k'])}, d = {d}: the claim {phrase}")
    else:
        out["verdict"], out["verdict_text"] = "not measured", "not measured (no healing method ran)"
    return out


def damage_and_repair(delta: pd.DataFrame, gain: pd.DataFrame) -> tuple[pd.DataFrame, str, str]:
    """Each arm's Δloss before healing beside the gain of healing (after − before: the more
    negative, the more healing repaired), and at the largest k the most damaged arm and the most
    repaired one (the lowest gain, not the highest)."""
    pruned = delta[delta["stage"] == PRUNED][["strategy", "k", "delta_loss"]]
    table = pruned.merge(gain, on=["strategy", "k"]).sort_values(["method", "k", "delta_loss"], ignore_index=True)
    largest = table[table["k"] == table["k"].max()]
    return (table, str(largest.loc[largest["delta_loss"].idxmax(), "strategy"]),
            str(largest.loc[largest["gain"].idxmin(), "strategy"]))


# --------------------------------------------------------------------------------------------
# The chapter
# --------------------------------------------------------------------------------------------

def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256,
        eval_tokens: int = DEFAULT_EVAL_TOKENS, calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS,
        heal_tokens: int = DEFAULT_HEAL_TOKENS, heal_holdout_tokens: int = DEFAULT_HOLDOUT_TOKENS, k_values: Sequence[int] = DEFAULT_K, seeds: int = DEFAULT_SEEDS,
        strategies: Sequence[str] = DEFAULT_STRATEGIES, methods: Sequence[str] = DEFAULT_METHODS,
        batch_size: int = 8, lr: float = DEFAULT_LR, rank: int = DEFAULT_RANK, bridges: str = DEFAULT_BRIDGES,
        out_dir: str = "results/healing", *, dtype: str = DEFAULT_DTYPE, progress: bool | None = None) -> ChapterResult:
    """The chapter: plan, heal, score → ``arms.csv`` (strategy, seed, k, removed), ``window_losses.csv``
    (per stage, removal set and eval window), ``delta.csv``, ``gain.csv``, ``comparison.csv``
    (``zones.pruning.compare.healing_intervals``), ``verdict.csv`` (:func:`verdict_table`), ``healing.csv`` (the
    calibration loss before and after each healing, on its own tokens and on ``heal_holdout_tokens`` held-out
    calibration tokens it never saw, and the repair's trainable parameters) and ``summary.json``.
    ``bridges``: ``"one"`` (matched: one d×d bridge per pruned model) or ``"per_span"`` (unequal
    capacity; ``zones.pruning.heal``). ``models``: a list (or
    one model); this chapter shows the first in detail. ``dtype``: the scoring precision of the
    planning and of every loss (the healing itself runs in float32); every loss is read from, or
    kept in, the per-window loss store, so the pruning chapter's sets on the same eval batches are
    not scored again."""
    started = time.time()
    model = check_models(models)[0]
    strategies = check_strategy_names(strategies)
    missing = [s for s in (OURS, REFERENCE) if s not in strategies]
    if missing:
        raise ValueError(f"the healing chapter compares {OURS} with {REFERENCE}; add {missing} to strategies")
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        raise ValueError(f"methods must be a non-empty list of {METHODS}; got {list(methods)}")
    check_choice(bridges, "bridges", BRIDGES)
    k_values = sorted({int(k) for k in k_values})
    progress = bars_shown(progress)
    loaded = load_model(model)
    subject = as_subject(loaded.model, dtype, fingerprint=loaded.fingerprint)  # the model at the door
    text = load_corpus(corpus)
    eval_windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    # the first windows heal; the next ones (nested: the same whatever the budget) are held out to check the repair
    # (the heal windows are the task-accuracy chapter's and zones heal's: its healed models are reused)
    heal_windows = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", heal_tokens)
    held_out = corpus_windows(text, loaded.tokenizer, seq_len, "calibration",
                              heal_windows.n_scored_tokens + heal_holdout_tokens).take(heal_windows.n_windows)
    ctx = PruningContext(subject, calibration, alpha=alpha_table(loaded.model), batch_size=batch_size,
                         progress=progress)
    arms = plan_arms(ctx, strategies, k_values, seeds)
    sets = sorted({canonical_removed(r) for r in arms["removed"]})
    as_list = lambda s: [int(b) for b in s.split(",")]  # noqa: E731
    scored = evaluate_removals(subject, eval_windows, [[]] + [as_list(s) for s in sets], batch_size=batch_size,
                               progress=progress, desc="scoring before healing", cache=True)
    n_tok = eval_windows.seq_len - 1
    long = [dict(stage="full", removed="", window=w, nll=float(v), n_tokens=n_tok)
            for w, v in enumerate(scored[0].window_nll)]
    long += [dict(stage=PRUNED, removed=s, window=w, nll=float(v), n_tokens=n_tok)
             for s, result in zip(sets, scored[1:]) for w, v in enumerate(result.window_nll)]
    healing_log = []
    for method in methods:
        for s in sets:
            healed = heal(loaded.model, as_list(s), heal_windows, method=method, heal_tokens=heal_tokens, lr=lr, rank=rank,
                          bridges=bridges, progress=progress, fingerprint=loaded.fingerprint, held_out=held_out)
            result = evaluate_loss(healed.model, eval_windows, batch_size, dtype=subject.dtype, cache=True)
            long += [dict(stage=method, removed=s, window=w, nll=float(v), n_tokens=n_tok)
                     for w, v in enumerate(result.window_nll)]
            healing_log.append(dict(method=method, removed=s, calibration_before=healed.calibration_before,
                                    calibration_after=healed.calibration_after, held_out_before=healed.held_out_before,
                                    held_out_after=healed.held_out_after, parameters=healed.parameters,
                                    notes="; ".join(healed.notes)))
            del healed
    window_losses = pd.DataFrame(long)
    stages = [PRUNED, *methods]
    found = healing_intervals(arms, window_losses, stages, reference=REFERENCE, ours=OURS)
    verdicts = verdict_table(found["comparison"], methods, model, corpus)
    hidden_size = int(loaded.model.get_input_embeddings().embedding_dim)
    numbers = dict(findings(found["delta"], found["gain"], found["comparison"], verdicts, methods, bridges),
                   capacity_text=capacity_text(pd.DataFrame(healing_log), bridges, hidden_size,
                                               heal_windows.n_scored_tokens, rank),
                   held_out_text=held_out_text(pd.DataFrame(healing_log), held_out.n_scored_tokens),
                   held_out_tokens=held_out.n_scored_tokens, held_out_rose=int(sum(
                       r["held_out_after"] > r["held_out_before"] for r in healing_log)),
                   hidden_size=hidden_size, bridges=bridges,
                   model_name=model, n_blocks=get_adapter(loaded.model).n_blocks,
                   base_loss=fmt_num(scored[0].loss, 4), n_windows=eval_windows.n_windows,
                   n_tokens=eval_windows.n_scored_tokens, heal_tokens=heal_windows.n_scored_tokens,
                   calibration_tokens=calibration.n_scored_tokens, k_values=", ".join(map(str, k_values)),
                   k_max=max(k_values), seeds=seeds, methods=", ".join(methods),
                   seeds_phrase=seeds_phrase(seeds),
                   healing_rule=score_after_healing.rule,
                   precision=precision_text(dtype, subject.dtype),
                   seconds=float(round(time.time() - started, 1)))
    record = dict(numbers, corpus=corpus, seq_len=seq_len, strategies=list(strategies), methods=list(methods),
                  lr=lr, rank=rank, dtype=subject.dtype)
    tables = dict(arms=arms, window_losses=window_losses, healing=pd.DataFrame(healing_log),
                  verdict=verdicts, **found)
    out = save(out_dir, tables, record)
    shown = dict(delta_shown=shown_delta(found["delta"], strategies, stages),
                 gain_shown=shown_gain(found["gain"], strategies))
    return ChapterResult(dict(tables, **shown), numbers, record, out,
                         extra=dict(stages=stages, strategies=list(strategies)))


def shown_delta(delta: pd.DataFrame, strategies: Sequence[str], stages: Sequence[str]) -> pd.DataFrame:
    """Δloss with its interval as text: one row per strategy, one column per (k, stage)."""
    df = delta.assign(text=[fmt_interval(a, b, c, unit="nats", signed=True) for a, b, c in
                            zip(delta["delta_loss"], delta["delta_loss_low"], delta["delta_loss_high"])],
                      column=[f"k = {k}, {stage}" for k, stage in zip(delta["k"], delta["stage"])])
    columns = [f"k = {k}, {stage}" for k in sorted(delta["k"].unique()) for stage in stages]
    return df.pivot(index="strategy", columns="column", values="text").reindex(index=list(strategies),
                                                                              columns=columns)


def shown_gain(gain: pd.DataFrame, strategies: Sequence[str]) -> pd.DataFrame:
    """The gain of healing with its interval as text: one row per strategy, one column per (k, method)."""
    df = gain.assign(text=[fmt_interval(a, b, c, unit="nats", signed=True)
                           for a, b, c in zip(gain["gain"], gain["gain_low"], gain["gain_high"])],
                     column=[f"k = {k}, {m}" for k, m in zip(gain["k"], gain["method"])])
    columns = list(dict.fromkeys(f"k = {k}, {m}" for k, m in sorted(zip(gain["k"], gain["method"]))))
    return df.pivot(index="strategy", columns="column", values="text").reindex(index=list(strategies),
                                                                              columns=columns)
