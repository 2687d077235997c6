"""Depth pruning: strategies, the exact segmentation, prefix-tree scoring and the table."""
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model

from zones.core import hardware
from zones.core.adapters import get_adapter
from zones.core.data import corpus_windows
from zones.measure import scoring
from zones.measure.blocks import skip_blocks
from zones.measure.bootstrap import NonFiniteLossError
from zones.measure.scoring import evaluate_loss, evaluate_removals, prefix_tree_work
from zones.pruning import (
    STRATEGIES,
    PruningContext,
    StrategyError,
    alpha_zones,
    best_sets,
    bic_segment_count,
    compare,
    compare_strategies,
    crossover_k,
    pairwise_differences,
    parse_removed,
    pruning_sweep,
    pruning_table,
    register_strategy,
    segment_profile,
    segmentation_cost,
    strategies,
    summarize_pruning,
    zone_aware_order,
)
from zones.pruning import sweep as sweep_module

ROOT = Path(__file__).resolve().parents[1]
N_LAYERS = 8


@pytest.fixture(scope="module")
def windows(tiny_tokenizer):
    return (corpus_windows("stdlib", tiny_tokenizer, 32, "eval", 31 * 4),
            corpus_windows("stdlib", tiny_tokenizer, 32, "calibration", 31 * 3))


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    return tiny_model("llama", n_layers=N_LAYERS, vocab=len(tiny_tokenizer))


def fake_alpha(values, role="q"):
    """An α table holding one role's profile (what the α-based strategies read)."""
    return pd.DataFrame({"layer": range(len(values)), "role": role, "alpha_shape": values})


# --- segmentation --------------------------------------------------------------------------

def brute_force_cost(x, m):
    best = np.inf
    for cuts in itertools.combinations(range(1, len(x)), m - 1):
        labels = np.zeros(len(x), dtype=int)
        for c in cuts:
            labels[c:] += 1
        best = min(best, segmentation_cost(x, labels))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_segmentation_is_optimal_on_small_profiles(seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=int(rng.integers(4, 9)))
    for m in range(1, min(4, len(x)) + 1):
        labels = segment_profile(x, m)
        assert len(np.unique(labels)) == m
        assert np.all(np.diff(labels) >= 0)  # contiguous, in depth order
        assert segmentation_cost(x, labels) == pytest.approx(brute_force_cost(x, m), abs=1e-10)


def test_bic_finds_a_clear_step_count_and_not_noise():
    rng = np.random.default_rng(0)
    steps = np.repeat([0.2, 0.5, 0.3], 10) + rng.normal(scale=0.01, size=30)
    assert bic_segment_count(steps) == 3
    assert bic_segment_count(rng.normal(scale=0.01, size=30) + 0.4) == 1


def test_segmentation_rejects_bad_input():
    with pytest.raises(ValueError, match="n_segments"):
        segment_profile([1.0, 2.0], 3)
    with pytest.raises(ValueError, match="non-finite"):
        segment_profile([1.0, np.nan, 2.0], 2)


# --- the zone-aware rule on known profiles ---------------------------------------------------

PROFILE = pd.Series([0.1, 0.2, 0.21, 0.19, 0.5, 0.52, 0.51, 0.3, 0.31, 0.32])


def test_zone_aware_order_follows_the_recipe():
    zones = alpha_zones(PROFILE, 3)
    assert zones.groupby("zone")["layer"].apply(list).tolist() == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert zones.groupby("zone")["zone_rank"].first().tolist() == [0, 2, 1]
    order = zone_aware_order(PROFILE, n_zones=3)
    assert 0 not in order and 9 not in order  # protected ends
    lowest = set(zones.loc[zones["zone_rank"] == 0, "layer"]) - {0, 9}
    assert order[0] == min(lowest, key=lambda b: PROFILE[b])  # lowest zone, lowest α first
    # spreading: no two adjacent removals while a non-adjacent candidate remained
    for k in range(1, len(order)):
        removed, block = set(order[:k]), order[k]
        adjacent = block - 1 in removed or block + 1 in removed
        apart = [b for b in order[k:] if b - 1 not in removed and b + 1 not in removed]
        assert not adjacent or not apart


def test_recipe_knobs_change_what_they_say():
    no_spread = zone_aware_order(PROFILE, n_zones=3, spread=False)
    assert no_spread[:3] == [3, 1, 2]  # lowest α inside the lowest zone, adjacency allowed
    unprotected = zone_aware_order(PROFILE, n_zones=3, protect_first=0, protect_last=0)
    assert unprotected[0] == 0
    one_zone = zone_aware_order(PROFILE, n_zones=1, spread=False)
    assert one_zone == sorted(range(1, 9), key=lambda b: PROFILE[b])


# --- every strategy on a tiny model ------------------------------------------------------------

