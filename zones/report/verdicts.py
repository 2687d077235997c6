"""The verdict vocabulary, the paper's figures, and every rule the chapters and the scorecard share.

A verdict is one of :data:`HOLDS`, :data:`FAILS`, :data:`OPEN` (inconclusive) or
:data:`MISSING` (not measured). An inconclusive verdict always says *why*
(:data:`REASONS`): the token budget, the number of blocks (layers), the number of training
runs (seeds), or an undefined interval. :class:`Verdict` is a ``str`` (it compares equal
to its word) that carries that reason.

Each rule is written once: :func:`rule` attaches the rule's words to the function that
applies it (``score_crossover.rule``), so the scorecard's rule column, its rules table and a
chapter page quoting the rule all print the words of the code that decides.

The paper's figures (arXiv 2604.22778) live here once, so the chapters and the scorecard
quote the same numbers. This module imports no chapter module: every chapter module and
the scorecard import it, never each other.
"""
from __future__ import annotations

import inspect
import math
import numbers
from typing import Callable, Mapping

import pandas as pd

from zones.analysis.importance import delta_loss_bounds
from zones.analysis.lifecycle import PAPER_DELTA_ALPHA_EXPONENT
from zones.analysis.paired import EXACT_ALPHA, mcnemar_p, mcnemar_power
from zones.analysis.power import asymmetry_rule_power, exponent_rule_power, rho_rule_power
from zones.analysis.unit_intervals import MAX_UNDEFINED, interval_side
from zones.pruning import COLLAPSE_RATIO
from zones.pruning.compare import CROSSES, NO_CROSSOVER, read_crossover
from zones.report.format import fmt_list, fmt_num, fmt_ratio, power_of_ten

HOLDS, FAILS, OPEN, MISSING = "holds", "does not hold", "inconclusive", "not measured"
APART = "not comparable"   # a magnitude whose arms are not both in the regime the paper measured: counted apart
VERDICTS = (HOLDS, FAILS, OPEN, APART, MISSING)

# Why a verdict is inconclusive: the limit that a larger run would lift (:func:`binding_limit`
# decides which one binds from the data; its detail says how many units there are).
BUDGET, BLOCKS, SEEDS, UNDEFINED = "budget", "blocks", "seeds", "undefined"
EXAMPLES = "examples"
REASONS = {
    BUDGET: "the eval tokens: the interval resamples eval windows, and more eval tokens narrow it",
    BLOCKS: "the blocks: the interval resamples blocks (or layers), and a model has only so many; more eval "
            "tokens would not narrow it",
    SEEDS: "the seeds: too few training runs (an interval within one run does not cover the variation between "
           "runs; an interval over runs narrows as runs are added)",
    UNDEFINED: "the interval is undefined here (too few units, or a quantity that is not positive)",
    EXAMPLES: "the task examples: the interval resamples examples, and more examples narrow it",
}
UNITS = {"windows": BUDGET, "blocks": BLOCKS, "layers": BLOCKS, "snapshots": SEEDS, "runs": SEEDS,
         "examples": EXAMPLES}

OURS = "zone_aware"               # the paper's spectral-guided pruning strategy
LAST_N_KEEP_LAST = "last_n_keep_last"   # Last-N as practitioners (and Lu et al.) use it: the final block stays

# The paper's figures.
PAPER_RHO = (0.69, 0.84)          # Spearman ρ of α against importance, across its models
PAPER_RHO_P = 0.02                # ... each with p below this
PAPER_RATIO = (1.1, 3.6)          # ΔPPL(Last-N) / ΔPPL(zone-aware)
PAPER_CROSSOVER_K = 6             # zone-aware overtakes Last-N from about this k (Pythia-410M)
PAPER_GAP = 23.7                  # the largest worst/best ΔPPL ratio over strategies
PAPER_Q_PROFILE = (0.22, 0.48)    # Pythia-410M Q-projection α, first block → last block
PAPER_EXPONENT = PAPER_DELTA_ALPHA_EXPONENT   # Δα ∝ L^0.26 (R² = 0.99)

FIRST_FRACTION = 0.1   # "the first blocks": the first ⌈0.1 · L⌉ blocks (at least one)


class Verdict(str):
    """A verdict word (``Verdict(OPEN, BLOCKS) == "inconclusive"``) with ``reason``: a key of
    :data:`REASONS` for an inconclusive verdict, ``""`` otherwise, and ``detail``: what the data
    say about that limit (``"it resamples the model's 30 blocks"``), computed by :func:`binding_limit`."""

    reason: str
    detail: str

    def __new__(cls, word: str, reason: str = "", detail: str = "") -> "Verdict":
        if word not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}; got {word!r}")
        if word == OPEN and reason not in REASONS:
            raise ValueError(f"an inconclusive verdict needs a reason in {sorted(REASONS)}; got {reason!r}")
        self = super().__new__(cls, word)
        self.reason = reason if word == OPEN else ""
        self.detail = detail if word in (OPEN, HOLDS, FAILS, APART) else ""
        return self

    def _with(self, more: str) -> "Verdict":
        """The same verdict with ``more`` added to its detail."""
        return Verdict(str(self), self.reason, f"{self.detail}; {more}" if self.detail else more)

    @property
    def why(self) -> str:
        """The reason in words, with its detail; for a firm verdict its detail alone (``"beyond the
        paper's range"``), ``""`` when it has none."""
        text = REASONS.get(self.reason, "")
        if not text:
            return self.detail
        return f"{text}; {self.detail}" if self.detail else text


