"""The paper's claims, and the book's own claims beyond the paper, tested: one row per claim
and per model (and corpus), each scored by a stated rule from the tables the chapters wrote.

The chapters write their tables to ``<results>/<chapter>/``; :func:`load_tables` reads them
back and :func:`score_claims` applies the rules of :data:`REGISTRY`. A verdict
(``zones.report.verdicts``) is one of

* ``holds``: the 95% interval of our figure agrees with the claim as the rule says;
* ``does not hold``: the interval excludes what the paper claims;
* ``inconclusive``: the interval is too wide to tell, with the reason in ``reason``: the limit
  that binds, decided from the data by ``zones.report.verdicts.binding_limit`` (the eval
  tokens, the blocks or layers, the training runs, or an undefined interval);
* ``not measured``: the chapter that measures it was not run.

Each claim of the paper is split into what it asserts (the direction of the Last-N ratio,
its magnitude, the crossover), and each part is one :class:`Claim` of :data:`REGISTRY`: its
words, the paper's figure, its rule, and the function that turns the chapters' tables into
rows. Adding a claim is adding one entry to :data:`REGISTRY`; a claim of the book's own, beyond
the paper, is one ``Claim.beyond(key, claim, score, chapter, rows)`` entry, listed apart.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from zones.analysis.power import rho_rule_power
from zones.analysis.unit_intervals import interval_side
from zones.core.atomic import atomic_write_text
from zones.core.glossary import CHAPTERS
from zones.pruning import COLLAPSE_RATIO, RECIPE_ABLATIONS
from zones.report.common import ChapterResult, read_summary, save
from zones.report.format import fmt_interval, fmt_num, fmt_p, fmt_ratio, list_table, md_escape
from zones.core.models import gguf_format
from zones.report.verdicts import (
    BLOCKS as BLOCKS_WORD,
    BUDGET as BUDGET_WORD,
    REASONS as REASON_TEXTS,
    SEEDS as SEEDS_WORD,
    UNDEFINED as UNDEFINED_WORD,
    APART,
    MIN_RISE,
    collapsed_arms,
    shape_effect,
    DEPTH_RHO_CLAIM,
    FAILS,
    HEALING_CLAIM,
    HOLDS,
    LAST_N_KEEP_LAST,
    MISSING,
    OPEN,
    OURS,
    PAPER_CROSSOVER_K,
    PAPER_EXPONENT,
    PAPER_GAP,
    PAPER_Q_PROFILE,
    PAPER_RATIO,
    PAPER_RHO,
    PAPER_RHO_MID,
    PAPER_RHO_P,
    TASK_CLAIM,
    UNDEFINED,
    VERDICTS,
    Verdict,
    binding_limit,
    finite,
    first_blocks_matter_most,
    from_word,
    min_permutation_p,
    ratio_interval_text,
    score_after_healing,
    score_asymmetry,
    score_crossover,
    score_exponent,
    score_gap,
    score_partial_rho,
    score_ratio_direction,
    score_ratio_magnitude,
    score_rho,
    score_shape,
    score_task_accuracy,
    score_wave,
    side_verdict,
    strict_band,
    rho_strict_rule,
    strict_ratio_magnitude,
)

COLUMNS = ["claim", "source", "paper", "ours", "interval", "model", "corpus", "chapter", "rule", "verdict", "reason",
           "note"]
LAST_N = ("last_n", "last_n_keep_last")   # the claim's reference: literal Last-N, and as practitioners use it
Tables = Mapping[str, Mapping[str, Any]]

__all__ = ["BOOK_SOURCE", "CLAIMS", "COLUMNS", "Claim", "PAPER_SOURCE", "REGISTRY", "RULES", "claim_counts",
           "claim_outcomes", "load_tables", "rules_table", "run", "score_claims", "scorecard_html", "summary_markdown",
           "verdict_counts"]


PAPER_SOURCE, BOOK_SOURCE = "paper", "beyond the paper"   # whose claim a row scores


@dataclass(frozen=True)
class Claim:
    """One claim, as the scorecard tests it.

    ``key`` names it; ``claim`` and ``paper`` are what is asserted and the paper's figure;
    ``score`` is the rule function that decides (``zones.report.verdicts``; its words,
    ``score.rule``, are the claim's :attr:`rule`, written once beside the code); ``chapter``
    the chapter that measures it (its "not measured" row and its link); ``rows(tables)``
    returns its scored rows (dicts with ``ours, interval, model, corpus, chapter, verdict``)
    from :func:`load_tables`' dict, or ``[]`` when the chapter did not write what it reads;
    ``source``: :data:`PAPER_SOURCE` for the paper's claims, :data:`BOOK_SOURCE` for the
    book's own claims beyond the paper.
    """

    key: str
    claim: str
    paper: str
    score: Callable[..., Any]
    chapter: str
    rows: Callable[[Tables], list[dict]]
    source: str = PAPER_SOURCE

    def __post_init__(self):
        if not isinstance(getattr(self.score, "rule", None), str):
            raise TypeError(f"claim {self.key!r}: its score must be a rule function (zones.report.verdicts.rule), "
                            f"so the page prints the words of the code that decides")

    @property
    def rule(self) -> str:
        """The stated rule: the words attached to :attr:`score`."""
        return self.score.rule

    @classmethod
    def beyond(cls, key: str, claim: str, score: Callable[..., Any], chapter: str,
               rows: Callable[[Tables], list[dict]]) -> "Claim":
        """A claim of the book's own, beyond the paper (no figure of the paper to set beside it)."""
        return cls(key, claim, "– (beyond the paper)", score, chapter, rows, BOOK_SOURCE)


# --- rows --------------------------------------------------------------------------------------------------

def _row(ours: str, interval: str, model: str, corpus: str, chapter: str, verdict: Verdict, note: str = "") -> dict:
    return dict(ours=ours, interval=interval, model=model, corpus=corpus, chapter=chapter, verdict=verdict,
                note=note)


def _summary(tables: Tables, chapter: str) -> Mapping[str, Any]:
    return tables.get(chapter, {}).get("summary", {})


def _count(row: Mapping[str, Any], *columns: str) -> int | None:
    """The sum of a row's count columns, or None when one is missing (a table from an older build)."""
    values = [row.get(c) for c in columns]
    return int(sum(values)) if finite(*values) else None


def _tokens(tables: Tables, chapter: str) -> int | None:
    """The eval tokens a chapter scored (its summary's ``n_tokens``), if it says."""
    n = _summary(tables, chapter).get("n_tokens")
    return int(n) if finite(n) else None


def _corpus(tables: Tables, chapter: str, default: str = "–") -> str:
    return str(tables.get(chapter, {}).get("summary", {}).get("corpus", default))


def _rho_rows(tables: Tables) -> list[dict]:
    rows = []
    for chapter in ("importance_vs_alpha", "depth_series"):
        found = tables.get(chapter, {})
        if "rho" not in found:
            continue
        summary = found.get("summary", {})
        alpha_estimator, role = summary.get("alpha_estimator", "alpha_shape"), summary.get("alpha_role", "weighted")
        rho = found["rho"]
        chosen = rho[(rho["estimator"] == alpha_estimator) & (rho["role"] == role)]
        for r in chosen.to_dict("records"):
            n = r.get("n_layers", r.get("n"))
            n = int(n) if n is not None and finite(float(n)) else None
            floor = f"; with {n} blocks the smallest p is {fmt_num(min_permutation_p(n), 2)}" if n else ""
            ours = f"ρ = {fmt_num(r['rho'], 2)}, {fmt_p(r['p_value'])} ({role} {alpha_estimator}, chosen in advance{floor})"
            notes = [_strict_rho_note(r["ci_low"], r["ci_high"], r["p_value"], n), _depth_note(found, str(r["model"])),
                     _q_note(tables, str(r["model"]))]
            rows.append(_row(ours, fmt_interval(None, r["ci_low"], r["ci_high"]), str(r["model"]),
                             _corpus(tables, chapter), chapter,
                             score_rho(r["rho"], r["ci_low"], r["ci_high"], r["p_value"], n),
                             "; ".join(n for n in notes if n)))
    return rows


def _strict_rho_note(low: float, high: float, p_value: float, n: int | None) -> str:
    """The strict reading of the ρ claim (the whole interval at or above 0.69), labelled, with its power."""
    word = strict_band(low, high, PAPER_RHO)
    word = OPEN if word == HOLDS and not p_value < PAPER_RHO_P else word
    power = rho_rule_power(rho_strict_rule, PAPER_RHO_MID, int(n))["holds"] if n and n >= 3 else math.nan
    said = f", power {power:.2f} at {n} blocks if the true ρ were {PAPER_RHO_MID}" if finite(power) else ""
    return f"strict reading (the whole interval at or above {PAPER_RHO[0]}): {word}{said}"


def _across(tables: Tables) -> pd.DataFrame | None:
    """The across-models chapter's one row per model (SmolLM2 and each trained run), if it ran."""
    return tables.get("across_models", {}).get("models")


def _q_note(tables: Tables, model: str) -> str:
    """ρ with the Q-projection α (the paper's quantity) beside the book's α, from the across-models table."""
    across = _across(tables)
    if across is None or "rho_q" not in across:
        return ""
    found = across[across["model"].astype(str) == model]
    if found.empty:
        return ""
    r = found.iloc[0]
    return f"with the Q-projection α ρ = {fmt_interval(r['rho_q'], r['rho_q_low'], r['rho_q_high'], signed=True)}"


def _depth_note(found: Mapping[str, Any], model: str) -> str:
    """Beside the paper's (raw) ρ of a model: its ρ partialled on block index, when the chapter wrote it."""
    if "depth" not in found:
        return ""
    depth = found["depth"]
    rows = depth[(depth["model"].astype(str) == model) & (depth["kind"] == "partial_depth")]
    if rows.empty:
        return ""
    r = rows.iloc[0]
    return (f"the paper's figure is this raw ρ; partialled on block index ρ = "
            f"{fmt_interval(r['rho'], r['ci_low'], r['ci_high'])} (scored apart, beyond the paper)")


def _partial_rho_rows(tables: Tables) -> list[dict]:
    """One row per model: ρ partialled on block index, from ``importance_vs_alpha/depth.csv``."""
    rows = []
    summary = _summary(tables, "importance_vs_alpha")
    name = f"{summary.get('alpha_role', 'weighted')} {summary.get('alpha_estimator', 'alpha_shape')}"
    for r in _records(tables, "importance_vs_alpha", "depth"):
        if r["kind"] != "partial_depth":
            continue
        n = int(r["n_blocks"]) if finite(r.get("n_blocks")) else None
        ours = (f"ρ partialled on block index = {fmt_num(r['rho'], 2)}, {fmt_p(r['p_value'])} ({name}, {n} blocks"
                f"{_undefined_said(r.get('undefined'))})")
        rows.append(_row(ours, fmt_interval(None, r["ci_low"], r["ci_high"]), str(r["model"]),
                         _corpus(tables, "importance_vs_alpha"), "importance_vs_alpha",
                         score_partial_rho(float(r["ci_low"]), float(r["ci_high"]), p_value=float(r["p_value"]),
                                           undefined=float(r.get("undefined", math.nan)), n_blocks=n)))
    across, done = _across(tables), {row["model"] for row in rows}
    if across is not None and "rho_partial" in across:
        for r in across.to_dict("records"):
            if str(r["model"]) in done or not _is_trained(r):
                continue
            ours = (f"ρ partialled on block index = {fmt_num(r['rho_partial'], 2)}, {fmt_p(r.get('rho_partial_p'))} "
                    f"({name}, {int(r['blocks'])} blocks{_undefined_said(r.get('rho_partial_undefined'))}); "
                    f"without the end blocks {fmt_interval(r['rho_inner'], r['rho_inner_low'], r['rho_inner_high'])}")
            rows.append(_row(ours, fmt_interval(None, r["rho_partial_low"], r["rho_partial_high"]), str(r["model"]),
                             str(r["corpus"]), "across_models",
                             score_partial_rho(float(r["rho_partial_low"]), float(r["rho_partial_high"]),
                                               p_value=float(r.get("rho_partial_p", math.nan)),
                                               undefined=float(r.get("rho_partial_undefined", math.nan)),
                                               n_blocks=int(r["blocks"]))))
    return rows


def _undefined_said(share: Any) -> str:
    """", 42% of resamples undefined" where any resample left the partial ρ undefined."""
    return f", {share:.0%} of resamples undefined" if finite(share) and share > 0 else ""


def _is_trained(row: Mapping[str, Any]) -> bool:
    """A row of the across-models table that is a trained run of the depth series (its corpus is held-out text)."""
    return "(held out)" in str(row.get("corpus", ""))


def _pruning_model(tables: Tables) -> str:
    return str(tables.get("pruning", {}).get("summary", {}).get("model_name", "–"))


def _ratio_shown(r: Mapping[str, Any]) -> str:
    if r["ratio"] > COLLAPSE_RATIO or r.get("status") == "collapsed":
        return f"{fmt_ratio(r['ratio'], cap=COLLAPSE_RATIO)} ({r['reference']} collapsed)"
    return fmt_ratio(r["ratio"])


def _pruned_loss(tables: Tables, strategy: str, k: int) -> float:
    """A strategy's pruned model's loss at k (nats: ln of its median perplexity), from ``by_strategy.csv``."""
    table = tables.get("pruning", {}).get("by_strategy")
    if table is None or "ppl" not in table:
        return math.nan
    found = table[(table["strategy"] == strategy) & (table["k"] == k)]
    return float(math.log(found["ppl"].iloc[0])) if not found.empty and found["ppl"].iloc[0] > 0 else math.nan


def _collapsed(tables: Tables, strategies: list[str], k: int) -> str:
    """:func:`zones.report.verdicts.collapsed_arms` of these strategies at k (the pruning chapter's vocabulary)."""
    vocab = _summary(tables, "pruning").get("vocab_size")
    return collapsed_arms({s: _pruned_loss(tables, s, k) for s in strategies}, vocab)


def _ratio_rows(score: Callable[[float, float], Verdict]) -> Callable[[Tables], list[dict]]:
    def rows(tables: Tables) -> list[dict]:
        pruning = tables.get("pruning", {})
        if "crossover" not in pruning:
            return []
        crossover = pruning["crossover"]
        k_max = int(crossover["k"].max())
        at_max = crossover[(crossover["k"] == k_max) & crossover["reference"].isin(LAST_N)]
        apart = (lambda r: dict(collapsed=_collapsed(tables, [r["reference"], r["ours"]], k_max))
                 if score is score_ratio_magnitude else {})
        return [_row(f"ΔPPL({r['reference']}) / ΔPPL({r['ours']}) at k = {k_max}: {_ratio_shown(r)}",
                     ratio_interval_text(r["ratio_low"], r["ratio_high"]),
                     f"{_pruning_model(tables)} (vs {r['reference']})", _corpus(tables, "pruning"), "pruning",
                     score(r["ratio_low"], r["ratio_high"], ratio=r["ratio"], tokens=_tokens(tables, "pruning"),
                           **apart(r)),
                     "; ".join(n for n in (_strict_ratio_note(score, r), _behind_note(tables, k_max)) if n))
                for r in at_max.to_dict("records")] + (_trained_direction_rows(tables) if score is
                                                       score_ratio_direction else [])
    return rows


def _strict_ratio_note(score: Callable, r: Mapping[str, Any]) -> str:
    if score is not score_ratio_magnitude:
        return ""
    return (f"strict reading (the whole interval inside [{PAPER_RATIO[0]}, {PAPER_RATIO[1]}]): "
            f"{strict_ratio_magnitude(r['ratio_low'], r['ratio_high'])}")


def _trained_direction_rows(tables: Tables) -> list[dict]:
    """The direction claim on each trained run: the across-models chapter's paired difference d =
    Δloss(zone-aware) − Δloss(Last-N keeping the last block) at k = ⌈L/4⌉ (d below 0 is the ratio above 1)."""
    across, rows = _across(tables), []
    if across is None:
        return rows
    for r in across.to_dict("records"):
        if not _is_trained(r) or not finite(r.get("diff_low"), r.get("diff_high")):
            continue
        # ratio > 1 exactly when Δloss(Last-N) > Δloss(zone-aware): score −d against 0 with the direction rule's reading
        low, high = -float(r["diff_high"]), -float(r["diff_low"])
        verdict = side_verdict(interval_side(low, high, 0.0), "above",
                               *binding_limit("windows", low=low, high=high, tokens=int(r["pruning_tokens"]),
                                              estimate=-float(r["diff"]), threshold=0.0))
        ours = (f"Δloss({LAST_N_KEEP_LAST}) − Δloss({OURS}) at k = {int(r['k'])} of {int(r['blocks'])}: "
                f"{fmt_num(-float(r['diff']), 3, signed=True)} nats ("
                + ("Last-N lost more: the ratio is above 1)" if -float(r["diff"]) > 0 else
                   "zone-aware lost as much or more: the ratio is not above 1)"))
        rows.append(_row(ours, fmt_interval(None, low, high), f"{r['model']} (vs {LAST_N_KEEP_LAST})",
                         str(r["corpus"]), "across_models", verdict))
    return rows


def _behind_note(tables: Tables, k: int) -> str:
    """Which of the pruning chapter's strategies (its recipe ablations left out) are separably
    ahead of zone-aware at k, by the paired Δloss difference: the direction claim can hold
    against Last-N while zone-aware is behind others, and the row says so."""
    pairwise = tables.get("pruning", {}).get("pairwise")
    if pairwise is None:
        return ""
    at = pairwise[pairwise["k"] == k]
    ahead = [*at.loc[(at["strategy_a"] == OURS) & (at["diff_low"] > 0), "strategy_b"],
             *at.loc[(at["strategy_b"] == OURS) & (at["diff_high"] < 0), "strategy_a"]]
    ahead = [s for s in dict.fromkeys(ahead) if s not in RECIPE_ABLATIONS]
    if not ahead:
        return f"at k = {k} no other strategy is separably ahead of {OURS}"
    listed = ahead[0] if len(ahead) == 1 else ", ".join(ahead[:-1]) + f" and {ahead[-1]}"
    return f"at k = {k}, {OURS} is separably behind {listed} (paired Δloss intervals)"


def _crossover_rows(tables: Tables) -> list[dict]:
    pruning = tables.get("pruning", {})
    if "crossover" not in pruning:
        return []
    rows = []
    for reference in LAST_N:
        part = pruning["crossover"][pruning["crossover"]["reference"] == reference].sort_values("k")
        if part.empty:
            continue
        winners = {int(k): str(w) for k, w in zip(part["k"], part["winner"])}
        ahead = [k for k, w in winners.items() if w == OURS]
        behind = [k for k, w in winners.items() if w == reference]
        listed = lambda ks: ", ".join(map(str, ks)) or "none"
        ours = (f"{reference} separably ahead at k = {listed(behind)}; {OURS} separably ahead at k = "
                f"{listed(ahead)} (k = 1–{max(winners)})")
        rows.append(_row(ours, "paired Δloss intervals per k", f"{_pruning_model(tables)} (vs {reference})",
                         _corpus(tables, "pruning"), "pruning",
                         score_crossover(winners, OURS, reference, tokens=_tokens(tables, "pruning"))))
    return rows


def _gap_rows(tables: Tables) -> list[dict]:
    pruning = tables.get("pruning", {})
    if "best" not in pruning:
        return []
    best = pruning["best"].dropna(subset=["worst_best_ratio"])
    if best.empty:
        return [_row("undefined (no positive best ΔPPL)", "undefined", _pruning_model(tables),
                     _corpus(tables, "pruning"), "pruning", Verdict(OPEN, UNDEFINED))]
    top = best.loc[best["worst_best_ratio"].idxmax()]
    shown = fmt_ratio(top["worst_best_ratio"], cap=COLLAPSE_RATIO)
    if top.get("gap_status", "ratio") != "ratio":
        shown += f" ({top['gap_status']})"
    return [_row(f"{shown} at k = {int(top['k'])} ({top['worst']} / {top['best']})",
                 ratio_interval_text(top["worst_best_ratio_low"], top["worst_best_ratio_high"]),
                 _pruning_model(tables), _corpus(tables, "pruning"), "pruning",
                 score_gap(top["worst_best_ratio_low"], top["worst_best_ratio_high"], gap=top["worst_best_ratio"],
                           tokens=_tokens(tables, "pruning"),
                           collapsed=_collapsed(tables, [str(top["worst"])], int(top["k"]))))]




def _shape_verdict(r: Mapping[str, Any], n_blocks: int | None) -> tuple[str, Verdict]:
    """The interval that decides a shape row, in words, and the shape rule's verdict on it."""
    effect, low, high, name = shape_effect(r)
    shown = f"{name} {fmt_interval(effect, low, high, signed=True)} (minimum effect {MIN_RISE})"
    return shown, score_shape(str(r["shape"]), effect=effect, effect_low=low, effect_high=high, n_blocks=n_blocks)


def _shape_rows(tables: Tables) -> list[dict]:
    alpha = tables.get("alpha_profile", {})
    model = str(alpha.get("summary", {}).get("model", "–"))
    if "shape_claim" in alpha:
        r = alpha["shape_claim"].iloc[0].to_dict()
        if "peak_lift" not in r:   # a table from before the minimum effect: its size is unknown
            r.update(peak_lift=math.nan, peak_lift_low=math.nan, peak_lift_high=math.nan)
        trend = (fmt_interval(r["rank_trend"], r["rank_trend_low"], r["rank_trend_high"], signed=True)
                 if "rank_trend" in r else "not computed (an older table)")
        deciding, verdict = _shape_verdict(r, _count(r, "n_blocks"))
        ours = (f"{r['role']}-projection α: {r['shape']}; rank trend {trend}, curvature "
                f"{fmt_interval(r['curvature'], r['curvature_low'], r['curvature_high'], signed=True)}; "
                f"largest at block {int(r['top_block'])}")
        return [_row(ours, deciding, model, "– (weights only)", "alpha_profile", verdict)] + _trained_shape_rows(tables)
    return []


def _trained_shape_rows(tables: Tables) -> list[dict]:
    """The shape claim on each trained run, from the across-models table (the same rule, the same role)."""
    across, rows = _across(tables), []
    if across is None or "rank_trend" not in across:
        return rows
    role = str(_summary(tables, "across_models").get("role", "q"))
    for r in across.to_dict("records"):
        if not _is_trained(r):
            continue
        if "peak_lift" not in r:
            r.update(peak_lift=math.nan, peak_lift_low=math.nan, peak_lift_high=math.nan)
        deciding, verdict = _shape_verdict(r, int(r["blocks"]))
        ours = (f"{role}-projection α: {r['shape']}; rank trend "
                f"{fmt_interval(r['rank_trend'], r['rank_trend_low'], r['rank_trend_high'], signed=True)}")
        rows.append(_row(ours, deciding, str(r["model"]), "– (weights only)", "across_models", verdict))
    return rows


def _first_rows(tables: Tables) -> list[dict]:
    rows = []
    for chapter, name in (("layer_ablation", "ablation"), ("depth_series", "importance")):
        table = tables.get(chapter, {}).get(name)
        if table is None:
            continue
        for model, part in table.groupby("model", sort=False):
            if part["layer"].nunique() < 2:
                continue
            r = first_blocks_matter_most(part)
            ours = (f"costliest of blocks {r['first_blocks']}: block {r['top_first']}, ΔLoss "
                    f"{fmt_num(r['top_first_delta'])} nats; costliest later: block {r['top_later']}, "
                    f"{fmt_interval(r['top_later_delta'], r['top_later_low'], r['top_later_high'], unit='nats')}"
                    + (f"; ranks of blocks {r['first_blocks']} by ΔLoss: "
                       f"{', '.join(str(rank) for rank in r['first_ranks'].values())} of {r['n_blocks']}"
                       if len(r.get("first_ranks", {})) > 1 else ""))
            tokens = int(part["n_tokens"].iloc[0]) if "n_tokens" in part else None
            rows.append(_row(ours, fmt_interval(None, r["top_first_low"], r["top_first_high"]), str(model),
                             _corpus(tables, chapter), chapter,
                             from_word(r["verdict"], *binding_limit("windows", tokens=tokens))))
    return rows


def _asymmetry_rows(tables: Tables) -> list[dict]:
    found = []
    alpha, life = tables.get("alpha_profile", {}), tables.get("spectral_lifecycle", {})
    if "asymmetry_claim" in alpha:
        found.append((alpha["asymmetry_claim"].iloc[0].to_dict(), str(alpha.get("summary", {}).get("model", "–")),
                      "– (weights only)", "alpha_profile"))
    if "asymmetry_claim" in life:
        for r in life["asymmetry_claim"].to_dict("records"):
            found.append((r, f"trained depth {int(r['depth'])}", _corpus(tables, "spectral_lifecycle"),
                          "spectral_lifecycle"))
    return [_row(f"std(Q/K) / std(V/O) = {a['ratio']:.3g}", fmt_interval(None, a["ratio_low"], a["ratio_high"]), model,
                 corpus, chapter, score_asymmetry(a["ratio_low"], a["ratio_high"], n_layers=_count(a, "n_layers")))
            for a, model, corpus, chapter in found]


def _records(tables: Tables, chapter: str, name: str) -> list[dict]:
    """The rows of a chapter's table ``name`` as dicts (``[]`` when the chapter did not write it)."""
    found = tables.get(chapter, {})
    return found[name].to_dict("records") if name in found else []


def _wave_rows(tables: Tables) -> list[dict]:
    rows = []
    for r in _records(tables, "spectral_lifecycle", "wave_claim"):
        leader = str(r.get("leader", "early" if r["peak_low"] > 0 else "neither"))
        lead = {"early": f"the early half led (max g = {fmt_interval(r['peak'], r['peak_low'], r['peak_high'])})",
                "late": f"the late half led (min g = "
                        f"{fmt_interval(*(r.get(c, math.nan) for c in ('trough', 'trough_low', 'trough_high')))})",
                "neither": "neither half led beyond its interval"}[leader]
        ours = f"Q/K, step 0 excluded: {lead}; later min g = {fmt_num(r['after'])}"
        later = f"later min g {fmt_interval(None, r['after_low'], r['after_high'])} (simultaneous over snapshots)"
        rows.append(_row(ours, later,
                         f"trained depth {int(r['depth'])}", _corpus(tables, "spectral_lifecycle"),
                         "spectral_lifecycle", score_wave(leader, r["after_low"], r["after_high"],
                                                          n_layers=_count(r, "n_early", "n_late"))))
    return rows


def _exponent_rows(tables: Tables) -> list[dict]:
    life = tables.get("spectral_lifecycle", {})
    if "delta_alpha_claim" not in life:
        return []
    r = life["delta_alpha_claim"].iloc[0]
    depths = [int(d) for d in str(r["depths"]).split(",") if d.strip()]
    counts = [int(n) for n in str(r.get("runs", "")).split(",") if n.strip()]
    runs = dict(zip(depths, counts)) if len(counts) == len(depths) else None
    ours = f"b = {fmt_num(r['exponent'])} (depths {r['depths']}, {r['group']} matrices, one point per training run)"
    verdict = score_exponent(float(r["low"]), float(r["high"]), runs=runs)
    return [_row(ours, f"{fmt_interval(None, r['low'], r['high'])} (t interval over runs)", "trained series",
                 _corpus(tables, "spectral_lifecycle"), "spectral_lifecycle", verdict)]


def _healing_rows(tables: Tables) -> list[dict]:
    """One row per healing method, read from ``healing/verdict.csv``."""
    rows = []
    comparison = tables.get("healing", {}).get("comparison")
    for r in _records(tables, "healing", "verdict"):
        part = (comparison[comparison["stage"] == r["method"]] if comparison is not None and "stage" in comparison
                else pd.DataFrame())
        by_k = ({int(c.k): (float(c.difference_low), float(c.difference_high)) for c in part.itertuples()}
                or {int(r["k"]): (float(r["difference_low"]), float(r["difference_high"]))})
        every = r.get("by_k") if isinstance(r.get("by_k"), str) else f"k = {int(r['k'])}"
        ours = (f"Δloss({LAST_N_KEEP_LAST}) − Δloss({OURS}) after {r['method']} healing, at every k: {every} "
                f"nats")
        rows.append(_row(ours, f"at k = {int(r['k'])}: {fmt_interval(None, r['difference_low'], r['difference_high'])}",
                         str(r["model"]), str(r["corpus"]), "healing",
                         score_after_healing(by_k, tokens=_tokens(tables, "healing"))))
    return rows


def _task_rows(tables: Tables) -> list[dict]:
    """One row per model, read from ``task_accuracy/verdict.csv``: the exact McNemar test decides
    (its discordant counts ``b``, ``c``; a table without them, from before the exact test, scores
    undefined); the bootstrap interval of d is shown beside it."""
    rows = []
    for r in _records(tables, "task_accuracy", "verdict"):
        b, c = r.get("b", float("nan")), r.get("c", float("nan"))
        counted = (f"; {int(b)} vs {int(c)} discordant, exact McNemar {fmt_p(r.get('p_exact'))}"
                   if finite(b, c) else "")
        ours = (f"accuracy({OURS}) − accuracy({LAST_N_KEEP_LAST}) after {r['method']} healing at k = {int(r['k'])}: "
                f"{fmt_num(r['difference'], 2, signed=True)} on {int(r['n'])} examples{counted}")
        effect = r.get("power_effect")
        verdict = score_task_accuracy(b, c, n_examples=int(r["n"]),
                                      **(dict(effect=float(effect)) if finite(effect) else {}))
        rows.append(_row(ours, fmt_interval(None, r["difference_low"], r["difference_high"]) + " (bootstrap)",
                         str(r["model"]), "zones' offline tasks", "task_accuracy", verdict))
    return rows


REGISTRY: list[Claim] = [
    Claim("rho", "α predicts importance", f"ρ = {PAPER_RHO[0]}–{PAPER_RHO[1]}, p < {PAPER_RHO_P}", score_rho,
          "importance_vs_alpha", _rho_rows),
    Claim("direction", "zone-aware pruning removes blocks more cheaply than Last-N",
          "ΔPPL(Last-N) / ΔPPL(zone-aware) > 1 at large k", score_ratio_direction, "pruning",
          _ratio_rows(score_ratio_direction)),
    Claim("magnitude", "… by 1.1×–3.6×", f"{PAPER_RATIO[0]}×–{PAPER_RATIO[1]}× lower ΔPPL than Last-N",
          score_ratio_magnitude, "pruning", _ratio_rows(score_ratio_magnitude)),
    Claim("crossover", "Last-N is better at small k, zone-aware from k ≈ 6",
          f"crossover at k ≈ {PAPER_CROSSOVER_K} (Pythia-410M)", score_crossover, "pruning", _crossover_rows),
    Claim("gap", "the choice of strategy matters: worst-vs-best gaps up to 23.7×", f"up to {PAPER_GAP}×", score_gap,
          "pruning", _gap_rows),
    Claim("rise", "the α profile rises with depth (an inverted U in deeper models)",
          f"Pythia-410M Q-projection α: {PAPER_Q_PROFILE[0]} → {PAPER_Q_PROFILE[1]}", score_shape, "alpha_profile",
          _shape_rows),
    Claim("first", "the first blocks matter most", "the first blocks have the largest ΔLoss",
          first_blocks_matter_most, "layer_ablation", _first_rows),
    Claim("asymmetry", "Q/K carry the depth dependence, V/O stay flat", "Q/K vary with depth, V/O flat",
          score_asymmetry, "alpha_profile", _asymmetry_rows),
    Claim("wave", "a compression wave runs from early to late layers, then reverses",
          "early layers compress first; the gradient later reverses", score_wave, "spectral_lifecycle", _wave_rows),
    Claim("exponent", "Δα ∝ Lᵇ with b = 0.26", f"b = {PAPER_EXPONENT} (R² = 0.99)", score_exponent, "spectral_lifecycle",
          _exponent_rows),
    # the book's own claims, beyond the paper: one line each
    Claim.beyond("rho_depth", DEPTH_RHO_CLAIM, score_partial_rho, "importance_vs_alpha", _partial_rho_rows),
    Claim.beyond("healed", HEALING_CLAIM, score_after_healing, "healing", _healing_rows),
    Claim.beyond("tasks", TASK_CLAIM, score_task_accuracy, "task_accuracy", _task_rows),
]

CLAIMS = {c.key: c.claim for c in REGISTRY}
RULES = {c.key: c.rule for c in REGISTRY}


# --- reading the chapters' tables, scoring them ---------------------------------------------------------

def load_tables(results_dir: str | Path, chapters=None) -> dict[str, dict[str, Any]]:
    """``{chapter: {table name: DataFrame, "summary": dict}}`` for each chapter folder of
    ``results_dir`` that exists (``results_dir/<chapter>/*.csv`` and ``summary.json``):
    ``chapters``, or by default every folder but this page's own, the book's chapters
    (``zones.core.glossary.CHAPTERS``) first in that order (so a new chapter's tables are read
    without a change here)."""
    root = Path(results_dir)
    if chapters is None:
        found = sorted(p.name for p in root.glob("*") if p.is_dir() and p.name != "claims") if root.is_dir() else []
        chapters = [c for c in CHAPTERS if c in found] + [c for c in found if c not in CHAPTERS]
    tables = {}
    for chapter in chapters:
        folder = root / chapter
        if not folder.is_dir():
            continue
        found: dict[str, Any] = {path.stem: pd.read_csv(path) for path in sorted(folder.glob("*.csv"))
                                 if path.stem != "snapshots"}
        found["summary"] = read_summary(folder)
        tables[chapter] = found
    return tables


def score_claims(tables: Tables, registry: list[Claim] | None = None) -> pd.DataFrame:
    """One row per claim and model (columns :data:`COLUMNS`), from :func:`load_tables`' dict.

    ``ours`` is our figure, ``interval`` its 95% interval, ``rule`` the rule that turned them
    into ``verdict``, ``reason`` why an inconclusive verdict is inconclusive. A claim whose
    chapter is absent gets one ``not measured`` row.
    """
    rows: list[dict] = []
    for claim in REGISTRY if registry is None else registry:
        found = claim.rows(tables)
        if not found:
            found = [dict(ours="–", interval="–", model="–", corpus="–", chapter=claim.chapter,
                          verdict=Verdict(MISSING))]
        for row in found:
            verdict = row["verdict"]
            rows.append(dict(row, claim=claim.claim, source=claim.source, paper=claim.paper, rule=claim.rule,
                             verdict=str(verdict), reason=getattr(verdict, "why", ""), note=row.get("note", "")))
    return pd.DataFrame(rows, columns=COLUMNS)


def verdict_counts(scores: pd.DataFrame) -> dict[str, int]:
    """How many *rows* have each verdict."""
    return {v: int((scores["verdict"] == v).sum()) for v in VERDICTS}


def claim_outcomes(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per claim (in :data:`REGISTRY` order): ``claim, source, outcome, models,
    chapter, verdicts, notes`` where ``outcome`` is the common verdict of its rows, or ``mixed``
    when they differ, and ``notes`` the rows' notes (what the verdict alone does not say)."""
    rows = []
    for claim, part in scores.groupby("claim", sort=False):
        verdicts = list(dict.fromkeys(part["verdict"]))
        rows.append(dict(claim=claim, source=str(part["source"].iloc[0]),
                         outcome=verdicts[0] if len(verdicts) == 1 else "mixed",
                         models="; ".join(dict.fromkeys(m for m in part["model"] if m != "–")) or "–",
                         chapter=str(part["chapter"].iloc[0]),
                         verdicts="; ".join(f"{m}: {v}" for m, v in zip(part["model"], part["verdict"])),
                         notes="; ".join(dict.fromkeys(n for n in part["note"].fillna("") if n))))
    return pd.DataFrame(rows, columns=["claim", "source", "outcome", "models", "chapter", "verdicts", "notes"])


def claim_counts(scores: pd.DataFrame, source: str | None = PAPER_SOURCE) -> dict[str, int]:
    """How many *claims* (of ``source``; ``None``: all) have each outcome of
    :func:`claim_outcomes` (``mixed`` included)."""
    outcomes = claim_outcomes(scores)
    if source is not None:
        outcomes = outcomes[outcomes["source"] == source]
    return {v: int((outcomes["outcome"] == v).sum()) for v in (*VERDICTS, "mixed")}


def _badge(verdict: str) -> str:
    css = {HOLDS: "holds", FAILS: "fails", OPEN: "open", APART: "apart", MISSING: "missing"}.get(verdict, "mixed")
    return f'<span class="zones-badge zones-badge-{css}">{html.escape(verdict)}</span>'


def summary_markdown(scores: pd.DataFrame, link_prefix: str = "chapters/", tables: Tables | None = None) -> str:
    """The front page's verdict list (MyST Markdown): the paper's claims, then the book's own
    claims beyond the paper, one line per claim with a badge for its outcome, the verdict per
    model and a link to the chapter that measured it (the notes are the scorecard's) (``{doc}`` links relative to the including page: ``link_prefix`` + chapter)."""
    outcomes = claim_outcomes(scores)

    def lines(source: str) -> list[str]:
        found = []
        for r in outcomes[outcomes["source"] == source].itertuples():
            measured = r.models != "–"
            # link only a chapter that ran: a book built without it has no such page to link
            where = f"{{doc}}`{r.chapter} <{link_prefix}{r.chapter}>`" if measured else f"the {r.chapter} chapter"
            detail = r.verdicts if r.outcome == "mixed" else f"on {r.models}" if measured else "no chapter ran"
            # one line a claim: the figures, intervals and notes are the scorecard's
            found.append(f"- {_badge(r.outcome)} **{r.claim}**: {detail} ({where})")
        return found

    def verb(n: int, one: str, many: str) -> str:   # "1 holds", "2 hold"
        return f"{n} {one if n == 1 else many}"

    paper, book = lines(PAPER_SOURCE), lines(BOOK_SOURCE)
    found = f"**What was found.** {findings(scores, tables)}\n\n" if tables is not None else ""
    counts = claim_counts(scores, PAPER_SOURCE)
    head = (f"Of the paper's {len(paper)} claims the scorecard tests, {verb(counts[HOLDS], 'holds', 'hold')}, "
            f"{verb(counts[FAILS], 'does not hold', 'do not hold')}, "
            f"{verb(counts[OPEN], 'is inconclusive', 'are inconclusive')}, "
            f"{verb(counts[APART], 'is not comparable (an arm collapsed)', 'are not comparable (an arm collapsed)')}, "
            f"{verb(counts['mixed'], 'differs between models', 'differ between models')} and "
            f"{verb(counts[MISSING], 'was not measured', 'were not measured')} "
            f"({{doc}}`the scorecard <{link_prefix}claims>`):")
    text = found + head + "\n\n" + "\n".join(paper) + "\n"
    if book:
        text += ("\nBeyond the paper, the book tests claims of its own (the paper does not make them), scored "
                 "by rules stated the same way:\n\n" + "\n".join(book) + "\n")
    return text


# The paper's claims as the front page names them (a few words each).
SHORT = {"rho": "α predicts importance", "direction": "zone-aware prunes more cheaply than Last-N",
         "magnitude": "by 1.1×–3.6×", "crossover": "Last-N first, then zone-aware",
         "gap": "worst/best gaps up to 23.7×", "rise": "α rises with depth", "first": "the first blocks matter most",
         "asymmetry": "Q/K carry the depth trend", "wave": "a compression wave that reverses",
         "exponent": "Δα ∝ L^0.26"}
PAPER_SIZES = "30–285 M"   # the paper's models, in parameters
FRONT_LIMITS = dict(sentences=5, words=120, sentence_words=30)   # what a reader repeats after one minute


def _short(claim: str) -> str:
    key = next((c.key for c in REGISTRY if c.claim == claim), "")
    return SHORT.get(key, claim)


def _millions(n: float) -> str:
    return f"{n / 1e6:.3g} M"


def _scale_sentence(tables: Tables) -> str:
    """Which models, how large, against the paper's."""
    ablation = _summary(tables, "layer_ablation")
    name = str(ablation.get("model", ablation.get("model_name", _summary(tables, "pruning").get("model_name", ""))))
    across = _across(tables)
    first = ""
    if across is not None and not across.empty:
        r = across.iloc[0]
        quant = gguf_format(name) if name else None
        stored = f", {quant} weights" if quant else ""
        first = f"{r['model']} ({_millions(float(r['parameters']))} parameters{stored})"
    elif name:
        first = Path(name).name
    series = tables.get("depth_series", {}).get("series")
    trained = ""
    if series is not None and not series.empty:
        sizes, tokens = series["parameters"].astype(float), series["tokens_seen"].astype(float)
        span = lambda v: _millions(v.min()) if v.min() == v.max() else f"{v.min() / 1e6:.2g}–{_millions(v.max())}"
        trained = f"{len(series)} run{'s' if len(series) != 1 else ''} trained here ({span(sizes)}, {span(tokens)} tokens)"
    models = " and ".join(m for m in (first, trained) if m) or "no model"
    dtype = ablation.get("dtype", _summary(tables, "pruning").get("dtype", "float32"))
    return f"Scale: {models}, in {dtype}; the paper's models have {PAPER_SIZES} parameters."


def _one_number(scores: pd.DataFrame, claim: str) -> str:
    """The interval of a claim's first failing row that gives one ("" when none does), with its model."""
    for r in scores[(scores["claim"] == claim) & (scores["verdict"] == FAILS)].itertuples():
        figure = str(r.interval).split(" (")[0]   # no brackets within brackets
        if "[" in figure and any(c.isdigit() for c in figure):
            return f" ({str(r.model).split(' (vs ')[0]}: {figure})"
    return ""


def _fit(sentence: str, words: int = FRONT_LIMITS["sentence_words"]) -> str:
    """A sentence cut to ``words``: its bracketed asides dropped, last first, until it fits."""
    while len(sentence.split()) > words and " (" in sentence:
        start = sentence.rindex(" (")
        end = sentence.find(")", start)
        sentence = sentence[:start] + sentence[end + 1:] if end > 0 else sentence[:start]
    return sentence


def _pruning_sentence(tables: Tables) -> str:
    """What zone-aware's pruning gain is made of: the α-free rule with the largest share of it at the
    largest k read, and the strategies separably ahead of zone-aware there."""
    pruning = tables.get("pruning", {})
    shares = pruning.get("share")
    if shares is None or shares.empty or "share" not in shares:
        return ""
    valid = shares[shares["status"] == "share"] if "status" in shares else shares
    if valid.empty:
        return ""
    at = valid[valid["k"] == valid["k"].max()]
    top = at.loc[at["share"].idxmax()]
    k = int(top["k"])
    said = (f"Pruning at k = {k}: {top['baseline']}, without α, reaches "
            f"{fmt_interval(top['share'], top['share_low'], top['share_high'])} of zone-aware's gain over Last-N")
    ahead = _ahead_of_ours(tables, k)
    if ahead:
        shown = ahead[:3] + ([f"{len(ahead) - 3} more"] if len(ahead) > 3 else [])
        said += f"; {_listed_or_none(shown).replace('; ', ', ')} beat zone-aware"
    return said + "."


def _ahead_of_ours(tables: Tables, k: int) -> list[str]:
    """The pruning chapter's strategies (its recipe ablations left out) separably ahead of zone-aware at k."""
    pairwise = tables.get("pruning", {}).get("pairwise")
    if pairwise is None:
        return []
    at = pairwise[pairwise["k"] == k]
    ahead = [*at.loc[(at["strategy_a"] == OURS) & (at["diff_low"] > 0), "strategy_b"],
             *at.loc[(at["strategy_b"] == OURS) & (at["diff_high"] < 0), "strategy_a"]]
    return [s for s in dict.fromkeys(ahead) if s not in RECIPE_ABLATIONS]


def _undecided_sentence(scores: pd.DataFrame, outcomes: pd.DataFrame) -> str:
    """Why the rest is undecided: how many claims, and the limits that bind their rows."""
    rest = outcomes[outcomes["outcome"].isin([OPEN, "mixed"])]
    apart = outcomes[outcomes["outcome"] == APART]
    if rest.empty and apart.empty:
        return ""
    rows = scores[scores["claim"].isin(rest["claim"]) & (scores["verdict"] == OPEN)]
    limits = {BLOCKS_WORD: "few blocks", SEEDS_WORD: "few training runs", BUDGET_WORD: "few eval tokens",
              UNDEFINED_WORD: "undefined statistics"}
    found = [limits[k] for k in limits if rows["reason"].astype(str).str.startswith(REASON_TEXTS[k]).any()]
    parts = []
    if not rest.empty:
        parts.append(f"{len(rest)} {'is undecided or differs' if len(rest) == 1 else 'are undecided or differ'} "
                     f"between models"
                     + (f" ({', '.join(found)}; toy scale)" if found else ""))
    if not apart.empty:
        parts.append(f"{len(apart)} {'is' if len(apart) == 1 else 'are'} not comparable: pruned Last-N is worse "
                     f"than a uniform guess")
    return _capital("; ".join(parts)) + "."


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def findings(scores: pd.DataFrame, tables: Tables) -> str:
    """The front page's at most five sentences (:data:`FRONT_LIMITS`), each read from the tables this
    build wrote: the models and their scale against the paper's; what replicates; what fails, with
    the number that shows it; what zone-aware's pruning gain is made of; why the rest is undecided."""
    outcomes = claim_outcomes(scores)
    paper = outcomes[outcomes["source"] == PAPER_SOURCE]
    held = [_short(r.claim) for r in paper.itertuples() if r.outcome == HOLDS]
    failed = [r.claim for r in paper.itertuples() if r.outcome == FAILS]
    sentences = [_scale_sentence(tables),
                 f"Of the paper's {len(paper)} claims, {len(held)} {'holds' if len(held) == 1 else 'hold'}"
                 + (f": {_listed_or_none(held)}." if held else ".")]
    if failed:   # every failed claim by name, the number that shows it for the first that has one
        numbered = next((c for c in failed if _one_number(scores, c)), None)
        names = [_short(c) + (_one_number(scores, c) if c == numbered else "") for c in failed]
        sentences.append(f"{len(failed)} {'does' if len(failed) == 1 else 'do'} not: {_listed_or_none(names)}.")
    sentences += [s for s in (_pruning_sentence(tables), _undecided_sentence(scores, paper)) if s]
    return " ".join(_fit(s) for s in sentences[:FRONT_LIMITS["sentences"]])


def _standalone(claim: str) -> str:
    """A claim that continues the one before it on the scorecard ("… by 1.1×–3.6×") said in full,
    so that it reads on its own in a list."""
    if not claim.startswith("… "):
        return claim
    names = [c.claim for c in REGISTRY]
    before = names[names.index(claim) - 1] if claim in names and names.index(claim) > 0 else ""
    return f"{before} {claim[2:]}".strip()


def _listed_or_none(items: list[str]) -> str:
    return "none" if not items else items[0] if len(items) == 1 else "; ".join(items[:-1]) + f" and {items[-1]}"


def _reasons(scores: pd.DataFrame, claim: str) -> str:
    return " ".join(scores.loc[scores["claim"] == claim, "reason"].fillna("").astype(str))


SCORECARD_NAME = "tbl-claims-scorecard"   # {numref}`tbl-claims-scorecard` cites it
SCORECARD_CAPTION = ("The paper's claims, then the book's own claims beyond the paper: our figure and its 95% "
                     "interval beside the paper's, for each model and corpus, with the verdict of the claim's rule "
                     "and, when inconclusive, the limit that binds.")


def deciding_figure(ours: str, interval: str) -> str:
    """One line for the scorecard: the first clause of our figure (up to its first ";" or " (")
    and, when the interval is not already in it, the 95% interval that decided the verdict."""
    head = ours.split("; ")[0].split(" (")[0].strip()
    if not interval or interval in head:
        return head
    return f"{head}; 95%: {interval}" if interval.startswith("[") or interval.startswith(">") else f"{head}; {interval}"


class ScorecardTable:
    """The scorecard as a table of four columns that fit a desktop column: the claim (with the
    paper's figure), the verdict (with why, if inconclusive), our figure (with its interval) and
    the model (with the corpus). In the book it is a numbered table (a MyST ``{list-table}``,
    ``name`` for ``{numref}``) whose rows become labelled cards at a phone's width
    (``table.zones-cards``); in JupyterLab the same table as HTML, each cell carrying its column
    name (``data-label``)."""

    LABELS = ("claim", "verdict", "ours", "model")

    def __init__(self, scores: pd.DataFrame, caption: str = "", name: str | None = SCORECARD_NAME):
        self.scores, self.caption, self.name = scores, caption, name

    @staticmethod
    def _cells(r: Mapping[str, Any], escape: Callable[[str], str] = html.escape) -> list[str]:
        """The four cells of row ``r``, in HTML (``escape=html.escape``) or MyST Markdown
        (``escape=md_escape``): one line each (the claim, the verdict, the figure that decided it
        with its interval, the model), and beneath the figure a collapsed "details" with the paper's
        figure, why an inconclusive verdict is so, our whole figure and the notes (strict readings,
        power). A badge and the details are inline HTML in both."""
        value = lambda key: str(r.get(key, "")) if r.get(key, "") == r.get(key, "") else ""
        bold = (lambda words: f"<strong>{words}</strong>") if escape is html.escape else (lambda words: f"**{words}**")
        figure = ("paper: " + value("paper")) if r.get("source", PAPER_SOURCE) == PAPER_SOURCE else "beyond the paper"
        interval = value("interval") if value("interval") not in ("–", "") else ""
        line = deciding_figure(value("ours"), interval)
        more = [figure, value("reason"), "ours: " + value("ours") if value("ours") != line else "",
                "note: " + value("note") if value("note") else "",
                value("corpus") if value("corpus") not in ("–", "") else ""]
        details = ('<details class="zones-more"><summary>details</summary><span class="zones-small">'
                   + html.escape("; ".join(m for m in more if m)) + "</span></details>")
        return [bold(escape(value("claim"))), _badge(str(r["verdict"])), f"{escape(line)}{details}",
                escape(value("model"))]

    def _repr_markdown_(self) -> str:
        rows = [self._cells(r, md_escape) for r in self.scores.to_dict("records")]
        return list_table([list(self.LABELS)], rows, self.caption or None, self.name,
                          ["zones-table", "zones-cards", "zones-claims"])

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{label}</th>" for label in self.LABELS)
        body = []
        for r in self.scores.to_dict("records"):
            cells = "".join(f'<td data-label="{label}">{cell}</td>' for label, cell in zip(self.LABELS, self._cells(r)))
            body.append(f"<tr>{cells}</tr>")
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (f'<div class="zones-table zones-claims-box"><table class="zones-table zones-cards zones-claims">'
                f'{caption}<thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table></div>')

    def __repr__(self) -> str:
        return self.scores[["claim", "verdict", "ours", "interval", "model"]].to_string(index=False)


def scorecard_html(scores: pd.DataFrame, caption: str = SCORECARD_CAPTION) -> ScorecardTable:
    """:class:`ScorecardTable` of ``scores`` (display it as a cell's last line)."""
    return ScorecardTable(scores, caption)


def run(results_dir: str = "results", out_dir: str = "results/claims",
        summary_file: str | Path | None = "claims_summary.md") -> ChapterResult:
    """The scorecard page: :func:`score_claims` of the chapters' tables under ``results_dir``
    → ``claims.csv``, ``outcomes.csv`` (one row per claim) and ``summary.json``; with
    ``summary_file``, also :func:`summary_markdown` there (the front page includes it)."""
    tables = load_tables(results_dir)
    scores = score_claims(tables)
    counts, per_claim = verdict_counts(scores), claim_counts(scores, PAPER_SOURCE)
    outcomes = claim_outcomes(scores)
    book = outcomes[outcomes["source"] == BOOK_SOURCE]
    numbers = dict(n_rows=int(len(scores)), n_claims=int((outcomes["source"] == PAPER_SOURCE).sum()),
                   n_holds=per_claim[HOLDS], n_fails=per_claim[FAILS], n_open=per_claim[OPEN], n_apart=per_claim[APART],
                   n_mixed=per_claim["mixed"], n_missing=per_claim[MISSING], rows_holds=counts[HOLDS],
                   rows_fails=counts[FAILS], rows_open=counts[OPEN], chapters_found=", ".join(tables) or "none",
                   n_book=int(len(book)),
                   book_text="; ".join(f"{r.claim}: {r.outcome}" for r in book.itertuples()) or "none",
                   findings_text=findings(scores, tables))
    summary = dict(results_dir=str(results_dir), chapters=list(tables), counts=counts, claim_counts=per_claim,
                   book_claim_counts=claim_counts(scores, BOOK_SOURCE))
    out = save(out_dir, dict(claims=scores, outcomes=outcomes), summary)
    if summary_file is not None:
        atomic_write_text(Path(summary_file), summary_markdown(scores, tables=tables))
    return ChapterResult(dict(claims=scores, outcomes=outcomes, rules=rules_table()), numbers, summary, out,
                         extra=dict(scorecard=scorecard_html(scores)))


def rules_table() -> pd.DataFrame:
    """``claim, source, paper, rule``: the stated rule of every claim (the page prints it), the
    words attached to the function that applies it."""
    return pd.DataFrame([dict(claim=c.claim, source=c.source, paper=c.paper, rule=c.rule) for c in REGISTRY])