def test_every_strategy_returns_valid_plans(model, windows):
    """The common check, over every registered strategy of both kinds: block plans hold k
    distinct blocks in range; sublayer plans are nested prefixes of distinct sublayers that
    remove k blocks' parameters (or None where the order never gets there)."""
    ev, cal = windows
    ctx = PruningContext(model, cal, alpha=fake_alpha(np.linspace(0.1, 0.5, N_LAYERS)), batch_size=2,
                         progress=False)
    sublayer_ctx = PruningContext(model, cal, batch_size=2, progress=False)   # the real α table: every role
    k_max = N_LAYERS - 2
    assert {s.kind for s in STRATEGIES.values()} == {"block", "sublayer"}
    for strategy in STRATEGIES.values():
        for seed in (0, 1):
            if strategy.kind == "sublayer":
                plans = strategy.plan(sublayer_ctx, 2, seed)
                block = sublayer_ctx.block_params()
                sizes = sublayer_ctx.sublayer_params().set_index(["layer", "part"])["n_params"]
                reached = [p for p in plans if p is not None]
                assert reached, strategy.name
                for k, plan in enumerate(plans, start=1):
                    if plan is None:
                        continue
                    assert len(set(plan)) == len(plan) and all(0 <= l < N_LAYERS and p in ("attn", "mlp")
                                                               for l, p in plan), strategy.name
                    assert sum(sizes[s] for s in plan) >= (1 - strategies.TOLERANCE) * k * block
                    assert plan == reached[-1][:len(plan)]   # nested: one removal order
                continue
            plans = strategy.plan(ctx, k_max, seed)
            assert len(plans) == k_max
            for k, plan in enumerate(plans, start=1):
                assert len(plan) == k and len(set(plan)) == k and all(0 <= b < N_LAYERS for b in plan)
            if "protect_first" in strategy.params:
                p_first, p_last = strategy.params["protect_first"], strategy.params["protect_last"]
                protected = set(range(p_first)) | set(range(N_LAYERS - p_last, N_LAYERS))
                assert not protected & set(plans[-1]), strategy.name
    assert STRATEGIES["last_n"].plan(ctx, 3) == [[7], [7, 6], [7, 6, 5]]
    assert STRATEGIES["last_n_keep_last"].plan(ctx, 3) == [[6], [6, 5], [6, 5, 4]]
    assert STRATEGIES["last_n_keep_last"].max_k(N_LAYERS) == N_LAYERS - 2
    assert {"last_n_keep_last", "random_protected"} <= set(sweep_module.DEFAULT_STRATEGIES) <= set(STRATEGIES)
    for k, plan in enumerate(STRATEGIES["angular"].plan(ctx, k_max), start=1):
        assert plan == list(range(plan[0], plan[0] + k))  # one contiguous run


def test_the_common_check_refuses_a_bad_plan_of_either_kind(model, windows):
    _, cal = windows
    ctx = PruningContext(model, cal, batch_size=2, progress=False)
    try:
        register_strategy("twice_test", kind="sublayer")(lambda ctx, target, seed: [(1, "attn"), (1, "attn")])
        register_strategy("out_of_range_test", kind="sublayer")(lambda ctx, target, seed: [(N_LAYERS, "mlp")])
        register_strategy("repeat_block_test")(lambda ctx, k_max, seed: [[1]] + [[1, 1]] * (k_max - 1))
        with pytest.raises(StrategyError, match="a sublayer twice"):
            STRATEGIES["twice_test"].plan(ctx, 1)
        with pytest.raises(StrategyError, match="blocks 0..7"):
            STRATEGIES["out_of_range_test"].plan(ctx, 1)
        with pytest.raises(StrategyError, match="distinct"):
            STRATEGIES["repeat_block_test"].plan(ctx, 2)
        # a block sweep takes block strategies only, and says which kind a name is
        with pytest.raises(StrategyError, match="'attn_drop' is a sublayer strategy"):
            strategies.get_strategy("attn_drop")
        with pytest.raises(StrategyError, match="unknown strategy"):
            sweep_module.check_strategy_names(["zone_aware", "attn_drop"])
    finally:
        for name in ("twice_test", "out_of_range_test", "repeat_block_test"):
            STRATEGIES.pop(name, None)


@pytest.mark.parametrize("name", ["random", "random_protected"])
def test_random_is_reproducible_by_seed(model, name):
    ctx = PruningContext(model, progress=False)
    random = STRATEGIES[name]
    assert random.plan(ctx, 5, seed=3) == random.plan(ctx, 5, seed=3)
    assert len({tuple(random.plan(ctx, 5, seed=s)[-1]) for s in range(5)}) > 1
    if name == "random_protected":
        used = {b for s in range(20) for b in random.plan(ctx, 5, seed=s)[-1]}
        assert used == set(range(1, N_LAYERS - 1))  # every middle block, never an end


def test_baselines_match_their_definitions(model, windows):
    _, cal = windows
    ctx = PruningContext(model, cal, batch_size=2, progress=False, cache=False)
    # greedy: each step is the argmin of the calibration loss, evaluated directly
    order = STRATEGIES["greedy"].plan(ctx, 2)[-1]
    removed = []
    for block in order:
        losses = {}
        for b in range(N_LAYERS):
            if b not in removed:
                with skip_blocks(model, removed + [b]):
                    losses[b] = evaluate_loss(model, cal, batch_size=2).loss
        assert block == min(losses, key=losses.get)
        removed.append(block)
    # block influence: 1 − mean cos(input, output) from hidden states captured by hooks
    stats = ctx.hidden_stats()
    ids = cal.input_ids
    import torch

    with torch.no_grad():
        hidden = model(input_ids=ids, output_hidden_states=True).hidden_states
    first = torch.nn.functional.cosine_similarity(hidden[0], hidden[1], dim=-1).double().mean()
    got = stats.query("start == 0 and span == 1")["mean_cos"].item()
    assert got == pytest.approx(float(first), abs=1e-5)
    # ablation rank: ascending single-block ΔLoss
    table = ctx.ablation()
    assert STRATEGIES["ablation_rank"].plan(ctx, 3)[-1] == table.sort_values("delta_loss")["layer"].tolist()[:3]


# --- scoring --------------------------------------------------------------------------------

