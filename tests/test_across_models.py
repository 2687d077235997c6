"""The across-models chapter on a tiny pretrained model and a tiny trained depth series: one row
per model with intervals, unique labels, and the pooled verdict on borderline readings."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from zones.report.verdicts import HOLDS, OPEN, models_agreement

TRAINING = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, lr=3e-3, eval_every=10,
                snapshot_every=10, checkpoint_every=15, eval_windows=8, steps=20)


@pytest.fixture(scope="module")
def chapter(tiny_model_dir, micro_corpus, tmp_path_factory):
    from zones.report import across_models

    out = tmp_path_factory.mktemp("across") / "results"
    params = dict(models=[str(tiny_model_dir)], profile="cpu", depths=[3, 4], seeds=1,
                  train_overrides=dict(TRAINING, corpus=micro_corpus), corpus="stdlib", seq_len=32,
                  eval_tokens=31 * 8, pruning_eval_tokens=31 * 4, series_eval_tokens=31 * 8, batch_size=4,
                  series_batch_size=8, n_resamples=200, n_permutations=200, out_dir=str(out), progress=False)
    return across_models.run(**params), out


def test_one_row_per_model_with_intervals(chapter, tiny_model_dir):
    result, out = chapter
    table = result["models"]
    assert table["model"].tolist() == [tiny_model_dir.name, "depth 3, seed 0", "depth 4, seed 0"]
    assert table["family"].tolist() == ["llama", "gpt_neox", "gpt_neox"]
    assert table["blocks"].tolist() == [6, 3, 4]
    # k = ⌈L/4⌉ (fewer where a strategy may not remove that many: L = 3 keeps two, protects the last)
    assert table["k"].tolist() == [2, 1, 1]
    assert (table["parameters"] > 0).all() and (table["tokens"] > 0).all()
    for name in ("rho", "zone_aware", "keep_last", "diff", "rise"):
        low, high = table[f"{name}_low"], table[f"{name}_high"]
        ok = low.notna() & high.notna()
        assert ok.any(), name
        assert (low[ok] <= table.loc[ok, name] + 1e-12).all() and (table.loc[ok, name] <= high[ok] + 1e-12).all(), name
    # the difference is zone-aware's Δloss minus Last-N's, on the same windows
    assert table["diff"].to_numpy() == pytest.approx((table["zone_aware"] - table["keep_last"]).to_numpy())
    assert set(table["rho_claim"]) <= {"holds", "does not hold", "inconclusive"}
    assert table["best"].str.len().gt(0).all()
    written = pd.read_csv(out / "models.csv")
    assert len(written) == 3 and list(written.columns) == list(table.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["pooled_text"] == result.numbers["pooled_text"]
    assert "3 models" in result.numbers["pooled_text"]


def test_the_chapter_page_executes_on_the_cached_tables(chapter, tiny_model_dir, micro_corpus, tmp_path, monkeypatch):
    from pathlib import Path

    from zones.book import declared_parameters, run_notebook

    _, out = chapter
    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    source = Path(__file__).resolve().parents[1] / "notebooks" / "across_models.md"
    params = dict(models=[str(tiny_model_dir)], profile="cpu", depths=[3, 4], seeds=1,
                  train_overrides=dict(TRAINING, corpus=micro_corpus), corpus="stdlib", seq_len=32,
                  eval_tokens=31 * 8, pruning_eval_tokens=31 * 4, series_eval_tokens=31 * 8, batch_size=4,
                  series_batch_size=8, n_resamples=200, n_permutations=200, out_dir=str(tmp_path / "results"))
    assert set(params) <= set(declared_parameters(source))
    executed = tmp_path / "across_models.ipynb"
    run_notebook(source, executed, params, cwd=tmp_path)
    text = executed.read_text()
    assert "tbl-across-models" in text and "depth 4, seed 0" in text
    assert pd.read_csv(tmp_path / "results" / "models.csv").equals(pd.read_csv(out / "models.csv"))


def test_profiles_on_relative_depth(chapter):
    result, _ = chapter
    for name in ("alpha_profiles", "delta_profiles"):
        frame = result[name]
        assert frame["model"].nunique() == 3
        for _, part in frame.groupby("model"):
            assert part["relative_depth"].min() == 0 and part["relative_depth"].max() == 1


def test_labels_are_unique_when_names_collide(tiny_model_dir, micro_corpus, tmp_path):
    import shutil

    from zones.report import across_models

    # two models whose folders share a name (the same model listed twice is refused: test_reliability)
    twin = tmp_path / "elsewhere" / tiny_model_dir.name
    shutil.copytree(tiny_model_dir, twin)
    result = across_models.run(models=[str(tiny_model_dir), str(twin)], profile=None, seq_len=32,
                               eval_tokens=31 * 4, pruning_eval_tokens=31 * 4, batch_size=4, n_resamples=50,
                               n_permutations=50, out_dir=str(tmp_path / "out"), progress=False)
    labels = result["models"]["model"].tolist()
    assert len(labels) == len(set(labels)) == 2
    assert set(result["alpha_profiles"]["model"]) == set(labels)
    assert "nothing is pooled" not in result.numbers["pooled_text"]
    # attribution on every model: ρ partialled on block index, without the end blocks, with the Q-projection α
    models = result["models"]
    assert {"rho_partial", "rho_inner", "rho_q", "rank_trend"} <= set(models.columns)
    assert models["rho_partial_low"].le(models["rho_partial_high"]).all()
    assert result.numbers["attribution_text"].count("partialled on block index") == 2


def test_figures_build(chapter):
    from zones.figures.across_models import profiles_on_depth, rho_by_model
    from zones.report.verdicts import PAPER_RHO

    result, _ = chapter
    spec = rho_by_model(result["models"], PAPER_RHO).to_dict()
    assert spec["layer"][0]["mark"]["type"] == "rect"
    spec = profiles_on_depth(result["alpha_profiles"], result["delta_profiles"]).to_dict()
    assert len(spec["concat"]) == 2


# --- the pooled verdict ------------------------------------------------------------------------------

def test_agreement_needs_every_model_to_give_the_same_word():
    pooled = models_agreement({"ρ": {"a": "above 0", "b": "above 0"}, "shape": {"a": "rises", "b": "falls"}})
    assert pooled["agree"] == {"ρ": "above 0"}
    assert pooled["part"] == {"shape": {"rises": ["a"], "falls": ["b"]}}
    assert pooled["text"].startswith("The 2 models agree on 1 of the 2 readings")
    assert "rises: a" in pooled["text"] and "falls: b" in pooled["text"]


def test_an_inconclusive_beside_a_holds_is_a_parting():
    pooled = models_agreement({"claim": {"a": HOLDS, "b": OPEN, "c": HOLDS}})
    assert pooled["agree"] == {}
    assert pooled["part"] == {"claim": {HOLDS: ["a", "c"], OPEN: ["b"]}}
    assert "agree on none" in pooled["text"]


def test_all_inconclusive_is_agreement_on_inconclusive_and_not_measured_is_left_out():
    pooled = models_agreement({"claim": {"a": OPEN, "b": OPEN}, "tasks": {"a": "not measured", "b": None}})
    assert pooled["agree"] == {"claim": OPEN} and pooled["part"] == {}
    assert "tasks" not in pooled["text"] and "They part on none" in pooled["text"]


def test_one_model_pools_nothing_and_bad_input_is_refused():
    pooled = models_agreement({"ρ": {"a": "includes 0"}})
    assert pooled["n_models"] == 1 and "nothing is pooled" in pooled["text"]
    with pytest.raises(ValueError, match="no readings"):
        models_agreement({})
    with pytest.raises(ValueError, match="same models"):
        models_agreement({"x": {"a": "w", "b": "w"}, "y": {"a": "w"}})
    assert models_agreement.rule.startswith("for each reading")


def test_quarter_k_and_words():
    from zones.report.across_models import pruning_word, quarter_k, rho_word

    assert quarter_k(30) == 8 and quarter_k(8) == 2 and quarter_k(16) == 4
    assert quarter_k(2) == 0   # no block can go: the comparison is undefined, not an error
    assert pruning_word(-0.3, -0.1) == "zone-aware ahead" and pruning_word(0.1, 0.2) == "Last-N ahead"
    assert pruning_word(-0.1, 0.1) == "not separable" and pruning_word(0.0, 0.0) == "same blocks"
    assert rho_word(math.nan, 0.2) == "undefined" and rho_word(-0.2, 0.3) == "includes 0"
