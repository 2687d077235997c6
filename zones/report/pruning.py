"""The depth-pruning chapter: every strategy's cost of removing k blocks, compared with
paired intervals, and the sentences the page states.

The tables come from ``zones.pruning`` (``pruning_sweep``, ``summarize_pruning``,
``pairwise_differences``, ``best_sets``, ``compare_strategies``); this module decides what may
be said about them. The rules, each applied by the function named:

* a strategy is *ahead* of another at k only where the paired interval of their Δloss
  difference excludes 0, *behind* where it excludes 0 the other way, and otherwise *not
  separable* (:func:`standing`);
* "best at k" is the set of strategies not separable from the lowest Δloss
  (``zones.pruning.best_sets``), never a single name where intervals overlap
  (:func:`best_text`);
* a ratio ΔPPL(a) / ΔPPL(b) is quoted as a number only when its status is ``ratio``; a
  ``collapsed`` comparison is named as such (:func:`ratio_text`);
* the paper's claim (zone-aware beats Last-N by 1.1×–3.6×) is scored by the scorecard's rules,
  its direction and its magnitude apart (``zones.report.verdicts.score_ratio_direction`` and
  ``score_ratio_magnitude``), so the chapter and the scorecard agree;
* wherever a reference is separably ahead of zone-aware, the page says so (:func:`behind_text`);
* how much of zone-aware's advantage over Last-N (keeping the last block) protection and
  spreading achieve without α is the share of ``zones.pruning.compare.gain_share``, quoted as a
  number only where zone-aware's gain is separably above zero, and read against 0 and 1 by
  where its interval lies (:func:`share_text`).
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd

from zones.analysis.unit_intervals import interval_side
from zones.core.checks import check_models
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import load_model, output_vocabulary
from zones.core.progress import bars_shown
from zones.measure.subject import as_subject
from zones.pruning import (
    COLLAPSE_RATIO,
    DEFAULT_CALIBRATION_TOKENS,
    DEFAULT_DTYPE,
    DEFAULT_EVAL_TOKENS,
    DEFAULT_SEEDS,
    DEFAULT_STRATEGIES,
    RECIPE_ABLATIONS,
    STRATEGIES,
    PruningContext,
    alpha_zones,
    best_sets,
    pairwise_differences,
    pruning_sweep,
    summarize_pruning,
)
from zones.pruning.compare import (
    CROSSES,
    SHARE_COLUMNS,
    SHARE_KS,
    gain_share,
    read_crossover,
    reference_comparisons,
    worst_best_gaps,
)
from zones.report.common import NAN, ChapterResult, precision_text, save
from zones.report.format import fmt_interval, fmt_list, fmt_num, fmt_ratio, plural, seeds_phrase
from zones.report.verdicts import (
    FAILS,
    HOLDS,
    OURS,
    PAPER_RATIO,
    score_ratio_direction,
    score_ratio_magnitude,
    strict_ratio_magnitude,
    verdict_phrase,
)
from zones.spectra import alpha_table

REFERENCES = ("last_n", "last_n_keep_last", "random", "random_protected")   # compared with ours, in this order
SHARE_REFERENCE = "last_n_keep_last"                       # the Last-N whose gap to ours is shared out
SHARE_BASELINES = ("protect_spread", "protect_spread_random")   # protection and spreading, without α


# --- tables ------------------------------------------------------------------------------------------

def interval_table(summary: pd.DataFrame, strategies: Sequence[str], value: str = "delta_loss") -> pd.DataFrame:
    """Strategies (rows) × k (columns), each cell ``"0.19 [0.12, 0.27]"`` (``value`` with its
    interval; ``value="delta_ppl"`` for ΔPPL). For the page; the CSV keeps the numbers. The
    interval's comma is followed by a no-break space, so a narrow column wraps a cell only
    between the estimate and its interval (every k stays visible at a desktop width)."""
    df = summary[summary["strategy"].isin(strategies)].copy()
    df["cell"] = [fmt_interval(v, lo, hi).replace(", ", ",\u00a0") for v, lo, hi in
                  zip(df[value], df[f"{value}_low"], df[f"{value}_high"])]
    wide = df.pivot(index="strategy", columns="k", values="cell")
    wide.columns = [f"k = {k}" for k in wide.columns]
    return wide.loc[[s for s in strategies if s in wide.index]]


def column_chunks(table: pd.DataFrame, size: int = 4) -> list[pd.DataFrame]:
    """``table`` cut into tables of at most ``size`` columns each (all rows, the same index), so
    a strategies × k table of intervals fits the article column at a desktop width (k = 1–4,
    then 5–8) instead of hiding its last columns behind a scroll bar."""
    columns = list(table.columns)
    return [table[columns[i:i + size]] for i in range(0, len(columns), size)] or [table]


def pairwise_matrix(pairwise: pd.DataFrame, k: int, strategies: Sequence[str]) -> pd.DataFrame:
    """At ``k``: row a, column b holds Δloss(a) − Δloss(b) with its interval (nats); ``*``
    marks a separable difference (interval excludes 0). For the page."""
    at = pairwise[pairwise["k"] == k]
    names = [s for s in strategies if s in set(at["strategy_a"]) | set(at["strategy_b"])]
    cells = pd.DataFrame("", index=names, columns=names)
    for r in at.itertuples():
        if r.strategy_a not in cells.index or r.strategy_b not in cells.index:
            continue
        mark = " *" if r.separable else ""
        cells.loc[r.strategy_a, r.strategy_b] = fmt_interval(r.diff, r.diff_low, r.diff_high, signed=True) + mark
        cells.loc[r.strategy_b, r.strategy_a] = fmt_interval(-r.diff, -r.diff_high, -r.diff_low, signed=True) + mark
    return cells


def share_table(shares: pd.DataFrame) -> pd.DataFrame:
    """The share table for the page: per k and baseline, ours' gain over the reference, the
    baseline's, and the share, each with its interval (no number where the gain may be zero)."""
    rows = []
    for r in shares.itertuples():
        rows.append({"k": int(r.k), "baseline": r.baseline,
                     f"Δloss({r.reference}) − Δloss({r.ours}) (nats)": fmt_interval(r.gain, r.gain_low, r.gain_high),
                     f"Δloss({r.reference}) − Δloss(baseline) (nats)": fmt_interval(
                         r.baseline_gain, r.baseline_gain_low, r.baseline_gain_high),
                     "share": fmt_interval(r.share, r.share_low, r.share_high) if r.status == "share" else "no number"})
    return pd.DataFrame(rows)


