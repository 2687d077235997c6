"""The verdict vocabulary, the paper's figures, and the helpers every rule shares.

A verdict is one of :data:`HOLDS`, :data:`FAILS`, :data:`OPEN` (inconclusive) or
:data:`MISSING` (not measured). An inconclusive verdict always says *why*
(:data:`REASONS`): the token budget, the number of blocks (layers), the number of training
runs (seeds), or an undefined interval. :class:`Verdict` is a ``str`` (it compares equal
to its word) that carries that reason.

The paper's figures (arXiv 2604.22778) live here once, so the chapters and the scorecard
quote the same numbers. This module imports no other chapter module: every chapter module
and the scorecard import it, never each other.
"""
from __future__ import annotations

import math
from typing import Mapping

from zones.analysis.lifecycle import PAPER_DELTA_ALPHA_EXPONENT
from zones.pruning import COLLAPSE_RATIO
from zones.report.common import interval_side
from zones.report.format import fmt_num, fmt_ratio, power_of_ten

HOLDS, FAILS, OPEN, MISSING = "holds", "does not hold", "inconclusive", "not measured"
VERDICTS = (HOLDS, FAILS, OPEN, MISSING)

# Why a verdict is inconclusive: the limit that a larger run would lift.
BUDGET, BLOCKS, SEEDS, UNDEFINED = "budget", "blocks", "seeds", "undefined"
REASONS = {
    BUDGET: "the interval is too wide at this token budget (more eval tokens narrow it)",
    BLOCKS: "too few blocks or layers to separate it, whatever the token budget",
    SEEDS: "one training run per depth: the interval covers snapshot jitter only, not run-to-run variation",
    UNDEFINED: "the interval is undefined here (too few units, or a quantity that is not positive)",
}

OURS = "zone_aware"               # the paper's spectral-guided pruning strategy

# The paper's figures.
PAPER_RHO = (0.69, 0.84)          # Spearman ρ of α against importance, across its models
PAPER_RHO_P = 0.02                # ... each with p below this
PAPER_RATIO = (1.1, 3.6)          # ΔPPL(Last-N) / ΔPPL(zone-aware)
PAPER_CROSSOVER_K = 6             # zone-aware overtakes Last-N from about this k (Pythia-410M)
PAPER_GAP = 23.7                  # the largest worst/best ΔPPL ratio over strategies
PAPER_Q_PROFILE = (0.22, 0.48)    # Pythia-410M Q-projection α, first block → last block
PAPER_EXPONENT = PAPER_DELTA_ALPHA_EXPONENT   # Δα ∝ L^0.26 (R² = 0.99)


class Verdict(str):
    """A verdict word (``Verdict(OPEN, BLOCKS) == "inconclusive"``) with ``reason``: a key of
    :data:`REASONS` for an inconclusive verdict, ``""`` otherwise."""

    reason: str

    def __new__(cls, word: str, reason: str = "") -> "Verdict":
        if word not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}; got {word!r}")
        if word == OPEN and reason not in REASONS:
            raise ValueError(f"an inconclusive verdict needs a reason in {sorted(REASONS)}; got {reason!r}")
        self = super().__new__(cls, word)
        self.reason = reason if word == OPEN else ""
        return self

    @property
    def why(self) -> str:
        """The reason in words (``""`` unless inconclusive)."""
        return REASONS.get(self.reason, "")


def side_verdict(side: str, good: str, reason: str = BUDGET) -> Verdict:
    """Map :func:`common.interval_side` to a verdict: the ``good`` side holds, the opposite
    fails, a straddling interval is inconclusive for ``reason``, an undefined one for
    :data:`UNDEFINED`."""
    if side == "undefined":
        return Verdict(OPEN, UNDEFINED)
    if side == "straddles":
        return Verdict(OPEN, reason)
    return Verdict(HOLDS if side == good else FAILS)


def from_word(word: str, reason: str = BUDGET) -> Verdict:
    """A chapter's verdict word (``holds``, ``does not hold``, ``inconclusive``) as a :class:`Verdict`."""
    if word in (HOLDS, FAILS):
        return Verdict(word)
    return Verdict(OPEN, reason)


def verdict_phrase(verdict: str) -> str:
    """A verdict as a predicate for "the claim …": ``"holds"``, ``"does not hold"``, ``"is
    inconclusive (too few blocks …)"``, ``"was not measured"``."""
    if verdict == OPEN:
        why = getattr(verdict, "why", "")
        return f"is {OPEN}" + (f" ({why})" if why else "")
    return {MISSING: f"was {MISSING}"}.get(verdict, str(verdict))


