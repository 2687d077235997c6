"""benchmarks/bench_book_precision.py: the rule that says whether a chapter built in its default
precision (bfloat16 where native) concludes what the float32 build concludes."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_book_precision.py"


def bench():
    spec = importlib.util.spec_from_file_location("bench_book_precision", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def table(delta, low, high, verdict="holds", removed="1,2"):
    return pd.DataFrame(dict(removed=[removed, "3"], delta_loss=delta, delta_loss_low=low, delta_loss_high=high,
                             verdict=[verdict, "inconclusive"], reason=["a", "b"]))


def test_an_estimate_moved_by_more_than_a_tenth_of_its_half_width_fails():
    b = bench()
    reference = table([0.50, 0.10], [0.40, 0.00], [0.60, 0.20])   # half-widths 0.10
    near = b.compare_table(reference, table([0.505, 0.109], [0.4, 0.0], [0.6, 0.2]), "t.csv")
    assert abs(near["share"] - 0.09) < 1e-9 and near["where"] == "t.csv:delta_loss:row 1" and not near["problem"]
    far = b.compare_table(reference, table([0.52, 0.10], [0.4, 0.0], [0.6, 0.2]), "t.csv")
    assert abs(far["share"] - 0.2) < 1e-9


def test_a_changed_verdict_or_removal_set_is_a_difference_whatever_the_numbers(tmp_path):
    b = bench()
    reference = table([0.5, 0.1], [0.4, 0.0], [0.6, 0.2])
    assert b.compare_table(reference, table([0.5, 0.1], [0.4, 0.0], [0.6, 0.2], verdict="inconclusive"),
                           "t.csv")["verdicts_differ"] == 1
    other_set = b.compare_table(reference, table([0.5, 0.1], [0.4, 0.0], [0.6, 0.2], removed="1,4"), "t.csv")
    assert "removed differs" in other_set["problem"]
    # a chapter: every CSV compared; one table over the share fails the chapter
    for name, frame in (("float32", reference), ("default", table([0.52, 0.1], [0.4, 0.0], [0.6, 0.2]))):
        (tmp_path / name / "sub").mkdir(parents=True)
        frame.to_csv(tmp_path / name / "sub" / "delta.csv", index=False)
        frame.to_csv(tmp_path / name / "same.csv", index=False)
    found = b.compare_chapter(tmp_path / "float32", tmp_path / "default")
    assert found["tables"] == 2 and not found["agree"] and abs(found["share"] - 0.2) < 1e-9
    (tmp_path / "default" / "sub" / "delta.csv").write_text(reference.to_csv(index=False))
    (tmp_path / "default" / "same.csv").write_text(reference.to_csv(index=False))
    assert b.compare_chapter(tmp_path / "float32", tmp_path / "default")["agree"]


def test_missing_cells_are_equal_to_missing_cells():
    b = bench()
    a = pd.DataFrame(dict(role=[None, "q"], delta_loss=[0.1, 0.2], delta_loss_low=[0.0, 0.1], delta_loss_high=[0.2, 0.3]))
    found = b.compare_table(a, a.copy(), "t.csv")
    assert not found["problem"] and found["share"] == 0.0


def test_a_rho_is_judged_against_its_own_interval():
    b = bench()
    a = pd.DataFrame(dict(rho=[0.5], ci_low=[0.3], ci_high=[0.7], p_value=[0.01]))
    found = b.compare_table(a, a.assign(rho=[0.53]), "rho.csv")
    assert abs(found["share"] - 0.15) < 1e-9 and found["where"] == "rho.csv:rho:row 0"   # 0.03 of a half-width 0.2
