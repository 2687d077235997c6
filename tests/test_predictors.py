"""Is α special? Predictor ρ against scipy, the paired difference, and the table."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model
from scipy.stats import spearmanr

from zones.analysis.predictors import (
    PREDICTORS,
    alpha_vs_best,
    available_predictors,
    best_simple,
    block_frobenius,
    position_predictors,
    predictor_rho,
    predictor_table,
    register_predictor,
    rho_difference,
)
from zones.spectra import alpha_table


def toy(n=12, seed=0):
    rng = np.random.default_rng(seed)
    importance = rng.gamma(2.0, size=n)
    return pd.DataFrame(dict(layer=range(n), importance=importance,
                             alpha_shape=importance + rng.normal(0, 0.05, n),  # nearly the same order
                             frobenius=rng.normal(size=n),                      # unrelated
                             block_influence=-importance + rng.normal(0, 0.7, n)))


def test_rho_matches_scipy_and_kinds():
    table = toy()
    rhos = predictor_rho(table, n_resamples=300, n_permutations=300).set_index("predictor")
    for name in ("alpha_shape", "frobenius", "block_influence"):
        assert rhos.loc[name, "rho"] == pytest.approx(spearmanr(table[name], table["importance"]).statistic)
        assert rhos.loc[name, "ci_low"] <= rhos.loc[name, "rho"] <= rhos.loc[name, "ci_high"]
    assert rhos.loc["alpha_shape", "kind"] == "spectral" and rhos.loc["frobenius", "kind"] == "simple"
    assert best_simple(rhos.reset_index()) == "block_influence"


def test_difference_is_paired_and_signed():
    table = toy()
    d = rho_difference(table, "alpha_shape", "frobenius", n_resamples=500)
    expected = abs(spearmanr(table["alpha_shape"], table["importance"]).statistic) - abs(
        spearmanr(table["frobenius"], table["importance"]).statistic)
    assert d["difference"] == pytest.approx(expected)
    assert d["low"] > 0  # a near-perfect predictor beats noise on the same resamples
    same = rho_difference(table, "alpha_shape", "alpha_shape", n_resamples=200)
    assert same["difference"] == 0 and same["low"] == same["high"] == 0
    rhos = predictor_rho(table, n_resamples=200, n_permutations=200)
    verdict = alpha_vs_best(table, rhos, "alpha_shape", n_resamples=500)
    assert verdict["second"] == "block_influence" and verdict["verdict"] == "α orders blocks better"


def test_position_predictors_know_only_where_a_block_sits():
    # blocks 2..8 of a stack (a table may start past block 0): distance to the nearer end
    table = toy(7).assign(layer=range(2, 9)).sample(frac=1.0, random_state=0)  # any row order
    placed = position_predictors(table).sort_values("layer")
    assert placed["edge_distance"].tolist() == [0, 1, 2, 3, 2, 1, 0]
    assert list(position_predictors(table).columns[:len(table.columns)]) == list(table.columns)  # nothing dropped
    # importance that falls away from both ends: edge_distance orders it perfectly
    ends = pd.DataFrame(dict(layer=range(7), importance=[9.0, 4.0, 2.0, 1.0, 2.5, 5.0, 8.0]))
    rhos = predictor_rho(position_predictors(ends), n_resamples=200, n_permutations=200).set_index("predictor")
    expected = spearmanr([0, 1, 2, 3, 2, 1, 0], ends["importance"]).statistic
    assert rhos.loc["edge_distance", "rho"] == pytest.approx(expected)
    assert rhos.loc["edge_distance", "rho"] < -0.9
    assert set(rhos["kind"]) == {"simple"}
    with pytest.raises(ValueError, match="layer column"):
        position_predictors(ends.drop(columns="layer"))


def test_predictor_table_from_a_model():
    model = tiny_model("llama")
    alphas = alpha_table(model, cache=False)
    ablation = pd.DataFrame(dict(layer=range(4), delta_loss=[0.4, 0.1, 0.2, 0.3]))
    hidden = pd.DataFrame(dict(start=[0, 1, 2, 3, 0], span=[1, 1, 1, 1, 2], mean_cos=[0.9, 0.5, 0.7, 0.8, 0.1],
                               angular_last=[0.1, 0.3, 0.2, 0.15, 0.5]))
    table = predictor_table(ablation, alphas, frobenius=block_frobenius(model), hidden_stats=hidden,
                            calibration_ablation=ablation.assign(delta_loss=[1.0, 2.0, 3.0, 4.0]))
    assert list(table["block_influence"]) == pytest.approx([0.1, 0.5, 0.3, 0.2])
    assert list(table["calibration_ablation"]) == [1.0, 2.0, 3.0, 4.0]
    assert {"alpha_shape", "alpha_weighted", "stable_rank", "entropy"} <= set(table.columns)
    block0 = [p for n, p in model.model.layers[0].named_parameters() if p.dim() == 2]
    with torch.no_grad():
        expected = float(torch.sqrt(sum((p.double() ** 2).sum() for p in block0)))
    assert table["frobenius"][0] == pytest.approx(expected)
    # position is a predictor too: the index, and the depth relative to the model's last block
    assert list(table["block_index"]) == [0, 1, 2, 3]
    assert list(table["relative_depth"]) == pytest.approx([0, 1 / 3, 2 / 3, 1])
    rhos = predictor_rho(table, n_resamples=50, n_permutations=50).set_index("predictor")
    assert rhos.loc["block_index", "kind"] == rhos.loc["relative_depth", "kind"] == "simple"
    assert rhos.loc["block_index", "rho"] == rhos.loc["relative_depth", "rho"] == pytest.approx(
        spearmanr(range(4), [0.4, 0.1, 0.2, 0.3]).statistic)


def test_chapter_sentence_follows_the_verdict():
    from zones.report.predictors import difference_sentence, n_detectable

    base = dict(first="alpha_shape", second="frobenius", difference=0.3, low=0.1, high=0.5)
    assert "orders the blocks better than" in difference_sentence(dict(base, verdict="α orders blocks better"), "M")
    assert "not separable" in difference_sentence(dict(base, low=-0.1, verdict="not separable"), "M")
    rhos = pd.DataFrame(dict(ci_low=[0.1, -0.5, -0.2], ci_high=[0.4, -0.1, 0.3]))
    assert n_detectable(rhos) == 2


@pytest.fixture
def registered():
    """Predictors a test registers, removed afterwards."""
    names = []
    yield names
    for name in names:
        PREDICTORS.pop(name, None)


def test_a_registered_predictor_is_a_column_of_the_table_and_a_row_of_rho(registered):
    """Predictors were a fixed list in ``predictor_table``; now a registered one joins the table,
    after the built-in ones, with its kind."""
    model = tiny_model("llama")
    alphas = alpha_table(model, cache=False)
    ablation = pd.DataFrame(dict(layer=range(4), delta_loss=[0.4, 0.1, 0.2, 0.3]))
    built_in = list(predictor_table(ablation, alphas).columns)
    assert list(available_predictors()["predictor"])[-2:] == ["block_index", "relative_depth"]

    @register_predictor("query_norm", kind="spectral")
    def query_norm(inputs):
        """Frobenius norm of the block's query matrix"""
        if inputs.model is None:  # what it reads was not given: no column
            return None
        return pd.Series({layer: float(block.self_attn.q_proj.weight.detach().norm())
                          for layer, block in enumerate(inputs.model.model.layers)})

    @register_predictor("reverse_index", description="the index counted from the last block")
    def reverse_index(inputs):
        return inputs.layers.to_numpy()[::-1]

    registered += ["query_norm", "reverse_index"]
    listed = available_predictors().set_index("predictor")
    assert listed.loc["query_norm", "description"] == "Frobenius norm of the block's query matrix"
    assert listed.loc["reverse_index", "kind"] == "simple"
    table = predictor_table(ablation, alphas, model=model)
    assert [c for c in table.columns if c not in built_in] == ["frobenius", "query_norm", "reverse_index"]
    assert list(table.columns[-2:]) == ["query_norm", "reverse_index"]  # registered after the built-in ones
    assert table["query_norm"][2] == pytest.approx(float(model.model.layers[2].self_attn.q_proj.weight.detach().norm()))
    assert list(table["reverse_index"]) == [3, 2, 1, 0]
    rhos = predictor_rho(table, n_resamples=50, n_permutations=50).set_index("predictor")
    assert rhos.loc["query_norm", "kind"] == "spectral" and rhos.loc["reverse_index", "kind"] == "simple"
    assert rhos.loc["reverse_index", "rho"] == pytest.approx(-rhos.loc["block_index", "rho"])
    assert list(predictor_table(ablation, alphas).columns) == [*built_in, "reverse_index"]  # no model: no query_norm
    with pytest.raises(ValueError, match="predictor 'reverse_index' is already registered"):
        register_predictor("reverse_index")(reverse_index)
    with pytest.raises(ValueError, match="predictor kind must be one of spectral, simple"):
        register_predictor("x", kind="other")
    register_predictor("short", description="two values")(lambda inputs: [1.0, 2.0])
    registered.append("short")
    with pytest.raises(ValueError, match="predictor short gave 2 values for 4 blocks"):
        predictor_table(ablation, alphas)


