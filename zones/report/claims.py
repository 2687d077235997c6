"""The paper's claims, tested: one row per claim and per model (and corpus), each scored by
a stated rule from the tables the chapters wrote.

The chapters write their tables to ``<results>/<chapter>/``; :func:`load_tables` reads them
back and :func:`score_claims` applies the rules. A verdict is one of

* ``holds``: the 95% interval of our figure agrees with the claim as the rule says;
* ``does not hold``: the interval excludes what the paper claims;
* ``inconclusive at this budget``: the interval is too wide to tell, or undefined;
* ``not measured``: the chapter that measures it was not run.

Every rule is in :data:`RULES` (the page prints them) and in the docstring of the function
that computes the interval it reads.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..format import fmt_interval, fmt_num, fmt_ratio
from .common import ChapterResult, interval_side, read_summary, save
from .layer_ablation import first_blocks_matter_most

HOLDS, FAILS, OPEN, MISSING = "holds", "does not hold", "inconclusive at this budget", "not measured"
COLUMNS = ["claim", "paper", "ours", "interval", "model", "corpus", "chapter", "rule", "verdict"]
CHAPTERS = ("alpha_profile", "layer_ablation", "importance_vs_alpha", "pruning", "depth_series",
            "spectral_lifecycle")

PAPER_RHO = (0.69, 0.84)
PAPER_RHO_P = 0.02
PAPER_RATIO = (1.1, 3.6)
PAPER_GAP = 23.7
PAPER_Q_PROFILE = (0.22, 0.48)
PAPER_EXPONENT = 0.26
LAST_N = ("last_n", "last_n_keep_last")   # the claim's reference: literal Last-N, and as practitioners use it

CLAIMS = {
    "rho": "α predicts importance",
    "ratio": "spectral-guided pruning beats Last-N",
    "gap": "worst-vs-best gaps between strategies",
    "rise": "the α profile rises with depth",
    "first": "the first blocks matter most",
    "asymmetry": "Q/K carry the depth dependence, V/O stay flat",
    "wave": "a compression wave runs from early to late layers, then reverses",
    "exponent": "Δα ∝ L^0.26",
}
PAPER = {
    "rho": "ρ = 0.69–0.84, p < 0.02",
    "ratio": "1.1×–3.6× lower ΔPPL than Last-N",
    "gap": "up to 23.7×",
    "rise": "Pythia-410M Q-projection α: 0.22 → 0.48",
    "first": "the first blocks have the largest ΔLoss",
    "asymmetry": "Q/K vary with depth, V/O flat",
    "wave": "early layers compress first; the gradient later reverses",
    "exponent": "b = 0.26 (R² = 0.99)",
}
RULES = {
    "rho": "holds if the 95% interval of ρ lies at or above 0.69 (inside the paper's range or above it) and "
           "p < 0.02; does not hold if the interval lies below 0.69; inconclusive otherwise",
    "ratio": "ratio = ΔPPL(Last-N) / ΔPPL(zone-aware) at the largest k; holds if its 95% interval lies at or "
             "above 1.1; does not hold if it lies below 1.1; inconclusive otherwise",
    "gap": "the largest worst/best ΔPPL ratio over k; holds if its 95% interval contains 23.7; does not hold "
           "if it excludes 23.7; inconclusive if it is undefined (the best arm's ΔPPL interval reaches 0)",
    "rise": "the fitted rise of the Q-projection α from the first to the last block (least squares over "
            "blocks); holds if its 95% interval lies above 0; does not hold if below 0; inconclusive otherwise",
    "first": "holds if the costliest block is one of the first ⌈L/10⌉ and its ΔLoss interval lies above "
             "every later block's; does not hold if a later block's interval lies above all of theirs; "
             "inconclusive otherwise",
    "asymmetry": "std over blocks of the Q/K α profile / that of V/O; holds if its 95% interval lies above 1; "
                 "does not hold if below 1; inconclusive otherwise",
    "wave": "g = mean compression of the first half of the layers − the second half's; holds if the interval "
            "of max g lies above 0 and that of the later minimum of g below 0; does not hold if max g's does "
            "not reach above 0 (the early layers never led) or the later minimum's lies above 0 (no reversal); "
            "inconclusive otherwise",
    "exponent": "holds if the 95% interval of b contains 0.26 and lies above 0; does not hold if it excludes "
                "0.26; inconclusive otherwise",
}


def verdict_phrase(verdict: str) -> str:
    """A verdict as a predicate: ``"holds"``, ``"does not hold"``, ``"is inconclusive at this
    budget"`` (for "the claim …"); the chapters' short ``"inconclusive"`` is accepted too."""
    return {OPEN: f"is {OPEN}", "inconclusive": f"is {OPEN}", MISSING: f"was {MISSING}"}.get(verdict, verdict)


