"""Sublayer removal, sublayer importance vs α, and sublayer pruning, on tiny models."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model

from zones.analysis.sublayer_importance import sublayer_alpha, sublayer_importance, sublayer_rho_table
from zones.core.adapters import get_adapter
from zones.core.data import Windows
from zones.measure.ablation import ablation_table, ablation_window_losses
from zones.measure.agreement import agreement_window_losses
from zones.measure.blocks import skip_blocks
from zones.measure.scoring import evaluate_loss, forward_nll_windows
from zones.measure.sublayer_removal import (
    format_removal,
    normalize_removal,
    parse_removal,
    removed_sublayers,
    sublayer_params,
)
from zones.pruning.strategies import plan_at_budget
from zones.pruning.sublayer_pruning import (
    compare_at_budget,
    plan_table,
    score_plans,
    sublayer_greedy_order,
    sublayer_similarity,
    tokens_per_second,
)
from zones.spectra import alpha_table

pytestmark = pytest.mark.usefixtures("one_thread")


def windows(n: int = 4, seq_len: int = 16, seed: int = 1, split: str = "eval") -> Windows:
    ids = torch.randint(0, 256, (n, seq_len), generator=torch.Generator().manual_seed(seed))
    return Windows(ids, seq_len, split=split, fingerprint=f"test-{n}-{seq_len}-{seed}-{split}")


def hook_zeroed_nll(model, ids, removal):
    """The independent reference: forward hooks that replace each sublayer's output with zeros."""
    adapter = get_adapter(model)
    handles = []
    for layer, part in removal:
        block = adapter.blocks()[layer]
        module = adapter.attention(block) if part == "attn" else adapter.mlp(block)

        def zero(_m, _a, out):
            return (torch.zeros_like(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else torch.zeros_like(out)

        handles.append(module.register_forward_hook(zero))
    try:
        with torch.inference_mode():
            return forward_nll_windows(model, ids)
    finally:
        for h in handles:
            h.remove()


def test_notation_round_trip():
    removal = normalize_removal("3:attn,5,7:mlp", 8)
    assert removal == ((3, "attn"), (5, "attn"), (5, "mlp"), (7, "mlp"))
    assert format_removal(removal) == "3:attn,5,7:mlp"
    assert normalize_removal(parse_removal(format_removal(removal)), 8) == removal
    with pytest.raises(ValueError, match="part must be"):
        normalize_removal([(1, "ffn")], 4)
    with pytest.raises(IndexError, match="out of range"):
        normalize_removal([9], 4)


@pytest.mark.parametrize("fam", ["llama", "gpt_neox", "gpt2"])
def test_removed_sublayers_matches_hook_zeroing(fam):
    model = tiny_model(fam)
    ids = windows().input_ids
    removal = [(0, "mlp"), (1, "attn"), (2, "attn"), (2, "mlp")]
    with torch.inference_mode(), removed_sublayers(model, removal):
        got = forward_nll_windows(model, ids)
    reference = hook_zeroed_nll(model, ids, removal)
    np.testing.assert_allclose(got, reference, rtol=1e-5)
    with torch.inference_mode():
        full = forward_nll_windows(model, ids)
    assert not np.allclose(got, full)  # the removal changes the output
    with torch.inference_mode():
        np.testing.assert_allclose(forward_nll_windows(model, ids), full)  # and the model is restored


@pytest.mark.parametrize("fam", ["llama", "gpt_neox"])
def test_both_sublayers_equal_skipping_the_block(fam):
    model = tiny_model(fam)
    ids = windows().input_ids
    with torch.inference_mode(), skip_blocks(model, [2]):
        skipped = forward_nll_windows(model, ids)
    np.testing.assert_allclose(hook_zeroed_nll(model, ids, [(2, "attn"), (2, "mlp")]), skipped, rtol=1e-5)


def test_agreement_scores_equal_hook_zeroing_delta_loss():
    model = tiny_model("llama")
    w = windows()
    removals = ["1:attn", "2:mlp", "0:attn,3", ""]
    long = agreement_window_losses(model, w, removals, batch_size=3, cache=False, progress=False)
    for text in removals:
        removal = normalize_removal(text, 4)
        nll = long[long["removed"] == format_removal(removal)].sort_values("window")["nll"].to_numpy()
        np.testing.assert_allclose(nll, hook_zeroed_nll(model, w.input_ids, removal), rtol=1e-5)
    full = long[long["removed"] == ""]
    assert np.allclose(full["kl"], 0, atol=1e-9) and (full["top1"] == full["n_tokens"]).all()


def test_ablation_parts_equal_hook_zeroing():
    model = tiny_model("gpt2")
    w = windows()
    table = ablation_table(model, w, parts=True, cache=False, progress=False)
    base = evaluate_loss(model, w).loss
    for layer in range(4):
        for part in ("attn", "mlp"):
            ref = hook_zeroed_nll(model, w.input_ids, [(layer, part)]).sum() / (w.n_windows * (w.seq_len - 1))
            assert table.loc[layer, f"delta_loss_{part}"] == pytest.approx(ref - base, rel=1e-5, abs=1e-7)


def test_params_split_blocks_exactly():
    model = tiny_model("llama")
    params = sublayer_params(model)
    per_block = params.groupby("layer")["n_params"].sum()
    blocks = get_adapter(model).blocks()
    assert list(per_block) == [sum(p.numel() for p in b.parameters()) for b in blocks]
    attn = sum(p.numel() for p in blocks[0].self_attn.parameters())
    norms = sum(p.numel() for p in blocks[0].input_layernorm.parameters()) * 2
    assert params.iloc[0]["n_params"] == attn + norms / 2


def test_plan_at_budget_takes_shortest_prefix():
    params = pd.DataFrame(dict(layer=[0, 0, 1, 1], part=["attn", "mlp"] * 2, n_params=[1.0, 3.0, 1.0, 3.0]))
    assert plan_at_budget([(0, "attn"), (1, "attn"), (0, "mlp")], params, 2.0) == [(0, "attn"), (1, "attn")]
    assert plan_at_budget([(0, "attn"), (1, "attn")], params, 4.0) is None


def test_sublayer_alpha_and_importance():
    model = tiny_model("llama")
    alphas = alpha_table(model, cache=False)
    alpha = sublayer_alpha(alphas, "alpha_shape")
    attn_rows = alphas[alphas["role"].isin(["q", "k", "v", "o"]) & (alphas["layer"] == 1)]
    weights = attn_rows["rows"] * attn_rows["cols"]
    expected = (attn_rows["alpha_shape"] * weights).sum() / weights.sum()
    assert alpha[(alpha["layer"] == 1) & (alpha["part"] == "attn")]["alpha"].item() == pytest.approx(expected)
    long = ablation_window_losses(model, windows(), parts=True, cache=False, progress=False)
    table = sublayer_importance(long, alphas, sublayer_params(model), n_resamples=200)
    assert len(table) == 8 and set(table["part"]) == {"attn", "mlp"}
    rho = sublayer_rho_table(long, alphas, estimators=["alpha_shape"], n_resamples=100, n_permutations=100)
    assert set(rho["part"]) == {"attn", "mlp"}
    from scipy.stats import spearmanr
    attn = table[table["part"] == "attn"]
    row = rho[(rho["part"] == "attn") & (rho["role"] == "weighted")].iloc[0]
    assert row["rho"] == pytest.approx(spearmanr(attn["alpha"], attn["delta_loss"]).statistic)


def test_greedy_first_step_is_the_lowest_single_removal():
    model = tiny_model("llama")
    cal = windows(2, seed=3, split="calibration")
    params = sublayer_params(model)
    steps = sublayer_greedy_order(model, cal, params, 2 * params["n_params"].max(), batch_size=2, cache=False,
                                  progress=False)
    singles = agreement_window_losses(model, cal, [[(l, p)] for l in range(4) for p in ("attn", "mlp")],
                                      cache=False, progress=False)
    totals = singles.groupby("removed")["nll"].sum() / (cal.n_windows * (cal.seq_len - 1))
    first = format_removal([(int(steps["layer"][0]), steps["part"][0])])
    assert totals[first] == pytest.approx(totals.min())
    assert steps["loss"][0] == pytest.approx(totals.min(), rel=1e-6)
    # the second step's loss is the loss of the two removals together
    both = normalize_removal([(int(l), p) for l, p in zip(steps["layer"][:2], steps["part"][:2])], 4)
    pair = agreement_window_losses(model, cal, [both], cache=False, progress=False)
    assert steps["loss"][1] == pytest.approx(pair["nll"].sum() / (cal.n_windows * (cal.seq_len - 1)), rel=1e-6)


def test_similarity_is_one_for_a_removed_branch():
    model = tiny_model("llama")
    cal = windows(2, seed=3, split="calibration")
    with removed_sublayers(model, [(1, "attn")]):
        sim = sublayer_similarity(model, cal, cache=False)
    assert sim[(sim["layer"] == 1) & (sim["part"] == "attn")]["cos"].item() == pytest.approx(1.0)
    assert (sim["cos"] < 1 - 1e-6).sum() >= 6


def test_plan_table_scores_and_compares_at_equal_parameters():
    model = tiny_model("llama", n_layers=6)
    cal, ev = windows(2, seed=3, split="calibration"), windows(6, seed=4)
    alphas = alpha_table(model, cache=False)
    plans = plan_table(model, cal, alphas, k_max=2, block_strategies=["zone_aware", "block_influence"],
                       cache=False, progress=False)
    assert set(plans["kind"]) == {"block", "sublayer"}
    assert (plans["params_ratio"] >= 1 - 0.01).all()
    block = plans[plans["kind"] == "block"]
    assert np.allclose(block["params_ratio"], 1.0)
    scored, long = score_plans(model, ev, plans, cache=False, progress=False, n_resamples=200)
    assert scored["delta_loss"].notna().all() and ((scored["top1"] >= 0) & (scored["top1"] <= 1)).all()
    diff = compare_at_budget(scored, long, "zone_aware", n_resamples=200)
    assert set(diff["k"]) == {1, 2} and (diff["low"] <= diff["difference"]).all()
    # an independent check of one difference: plain losses under hook zeroing
    row = diff.iloc[0]
    other = scored[(scored["k"] == row["k"]) & (scored["strategy"] == row["strategy"])]["removed"].item()
    ref = scored[(scored["k"] == row["k"]) & (scored["strategy"] == "zone_aware")]["removed"].item()
    n_tokens = ev.n_windows * (ev.seq_len - 1)
    expected = (hook_zeroed_nll(model, ev.input_ids, normalize_removal(other, 6)).sum()
                - hook_zeroed_nll(model, ev.input_ids, normalize_removal(ref, 6)).sum()) / n_tokens
    assert row["difference"] == pytest.approx(expected, rel=1e-5, abs=1e-8)
    from zones.core.progress import REFERENCE_FLOPS, matmul_flops, module_weights, work_done

    before = work_done()
    speed = tokens_per_second(model, ev, list(plans["removed"][:2]), batch_size=2, repeats=1)
    assert list(speed["removed"])[0] == "" and (speed["tokens_per_s"] > 0).all()
    # the timed forwards are counted as work: one per variant and repeat, each the matrices that
    # run (issue 37: a removed sublayer's were counted too)
    adapter = get_adapter(model)

    def matrices(module) -> int:
        return sum(p.numel() for p in module.parameters() if p.dim() >= 2)

    def running(removed: str) -> int:
        gone = [(adapter.attention if part == "attn" else adapter.mlp)(adapter.blocks()[layer])
                for layer, part in normalize_removal(removed, 6)]
        return module_weights(model) - sum(matrices(m) for m in gone)

    expected = sum(matmul_flops(running(v), ev.input_ids[:2].numel()) for v in speed["removed"]) / REFERENCE_FLOPS
    assert work_done() - before == pytest.approx(expected)
    assert all(running(v) < module_weights(model) for v in speed["removed"][1:])


def test_chapter_rules():
    from zones.report.sublayers import asymmetry, comparison_text, standing

    assert standing(-0.3, -0.1) == "cheaper" and standing(0.1, 0.2) == "costlier"
    assert standing(-0.1, 0.2) == "not separable" and standing(float("nan"), 1.0) == "undefined"
    # attention removals cost 0.1 nats less per token than MLP removals on every window
    rows = []
    for layer in range(3):
        for w in range(6):
            base = 10.0 + w
            rows.append(dict(layer=layer, window=w, nll=base + 5, base_nll=base, n_tokens=10,
                             nll_attn=base + 1.0 + 0.01 * w, nll_mlp=base + 2.0 + 0.01 * w))
    result = asymmetry(pd.DataFrame(rows), n_resamples=200)
    assert result["difference"] == pytest.approx(-0.1) and result["verdict"] == "attention costs less"
    diffs = pd.DataFrame(dict(k=[1], strategy=["attn_drop"], reference=["zone_aware"], difference=[-0.2],
                              low=[-0.3], high=[-0.1]))
    assert "at 1 block's parameters, attn_drop is cheaper than zone_aware" in comparison_text(diffs, "zone_aware")


def test_chapter_runs_on_a_model_directory(tiny_model_dir, tmp_path):
    from zones.report import sublayers as chapter

    result = chapter.run(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=4 * 31, calibration_tokens=31,
                         batch_size=4, k_max=1, block_strategies=["zone_aware"],
                         sublayer_strategies=["attn_drop", "zone_aware_attn", "sublayer_greedy"], n_resamples=100,
                         n_permutations=100, speed_repeats=1, block_agreement=True, profile=None, out_dir=str(tmp_path / "out"),
                         progress=False)
    assert {"importance", "rho", "plans", "differences", "speed"} <= set(result.tables)
    assert (tmp_path / "out" / "plans.csv").exists()
    assert len(result["importance"]) == 2 * 6 and set(result["plans"]["kind"]) == {"block", "sublayer"}
    assert "zone_aware" in result.numbers["comparison_text"]
    blocks = result["block_agreement"]
    assert len(blocks) == 6 and ((blocks["kl"] > 0) & (blocks["top1"] < 1)).all()
    assert "Spearman ρ" in result.numbers["block_agreement_text"]


def test_chapter_uses_its_n_resamples_for_every_interval(tiny_model_dir, tmp_path, monkeypatch):
    """Issue 40: ``run`` took ``n_resamples`` and dropped it in several calls, so the page's
    intervals used the default whatever the budget said. Every bootstrap it draws (they all go
    through ``scipy.stats.bootstrap``) now resamples ``n_resamples`` times."""
    import scipy.stats

    from zones.report import sublayers as chapter

    seen = []
    bootstrap = scipy.stats.bootstrap

    def counting(*args, **kwargs):
        seen.append(kwargs.get("n_resamples"))
        return bootstrap(*args, **kwargs)

    monkeypatch.setattr(scipy.stats, "bootstrap", counting)
    chapter.run(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=4 * 31, calibration_tokens=31, batch_size=4,
                k_max=1, block_strategies=["zone_aware"], sublayer_strategies=["attn_drop", "zone_aware_attn"],
                n_resamples=37, n_permutations=50, speed_repeats=1, block_agreement=True, profile=None,
                out_dir=str(tmp_path / "out"), progress=False)
    assert seen and set(seen) == {37}


def test_notebook_executes_on_a_tiny_model(tmp_path, tiny_model_dir, monkeypatch):
    from zones.book import declared_parameters, project_root, run_notebook

    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    source = project_root() / "notebooks" / "sublayers.md"
    parameters = dict(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=4 * 31, calibration_tokens=31,
                      batch_size=4, k_max=1, block_strategies=["zone_aware", "block_influence"],
                      sublayer_strategies=["attn_drop", "zone_aware_attn"], n_resamples=50, n_permutations=50, speed_repeats=1,
                      profile=None)
    assert set(parameters) <= set(declared_parameters(source))
    run_notebook(source, tmp_path / "sublayers.ipynb", parameters, cwd=tmp_path)
    text = (tmp_path / "sublayers.ipynb").read_text()
    assert "Traceback" not in text and (tmp_path / "results" / "sublayers" / "plans.csv").exists()


def test_series_sublayer_rho_matches_scipy_on_each_trained_model(micro_corpus, one_thread):
    """The trained-series part of the chapter: per run and part, ρ equals scipy's Spearman ρ
    between that part's ablation ΔLoss and its weighted α, on the run's own held-out windows."""
    from scipy.stats import spearmanr

    from zones.report.sublayers import series_rho_table, series_text
    from zones.series import heldout_windows, series_sublayer_rho, train_series

    overrides = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, steps=20, lr=3e-3,
                     eval_every=10, snapshot_every=10, checkpoint_every=15, eval_windows=8, corpus=micro_corpus)
    table = series_sublayer_rho("cpu", [5], dict(overrides, seed=0), eval_tokens=8 * 31, n_resamples=100, n_permutations=200)
    assert list(table["part"]) == ["attn", "mlp"] and set(table["n_blocks"]) == {5}
    run = train_series([5], "cpu", progress=False, **dict(overrides, seed=0))[0]
    model = run.load().model
    ablation = ablation_table(model, heldout_windows(run, 8 * 31), parts=True, progress=False)
    alphas = sublayer_alpha(alpha_table(model))
    for part in ("attn", "mlp"):
        expected = spearmanr(ablation[f"delta_loss_{part}"], alphas[alphas["part"] == part]["alpha"]).statistic
        assert table.loc[table["part"] == part, "rho"].item() == pytest.approx(expected, abs=1e-9)
    shown = series_rho_table("cpu", [5], dict(overrides, seed=0), series_eval_tokens=8 * 31, n_resamples=100,
                             n_permutations=200)
    assert shown.drop(columns="verdict").equals(table) and shown["verdict"].str.contains("On depth 5, seed 0").all()
    assert "of 1 intervals" in series_text(shown) and series_rho_table(None).empty