def test_chapter_runs_on_a_model_directory(tiny_model_dir, tmp_path, registered):
    from zones.report import predictors as chapter

    # a predictor registered before the chapter runs is one of its rows
    register_predictor("mlp_norm", description="Frobenius norm of the MLP's matrices")(
        lambda inputs: pd.Series({layer: float(sum(p.detach().norm() ** 2 for p in block.mlp.parameters()) ** 0.5)
                                  for layer, block in enumerate(inputs.model.model.layers)}))
    registered.append("mlp_norm")
    result = chapter.run(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=4 * 31, calibration_tokens=2 * 31,
                         batch_size=4, n_resamples=100, n_permutations=100, out_dir=str(tmp_path / "out"), progress=False)
    rho = result["rho"]
    assert {"alpha_shape", "frobenius", "block_influence", "angular", "calibration_ablation", "block_index",
            "relative_depth", "mlp_norm"} <= set(rho["predictor"])
    assert "mlp_norm" in pd.read_csv(tmp_path / "out" / "rho.csv")["predictor"].tolist()
    assert result["difference"]["second"].iloc[0] in {"frobenius", "block_influence", "angular",
                                                      "calibration_ablation", "block_index", "relative_depth",
                                                      "mlp_norm"}  # a registered predictor competes too
    assert (tmp_path / "out" / "rho.csv").exists()


def test_notebook_executes_on_a_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    from zones.book import declared_parameters, project_root, run_notebook

    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    source = project_root() / "notebooks" / "predictors.md"
    parameters = dict(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=4 * 31, calibration_tokens=2 * 31,
                      batch_size=4, n_resamples=50, n_permutations=50)
    assert set(parameters) <= set(declared_parameters(source))
    run_notebook(source, tmp_path / "predictors.ipynb", parameters, cwd=tmp_path)
    assert (tmp_path / "results" / "predictors" / "rho.csv").exists()
