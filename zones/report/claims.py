"""The paper's claims, tested: one row per claim and per model (and corpus), each scored by
a stated rule from the tables the chapters wrote.

The chapters write their tables to ``<results>/<chapter>/``; :func:`load_tables` reads them
back and :func:`score_claims` applies the rules of :data:`REGISTRY`. A verdict
(``zones.report.verdicts``) is one of

* ``holds``: the 95% interval of our figure agrees with the claim as the rule says;
* ``does not hold``: the interval excludes what the paper claims;
* ``inconclusive``: the interval is too wide to tell, with the reason in ``reason``: the
  token budget, the number of blocks (layers), the number of training runs (seeds), or an
  undefined interval;
* ``not measured``: the chapter that measures it was not run.

Each claim of the paper is split into what it asserts (the direction of the Last-N ratio,
its magnitude, the crossover), and each part is one :class:`Claim` of :data:`REGISTRY`: its
words, the paper's figure, its rule, and the function that turns the chapters' tables into
rows. Adding a claim is adding one entry to :data:`REGISTRY`.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from zones.core.cache import atomic_write_text
from zones.pruning import COLLAPSE_RATIO
from zones.report import healing
from zones.report import task_accuracy
from zones.report.common import ChapterResult, interval_side, read_summary, save
from zones.report.format import fmt_interval, fmt_num, fmt_p, fmt_ratio
from zones.report.layer_ablation import first_blocks_matter_most
from zones.report.verdicts import (
    BLOCKS,
    BUDGET,
    FAILS,
    HOLDS,
    MISSING,
    OPEN,
    OURS,
    PAPER_CROSSOVER_K,
    PAPER_EXPONENT,
    PAPER_GAP,
    PAPER_Q_PROFILE,
    PAPER_RATIO,
    PAPER_RHO,
    PAPER_RHO_P,
    SEEDS,
    UNDEFINED,
    VERDICTS,
    Verdict,
    finite,
    from_word,
    interval_text,
    min_permutation_p,
    ratio_interval_text,
    score_crossover,
    score_ratio_direction,
    score_ratio_magnitude,
    side_verdict,
    verdict_phrase,
)

COLUMNS = ["claim", "paper", "ours", "interval", "model", "corpus", "chapter", "rule", "verdict", "reason"]
CHAPTERS = ("alpha_profile", "layer_ablation", "importance_vs_alpha", "pruning", "healing", "depth_series",
            "spectral_lifecycle")
LAST_N = ("last_n", "last_n_keep_last")   # the claim's reference: literal Last-N, and as practitioners use it
Tables = Mapping[str, Mapping[str, Any]]

__all__ = ["CHAPTERS", "CLAIMS", "COLUMNS", "Claim", "FAILS", "HOLDS", "MISSING", "OPEN", "PAPER", "REGISTRY",
           "RULES", "claim_counts", "load_tables", "rules_table", "run", "score_claims", "score_crossover",
           "score_gap", "score_ratio_direction", "score_ratio_magnitude", "score_rho", "score_wave",
           "scorecard_html", "summary_markdown", "verdict_counts", "verdict_phrase"]


@dataclass(frozen=True)
class Claim:
    """One claim of the paper, as the scorecard tests it.

    ``key`` names it; ``claim`` and ``paper`` are what the paper asserts and its figure;
    ``rule`` the stated rule; ``chapter`` the chapter that measures it (its "not measured"
    row and its link); ``rows(tables)`` returns its scored rows (dicts with ``ours, interval,
    model, corpus, chapter, verdict``) from :func:`load_tables`' dict, or ``[]`` when the
    chapter did not write what it reads.
    """

    key: str
    claim: str
    paper: str
    rule: str
    chapter: str
    rows: Callable[[Tables], list[dict]]


# --- the rules (each tested branch by branch in tests/test_report.py) -------------------------------------

def score_rho(rho: float, low: float, high: float, p_value: float, n_blocks: int | None = None) -> Verdict:
    """Claim "α predicts importance, ρ = 0.69–0.84 with p < 0.02": holds if the interval lies
    at or above 0.69 and p < 0.02; does not hold if it lies below 0.69; otherwise
    inconclusive, for ``blocks`` when with ``n_blocks`` blocks even a perfect ordering cannot
    reach p < 0.02 (the smallest two-sided permutation p is 2 / n!) or the interval is
    undefined with few blocks, else for ``budget``."""
    few = n_blocks is not None and min_permutation_p(int(n_blocks)) >= PAPER_RHO_P
    side = interval_side(low, high, PAPER_RHO[0])
    if side == "below":
        return Verdict(FAILS)
    if few:
        return Verdict(OPEN, BLOCKS)
    if side == "above" or (side == "straddles" and low == PAPER_RHO[0]):
        return Verdict(HOLDS) if p_value < PAPER_RHO_P else Verdict(OPEN, BUDGET)
    return Verdict(OPEN, UNDEFINED if side == "undefined" else BUDGET)


def score_gap(low: float, high: float) -> Verdict:
    """Claim "the choice of strategy matters: worst-vs-best gaps up to 23.7×": the largest
    worst/best ΔPPL ratio over k. Holds if its interval lies above 1 and reaches 23.7 (a gap at
    least as large as the paper's: "up to 23.7×" is then borne out, or exceeded); does not hold
    if it lies wholly below 23.7 (the gaps here stay smaller than the paper's); inconclusive if
    it is undefined (the best arm's ΔPPL interval reaches 0) or reaches 23.7 but contains 1
    (budget)."""
    if not finite(low, high):
        return Verdict(OPEN, UNDEFINED)
    if high < PAPER_GAP:
        return Verdict(FAILS)
    if low > 1:
        return Verdict(HOLDS)
    return Verdict(OPEN, BUDGET)


def score_wave(leader: str, after_low: float, after_high: float, reason: str = BLOCKS) -> Verdict:
    """Claim "a compression wave runs from early to late layers, then reverses", from
    ``lifecycle.wave_reversal`` (step 0 excluded): holds if the early half led and the later
    minimum's interval lies below 0; does not hold if the late half led, or the early half led
    and the later minimum's interval lies above 0; inconclusive (``reason``, the layers per
    half) otherwise."""
    side = interval_side(after_low, after_high, 0.0)
    if leader == "late" or (leader == "early" and side == "above"):
        return Verdict(FAILS)
    if leader == "early" and side == "below":
        return Verdict(HOLDS)
    return Verdict(OPEN, reason if reason else BLOCKS)


def score_shape(shape: str) -> Verdict:
    """Claim "the α profile rises with depth (an inverted U in deeper models)", from
    ``alpha_profile.profile_shape``: holds for ``rises`` or ``inverted U``; does not hold for
    ``falls`` or ``U-shaped``; inconclusive otherwise (blocks: the weights are all there is,
    so only more blocks would narrow it)."""
    if shape in ("rises", "inverted U"):
        return Verdict(HOLDS)
    if shape in ("falls", "U-shaped"):
        return Verdict(FAILS)
    return Verdict(OPEN, UNDEFINED if shape == "undefined" else BLOCKS)


def score_exponent(word: str) -> Verdict:  # noqa: ARG001 (the word is shown in ``ours``)
    """Claim "Δα ∝ L^0.26": the chapter's rule (``lifecycle.delta_alpha_exponent``) reads an
    interval that covers snapshot jitter only, from one training run per depth; a firm verdict
    needs runs with several seeds, so the scorecard says inconclusive (seeds) and shows the
    jitter-only verdict in ``ours``."""
    return Verdict(OPEN, SEEDS)


# --- rows --------------------------------------------------------------------------------------------------

def _row(ours: str, interval: str, model: str, corpus: str, chapter: str, verdict: Verdict) -> dict:
    return dict(ours=ours, interval=interval, model=model, corpus=corpus, chapter=chapter, verdict=verdict)


def _corpus(tables: Tables, chapter: str, default: str = "–") -> str:
    return str(tables.get(chapter, {}).get("summary", {}).get("corpus", default))


def _rho_rows(tables: Tables) -> list[dict]:
    rows = []
    for chapter in ("importance_vs_alpha", "depth_series"):
        found = tables.get(chapter, {})
        if "rho" not in found:
            continue
        summary = found.get("summary", {})
        estimator, role = summary.get("alpha_estimator", "alpha_shape"), summary.get("alpha_role", "weighted")
        rho = found["rho"]
        chosen = rho[(rho["estimator"] == estimator) & (rho["role"] == role)]
        for r in chosen.to_dict("records"):
            n = r.get("n_layers", r.get("n"))
            n = int(n) if n is not None and finite(float(n)) else None
            floor = f"; with {n} blocks the smallest p is {fmt_num(min_permutation_p(n), 2)}" if n else ""
            ours = f"ρ = {fmt_num(r['rho'], 2)}, {fmt_p(r['p_value'])} ({role} {estimator}, chosen in advance{floor})"
            rows.append(_row(ours, interval_text(r["ci_low"], r["ci_high"], 2), str(r["model"]),
                             _corpus(tables, chapter), chapter,
                             score_rho(r["rho"], r["ci_low"], r["ci_high"], r["p_value"], n)))
    return rows


def _pruning_model(tables: Tables) -> str:
    return str(tables.get("pruning", {}).get("summary", {}).get("model_name", "–"))


def _ratio_shown(r: Mapping[str, Any]) -> str:
    if r["ratio"] > COLLAPSE_RATIO or r.get("status") == "collapsed":
        return f"{fmt_ratio(r['ratio'], cap=COLLAPSE_RATIO)} ({r['reference']} collapsed)"
    return fmt_ratio(r["ratio"])


def _ratio_rows(score: Callable[[float, float], Verdict]) -> Callable[[Tables], list[dict]]:
    def rows(tables: Tables) -> list[dict]:
        pruning = tables.get("pruning", {})
        if "crossover" not in pruning:
            return []
        crossover = pruning["crossover"]
        k_max = int(crossover["k"].max())
        at_max = crossover[(crossover["k"] == k_max) & crossover["reference"].isin(LAST_N)]
        return [_row(f"ΔPPL({r['reference']}) / ΔPPL({r['ours']}) at k = {k_max}: {_ratio_shown(r)}",
                     ratio_interval_text(r["ratio_low"], r["ratio_high"]),
                     f"{_pruning_model(tables)} (vs {r['reference']})",
                     _corpus(tables, "pruning"), "pruning", score(r["ratio_low"], r["ratio_high"]))
                for r in at_max.to_dict("records")]
    return rows


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
                         _corpus(tables, "pruning"),
                         "pruning", score_crossover(winners, OURS, reference)))
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
                 score_gap(top["worst_best_ratio_low"], top["worst_best_ratio_high"]))]


def _shape_rows(tables: Tables) -> list[dict]:
    alpha = tables.get("alpha_profile", {})
    model = str(alpha.get("summary", {}).get("model", "–"))
    if "shape_claim" in alpha:
        r = alpha["shape_claim"].iloc[0]
        ours = (f"{r['role']}-projection α: {r['shape']}; rise {fmt_interval(r['rise'], r['rise_low'], r['rise_high'], signed=True)}, "
                f"curvature {fmt_interval(r['curvature'], r['curvature_low'], r['curvature_high'], signed=True)}; "
                f"largest at block {int(r['top_block'])}")
        return [_row(ours, f"rise {interval_text(r['rise_low'], r['rise_high'])}", model, "– (weights only)",
                     "alpha_profile", score_shape(str(r["shape"])))]
    if "trend" in alpha and "q" in set(alpha["trend"]["role"]):
        r = alpha["trend"].set_index("role").loc["q"]
        ours = f"Q-projection α {r['first_fit']:.2f} → {r['last_fit']:.2f} (fitted), rise {fmt_num(r['rise'])}"
        return [_row(ours, interval_text(r["rise_low"], r["rise_high"]), model, "– (weights only)", "alpha_profile",
                     side_verdict(interval_side(r["rise_low"], r["rise_high"], 0.0), "above", BLOCKS))]
    return []


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
            rows.append(_row(ours, interval_text(r["top_first_low"], r["top_first_high"]), str(model),
                             _corpus(tables, chapter), chapter, from_word(r["verdict"], BUDGET)))
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
    return [_row(f"std(Q/K) / std(V/O) = {a['ratio']:.3g}", interval_text(a["ratio_low"], a["ratio_high"]), model,
                 corpus, chapter, side_verdict(interval_side(a["ratio_low"], a["ratio_high"], 1.0), "above", BLOCKS))
            for a, model, corpus, chapter in found]


def _wave_rows(tables: Tables) -> list[dict]:
    life = tables.get("spectral_lifecycle", {})
    if "wave_claim" not in life:
        return []
    rows = []
    for r in life["wave_claim"].to_dict("records"):
        leader = str(r.get("leader", "early" if r["peak_low"] > 0 else "neither"))
        lead = {"early": f"the early half led (max g = {fmt_interval(r['peak'], r['peak_low'], r['peak_high'])})",
                "late": f"the late half led (min g = "
                        f"{fmt_interval(r.get('trough', math.nan), r.get('trough_low', math.nan), r.get('trough_high', math.nan))})",
                "neither": "neither half led beyond its interval"}[leader]
        ours = f"Q/K, step 0 excluded: {lead}; later min g = {fmt_num(r['after'])}"
        rows.append(_row(ours, f"later min g {interval_text(r['after_low'], r['after_high'])}",
                         f"trained depth {int(r['depth'])}", _corpus(tables, "spectral_lifecycle"),
                         "spectral_lifecycle", score_wave(leader, r["after_low"], r["after_high"])))
    return rows


def _exponent_rows(tables: Tables) -> list[dict]:
    life = tables.get("spectral_lifecycle", {})
    if "delta_alpha_claim" not in life:
        return []
    r = life["delta_alpha_claim"].iloc[0]
    ours = (f"b = {fmt_num(r['exponent'])} (depths {r['depths']}, {r['group']} matrices); by the snapshot-jitter "
            f"interval alone the claim {verdict_phrase(str(r['verdict']))}")
    return [_row(ours, f"{interval_text(r['low'], r['high'])} (snapshot jitter only)", "trained series",
                 _corpus(tables, "spectral_lifecycle"), "spectral_lifecycle", score_exponent(str(r["verdict"])))]


REGISTRY: list[Claim] = [
    Claim("rho", "α predicts importance", f"ρ = {PAPER_RHO[0]}–{PAPER_RHO[1]}, p < {PAPER_RHO_P}",
          f"ρ of the α chosen in advance (the chapter's parameter, not the best of the table); holds if its 95% "
          f"interval lies at or above {PAPER_RHO[0]} and p < {PAPER_RHO_P}; does not hold if it lies below "
          f"{PAPER_RHO[0]}; inconclusive otherwise: for the number of blocks when even a perfect ordering of n "
          f"blocks cannot reach p < {PAPER_RHO_P} (the smallest two-sided permutation p is 2/n!), else for the "
          f"budget", "importance_vs_alpha", _rho_rows),
    Claim("direction", "zone-aware pruning removes blocks more cheaply than Last-N",
          "ΔPPL(Last-N) / ΔPPL(zone-aware) > 1 at large k",
          "ratio = ΔPPL(Last-N) / ΔPPL(zone-aware) at the largest k; holds if its 95% interval lies above 1; does "
          "not hold if below 1; inconclusive (budget) if it contains 1", "pruning",
          _ratio_rows(score_ratio_direction)),
    Claim("magnitude", "… by 1.1×–3.6×", f"{PAPER_RATIO[0]}×–{PAPER_RATIO[1]}× lower ΔPPL than Last-N",
          f"the same ratio; holds if its 95% interval lies inside [{PAPER_RATIO[0]}, {PAPER_RATIO[1]}]; does not "
          f"hold if it lies wholly above {PAPER_RATIO[1]} (a collapsed Last-N gives > 10³, not the paper's range) "
          f"or wholly below {PAPER_RATIO[0]}; inconclusive (budget) if it crosses either end", "pruning",
          _ratio_rows(score_ratio_magnitude)),
    Claim("crossover", "Last-N is better at small k, zone-aware from k ≈ 6",
          f"crossover at k ≈ {PAPER_CROSSOVER_K} (Pythia-410M)",
          "the separable winner at each k (paired Δloss interval excludes 0); holds if Last-N wins at some k and "
          "zone-aware at every k after Last-N's last win; does not hold if zone-aware wins from k = 1 with Last-N "
          "never ahead, or Last-N is ahead at the largest k; inconclusive (budget) otherwise", "pruning",
          _crossover_rows),
    Claim("healed", healing.CLAIM, healing.PAPER, healing.HEALING_RULE, "healing", healing.healing_rows),
    Claim("tasks", task_accuracy.CLAIM, task_accuracy.PAPER, task_accuracy.TASK_RULE, "task_accuracy",
          task_accuracy.task_accuracy_rows),
    Claim("gap", "the choice of strategy matters: worst-vs-best gaps up to 23.7×", f"up to {PAPER_GAP}×",
          f"the largest worst/best ΔPPL ratio over k; holds if its 95% interval lies above 1 and reaches "
          f"{PAPER_GAP} or beyond (gaps at least as large as the paper's); does not hold if it lies wholly below "
          f"{PAPER_GAP}; inconclusive if it is undefined (the best arm's ΔPPL interval reaches 0) or contains 1",
          "pruning", _gap_rows),
    Claim("rise", "the α profile rises with depth (an inverted U in deeper models)",
          f"Pythia-410M Q-projection α: {PAPER_Q_PROFILE[0]} → {PAPER_Q_PROFILE[1]}",
          "over relative depth, with blocks resampled: holds if the fitted parabola's curvature interval lies "
          "below 0 with its turn inside the depth (inverted U) or the fitted line's rise interval lies above 0; "
          "does not hold if the rise's interval lies below 0 or the profile is U-shaped; inconclusive (blocks) "
          "otherwise", "alpha_profile", _shape_rows),
    Claim("first", "the first blocks matter most", "the first blocks have the largest ΔLoss",
          "holds if the costliest block is one of the first ⌈L/10⌉ and its ΔLoss interval lies above every later "
          "block's; does not hold if a later block's interval lies above all of theirs; inconclusive (budget) "
          "otherwise", "layer_ablation", _first_rows),
    Claim("asymmetry", "Q/K carry the depth dependence, V/O stay flat", "Q/K vary with depth, V/O flat",
          "std over blocks of the Q/K α profile / that of V/O; holds if its 95% interval lies above 1; does not "
          "hold if below 1; inconclusive (blocks) otherwise", "alpha_profile", _asymmetry_rows),
    Claim("wave", "a compression wave runs from early to late layers, then reverses",
          "early layers compress first; the gradient later reverses",
          "g = mean compression of the first half of the layers − the second half's, at every snapshot after "
          "step 0; the leading half is the one whose extreme (max g for early, min g for late) has an interval "
          "excluding 0, the earlier one if both; holds if the early half led and the interval of g's later "
          "minimum lies below 0; does not hold if the late half led, or the early half led and that interval lies "
          "above 0 (no reversal); inconclusive (blocks: layers per half) otherwise", "spectral_lifecycle",
          _wave_rows),
    Claim("exponent", "Δα ∝ L^0.26", f"b = {PAPER_EXPONENT} (R² = 0.99)",
          f"b = log–log slope of Δα (averaged over the last quarter's snapshots) on depth; its interval resamples "
          f"snapshots, so it covers snapshot jitter only: by that interval the claim would hold if it contains "
          f"{PAPER_EXPONENT} and lies above 0 and not hold if it excludes {PAPER_EXPONENT}, but with one training "
          f"run per depth the verdict is inconclusive (seeds) until several seeds are trained",
          "spectral_lifecycle", _exponent_rows),
]

CLAIMS = {c.key: c.claim for c in REGISTRY}
PAPER = {c.key: c.paper for c in REGISTRY}
RULES = {c.key: c.rule for c in REGISTRY}


# --- reading the chapters' tables, scoring them ---------------------------------------------------------

def load_tables(results_dir: str | Path, chapters=None) -> dict[str, dict[str, Any]]:
    """``{chapter: {table name: DataFrame, "summary": dict}}`` for each chapter folder of
    ``results_dir`` that exists (``results_dir/<chapter>/*.csv`` and ``summary.json``):
    ``chapters``, or by default :data:`CHAPTERS` and then every other folder but this page's
    own (so a new chapter's tables are read without a change here)."""
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
            rows.append(dict(row, claim=claim.claim, paper=claim.paper, rule=claim.rule, verdict=str(verdict),
                             reason=getattr(verdict, "why", "")))
    return pd.DataFrame(rows, columns=COLUMNS)


def verdict_counts(scores: pd.DataFrame) -> dict[str, int]:
    """How many *rows* have each verdict."""
    return {v: int((scores["verdict"] == v).sum()) for v in VERDICTS}


def claim_outcomes(scores: pd.DataFrame) -> pd.DataFrame:
    """One row per claim (in :data:`REGISTRY` order): ``claim, outcome, models, chapter`` where
    ``outcome`` is the common verdict of its rows, or ``mixed`` when they differ."""
    rows = []
    for claim, part in scores.groupby("claim", sort=False):
        verdicts = list(dict.fromkeys(part["verdict"]))
        rows.append(dict(claim=claim, outcome=verdicts[0] if len(verdicts) == 1 else "mixed",
                         models="; ".join(dict.fromkeys(m for m in part["model"] if m != "–")) or "–",
                         chapter=str(part["chapter"].iloc[0]),
                         verdicts="; ".join(f"{m}: {v}" for m, v in zip(part["model"], part["verdict"]))))
    return pd.DataFrame(rows, columns=["claim", "outcome", "models", "chapter", "verdicts"])


def claim_counts(scores: pd.DataFrame) -> dict[str, int]:
    """How many *claims* have each outcome of :func:`claim_outcomes` (``mixed`` included)."""
    outcomes = claim_outcomes(scores)["outcome"]
    return {v: int((outcomes == v).sum()) for v in (*VERDICTS, "mixed")}


def _badge(verdict: str) -> str:
    css = {HOLDS: "holds", FAILS: "fails", OPEN: "open", MISSING: "missing"}.get(verdict, "mixed")
    return f'<span class="zones-badge zones-badge-{css}">{html.escape(verdict)}</span>'


def summary_markdown(scores: pd.DataFrame, link_prefix: str = "chapters/") -> str:
    """The front page's verdict list (MyST Markdown): one line per claim with a badge for its
    outcome, the verdict per model and a link to the chapter that measured it (``{doc}`` links
    relative to the including page: ``link_prefix`` + chapter)."""
    lines = []
    for r in claim_outcomes(scores).itertuples():
        measured = r.models != "–"
        # link only a chapter that ran: a book built without it has no such page to link
        where = f"{{doc}}`{r.chapter} <{link_prefix}{r.chapter}>`" if measured else f"the {r.chapter} chapter"
        detail = r.verdicts if r.outcome == "mixed" else f"on {r.models}" if measured else "no chapter ran"
        lines.append(f"- {_badge(r.outcome)} **{r.claim}**: {detail} ({where})")
    counts = claim_counts(scores)
    def verb(n: int, one: str, many: str) -> str:   # "1 holds", "2 hold"
        return f"{n} {one if n == 1 else many}"

    head = (f"Of the {len(lines)} claims the scorecard tests, {verb(counts[HOLDS], 'holds', 'hold')}, "
            f"{verb(counts[FAILS], 'does not hold', 'do not hold')}, "
            f"{verb(counts[OPEN], 'is inconclusive', 'are inconclusive')}, "
            f"{verb(counts['mixed'], 'differs between models', 'differ between models')} and "
            f"{verb(counts[MISSING], 'was not measured', 'were not measured')} "
            f"({{doc}}`the scorecard <{link_prefix}claims>`):")
    return head + "\n\n" + "\n".join(lines) + "\n"


class ScorecardTable:
    """The scorecard as an HTML table (``table.zones-claims``) of four columns that fit a
    desktop column: the claim (with the paper's figure), the verdict (with why, if
    inconclusive), our figure (with its interval) and the model (with the corpus). Every cell
    carries its column name (``data-label``), so at a phone's width the CSS stacks each row
    into a card."""

    LABELS = ("claim", "verdict", "ours", "model")

    def __init__(self, scores: pd.DataFrame, caption: str = ""):
        self.scores, self.caption = scores, caption

    @staticmethod
    def _cells(r: Mapping[str, Any]) -> list[str]:
        text = lambda key: html.escape(str(r.get(key, "")) if r.get(key, "") == r.get(key, "") else "")
        small = lambda words: f'<br><span class="zones-small">{words}</span>' if words else ""
        return [f"<strong>{text('claim')}</strong>{small('paper: ' + text('paper'))}",
                _badge(str(r["verdict"])) + small(text("reason")),
                f"{text('ours')}{small('95% interval: ' + text('interval')) if r.get('interval') not in ('–', None) else ''}",
                f"{text('model')}{small(text('corpus')) if r.get('corpus') not in ('–', None) else ''}"]

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{label}</th>" for label in self.LABELS)
        body = []
        for r in self.scores.to_dict("records"):
            cells = "".join(f'<td data-label="{label}">{cell}</td>' for label, cell in zip(self.LABELS, self._cells(r)))
            body.append(f"<tr>{cells}</tr>")
        caption = f"<caption>{html.escape(self.caption)}</caption>" if self.caption else ""
        return (f'<div class="zones-table zones-claims-box"><table class="zones-claims">{caption}<thead><tr>{head}'
                f'</tr></thead><tbody>{"".join(body)}</tbody></table></div>')

    def __repr__(self) -> str:
        return self.scores[["claim", "verdict", "ours", "interval", "model"]].to_string(index=False)


SCORECARD_CAPTION = ("Table 1. The paper's claims: our figure and its 95% interval beside the paper's, "
                     "for each model and corpus, with the verdict of the claim's rule and, when inconclusive, why.")


def scorecard_html(scores: pd.DataFrame, caption: str = SCORECARD_CAPTION) -> ScorecardTable:
    """:class:`ScorecardTable` of ``scores`` (display it as a cell's last line)."""
    return ScorecardTable(scores, caption)


def run(results_dir: str = "results", out_dir: str = "results/claims",
        summary_file: str | Path | None = None) -> ChapterResult:
    """The scorecard page: :func:`score_claims` of the chapters' tables under ``results_dir``
    → ``claims.csv``, ``outcomes.csv`` (one row per claim) and ``summary.json``; with
    ``summary_file``, also :func:`summary_markdown` there (the front page includes it)."""
    tables = load_tables(results_dir)
    scores = score_claims(tables)
    counts, per_claim = verdict_counts(scores), claim_counts(scores)
    outcomes = claim_outcomes(scores)
    numbers = dict(n_rows=int(len(scores)), n_claims=int(len(outcomes)), n_holds=per_claim[HOLDS],
                   n_fails=per_claim[FAILS], n_open=per_claim[OPEN], n_mixed=per_claim["mixed"],
                   n_missing=per_claim[MISSING], rows_holds=counts[HOLDS], rows_fails=counts[FAILS],
                   rows_open=counts[OPEN], chapters_found=", ".join(tables) or "none")
    summary = dict(results_dir=str(results_dir), chapters=list(tables), counts=counts, claim_counts=per_claim)
    out = save(out_dir, dict(claims=scores, outcomes=outcomes), summary)
    if summary_file is not None:
        atomic_write_text(Path(summary_file), summary_markdown(scores))
    return ChapterResult(dict(claims=scores, outcomes=outcomes, rules=rules_table()), numbers, summary, out,
                         extra=dict(scorecard=scorecard_html(scores)))


def rules_table() -> pd.DataFrame:
    """``claim, paper, rule``: the stated rule of every claim (the page prints it)."""
    return pd.DataFrame([dict(claim=c.claim, paper=c.paper, rule=c.rule) for c in REGISTRY])