def test_removal_losses_equal_direct_evaluation(family, tiny_tokenizer):
    model = tiny_model(family, n_layers=6, vocab=len(tiny_tokenizer))
    ev = corpus_windows("stdlib", tiny_tokenizer, 32, "eval", 31 * 3)
    sets = [(), (3,), (0, 5), (2, 3, 4), (3,), (1, 2), (0, 1, 2, 3)]
    got = evaluate_removals(model, ev, sets, batch_size=2, progress=False)
    for removed, result in zip(sets, got):
        with skip_blocks(model, removed):
            direct = evaluate_loss(model, ev, batch_size=2)
        assert result.loss == pytest.approx(direct.loss, abs=1e-5)
        assert result.n_tokens == direct.n_tokens


def test_kept_traces_trace_each_batch_once_and_change_no_number(model, tiny_tokenizer, monkeypatch):
    ev = corpus_windows("stdlib", tiny_tokenizer, 32, "eval", 31 * 3)
    chunks = [[(), (3,), (0, 5)], [(2, 3, 4), (1, 2)], [(0, 1, 2, 3)]]
    fresh = [r.window_nll for chunk in chunks
             for r in evaluate_removals(model, ev, chunk, batch_size=2, progress=False)]
    traced = []
    real = scoring.BlockTrace
    monkeypatch.setattr(scoring, "BlockTrace", lambda *a: traced.append(1) or real(*a))
    traces: dict = {}
    kept = [r.window_nll for chunk in chunks
            for r in evaluate_removals(model, ev, chunk, batch_size=2, progress=False, traces=traces)]
    assert len(traced) == 2  # two batches, traced once for the three calls
    for a, b in zip(fresh, kept):
        np.testing.assert_array_equal(a, b)


def test_the_head_chunk_changes_no_number(model, tiny_tokenizer, monkeypatch):
    ev = corpus_windows("stdlib", tiny_tokenizer, 32, "eval", 31 * 3)
    whole = evaluate_removals(model, ev, [(), (2,)], batch_size=3, progress=False)
    monkeypatch.setattr(scoring, "HEAD_CHUNK", 7)  # several chunks per window, one across windows
    chunked = evaluate_removals(model, ev, [(), (2,)], batch_size=3, progress=False)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(a.window_nll, b.window_nll, rtol=1e-6)


def test_prefix_tree_never_does_more_work_than_prefix_reuse():
    rng = np.random.default_rng(0)
    sets = [rng.choice(30, size=k, replace=False) for k in range(1, 9) for _ in range(5)]
    work = prefix_tree_work(sets, 30)
    assert work["tree"] <= work["prefix"] <= work["naive"]


def test_table_delta_ppl_equals_direct_evaluation(model, windows):
    ev, cal = windows
    table = pruning_table(model, ev, cal, strategies=["zone_aware", "last_n", "random"], k_max=3, seeds=2,
                          alpha=fake_alpha(np.linspace(0.5, 0.1, N_LAYERS)), batch_size=2, progress=False,
                          model_name="tiny")
    assert list(table.columns) == sweep_module.COLUMNS
    assert len(table) == 3 + 3 + 2 * 3
    np.testing.assert_allclose(table["delta_loss"], np.log(table["ppl"] / table["base_ppl"]), atol=1e-12)
    assert set(table.loc[table["strategy"] == "random", "seed"]) == {0, 1}
    base = evaluate_loss(model, ev, batch_size=2).ppl
    for _, row in table.sample(4, random_state=0).iterrows():
        with skip_blocks(model, parse_removed(row["removed"])):
            ppl = evaluate_loss(model, ev, batch_size=2).ppl
        assert row["delta_ppl"] == pytest.approx(ppl - base, rel=1e-4)
    assert table.loc[(table.strategy == "last_n") & (table.k == 3), "removed"].item() == "7,6,5"


