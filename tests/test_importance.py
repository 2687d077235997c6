"""Spearman ρ with its interval and p-value; the ρ table; the importance chapter's pieces."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import spearmanr

from zones.analysis.importance import (
    RHO_COLUMNS,
    depth_controlled,
    depth_table,
    holm,
    importance_table,
    model_labels,
    partial_spearman,
    relative_depth,
    rho_table,
    spearman,
    spearman_rho,
    strongest,
    without_ends,
)
from zones.figures.layer_ablation import ablation_bars, importance_scatter, log_floor

NAN = float("nan")


def test_rho_equals_scipy_with_ties_and_nans():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 6, size=25).astype(float)  # many ties
    y = x + rng.normal(size=25)
    assert spearman_rho(x, y) == pytest.approx(spearmanr(x, y)[0], abs=1e-12)
    # Monotone transforms do not change ranks.
    assert spearman_rho(np.exp(x), y ** 3) == pytest.approx(spearman_rho(x, y), abs=1e-12)
    x[3], y[7] = np.nan, np.nan
    keep = np.isfinite(x) & np.isfinite(y)
    assert spearman_rho(x, y) == pytest.approx(spearmanr(x[keep], y[keep])[0], abs=1e-12)
    assert spearman(x, y, n_resamples=10, n_permutations=10).n == 23


def test_p_value_matches_the_exact_permutation_distribution():
    x = np.array([0.3, 1.2, 0.7, 2.0, 1.5, 0.1, 0.9])
    y = np.array([1.0, 2.5, 0.2, 3.0, 1.1, 0.8, 2.2])
    observed = abs(spearman_rho(x, y))
    null = [abs(spearman_rho(x, y[list(p)])) for p in itertools.permutations(range(7))]
    exact = np.mean(np.array(null) >= observed - 1e-12)
    result = spearman(x, y, n_permutations=20000, n_resamples=10)
    # Monte Carlo error of the estimate: sqrt(p (1 - p) / n_permutations) < 0.004.
    assert result.p_value == pytest.approx(exact, abs=0.012)
    assert 0.01 < exact < 0.9


def test_perfect_and_absent_relations():
    x = np.arange(12.0)
    strong = spearman(x, x ** 2)
    assert strong.rho == 1.0 and strong.ci_low == 1.0 and strong.ci_high == 1.0
    assert strong.p_value == pytest.approx(1 / 10001)  # no permutation of 12 reaches |ρ| = 1
    negative = spearman(x, -x)
    assert negative.rho == -1.0 and negative.p_value < 0.001
    flat = spearman(x, np.ones(12))
    assert np.isnan(flat.rho) and np.isnan(flat.p_value) and flat.n == 12
    assert np.isnan(spearman([1.0, 2.0], [2.0, 1.0]).rho)


def test_bootstrap_interval_covers_the_population_rho():
    # Bivariate normal with correlation r has Spearman ρ = (6/π) asin(r/2).
    r, n, trials = 0.6, 30, 120
    population = 6 / np.pi * np.arcsin(r / 2)
    rng = np.random.default_rng(1)
    covered, widths = 0, []
    for trial in range(trials):
        x = rng.normal(size=n)
        y = r * x + np.sqrt(1 - r * r) * rng.normal(size=n)
        c = spearman(x, y, n_resamples=600, n_permutations=10, seed=trial)
        covered += c.ci_low <= population <= c.ci_high
        widths.append(c.ci_high - c.ci_low)
        assert c.ci_low <= c.rho <= c.ci_high
    assert 0.85 <= covered / trials <= 1.0
    assert 0.2 < np.mean(widths) < 0.8


def test_seeded_and_validated():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=20), rng.normal(size=20)
    assert spearman(x, y, seed=3) == spearman(x, y, seed=3)
    assert spearman(x, y, seed=3).ci_low != spearman(x, y, seed=4).ci_low
    for kwargs in (dict(n_resamples=0), dict(n_permutations=-1), dict(n_resamples=2.5), dict(level=1.0), dict(n_resamples=True),
                   dict(n_permutations=99.0), dict(level=np.nan)):
        with pytest.raises(ValueError, match=r"^(n_resamples|n_permutations|level) must be .*; got "):
            spearman(x, y, **kwargs)
    # numpy integers (what a table or a parameter grid hands over) count like python ones
    assert spearman(x, y, n_resamples=np.int64(200), n_permutations=np.int32(500), seed=3) == \
        spearman(x, y, n_resamples=200, n_permutations=500, seed=3)
    with pytest.raises(ValueError, match="length"):
        spearman(x, y[:-1])


def synthetic_alpha_table(n_layers=10, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for layer in range(n_layers):
        for role, shape in (("q", (8, 8)), ("v", (4, 8)), ("mlp_in", (16, 8))):
            rows.append(dict(layer=layer, role=role, rows=shape[0], cols=shape[1],
                             alpha_shape=0.2 + 0.05 * layer + rng.normal(scale=0.001),
                             alpha_esd=rng.normal(3, 1), alpha_hill=np.nan, note=""))
    return pd.DataFrame(rows)


def synthetic_ablation(alpha: pd.Series) -> pd.DataFrame:
    delta = np.exp(5 * alpha.to_numpy())  # ΔLoss rises with α, steeply
    return pd.DataFrame(dict(layer=alpha.index.to_numpy(), loss=3 + delta, base_loss=3.0, delta_loss=delta,
                             n_tokens=1000))


def test_rho_table_per_estimator_and_role():
    from zones.spectra import layer_alpha

    alphas = synthetic_alpha_table()
    ablation = synthetic_ablation(layer_alpha(alphas, "alpha_shape", "weighted"))
    table = rho_table(ablation, alphas, n_resamples=200, n_permutations=500)
    assert list(table.columns) == RHO_COLUMNS
    # alpha_hill is all NaN: left out. Roles: weighted, then each role in table order.
    assert table["estimator"].drop_duplicates().tolist() == ["alpha_shape", "alpha_esd"]
    assert table["role"].drop_duplicates().tolist() == ["weighted", "q", "v", "mlp_in"]
    shape = table[table["estimator"] == "alpha_shape"].set_index("role")
    assert shape.loc["weighted", "rho"] == pytest.approx(1.0)
    assert (shape["rho"] > 0.9).all() and (shape["p_value"] < 0.01).all()
    assert (table["n_layers"] == 10).all()
    esd = table[table["estimator"] == "alpha_esd"]
    assert esd["rho"].abs().max() < 0.9  # random α: no perfect relation
    with pytest.raises(ValueError, match="no column"):
        rho_table(ablation, alphas, value="delta_loss_attn")


def test_importance_table_joins_on_layer():
    ablation = synthetic_ablation(pd.Series([0.1, 0.2, 0.3], index=[0, 1, 2]))
    alpha = pd.Series([1.5, 0.5], index=pd.Index([2, 0], name="layer"))
    table = importance_table(ablation, alpha)
    assert table["layer"].tolist() == [0, 2] and table["alpha"].tolist() == [0.5, 1.5]
    with pytest.raises(ValueError, match="delta_loss"):
        importance_table(ablation.drop(columns="delta_loss"), alpha)


def test_model_labels_are_short_and_unique(tmp_path):
    (tmp_path / "d8").mkdir()
    assert model_labels(["smollm2-135m", str(tmp_path / "d8"), str(tmp_path / "d8"), "org/model"]) == [
        "smollm2-135m", "d8", "d8 (2)", "org/model"]


def two_model_frame():
    rows = []
    for model, n in (("d4", 4), ("d6", 6)):
        for layer in range(n):
            rows.append(dict(model=model, layer=layer, delta_loss=[2.0, -0.01, 0.05, 0.3, 0.01, 0.02][layer],
                             alpha=0.2 + 0.01 * layer, loss=3.0, base_loss=2.9))
    return pd.DataFrame(rows)


def test_figures_one_panel_per_model_and_log_floor():
    frame = two_model_frame()
    assert log_floor(frame["delta_loss"]) == pytest.approx(0.01 / 3)
    bars = ablation_bars(frame, titles={"d4": "four"}).to_dict()
    scatter = importance_scatter(frame).to_dict()
    for spec in (bars, scatter):
        assert len(spec["hconcat"]) == 2
        assert spec["resolve"]["scale"]["y"] == "shared"
    assert bars["hconcat"][0]["title"] == "four"
    y = bars["hconcat"][0]["layer"][0]["encoding"]["y"]
    assert y["scale"]["type"] == "log" and y["field"] == "delta_loss_plot"
    # The block whose removal lowers the loss is drawn at the floor, its true value kept.
    datasets = bars["datasets"]
    d6 = next(rows for rows in datasets.values() if len(rows) == 6)
    block1 = next(r for r in d6 if r["layer"] == 1)
    assert block1["delta_loss"] == -0.01 and block1["delta_loss_plot"] == pytest.approx(0.01 / 3)
    marks = next(rows for rows in scatter["datasets"].values() if len(rows) == 6)
    assert {r["layer"]: r["highlight"] for r in marks if r["highlight"] != "other"} == {
        0: "most important", 1: "least important"}
    with pytest.raises(ValueError, match="alpha"):
        ablation_bars(frame.drop(columns="alpha"))


def test_ablation_bars_carry_the_intervals_as_error_bars():
    frame = two_model_frame()
    assert len(ablation_bars(frame).to_dict()["hconcat"][0]["layer"]) == 2  # no interval columns: no bars
    frame["delta_loss_low"] = frame["delta_loss"] - 0.02
    frame["delta_loss_high"] = frame["delta_loss"] + 0.05
    spec = ablation_bars(frame).to_dict()
    rule = spec["hconcat"][0]["layer"][-1]
    assert rule["mark"]["type"] == "rule"
    assert rule["encoding"]["y"]["field"] == "delta_loss_low_plot" and rule["encoding"]["y2"]["field"] == "delta_loss_high_plot"
    rows = next(r for r in spec["datasets"].values() if len(r) == 6 and "delta_loss_low_plot" in r[0])
    floor = log_floor(frame["delta_loss"])
    for r in rows:  # an end below the log axis's floor is drawn at the floor; the top is the interval's
        assert r["delta_loss_low_plot"] == pytest.approx(max(r["delta_loss_low"], floor))
        assert r["delta_loss_high_plot"] == pytest.approx(r["delta_loss_high"])


def run_chapter(name, tmp_path, model_dir, **parameters):
    import os

    from zones.book import project_root, run_notebook

    os.environ["OMP_NUM_THREADS"] = "1"  # tiny models: threads only add overhead
    os.environ["ZONES_BOOK_BUILD"] = "1"
    try:
        run_notebook(project_root() / "notebooks" / f"{name}.md", tmp_path / f"{name}.ipynb", cwd=tmp_path,
                     parameters=dict(models=[str(model_dir), str(model_dir)], seq_len=32,
                                     eval_tokens=155, batch_size=4, **parameters))
    finally:
        del os.environ["OMP_NUM_THREADS"], os.environ["ZONES_BOOK_BUILD"]
    return json.loads((tmp_path / "results" / name / "summary.json").read_text())


def test_chapters_run_on_a_tiny_model(tmp_path, tiny_model_dir):
    ablation = run_chapter("layer_ablation", tmp_path, tiny_model_dir)
    first = ablation["models"][0]
    assert [m["model"] for m in ablation["models"]] == [tiny_model_dir.name, f"{tiny_model_dir.name} (2)"]
    assert first["n_blocks"] == 6 and len(first["top"]) == 3 and first["n_tokens"] == 155
    table = pd.read_csv(tmp_path / "results" / "layer_ablation" / "ablation.csv")
    assert set(table["model"]) == {m["model"] for m in ablation["models"]} and len(table) == 12
    # Every block's ΔLoss has its interval; the top blocks and the first-blocks verdict cite them.
    assert ((table["delta_loss_low"] <= table["delta_loss"]) & (table["delta_loss"] <= table["delta_loss_high"])).all()
    top = table[table["model"] == first["model"]].set_index("layer").loc[first["top"][0]]
    assert first["top_low"][0] == pytest.approx(top["delta_loss_low"])
    assert first["first_blocks"]["verdict"] in ("holds", "does not hold", "inconclusive")

    importance = run_chapter("importance_vs_alpha", tmp_path, tiny_model_dir, n_resamples=50, n_permutations=50)
    first_rho = importance["models"][0]
    assert -1 <= first_rho["ci_low"] <= first_rho["rho"] <= first_rho["ci_high"] <= 1
    rho = pd.read_csv(tmp_path / "results" / "importance_vs_alpha" / "rho.csv")
    assert {"alpha_shape", "weighted"} <= set(rho["estimator"]) | set(rho["role"])
    depth = pd.read_csv(tmp_path / "results" / "importance_vs_alpha" / "depth.csv")   # two models: a pooled row
    assert depth["kind"].tolist() == ["raw", "partial_depth", "without_ends"] * 2 + ["partial_relative_depth"]
    assert depth.loc[0, "rho"] == pytest.approx(first_rho["rho"]) and depth.loc[2, "n_blocks"] == 4
    # Same model and windows as the ablation chapter: the second chapter reads its cache.
    assert importance["models"][0]["most_important"] == first["top"][0]
    strongest = first_rho["strongest"]
    assert abs(strongest["rho"]) == pytest.approx(rho[rho["model"] == first_rho["model"]]["rho"].abs().max())
    assert first_rho["verdict"].startswith(f"On {first_rho['model']}")


def test_strongest_counts_the_estimators_not_separable_from_it():
    rhos = pd.DataFrame(dict(estimator=["a", "b", "c", "d"], role="weighted", rho=[0.6, -0.7, 0.1, NAN],
                             ci_low=[0.3, -0.9, -0.2, NAN], ci_high=[0.8, -0.4, 0.3, NAN]))
    best = strongest(rhos)
    assert best["estimator"] == "b" and best["n_close"] == 0  # 0.6's interval does not reach −0.7
    rhos.loc[0, ["rho", "ci_low", "ci_high"]] = [-0.6, -0.8, -0.3]
    assert strongest(rhos)["close"] == ["a (weighted)"]
    assert strongest(rhos.assign(rho=NAN)) is None


def test_holm_and_the_strongest_of_many_is_adjusted():
    assert holm([0.01, 0.04, 0.03, NAN, 0.005]) == pytest.approx([0.03, 0.06, 0.06, NAN, 0.02],
                                                                            nan_ok=True)
    rhos = pd.DataFrame(dict(estimator=[f"e{i}" for i in range(56)], role="weighted",
                             rho=np.linspace(-0.5, 0.6, 56), ci_low=np.linspace(-0.7, 0.3, 56),
                             ci_high=np.linspace(-0.2, 0.8, 56), p_value=np.r_[np.full(55, 0.5), 0.004]))
    best = strongest(rhos)
    assert best["n_tested"] == 56 and best["p_holm"] == pytest.approx(56 * 0.004) and best["n_significant"] == 0


# --- controlling for depth ---------------------------------------------------------------------------

def depth_only(n=30, seed=0):
    """α and ΔLoss that both follow depth, with independent noise: no information beyond depth."""
    rng = np.random.default_rng(seed)
    layer = np.arange(n)
    return pd.DataFrame(dict(layer=layer, alpha=layer + rng.normal(0, 3, n),
                             delta_loss=np.exp(-(layer + rng.normal(0, 3, n)) / 10)))


def test_partial_rho_vanishes_when_alpha_follows_depth_only():
    table = depth_only(n=60)   # 60 blocks: the partial ρ of pure noise has a spread of about 0.13
    raw = spearman(table["alpha"], table["delta_loss"], n_resamples=500, n_permutations=500)
    partial = partial_spearman(table["alpha"], table["delta_loss"], table["layer"], n_resamples=500,
                               n_permutations=500)
    assert raw.rho < -0.7 and raw.ci_high < 0                      # large, from position alone
    assert abs(partial.rho) < 0.3 and partial.ci_low < 0 < partial.ci_high and partial.p_value > 0.05
    assert partial.n == 60


def test_partial_rho_stays_when_alpha_carries_more_than_depth():
    rng = np.random.default_rng(1)
    n = 30
    layer = np.arange(n)
    shared = rng.normal(size=n)   # what α knows about a block beyond its position
    alpha = 0.05 * layer + shared
    delta = -0.05 * layer + shared + rng.normal(0, 0.2, n)
    partial = partial_spearman(alpha, delta, layer, n_resamples=500, n_permutations=500)
    assert partial.rho > 0.6 and partial.ci_low > 0 and partial.p_value < 0.01


def test_partial_rho_is_the_partial_correlation_of_the_ranks():
    rng = np.random.default_rng(2)
    x, y, z = rng.normal(size=(3, 20))
    y = y + x + z
    r = lambda a, b: spearmanr(a, b)[0]  # noqa: E731
    expected = (r(x, y) - r(x, z) * r(y, z)) / np.sqrt((1 - r(x, z) ** 2) * (1 - r(y, z) ** 2))
    result = partial_spearman(x, y, z, n_resamples=200, n_permutations=200)
    assert result.rho == pytest.approx(expected, abs=1e-10)
    assert result.ci_low <= result.rho <= result.ci_high
    assert partial_spearman(x, y, z, n_resamples=200, n_permutations=200) == result   # seeded
    assert np.isnan(partial_spearman(x[:3], y[:3], z[:3], n_resamples=10, n_permutations=10).rho)  # too few


def test_without_ends_drops_the_first_and_last_blocks():
    table = depth_only(n=10)
    inner = without_ends(table)
    assert inner["layer"].tolist() == list(range(1, 9))
    assert without_ends(table.iloc[:6], n_blocks=10)["layer"].tolist() == [1, 2, 3, 4, 5]  # block 9 absent already
    rows = depth_controlled(table, label="m", n_resamples=200, n_permutations=200).set_index("kind")
    assert list(rows.index) == ["raw", "partial_depth", "without_ends"]
    assert rows.loc["without_ends", "n_blocks"] == 8 and rows.loc["raw", "n_blocks"] == 10
    assert rows.loc["without_ends", "rho"] == pytest.approx(spearmanr(inner["alpha"], inner["delta_loss"])[0])
    assert rows.loc["raw", "rho"] == pytest.approx(spearmanr(table["alpha"], table["delta_loss"])[0])


def test_pooled_models_are_partialled_on_relative_depth():
    a, b = depth_only(12, seed=3).assign(model="a"), depth_only(24, seed=4).assign(model="b")
    frame = pd.concat([a, b], ignore_index=True)
    table = depth_table(frame, n_resamples=200, n_permutations=200)
    assert table["model"].tolist() == ["a"] * 3 + ["b"] * 3 + ["pooled"]
    pooled = table.iloc[-1]
    assert pooled["kind"] == "partial_relative_depth" and pooled["n_blocks"] == 36
    depth = np.concatenate([relative_depth(a["layer"]), relative_depth(b["layer"])])
    assert depth.max() == 1 and relative_depth(a["layer"])[-1] == 1
    expected = partial_spearman(frame["alpha"], frame["delta_loss"], depth, n_resamples=200, n_permutations=200)
    assert pooled["rho"] == pytest.approx(expected.rho)
    assert len(depth_table(a, n_resamples=50, n_permutations=50)) == 3   # one model: no pooled row


def test_pooled_seeds_count_their_shared_positions_once():
    # two seeds of one depth that agree block for block are one run's evidence, not twice as much:
    # the pooled interval and p treat a position as the unit (the old pooling treated 16 blocks as 16)
    from zones.analysis.importance import spearman
    from zones.analysis.pooled import rho_pooled

    rng = np.random.default_rng(3)
    alpha, delta = rng.normal(size=8), rng.normal(size=8)
    delta = delta + 0.8 * alpha
    run = pd.DataFrame(dict(depth=8, layer=range(8), alpha=alpha, delta_loss=delta))
    frame = pd.concat([run.assign(seed=s, model=f"D8 s{s}") for s in (0, 1)], ignore_index=True)
    pooled = rho_pooled(frame, n_resamples=500, n_permutations=2000).set_index("depth").loc["8"]
    one = spearman(alpha, delta, n_resamples=500, n_permutations=2000)
    assert pooled["rho"] == pytest.approx(one.rho)
    assert pooled["p_value"] == pytest.approx(one.p_value, abs=0.03)
    assert pooled["ci_high"] - pooled["ci_low"] == pytest.approx(one.ci_high - one.ci_low, abs=0.15)


def test_the_cluster_bootstrap_ranks_its_resamples_together_and_gets_the_per_resample_numbers():
    # Issue 37: the depth series' pooled ρ ranked 8,000 resamples one call at a time (2.3 s of the
    # chapter); one ranking per resample length gives the same ρ to the bit, with clusters of 2
    # (seeds of one depth), 1 (one seed) and resamples too short to rank (NaN).
    from zones.analysis.importance import spearman_rho
    from zones.analysis.pooled import _resampled_rho

    rng = np.random.default_rng(5)
    a, d = rng.normal(size=30), rng.normal(size=30)
    d[:4] = a[:4]  # some ties in the ranks of a resample
    members = [np.array([i, i + 15]) for i in range(8)] + [np.array([i]) for i in range(8, 15)] + [np.array([29])]
    draws = [np.concatenate([members[i] for i in rng.integers(0, len(members), rng.integers(1, 9))])
             for _ in range(300)]
    expected = np.array([spearman_rho(a[idx], d[idx]) for idx in draws])
    got = _resampled_rho(a, d, draws)
    assert len({idx.size for idx in draws}) > 5 and np.isnan(expected).any()
    np.testing.assert_array_equal(got, expected)


# --- intervals over blocks carry the window noise, and count the resamples they cannot use ----------------

def _measured(means: np.ndarray, sd: float, n_windows: int = 24, seed: int = 0):
    """Per-window ΔLoss of blocks whose true means are ``means``, measured with noise ``sd`` a window."""
    from zones.analysis.unit_intervals import WindowNoise

    rng = np.random.default_rng(seed)
    per_window = means[:, None] + sd * rng.standard_normal((means.size, n_windows))
    return WindowNoise(per_window, np.ones(n_windows))


def test_a_rho_decided_by_noise_is_not_certain_once_the_windows_are_resampled():
    # six blocks whose ΔLoss differ by 1e-4 nats, each measured to ±0.003: their order is noise, yet a
    # bootstrap over blocks alone reads the measured order as certain ("1.0 [1.0, 1.0]")
    means = 0.006 + 1e-4 * np.arange(6)
    noise = _measured(means, 0.003)
    delta = noise.values()
    alpha = delta.argsort().argsort().astype(float)   # α ordered exactly as the measured ΔLoss
    blocks_only = spearman(alpha, delta, n_resamples=400, n_permutations=200)
    both = spearman(alpha, delta, noise=noise, n_resamples=400, n_permutations=200)
    assert blocks_only.rho == both.rho == 1.0
    assert blocks_only.ci_low == 1.0                 # the old reading
    assert both.ci_low < 0.5 and both.ci_high == 1.0  # the windows' noise in the interval


def test_undefined_partial_rho_resamples_are_counted_and_the_statistic_called_not_estimable():
    # α monotone in depth but for one pair of blocks: most resamples leave the partial ρ undefined
    depth = np.arange(8, dtype=float)
    alpha = -depth.copy()
    alpha[[4, 5]] = alpha[[5, 4]]
    delta = np.exp(-6 * depth / 7) + 0.01 * np.random.default_rng(1).standard_normal(8)
    c = partial_spearman(alpha, delta, depth, noise=_measured(delta, 0.01), n_resamples=400, n_permutations=200)
    assert c.undefined > 0.3 and not c.estimable
    assert c.ci_low <= 0.0   # the undefined resamples count as 0: the interval cannot exclude it


def test_pooled_models_resample_each_models_windows_within_it():
    from zones.analysis.unit_intervals import WindowNoise

    a, b = _measured(np.array([1.0, 2.0, 3.0]), 0.1, 4, 1), _measured(np.array([5.0, 6.0]), 0.1, 6, 2)
    both = WindowNoise.stack([a, b])
    assert both.delta.shape == (5, 10) and list(both.strata) == [0] * 4 + [1] * 6
    assert np.allclose(both.values(), np.concatenate([a.values(), b.values()]))
    counts = both.counts(np.random.default_rng(0), 50)
    assert (counts[:, :4].sum(1) == 4).all() and (counts[:, 4:].sum(1) == 6).all()   # within each model


def test_one_seed_agrees_with_nothing():
    # a depth with one run: no seed pair to agree, so no agreement words or spread (not "True" and 0)
    from zones.analysis.pooled import rho_by_run, seed_agreement

    run = pd.DataFrame(dict(depth=12, seed=0, model="D12 s0", layer=range(6), alpha=np.arange(6.0),
                            delta_loss=np.arange(6.0)[::-1]))
    agreement = seed_agreement(run, rho_by_run(run, n_resamples=50, n_permutations=50)).iloc[0]
    assert agreement["n_seeds"] == 1 and pd.isna(agreement["same_costliest"]) and pd.isna(agreement["rho_spread"])


def test_a_blocks_place_in_the_ranking_is_resolved_only_when_its_interval_is_small_against_the_gap():
    """Mid-depth ΔLoss values 0.002 apart with ±0.003 of window noise do not decide a ranking (issue 51)."""
    from zones.analysis.importance import ranking_resolution
    from zones.report.layer_ablation import ranking_text

    table = pd.DataFrame(dict(layer=[0, 1, 2, 3], delta_loss=[2.0, 0.010, 0.008, 0.5],
                              delta_loss_low=[1.9, 0.007, 0.005, 0.45], delta_loss_high=[2.1, 0.013, 0.011, 0.55]))
    found = ranking_resolution(table)
    assert found["layer"].tolist() == [0, 3, 1, 2] and found["rank"].tolist() == [1, 2, 3, 4]
    assert found["resolved"].tolist() == [True, True, False, False]
    assert found["gap"].tolist() == pytest.approx([1.5, 0.49, 0.002, 0.002])
    text = ranking_text(found, 3060)
    assert "2 of the 4 blocks" in text and "blocks 0, 3" in text and "about 20× the tokens" in text
    bare = ranking_resolution(table.drop(columns=["delta_loss_low", "delta_loss_high"]))
    assert bare["resolved"].isna().all() and "not measured" in ranking_text(bare, 3060)
