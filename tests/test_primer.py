"""The primer: random matrices against the Marchenko–Pastur law, the pictures the α fits read,
the chapter's run() on a tiny model, its notebook with the exercises' solutions, and its
slider in a browser with the network off."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.integrate import quad

from zones.spectra import spectral_table
from zones.spectra.pictures import density_picture, rank_picture
from zones.spectra.random import (
    gaussian_matrix,
    ks_distance,
    marchenko_pastur_cdf,
    marchenko_pastur_density,
    marchenko_pastur_edges,
    marchenko_pastur_fit,
    scaled_eigenvalues,
    student_t_matrix,
)

ROOT = Path(__file__).resolve().parents[1]
MICRO_TRAINING = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, lr=3e-3, eval_every=10,
                      snapshot_every=10, checkpoint_every=15, eval_windows=8, steps=20)


# --- the Marchenko–Pastur law -----------------------------------------------------------------------

@pytest.mark.parametrize("q", [0.1, 0.5, 1.0])
@pytest.mark.parametrize("sigma2", [0.5, 2.0])
def test_marchenko_pastur_density_is_a_probability_density_with_the_known_moments(q, sigma2):
    lo, hi = marchenko_pastur_edges(q, sigma2)
    assert lo == pytest.approx(sigma2 * (1 - math.sqrt(q)) ** 2)
    assert hi == pytest.approx(sigma2 * (1 + math.sqrt(q)) ** 2)
    def density(x):
        return float(marchenko_pastur_density(x, q, sigma2))

    # quad handles the square-root ends (and the x^(-1/2) divergence at 0 when q = 1)
    total = quad(density, lo, hi, limit=400)[0]
    mean = quad(lambda x: x * density(x), lo, hi, limit=400)[0]
    second = quad(lambda x: x * x * density(x), lo, hi, limit=400)[0]
    assert total == pytest.approx(1.0, abs=1e-6)
    assert mean == pytest.approx(sigma2, rel=1e-6)                    # E[x] = σ²
    assert second == pytest.approx(sigma2 ** 2 * (1 + q), rel=1e-6)   # E[x²] = σ⁴ (1 + q)
    assert marchenko_pastur_density([lo - 1e-3, hi + 1e-3], q, sigma2).tolist() == [0.0, 0.0]
    # the CDF is the density's integral: 0 and 1 at the edges, and equal to quad in between
    mid = (lo + hi) / 2
    assert marchenko_pastur_cdf([lo, hi], q, sigma2) == pytest.approx([0.0, 1.0], abs=1e-9)
    assert float(marchenko_pastur_cdf(mid, q, sigma2)) == pytest.approx(quad(density, lo, mid, limit=400)[0], abs=1e-6)


def test_bad_aspect_ratio_or_variance_is_one_clear_error():
    with pytest.raises(ValueError, match="aspect ratio q"):
        marchenko_pastur_edges(1.5)
    with pytest.raises(ValueError, match="aspect ratio q"):
        marchenko_pastur_density([1.0], 0.0)
    with pytest.raises(ValueError, match="sigma2"):
        marchenko_pastur_edges(0.5, -1.0)


def test_a_large_gaussian_matrix_follows_marchenko_pastur():
    """A statistical check of the law against a sampled spectrum.

    Tolerance: n = 1000 eigenvalues. Were they independent draws, the Kolmogorov–Smirnov distance
    would exceed 1.36/√n = 0.043 one time in twenty; but the eigenvalues of a random matrix are
    far more regular than independent draws (each stays within O(log n / n) of its quantile in
    the bulk, with O(n^(−2/3)) corrections at the edges only), and over seeds 0–2 the distance is
    0.003–0.004. 0.015 leaves a factor of three; the law with a 10 % wrong variance is ≥ 0.03
    away from the same eigenvalues, and the wrong aspect ratio ≥ 0.04, so the check can fail.
    The largest eigenvalue sits within Tracy–Widom fluctuations, O(m^(−2/3)) relative, of the
    upper edge: 3 % is ten times that scale at m = 2000.
    """
    spectrum = scaled_eigenvalues(gaussian_matrix(1000, 2000, seed=0))
    assert spectrum.q == 0.5 and len(spectrum.x) == 1000
    fit = marchenko_pastur_fit(spectrum, sigma2=1.0)
    assert fit.ks_distance < 0.015
    assert ks_distance(spectrum.x, 0.5, 1.1) > 0.03        # a 10 % wrong variance is seen
    assert ks_distance(spectrum.x, 0.6, 1.0) > 0.03        # so is a wrong aspect ratio
    lo, hi = marchenko_pastur_edges(0.5)
    assert 0.97 < spectrum.x.max() / hi < 1.03 and 0.97 < spectrum.x.min() / lo < 1.03
    assert fit.n_beyond == 0 or spectrum.x.max() / hi < 1.03
    # the twin's σ² is the mean squared entry: within sampling error of the σ² = 1 it was drawn with
    assert spectrum.sigma2 == pytest.approx(1.0, abs=5 / math.sqrt(2e6))


def test_random_matrices_are_seeded_and_heavy_tails_leave_the_bulk():
    a, b = student_t_matrix(50, 80, 2.5, seed=3), student_t_matrix(50, 80, 2.5, seed=3)
    assert a.shape == (50, 80) and bool((a == b).all())
    assert not bool((a == student_t_matrix(50, 80, 2.5, seed=4)).all())
    assert bool((student_t_matrix(40, 60, math.inf, seed=1) == gaussian_matrix(40, 60, seed=1)).all())
    with pytest.raises(ValueError, match="df"):
        student_t_matrix(10, 10, 0.0)
    gauss = spectral_table([gaussian_matrix(300, 600, seed=0)]).iloc[0]
    heavy_matrix = student_t_matrix(300, 600, 1.0, seed=0)
    heavy = spectral_table([heavy_matrix]).iloc[0]
    twin = marchenko_pastur_fit(scaled_eigenvalues(heavy_matrix))
    assert twin.n_beyond > 0 and twin.top_over_edge > 2   # eigenvalues no random twin would have
    assert heavy["alpha_shape"] > 2 * gauss["alpha_shape"]  # singular values fall much faster
    assert heavy["alpha_esd"] < gauss["alpha_esd"]          # a heavier density tail


# --- the pictures the fits read -------------------------------------------------------------------

def test_pictures_draw_what_the_estimators_fit():
    matrix = student_t_matrix(120, 240, 2.0, seed=0)
    row = spectral_table([matrix]).iloc[0]
    lam = scaled_eigenvalues(matrix).eigenvalues

    rank, alpha, r2 = rank_picture(lam)
    assert alpha == pytest.approx(row["alpha_shape"], rel=1e-9) and r2 == pytest.approx(row["alpha_shape_r2"], rel=1e-9)
    assert rank["rank"].tolist() == list(range(1, 121)) and rank["sigma"].is_monotonic_decreasing
    assert rank["in_window"].sum() == 60 and rank.loc[rank["in_window"], "rank"].max() == 60
    inside = rank[rank["in_window"]]
    slope = np.polyfit(np.log(inside["rank"]), np.log(inside["fitted"]), 1)[0]
    assert slope == pytest.approx(-alpha, rel=1e-9)     # the drawn line is the fit
    # least squares: residuals of log σ about the drawn line sum to zero
    assert np.sum(np.log(inside["sigma"]) - np.log(inside["fitted"])) == pytest.approx(0.0, abs=1e-9)
    assert rank.loc[~rank["in_window"], "fitted"].isna().all()

    m = 240
    histogram, line, fit = density_picture(lam, bins=30, scale=1 / m)
    assert fit.alpha == pytest.approx(row["alpha_esd"], rel=1e-9) and fit.n_tail == row["n_tail"]
    widths = histogram["x_high"] - histogram["x_low"]
    assert float((histogram["density"] * widths).sum()) == pytest.approx(1.0, rel=1e-9)   # a density
    assert int(histogram["count"].sum()) == int((lam > 1e-5).sum())
    tail_bins = histogram[histogram["in_tail"]]
    assert tail_bins["x_high"].min() > fit.xmin / m
    assert int(tail_bins["count"].sum()) >= fit.n_tail     # every tail eigenvalue is in a red bin
    assert line["x"].iloc[0] == pytest.approx(fit.xmin / m) and line["x"].iloc[-1] == pytest.approx(lam.max() / m)
    log_slope = np.polyfit(np.log(line["x"]), np.log(line["density"]), 1)[0]
    assert log_slope == pytest.approx(-fit.alpha, rel=1e-9)
    with pytest.raises(ValueError, match="eigenvalues"):
        density_picture([])
    # leaving out the smallest 10 %: the bars start at the 10 % quantile and hold 90 % of the mass
    clipped, _, same_fit = density_picture(lam, bins=30, scale=1 / m, drop_lowest=0.1)
    assert same_fit == fit and int(clipped["count"].sum()) == 108
    assert clipped["x_low"].iloc[0] == pytest.approx(np.sort(lam)[12] / m)
    widths = clipped["x_high"] - clipped["x_low"]
    assert float((clipped["density"] * widths).sum()) == pytest.approx(0.9, rel=1e-9)


# --- the chapter ------------------------------------------------------------------------------------

def test_primer_run_on_a_tiny_model_returns_the_tables_the_page_draws(tmp_path, tiny_model_dir, micro_corpus,
                                                                      one_thread):
    from zones.figures.primer import density_fits, mp_histogram, rank_fits, tail_slider, twin_comparison
    from zones.report import primer

    training = dict(MICRO_TRAINING, corpus=micro_corpus)
    result = primer.run(models=str(tiny_model_dir), rows=40, cols=80, tail_df=1.5, tail_dfs=[1.0, 1.5, 4.0],
                        depths=[3, 2], train_overrides=training, out_dir=str(tmp_path / "out"))
    matrices = result["matrices"]
    assert matrices["kind"].tolist() == ["gaussian", "heavy-tailed", "trained", "initialised", "trained"]
    assert matrices["matrix"].is_unique and result.extra["order"] == matrices["matrix"].tolist()
    tiny = matrices.iloc[2]
    assert (tiny["rows"], tiny["cols"], tiny["layer"]) == (32, 32, 3)  # the middle of 6 blocks, halves up
    assert matrices.iloc[0]["q"] == 0.5 and matrices.iloc[0]["rows"] == 40
    # init and trained are the same matrix of the same run: same shape, different weights
    init, trained = matrices.iloc[3], matrices.iloc[4]
    assert (init["rows"], init["cols"], init["layer"]) == (trained["rows"], trained["cols"], trained["layer"])
    assert init["alpha_shape"] != trained["alpha_shape"]
    assert result.summary["series"]["depth"] == 2 and result.summary["series"]["seed"] == 0
    # the numbers the figures and prose use agree with the library's estimators on the same matrix
    gauss = spectral_table([gaussian_matrix(40, 80, seed=0)]).iloc[0]
    assert matrices.iloc[0]["alpha_esd"] == pytest.approx(gauss["alpha_esd"], rel=1e-12)
    assert result.numbers["gauss_alpha_shape"] == pytest.approx(gauss["alpha_shape"], rel=1e-12)
    assert all(isinstance(v, (str, int, float)) for _, v in result.glue_items())
    assert result["tail_grid"]["df"].tolist() == [1.0, 1.5, 4.0]
    assert result["tail_grid"]["reference_alpha"].iloc[:2].tolist() == [1.5, 1.75]
    assert math.isnan(result["tail_grid"]["reference_alpha"].iloc[2])
    for name in ("density", "density_line", "rank", "eigenvalues"):
        assert set(result[name]["matrix"]) <= set(matrices["matrix"]), name
    assert set(result["rank"]["matrix"]) == set(matrices["matrix"])
    assert set(result["tail_rank"]["df"]) == {1.0, 1.5, 4.0}
    for name in ("matrices", "tail_grid", "density", "rank", "tail_density"):
        assert (tmp_path / "out" / f"{name}.csv").exists(), name
    # every figure of the page draws from these tables
    names = result.extra["order"]
    charts = [mp_histogram(result["eigenvalues"], result["mp_curve"], names[0]),
              twin_comparison(result["density"], result["mp_curve"], matrices, names[:2]),
              rank_fits(result["rank"], matrices, names),
              density_fits(result["density"], result["density_line"], matrices),
              tail_slider(result["tail_grid"], result["tail_density"], result["tail_line"], result["tail_rank"],
                          start=1.5)]
    specs = [c.to_dict() for c in charts]
    slider = specs[-1]["params"][0]
    assert slider["name"] == "nu" and slider["value"] == 1.5 and slider["bind"]["input"] == "select"  # uneven grid


def test_rules_of_the_primer_sentences():
    from zones.report import primer
    from zones.spectra import described

    assert primer.tail_start(3.0, 2.9) == "beyond the twin's edge"
    assert primer.tail_start(2.0, 2.9) == "below the twin's edge"
    assert primer.tail_start(float("nan"), 2.9) == "no fit"
    grid = pd.DataFrame({"df": [3.0, 1.0, 2.0], "alpha_shape": [0.4, 0.9, 0.5]})  # sorted by ν first
    assert primer.grid_trend(grid) == "falls at every step"
    assert primer.grid_trend(grid.assign(alpha_shape=[0.4, 0.9, 0.3])) == "falls overall, not at every step"
    assert primer.grid_trend(grid.assign(alpha_shape=[0.5, 0.3, 0.4])) == "rises at every step"
    assert primer.grid_trend(grid.assign(alpha_shape=[0.5, 0.3, 0.2])) == "rises overall, not at every step"
    # ν = 1, 2, 3 → 0.3, 0.5, 0.3
    assert primer.grid_trend(grid.assign(alpha_shape=[0.3, 0.3, 0.5])) == "ends where it started"
    assert primer.grid_trend(grid.assign(alpha_shape=[0.3, float("nan"), 0.5])) == "undefined"
    assert described.relative_spread([1.0, 2.0, 3.0]) == pytest.approx(1.0)
    assert math.isnan(described.relative_spread([1.0]))
    draws = pd.DataFrame({"df": [3.0, 3.0, 1.5, 1.5], "alpha_esd": [2.0, 4.0, 1.9, 1.9],
                          "alpha_shape": [0.50, 0.51, 0.5, 0.6], "n_tail": [20, 80, 150, 160]})
    assert primer.seed_reading(draws) == (
        "at ν = 1.5 α_shape moves more (18 % against 0 %), the power-law fit reading a tail of 150 to 160 "
        "eigenvalues; at ν = 3 the power-law α moves more (its range is 67 % of its mean, α_shape's 2.0 %), "
        "its fitted tail holding 20 to 80 eigenvalues")
    assert "steep fall" in primer.tail_reading(3, 4) and "handful" in primer.tail_reading(1, 4)
    assert "inside" in primer.gaussian_tail_sentence(20, 0, "below the twin's edge")
    reference = pd.DataFrame({"df": [2.0, 1.0, 4.0], "alpha_esd": [3.3, 1.58, 7.0], "alpha_esd_sigma": [0.3, 0.05, 1.0],
                              "reference_alpha": [2.0, 1.5, float("nan")]})
    assert primer.reference_agreement(reference) == "within 3 σ(α) at ν = 1; not at ν = 2"
    assert primer.reference_agreement(reference.assign(alpha_esd_sigma=[0.5, 0.05, 1.0])) == "within 3 σ(α) at ν = 1, 2"
    assert [primer.block_at(30, 0.5), primer.block_at(6, 0.5), primer.block_at(6, 1.0), primer.block_at(6, 0.0)] == [
        15, 3, 5, 0]
    with pytest.raises(ValueError, match="position"):
        primer.block_at(6, 1.5)
    seeds = described.tail_seeds(30, 60, [2.0, 3.0], seeds=3)
    assert seeds["seed"].tolist() == [0, 1, 2] * 2 and seeds["df"].tolist() == [2.0] * 3 + [3.0] * 3
    assert seeds["alpha_esd"].nunique() == 6
    assert seeds.iloc[0]["alpha_esd"] == described.tail_seeds(30, 60, 2.0, seeds=1).iloc[0]["alpha_esd"]
    table = described.compare({"wide": gaussian_matrix(30, 60), "square": gaussian_matrix(60, 60)})
    assert table["mp_low"].iloc[1] == 0.0 and table["mp_low"].iloc[0] > 0
    assert table.columns.tolist() == described.COMPARE_COLUMNS


def _micro_parameters(model_dir: Path, corpus: str) -> dict:
    return dict(models=[str(model_dir)], rows=40, cols=80, depths=[2],
                train_overrides=dict(MICRO_TRAINING, corpus=corpus))


def test_primer_chapter_executes_with_its_exercise_solutions(tmp_path, tiny_model_dir, micro_corpus, monkeypatch):
    import nbformat

    from zones.book import declared_parameters, run_notebook

    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    source = ROOT / "notebooks" / "primer.md"
    parameters = _micro_parameters(tiny_model_dir, micro_corpus)
    assert set(parameters) <= set(declared_parameters(source))
    run_notebook(source, tmp_path / "primer.ipynb", parameters, cwd=tmp_path)
    assert (tmp_path / "results" / "primer" / "matrices.csv").exists()
    notebook = nbformat.read(tmp_path / "primer.ipynb", as_version=4)
    glued = {o["metadata"]["scrapbook"]["name"] for c in notebook.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if "scrapbook" in o.get("metadata", {})}
    # every solution ran and glued the numbers its prose cites
    assert {"square_smallest", "square_shape", "draws_reading"} <= glued
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    cited = set(__import__("re").findall(r"\{glue:text\}`([a-z_0-9]+)`", markdown))
    assert cited <= glued, f"cited but never glued: {sorted(cited - glued)}"
    assert markdown.count("{solution-start}") == markdown.count("{exercise}") >= 2
    assert markdown.count("{solution-start}") == markdown.count(":class: dropdown")


@pytest.mark.slow
def test_primer_page_slider_works_offline_and_solutions_start_collapsed(tmp_path, tiny_model_dir, micro_corpus):
    """The built page in Debian's chromium with the network off, at 1280 and 390 px: the slider
    redraws the figure for another ν, every chart draws, and each solution starts collapsed."""
    from playwright.sync_api import sync_playwright

    from zones.book import build_book, copy_project

    root = copy_project(tmp_path / "project", ["primer"], root=ROOT)
    index = build_book(_micro_parameters(tiny_model_dir, micro_corpus), root=root)
    page_path = index.parent / "book" / "chapters" / "primer.html"
    shots = Path("/tmp/zones-shots")
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        for width in (1280, 390):
            context = browser.new_context(viewport={"width": width, "height": 900}, offline=True)
            page = context.new_page()
            page.goto(page_path.as_uri(), wait_until="load")
            page.wait_for_function("() => [...document.querySelectorAll('.zones-chart')].every("
                                   "c => c.querySelector('svg') || c.innerText.includes('chart error'))",
                                   timeout=30_000)
            charts = page.locator(".zones-chart")
            assert charts.count() == 5
            assert "chart error" not in page.inner_text("body")
            # the slider's figure: its label names the chosen ν, and moving the control redraws it
            control = page.locator(".zones-chart .vega-bind input[type=range]").first
            assert control.count() == 1
            slider_chart = page.locator(".zones-chart", has=page.locator(".vega-bind"))
            texts = "c => [...c.querySelectorAll('svg text')].map(t => t.textContent).join('|')"
            before = slider_chart.evaluate(texts)
            assert "ν = 1.5:" in before  # the chapter's tail_df
            control.evaluate("e => { e.value = e.max; e.dispatchEvent(new Event('input', {bubbles: true})); }")
            page.wait_for_timeout(500)
            after = slider_chart.evaluate(texts)
            assert after != before and "ν = 8:" in after
            # every solution is a collapsed dropdown: its code and prose are not shown until opened
            solutions = page.locator(".solution")
            assert solutions.count() >= 2
            for k in range(solutions.count()):
                body = solutions.nth(k).locator(".admonition-title ~ *").first
                assert not body.is_visible(), f"solution {k + 1} is open by default"
            page.screenshot(path=str(shots / f"primer-{width}.png"), full_page=True)
            context.close()
        browser.close()