# --- the rules and the sentences ------------------------------------------------------------------------

def standing(pairwise: pd.DataFrame, k: int, ours: str, other: str) -> tuple[str, float, float, float]:
    """``(word, diff, low, high)``: Δloss(ours) − Δloss(other) at k with its interval, and
    ``"ahead"`` (interval below 0), ``"behind"`` (above 0), ``"same blocks"`` (a zero-width
    interval at 0), ``"not separable"`` (it includes 0) or ``"undefined"``."""
    at = pairwise[pairwise["k"] == k]
    row = at[(at["strategy_a"] == ours) & (at["strategy_b"] == other)]
    sign = 1.0
    if row.empty:
        row, sign = at[(at["strategy_a"] == other) & (at["strategy_b"] == ours)], -1.0
    if row.empty:
        return "undefined", NAN, NAN, NAN
    r = row.iloc[0]
    diff, low, high = sign * float(r["diff"]), *sorted((sign * float(r["diff_low"]), sign * float(r["diff_high"])))
    if not (np.isfinite(low) and np.isfinite(high)):
        return "undefined", diff, low, high
    if low == high == 0:
        return "same blocks", diff, low, high
    return ("ahead" if high < 0 else "behind" if low > 0 else "not separable"), diff, low, high


def ratio_text(row) -> str:
    """One comparison row (of :func:`comparisons` or ``compare_strategies``) in words: the
    ratio with its interval, or why there is no ratio to quote."""
    numerator = row["reference"] if "reference" in row else row["numerator"]
    denominator = row["ours"] if "ours" in row else row["denominator"]
    if row["status"] == "ratio":
        return f"ΔPPL ratio {fmt_interval(row['ratio'], row['ratio_low'], row['ratio_high'])}"
    if row["status"] == "collapsed":
        if row["ratio"] > COLLAPSE_RATIO:
            return f"{numerator} collapsed (ratio {fmt_ratio(row['ratio'], cap=COLLAPSE_RATIO)})"
        return f"{denominator}'s ΔPPL is not separable from 0, so the ratio is unbounded"
    return "no ratio (a ΔPPL is not positive)"