def binding_limit(units: str, *, low: float = 0.0, high: float = 0.0, n_units: int | None = None,
                  tokens: int | None = None, estimate: float | None = None, threshold: float | None = None,
                  runs_resampled: int | None = None, seeds_trained: Mapping[int, int] | None = None) -> tuple[str, str]:
    """``(reason, detail)``: the limit that binds an inconclusive interval, decided from the data.

    In this order: an interval with a NaN bound is :data:`UNDEFINED`; an interval that resamples
    within one training run (``runs_resampled`` < 2) is bound by the :data:`SEEDS`, whatever it
    resamples, and the detail gives ``seeds_trained`` (depth → runs trained); otherwise the
    resampled ``units`` decide (:data:`UNITS`: ``windows`` → :data:`BUDGET`, ``blocks`` or
    ``layers`` → :data:`BLOCKS`), with ``n_units`` (and, for eval windows, ``tokens`` and how
    many times the tokens would make the half-width smaller than |``estimate`` − ``threshold``|,
    since it shrinks as 1/√tokens).
    """
    if units not in UNITS:
        raise ValueError(f"units must be one of {sorted(UNITS)}; got {units!r}")
    if not finite(low, high):
        return UNDEFINED, ""
    if (runs_resampled is not None and runs_resampled < 2) or units == "snapshots":
        trained = ""
        if seeds_trained:
            counts = [f"{n} at depth {d}" for d, n in sorted(seeds_trained.items())]
            trained = f"; training runs the series has: {fmt_list(counts)}"
        covers = "one training run per depth" if (runs_resampled or 1) < 2 else f"{runs_resampled} runs"
        return SEEDS, f"it resamples the {units} of {covers}{trained}"
    if units == "runs":   # an interval over training runs: more of them narrow it
        counts = [f"{n} at depth {d}" for d, n in sorted((seeds_trained or {}).items())]
        return SEEDS, (f"a t interval over {n_units if n_units is not None else 'the'} training runs"
                       + (f" ({fmt_list(counts)})" if counts else ""))
    reason = UNITS[units]
    named = {"windows": "eval windows", "examples": "task examples"}.get(units, units)
    counted = f"{n_units} {named}" if n_units is not None else named
    if reason == BLOCKS:
        return BLOCKS, f"it resamples the model's {counted}"
    detail = f"it resamples {counted}" + (f" ({tokens:,} tokens)" if tokens else "")
    if finite(estimate, threshold) and estimate != threshold:
        factor = ((high - low) / 2 / abs(estimate - threshold)) ** 2
        more = "tokens" if units == "windows" else "examples"
        if factor > 1:
            detail += f"; about {fmt_num(factor, 2)}× the {more} would separate it from {fmt_num(threshold)}, if " \
                      f"the estimate held"
    return reason, detail


def inconclusive(units: str, **data) -> Verdict:
    """``Verdict(OPEN, *binding_limit(units, **data))``."""
    return Verdict(OPEN, *binding_limit(units, **data))


def rule(text: str) -> Callable[[Callable], Callable]:
    """Decorator: ``text`` is the stated rule the function applies, written once. It becomes
    the function's ``rule`` attribute (what the scorecard and the pages print) and the first
    paragraph of its docstring."""
    def attach(function: Callable) -> Callable:
        function.rule = text
        rest = inspect.cleandoc(function.__doc__ or "")
        function.__doc__ = f"Rule: {text}." + (f"\n\n{rest}" if rest else "")
        return function

    return attach


def side_verdict(side: str, good: str, reason: str = BUDGET, detail: str = "") -> Verdict:
    """Map ``zones.analysis.unit_intervals.interval_side`` to a verdict: the ``good`` side holds, the
    opposite fails, a straddling interval is inconclusive for ``reason`` (with ``detail``), an
    undefined one for :data:`UNDEFINED`."""
    if side == "undefined":
        return Verdict(OPEN, UNDEFINED)
    if side == "straddles":
        return Verdict(OPEN, reason, detail)
    return Verdict(HOLDS if side == good else FAILS)


def from_word(word: str, reason: str = BUDGET, detail: str = "") -> Verdict:
    """A chapter's verdict word (``holds``, ``does not hold``, ``inconclusive``) as a :class:`Verdict`."""
    if word in (HOLDS, FAILS):
        return Verdict(word)
    return Verdict(OPEN, reason, detail)


def verdict_phrase(verdict: str) -> str:
    """A verdict as a predicate for "the claim …": ``"holds"``, ``"does not hold"``, ``"is
    inconclusive (too few blocks …)"``, ``"was not measured"``."""
    if verdict == OPEN:
        why = getattr(verdict, "why", "")
        return f"is {OPEN}" + (f" ({why})" if why else "")
    return {MISSING: f"was {MISSING}"}.get(verdict, str(verdict))


def min_permutation_p(n: int) -> float:
    """The smallest two-sided permutation p-value a rank correlation of ``n`` pairs can reach:
    ``2 / n!`` (only the two perfect orderings are as extreme), e.g. 1/12 for 4 blocks."""
    return 2.0 / math.factorial(n) if n >= 1 else math.nan


def finite(*values) -> bool:
    """Every value a finite number (numpy scalars included, bools not)."""
    return all(isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) for v in values)


def ratio_interval_text(low: float, high: float) -> str:
    """A ratio's interval: ``"[1.2×, 3.4×]"``; when even its lower end is past
    ``zones.pruning.COLLAPSE_RATIO`` (one arm collapsed), ``"> 10³ [2.10 × 10³, 5.00 × 10⁶]"``:
    the ratio says only that it is huge, and the bounds are shown as they are."""
    if not finite(low, high):
        return "undefined"
    if low > COLLAPSE_RATIO:
        return f"> {power_of_ten(round(math.log10(COLLAPSE_RATIO)))} [{fmt_num(low)}, {fmt_num(high)}]"
    return f"[{fmt_ratio(low)}, {fmt_ratio(high)}]"


# --- α predicts importance ---------------------------------------------------------------------------

PAPER_RHO_MID = round(sum(PAPER_RHO) / 2, 3)   # 0.765: the effect whose power the pages quote


def band_verdict(value: float, low: float, high: float, band: tuple[float, float], *, significant: bool,
                 units: str, **limit) -> Verdict:
    """The one reading of a figure against the paper's band ``(a, b)``, shared by every magnitude
    rule (ρ, the Last-N ratio, the worst/best gap), so that overshoot is read the same way in all:

    holds if ``value`` (the point figure) is at or above ``a`` and ``significant`` (the paper's own standard: its
    point figure, separable from no effect), with the detail "within the paper's range" or
    "beyond the paper's range (overshoot)"; does not hold if the interval lies below ``a``;
    inconclusive otherwise (``units`` and ``limit`` say which limit binds)."""
    if not finite(value, low, high):
        return Verdict(OPEN, UNDEFINED)
    a, b = band
    if high < a:
        return Verdict(FAILS, detail=f"the interval lies below the paper's {fmt_num(a)}")
    if value >= a and significant:
        where = "within the paper's range" if value <= b else \
            f"beyond the paper's range (overshoot: above {fmt_num(b)})"
        return Verdict(HOLDS, detail=where)
    return inconclusive(units, low=low, high=high, **limit)


