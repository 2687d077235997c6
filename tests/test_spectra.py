"""Spectral estimators: known exponents are recovered, WeightWatcher's ESD α is matched
exactly, degenerate matrices give NaN with a note, and the model table is cached and tidy."""
from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model

from zones import spectra
from zones.core.adapters import get_adapter
from zones.spectra import (
    COLUMNS,
    alpha_shape,
    alpha_table,
    depth_spread,
    fit_esd,
    gram,
    layer_alpha,
    matrix_module_names,
    spectral_table,
)
from zones.spectra import table as table_module


def _with_singular_values(sv: np.ndarray, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """A rows × cols float64 matrix with exactly these singular values (random singular vectors)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((rows, len(sv))))
    v, _ = np.linalg.qr(rng.standard_normal((cols, len(sv))))
    return (u * sv) @ v.T


def _pareto(alpha: float, n: int, seed: int) -> np.ndarray:
    """n draws from the density ∝ λ^(−α) on [1, ∞)."""
    return (1 - np.random.default_rng(seed).random(n)) ** (-1 / (alpha - 1))


# --- spectral-shape α ---------------------------------------------------------------------------

@pytest.mark.parametrize("exponent", [0.25, 0.6, 1.1])
@pytest.mark.parametrize("rows,cols", [(96, 96), (64, 200), (240, 80)])
def test_shape_alpha_recovers_a_known_decay(exponent, rows, cols):
    n = min(rows, cols)
    sv = 3.0 * np.arange(1, n + 1, dtype=np.float64) ** -exponent
    table = spectral_table([_with_singular_values(sv, rows, cols)], estimators=["shape"])
    assert abs(table["alpha_shape"][0] - exponent) < 0.01
    assert table["alpha_shape_r2"][0] > 0.999
    assert abs(alpha_shape(sv) - exponent) < 1e-9  # the one-spectrum function agrees


def test_shape_alpha_window_selects_the_ranks():
    # Two regimes: slope 0.2 over the top half, 1.5 below; each window sees its own.
    n = 200
    k = np.arange(1, n + 1, dtype=np.float64)
    sv = np.where(k <= 100, k ** -0.2, 100 ** -0.2 * (k / 100) ** -1.5)
    w = _with_singular_values(sv, n, n)
    top = spectral_table([w], window=(0.0, 0.5), estimators=["shape"])["alpha_shape"][0]
    bottom = spectral_table([w], window=(0.5, 1.0), estimators=["shape"])["alpha_shape"][0]
    assert abs(top - 0.2) < 0.01 and abs(bottom - 1.5) < 0.02


# --- ESD α ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", [2.0, 3.0, 4.5])
def test_esd_alpha_recovers_a_pareto_exponent(alpha):
    fit = fit_esd(_pareto(alpha, 1000, seed=0))
    assert abs(fit.alpha - alpha) <= 3 * fit.sigma
    assert fit.sigma == pytest.approx((fit.alpha - 1) / np.sqrt(fit.n_tail))
    # The same spectrum as a matrix's squared singular values, through the whole table.
    lam = _pareto(alpha, 300, seed=1)
    row = spectral_table([_with_singular_values(np.sqrt(np.sort(lam)[::-1]), 300, 500)]).iloc[0]
    assert abs(row["alpha_esd"] - alpha) <= 3 * row["alpha_esd_sigma"]
    assert row["alpha_weighted"] == pytest.approx(row["alpha_esd"] * row["log_lambda_max"])


def test_hill_alpha_uses_the_median_eigenvalue():
    lam = np.sort(_pareto(3.0, 501, seed=2))
    tail = lam[250:]
    expected = 1 + len(tail) / np.sum(np.log(tail / tail[0]))
    assert spectra.alpha_hill(lam) == pytest.approx(expected, rel=1e-12)


def test_pruned_xmin_scan_equals_the_full_scan():
    rng = np.random.default_rng(3)
    for lam in (_pareto(2.5, 400, 4), np.abs(rng.standard_t(2, 300)) + 1e-3, rng.chisquare(3, 250)):
        lam = np.sort(lam)
        fit = fit_esd(lam)
        logs = np.log(lam)
        n = len(lam)
        dists, alphas = np.ones(n - 1), np.zeros(n - 1)
        for i in range(n - 1):  # the textbook scan: every candidate, first minimum
            m = n - i
            alphas[i] = 1 + m / (logs[i:].sum() - m * logs[i])
            if alphas[i] > 1:
                dists[i] = np.max(np.abs(1 - (lam[i:] / lam[i]) ** (1 - alphas[i]) - np.arange(m) / m))
        best = int(np.argmin(dists))
        assert fit.xmin == lam[best] and fit.n_tail == n - best
        assert fit.alpha == pytest.approx(alphas[best], rel=1e-10)
        assert fit.ks_distance == pytest.approx(dists[best], rel=1e-10)


# --- equality with WeightWatcher ---------------------------------------------------------------

WW_COLUMNS = {"alpha_esd": "alpha", "xmin": "xmin", "ks_distance": "D", "n_tail": "num_pl_spikes",
              "alpha_esd_sigma": "sigma", "stable_rank": "stable_rank",
              "log_lambda_max": "log_spectral_norm", "alpha_weighted": "alpha_weighted"}


@pytest.fixture(scope="module")
def weightwatcher():
    ww = pytest.importorskip("weightwatcher")
    logging.getLogger("weightwatcher").setLevel(logging.ERROR)
    return ww


def _assert_same_as_weightwatcher(ours: pd.DataFrame, theirs: pd.DataFrame):
    for col, ww_col in WW_COLUMNS.items():
        np.testing.assert_allclose(ours[col].to_numpy(float), theirs[ww_col].to_numpy(float), rtol=1e-6,
                                   err_msg=col)
    # WeightWatcher adds 1e-10 to every probability inside the entropy.
    np.testing.assert_allclose(ours["entropy"].to_numpy(float), theirs["entropy"].to_numpy(float), rtol=1e-5)


def test_esd_equals_weightwatcher_on_fixed_matrices(weightwatcher):
    rng = np.random.default_rng(0)
    mats = [rng.standard_normal((200, 100)),                 # Marchenko–Pastur bulk
            rng.standard_t(2.5, (300, 150)),                 # heavy-tailed entries
            rng.standard_t(1.5, (128, 128)),                 # heavier still
            0.1 * rng.standard_normal((50, 400)),            # wide
            _with_singular_values(np.sqrt(_pareto(2.0, 256, 5)), 256, 256),  # power-law spectrum
            rng.standard_normal((16, 40))]                   # 16 eigenvalues: WeightWatcher's small-sample fit
    net = torch.nn.Sequential(*[torch.nn.Linear(m.shape[1], m.shape[0], bias=False) for m in mats])
    with torch.no_grad():
        for layer, m in zip(net, mats):
            layer.weight.copy_(torch.as_tensor(m, dtype=torch.float32))
    theirs = weightwatcher.WeightWatcher(model=net).analyze()
    ours = spectral_table([layer.weight for layer in net])
    assert len(theirs) == len(mats)
    _assert_same_as_weightwatcher(ours, theirs)


def test_model_table_equals_weightwatcher(family, weightwatcher):
    model = tiny_model(family, n_layers=2)
    table = alpha_table(model, cache=False).assign(module=matrix_module_names(model)["module"])
    matched = table[table["module"].notna()]
    # Fused Q/K/V (GPT-2, GPT-NeoX) is one matrix to WeightWatcher and three to us.
    assert len(matched) == (len(table) if family == "llama" else len(table) // 2)
    theirs = weightwatcher.WeightWatcher(model=model).analyze().set_index("longname").loc[matched["module"]]
    _assert_same_as_weightwatcher(matched, theirs)


# --- degenerate input ----------------------------------------------------------------------------

def test_degenerate_matrices_give_nan_and_a_note():
    rng = np.random.default_rng(0)
    u = rng.standard_normal((40, 1))
    with_nan = rng.standard_normal((30, 30))
    with_nan[3, 4] = np.nan
    with_inf = rng.standard_normal((30, 30))
    with_inf[0, 0] = np.inf
    good = rng.standard_normal((60, 30))
    mats = [np.zeros((20, 30)), u @ u.T, with_nan, with_inf, rng.standard_normal((5, 40)),
            1e-4 * rng.standard_normal((50, 60)), good]
    table = spectral_table(mats)
    notes = table["note"].tolist()
    assert notes[0] == "all-zero matrix"
    assert notes[1] == "rank 1"
    assert notes[2] == notes[3] == "non-finite entries"
    assert notes[4].startswith("fewer than 10 singular values")
    assert notes[5].startswith("only 0 eigenvalues above 1e-05")
    assert notes[6] == ""
    alphas = table[["alpha_shape", "alpha_esd", "alpha_hill"]]
    assert alphas.iloc[:5].isna().all().all()
    assert np.isnan(table["alpha_esd"][5]) and np.isnan(table["alpha_hill"][5])
    assert np.isfinite(table["alpha_shape"][5])  # the shape needs no threshold
    assert alphas.iloc[6].notna().all()
    assert table["n_tail"].isna().tolist() == [True] * 6 + [False]


def test_gram_spectrum_matches_svd_even_when_ill_conditioned():
    rng = np.random.default_rng(1)
    sv = np.logspace(0, -9, 60)  # condition number 1e9: the Gram route must fall back to svdvals
    mats = [torch.as_tensor(rng.standard_normal((80, 120))), torch.as_tensor(_with_singular_values(sv, 60, 90))]
    expected = [np.sort(np.linalg.svd(m.numpy(), compute_uv=False) ** 2) for m in mats]
    for route in (spectra.gram_eigenvalues, lambda ms: [gram._gram_spectrum(m) for m in ms]):  # numpy, torch
        for lam, want in zip(route(mats), expected):
            np.testing.assert_allclose(lam.numpy(), want, rtol=1e-8, atol=1e-12 * want[-1])
    # The GPU route: same-shape matrices stacked and decomposed in small batches.
    same = [torch.as_tensor(_with_singular_values(s, 30, 50, seed=k)) for k, s in
            enumerate([np.linspace(3, 1, 30), np.logspace(0, -9, 30), np.linspace(5, 2, 30)])]
    batched = dict(gram._batched_spectra(same, [0, 1, 2], budget=2 * 8 * (30 * 50 + 30 * 30)))
    for k, m in enumerate(same):
        want = np.sort(np.linalg.svd(m.numpy(), compute_uv=False) ** 2)
        np.testing.assert_allclose(batched[k].numpy(), want, rtol=1e-8, atol=1e-12 * want[-1])


def test_invalid_arguments_fail_before_any_work():
    with pytest.raises(ValueError, match="window"):
        spectral_table([np.eye(20)], window=(0.5, 0.2))
    with pytest.raises(ValueError, match="unknown estimators"):
        spectral_table([np.eye(20)], estimators=["shape", "nope"])
    with pytest.raises(ValueError, match="2-D"):
        spectral_table([np.ones((2, 3, 4))])


# --- the model table -------------------------------------------------------------------------------

def test_alpha_table_is_tidy_cached_and_subsettable(monkeypatch):
    model = tiny_model("llama", n_layers=3)
    table = alpha_table(model)
    assert list(table.columns) == COLUMNS
    assert len(table) == 3 * 7 and not table.duplicated(["layer", "role"]).any()
    assert (table["note"] == "").all() and table[spectra.ALPHA_COLUMNS].notna().all().all()

    calls = []
    monkeypatch.setattr(table_module, "spectral_table", lambda *a, **k: calls.append(1))
    again = alpha_table(model)  # from the cache: no computation
    assert not calls
    pd.testing.assert_frame_equal(again, table)
    monkeypatch.undo()

    subset = alpha_table(model, estimators=["shape", "esd"], cache=False)
    pd.testing.assert_series_equal(subset["alpha_shape"], table["alpha_shape"])
    pd.testing.assert_series_equal(subset["alpha_esd"], table["alpha_esd"])
    for estimator in ("hill", "companions"):
        assert subset[spectra.ESTIMATOR_COLUMNS[estimator]].isna().all().all()
    other_window = alpha_table(model, window=(0.0, 1.0))
    assert not np.allclose(other_window["alpha_shape"], table["alpha_shape"])


def test_layer_alpha_weighted_mean_and_single_role():
    table = pd.DataFrame({"layer": [0, 0, 0, 1, 1, 1], "role": ["q", "v", "mlp_up"] * 2,
                          "rows": [4, 2, 8] * 2, "cols": [4, 4, 4] * 2,
                          "alpha_shape": [1.0, 2.0, 4.0, 3.0, np.nan, 1.0]})
    weighted = layer_alpha(table)
    assert weighted.name == "alpha_shape" and weighted.index.name == "layer"
    assert weighted[0] == pytest.approx((16 * 1 + 8 * 2 + 32 * 4) / 56)
    assert weighted[1] == pytest.approx((16 * 3 + 32 * 1) / 48)  # the NaN is skipped
    assert layer_alpha(table, alpha_role="v").tolist()[0] == 2.0 and np.isnan(layer_alpha(table, alpha_role="v")[1])
    with pytest.raises(ValueError, match="role"):
        layer_alpha(table, alpha_role="nope")
    with pytest.raises(ValueError, match="estimator"):
        layer_alpha(table, alpha_estimator="rows")


def test_depth_spread_separates_moving_and_flat_roles():
    layers = np.arange(8)
    table = pd.DataFrame({"layer": np.repeat(layers, 2), "role": ["q", "v"] * 8,
                          "alpha_shape": np.ravel(np.column_stack([0.2 + 0.05 * layers, 0.4 + 0 * layers]))})
    spread = depth_spread(table).set_index("role")
    assert spread.loc["q", "range"] == pytest.approx(0.35) and spread.loc["q", "depth_corr"] == pytest.approx(1.0)
    assert spread.loc["v", "range"] == 0.0
    assert spread.loc["q", "group"] == "Q/K" and spread.loc["v", "group"] == "V/O"


def test_module_names_mark_fused_slices(family):
    names = matrix_module_names(tiny_model(family, n_layers=2))
    fused = names[names["role"].isin(["q", "k", "v"])]["module"]
    assert fused.notna().all() if family == "llama" else fused.isna().all()
    assert names[names["role"] == "o"]["module"].notna().all()


# --- command line and chapter ---------------------------------------------------------------------

def test_cli_writes_the_documented_columns(tiny_model_dir, tmp_path):
    from zones.cli import main

    assert main(["alpha", "--model", str(tiny_model_dir), "--device", "cpu", "--estimators", "shape", "esd",
                 "--window", "0", "0.5", "--out", str(tmp_path)]) == 0
    written = pd.read_csv(tmp_path / "alpha.csv")
    assert list(written.columns) == COLUMNS and len(written) == 6 * 7
    assert written["alpha_shape"].notna().all() and written["alpha_hill"].isna().all()


def test_chapter_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    from pathlib import Path

    from zones.book import run_notebook

    out = tmp_path / "results"
    run_notebook(Path("notebooks/alpha_profile.md"), tmp_path / "chapter.ipynb", cwd=tmp_path,
                 parameters=dict(models=[str(tiny_model_dir)], out_dir=str(out)))
    summary = json.loads((out / "summary.json").read_text())
    table = pd.read_csv(out / "alpha.csv")
    assert summary["n_blocks"] == 6 and len(table) == 6 * 7
    q = table[table["role"] == "q"].sort_values("layer")["alpha_shape"]
    assert summary["first"] == pytest.approx(q.iloc[0]) and summary["last"] == pytest.approx(q.iloc[-1])
    assert (out / "spread.csv").exists()
    # The rise with depth and the Q/K–V/O ratio come with intervals over blocks, and a verdict word.
    trend = pd.read_csv(out / "trend.csv").set_index("role")
    assert trend.loc["q", "rise_low"] <= summary["rise"] <= trend.loc["q", "rise_high"]
    assert summary["trend"] in ("rises", "falls", "flat within noise")
    asym = pd.read_csv(out / "asymmetry_claim.csv").iloc[0]
    assert asym["ratio_low"] <= asym["ratio"] <= asym["ratio_high"] and summary["asymmetry"] == asym["asymmetry"]


@pytest.mark.slow
def test_default_model_matches_weightwatcher_fits(user_cache):
    from weightwatcher.WW_powerlaw import pl_fit

    from zones.core.models import load_model

    model = load_model("smollm2-135m", device="cpu").model
    table = alpha_table(model)
    assert len(table) == 30 * 7 and (table["note"] == "").all()
    matrices = {(layer, role): m for layer, role, m in get_adapter(model).iter_matrices()}
    for key in [(0, "q"), (14, "mlp_up"), (29, "mlp_down")]:
        w = matrices[key].detach().double().numpy()
        evals = np.sort(np.linalg.svd(w, compute_uv=False) ** 2)
        fit = pl_fit(evals[evals > 1e-5])
        row = table[(table["layer"] == key[0]) & (table["role"] == key[1])].iloc[0]
        assert row["alpha_esd"] == pytest.approx(fit.alpha, rel=1e-6)
        assert row["xmin"] == pytest.approx(fit.xmin, rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_rank_is_judged_in_the_matrix_own_precision(dtype):
    rng = np.random.default_rng(0)
    rank_one = torch.as_tensor(np.outer(rng.standard_normal(64), rng.standard_normal(128))).to(dtype)
    full = torch.as_tensor(rng.standard_normal((64, 128))).to(dtype)
    table = spectral_table([rank_one, full])
    # Rounding rank 1 to float32/bfloat16 leaves a spectrum of noise, not a power law.
    assert table["note"].tolist() == ["rank 1", ""]
    assert table.loc[0, ["alpha_shape", "alpha_esd", "alpha_hill", "entropy"]].isna().all()
    assert table.loc[1, ["alpha_shape", "alpha_esd", "alpha_hill", "entropy"]].notna().all()


def test_rank_two_in_float32_is_not_rank_one():
    rng = np.random.default_rng(1)
    low = rng.standard_normal((64, 2)) @ rng.standard_normal((2, 96))
    table = spectral_table([torch.as_tensor(low, dtype=torch.float32)])
    assert "shape: numerically zero singular values" in table["note"][0]  # rank 2 < the window
    assert np.isnan(table["alpha_shape"][0])


def test_every_spectrum_is_counted_from_its_shape():
    """Before: spectra counted no work. Each m × n matrix counts 2·m·n·min(m, n)."""
    from zones.core.progress import REFERENCE_FLOPS, spectrum_flops, work_done
    from zones.spectra.gram import gram_eigenvalues

    matrices = [torch.randn(12, 30), torch.randn(20, 8), torch.randn(5, 5)]
    before = work_done()
    gram_eigenvalues(matrices, workers=2)
    expected = (spectrum_flops(12, 30) + spectrum_flops(20, 8) + spectrum_flops(5, 5)) / REFERENCE_FLOPS
    assert work_done() - before == pytest.approx(expected)
