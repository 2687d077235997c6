"""KL from the full model and top-1 agreement, against independent references."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_model

from zones.core.adapters import get_adapter
from zones.core.data import Windows
from zones.measure.agreement import agreement_difference, agreement_window_losses, head_metrics, summarize_agreement
from zones.measure.blocks import skip_blocks

pytestmark = pytest.mark.usefixtures("one_thread")


def windows(n=5, seq_len=12, seed=2):
    ids = torch.randint(0, 256, (n, seq_len), generator=torch.Generator().manual_seed(seed))
    return Windows(ids, seq_len, split="eval", fingerprint=f"agree-{n}-{seq_len}-{seed}")


def test_identical_models_have_zero_kl_and_full_agreement():
    model = tiny_model("llama")
    ids = windows().input_ids
    with torch.inference_mode():
        hidden = model.base_model(input_ids=ids, output_hidden_states=True).hidden_states[-1]
    # hidden_states[-1] is after the final norm in Llama: use the pre-norm stream from a trace instead
    from zones.measure.blocks import BlockTrace

    trace = BlockTrace(model, ids)
    m = head_metrics(get_adapter(model), trace.final_hidden, trace.final_hidden, ids)
    assert np.allclose(m["kl"], 0.0, atol=1e-10)
    assert np.array_equal(m["top1"], np.full(ids.shape[0], ids.shape[1] - 1.0))
    assert hidden.shape == trace.final_hidden.shape


def test_kl_and_top1_match_a_plain_reference():
    model = tiny_model("gpt_neox")
    w = windows()
    long = agreement_window_losses(model, w, [[1]], cache=False, progress=False)
    with torch.inference_mode():
        p = torch.log_softmax(model(w.input_ids).logits[:, :-1].double(), -1)
        with skip_blocks(model, [1]):
            q = torch.log_softmax(model(w.input_ids).logits[:, :-1].double(), -1)
    kl = (p.exp() * (p - q)).sum(-1).sum(-1).numpy()
    top1 = (p.argmax(-1) == q.argmax(-1)).double().sum(-1).numpy()
    nll = -q.gather(-1, w.input_ids[:, 1:, None])[..., 0].sum(-1).numpy()
    # the library scores in float32 (the reference in float64): forward passes differ by ~1e-6
    # relative between transformers versions, so allow float32 rounding, far below any effect size
    np.testing.assert_allclose(long["kl"], kl, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(long["top1"], top1)
    np.testing.assert_allclose(long["nll"], nll, rtol=1e-5)
    assert (long["kl"] > 0).all()


def test_summary_intervals_and_difference():
    model = tiny_model("llama")
    w = windows()
    long = agreement_window_losses(model, w, ["", "1", "2:attn"], cache=False, progress=False)
    summary = summarize_agreement(long, n_resamples=300).set_index("removed")
    assert summary.loc["", "kl"] == pytest.approx(0, abs=1e-12) and summary.loc["", "top1"] == 1.0
    assert summary.loc["", "delta_loss"] == pytest.approx(0, abs=1e-12)
    row = summary.loc["1"]
    assert row["kl_low"] <= row["kl"] <= row["kl_high"] and row["top1_low"] <= row["top1"] <= row["top1_high"]
    tokens = w.n_windows * (w.seq_len - 1)
    assert row["kl"] == pytest.approx(long[long["removed"] == "1"]["kl"].sum() / tokens)
    diff = agreement_difference(long, "1", "2:attn", n_resamples=300).set_index("metric")
    assert diff.loc["kl", "difference"] == pytest.approx(row["kl"] - summary.loc["2:attn", "kl"])
    expected = row["delta_loss"] - summary.loc["2:attn", "delta_loss"]
    assert diff.loc["delta_loss", "difference"] == pytest.approx(expected)


def test_cached_table_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    model = tiny_model("llama")
    w = windows()
    first = agreement_window_losses(model, w, ["1"], progress=False)
    second = agreement_window_losses(model, w, ["1"], progress=False)
    np.testing.assert_array_equal(first["kl"], second["kl"])
    assert any(tmp_path.rglob("window-losses/*.jsonl"))


def test_kept_and_recomputed_base_agree(monkeypatch):
    from zones.measure import scoring

    model = tiny_model("llama")
    w = windows()
    kept = agreement_window_losses(model, w, ["1", "2:mlp"], cache=False, progress=False)
    monkeypatch.setattr(scoring, "BASE_LOGP_BYTES", 0)
    monkeypatch.setattr(scoring, "HEAD_CHUNK", 7)  # chunks that do not divide the tokens
    recomputed = agreement_window_losses(model, w, ["1", "2:mlp"], cache=False, progress=False)
    for column in ("nll", "kl", "top1"):
        np.testing.assert_allclose(kept[column], recomputed[column], rtol=1e-6, atol=1e-9)


def block_one_removed():
    """A tiny Llama, its windows, the full model's trace, its adapter and the last hidden state
    with block 1 removed."""
    from zones.measure.blocks import BlockTrace

    model = tiny_model("llama")
    ids = windows().input_ids
    trace = BlockTrace(model, ids)
    with skip_blocks(model, [1]):
        reduced = BlockTrace(model, ids).final_hidden
    return model, ids, trace, get_adapter(model), reduced


def test_the_row_blocks_change_no_number(monkeypatch):
    """The vocabulary-wide passes visit the logits ROW_BLOCK_BYTES at a time on a CPU: NLL, KL and
    top-1 are the same to the bit as over whole chunks, with blocks that do not divide a chunk."""
    from zones.measure import scoring

    model, ids, trace, adapter, reduced = block_one_removed()
    row = model.config.vocab_size * 4  # one row of float32 logits

    def scores():
        nll = scoring.head_nll_windows(adapter, reduced, ids)
        base = scoring.base_log_probs(adapter, trace.final_hidden)
        return [nll, *head_metrics(adapter, reduced, trace.final_hidden, ids, base).values(),
                *head_metrics(adapter, reduced, trace.final_hidden, ids).values()]

    monkeypatch.setattr(scoring, "HEAD_CHUNK", 23)
    monkeypatch.setattr(scoring, "ROW_BLOCK_BYTES", 10 ** 12)
    whole = scores()
    monkeypatch.setattr(scoring, "ROW_BLOCK_BYTES", 4 * row + 3)  # 23-row chunks: five blocks of 4 and one of 3
    for a, b in zip(whole, scores()):
        np.testing.assert_array_equal(a, b)
    logits = torch.zeros(10, model.config.vocab_size)
    assert scoring.row_blocks(logits) == [slice(0, 4), slice(4, 8), slice(8, 10)]
    assert scoring.row_blocks(logits.to("meta")) == [slice(0, 10)]  # a GPU: one block


def test_a_small_vocabulary_reads_a_chunk_in_one_block():
    """The row blocks are sized in bytes: SmolLM2's 49,152-wide rows go 16 at a time, and a chunk
    of a depth-series model's 1,024-wide logits (2 MB) is one block, not 32 calls of 16 rows each
    (a tiny model's scoring paid ~49,000 log-sum-exp calls in the depth-series chapter)."""
    from zones.measure import scoring

    assert scoring.row_blocks(torch.zeros(512, 49_152))[:2] == [slice(0, 16), slice(16, 32)]
    assert scoring.row_blocks(torch.zeros(512, 1_024)) == [slice(0, 512)]


def test_the_head_in_vocabulary_blocks_gives_the_loss_kl_and_top1_of_the_whole_head(monkeypatch):
    """On a CPU the LM head's product runs VOCAB_BLOCK columns at a time, its log-sum-exp combined
    over the blocks: the NLL is the plain cross-entropy of the whole logits (to float32 rounding),
    the same to the bit in the loss alone and beside KL and top-1, and KL and top-1 are those of
    the whole head; the loss alone never holds a chunk's logits."""
    from zones.measure import scoring

    model, ids, trace, adapter, reduced = block_one_removed()
    with torch.inference_mode():
        logits = adapter.lm_head()(adapter.final_norm()(reduced[:, :-1])).double()
        reference = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1),
                                                      reduction="none").reshape(len(ids), -1).sum(-1).numpy()
    monkeypatch.setattr(scoring, "HEAD_CHUNK", 23)
    whole = head_metrics(adapter, reduced, trace.final_hidden, ids)
    monkeypatch.setattr(scoring, "VOCAB_BLOCK", 37)  # 256 logits: six blocks of 37 and one of 34
    assert len(scoring.vocab_blocks(adapter.lm_head(), torch.device("cpu"))) == 7
    assert scoring.vocab_blocks(adapter.lm_head(), torch.device("meta")) == [slice(None)]  # a GPU: one product
    nll = scoring.head_nll_windows(adapter, reduced, ids)
    blocked = head_metrics(adapter, reduced, trace.final_hidden, ids)
    np.testing.assert_allclose(nll, reference, rtol=1e-6)
    np.testing.assert_array_equal(nll, blocked["nll"])
    np.testing.assert_allclose(blocked["kl"], whole["kl"], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(blocked["top1"], whole["top1"])
    hidden = scoring.head_inputs(adapter, reduced)
    lse, picked, kept = scoring.head_pass(adapter, hidden, 0, ids[:, 1:].reshape(-1)[:23])
    assert kept is None and lse.shape == picked.shape == (23,)
