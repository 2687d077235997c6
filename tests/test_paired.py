"""zones.analysis.paired: the exact McNemar test of two variants over the same examples, and the
power of the task-accuracy rule "d > 0 and exact p < 0.05", against values computed by hand."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from zones.analysis.paired import _critical, mcnemar_exact, mcnemar_p, mcnemar_power


def answers(both: int, only_a: int, only_b: int, neither: int) -> tuple[np.ndarray, np.ndarray]:
    a = [1] * both + [1] * only_a + [0] * only_b + [0] * neither
    b = [1] * both + [0] * only_a + [1] * only_b + [0] * neither
    return np.array(a), np.array(b)


def test_seven_against_one_of_forty_is_p_0_0703125():
    """The issue's case: 7 vs 1 discordant pairs of 40; by hand p = 2·(C(8,7) + C(8,8)) / 2⁸ = 18/256."""
    a, b = answers(20, 7, 1, 12)
    test = mcnemar_exact(a, b)
    assert (test.n, test.b, test.c) == (40, 7, 1)
    assert test.difference == pytest.approx(6 / 40) and test.discordance == pytest.approx(8 / 40)
    assert test.p_exact == pytest.approx(0.0703125, abs=1e-12)
    swapped = mcnemar_exact(b, a)   # the test is symmetric: the counts swap, d changes sign, p stays
    assert (swapped.b, swapped.c, swapped.difference, swapped.p_exact) == (1, 7, -test.difference, test.p_exact)


@pytest.mark.parametrize("b, c, p", [(0, 0, 1.0), (6, 0, 2 / 64), (5, 0, 2 / 32), (4, 4, 1.0), (0, 6, 2 / 64),
                                     (9, 1, 2 * 11 / 1024), (7, 1, 18 / 256)])
def test_exact_p_by_hand(b, c, p):
    assert mcnemar_p(b, c) == pytest.approx(p, abs=1e-12)


def test_bools_are_answers_and_bad_answers_are_one_line():
    assert mcnemar_exact([True, False, True], [False, False, True]).b == 1
    with pytest.raises(ValueError, match="same examples; got 3 and 2"):
        mcnemar_exact([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="0/1"):
        mcnemar_exact([1, 0, 0.5], [1, 0, 1])
    with pytest.raises(ValueError, match="b must be an integer >= 0"):
        mcnemar_p(-1, 3)


def test_the_critical_count_is_the_binomial_tests():
    """The power's rejection region is exactly where scipy's binomtest says p < 0.05 with b > c."""
    m = np.arange(0, 120)
    for count, critical in zip(m, _critical(m, 0.05)):
        want = next((b for b in range(count + 1) if 2 * b > count and stats.binomtest(b, count, 0.5).pvalue < 0.05),
                    count + 1)
        assert critical == want, count


def test_power_by_hand():
    # every example discordant and always the first's: holds whenever 2/2ⁿ < 0.05, i.e. n >= 6
    assert mcnemar_power(1.0, 1.0, 6) == 1.0 and mcnemar_power(1.0, 1.0, 5) == 0.0
    # all discordant, the first right with probability 3/4: only b = 6 of 6 reaches p < 0.05
    assert mcnemar_power(0.5, 1.0, 6) == pytest.approx(0.75 ** 6, abs=1e-12)
    # no true difference: the rule says holds at most half the level (one side of a two-sided test)
    assert mcnemar_power(0.0, 0.2, 400) <= 0.025


def test_power_agrees_with_a_simulation_and_grows_with_the_examples():
    rng = np.random.default_rng(0)
    n, sims = 40, 20000
    u = rng.random((sims, n))
    b, c = (u < 0.15).sum(1), ((u >= 0.15) & (u < 0.20)).sum(1)   # d = +0.10, discordance 0.20
    p = {pair: mcnemar_p(*pair) for pair in set(zip(b.tolist(), c.tolist()))}
    simulated = np.mean([bb > cc and p[(bb, cc)] < 0.05 for bb, cc in zip(b.tolist(), c.tolist())])
    exact = mcnemar_power(0.10, 0.20, n)
    assert exact == pytest.approx(simulated, abs=0.012)
    powers = [mcnemar_power(0.10, 0.20, size) for size in (40, 100, 200, 400)]
    assert powers == sorted(powers) and powers[0] < 0.25 and powers[-1] > 0.99


def test_power_refuses_a_difference_larger_than_the_discordance():
    with pytest.raises(ValueError, match="difference must be a finite number >= -0.1 and <= 0.1"):
        mcnemar_power(0.2, 0.1, 40)
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        mcnemar_power(0.1, 0.2, 0)