def _verdict(side: str, good: str) -> str:
    """Map :func:`common.interval_side` to a verdict: ``good`` side holds, the opposite fails."""
    if side == "undefined" or side == "straddles":
        return OPEN
    return HOLDS if side == good else FAILS


def _interval(low: float, high: float, digits: int = 3) -> str:
    """``"[0.12, 0.34]"`` (``zones.format.fmt_num``), or ``"undefined"``."""
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)):
        return "undefined"
    return f"[{fmt_num(low, digits)}, {fmt_num(high, digits)}]"


def _ratio_interval(low: float, high: float) -> str:
    """A ratio's interval: ``"[1.2×, 3.4×]"``, or ``"collapsed (> 10³×)"`` when even its lower end
    says only that one arm collapsed (``zones.pruning.COLLAPSE_RATIO``)."""
    from ..pruning import COLLAPSE_RATIO

    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (low, high)):
        return "undefined"
    if low > COLLAPSE_RATIO:
        return "collapsed (> 10³×)"
    return f"[{fmt_ratio(low)}, {fmt_ratio(high)}]"


def _row(claim: str, ours: str, low: float, high: float, model: str, corpus: str, chapter: str,
         verdict: str, digits: int = 3, ratio: bool = False) -> dict:
    interval = _ratio_interval(low, high) if ratio else _interval(low, high, digits)
    return dict(claim=CLAIMS[claim], paper=PAPER[claim], ours=ours, interval=interval,
                model=model, corpus=corpus, chapter=chapter, rule=RULES[claim], verdict=verdict)


def _missing(claim: str, chapter: str) -> dict:
    return dict(claim=CLAIMS[claim], paper=PAPER[claim], ours="–", interval="–", model="–", corpus="–",
                chapter=chapter, rule=RULES[claim], verdict=MISSING)


# --- the rules --------------------------------------------------------------------------------------

def score_rho(rho: float, low: float, high: float, p_value: float) -> str:
    """Claim "α predicts importance, ρ = 0.69–0.84 with p < 0.02" (rule in :data:`RULES`)."""
    side = interval_side(low, high, PAPER_RHO[0])
    if side == "below":
        return FAILS
    if side == "above" or (side == "straddles" and low == PAPER_RHO[0]):
        return HOLDS if p_value < PAPER_RHO_P else OPEN
    return OPEN


def score_ratio(low: float, high: float) -> str:
    """Claim "zone-aware beats Last-N by 1.1×–3.6×" (rule in :data:`RULES`)."""
    if math.isfinite(low) and low >= PAPER_RATIO[0]:
        return HOLDS
    return _verdict(interval_side(low, high, PAPER_RATIO[0]), "above")


def score_gap(low: float, high: float) -> str:
    """Claim "worst-vs-best gaps up to 23.7×" (rule in :data:`RULES`)."""
    side = interval_side(low, high, PAPER_GAP)
    return {"undefined": OPEN, "straddles": HOLDS}.get(side, FAILS)


# --- reading the chapters' tables ------------------------------------------------------------------------

def load_tables(results_dir: str | Path, chapters=CHAPTERS) -> dict[str, dict[str, Any]]:
    """``{chapter: {table name: DataFrame, "summary": dict}}`` for each chapter folder of
    ``results_dir`` that exists (``results_dir/<chapter>/*.csv`` and ``summary.json``)."""
    root = Path(results_dir)
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


def _rho_rows(chapter: str, found: Mapping[str, Any], corpus: str) -> list[dict]:
    summary = found.get("summary", {})
    estimator, role = summary.get("alpha_estimator", "alpha_shape"), summary.get("alpha_role", "weighted")
    rho = found["rho"]
    chosen = rho[(rho["estimator"] == estimator) & (rho["role"] == role)]
    rows = []
    for r in chosen.itertuples():
        ours = f"ρ = {r.rho:.2f}, p = {r.p_value:.2g} ({role} {estimator})"
        rows.append(_row("rho", ours, r.ci_low, r.ci_high, str(r.model), corpus, chapter,
                         score_rho(r.rho, r.ci_low, r.ci_high, r.p_value), digits=2))
    return rows


