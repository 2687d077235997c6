"""The scorecard's rules, simulated: their power when the paper's effect is true, their error
when there is none, and the Methods table that prints both (``zones.report.operating``)."""
from pathlib import Path

import pytest

from zones.analysis.power import mean_draws, operating, rho_draws, rho_rule_power
from zones.report import operating as op
from zones.report import verdicts

ROOT = Path(__file__).resolve().parents[1]


def test_the_methods_page_prints_the_table_the_code_computes():
    page = (ROOT / "book" / "methods" / "verdicts.md").read_text()
    printed = [line for line in page.splitlines() if line.startswith("| ")]
    computed = op.operating_markdown(op.operating_table()).splitlines()
    assert printed == computed, "book/methods/verdicts.md is stale: regenerate it with python -m zones.report.operating"


def test_the_paper_reading_of_rho_has_power_where_the_strict_reading_has_none():
    # the finding: with a true ρ of 0.84 the strict reading says "holds" rarely at 12 blocks
    strict = operating(verdicts.rho_strict_rule, rho_draws(0.84, 12, n_draws=200))
    fair = operating(verdicts.rho_rule, rho_draws(0.84, 12, n_draws=200))
    assert strict["holds"] < 0.25 < 0.7 < fair["holds"]
    # and without any effect neither says "holds", and the fair one says "does not hold" at 30 blocks
    null = operating(verdicts.rho_rule, rho_draws(0.0, 30, n_draws=200))
    assert null["holds"] <= 0.02 and null["does not hold"] > 0.9


def test_the_rho_rule_rarely_passes_a_rho_below_the_band_at_the_largest_size():
    below = operating(verdicts.rho_rule, rho_draws(0.5, 30, n_draws=200))
    assert below["holds"] < 0.15


def test_a_rule_against_zero_errs_at_about_its_level_without_an_effect():
    shares = operating(lambda estimate, low, high, n: str(verdicts.side_verdict(
        verdicts.interval_side(low, high, 0.0), "above")), mean_draws(0.0, 1.0, 64, n_draws=300))
    assert shares["holds"] < 0.1 and shares["does not hold"] < 0.1
    strong = operating(lambda estimate, low, high, n: str(verdicts.side_verdict(
        verdicts.interval_side(low, high, 0.0), "above")), mean_draws(1.0, 1.0, 12, n_draws=300))
    assert strong["holds"] > 0.8


def test_an_inconclusive_rho_says_its_power():
    v = verdicts.score_rho(0.6, 0.2, 0.85, 0.01, 12)
    assert v == verdicts.OPEN and v.reason == verdicts.BLOCKS and "power" in v.detail and "12 blocks" in v.detail
    assert 0 < rho_rule_power(verdicts.rho_rule, verdicts.PAPER_RHO_MID, 12)["holds"] < 1


@pytest.mark.parametrize("rho, low, high, p, verdict, detail", [
    (0.75, 0.4, 0.9, 0.001, verdicts.HOLDS, "within the paper's range"),      # the paper's own standard
    (0.92, 0.80, 0.97, 0.001, verdicts.HOLDS, "beyond the paper's range"),    # overshoot: labelled, not failed
    (0.75, 0.4, 0.9, 0.05, verdicts.OPEN, "power"),                           # p not small enough
    (0.2, -0.2, 0.6, 0.3, verdicts.FAILS, "below")])
def test_the_rho_rule_on_borderline_tables(rho, low, high, p, verdict, detail):
    scored = verdicts.score_rho(rho, low, high, p, 30)
    assert scored == verdict and detail in scored.why


def test_overshoot_is_read_the_same_way_by_every_band_rule():
    ratio = verdicts.score_ratio_magnitude(2e5, 9e5, ratio=4e5)
    gap = verdicts.score_gap(82.0, 252.0, gap=130.0)
    rho = verdicts.score_rho(0.95, 0.9, 0.99, 0.0001, 30)
    assert ratio == gap == rho == verdicts.HOLDS
    assert all("beyond the paper's range" in v.why for v in (ratio, gap, rho))
    assert verdicts.strict_ratio_magnitude(2e5, 9e5) == verdicts.FAILS   # the strict line still says so


def test_the_exponent_rule_over_runs_errs_at_about_its_level_and_gains_power_with_runs():
    from zones.analysis.power import exponent_draws

    rule = lambda estimate, low, high, n: str(verdicts.score_exponent_interval(low, high))
    true = {runs: operating(rule, exponent_draws(0.26, 0.05, {8: runs, 12: runs, 16: runs}, n_draws=300))
            for runs in (1, 2, 3)}
    assert all(t["does not hold"] < 0.1 for t in true.values())             # the t interval's 5%, not more
    assert true[1]["holds"] < true[2]["holds"] < true[3]["holds"] and true[3]["holds"] > 0.85
    null = operating(rule, exponent_draws(0.0, 0.05, {8: 3, 12: 3, 16: 3}, n_draws=300))
    assert null["holds"] < 0.05 and null["does not hold"] > 0.85