def crossover_text(comparison: pd.DataFrame, ours: str = OURS, comparator: str = "last_n") -> str:
    """Where ``ours`` is separably ahead of ``comparator`` (``winner`` of ``compare_strategies``,
    which needs the Δloss difference's interval to exclude 0), in words. Whether it crosses over
    is ``zones.pruning.compare.read_crossover``'s decision, the rule the scorecard's
    ``score_crossover`` applies too: a tie after ``comparator``'s last win does not move the k
    from which ``ours`` is ahead."""
    c = comparison.sort_values("k")
    k_max = int(c["k"].max())
    found = read_crossover(dict(zip(c["k"], c["winner"])), ours, comparator)
    ahead, behind, tied = found.ahead, found.behind, found.tied
    ks = lambda values: ", ".join(map(str, values))
    if found.status == CROSSES:
        between = [k for k in tied if k > found.ahead_from]
        return (f"{ours} is separably ahead of {comparator} from k = {found.ahead_from} up to k = {k_max}"
                + (f" (not separable from it at k = {ks(between)}, but never behind)" if between else "")
                + ", and behind or not separable before")
    if len(ahead) == len(c):
        return f"{ours} is separably ahead of {comparator} at every k from 1 to {k_max}: there is no crossover"
    if len(behind) == len(c):
        return f"{ours} is separably behind {comparator} at every k from 1 to {k_max}: there is no crossover"
    if len(tied) == len(c):
        return (f"{ours} and {comparator} are not separable at any k from 1 to {k_max}: no crossover can be "
                f"claimed")
    parts = [f"separably ahead of {comparator} at k = {ks(ahead)}" if ahead else "",
             f"behind it at k = {ks(behind)}" if behind else "",
             f"not separable from it at k = {ks(tied)}" if tied else ""]
    return f"{ours} is " + ", ".join(p for p in parts if p) + f": no lasting crossover ({found.why})"


def claim_text(comparison: pd.DataFrame, k_max: int, comparator: str = "last_n") -> str:
    """The paper's headline claim at k_max, scored by the scorecard's two rules: the direction
    (the ratio's interval above 1) and the magnitude (inside the paper's 1.1–3.6×)."""
    rows = comparison[(comparison["reference"] == comparator) & (comparison["k"] == k_max)]
    if rows.empty:
        return f"The claim cannot be scored: {comparator} was not run."
    row = rows.iloc[0]
    direction = score_ratio_direction(row["ratio_low"], row["ratio_high"])
    magnitude = score_ratio_magnitude(row["ratio_low"], row["ratio_high"], ratio=row["ratio"])
    lo, hi = PAPER_RATIO
    said = verdict_phrase(magnitude) + (f" ({magnitude.why})" if magnitude in (HOLDS, FAILS) and magnitude.why else "")
    return (f"Against {comparator} at k = {k_max}: {ratio_text(row)}. By the scorecard's rules, the claim that "
            f"zone-aware removes blocks more cheaply {verdict_phrase(direction)} (the ratio's interval above 1), and "
            f"the claim that it does so by the paper's {lo}×–{hi}× {said}: the ratio at or above {lo} with its "
            f"interval above 1; by the strict reading (the whole interval inside [{lo}, {hi}]) it "
            f"{verdict_phrase(strict_ratio_magnitude(row['ratio_low'], row['ratio_high']))}.")


def behind_text(comparison: pd.DataFrame, ours: str = OURS) -> str:
    """Every k at which a reference is separably ahead of ``ours`` (``winner`` of the
    comparison), with the ratio ΔPPL(reference) / ΔPPL(ours) and its interval: below 1, the
    reference removed blocks more cheaply. Empty comparisons say that no reference was."""
    parts = []
    for reference, part in comparison.groupby("reference", sort=False):
        won = part[part["winner"] == reference].sort_values("k")
        if won.empty:
            continue
        cells = ", ".join(f"k = {int(r.k)} ({fmt_interval(r.ratio, r.ratio_low, r.ratio_high)}×)"
                          if r.status == "ratio" else f"k = {int(r.k)}" for r in won.itertuples())
        parts.append(f"{reference} at {cells}")
    if not parts:
        return f"No reference strategy is separably ahead of {ours} at any k."
    return (f"Where a reference is separably ahead of {ours} (its paired Δloss interval lies below {ours}'s; "
            f"in brackets the ratio ΔPPL(reference) / ΔPPL({ours}), below 1): " + "; ".join(parts) + ".")


