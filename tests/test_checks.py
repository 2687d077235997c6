"""The shared scalar validator: python and numpy values accepted, bools and wrong types refused, one-line errors."""

import math

import numpy as np
import pytest

from zones.core.checks import check_choice, check_float, check_int, check_probability


@pytest.mark.parametrize("value", [3, np.int64(3), np.int32(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_integers_and_returns_python_int(value):
    result = check_int(value, "n", min=1)
    assert result == 3
    assert type(result) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), 99.9, 99.0, np.float64(3.0), "3", None, [3]])
def test_check_int_refuses_bools_floats_and_other_types(value):
    with pytest.raises(ValueError, match=r"^step must be an integer; got "):
        check_int(value, "step")


def test_check_int_bounds_and_message():
    assert check_int(0, "k", min=0, max=2) == 0
    assert check_int(2, "k", min=0, max=2) == 2
    with pytest.raises(ValueError) as info:
        check_int(np.int64(0), "seeds", min=1)
    assert str(info.value) == "seeds must be an integer >= 1; got 0"
    with pytest.raises(ValueError, match=r"^k must be an integer >= 0 and <= 2; got 3$"):
        check_int(3, "k", min=0, max=2)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [0.5, 1, np.float32(0.5), np.float64(0.5), np.int64(1)])
def test_check_float_accepts_numbers_and_returns_python_float(value):
    result = check_float(value, "level", min=0, max=1)
    assert type(result) is float
    assert result == float(value)


@pytest.mark.parametrize("value", [True, np.bool_(False), "0.5", None])
def test_check_float_refuses_bools_and_non_numbers(value):
    with pytest.raises(ValueError, match=r"^x must be a finite number; got "):
        check_float(value, "x")


def test_check_float_finiteness_and_bounds():
    for bad in (math.nan, math.inf, -math.inf, np.float64("nan")):
        with pytest.raises(ValueError, match="finite"):
            check_float(bad, "x")
    assert check_float(math.inf, "x", finite=False) == math.inf
    assert math.isnan(check_float(math.nan, "x", finite=False))
    with pytest.raises(ValueError, match=r"^x must be a finite number >= 0; got -0.1$"):
        check_float(-0.1, "x", min=0)
    with pytest.raises(ValueError, match=r"^level must be a finite number > 0 and < 1; got 1.0$"):
        check_float(1.0, "level", min=0, max=1, min_inclusive=False, max_inclusive=False)
    with pytest.raises(ValueError, match=r"> 0"):
        check_float(0, "level", min=0, min_inclusive=False)


def test_check_probability():
    assert check_probability(0, "p") == 0.0
    assert check_probability(np.float32(1.0), "p") == 1.0
    for bad in (-0.01, 1.01, math.nan, True):
        with pytest.raises(ValueError, match=r"^p must be a finite number >= 0.0 and <= 1.0; got "):
            check_probability(bad, "p")


def test_check_choice():
    assert check_choice("mean", "how", ["mean", "median"]) == "mean"
    assert check_choice(np.str_("mean"), "how", ("mean", "median")) == "mean"
    with pytest.raises(ValueError) as info:
        check_choice("mode", "how", ["mean", "median"])
    assert str(info.value) == "how must be one of 'mean', 'median'; got 'mode'"
    with pytest.raises(ValueError, match="one of 1, 2; got True"):
        check_choice(True, "k", [1, 2])
    with pytest.raises(ValueError, match="one of"):
        check_choice(["mean"], "how", ["mean"])
    with pytest.raises(ValueError, match="one of"):
        check_choice(np.array([1, 2]), "how", [1, 2])