def strict_band(low: float, high: float, band: tuple[float, float]) -> str:
    """The strict reading, printed as a second, labelled line: the whole 95% interval at or
    above the band's lower end (``holds``), wholly below it (``does not hold``), else
    ``inconclusive``; it answers "is the effect at least the paper's smallest?", which the
    book's sizes rarely can (see the power table in Methods)."""
    if not finite(low, high):
        return OPEN
    return HOLDS if low >= band[0] else FAILS if high < band[0] else OPEN


def rho_power(n_blocks: int | None, rho: float = PAPER_RHO_MID) -> float:
    """The chance that :func:`score_rho` says "holds" at ``n_blocks`` blocks if the true ρ is
    ``rho`` (by default the middle of the paper's band), simulated by
    ``zones.analysis.power.rho_rule_power``; NaN without a block count."""
    if n_blocks is None or not finite(n_blocks) or int(n_blocks) < 3:
        return math.nan
    return rho_rule_power(rho_rule, float(rho), int(n_blocks))["holds"]


@rule(f"ρ of the α chosen in advance (the chapter's parameter, not the best of the table), read as the paper "
      f"reads each of its models: holds if ρ is at or above {PAPER_RHO[0]} and its permutation p < {PAPER_RHO_P} "
      f"(\"within the paper's range\" up to {PAPER_RHO[1]}, \"beyond\" above it); does not hold if its 95% "
      f"interval (blocks resampled) lies below {PAPER_RHO[0]}; inconclusive otherwise, bound by the blocks, with "
      f"the rule's power at that many blocks (the chance of 'holds' if the true ρ were {PAPER_RHO_MID}). The "
      f"strict reading (the whole interval at or above {PAPER_RHO[0]}) is printed beside it")
def score_rho(rho: float, low: float, high: float, p_value: float, n_blocks: int | None = None) -> Verdict:
    """Claim "α predicts importance, ρ = 0.69–0.84 with p < 0.02" (:func:`band_verdict`);
    ``n_blocks`` gives the smallest p a permutation test can reach (:func:`min_permutation_p`)
    and the power quoted when inconclusive (:func:`rho_power`)."""
    if n_blocks is not None and min_permutation_p(int(n_blocks)) >= PAPER_RHO_P and finite(low, high) \
            and high >= PAPER_RHO[0]:
        return Verdict(OPEN, BLOCKS, f"with {n_blocks} blocks the smallest two-sided permutation p is "
                                     f"{fmt_num(min_permutation_p(int(n_blocks)), 2)}, not below {PAPER_RHO_P}")
    significant = finite(p_value) and p_value < PAPER_RHO_P
    verdict = band_verdict(rho, low, high, PAPER_RHO, significant=significant, units="blocks", n_units=n_blocks)
    if verdict == OPEN and verdict.reason == BLOCKS:
        power = rho_power(n_blocks)
        if finite(power):
            verdict.detail += f"; power {power:.2f} at {n_blocks} blocks (if the true ρ were {PAPER_RHO_MID})"
    return verdict


def rho_rule(rho: float, low: float, high: float, p: float, n: int) -> str:
    """:func:`score_rho` as the power simulation calls it (no power in its detail: no recursion)."""
    significant = p < PAPER_RHO_P
    if min_permutation_p(int(n)) >= PAPER_RHO_P:
        significant = False
    return str(band_verdict(rho, low, high, PAPER_RHO, significant=significant, units="blocks", n_units=n))


def rho_strict_rule(rho: float, low: float, high: float, p: float, n: int) -> str:  # noqa: ARG001
    """The strict reading of ρ (:func:`strict_band` with p < 0.02), as the power simulation calls it."""
    word = strict_band(low, high, PAPER_RHO)
    return OPEN if word == HOLDS and not p < PAPER_RHO_P else word


DEPTH_RHO_CLAIM = "α predicts importance beyond block depth"


PARTIAL_P = 0.05   # the permutation p the partial ρ's verdict needs, beside its interval


@rule(f"ρ(α, ΔLoss) partialled on block index (the ranks of α and of ΔLoss each regressed on the rank of the block's "
      f"index, ρ the correlation of the residuals), the α chosen in advance; its 95% interval resamples the blocks "
      f"and the eval windows behind each block's ΔLoss together, a resample in which it is undefined counting as 0; "
      f"not estimable at this design (inconclusive, undefined) when more than {MAX_UNDEFINED:.0%} of the resamples "
      f"leave it undefined (α nearly monotone in depth leaves too little to correlate); otherwise holds if the "
      f"interval lies above 0 and the permutation p (residuals shuffled, Kennedy's test) is below {PARTIAL_P}; does "
      f"not hold if the interval lies below 0 with that p; inconclusive (blocks) otherwise")
def score_partial_rho(low: float, high: float, *, p_value: float = math.nan, undefined: float = 0.0,
                      n_blocks: int | None = None) -> Verdict:
    """The book's own claim beside the paper's ρ: α carries information about a block's
    importance that its position does not (the paper's figure is the raw ρ, without this control).
    Both the interval and the permutation p must agree: on few blocks with α nearly monotone in
    depth, an interval alone says "holds" far more often than 5% of the time when α and ΔLoss
    share nothing but their depth trends (Methods' structured null). A table without ``p_value``
    (from before this rule) cannot say "holds"."""
    if not finite(undefined):
        return Verdict(OPEN, UNDEFINED, "the share of undefined resamples is missing (a table from before they were "
                                        "counted)")
    if undefined > MAX_UNDEFINED:
        return Verdict(OPEN, UNDEFINED, f"not estimable at this design: {undefined:.0%} of the resamples leave the "
                                        f"partial ρ undefined (more than {MAX_UNDEFINED:.0%})")
    limit = binding_limit("blocks", low=low, high=high, n_units=n_blocks)
    side = interval_side(low, high, 0.0)
    significant = finite(p_value) and p_value < PARTIAL_P
    if side in ("above", "below") and not significant:
        shown = fmt_num(p_value, 2) if finite(p_value) else "not computed"
        return Verdict(OPEN, BLOCKS, f"{limit[1]}; the interval lies {side} 0 but the permutation p is {shown}, not "
                                     f"below {PARTIAL_P}")
    return side_verdict(side, "above", *limit)