def best_text(best: pd.DataFrame, ours: str = OURS) -> str:
    """``"k = 1: {a, b}; k = 2: {c}"``: per k, the strategies not separable from the best."""
    parts = [f"k = {int(r.k)}: {{{', '.join(str(r.best_set).split(','))}}}" for r in best.itertuples()]
    inside = [int(r.k) for r in best.itertuples() if ours in str(r.best_set).split(",")]
    where = (f"{ours} is in the set at k = {', '.join(map(str, inside))}" if inside
             else f"{ours} is in none of them")
    return "; ".join(parts) + f". {where}."


def baseline_text(pairwise: pd.DataFrame, k: int, compared: Sequence[str], ours: str = OURS) -> str:
    """At k, which strategies ``ours`` is separably ahead of, behind, or not separable from."""
    groups: dict[str, list[str]] = {"ahead": [], "behind": [], "not separable": [], "same blocks": []}
    for other in compared:
        if other == ours:
            continue
        word, diff, low, high = standing(pairwise, k, ours, other)
        if word == "same blocks":
            groups[word].append(other)
            continue
        key = "not separable" if word == "undefined" else word
        groups[key].append(f"{other} ({fmt_interval(diff, low, high, signed=True)} nats)")
    parts = []
    if groups["ahead"]:
        parts.append(f"separably ahead of {', '.join(groups['ahead'])}")
    if groups["behind"]:
        parts.append(f"separably behind {', '.join(groups['behind'])}")
    if groups["not separable"]:
        parts.append(f"not separable from {', '.join(groups['not separable'])}")
    if groups["same blocks"]:
        parts.append(f"removes the same blocks as {', '.join(groups['same blocks'])}")
    return (f"At k = {k}, {ours} is " + "; ".join(parts) +
            f" (each: Δloss of {ours} minus the other's, with its paired 95% interval).")


def standings(pairwise: pd.DataFrame, ours: str, other: str) -> dict[str, list[int]]:
    """Every k at which ``ours`` and ``other`` were both scored, grouped by :func:`standing`'s word."""
    ks = sorted({int(k) for k in pairwise["k"]})
    grouped: dict[str, list[int]] = {}
    for k in ks:
        word = standing(pairwise, k, ours, other)[0]
        if word != "undefined":
            grouped.setdefault(word, []).append(k)
    return grouped


def _ks(ks: Sequence[int]) -> str:
    return "k = " + fmt_list(ks)


def recipe_text(pairwise: pd.DataFrame, k: int, recipe: Sequence[str], ours: str = OURS) -> str:
    """What dropping each rule of the recipe does at k: Δloss(variant) − Δloss(ours). A variant
    that removes the same blocks as ours at every k is said to change nothing on this model."""
    effects = []
    for variant in recipe:
        word, diff, low, high = standing(pairwise, k, variant, ours)
        if word == "undefined":
            continue
        meaning = {"ahead": "better than the full recipe", "behind": "worse than the full recipe",
                   "same blocks": "the same blocks", "not separable": "not separable from the full recipe"}[word]
        grouped = standings(pairwise, variant, ours)
        if word == "same blocks" and list(grouped) == ["same blocks"] and len(grouped["same blocks"]) > 1:
            ks = grouped["same blocks"]
            meaning = f"the same blocks at every k ({ks[0]}–{ks[-1]}): dropping this rule changes nothing on this model"
        shown = "" if word == "same blocks" else f"{fmt_interval(diff, low, high, signed=True)} nats, "
        effects.append(f"{variant}: {shown}{meaning}")
    return f"At k = {k}: " + "; ".join(effects) + "." if effects else ""


