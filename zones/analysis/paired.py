"""Two variants answering the same examples right or wrong: the exact McNemar test and its power.

When two models answer the same n examples, only the *discordant* examples tell them apart:
``b`` examples that the first answers right and the second wrong, ``c`` the reverse. The
difference of accuracies is d = (b − c) / n. Under "no difference" each discordant example is
a fair coin, so b is Binomial(b + c, ½) given b + c; the exact two-sided McNemar p is that
binomial test's (``scipy.stats.binomtest``; for the fair coin it equals
min(1, 2·P(X ≥ max(b, c)))). With few discordant pairs a percentile bootstrap over examples is
too narrow (7 against 1 of 40 examples: bootstrap interval [+0.02, +0.28], exact p = 0.070);
the exact test is the one that holds its level.

* :func:`mcnemar_p`: the exact two-sided p from the discordant counts;
* :func:`mcnemar_exact`: b, c, d and p from two 0/1 answer vectors;
* :func:`mcnemar_power`: the probability that the rule "d > 0 and p < α" says *holds*, for a
  true difference and discordance rate over n examples (an exact binomial sum, no simulation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

from zones.core.checks import check_float, check_int

EXACT_ALPHA = 0.05   # the level of every exact test here


@dataclass(frozen=True)
class McNemar:
    """The exact McNemar test of two variants over the same ``n`` examples: ``b`` (only the
    first right), ``c`` (only the second right), ``difference`` = (b − c) / n (accuracy of the
    first − of the second) and ``p_exact`` (two-sided)."""

    n: int
    b: int
    c: int
    difference: float
    p_exact: float

    @property
    def discordance(self) -> float:
        """The share of examples the two answer differently, (b + c) / n."""
        return (self.b + self.c) / self.n if self.n else float("nan")


def mcnemar_p(b: int, c: int) -> float:
    """The exact two-sided McNemar p: ``scipy.stats.binomtest(b, b + c, 0.5)``; 1 when no
    example is discordant."""
    b, c = check_int(b, "b", min=0), check_int(c, "c", min=0)
    return 1.0 if b + c == 0 else float(stats.binomtest(b, b + c, 0.5).pvalue)


def _answers(values, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    if array.ndim != 1 or not np.isin(array, (0.0, 1.0)).all():
        raise ValueError(f"{name} must be a 1-D sequence of 0/1 (or bool) answers; got shape {array.shape}")
    return array.astype(bool)


def mcnemar_exact(a_correct, b_correct) -> McNemar:
    """The exact McNemar test of variant A against variant B from their answers to the same
    examples (``a_correct[i]``: A answered example i right; 0/1 or bool, equal lengths)."""
    a, b = _answers(a_correct, "a_correct"), _answers(b_correct, "b_correct")
    if a.shape != b.shape:
        raise ValueError(f"a_correct and b_correct must answer the same examples; got {a.size} and {b.size}")
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    n = int(a.size)
    return McNemar(n, only_a, only_b, (only_a - only_b) / n if n else float("nan"), mcnemar_p(only_a, only_b))


def _critical(m: np.ndarray, alpha: float) -> np.ndarray:
    """For each number m of discordant examples, the smallest b whose exact two-sided p,
    min(1, 2·P(X ≥ b)) with X ~ Binomial(m, ½), is below ``alpha`` (m + 1 where none is). Such
    a b always exceeds m/2 (below it p = 1); found from ``binom.isf`` and nudged onto the
    strict inequality."""
    found = np.asarray(stats.binom.isf(alpha / 2, m, 0.5), dtype=float) + 1
    found = np.where(np.isfinite(found), found, m + 1).astype(np.int64)
    p = lambda b: 2.0 * stats.binom.sf(b - 1, m, 0.5)  # noqa: E731 (the doubled tail, for b > m/2)
    for _ in range(2):  # isf's rounding can leave it one off either way
        found = np.where((found <= m) & (p(found) >= alpha), found + 1, found)
        found = np.where((found - 1 > m / 2) & (p(found - 1) < alpha), found - 1, found)
    return np.minimum(found, m + 1)


def mcnemar_power(difference: float, discordance: float, n: int, *, alpha: float = EXACT_ALPHA) -> float:
    """The probability that the rule "d > 0 and exact McNemar p < ``alpha``" says *holds* when
    each of ``n`` examples is, independently, answered right by the first variant only with
    probability (``discordance`` + ``difference``) / 2 and by the second only with
    (``discordance`` − ``difference``) / 2. An exact sum over the number m of discordant
    examples: Σₘ Binomial(m; n, discordance) · P(b ≥ b*(m)), b ~ Binomial(m, ½ + difference /
    (2·discordance)), b*(m) the smallest b > m/2 with p < alpha. Needs |difference| ≤
    discordance ≤ 1."""
    n = check_int(n, "n", min=1)
    discordance = check_float(discordance, "discordance", min=0.0, max=1.0, min_inclusive=False)
    difference = check_float(difference, "difference", min=-discordance, max=discordance)
    alpha = check_float(alpha, "alpha", min=0.0, max=1.0, min_inclusive=False, max_inclusive=False)
    m = np.arange(n + 1)
    first = 0.5 + difference / (2 * discordance)
    reach = stats.binom.sf(_critical(m, alpha) - 1, m, first)
    return float(np.clip((stats.binom.pmf(m, n, discordance) * reach).sum(), 0.0, 1.0))