def partial_rule(rho: float, low: float, high: float, p: float, n: int, undefined: float = 0.0) -> str:  # noqa: ARG001
    """:func:`score_partial_rho` as the power simulation calls it."""
    return str(score_partial_rho(low, high, p_value=p, undefined=undefined, n_blocks=n))


@rule("ρ's 95% interval excludes 0: α detectably predicts importance, in the sign of ρ; it includes 0: not "
      "detectably (the interval resamples blocks, so a model with more blocks, not more eval tokens, would narrow "
      "it); undefined: ρ cannot be computed")
def rho_verdict(correlation: dict, model: str, alpha_name: str) -> str:
    """The chapters' verdict sentence on one model's ρ (``rho, ci_low, ci_high`` and, when known,
    ``n`` or ``n_layers`` or ``n_blocks`` of ``zones.analysis.importance.spearman``)."""
    side = interval_side(correlation["ci_low"], correlation["ci_high"], 0.0)
    if side == "undefined":
        return f"On {model} ρ cannot be computed (too few blocks, or a constant α or ΔLoss)."
    if side == "straddles":
        n = next((correlation[k] for k in ("n", "n_layers", "n_blocks") if finite(correlation.get(k))), None)
        blocks = f"its {int(n)} blocks" if n is not None else "its blocks"
        return (f"On {model} the interval includes zero: the block's {alpha_name} does not detectably predict its "
                f"importance (the interval resamples {blocks}; more eval tokens would not narrow it).")
    direction = "larger" if side == "above" else "smaller"
    return (f"On {model} the interval excludes zero: blocks with a {direction} {alpha_name} tend to matter "
            f"more.")


# --- zone-aware against Last-N -----------------------------------------------------------------------

@rule("ratio = ΔPPL(Last-N) / ΔPPL(zone-aware) at the largest k; holds if its 95% interval lies above 1; does "
      "not hold if below 1; inconclusive (budget) if it contains 1; a zero-width interval (both removed the same "
      "blocks, so every resample gives the same ratio) is read as it stands. On a trained run (the across-models "
      "chapter, k = ⌈L/4⌉) the same reading of the paired difference Δloss(Last-N) − Δloss(zone-aware), which is "
      "above 0 exactly when the ratio is above 1")
def score_ratio_direction(low: float, high: float, *, ratio: float | None = None, tokens: int | None = None) -> Verdict:
    """Claim "zone-aware removes blocks more cheaply than Last-N", from the ratio's interval
    (``ratio`` and ``tokens``, when given, say how far a larger budget would have to go)."""
    if finite(low, high) and low == high:
        return Verdict(HOLDS if low > 1 else FAILS)
    return side_verdict(interval_side(low, high, 1.0), "above",
                        *binding_limit("windows", low=low, high=high, tokens=tokens, estimate=ratio, threshold=1.0))


@rule(f"the same ratio, read as every magnitude rule is (the same reading as ρ's): holds if the ratio is at or "
      f"above {PAPER_RATIO[0]} and its 95% interval lies above 1 (\"within the paper's range\" up to "
      f"{PAPER_RATIO[1]}, \"beyond the paper's range\" above it: an overshoot, as when Last-N collapses, is "
      f"labelled, not failed); does not hold if the interval lies below {PAPER_RATIO[0]}; inconclusive (budget) "
      f"otherwise, (undefined) if it is undefined. Read only between comparable arms: where an arm's pruned model "
      f"is no better than a uniform guess (its loss at or above ln V), the row is not comparable, counted apart "
      f"from holds (the ratio then measures a collapse). The strict reading (the whole interval inside "
      f"[{PAPER_RATIO[0]}, {PAPER_RATIO[1]}]) is printed beside it")
def score_ratio_magnitude(low: float, high: float, *, ratio: float | None = None,
                          tokens: int | None = None, collapsed: str = "") -> Verdict:
    """Claim "… by 1.1×–3.6×" (:func:`band_verdict`; without ``ratio`` the interval's
    geometric middle stands for it); ``collapsed``: :func:`collapsed_arms`' words, when an arm
    left the paper's regime (the verdict is then :data:`APART`)."""
    if collapsed:
        return Verdict(APART, detail=collapsed)
    if ratio is None and finite(low, high) and low > 0:
        ratio = math.sqrt(low * high)
    return band_verdict(ratio if ratio is not None else math.nan, low, high, PAPER_RATIO,
                        significant=finite(low) and low > 1, units="windows", tokens=tokens, estimate=ratio,
                        threshold=PAPER_RATIO[0])


def collapsed_arms(losses: Mapping[str, float], vocab_size: int | None) -> str:
    """The arms of a ratio that left the regime the paper measured, in words ("" when none, or
    when the vocabulary size is unknown): an arm whose pruned model's loss is at or above ln V,
    no better than a uniform guess over its V-word vocabulary, has collapsed, and a ratio of its
    ΔPPL to another's measures the collapse, not how much better the other arm prunes."""
    if not vocab_size or not finite(float(vocab_size)) or vocab_size < 2:
        return ""
    uniform = math.log(float(vocab_size))
    gone = [f"{name} collapses (its loss {fmt_num(loss, 3)} nats ≥ ln V = {fmt_num(uniform, 3)})"
            for name, loss in losses.items() if finite(loss) and loss >= uniform]
    return fmt_list(gone) if gone else ""


def strict_ratio_magnitude(low: float, high: float) -> str:
    """The strict reading of the magnitude: the whole interval inside the paper's band."""
    if not finite(low, high):
        return OPEN
    lo, hi = PAPER_RATIO
    if low >= lo and high <= hi:
        return HOLDS
    return FAILS if (low > hi or high < lo) else OPEN


