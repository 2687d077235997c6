"""The α profile's statistics: intervals over blocks, the trend, the shape and the Q/K–V/O
asymmetry, on synthetic profiles with a known answer."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from zones.analysis import profile
from zones.analysis.unit_intervals import interval_side, slope, unit_bootstrap

NAN = float("nan")


def _alpha_table(values: dict[str, np.ndarray]) -> pd.DataFrame:
    rows = [dict(layer=i, role=role, alpha_shape=float(v)) for role, vs in values.items() for i, v in enumerate(vs)]
    return pd.DataFrame(rows)


def test_unit_bootstrap_covers_a_known_slope_and_is_nan_with_too_few_units():
    rng = np.random.default_rng(1)
    x = np.linspace(0, 1, 30)
    y = 0.3 * x + rng.normal(0, 0.05, x.size)
    est, low, high = unit_bootstrap([x, y], slope)
    assert low < 0.3 < high and low < est < high and high - low < 0.2
    assert math.isnan(unit_bootstrap([x[:2], y[:2]], slope)[1])
    # strata: each resampled on its own
    est, low, high = unit_bootstrap([np.array([1.0, 1.2, 0.8]), np.array([0.0, 0.1, -0.1])],
                                           lambda a, b, axis=-1: a.mean(axis) - b.mean(axis), paired=False)
    assert est == pytest.approx(1.0) and 0.7 < low < 1.0 < high < 1.3


@pytest.mark.parametrize("low, high, side", [(0.1, 0.2, "above"), (-0.2, -0.1, "below"), (-0.1, 0.1, "straddles"),
                                             (NAN, 0.1, "undefined")])
def test_interval_side(low, high, side):
    assert interval_side(low, high, 0.0) == side


def test_depth_trend_says_rises_falls_or_flat():
    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, 24)
    table = _alpha_table({"q": 0.22 + 0.26 * x + rng.normal(0, 0.02, x.size),
                          "k": 0.5 - 0.2 * x + rng.normal(0, 0.02, x.size),
                          "v": 0.4 + np.tile([0.05, -0.05], 12)})
    trend = profile.depth_trend(table).set_index("role")
    assert trend.loc["q", "trend"] == "rises" and trend.loc["q", "rise_low"] < 0.26 < trend.loc["q", "rise_high"]
    assert trend.loc["q", "first_fit"] == pytest.approx(0.22, abs=0.03)
    assert trend.loc["k", "trend"] == "falls"
    assert trend.loc["v", "trend"] == "flat within noise"
    assert profile.trend_word(NAN, NAN) == "undefined"


def test_qk_vo_asymmetry_branches():
    rng = np.random.default_rng(0)
    wavy, flat = np.sin(np.linspace(0, 3, 20)), 0.01 * rng.normal(size=20)

    def groups_of(qk, vo):
        return pd.DataFrame([dict(layer=i, group=g, value=v) for g, vs in (("Q/K", qk), ("V/O", vo))
                             for i, v in enumerate(vs)])

    assert profile.qk_vo_asymmetry(groups_of(wavy, flat))["asymmetry"] == "Q/K larger"
    assert profile.qk_vo_asymmetry(groups_of(flat, wavy))["asymmetry"] == "V/O larger"
    noise = rng.normal(size=20)
    same = profile.qk_vo_asymmetry(groups_of(noise, noise[::-1]))  # equal spread, other order
    assert same["asymmetry"] == "not separable" and same["ratio_low"] < 1 < same["ratio_high"]
    missing = profile.qk_vo_asymmetry(groups_of(wavy, flat).query("group == 'Q/K'"))
    assert missing["asymmetry"] == "undefined"
    # group_profile averages the roles of a group per layer
    table = _alpha_table({"q": np.array([1.0, 2.0]), "k": np.array([3.0, 4.0]), "v": np.array([0.0, 0.0])})
    grouped = profile.group_profile(table).set_index(["layer", "group"])["value"]
    assert grouped[(0, "Q/K")] == 2.0 and grouped[(1, "Q/K")] == 3.0 and grouped[(1, "V/O")] == 0.0


def test_profile_shape_branches():
    x = np.linspace(0, 1, 16)
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 0.005, x.size)
    shape = lambda y: profile.profile_shape(_alpha_table({"q": y}), "q", n_resamples=300)
    assert shape(0.2 + 0.3 * x + noise)["shape"] == "rises"
    bump = shape(0.2 + x * (1 - x) + noise)
    assert bump["shape"] == "inverted U" and 0.4 < bump["vertex"] < 0.6
    assert shape(0.5 - 0.3 * x + noise)["shape"] == "falls"
    assert shape(0.5 - x * (1 - x) + noise)["shape"] == "U-shaped"
    assert shape(0.3 + 0.05 * rng.normal(size=x.size))["shape"] == "not separable"
    assert shape(np.array([0.1, 0.2]))["shape"] == "undefined"
