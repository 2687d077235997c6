"""Sentences a reader repeats: nouns agree with their numbers ("1 seed", never "1 seeds" or
"window(s)"), one run is never "pooled", a one-seed row compares nothing, a sentence about power
follows the verdict beside it, and the pages' hand-written facts match the code."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from zones.report.format import plural, seeds_phrase

ROOT = Path(__file__).resolve().parents[1]


def test_plural_agrees_with_the_number():
    assert [plural(1, "seed"), plural(20, "seed"), plural(2, "matrix"), plural(1, "calibration window"),
            plural(4, "calibration window"), plural(16320, "token")] == [
        "1 seed", "20 seeds", "2 matrices", "1 calibration window", "4 calibration windows", "16,320 tokens"]
    assert seeds_phrase(1) == "its one seed" and seeds_phrase(20) == "the median over 20 seeds"


def _pooled_and_runs():
    runs = pd.DataFrame([dict(depth=8, seed=0, rho=0.5, ci_low=0.1, ci_high=0.8, p_value=0.02),
                         dict(depth=8, seed=1, rho=0.4, ci_low=-0.1, ci_high=0.7, p_value=0.2),
                         dict(depth=12, seed=0, rho=0.3, ci_low=-0.2, ci_high=0.6, p_value=0.31)])
    pooled = pd.DataFrame([dict(depth="8", n_runs=2, rho=0.45, ci_low=0.1, ci_high=0.7, p_value=0.01),
                           dict(depth="12", n_runs=1, rho=0.3, ci_low=-0.2, ci_high=0.6, p_value=0.27),
                           dict(depth="all", n_runs=3, rho=0.4, ci_low=0.1, ci_high=0.6, p_value=0.01)])
    return pooled, runs


def test_one_run_is_not_pooled_and_shows_its_own_p():
    from zones.figures.depth_series import rho_intervals
    from zones.report.depth_series import pooled_text

    pooled, runs = _pooled_and_runs()
    text = pooled_text(pooled, runs)
    assert "depth 8 (pooled over 2 runs): ρ = 0.45" in text
    assert "depth 12 (one run, seed 0, nothing to pool): ρ = 0.30 [−0.20, 0.60], p = 0.31" in text
    assert "1 runs" not in text and "p = 0.27" not in text
    rows = [r["row"] for rows in rho_intervals(runs, pooled).to_dict()["datasets"].values() for r in rows if "row" in r]
    assert "D8, pooled" in rows and "D12, pooled" not in rows and "all runs, pooled" in rows


def test_a_one_seed_depth_compares_no_seeds():
    from zones.report.depth_series import agreement_shown

    agreement = pd.DataFrame([dict(depth=8, n_seeds=2, profile_rho=0.9, costliest_blocks="0, 0", same_costliest=True,
                                   rho_min=0.4, rho_max=0.5, rho_spread=0.1),
                              dict(depth=12, n_seeds=1, profile_rho=np.nan, costliest_blocks="0", same_costliest=True,
                                   rho_min=0.3, rho_max=0.3, rho_spread=0.0)])
    shown = agreement_shown(agreement).set_index("depth")
    assert shown.loc[8, "same_costliest"] is True and shown.loc[8, "rho_spread"] == 0.1
    assert pd.isna(shown.loc[12, "same_costliest"]) and math.isnan(shown.loc[12, "rho_spread"])


def test_the_round_trip_sentence_says_which_way_the_interval_moved():
    from zones.report.depth_series import _flipped

    summary = pd.DataFrame([dict(model="D8 s0", rho_before_low=0.1, rho_before_high=0.8, rho_after_low=-0.1,
                                 rho_after_high=0.7),
                            dict(model="D12 s0", rho_before_low=-0.1, rho_before_high=0.6, rho_after_low=0.05,
                                 rho_after_high=0.7)])
    text = _flipped(summary)
    assert "on D8 s0 ρ's interval excludes zero with the float32 weights but includes it after the Q4_1 round trip" in text
    assert "on D12 s0 ρ's interval includes zero with the float32 weights but excludes it after the Q4_1 round trip" in text
    assert "one side of the round trip" not in text
    assert _flipped(summary.iloc[:0]) == ""


def test_the_power_sentence_follows_the_verdict():
    from zones.report.task_accuracy import power_sentence

    held = power_sentence("holds", 0.79)
    assert "inconclusive" not in held and "(holds) is decided" in held and "0.79" in held
    assert "says little" in power_sentence("inconclusive", 0.5)
    assert "some evidence against" in power_sentence("inconclusive", 0.9)
    assert "not computed" in power_sentence("not measured", float("nan"))


def test_the_group_of_all_matrices_is_not_the_all_matrices():
    from zones.report.spectral_lifecycle import exponent_shown, group_phrase

    assert group_phrase("all") == "all matrices" and group_phrase("Q/K") == "the Q/K matrices"
    assert exponent_shown(dict(exponent=-0.5, low=-0.86, high=-0.15)) == "−0.50 [−0.86, −0.15]"


def _cpu_seeds() -> dict[int, int]:
    from zones.series.config import profile_depths, profile_seeds

    return {depth: len(profile_seeds("cpu", depth)) for depth in profile_depths("cpu")}


def test_the_methods_table_and_the_notebook_comment_give_the_cpu_profile_s_seeds():
    seeds = _cpu_seeds()
    row = next(line for line in (ROOT / "book/methods/training.md").read_text().splitlines()
               if line.startswith("| `cpu`"))
    shown = ", ".join(f"{d} ({', '.join(str(s) for s in range(n))})" for d, n in sorted(seeds.items()))
    assert f"| {shown} |" in row
    comment = next(line for line in (ROOT / "notebooks/depth_series.md").read_text().splitlines()
                   if line.startswith("seeds = "))
    by_count = {}
    for depth, n in sorted(seeds.items()):
        by_count.setdefault(n, []).append(f"D{depth}")
    for n, depths in by_count.items():
        names = depths[0] if len(depths) == 1 else ", ".join(depths[:-1]) + f" and {depths[-1]}"
        assert f"{n} for {names}" in comment, comment


def test_the_notebooks_write_no_number_agreement_by_hand():
    text = "\n".join(p.read_text() for p in (ROOT / "notebooks").glob("*.md"))
    assert "window(s)" not in text
    assert not re.search(r"\{glue:text\}`seeds` seeds", text)    # "over 1 seeds"
    assert "Hover over a bar for" not in text                     # a phone has no hover
    assert "the band is its 95% interval" not in text            # the crossover's intervals are whiskers
    assert "the {glue:text}`delta_group_name` matrices" not in text   # "the all matrices"


def test_the_chance_exercise_states_its_answer():
    from zones.report.task_accuracy import chance_text

    accuracy = pd.DataFrame([dict(task="all", strategy="full", accuracy=0.4, accuracy_low=0.33, accuracy_high=0.47),
                             dict(task="all", strategy="greedy", accuracy=0.27, accuracy_low=0.2, accuracy_high=0.34),
                             dict(task="all", strategy="last_n", accuracy=0.1, accuracy_low=0.05, accuracy_high=0.2),
                             dict(task="arc", strategy="full", accuracy=0.9, accuracy_low=0.8, accuracy_high=0.95)])
    text = chance_text(accuracy)
    assert text.startswith("Better than chance by their intervals: full (")
    assert "not shown to beat chance (the interval includes 0.25): greedy (" in text
    assert "worse than chance: last_n (" in text and text.endswith(".")
    assert chance_text(accuracy.iloc[:0]) == "No variant was scored on these examples."