@rule("the separable winner at each k (its paired Δloss interval excludes 0; otherwise neither wins there); "
      "holds if Last-N wins at some k, zone-aware wins at the largest k, and every zone-aware win comes after "
      "Last-N's last win (at the k between and after, zone-aware may be not separable from Last-N, but is "
      "never behind it); does not hold if zone-aware wins at the smallest k with Last-N never ahead (no "
      "crossover), if Last-N wins at the largest k (zone-aware never overtakes), or if a zone-aware win comes "
      "before a Last-N win (they trade places: no single crossover); inconclusive (budget) otherwise: ties "
      "hide whether, or where, they cross")
def score_crossover(winners: Mapping[int, str], ours: str = OURS, comparator: str = "last_n", *,
                    tokens: int | None = None) -> Verdict:
    """Claim "Last-N is better at small k, zone-aware from k ≈ 6" (the paper: zone-aware
    overtakes Last-N from about k = 6). ``winners`` maps k to the separable winner at k
    (``compare_strategies``' ``winner``: ``ours``, ``comparator`` or ``tie``). A tie after
    Last-N's last win does not stop the claim from holding (an overtaking seen through
    intervals may pass through ties); a Last-N win after a zone-aware win does."""
    if not winners:
        return Verdict(OPEN, UNDEFINED)
    # the page's sentence reads the same rule (zones.pruning.compare.read_crossover): one decision
    status = read_crossover(winners, ours, comparator).status
    if status == CROSSES:
        return Verdict(HOLDS)
    if status == NO_CROSSOVER:
        return Verdict(FAILS)
    return inconclusive("windows", tokens=tokens)


@rule(f"the largest worst/best ΔPPL ratio over k, read as every magnitude rule is: holds if it is at or above "
      f"{PAPER_RATIO[0]} (the smallest ratio the paper calls an effect) and its 95% interval lies above 1 "
      f"(\"within the paper's range\" up to {PAPER_GAP}, \"beyond the paper's range\" above it: labelled, "
      f"not failed, exactly as the Last-N ratio); does not hold if the interval lies below {PAPER_RATIO[0]}; "
      f"inconclusive otherwise, (undefined) if the best arm's ΔPPL interval reaches 0; not comparable (counted "
      f"apart) when the worst arm's pruned model is no better than a uniform guess (its loss at or above ln V)")
def score_gap(low: float, high: float, *, gap: float | None = None, tokens: int | None = None,
              collapsed: str = "") -> Verdict:
    """Claim "the choice of strategy matters: worst-vs-best gaps up to 23.7×" (:func:`band_verdict`
    with the band [1.1, 23.7]; without ``gap`` the interval's geometric middle stands for it);
    ``collapsed`` as in :func:`score_ratio_magnitude`."""
    if collapsed:
        return Verdict(APART, detail=collapsed)
    if gap is None and finite(low, high) and low > 0:
        gap = math.sqrt(low * high)
    return band_verdict(gap if gap is not None else math.nan, low, high, (PAPER_RATIO[0], PAPER_GAP),
                        significant=finite(low) and low > 1, units="windows", tokens=tokens, estimate=gap,
                        threshold=PAPER_RATIO[0])


HEALING_CLAIM = "spectral-guided pruning beats Last-N after healing"
HEALING_PAPER = "1.1×–3.6× lower ΔPPL than Last-N (before healing; the paper does not heal)"


@rule("d = Δloss(Last-N keeping the last block) − Δloss(zone-aware), both healed by the same method with the "
      "same repair capacity (the bridge: one d×d map per pruned model) and token budget, on the same eval windows, "
      "at every k the chapter measures (stated before the data: one k is not enough); holds if d's 95% interval "
      "lies above 0 at every k; does not hold if it lies below 0 at some k (zone-aware trails there); inconclusive "
      "(budget) otherwise")
def score_after_healing(by_k: Mapping[int, tuple[float, float]], *, differences: Mapping[int, float] | None = None,
                        tokens: int | None = None) -> Verdict:
    """The healing chapter's claim, from d's interval at each k (``by_k``: k → (low, high); above
    0: zone-aware's healed model is better). Requiring every k to agree controls the chance of a
    false "holds" at 5% whatever the number of k; a single k where zone-aware is separably behind
    decides against it. The detail names the k that decided."""
    if not by_k:
        return Verdict(OPEN, UNDEFINED)
    sides = {int(k): interval_side(low, high, 0.0) for k, (low, high) in sorted(by_k.items())}
    behind = [k for k, side in sides.items() if side == "below"]
    if behind:
        return Verdict(FAILS, detail=f"zone-aware trails at k = {fmt_list([str(k) for k in behind])}")
    if all(side == "above" for side in sides.values()):
        return Verdict(HOLDS, detail=f"ahead at every k ({fmt_list([str(k) for k in sides])})")
    if any(side == "undefined" for side in sides.values()):
        return Verdict(OPEN, UNDEFINED)
    k = next(k for k, side in sides.items() if side == "straddles")
    low, high = by_k[k]
    estimate = (differences or {}).get(k)
    reason, detail = binding_limit("windows", low=low, high=high, tokens=tokens, estimate=estimate, threshold=0.0)
    return Verdict(OPEN, reason, f"not separable at k = {k}; {detail}")


TASK_CLAIM = "zone-aware beats Last-N on task accuracy"


@rule("d = accuracy (lm-eval's acc_norm) of zone-aware − of Last-N keeping the last block, both pruned at the "
      "healing chapter's largest k and healed by its method and budget, over the same examples of zones' offline "
      "tasks; b = the examples only zone-aware answers right, c = those only Last-N answers right (d = (b − c) / n), "
      "p = the exact two-sided McNemar p (the binomial test of b among the b + c discordant examples at ½); holds "
      f"if d > 0 and p < {EXACT_ALPHA}; does not hold if d < 0 and p < {EXACT_ALPHA}; inconclusive (examples) "
      "otherwise, with b, c and the rule's power at this number of examples (the bootstrap interval of d is "
      "shown beside them; it does not decide)")