def score_ratio_direction(low: float, high: float) -> Verdict:
    """Claim "zone-aware removes blocks more cheaply than Last-N": the ratio ΔPPL(Last-N) /
    ΔPPL(zone-aware) at the largest k; holds if its interval lies above 1, does not hold if
    below 1, inconclusive (budget) if it contains 1. A zero-width interval (both arms removed
    the same blocks, so every resample gives the same ratio) is read as it stands: no budget
    would widen it."""
    if finite(low, high) and low == high:
        return Verdict(HOLDS if low > 1 else FAILS)
    return side_verdict(interval_side(low, high, 1.0), "above")


def score_ratio_magnitude(low: float, high: float) -> Verdict:
    """Claim "… by 1.1×–3.6×": holds if the ratio's interval lies inside [1.1, 3.6]; does not
    hold if it lies wholly above 3.6 (e.g. Last-N collapsed: a ratio of 10⁵ is not the
    paper's 1.1–3.6×) or wholly below 1.1; inconclusive (budget) if it crosses 1.1 or 3.6."""
    lo, hi = PAPER_RATIO
    if not finite(low, high):
        return Verdict(OPEN, UNDEFINED)
    if low >= lo and high <= hi:
        return Verdict(HOLDS)
    if low > hi or high < lo:
        return Verdict(FAILS)
    return Verdict(OPEN, BUDGET)


def score_crossover(winners: Mapping[int, str], ours: str = OURS, reference: str = "last_n") -> Verdict:
    """Claim "Last-N is better at small k, zone-aware from k ≈ 6": ``winners`` maps k to the
    separable winner at k (``compare_strategies``' ``winner``: ``ours``, ``reference`` or
    ``tie``). Holds if the reference wins at some k, ours at some later k and at the largest
    k, and ours never before the reference's last win (ties in between are allowed); does not hold if ours wins
    at k = 1 … with the reference never ahead (no crossover: ours is better from the start),
    or the reference is ahead at the largest k (ours never overtakes); inconclusive (budget)
    otherwise (ties hide where, or whether, they cross)."""
    ks = sorted(winners)
    if not ks:
        return Verdict(OPEN, UNDEFINED)
    ahead = [k for k in ks if winners[k] == ours]
    behind = [k for k in ks if winners[k] == reference]
    if behind and winners[ks[-1]] == reference:
        return Verdict(FAILS)
    if not behind and ahead and ahead[0] == ks[0]:
        return Verdict(FAILS)
    if behind and ahead and max(behind) < min(ahead) and winners[ks[-1]] == ours:
        return Verdict(HOLDS)
    return Verdict(OPEN, BUDGET)


def min_permutation_p(n: int) -> float:
    """The smallest two-sided permutation p-value a rank correlation of ``n`` pairs can reach:
    ``2 / n!`` (only the two perfect orderings are as extreme), e.g. 1/12 for 4 blocks."""
    return 2.0 / math.factorial(n) if n >= 1 else math.nan


def finite(*values) -> bool:
    """Every value a finite number."""
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def interval_text(low: float, high: float, digits: int = 3) -> str:
    """``"[0.12, 0.34]"`` (``zones.report.format.fmt_num``), or ``"undefined"``."""
    if not finite(low, high):
        return "undefined"
    return f"[{fmt_num(low, digits)}, {fmt_num(high, digits)}]"


def ratio_interval_text(low: float, high: float) -> str:
    """A ratio's interval: ``"[1.2×, 3.4×]"``; when even its lower end is past
    ``zones.pruning.COLLAPSE_RATIO`` (one arm collapsed), ``"> 10³ [2.10 × 10³, 5.00 × 10⁶]"``:
    the ratio says only that it is huge, and the bounds are shown as they are."""
    if not finite(low, high):
        return "undefined"
    if low > COLLAPSE_RATIO:
        return f"> {power_of_ten(round(math.log10(COLLAPSE_RATIO)))} [{fmt_num(low)}, {fmt_num(high)}]"
    return f"[{fmt_ratio(low)}, {fmt_ratio(high)}]"


__all__ = ["OURS", "score_crossover", "score_ratio_direction", "score_ratio_magnitude", "BLOCKS", "BUDGET", "FAILS", "HOLDS", "MISSING", "OPEN", "PAPER_CROSSOVER_K", "PAPER_EXPONENT",
           "PAPER_GAP", "PAPER_Q_PROFILE", "PAPER_RATIO", "PAPER_RHO", "PAPER_RHO_P", "REASONS", "SEEDS",
           "UNDEFINED", "VERDICTS", "Verdict", "finite", "from_word", "interval_side", "interval_text",
           "min_permutation_p", "ratio_interval_text", "side_verdict", "verdict_phrase"]