def without_alpha_text(pairwise: pd.DataFrame, baselines: Sequence[str], ours: str = OURS) -> str:
    """Ours against each baseline that protects and spreads without α, at every k: where ours is
    separably ahead, separably behind, not separable, or removes the same blocks."""
    words = {"ahead": "separably ahead", "behind": "separably behind", "not separable": "not separable",
             "same blocks": "the same blocks"}
    parts = []
    for other in baselines:
        grouped = standings(pairwise, ours, other)
        if grouped:
            said = "; ".join(f"{words[w]} at {_ks(grouped[w])}" for w in words if w in grouped)
            parts.append(f"against {other}, {ours} is {said}")
    return ("At every k (Δloss of each, paired 95% interval): " + "; ".join(parts) + ".") if parts else ""


MIN_SPREAD_SEEDS = 5   # fewer seeds give no interquartile range worth printing (2 seeds: its ends are not the seeds)


def seeds_text(summary: pd.DataFrame, k: int, seeded: Sequence[str] = ("random", "random_protected")) -> str:
    """Each seeded strategy at k: its median Δloss over seeds (the statistic every comparison
    decides by), the ΔPPL at that median, and the interquartile range of the seeds' ΔPPL."""
    parts = []
    for name in seeded:
        row = summary[(summary["strategy"] == name) & (summary["k"] == k)]
        if row.empty:
            continue
        r = row.iloc[0]
        dloss = fmt_interval(r["delta_loss"], r["delta_loss_low"], r["delta_loss_high"], unit="nats")
        n = int(r["n_seeds"])
        spread = (f"interquartile range of ΔPPL over its {n} seeds {fmt_num(r['delta_ppl_q25'])} to "
                  f"{fmt_num(r['delta_ppl_q75'])}" if n >= MIN_SPREAD_SEEDS else
                  f"no spread over seeds is shown: {plural(n, 'seed')} cannot estimate one (it takes "
                  f"{MIN_SPREAD_SEEDS}; the GPU budget runs 20)")
        what = "median Δloss" if n > 1 else "Δloss (one seed)"
        at = "that median" if n > 1 else "that Δloss"
        parts.append(f"{name}: {what} {dloss}, ΔPPL at {at} "
                     f"{fmt_interval(r['delta_ppl'], r['delta_ppl_low'], r['delta_ppl_high'])}; {spread}")
    return "; ".join(parts)


def share_text(shares: pd.DataFrame) -> str:
    """What protection and spreading alone achieve of ours' advantage over the reference
    (``zones.pruning.compare.gain_share``), per k and baseline, in words. The words follow
    where the share's interval lies: above 1 (the baseline does better than ours), containing 1
    (not separable from all of the gain: α adds nothing this budget can see), between 0 and 1
    (a part; the blocks chosen by α add the rest), containing 0 (not separable from none of it), below
    0. A share whose denominator (ours' gain) may be zero is not a number: its note is said."""
    if shares.empty:
        return "The share of zone-aware's advantage was not computed (protect_spread, zone_aware or the reference " \
               "was not run at k = 4 or 8)."
    parts = []
    for r in shares.itertuples():
        if r.status != "share":
            parts.append(f"At k = {r.k}, {r.note} ({r.baseline}).")
            continue
        share = fmt_interval(r.share, r.share_low, r.share_high)
        gain = fmt_interval(r.gain, r.gain_low, r.gain_high, unit="nats")
        below_one, above_zero = interval_side(r.share_low, r.share_high, 1.0), interval_side(r.share_low, r.share_high, 0.0)
        if below_one == "above":
            meaning = f"{r.baseline} does separably better than {r.ours} itself"
        elif below_one == "straddles":
            meaning = (f"not separable from all of it: protection and spreading alone account for {r.ours}'s gain, "
                       f"and α adds nothing these windows can detect")
        elif above_zero == "above":
            meaning = f"a part of it: protection and spreading give that much, the blocks {r.ours} picks by α the rest"
        elif above_zero == "straddles":
            meaning = "not separable from none of it: protection and spreading alone do not detectably help"
        else:
            meaning = f"{r.baseline} does separably worse than {r.reference}"
        parts.append(f"At k = {r.k}, {r.ours} is ahead of {r.reference} by {gain}; {r.baseline} achieves a share "
                     f"{share} of that: {meaning}.")
    return " ".join(parts)