def score_task_accuracy(b: int, c: int, *, n_examples: int | None = None, effect: float = 0.10) -> Verdict:
    """The task-accuracy chapter's claim, from the discordant counts ``b`` and ``c`` over
    ``n_examples`` (b > c: zone-aware's pruned and healed model answers more of them). With few
    discordant examples the percentile bootstrap over examples is too narrow (7 against 1 of 40:
    interval [+0.02, +0.28], exact p = 0.070), so the exact test decides. An inconclusive
    verdict's detail gives b, c, p and the power of this rule at ``n_examples``
    (``zones.analysis.paired.mcnemar_power``) for a true difference of ``effect`` at the observed
    discordance (b + c) / n, or at ``effect`` itself where fewer examples were discordant (a
    difference of ``effect`` needs at least that share). Counts that are missing (a table from
    before the exact test) give an undefined verdict."""
    if not finite(b, c):
        return Verdict(OPEN, UNDEFINED, "the discordant counts b and c are missing (a table from before the "
                                        "exact test)")
    b, c = int(b), int(c)
    p = mcnemar_p(b, c)
    if p < EXACT_ALPHA and b != c:
        return Verdict(HOLDS if b > c else FAILS)
    detail = (f"{b} examples only zone-aware answered right, {c} only Last-N (exact McNemar p = "
              f"{fmt_num(p, 2)})")
    if n_examples is not None and finite(n_examples) and n_examples >= max(b + c, 1):
        rate = max((b + c) / n_examples, effect)
        power = mcnemar_power(effect, rate, int(n_examples), alpha=EXACT_ALPHA)
        detail += (f"; at {int(n_examples)} examples this rule says holds with probability {fmt_num(power, 2)} "
                   f"when the true d is {fmt_num(effect, 2, signed=True)} and {fmt_num(rate, 2)} of the examples "
                   f"are discordant")
    return Verdict(OPEN, EXAMPLES, detail)


# --- the α profile, block importance, the lifecycle --------------------------------------------------

PAPER_RISE = round(PAPER_Q_PROFILE[1] - PAPER_Q_PROFILE[0], 3)   # 0.26: Pythia-410M's Q-projection α, first → last
MIN_RISE_SHARE = 0.25                                               # the smallest rise the claim counts: a quarter
MIN_RISE = round(MIN_RISE_SHARE * PAPER_RISE, 3)                    # of the paper's, in its α units (0.065)


def shape_effect(row: Mapping[str, float]) -> tuple[float, float, float, str]:
    """The size that decides a shape, with its interval and its name, from a ``profile_shape`` row:
    an inverted U's ``peak_lift`` (the parabola's rise to its top), otherwise the fitted line's
    ``rise`` (first block → last)."""
    if str(row.get("shape")) == "inverted U" and "peak_lift" in row:
        return float(row["peak_lift"]), float(row["peak_lift_low"]), float(row["peak_lift_high"]), "rise to the top"
    return float(row.get("rise", math.nan)), float(row.get("rise_low", math.nan)), \
        float(row.get("rise_high", math.nan)), "fitted rise"


@rule(f"over depth, blocks resampled: the shape first (an inverted U: the fitted parabola's curvature interval "
      f"below 0 with its turn inside the depth; a rise: the rank trend, Spearman ρ of α with the block index, has "
      f"its interval above 0; a fall or a U shape the opposite), then its size against a minimum effect of "
      f"{MIN_RISE} in α units (a quarter of the paper's rise, {PAPER_Q_PROFILE[0]} → {PAPER_Q_PROFILE[1]}; for an "
      f"inverted U the parabola's rise from the first block to its top, else the fitted line's rise): holds if the "
      f"shape rises or is an inverted U and its size is at least {MIN_RISE}; does not hold for a fall or a U "
      f"shape, or when the size's 95% interval lies below {MIN_RISE} (a rise too small to be the paper's); "
      f"inconclusive (blocks) otherwise")
def score_shape(shape: str, *, effect: float = math.inf, effect_low: float = math.inf,
                effect_high: float = math.inf, n_blocks: int | None = None) -> Verdict:
    """Claim "the α profile rises with depth (an inverted U in deeper models)", from
    ``zones.analysis.profile.profile_shape``'s ``shape`` and the size that decides it
    (:func:`shape_effect`; left out, the shape alone decides, as the power simulation reads it).
    The weights are all there is, so only more blocks would narrow an inconclusive one."""
    if shape in ("falls", "U-shaped"):
        return Verdict(FAILS)
    if shape == "undefined" or not finite(effect, effect_low, effect_high) and effect != math.inf:
        return Verdict(OPEN, UNDEFINED)
    small = effect_high < MIN_RISE
    if small:
        return Verdict(FAILS, detail=f"its size's interval [{fmt_num(effect_low)}, {fmt_num(effect_high)}] lies below "
                                     f"the minimum effect {MIN_RISE}")
    if shape in ("rises", "inverted U"):
        if effect >= MIN_RISE:
            return Verdict(HOLDS)
        return inconclusive("blocks", n_units=n_blocks)._with(
            f"the shape is there but its size {fmt_num(effect)} is below the minimum effect {MIN_RISE}")
    return inconclusive("blocks", n_units=n_blocks)


ASYMMETRY_EFFECT = 2.0   # the std ratio whose power an inconclusive asymmetry quotes: Q/K spread twice as wide as V/O


