"""Single-block ablation: prefix reuse equals the naive sweep, caching, resuming, bad input, CLI."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model

from zones.core import hardware
from zones.core.adapters import get_adapter
from zones.core.data import CorpusError, Windows, corpus_windows, make_windows
from zones.measure import ablation, scoring
from zones.measure.ablation import COLUMNS, PART_COLUMNS, ablation_table
from zones.measure.blocks import skip_blocks, zero_sublayer
from zones.measure.bootstrap import NonFiniteLossError
from zones.measure.scoring import evaluate_loss

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def random_windows(n_windows=7, seq_len=16, vocab=256, seed=0) -> Windows:
    ids = np.random.default_rng(seed).integers(0, vocab, size=40 * seq_len)
    return make_windows(ids, seq_len, "eval", max_tokens=n_windows * (seq_len - 1))


def count_block_calls(model) -> list:
    calls = []
    for i, block in enumerate(get_adapter(model).blocks()):
        block.register_forward_pre_hook(lambda *_, i=i: calls.append(i))
    return calls


LOSS_COLUMNS = ["loss", "base_loss", "delta_loss"] + PART_COLUMNS


def test_prefix_sweep_equals_naive_sweep(family):
    model = tiny_model(family, n_layers=4)
    windows = random_windows()  # 7 windows in batches of 3: the last batch is short
    prefix = ablation_table(model, windows, parts=True, batch_size=3, cache=False, progress=False)
    naive = ablation_table(model, windows, parts=True, batch_size=3, ablation_method="naive", cache=False,
                           progress=False)
    assert list(prefix.columns) == COLUMNS + PART_COLUMNS
    assert (prefix[LOSS_COLUMNS] - naive[LOSS_COLUMNS]).abs().max().max() < 1e-4
    # Removing blocks did change the loss, so the agreement is not between two copies of the base.
    assert prefix["delta_loss"].abs().max() > 1e-3
    assert prefix[["delta_loss_attn", "delta_loss_mlp"]].abs().max().max() > 1e-3


def test_losses_equal_full_forwards_under_the_context_managers(family):
    model = tiny_model(family, n_layers=4, seed=1)
    windows = random_windows(n_windows=4)
    table = ablation_table(model, windows, parts=True, batch_size=2, cache=False, progress=False)
    assert table["layer"].tolist() == [0, 1, 2, 3]
    assert (table["n_tokens"] == windows.n_scored_tokens).all()
    assert table["base_loss"].nunique() == 1
    assert table["base_loss"][0] == pytest.approx(evaluate_loss(model, windows).loss, abs=1e-5)
    with skip_blocks(model, [2]):
        assert table["loss"][2] == pytest.approx(evaluate_loss(model, windows).loss, abs=1e-5)
    with zero_sublayer(model, 1, "attn"):
        assert table["loss_attn"][1] == pytest.approx(evaluate_loss(model, windows).loss, abs=1e-5)
    with zero_sublayer(model, 3, "mlp"):
        assert table["loss_mlp"][3] == pytest.approx(evaluate_loss(model, windows).loss, abs=1e-5)
    np.testing.assert_allclose(table["delta_loss"], table["loss"] - table["base_loss"])


def test_prefix_runs_only_the_blocks_after_the_removed_one():
    n = 5
    windows = random_windows(n_windows=4)  # two batches
    # Per batch: the naive sweep runs the full model and then n - 1 blocks per ablation; the
    # prefix sweep traces n blocks once and then only the blocks after the removed one.
    for method, per_batch in (("prefix", n + n * (n - 1) // 2), ("naive", n + n * (n - 1))):
        model = tiny_model("llama", n_layers=n)
        calls = count_block_calls(model)
        ablation_table(model, windows, batch_size=2, ablation_method=method, cache=False, progress=False)
        assert len(calls) == 2 * per_batch, method


def test_some_layers_only():
    model = tiny_model("gpt2", n_layers=4)
    windows = random_windows(n_windows=3)
    full = ablation_table(model, windows, cache=False, progress=False)
    some = ablation_table(model, windows, layers=[3, 1], cache=False, progress=False)
    assert some["layer"].tolist() == [1, 3]
    pd.testing.assert_frame_equal(some, full[full["layer"].isin([1, 3])].reset_index(drop=True))


def test_cached_sweep_is_not_recomputed(own_cache):
    model = tiny_model("llama", n_layers=3)
    windows = random_windows(n_windows=4)
    first = ablation_table(model, windows, batch_size=2, progress=False)
    calls = count_block_calls(model)
    again = ablation_table(model, windows, batch_size=2, progress=False)
    assert calls == []
    pd.testing.assert_frame_equal(first, again)
    # Other windows, other parameters or another model are other entries.
    ablation_table(model, random_windows(n_windows=4, seed=1), batch_size=2, progress=False)
    assert calls
    calls.clear()
    ablation_table(model, windows, batch_size=2, parts=True, progress=False)
    assert calls
    other = tiny_model("llama", n_layers=3, seed=5)
    changed = ablation_table(other, windows, batch_size=2, progress=False)
    assert not np.allclose(changed["loss"], first["loss"])


def journal_rows(cache) -> int:
    return sum(len(p.read_text().splitlines()) for p in cache.glob("window-losses/*.jsonl"))


def test_interrupted_sweep_resumes_and_is_never_read_partial(own_cache, monkeypatch):
    model = tiny_model("gpt_neox", n_layers=4)
    windows = random_windows(n_windows=6)
    expected = ablation_table(model, windows, batch_size=2, cache=False, progress=False)
    n_tasks = 3 * 5  # 3 batches x (the full model and 4 blocks)
    monkeypatch.setattr(scoring, "SETS_PER_PASS", 1)  # every removal is stored as soon as it is checked

    real_values = scoring._ChunkScorer.values
    done = []

    def values_then_crash(self, removal):
        if len(done) == 6:
            raise KeyboardInterrupt
        done.append(removal)
        return real_values(self, removal)

    monkeypatch.setattr(scoring._ChunkScorer, "values", values_then_crash)
    with pytest.raises(KeyboardInterrupt):
        ablation_table(model, windows, batch_size=2, progress=False)
    # Only complete, checked rows were stored: the full model and 4 blocks of batch 0, then the
    # full model of batch 1 (computed first, to check it; stored with its pass).
    assert journal_rows(own_cache) == 5

    resumed = []

    def counting_values(self, removal):
        resumed.append(removal)
        return real_values(self, removal)

    monkeypatch.setattr(scoring._ChunkScorer, "values", counting_values)
    table = ablation_table(model, windows, batch_size=2, progress=False)
    assert len(resumed) == n_tasks - 5
    pd.testing.assert_frame_equal(table, expected, check_exact=False, atol=1e-9)
    assert journal_rows(own_cache) == n_tasks
    key = json.loads(next(own_cache.glob("window-losses/*.json")).read_text())
    assert key["model"] and key["dtype"] == "float32"


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(layers=[4]), IndexError, "out of range"),
    (dict(layers=[-1]), IndexError, "out of range"),
    (dict(layers=[]), ValueError, "no blocks"),
    (dict(ablation_method="fast"), ValueError, "ablation_method"),
    (dict(batch_size=0), ValueError, "batch_size"),
    (dict(batch_size=2.5), ValueError, "batch_size"),
])
def test_bad_arguments_fail_before_any_forward(kwargs, error, match):
    model = tiny_model("llama", n_layers=4)
    calls = count_block_calls(model)
    with pytest.raises(error, match=match):
        ablation_table(model, random_windows(n_windows=2), cache=False, progress=False, **kwargs)
    assert calls == []


def test_empty_windows_fail_before_any_forward():
    model = tiny_model("llama", n_layers=2)
    calls = count_block_calls(model)
    empty = Windows(torch.zeros(0, 16, dtype=torch.long), "x", "eval", "none")
    with pytest.raises(ValueError, match="empty"):
        ablation_table(model, empty, cache=False, progress=False)
    with pytest.raises(TypeError, match="Windows"):
        ablation_table(model, torch.zeros(2, 16, dtype=torch.long), cache=False, progress=False)
    assert calls == []


def test_empty_corpus_and_too_large_budget_are_clear_errors(tmp_path, tiny_tokenizer):
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n")
    with pytest.raises(CorpusError, match="empty"):
        corpus_windows(str(empty), tiny_tokenizer, seq_len=16)
    small = tmp_path / "small.txt"
    small.write_text("A few words of text, repeated. " * 40)
    with pytest.raises(CorpusError, match="token budget"):
        corpus_windows(str(small), tiny_tokenizer, seq_len=16, max_tokens=1_000_000)


def test_cli_writes_the_table(tmp_path, tiny_model_dir, capsys):
    from zones.cli import main

    text = tmp_path / "text.txt"
    text.write_text("Every block of the model is removed in turn, and the loss is measured. " * 60)
    out = tmp_path / "out"
    args = ["ablate", "--model", str(tiny_model_dir), "--corpus", str(text), "--seq-len", "16",
            "--eval-tokens", "60", "--out", str(out), "--device", "cpu"]
    assert main(args) == 0
    table = pd.read_csv(out / "ablation.csv")
    assert list(table.columns) == COLUMNS
    assert table["layer"].tolist() == list(range(6)) and (table["n_tokens"] == 60).all()
    assert main(args + ["--parts", "--out", str(tmp_path / "parts")]) == 0
    assert list(pd.read_csv(tmp_path / "parts" / "ablation.csv").columns) == COLUMNS + PART_COLUMNS

    capsys.readouterr()
    assert main(args[:-4] + ["--eval-tokens", "10000000", "--out", str(tmp_path / "x")]) == 1
    assert "token budget" in capsys.readouterr().err
    assert not (tmp_path / "x" / "ablation.csv").exists()


@pytest.mark.slow
def test_default_model_prefix_equals_naive(user_cache):
    from zones.core.models import load_model

    loaded = load_model("smollm2-135m", device="cpu")
    windows = corpus_windows("stdlib", loaded.tokenizer, seq_len=32, max_tokens=2 * 31)
    kwargs = dict(layers=[0, 14, 29], cache=False, progress=False)
    prefix = ablation_table(loaded.model, windows, **kwargs)
    naive = ablation_table(loaded.model, windows, ablation_method="naive", **kwargs)
    assert (prefix[LOSS_COLUMNS[:3]] - naive[LOSS_COLUMNS[:3]]).abs().max().max() < 1e-4
    assert prefix["delta_loss"][0] > prefix["delta_loss"][1]  # the first block matters most


# --- per-window losses, intervals, non-finite losses, precision ---------------------------------

def test_window_losses_sum_to_the_table_and_intervals_cover_it():
    model = tiny_model("llama", n_layers=4, seed=2)
    windows = random_windows(n_windows=6)
    long = ablation.ablation_window_losses(model, windows, batch_size=4, cache=False, progress=False)
    assert list(long.columns) == ablation.WINDOW_COLUMNS and len(long) == 4 * 6
    assert sorted(long["window"].unique()) == list(range(6))
    table = ablation_table(model, windows, batch_size=4, cache=False, progress=False)
    sums = long.groupby("layer")[["nll", "base_nll", "n_tokens"]].sum()
    np.testing.assert_allclose(table["loss"], sums["nll"] / sums["n_tokens"])
    np.testing.assert_allclose(table["base_loss"], sums["base_nll"] / sums["n_tokens"])
    assert (table["delta_loss_low"] <= table["delta_loss"]).all() and (table["delta_loss"] <= table["delta_loss_high"]).all()
    assert (table["delta_loss_high"] > table["delta_loss_low"]).all()
    # One window's NLL is that window evaluated alone.
    one = Windows(windows.input_ids[4:5], "x", "eval", "w4")
    with skip_blocks(model, [1]):
        expected = evaluate_loss(model, one).loss * (windows.seq_len - 1)
    assert long.query("layer == 1 and window == 4")["nll"].item() == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(ablation_method="naive"), dict(parts=True)])
def test_a_nan_weight_is_an_error_naming_the_block_and_window(kwargs, own_cache):
    model = tiny_model("llama", n_layers=4)
    with torch.no_grad():
        get_adapter(model).blocks()[2].mlp.up_proj.weight[3, 1] = float("nan")
    windows = random_windows(n_windows=4)
    with pytest.raises(NonFiniteLossError, match=r"full model is not finite \(nan\) on window 0 of 4"):
        ablation_table(model, windows, batch_size=2, progress=False, **kwargs)
    assert journal_rows(own_cache) == 0  # nothing cached as a result


def test_bfloat16_scoring_keeps_the_weights_and_is_cached_apart(own_cache, monkeypatch):
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": True)  # the test must run on any CPU
    model = tiny_model("llama", n_layers=4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    windows = random_windows(n_windows=4)
    fp32 = ablation_table(model, windows, batch_size=2, progress=False)
    bf16 = ablation_table(model, windows, batch_size=2, progress=False, dtype="bfloat16")
    assert not np.array_equal(fp32["loss"], bf16["loss"])
    np.testing.assert_allclose(fp32["delta_loss"], bf16["delta_loss"], atol=0.1)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(list(own_cache.glob("window-losses/*.jsonl"))) == 2  # one store per precision
    with pytest.raises(ValueError, match="dtype"):
        ablation_table(model, windows, cache=False, progress=False, dtype="half")


def test_windows_beyond_the_model_fail_before_any_forward():
    model = tiny_model("gpt2", n_layers=2)  # 256 positions, 256 ids
    calls = count_block_calls(model)
    too_long = Windows(torch.zeros(1, 300, dtype=torch.long), "x", "eval", "long")
    big_ids = Windows(torch.full((1, 16), 999, dtype=torch.long), "x", "eval", "ids")
    for windows, match in ((too_long, "positions"), (big_ids, "vocabulary")):
        with pytest.raises(ValueError, match=match):
            ablation_table(model, windows, cache=False, progress=False)
        with pytest.raises(ValueError, match=match):
            evaluate_loss(model, windows)
    assert calls == []