def test_table_is_cached_and_resumes(model, windows, monkeypatch, tmp_path):
    from zones.measure import scoring

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))  # no sets scored by other tests
    ev, _ = windows
    args = dict(strategies=["last_n", "random"], k_max=3, seeds=3, batch_size=2, progress=False)
    real = scoring._ChunkScorer.values
    calls = []

    def interrupted(self, removal):
        if len(calls) == 6:
            raise KeyboardInterrupt
        calls.append(removal)
        return real(self, removal)

    monkeypatch.setattr(scoring, "SETS_PER_PASS", 4)
    monkeypatch.setattr(scoring._ChunkScorer, "values", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pruning_table(model, ev, **args)
    calls.clear()
    monkeypatch.setattr(scoring._ChunkScorer, "values", lambda self, r: calls.append(r) or real(self, r))
    resumed = pruning_table(model, ev, **args)
    n_sets = len(set(resumed["removed"].map(lambda r: tuple(sorted(parse_removed(r)))))) + 1
    n_batches = -(-ev.n_windows // 2)
    # The first batch's first pass of 4 sets was stored; every other (batch, set) is computed now,
    # the full model of each batch once (first, to check it).
    assert len(calls) == n_sets * n_batches - 4
    calls.clear()
    again = pruning_table(model, ev, **args)
    assert calls == []
    pd.testing.assert_frame_equal(again, resumed)
    fresh = pruning_table(model, ev, cache=False, **args)
    pd.testing.assert_frame_equal(fresh, resumed)


# --- bad input, before any forward pass ---------------------------------------------------------

def test_bad_arguments_fail_before_any_forward(model, windows, monkeypatch):
    ev, cal = windows

    def no_forward(*a, **kw):
        raise AssertionError("a forward pass ran")

    monkeypatch.setattr(sweep_module, "score_windows", no_forward)
    monkeypatch.setattr(strategies, "BlockTrace", no_forward)
    with pytest.raises(ValueError, match="k_max=7 is too large"):
        pruning_table(model, ev, cal, strategies=["last_n"], k_max=7)
    params = dict(STRATEGIES["zone_aware"].params, protect_first=2)
    register_strategy("zone_aware_protect2_test", **params)(strategies.zone_aware)
    try:  # protecting three blocks leaves five removable: refused before greedy's search
        with pytest.raises(ValueError, match="'zone_aware_protect2_test' may remove at most 5"):
            pruning_table(model, ev, cal, strategies=["greedy", "zone_aware_protect2_test"], k_max=6)
    finally:
        STRATEGIES.pop("zone_aware_protect2_test")
    with pytest.raises(StrategyError, match="unknown strategy.*'nope'"):
        pruning_table(model, ev, cal, strategies=["last_n", "nope"], k_max=2)
    with pytest.raises(ValueError, match="need calibration_windows"):
        pruning_table(model, ev, None, strategies=["greedy"], k_max=2)
    with pytest.raises(ValueError, match="seeds"):
        pruning_table(model, ev, cal, strategies=["random"], k_max=2, seeds=0)


# --- the registry -----------------------------------------------------------------------------

def test_a_user_strategy_is_one_decorated_function(model, windows):
    ev, _ = windows
    try:
        @register_strategy("middle_out_test", description="the middle blocks first")
        def middle_out(ctx, k_max, seed):
            middle = ctx.n_blocks // 2
            return strategies.prefixes(sorted(range(1, ctx.n_blocks - 1), key=lambda i: abs(i - middle)), k_max)

        with pytest.raises(ValueError, match="already registered"):
            register_strategy("middle_out_test")(middle_out)
        table = pruning_table(model, ev, strategies="middle_out_test,last_n", k_max=2, batch_size=2, progress=False)
        assert table.loc[table.strategy == "middle_out_test", "removed"].tolist() == ["4", "4,3"]

        @register_strategy("broken_test")
        def broken(ctx, k_max, seed):
            return [[1, 1]] * k_max

        with pytest.raises(StrategyError, match="distinct"):
            pruning_table(model, ev, strategies=["broken_test"], k_max=2, batch_size=2, progress=False)
    finally:
        STRATEGIES.pop("middle_out_test", None)
        STRATEGIES.pop("broken_test", None)


# --- reading the table ----------------------------------------------------------------------------

def test_crossover_and_summaries():
    rows = []
    for k, (last, zone) in enumerate([(1, 2), (2, 3), (5, 4), (9, 4)], start=1):
        rows += [dict(strategy="last_n", k=k, seed=0, delta_ppl=last, ppl=10 + last, base_ppl=10),
                 dict(strategy="zone_aware", k=k, seed=0, delta_ppl=zone, ppl=10 + zone, base_ppl=10)]
        rows += [dict(strategy="random", k=k, seed=s, delta_ppl=10 + s, ppl=20 + s, base_ppl=10) for s in range(3)]
    summary = summarize_pruning(pd.DataFrame(rows))
    random = summary[summary.strategy == "random"].iloc[0]
    assert (random.delta_ppl, random.delta_ppl_min, random.delta_ppl_max, random.n_seeds) == (11, 10, 12, 3)
    comparison = compare_strategies(summary)
    assert comparison["ratio"].tolist() == pytest.approx([0.5, 2 / 3, 1.25, 2.25])
    assert crossover_k(comparison) == 3
    assert crossover_k(comparison.iloc[:2]) is None
    # a tie after Last-N's last win does not move the crossover (the scorecard's rule: issue 40)
    ties = pd.DataFrame(dict(k=[1, 2, 3, 4, 5], winner=["last_n", "zone_aware", "tie", "tie", "zone_aware"]))
    assert crossover_k(ties) == 2
    best = compare.best_by_k(summary)
    assert best["best"].tolist() == ["last_n", "last_n", "zone_aware", "zone_aware"]
    assert best["worst"].tolist() == ["random"] * 4


# --- intervals from the per-window losses -------------------------------------------------------

@pytest.fixture(scope="module")
def sweep(model, tiny_tokenizer):
    ev = corpus_windows("stdlib", tiny_tokenizer, 32, "eval", 31 * 6)
    return pruning_sweep(model, ev, strategies=["zone_aware", "last_n", "last_n_keep_last", "random",
                                                "random_protected"],
                         k_max=3, seeds=5, alpha=fake_alpha(np.linspace(0.5, 0.1, N_LAYERS)), batch_size=3,
                         progress=False, cache=False), ev


def test_window_losses_are_the_table_s_losses(sweep, model):
    result, ev = sweep
    long = result.window_losses
    assert list(long.columns) == sweep_module.WINDOW_COLUMNS
    assert set(long["window"]) == set(range(ev.n_windows)) and (long["n_tokens"] == 31).all()
    per_set = long.groupby("removed")["nll"].sum() / (31 * ev.n_windows)
    base = per_set[""]
    for _, row in result.table.sample(6, random_state=1).iterrows():
        loss = per_set[sweep_module.canonical_removed(row["removed"])]
        assert row["delta_loss"] == pytest.approx(loss - base, abs=1e-12)
    # A window's NLL is that window's own evaluation.
    with skip_blocks(model, [7, 6]):
        one = evaluate_loss(model, sweep_module.Windows(ev.input_ids[2:3], "stdlib", "eval", "w2"))
    assert long.query("removed == '6,7' and window == 2")["nll"].item() == pytest.approx(one.loss * 31, rel=1e-6)


def test_summary_intervals_medians_and_iqr(sweep):
    result, _ = sweep
    summary = summarize_pruning(result.table, result.window_losses)
    assert (summary["delta_loss_low"] <= summary["delta_loss"] + 1e-12).all()
    assert (summary["delta_loss"] <= summary["delta_loss_high"] + 1e-12).all()
    assert (summary["delta_ppl_low"] <= summary["delta_ppl"] + 1e-9).all()
    assert (summary["delta_ppl"] <= summary["delta_ppl_high"] + 1e-9).all()
    assert (summary["delta_loss_high"] > summary["delta_loss_low"]).all()
    random = result.table[(result.table.strategy == "random") & (result.table.k == 2)]
    row = summary[(summary.strategy == "random") & (summary.k == 2)].iloc[0]
    assert row["n_seeds"] == 5 and row["delta_ppl"] == pytest.approx(random["delta_ppl"].median())
    assert row["delta_ppl_mean"] == pytest.approx(random["delta_ppl"].mean())
    assert row["delta_ppl_q25"] == pytest.approx(random["delta_ppl"].quantile(0.25))
    # Without the windows the point values stay and the intervals are NaN.
    plain = summarize_pruning(result.table)
    np.testing.assert_allclose(plain["delta_ppl"], summary["delta_ppl"])
    assert plain["delta_ppl_low"].isna().all()


def test_pairwise_differences_and_best_sets(sweep):
    result, _ = sweep
    summary = summarize_pruning(result.table, result.window_losses).set_index(["strategy", "k"])
    pairs = pairwise_differences(result.table, result.window_losses)
    assert len(pairs) == 3 * 10  # 5 strategies: 10 pairs per k
    for _, p in pairs.iterrows():
        expected = summary.loc[(p.strategy_a, p.k), "delta_loss"] - summary.loc[(p.strategy_b, p.k), "delta_loss"]
        assert p["diff"] == pytest.approx(expected, abs=1e-12)
        assert p.diff_low <= p["diff"] <= p.diff_high
        assert p.separable == (p.diff_low > 0 or p.diff_high < 0)
    # Strategies that remove the same blocks differ by exactly 0, with a zero-width interval.
    same = pairs.query("k == 1 and strategy_a == 'zone_aware' and strategy_b == 'last_n_keep_last'").iloc[0]
    assert (same["diff"], same.diff_low, same.diff_high, same.separable) == (0, 0, 0, False)
    best = best_sets(result.table, result.window_losses)
    assert best["k"].tolist() == [1, 2, 3]
    for _, row in best.iterrows():
        members = row.best_set.split(",")
        assert members[0] == row.best and row.n_best == len(members)
        at_k = pairs[pairs.k == row.k]
        for other in set(summary.xs(row.k, level="k").index) - {row.best}:
            pair = at_k[((at_k.strategy_a == other) & (at_k.strategy_b == row.best))
                        | ((at_k.strategy_b == other) & (at_k.strategy_a == row.best))].iloc[0]
            assert (other in members) == (not pair.separable), (row.k, other)
        assert row.worst_set.split(",")[0] == row.worst


def test_compare_strategies_intervals_and_status(sweep):
    result, _ = sweep
    comparison = compare_strategies(result.table, "last_n", "zone_aware", result.window_losses)
    assert list(comparison.columns) == ["k", "numerator", "denominator", "last_n", "zone_aware", "ratio",
                                        "ratio_low", "ratio_high", "status", "winner"]
    ok = comparison[comparison.status == "ratio"]
    assert ((ok.ratio_low <= ok.ratio) & (ok.ratio <= ok.ratio_high)).all()
    assert set(comparison["status"]) <= {"ratio", "collapsed", "n/a"}
    assert comparison.loc[comparison.status == "n/a", "ratio_low"].isna().all()


def synthetic_sweep(base_loss, strategy_losses, n_windows=12, noise=0.02, seed=0):
    """A table and window losses with known per-window losses (31 tokens a window)."""
    rng = np.random.default_rng(seed)
    hard = rng.normal(0, 0.3, n_windows)
    rows, long = [], [dict(removed="", window=w, nll=31 * (base_loss + hard[w]), n_tokens=31) for w in range(n_windows)]
    for i, (name, loss) in enumerate(strategy_losses.items()):
        removed = str(i)
        own = rng.normal(0, noise, n_windows)
        long += [dict(removed=removed, window=w, nll=31 * (loss + hard[w] + own[w]), n_tokens=31)
                 for w in range(n_windows)]
        rows.append(dict(model="m", strategy=name, k=1, seed=0, removed=removed, n_tokens=31 * n_windows))
    long = pd.DataFrame(long)
    mean = long.groupby("removed")["nll"].sum() / (31 * n_windows)
    table = pd.DataFrame(rows)
    table["ppl"] = np.exp(mean[table["removed"]].to_numpy())
    table["base_ppl"] = float(np.exp(mean[""]))
    table["delta_ppl"] = table["ppl"] - table["base_ppl"]
    table["delta_loss"] = np.log(table["ppl"] / table["base_ppl"])
    return table, long


def test_a_collapsed_arm_is_named_not_printed_as_a_ratio():
    # last_n collapsed (7 nats), zone_aware barely moves: the ratio is enormous.
    table, long = synthetic_sweep(2.0, {"last_n": 9.0, "zone_aware": 2.05, "last_n_keep_last": 2.3})
    comparison = compare_strategies(table, "last_n", "zone_aware", long)
    assert comparison["ratio"].item() > 1e3 and comparison["status"].item() == "collapsed"
    assert comparison["winner"].item() == "zone_aware"
    fair = compare_strategies(table, "last_n_keep_last", "zone_aware", long).iloc[0]
    assert fair.status == "ratio" and fair.ratio_low <= fair.ratio <= fair.ratio_high and fair.winner == "zone_aware"
    # The denominator's interval reaches 0: collapsed too, and no winner where nothing separates.
    table, long = synthetic_sweep(2.0, {"last_n": 2.02, "zone_aware": 2.012}, noise=0.05)
    row = compare_strategies(table, "last_n", "zone_aware", long).iloc[0]
    assert row.last_n > 0 and row.zone_aware > 0  # a ratio exists, but its denominator may be 0
    assert row.status == "collapsed" and row.winner == "tie"
    # A strategy that lowers the loss has no ratio.
    table, long = synthetic_sweep(2.0, {"last_n": 1.9, "zone_aware": 2.3})
    assert compare_strategies(table, "last_n", "zone_aware", long)["status"].item() == "n/a"


def test_best_set_holds_every_strategy_not_separable_from_the_best():
    table, long = synthetic_sweep(2.0, {"a": 2.10, "b": 2.101, "c": 2.5}, noise=0.01)
    row = best_sets(table, long).iloc[0]
    assert row.best in {"a", "b"} and set(row.best_set.split(",")) == {"a", "b"} and row.worst_set == "c"


def test_figures_draw_intervals_and_mark_collapsed_ratios():
    from zones.figures.pruning import crossover_chart, delta_ppl_bars, delta_ppl_lines

    table, long = synthetic_sweep(2.0, {"last_n": 9.0, "zone_aware": 2.05, "last_n_keep_last": 2.3})
    summary = summarize_pruning(table, long)
    marks = lambda spec: [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
                          for layer in spec["layer"]]
    bars = delta_ppl_bars(summary, ["zone_aware", "last_n"]).to_dict()
    assert marks(bars) == ["bar", "rule"] and bars["layer"][1]["encoding"]["y"]["field"] == "delta_ppl_low_plot"
    assert "rule" in marks(delta_ppl_lines(summary).to_dict())
    collapsed = crossover_chart(compare_strategies(table, "last_n", "zone_aware", long)).to_dict()
    assert "line" in marks(collapsed) and marks(collapsed)[-2:] == ["point", "text"]  # the collapsed mark
    plotted = [r for rows in collapsed["datasets"].values() for r in rows if "ratio" in r and "label" not in r]
    assert plotted == []  # the 10⁴× ratio is not drawn as a value
    fair = crossover_chart(compare_strategies(table, "last_n_keep_last", "zone_aware", long),
                           "last_n_keep_last").to_dict()
    assert marks(fair)[-1] == "rule" and "point" not in marks(fair)[-2:]


# --- non-finite losses are errors ------------------------------------------------------------------

def test_a_nan_weight_stops_the_sweep_naming_the_set_and_window(windows, tiny_tokenizer):
    ev, cal = windows
    model = tiny_model("llama", n_layers=N_LAYERS, vocab=len(tiny_tokenizer))
    with torch.no_grad():
        get_adapter(model).blocks()[5].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"full model is not finite \(nan\) on window 0 of 4"):
        pruning_table(model, ev, strategies=["last_n"], k_max=2, batch_size=2, progress=False, cache=False)
    with pytest.raises(NonFiniteLossError, match="not finite"):
        evaluate_loss(model, ev)
    # the full model is checked first: a set that keeps the broken block is blamed on the full model
    with pytest.raises(NonFiniteLossError, match=r"full model is not finite \(nan\) on window 0"):
        evaluate_removals(model, ev, [(5,), (1,)], progress=False)
    # even a set that removes the broken block is refused: the full model is checked first
    with pytest.raises(NonFiniteLossError, match="full model is not finite"):
        evaluate_removals(model, ev, [(5,)], progress=False)
    for name in ("ablation_rank", "greedy", "block_influence"):
        ctx = PruningContext(model, cal, batch_size=2, progress=False, cache=False)
        with pytest.raises(NonFiniteLossError, match="not finite"):
            STRATEGIES[name].plan(ctx, 2)


def test_a_nan_alpha_says_what_to_do_instead(model):
    alpha = fake_alpha(np.r_[np.linspace(0.1, 0.5, N_LAYERS - 1), np.nan])
    ctx = PruningContext(model, alpha=alpha, progress=False)
    with pytest.raises(StrategyError, match="NaN for layers \\[7\\].*leave zone_aware\\*, alpha_lowest out of "
                                            "--strategies") as err:
        STRATEGIES["zone_aware"].plan(ctx, 2)
    assert "choose another estimator" not in str(err.value)


def test_bfloat16_scoring_is_close_and_keyed_apart(model, windows, monkeypatch, tmp_path):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": True)  # the test must run on any CPU
    ev, _ = windows
    args = dict(strategies=["last_n"], k_max=2, batch_size=2, progress=False)
    fp32 = pruning_table(model, ev, **args)
    bf16 = pruning_table(model, ev, dtype="bfloat16", **args)
    assert not np.array_equal(fp32["ppl"], bf16["ppl"])  # scored apart, not read from the fp32 entry
    np.testing.assert_allclose(fp32["delta_loss"], bf16["delta_loss"], atol=0.05)
    assert next(model.parameters()).dtype == torch.float32  # the weights were never cast
    with pytest.raises(ValueError, match="dtype"):
        pruning_table(model, ev, dtype="float16", **args)


def test_bfloat16_scoring_is_refused_without_native_bf16(model, windows, monkeypatch, tmp_path):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": False)  # an AVX2 CPU
    ev, _ = windows
    for score in (lambda: pruning_table(model, ev, strategies=["last_n"], k_max=1, batch_size=2, progress=False,
                                        dtype="bfloat16"),
                  lambda: evaluate_loss(model, ev, dtype="bfloat16"),
                  lambda: evaluate_removals(model, ev, [(1,)], progress=False, dtype="bfloat16")):
        with pytest.raises(ValueError, match="scoring dtype 'bfloat16'.*100x slower than float32") as err:
            score()
        assert "\n" not in str(err.value)
    assert not list(tmp_path.rglob("*.jsonl"))  # refused before any forward or journal


# --- CLI and chapter -------------------------------------------------------------------------------

def test_cli_writes_the_table(tiny_model_dir, tmp_path):
    from zones.cli import main

    out = tmp_path / "out"
    assert main(["prune", "--model", str(tiny_model_dir), "--device", "cpu", "--strategies", "last_n,random",
                 "--k-max", "2", "--seeds", "2", "--seq-len", "32", "--eval-tokens", "62",
                 "--calibration-tokens", "31", "--out", str(out)]) == 0
    table = pd.read_csv(out / "pruning.csv")
    assert list(table.columns) == sweep_module.COLUMNS and len(table) == 2 + 2 * 2
    assert main(["prune", "--model", str(tiny_model_dir), "--strategies", "last_n", "--k-max", "5",
                 "--out", str(out)]) == 1


def test_notebook_runs_on_a_tiny_model(tiny_model_dir, tmp_path):
    from zones.book import run_notebook

    out = tmp_path / "results"
    run_notebook(ROOT / "notebooks" / "pruning.md", tmp_path / "pruning.ipynb",
                 parameters=dict(models=[str(tiny_model_dir)], seq_len=32, eval_tokens=124,
                                 calibration_tokens=62, k_max=3, seeds=3, batch_size=2,
                                 out_dir=str(out)), cwd=tmp_path)
    table = pd.read_csv(out / "pruning.csv")
    assert set(table["k"]) == {1, 2, 3}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_blocks"] == 6 and summary["k_max"] == 3 and summary["n_windows"] == 4
    # Every (strategy, k) has its interval, the sets and ratios are written for the scorecard.
    by_strategy = pd.read_csv(out / "by_strategy.csv")
    assert (by_strategy["delta_loss_low"] <= by_strategy["delta_loss"]).all()
    assert (by_strategy["delta_loss"] <= by_strategy["delta_loss_high"]).all()
    crossover = pd.read_csv(out / "crossover.csv")
    assert list(dict.fromkeys(crossover["reference"])) == ["last_n", "last_n_keep_last", "random", "random_protected"]
    best = pd.read_csv(out / "best.csv")
    assert all(row.best in row.best_set.split(",") for row in best.itertuples())
    assert {"worst_best_ratio_low", "worst_best_ratio_high"} <= set(best.columns)
    assert "scorecard's rule" in summary["claim_text"] and "k = 1: {" in summary["best_text"]
    share = pd.read_csv(out / "share.csv")   # k_max = 3 < 4: the share is read at the largest k
    assert share["k"].tolist() == [3, 3] and share["baseline"].tolist() == ["protect_spread", "protect_spread_random"]
    assert set(share["reference"]) == {"last_n_keep_last"} and summary["share_text"].startswith("At k = 3")
    assert (share["status"] == "share").all() or share["note"].str.contains("k = 3").any()
    text = (tmp_path / "pruning.ipynb").read_text()
    assert "Traceback" not in text and text.count("vegaEmbed") >= 5  # bars, the crossovers (one stacked figure), 2 line charts, removed blocks
    import re

    import nbformat

    executed = nbformat.read(tmp_path / "pruning.ipynb", as_version=4)
    glued = {o["metadata"]["scrapbook"]["name"] for c in executed.cells if c.cell_type == "code"
             for o in c.get("outputs", []) if "scrapbook" in o.get("metadata", {})}
    cited = set(re.findall(r"\{glue:text\}`([a-z_0-9]+)", (ROOT / "notebooks" / "pruning.md").read_text()))
    assert cited <= glued, f"the page cites numbers the chapter does not glue: {cited - glued}"


@pytest.mark.slow
def test_default_model_table_matches_direct_evaluation(user_cache):
    from zones.core.models import load_model

    loaded = load_model("smollm2-135m", device="cpu")
    ev = corpus_windows("stdlib", loaded.tokenizer, 64, "eval", 63)
    table = pruning_table(loaded.model, ev, strategies=["last_n"], k_max=2, progress=False, cache=False)
    base = evaluate_loss(loaded.model, ev).ppl
    with skip_blocks(loaded.model, [29, 28]):
        ppl = evaluate_loss(loaded.model, ev).ppl
    assert table.loc[table.k == 2, "delta_ppl"].item() == pytest.approx(ppl - base, rel=1e-4)


def test_with_two_seeds_one_statistic_decides_and_the_words_follow_it():
    """Two seeds of random: one cheap, one close to collapse. Their median Δloss is below
    zone-aware's, while the median of their ΔPPL (the mean of a small and a huge one) is above
    it: the ΔPPL shown is the one at the median Δloss, so ratio, winner and words agree."""
    from zones.report import pruning as chapter

    rng = np.random.default_rng(0)
    n_windows, tokens, base = 12, 100, 3.0
    noise = rng.normal(0, 0.01, n_windows)

    def windows(rise):
        return [(w, tokens * (base + rise + noise[w])) for w in range(n_windows)]

    sets = {"": 0.0, "1": 1.4, "2": 0.05, "3": 2.5}      # zone_aware removes 1; random's seeds remove 2 and 3
    window_losses = pd.DataFrame([dict(removed=r, window=w, nll=nll, n_tokens=tokens)
                                  for r, rise in sets.items() for w, nll in windows(rise)])
    base_ppl = np.exp(base + noise.mean())
    rows = []
    for strategy, seed, removed in (("zone_aware", 0, "1"), ("random", 0, "2"), ("random", 1, "3")):
        loss = window_losses.loc[window_losses["removed"] == removed, "nll"].sum() / (tokens * n_windows)
        ppl = np.exp(loss)
        rows.append(dict(model="m", strategy=strategy, k=1, seed=seed, removed=removed, ppl=ppl, base_ppl=base_ppl,
                         delta_ppl=ppl - base_ppl, delta_loss=np.log(ppl / base_ppl), n_tokens=tokens * n_windows))
    table = pd.DataFrame(rows)
    summary = summarize_pruning(table, window_losses, n_resamples=300).set_index("strategy")
    assert summary.loc["random", "delta_loss"] < summary.loc["zone_aware", "delta_loss"]
    assert summary.loc["random", "delta_ppl"] < summary.loc["zone_aware", "delta_ppl"]      # the same order
    assert table.loc[table["strategy"] == "random", "delta_ppl"].median() > summary.loc["zone_aware", "delta_ppl"]
    comparison = compare.reference_comparisons(table, window_losses, "zone_aware", ["random"])
    row = comparison.iloc[0]
    assert row["winner"] == "random" and row["ratio"] < 1 and row["ratio_high"] < 1
    words = chapter.behind_text(comparison)
    assert "random at k = 1" in words and "×)" in words
    said = chapter.seeds_text(summarize_pruning(table, window_losses, n_resamples=300), 1)
    # two seeds: a median, but no "interquartile range" (its ends would not even be the two seeds)
    assert "median Δloss" in said and "interquartile" not in said and "2 seeds cannot estimate one" in said


# --- protection and spreading without α ----------------------------------------------------------

def test_protect_spread_keeps_the_ends_and_spreads_evenly():
    """On a 12-block model: the first and last blocks are never removed, and the gaps between
    consecutive removals differ by at most one block (even spreading over the 10 interior blocks)."""
    ctx = PruningContext(tiny_model("llama", n_layers=12), progress=False)
    k_max = STRATEGIES["protect_spread"].max_k(12)
    assert k_max == 10
    plans = STRATEGIES["protect_spread"].plan(ctx, k_max)
    for k, plan in enumerate(plans, start=1):
        assert len(plan) == k and 0 not in plan and 11 not in plan
        gaps = np.diff(sorted(plan))
        assert k == 1 or gaps.max() - gaps.min() <= 1, (k, plan)
    assert plans[3] == [2, 4, 7, 9] and plans[0] == [6] and plans[-1] == list(range(1, 11))
    assert STRATEGIES["protect_spread"].plan(ctx, 4, seed=5) == plans[:4]       # deterministic: no seed
    random = STRATEGIES["protect_spread_random"]
    assert random.seeded and random.plan(ctx, 6, seed=2) == random.plan(ctx, 6, seed=2)
    assert random.plan(ctx, 6, seed=2) != random.plan(ctx, 6, seed=3)
    for seed in range(5):
        for k, plan in enumerate(random.plan(ctx, k_max, seed), start=1):
            edges = [1 + (i * 10) // k for i in range(k + 1)]   # one block in each of k equal interior segments
            assert [edges[i] <= b < edges[i + 1] for i, b in enumerate(plan)] == [True] * k
    assert {"protect_spread", "protect_spread_random"} <= set(sweep_module.DEFAULT_STRATEGIES)


def share_inputs(zone_gain: float, noise: float = 0.05, n_windows: int = 20, seed: int = 0):
    """A pruning table and its per-window losses: Last-N keeping the last block costs 1 nat a token,
    protect_spread 0.6, zone_aware 1 − ``zone_gain``, each window with its own noise."""
    rng = np.random.default_rng(seed)
    arms = {"last_n_keep_last": ("5,6", 1.0), "zone_aware": ("2,4", 1.0 - zone_gain), "protect_spread": ("3,5", 0.6)}
    table = pd.DataFrame([dict(strategy=s, k=2, seed=0, removed=r) for s, (r, _) in arms.items()])
    base = 2.0 + rng.normal(0, noise, n_windows)
    rows = [dict(removed="", window=w, nll=100 * base[w], n_tokens=100) for w in range(n_windows)]
    for removed, cost in arms.values():
        rows += [dict(removed=removed, window=w, nll=100 * (base[w] + cost + rng.normal(0, noise)), n_tokens=100)
                 for w in range(n_windows)]
    return table, pd.DataFrame(rows)


def test_gain_share_is_a_ratio_only_where_zone_aware_gains():
    table, windows = share_inputs(zone_gain=0.8)
    share = compare.gain_share(table, windows, ks=(2, 4), n_resamples=400).iloc[0]
    assert share["status"] == "share" and share["note"] == ""
    assert share["share"] == pytest.approx(0.4 / 0.8, abs=0.05)
    assert share["share_low"] < share["share"] < share["share_high"] and 0 < share["share_low"] and share["share_high"] < 1
    assert share["gain"] == pytest.approx(0.8, abs=0.05) and share["gain_low"] > 0
    assert len(compare.gain_share(table, windows, ks=(2, 4), n_resamples=50)) == 1   # k = 4 absent: left out
    # zone_aware no better than Last-N: the denominator's interval reaches 0, so no share is a number
    table, windows = share_inputs(zone_gain=0.0)
    borderline = compare.gain_share(table, windows, ks=(2,), n_resamples=400).iloc[0]
    assert borderline["gain_low"] <= 0 <= borderline["gain_high"]
    assert borderline["status"] == "no gain" and np.isnan(borderline["share"]) and np.isnan(borderline["share_low"])
    assert "not separable from zero" in borderline["note"] and "k = 2" in borderline["note"]
    # one window: no interval, so no share either
    table, windows = share_inputs(zone_gain=0.8, n_windows=1)
    single = compare.gain_share(table, windows, ks=(2,), n_resamples=50).iloc[0]
    assert single["status"] == "undefined" and np.isnan(single["share"]) and "no interval" in single["note"]
    with pytest.raises(ValueError, match="protect_spread_random"):
        compare.gain_share(table, windows, baselines=("protect_spread_random",))