def asymmetry_rule(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    """:func:`score_asymmetry` as the power simulation calls it (no power in its detail: no recursion)."""
    return str(side_verdict(interval_side(low, high, 1.0), "above", BLOCKS))


def asymmetry_power(n_layers: int | None, ratio: float = ASYMMETRY_EFFECT) -> float:
    """The chance that :func:`score_asymmetry` says "holds" at ``n_layers`` layers if the true
    std(Q/K) / std(V/O) is ``ratio``, simulated by ``zones.analysis.power.asymmetry_rule_power``;
    NaN without a layer count (or with fewer than three)."""
    if n_layers is None or not finite(n_layers) or int(n_layers) < 3:
        return math.nan
    return asymmetry_rule_power(asymmetry_rule, float(ratio), int(n_layers))["holds"]


@rule(f"std over blocks of the Q/K α profile / that of V/O; holds if its 95% interval lies above 1; does not "
      f"hold if below 1; inconclusive (blocks) otherwise, with the rule's power at that many layers (the chance "
      f"of 'holds' if the true ratio were {ASYMMETRY_EFFECT:g})")
def score_asymmetry(low: float, high: float, *, n_layers: int | None = None) -> Verdict:
    """Claim "Q/K carry the depth dependence, V/O stay flat", from the ratio's interval
    (``zones.analysis.profile.qk_vo_asymmetry``: layers resampled); an inconclusive verdict
    quotes :func:`asymmetry_power` at ``n_layers``."""
    verdict = side_verdict(interval_side(low, high, 1.0), "above", *binding_limit("layers", low=low, high=high,
                                                                                   n_units=n_layers))
    power = asymmetry_power(n_layers)
    if verdict == OPEN and verdict.reason == BLOCKS and finite(power):
        verdict.detail += (f"; power {power:.2f} at {int(n_layers)} layers (if the true ratio were "
                           f"{ASYMMETRY_EFFECT:g})")
    return verdict


def first_blocks(n_blocks: int) -> list[int]:
    """The blocks the claim "the first blocks matter most" is about: the first ⌈0.1 · L⌉."""
    return list(range(max(1, math.ceil(FIRST_FRACTION * n_blocks))))


@rule("holds if the costliest block is one of the first ⌈L/10⌉ and its ΔLoss interval lies above every later "
      "block's; does not hold if a later block's interval lies above all of theirs; inconclusive (budget) "
      "otherwise")
def first_blocks_matter_most(table: pd.DataFrame) -> dict:
    """Is the most important block one of the first blocks (:func:`first_blocks`), clearly?

    Without intervals in the table the verdict is ``inconclusive``. The comparison of separate
    intervals is conservative: a paired difference would separate at least as often.

    Returns ``first_blocks`` (text), ``first_ranks`` (each first block's rank by ΔLoss, 1 =
    costliest), ``n_blocks``, ``top_first, top_first_delta, top_first_low, top_first_high``,
    the same for ``top_later`` and for ``reach_later`` (the later block whose interval reaches
    highest), and ``verdict`` (a word).
    """
    df = table.sort_values("layer").reset_index(drop=True)
    low, high = delta_loss_bounds(df)
    head = df["layer"].isin(first_blocks(len(df)))
    if head.all():
        raise ValueError("the model has too few blocks to compare its first blocks with later ones")
    first_i = df.loc[head, "delta_loss"].idxmax()
    later_i = df.loc[~head, "delta_loss"].idxmax()
    if low.isna().any() or high.isna().any():
        verdict = OPEN
    elif df.loc[first_i, "delta_loss"] >= df.loc[later_i, "delta_loss"] and low[first_i] > high[~head].max():
        verdict = HOLDS
    elif (low[~head] > high[head].max()).any():
        verdict = FAILS
    else:
        verdict = OPEN
    span = first_blocks(len(df))
    ranks = df["delta_loss"].rank(ascending=False, method="min").astype(int)
    reach_i = high[~head].idxmax() if high[~head].notna().any() else later_i   # the later interval reaching highest
    return dict(first_blocks=f"{span[0]}" if len(span) == 1 else f"{span[0]}–{span[-1]}",
                first_ranks={int(df.loc[i, "layer"]): int(ranks[i]) for i in df.index[head]}, n_blocks=int(len(df)),
                top_first=int(df.loc[first_i, "layer"]), top_first_delta=float(df.loc[first_i, "delta_loss"]),
                top_first_low=float(low[first_i]), top_first_high=float(high[first_i]),
                top_later=int(df.loc[later_i, "layer"]), top_later_delta=float(df.loc[later_i, "delta_loss"]),
                top_later_low=float(low[later_i]), top_later_high=float(high[later_i]),
                reach_later=int(df.loc[reach_i, "layer"]), reach_later_delta=float(df.loc[reach_i, "delta_loss"]),
                reach_later_low=float(low[reach_i]), reach_later_high=float(high[reach_i]), verdict=verdict)


@rule("g = mean compression of the first half of the layers − the second half's, at every snapshot after "
      "step 0, with intervals from resampling each half's layers; the leading half is the one whose extreme "
      "(max g for early, min g for late) has a percentile interval excluding 0, the earlier one if both; g's "
      "later minimum is its minimum over the snapshots from max g's on, with a simultaneous interval (each "
      "snapshot's g ± c · its resampled sd, c the 95th percentile of the largest |resampled g − g| / sd over "
      "those snapshots; the interval runs from the least lower bound to the least upper one), so that picking "
      "the lowest of several noisy snapshots does not by itself pass; holds if the early half led and that "
      "interval lies below 0; does not hold if the late half led, or the early half led and that interval lies "
      "above 0 (no reversal); inconclusive (blocks: layers per half) otherwise")
def score_wave(leader: str, after_low: float, after_high: float, *, n_layers: int | None = None) -> Verdict:
    """Claim "a compression wave runs from early to late layers, then reverses", from
    ``zones.analysis.lifecycle.wave_reversal`` (step 0 excluded; ``n_layers``: the layers its
    halves resample)."""
    side = interval_side(after_low, after_high, 0.0)
    if leader == "late" or (leader == "early" and side == "above"):
        return Verdict(FAILS)
    if leader == "early" and side == "below":
        return Verdict(HOLDS)
    return Verdict(OPEN, BLOCKS, binding_limit("layers", n_units=n_layers)[1])


@rule(f"by the interval of b alone (snapshots resampled): holds if it contains {PAPER_EXPONENT} and lies above 0; "
      f"does not hold if it excludes {PAPER_EXPONENT}; inconclusive otherwise (it contains {PAPER_EXPONENT} and "
      f"0, or is undefined)")
def score_exponent_interval(low: float, high: float) -> str:
    """b's interval as a word: holds if it contains the paper's exponent and lies above 0, does
    not hold if it excludes the paper's exponent, inconclusive otherwise (or undefined)."""
    side = interval_side(low, high, PAPER_EXPONENT)
    if side == "undefined":
        return OPEN
    if side != "straddles":
        return FAILS
    return HOLDS if low > 0 else OPEN


EXPONENT_RUN_SD = 0.05   # run-to-run sd of log Δα its power assumes: the cpu build's two D8 runs differ by 0.08


def exponent_rule(estimate: float, low: float, high: float, n: int) -> str:  # noqa: ARG001
    """:func:`score_exponent_interval` as the power simulation calls it."""
    return score_exponent_interval(low, high)


def exponent_power(runs: Mapping[int, int] | None, sd: float = EXPONENT_RUN_SD,
                   exponent: float = PAPER_EXPONENT) -> float:
    """The chance that :func:`score_exponent` says "holds" with ``runs`` (depth → training runs) if
    the true exponent is ``exponent`` and each run's log Δα scatters by ``sd`` about the power law,
    simulated by ``zones.analysis.power.exponent_rule_power``; NaN without at least three runs over
    two depths (no t interval)."""
    if not runs or sum(runs.values()) < 3 or len(runs) < 2:
        return math.nan
    cells = tuple(sorted((int(d), int(n)) for d, n in runs.items()))
    return exponent_rule_power(exponent_rule, float(exponent), float(sd), cells)["holds"]


@rule(f"b = least-squares slope of log Δα on log depth with one point per training run (Δα averaged over the "
      f"run's last-quarter snapshots), and its t interval over the runs (n_runs − 2 degrees of freedom, exact for "
      f"few runs where a bootstrap is not): holds if the interval contains {PAPER_EXPONENT} and lies above 0, "
      f"does not hold if it excludes {PAPER_EXPONENT}, inconclusive otherwise (more runs narrow it), with the "
      f"rule's power at those runs (the chance of 'holds' if the true b were {PAPER_EXPONENT} and the runs' log Δα "
      f"scattered by sd {EXPONENT_RUN_SD})")
def score_exponent(low: float, high: float, *, runs: Mapping[int, int] | None = None) -> Verdict:
    """Claim "Δα ∝ L^0.26" from b's interval over training runs; ``runs``: depth → the runs
    the interval read (named when inconclusive, with the rule's power there: :func:`exponent_power`)."""
    word = score_exponent_interval(low, high)
    if word != OPEN:
        return Verdict(word)
    n = sum((runs or {}).values()) or None
    verdict = inconclusive("runs", low=low, high=high, n_units=n, seeds_trained=runs)
    power = exponent_power(runs)
    if verdict.reason == SEEDS and finite(power):
        verdict.detail += (f"; power {power:.2f} at {n} runs (if the true b were {PAPER_EXPONENT} and the runs' "
                           f"log Δα scattered by sd {EXPONENT_RUN_SD})")
    return verdict


# --- several models side by side ---------------------------------------------------------------------

@rule("for each reading (ρ's interval against 0, the paper's ρ claim, zone-aware against Last-N keeping the last "
      "block at k = ⌈L/4⌉, the first blocks matter most, the α profile's shape), the models agree when every "
      "model gives it the same word and part otherwise; an inconclusive (or undefined) word is a word of its "
      "own, so one model's 'holds' beside another's 'inconclusive' is a parting, never an agreement; a reading "
      "with no word for a model (not measured) is left out of both; one model pools nothing")
def models_agreement(readings: Mapping[str, Mapping[str, str]]) -> dict:
    """What several models agree on and where they part: ``readings`` maps a reading (its name,
    as the page writes it) to ``{model label: word}`` (the same models in every reading).

    Returns ``agree`` (reading → the shared word), ``part`` (reading → {word: [models]}, in the
    models' order), ``n_models`` and ``text``: the pooled sentence."""
    if not readings:
        raise ValueError("no readings to pool: give at least one reading with one model's word")
    models = list(next(iter(readings.values())))
    if not models:
        raise ValueError("no models to pool: every reading needs one word per model")
    for name, words in readings.items():
        if list(words) != models:
            raise ValueError(f"reading {name!r} names models {list(words)}, not {models}: every reading needs the "
                             f"same models")
    agree, part = {}, {}
    for name, words in readings.items():
        given = {m: str(w) for m, w in words.items() if w is not None and str(w) != MISSING}
        if not given:
            continue
        groups: dict[str, list[str]] = {}
        for model, word in given.items():
            groups.setdefault(word, []).append(model)
        if len(groups) == 1:
            agree[name] = next(iter(groups))
        else:
            part[name] = groups
    if len(models) == 1:
        listed = "; ".join(f"{name}: {word}" for name, word in agree.items())
        text = f"One model only ({models[0]}), so nothing is pooled; its readings: {listed}."
        return dict(agree=agree, part=part, n_models=1, text=text)
    n = len(models)
    agreed = (f"The {n} models agree on {len(agree)} of the {len(agree) + len(part)} readings: "
              + "; ".join(f"{name}: {word} in all" for name, word in agree.items()) + "."
              if agree else f"The {n} models agree on none of the readings.")
    parted = ("They part on " + "; ".join(
        f"{name} ({', '.join(f'{word}: {fmt_list(group)}' for word, group in groups.items())})"
        for name, groups in part.items()) + "." if part else "They part on none.")
    return dict(agree=agree, part=part, n_models=n, text=f"{agreed} {parted}")


__all__ = ["MIN_RISE", "PAPER_RISE", "shape_effect", "APART", "collapsed_arms", "BLOCKS", "BUDGET", "FAILS", "FIRST_FRACTION", "HEALING_CLAIM", "HEALING_PAPER", "HOLDS",
           "LAST_N_KEEP_LAST", "MISSING", "OPEN", "OURS", "PAPER_CROSSOVER_K", "PAPER_EXPONENT", "PAPER_GAP",
           "PAPER_Q_PROFILE", "PAPER_RATIO", "PAPER_RHO", "PAPER_RHO_P", "REASONS", "SEEDS", "UNDEFINED",
           "UNITS", "VERDICTS", "PAPER_RHO_MID", "Verdict", "band_verdict", "binding_limit", "rho_power", "rho_rule", "rho_strict_rule", "strict_band", "strict_ratio_magnitude", "finite", "first_blocks", "first_blocks_matter_most",
           "from_word", "inconclusive", "models_agreement", "min_permutation_p", "ratio_interval_text", "rho_verdict", "rule", "score_after_healing",
           "score_asymmetry", "score_crossover", "score_task_accuracy", "TASK_CLAIM", "EXAMPLES", "score_exponent", "score_exponent_interval", "score_gap",
           "score_ratio_direction", "score_ratio_magnitude", "score_rho", "score_shape", "score_wave",
           "side_verdict", "verdict_phrase", "EXPONENT_RUN_SD", "exponent_power", "exponent_rule",
           "ASYMMETRY_EFFECT", "asymmetry_power", "asymmetry_rule", "PARTIAL_P", "partial_rule"]