def _at(summary: pd.DataFrame, name: str, k: int, value: str) -> str:
    row = summary[(summary["strategy"] == name) & (summary["k"] == k)]
    if row.empty:
        return "not run"
    r = row.iloc[0]
    return fmt_interval(r[value], r[f"{value}_low"], r[f"{value}_high"], unit="nats" if value == "delta_loss" else "")


def findings(table: pd.DataFrame, summary: pd.DataFrame, pairwise: pd.DataFrame, best: pd.DataFrame,
             comparison: pd.DataFrame, *, ours: str = OURS, recipe: Sequence[str] | None = None) -> dict:
    """The chapter's numbers and sentences, as plain Python values (glued by the page).

    ``k_max, base_ppl, n_tokens``; ``dloss_<s>_k1/_kmax`` and ``dppl_<s>_k1/_kmax`` (text with
    intervals) for ours and each reference; ``crossover_text, ratio_kmax_text`` (Last-N) and
    ``crossover_keep_last_text, ratio_keep_last_kmax_text``; ``claim_text``; ``best_text``; ``baseline_text``;
    ``recipe_text``; ``seeds_text``; ``behind_text``.
    """
    recipe = RECIPE_ABLATIONS if recipe is None else recipe
    present = list(dict.fromkeys(summary["strategy"]))
    compared = [s for s in present if s not in recipe]
    k_max = int(summary["k"].max())
    out = dict(k_max=k_max, base_ppl=float(table["base_ppl"].iloc[0]), n_tokens=int(table["n_tokens"].iloc[0]))
    for name in (ours, *REFERENCES):
        for k, tag in ((1, "k1"), (k_max, "kmax")):
            out[f"dloss_{name}_{tag}"] = _at(summary, name, k, "delta_loss")
            out[f"dppl_{name}_{tag}"] = _at(summary, name, k, "delta_ppl")
    for reference, tag in (("last_n", ""), ("last_n_keep_last", "_keep_last")):
        part = comparison[comparison["reference"] == reference]
        out[f"crossover{tag}_text"] = crossover_text(part, ours, reference) if len(part) else f"{reference} was not run"
        at_max = part[part["k"] == k_max]
        out[f"ratio{tag}_kmax_text"] = ratio_text(at_max.iloc[0]) if len(at_max) else "not run"
    out["claim_text"] = " ".join(claim_text(comparison, k_max, r) for r in ("last_n", "last_n_keep_last")
                                 if r in present)
    out["best_text"] = best_text(best, ours)
    out["baseline_text"] = baseline_text(pairwise, k_max, compared, ours)
    out["recipe_text"] = recipe_text(pairwise, k_max, [r for r in recipe if r in present], ours)
    out["seeds_text"] = seeds_text(summary, k_max) or "no seeded strategy was run"
    out["behind_text"] = behind_text(comparison, ours)
    return out


