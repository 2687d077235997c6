"""zones.report.format: the book's one way of writing numbers, intervals and tables."""
import math

import numpy as np
import pandas as pd
import pytest

from zones.report.format import (
    csv_links,
    display_table,
    fmt_delta_ppl,
    fmt_int,
    fmt_interval,
    fmt_nats,
    fmt_num,
    fmt_p,
    fmt_pct,
    fmt_ppl,
    fmt_ratio,
    for_glue,
    rounded,
)


@pytest.mark.parametrize("value, text", [
    (0.012345, "0.0123"), (0.123456, "0.123"), (1.5, "1.50"), (12.0, "12.0"), (649.81, "650"),
    (1234.5, "1,230"), (0.9996, "1.00"), (99.96, "100"), (0, "0"),
    # huge values in powers of ten, not long runs of digits
    (22_369_156.15, "2.24 × 10⁷"), (91_138.49, "9.11 × 10⁴"), (649_812.71, "6.50 × 10⁵"), (1e-5, "1.00 × 10⁻⁵"),
    (-1.5, "\u22121.50"), (-22_369_156.15, "\u22122.24 × 10⁷"),
    (float("nan"), "n/a"), (None, "n/a"), (math.inf, "∞"), (-math.inf, "\u2212∞"),
])
def test_numbers_have_significant_figures_a_true_minus_and_powers_of_ten(value, text):
    assert fmt_num(value) == text


def test_digits_and_sign():
    assert fmt_num(0.123456, digits=2) == "0.12"
    assert fmt_num(0.05, signed=True) == "+0.0500"
    assert fmt_num(-0.0001, digits=2) == "\u22121.0 × 10⁻⁴"
    assert fmt_num(-0.0004, digits=1) == "\u22124 × 10⁻⁴"
    assert "-" not in fmt_num(-3.0) and "-" not in fmt_num(-3e-9)
    assert fmt_int(16320) == "16,320"


@pytest.mark.parametrize("args, text", [
    ((0.19, -0.2, 0.54), "0.19 [\u22120.20, 0.54]"),             # an interval that spans zero
    ((0.1234, 0.1, 0.15), "0.123 [0.100, 0.150]"),               # decimals follow the interval's width
    ((12.3456, 10.2, 14.9), "12.3 [10.2, 14.9]"),
    ((2.2e7, 1.9e7, 2.6e7), "2.20 × 10⁷ [1.90 × 10⁷, 2.60 × 10⁷]"),
    ((0.5, float("nan"), 0.7), "0.500 [n/a]"),
    ((float("nan"), 0.1, 0.2), "n/a"),
])
def test_intervals_read_estimate_then_bounds(args, text):
    assert fmt_interval(*args) == text


def test_interval_units_and_signs():
    assert fmt_interval(0.19, -0.2, 0.54, unit="nats") == "0.19 [\u22120.20, 0.54] nats"
    assert fmt_interval(0.19, -0.2, 0.54, signed=True) == "+0.19 [\u22120.20, +0.54]"
    # a zero-width interval keeps the estimate's figures instead of crashing
    assert fmt_interval(0.25, 0.25, 0.25) == "0.25 [0.25, 0.25]"


def test_ratios_cap_at_powers_of_ten():
    assert fmt_ratio(3.24) == "3.2×"
    assert fmt_ratio(1.1) == "1.1×"
    assert fmt_ratio(22_369_156.15) == "> 10⁴×"
    assert fmt_ratio(math.inf) == "> 10⁴×"
    assert fmt_ratio(5e6, cap=1e6) == "> 10⁶×"
    assert fmt_ratio(1e-6) == "< 10⁻⁴×"
    assert fmt_ratio(float("nan")) == "n/a"


def test_losses_and_perplexities_are_labelled():
    assert fmt_nats(0.123) == "0.123 nats"
    assert fmt_nats(-0.05, signed=True) == "\u22120.0500 nats"
    assert fmt_nats(float("nan")) == "n/a"
    assert fmt_ppl(23.41) == "perplexity 23.4"
    assert fmt_ppl(91_138.49) == "perplexity 9.11 × 10⁴"
    assert fmt_delta_ppl(3.2) == "ΔPPL +3.20"
    assert fmt_delta_ppl(-0.5) == "ΔPPL \u22120.500"
    assert fmt_pct(0.1234) == "12%"
    assert fmt_p(0.0312) == "p = 0.031"
    assert fmt_p(1e-5) == "p < 0.001"


def test_display_table_rounds_for_the_page_and_leaves_the_data_alone():
    table = pd.DataFrame({"k": [1, 2], "strategy": ["last_n", "zone_aware"], "ppl": [22_369_156.15, 23.456789]})
    shown = display_table(table)
    page = shown._repr_html_()
    assert page.startswith('<div class="zones-table">') and page.endswith("</div>")
    assert "2.24 × 10⁷" in page and "23.5" in page
    assert "22369156" not in page and "23.456789" not in page
    assert shown.data["ppl"].tolist() == [22_369_156.15, 23.456789]  # full precision kept
    assert rounded(table)["k"].tolist() == ["1", "2"]
    assert "zone_aware" in repr(shown)


def test_csv_links_are_download_roles_relative_to_the_notebook(tmp_path):
    out = tmp_path / "results" / "chapter"
    out.mkdir(parents=True)
    pd.DataFrame({"a": [0.123456789]}).to_csv(out / "table.csv", index=False)
    pd.DataFrame({"b": [1]}).to_csv(out / "other.csv", index=False)
    text = csv_links(out, start=tmp_path).data
    assert "{download}`other.csv <results/chapter/other.csv>`" in text
    assert "{download}`table.csv <results/chapter/table.csv>`" in text
    with pytest.raises(FileNotFoundError, match="missing.csv.*re-run the chapter"):
        csv_links(out, names=["missing.csv"], start=tmp_path)
    with pytest.raises(FileNotFoundError, match="no CSV tables"):
        csv_links(tmp_path / "empty", start=tmp_path)


def test_glued_values_read_like_the_rest_of_the_page():
    assert for_glue(-0.0374) == "\u22120.0374" and for_glue(53.2417) == "53.2"
    assert for_glue(248) == 248 and for_glue(16320) == "16,320"
    assert for_glue("holds") == "holds" and for_glue(True) is True and for_glue(None) is None
    assert for_glue(float("nan")) == "n/a"
    # numpy scalars (what pandas and numpy hand back) are glued like python ones
    assert for_glue(np.int64(16320)) == "16,320" and for_glue(np.int32(248)) == 248
    assert type(for_glue(np.int64(248))) is int
    assert for_glue(np.float32(1.5)) == "1.50" and for_glue(np.float64(53.2417)) == "53.2"
    assert for_glue(np.bool_(True)) == True  # noqa: E712 (a flag stays a flag)
    assert for_glue([1.5, 2]) == [1.5, 2]
