"""The lifecycle readings on snapshot tables built to show (or not show) each phenomenon."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from zones.analysis import lifecycle

ROLES = ("q", "k", "v", "o", "mlp_in", "mlp_out")


def snapshot_table(depth: int, steps, stable_rank, alpha) -> pd.DataFrame:
    """A snapshot table whose values come from functions of (step, layer, role)."""
    rows = [dict(step=s, layer=l, role=r, stable_rank=stable_rank(s, l, r), alpha_shape=alpha(s, l, r),
                 alpha_esd=2.0) for s in steps for l in range(depth) for r in ROLES]
    return pd.DataFrame(rows)


def travelling_wave(step, layer, role):
    """Q/K matrices lose rank early layers first; late layers later overshoot them. V/O and MLP
    compress the same at every depth."""
    if role in ("q", "k"):
        start = 10 * layer                        # the wave front reaches layer l at step 10 l
        depth_of_fall = 0.4 + 0.1 * layer         # late layers end up more compressed
        fall = depth_of_fall * min(1.0, max(0.0, (step - start) / 20))
        return 20.0 * (1 - fall)
    return 20.0 * (1 - 0.3 * min(1.0, step / 50))


def inverted_u(step, layer, role, depth=6):
    x = layer / (depth - 1)
    return 0.3 + min(1.0, step / 50) * 0.4 * x * (1 - x) * 4


def test_role_groups():
    assert [lifecycle.role_group(r) for r in ROLES] == ["Q/K", "Q/K", "V/O", "V/O", "MLP", "MLP"]
    assert lifecycle.role_group("mlp_gate") == "MLP"


def test_group_grid_averages_the_roles_of_each_group():
    snaps = snapshot_table(3, [0, 10], lambda s, l, r: {"q": 1.0, "k": 3.0}.get(r, 5.0),
                           lambda s, l, r: float(l))
    grid = lifecycle.group_grid(snaps, "stable_rank", ("Q/K", "V/O", "all"))
    assert set(grid["depth"]) == {3}
    qk = grid[grid["group"] == "Q/K"]
    assert (qk["value"] == 2.0).all() and len(qk) == 6
    assert grid[grid["group"] == "all"]["value"].tolist() == pytest.approx([(1 + 3 + 4 * 5) / 6] * 6)
    assert grid["relative_depth"].max() == 1.0
    with pytest.raises(ValueError, match="unknown group"):
        lifecycle.group_grid(snaps, "stable_rank", ("QK",))
    with pytest.raises(ValueError, match="lacks column"):
        lifecycle.group_grid(snaps.drop(columns="alpha_shape"), "alpha_shape")


def test_a_wave_from_early_to_late_layers_is_seen_leading_then_reversing():
    snaps = snapshot_table(6, range(0, 101, 5), travelling_wave, inverted_u)
    waves = lifecycle.wave_summary(lifecycle.wave_gradient(snaps)).set_index("group")
    assert waves.loc["Q/K", "leader"] == "early"
    assert waves.loc["Q/K", "reversed"]
    assert waves.loc["Q/K", "peak_step"] < waves.loc["Q/K", "trough_step"]
    assert waves.loc["Q/K", "final_gradient"] < 0           # late layers over-compressed
    assert waves.loc["V/O", "leader"] == "none" and not waves.loc["V/O", "reversed"]
    onset = lifecycle.compression_onset(snaps, "Q/K")
    assert onset["onset_step"].is_monotonic_increasing and onset["onset_step"].iloc[-1] > onset["onset_step"].iloc[0]


def test_compression_is_relative_to_the_first_snapshot():
    snaps = snapshot_table(2, [0, 10], lambda s, l, r: 10.0 if s == 0 else 4.0, lambda s, l, r: 1.0)
    comp = lifecycle.with_compression(snaps)
    assert (comp[comp["step"] == 0]["compression"] == 0).all()
    assert comp[comp["step"] == 10]["compression"].tolist() == pytest.approx([0.6] * 12)


def test_delta_alpha_and_the_peak_of_an_inverted_u():
    snaps = snapshot_table(6, [0, 25, 50], travelling_wave, inverted_u)
    deltas = lifecycle.delta_alpha(snaps).set_index("group")
    profile = [inverted_u(50, l, "q") for l in range(6)]
    assert deltas.loc["Q/K", "delta_alpha"] == pytest.approx(max(profile) - min(profile))
    assert 0 < deltas.loc["all", "peak_position"] < 1
    spread = lifecycle.spread_over_time(snaps, "alpha_shape")
    qk = spread[spread["group"] == "Q/K"].sort_values("step")["spread"].tolist()
    assert qk[0] == pytest.approx(0) and qk[-1] == pytest.approx(deltas.loc["Q/K", "delta_alpha"])


def test_asymmetry_shows_q_k_varying_with_depth_and_v_o_uniform():
    snaps = snapshot_table(6, range(0, 101, 10), travelling_wave, inverted_u)
    spreads = lifecycle.asymmetry(snaps).set_index("group")
    assert spreads.loc["Q/K", "compression_spread_max"] > 0.2
    assert spreads.loc["V/O", "compression_spread_max"] == pytest.approx(0, abs=1e-12)


def test_power_law_fit_recovers_a_known_exponent():
    depths = np.array([4, 6, 8, 12])
    fit = lifecycle.fit_power_law(depths, 0.05 * depths ** 0.26)
    assert fit["exponent"] == pytest.approx(0.26)
    assert fit["prefactor"] == pytest.approx(0.05)
    assert fit["r2"] == pytest.approx(1.0) and fit["n"] == 4
    noisy = lifecycle.fit_power_law(depths, 0.05 * depths ** 0.26 * np.array([1.1, 0.9, 1.05, 0.97]))
    assert noisy["r2"] < 1


@pytest.mark.parametrize("x, y, match", [
    ([4], [0.1], "two distinct"), ([4, 4], [0.1, 0.2], "two distinct"),
    ([4, 8], [0.1, -0.2], "positive"), ([4, 8], [0.1], "differ in length"),
])
def test_power_law_fit_refuses_what_it_cannot_fit(x, y, match):
    with pytest.raises(ValueError, match=match):
        lifecycle.fit_power_law(x, y)


def test_delta_alpha_fits_across_a_stacked_series():
    parts = []
    for depth in (4, 6, 8):
        snaps = snapshot_table(depth, [0, 50], travelling_wave,
                               lambda s, l, r, d=depth: 0.3 + 0.02 * d ** 0.5 * l / (d - 1) * min(1, s / 50))
        parts.append(snaps.assign(depth=depth))
    deltas = lifecycle.delta_alpha(pd.concat(parts, ignore_index=True))
    fits = lifecycle.delta_alpha_fits(deltas).set_index("group")
    assert fits.loc["Q/K", "exponent"] == pytest.approx(0.5)
    assert (fits["paper_exponent"] == lifecycle.PAPER_DELTA_ALPHA_EXPONENT).all()


def test_the_readings_accept_a_snapshot_table_computed_from_checkpoints(tmp_path):
    """A checkpoint series of one model (Llama roles, unevenly spaced steps, no depth column)."""
    from conftest import tiny_model

    from zones.series.checkpoints import lifecycle_snapshots

    for k, step in enumerate((0, 1, 4, 64)):
        tiny_model("llama", n_layers=4, seed=k).save_pretrained(tmp_path / f"step{step}")
    snaps = lifecycle_snapshots(str(tmp_path / "step*"), progress=False)
    assert "depth" not in snaps.columns and sorted(snaps["step"].unique()) == [0, 1, 4, 64]
    grid = lifecycle.group_grid(snaps, "compression")
    assert set(grid["depth"]) == {4} and (grid[grid["step"] == 0]["value"] == 0).all()
    waves = lifecycle.wave_summary(lifecycle.wave_gradient(snaps))
    assert waves["depth"].tolist() == [4, 4, 4] and set(waves["group"]) == set(lifecycle.GROUPS)
    spread = lifecycle.delta_alpha(snaps).set_index("group")
    profile = lifecycle.final_profile(snaps).set_index(["group", "layer"])["value"]
    assert spread.loc["Q/K", "delta_alpha"] == pytest.approx(profile["Q/K"].max() - profile["Q/K"].min())
    assert set(lifecycle.asymmetry(snaps)["group"]) == set(lifecycle.GROUPS)
    assert len(lifecycle.compression_onset(snaps)) == 4


def test_a_table_with_two_snapshots_of_the_same_step_is_refused():
    snaps = snapshot_table(3, [0, 10], lambda s, l, r: 5.0, lambda s, l, r: 1.0)
    with pytest.raises(ValueError, match="repeated .depth, step, layer, role. rows"):
        lifecycle.wave_gradient(pd.concat([snaps, snaps[snaps["step"] == 10]]))


def test_the_later_minimum_interval_is_simultaneous_over_snapshots():
    # ten snapshots whose true g is 0, resampled with independent noise: the lowest of them dips below 0
    # by chance, and a percentile interval of the resampled minimum keeps that dip; the band does not
    rng = np.random.default_rng(0)
    boot = rng.standard_normal((400, 10))
    assert np.percentile(boot.min(axis=1), 97.5) < 0
    estimate, low, high = lifecycle.simultaneous_min(np.zeros(10), boot)
    assert estimate == 0 and low < 0 < high
    # one snapshot far below the rest is still found below 0
    point = np.r_[np.zeros(9), -6.0]
    assert lifecycle.simultaneous_min(point, point + boot)[2] < 0