def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256,
        eval_tokens: int | None = DEFAULT_EVAL_TOKENS, calibration_tokens: int | None = DEFAULT_CALIBRATION_TOKENS,
        k_max: int = 8, seeds: int = DEFAULT_SEEDS, strategies: Sequence[str] = DEFAULT_STRATEGIES + RECIPE_ABLATIONS,
        batch_size: int = 8, out_dir: str = "results/pruning", *, dtype: str = DEFAULT_DTYPE,
        progress: bool | None = None) -> ChapterResult:
    """The chapter: plans and scores every strategy (``zones.pruning.pruning_sweep``, cached)
    → ``pruning.csv`` (every strategy, seed and k), ``window_losses.csv`` (per eval window),
    ``by_strategy.csv`` (per strategy and k, with intervals), ``pairwise.csv``, ``best.csv``
    (``zones.pruning.compare.worst_best_gaps``), ``crossover.csv``
    (``zones.pruning.compare.reference_comparisons``) and ``summary.json``. ``models``: a list
    (or one model); this chapter shows the first in detail. A token budget of None is the whole split."""
    started = time.time()
    model = check_models(models)[0]
    strategies = list(DEFAULT_STRATEGIES + RECIPE_ABLATIONS if strategies is None else strategies)
    missing = [s for s in (OURS, "last_n") if s not in strategies]
    if missing:
        raise ValueError(f"the pruning chapter compares {OURS} with last_n; add {missing} to strategies")
    progress = bars_shown(progress)
    loaded = load_model(model)
    subject = as_subject(loaded.model, dtype or DEFAULT_DTYPE, fingerprint=loaded.fingerprint)  # the door
    text = load_corpus(corpus)
    eval_windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    alpha = alpha_table(loaded.model)
    swept = pruning_sweep(subject, eval_windows, calibration, strategies=strategies, k_max=k_max, seeds=seeds,
                          alpha=alpha, batch_size=batch_size, model_name=model, progress=progress)
    table, windows = swept.table, swept.window_losses
    main = [s for s in strategies if s not in RECIPE_ABLATIONS]
    summary = summarize_pruning(table, windows)
    pairwise = pairwise_differences(table, windows)
    best = worst_best_gaps(table, windows, best_sets(table, windows, strategies=main))
    comparison = reference_comparisons(table, windows, OURS, REFERENCES)
    sharers = [s for s in SHARE_BASELINES if s in strategies]
    ks = [k for k in SHARE_KS if k <= k_max] or [k_max]   # a small sweep reads its largest k
    shares = (gain_share(table, windows, comparator=SHARE_REFERENCE, ours=OURS, baselines=sharers, ks=ks)
              if sharers and SHARE_REFERENCE in strategies else pd.DataFrame(columns=SHARE_COLUMNS))

    zone_params = STRATEGIES[OURS].params
    profile = PruningContext(loaded.model, alpha=alpha).layer_alpha(zone_params["alpha_estimator"], zone_params["alpha_role"])
    zones = alpha_zones(profile, zone_params["n_zones"], zone_params["max_zones"])
    spans = [(int(g["layer"].min()), int(g["layer"].max()), int(g["zone_rank"].iloc[0]))
             for _, g in zones.groupby("zone")]
    span = lambda a, b: f"{a}" if a == b else f"{a}–{b}"
    n_seeds = int(table.groupby("strategy")["seed"].nunique().max())
    numbers = dict(findings(table, summary, pairwise, best, comparison), model_name=model,
                   n_blocks=int(len(zones)), seeds=n_seeds, seeds_phrase=seeds_phrase(n_seeds),
                   seeds_dloss=("the Δloss of its one seed" if n_seeds == 1
                                else f"the median Δloss over {plural(n_seeds, 'seed')}"),
                   n_windows=int(eval_windows.n_windows), calibration_windows=int(calibration.n_windows),
                   calibration_windows_text=plural(int(calibration.n_windows), "calibration window"),
                   calibration_tokens_scored=int(calibration.n_scored_tokens), n_zones=len(spans),
                   zone_text=", ".join(span(a, b) for a, b, _ in spans),
                   lowest_zone=next(span(a, b) for a, b, rank in spans if rank == 0),
                   precision=precision_text(dtype or DEFAULT_DTYPE, subject.dtype),
                   share_text=share_text(shares), share_reference=SHARE_REFERENCE,
                   without_alpha_text=without_alpha_text(pairwise, sharers) or "no baseline without α was run",
                   seconds=float(round(time.time() - started, 1)))
    record = dict(numbers, corpus=corpus, seq_len=seq_len, strategies=strategies, dtype=subject.dtype,
                  vocab_size=output_vocabulary(loaded.model))
    tables = dict(pruning=table, window_losses=windows, by_strategy=summary, pairwise=pairwise, best=best,
                  crossover=comparison, share=shares)
    out = save(out_dir, tables, record)
    shown = dict(delta_loss=interval_table(summary, strategies, "delta_loss"),
                 delta_ppl=interval_table(summary, strategies, "delta_ppl"),
                 pairwise_kmax=pairwise_matrix(pairwise, k_max, main), share_shown=share_table(shares))
    return ChapterResult(dict(tables, **shown), numbers, record, out,
                         extra=dict(zones=zones, main=main, strategies=strategies,
                                    headline=[s for s in (OURS, *REFERENCES) if s in strategies],
                                    recipe=[s for s in (OURS, *RECIPE_ABLATIONS) if s in strategies],
                                    value_title=f"{zone_params['alpha_estimator']} ({zone_params['alpha_role']})"))