def _first_rows(chapter: str, table: pd.DataFrame, corpus: str) -> list[dict]:
    rows = []
    for model, part in table.groupby("model", sort=False):
        if part["layer"].nunique() < 2:
            continue
        r = first_blocks_matter_most(part)
        ours = (f"costliest of blocks {r['first_blocks']}: block {r['top_first']}, ΔLoss "
                f"{fmt_num(r['top_first_delta'])} nats; costliest later: block {r['top_later']}, "
                f"{fmt_interval(r['top_later_delta'], r['top_later_low'], r['top_later_high'], unit='nats')}")
        verdict = {"holds": HOLDS, "does not hold": FAILS}.get(r["verdict"], OPEN)
        rows.append(_row("first", ours, r["top_first_low"], r["top_first_high"], str(model), corpus, chapter,
                         verdict))
    return rows


def score_claims(tables: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per claim and model (columns :data:`COLUMNS`), from :func:`load_tables`' dict.

    ``ours`` is our figure, ``interval`` its 95% interval, ``rule`` the rule that turned them
    into ``verdict``. A claim whose chapter is absent gets one ``not measured`` row.
    """
    rows: list[dict] = []

    def corpus_of(chapter: str, default: str = "–") -> str:
        return str(tables.get(chapter, {}).get("summary", {}).get("corpus", default))

    # α predicts importance: the published-model chapter, then the trained series.
    found_rho = False
    for chapter in ("importance_vs_alpha", "depth_series"):
        if "rho" in tables.get(chapter, {}):
            rows += _rho_rows(chapter, tables[chapter], corpus_of(chapter))
            found_rho = True
    if not found_rho:
        rows.append(_missing("rho", "importance_vs_alpha"))

    # Pruning: zone-aware against Last-N (literal, and keeping the final block), and the gap.
    pruning = tables.get("pruning", {})
    if "crossover" in pruning:
        crossover = pruning["crossover"]
        k_max = int(crossover["k"].max())
        model = str(pruning.get("summary", {}).get("model_name", "–"))
        from .pruning import ratio_text  # the chapter's words for a ratio (pruning reads this module)

        at_max = crossover[(crossover["k"] == k_max) & crossover["reference"].isin(LAST_N)]
        for _, r in at_max.iterrows():
            ours = f"{r['reference']}/{r['ours']} at k = {k_max}: {ratio_text(r)}"
            rows.append(_row("ratio", ours, r["ratio_low"], r["ratio_high"], model, corpus_of("pruning"), "pruning",
                             score_ratio(r["ratio_low"], r["ratio_high"]), ratio=True))
    else:
        rows.append(_missing("ratio", "pruning"))
    if "best" in pruning:
        best = pruning["best"].dropna(subset=["worst_best_ratio"])
        model = str(pruning.get("summary", {}).get("model_name", "–"))
        if len(best):
            top = best.loc[best["worst_best_ratio"].idxmax()]
            shown = fmt_ratio(top["worst_best_ratio"]) if top.get("gap_status", "ratio") == "ratio" else (
                f"{top['gap_status']} (> 10³×)")
            ours = f"{shown} at k = {int(top['k'])} ({top['worst']} / {top['best']})"
            rows.append(_row("gap", ours, top["worst_best_ratio_low"], top["worst_best_ratio_high"], model,
                             corpus_of("pruning"), "pruning",
                             score_gap(top["worst_best_ratio_low"], top["worst_best_ratio_high"]), ratio=True))
        else:
            rows.append(_row("gap", "undefined (no positive best ΔPPL)", math.nan, math.nan, model,
                             corpus_of("pruning"), "pruning", OPEN))
    else:
        rows.append(_missing("gap", "pruning"))

    # The α profile rises with depth (Q-projection, as in the paper).
    alpha = tables.get("alpha_profile", {})
    if "trend" in alpha:
        trend = alpha["trend"].set_index("role")
        model = str(alpha.get("summary", {}).get("model", "–"))
        if "q" in trend.index:
            r = trend.loc["q"]
            ours = f"Q-projection α {r['first_fit']:.2f} → {r['last_fit']:.2f} (fitted), rise {r['rise']:.3g}"
            rows.append(_row("rise", ours, r["rise_low"], r["rise_high"], model, "– (weights only)",
                             "alpha_profile", _verdict(interval_side(r["rise_low"], r["rise_high"], 0.0), "above")))
    else:
        rows.append(_missing("rise", "alpha_profile"))

    # The first blocks matter most.
    found_first = False
    for chapter, name in (("layer_ablation", "ablation"), ("depth_series", "importance")):
        if name in tables.get(chapter, {}):
            rows += _first_rows(chapter, tables[chapter][name], corpus_of(chapter))
            found_first = True
    if not found_first:
        rows.append(_missing("first", "layer_ablation"))

    # Q/K against V/O: the model's α profile, and each trained depth's final profile.
    asym_rows = []
    if "asymmetry_claim" in alpha:
        a = alpha["asymmetry_claim"].iloc[0].to_dict()
        asym_rows.append((a, str(alpha.get("summary", {}).get("model", "–")), "– (weights only)", "alpha_profile"))
    life = tables.get("spectral_lifecycle", {})
    if "asymmetry_claim" in life:
        for r in life["asymmetry_claim"].to_dict("records"):
            asym_rows.append((r, f"trained depth {int(r['depth'])}", corpus_of("spectral_lifecycle"),
                              "spectral_lifecycle"))
    for a, model, corpus, chapter in asym_rows:
        ours = f"std(Q/K) / std(V/O) = {a['ratio']:.3g}"
        rows.append(_row("asymmetry", ours, a["ratio_low"], a["ratio_high"], model, corpus, chapter,
                         _verdict(interval_side(a["ratio_low"], a["ratio_high"], 1.0), "above")))
    if not asym_rows:
        rows.append(_missing("asymmetry", "alpha_profile"))

    # The compression wave and Δα against depth (the trained series).
    if "wave_claim" in life:
        for r in life["wave_claim"].itertuples():
            ours = (f"Q/K: max g = {r.peak:.3g} {_interval(r.peak_low, r.peak_high)}, later min g = "
                    f"{r.after:.3g}")
            verdict = {"holds": HOLDS, "does not hold": FAILS}.get(r.verdict, OPEN)
            rows.append(_row("wave", ours, r.after_low, r.after_high, f"trained depth {int(r.depth)}",
                             corpus_of("spectral_lifecycle"), "spectral_lifecycle", verdict))
    else:
        rows.append(_missing("wave", "spectral_lifecycle"))
    if "delta_alpha_claim" in life:
        r = life["delta_alpha_claim"].iloc[0]
        verdict = {"holds": HOLDS, "does not hold": FAILS}.get(r["verdict"], OPEN)
        rows.append(_row("exponent", f"b = {r['exponent']:.3g} (depths {r['depths']}, {r['group']} matrices)",
                         r["low"], r["high"], "trained series", corpus_of("spectral_lifecycle"),
                         "spectral_lifecycle", verdict))
    else:
        rows.append(_missing("exponent", "spectral_lifecycle"))
    return pd.DataFrame(rows, columns=COLUMNS)


def verdict_counts(scores: pd.DataFrame) -> dict[str, int]:
    """How many rows have each verdict."""
    return {v: int((scores["verdict"] == v).sum()) for v in (HOLDS, FAILS, OPEN, MISSING)}


def run(results_dir: str = "results", out_dir: str = "results/claims") -> ChapterResult:
    """The scorecard page: :func:`score_claims` of the chapters' tables under ``results_dir``
    → ``claims.csv`` and ``summary.json``."""
    tables = load_tables(results_dir)
    scores = score_claims(tables)
    counts = verdict_counts(scores)
    numbers = dict(n_rows=int(len(scores)), n_claims=int(scores["claim"].nunique()), n_holds=counts[HOLDS],
                   n_fails=counts[FAILS], n_open=counts[OPEN], n_missing=counts[MISSING],
                   chapters_found=", ".join(tables) or "none")
    summary = dict(results_dir=str(results_dir), chapters=list(tables), counts=counts)
    out = save(out_dir, dict(claims=scores), summary)
    return ChapterResult(dict(claims=scores, rules=rules_table()), numbers, summary, out)


def rules_table() -> pd.DataFrame:
    """``claim, paper, rule``: the stated rule of every claim (the page prints it)."""
    return pd.DataFrame([dict(claim=CLAIMS[c], paper=PAPER[c], rule=RULES[c]) for c in CLAIMS])
