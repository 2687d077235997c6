"""Round-tripping a model's block matrices through Q4_1 as a GGUF file stores them, and what the
round trip changes in a trained run's α, ΔLoss and ρ(α, ΔLoss)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import FAMILIES, tiny_model

from zones.core.models import model_fingerprint
from zones.core.quantize import quantization_plan, quantize_model, round_trip, round_trip_bound

pytestmark = pytest.mark.usefixtures("one_thread")


def _rows(model, name: str) -> np.ndarray:
    """A block weight as (out, in) rows, the quantised axis last (GPT-2's Conv1D is stored (in, out))."""
    weight = model.get_parameter(name).detach().numpy()
    return weight.T if model.config.model_type == "gpt2" else weight


@pytest.mark.parametrize("family", FAMILIES)
def test_round_trip_moves_each_weight_by_at_most_half_a_q4_1_step(family):
    model = tiny_model(family)
    quantized = quantize_model(model)
    plan = quantization_plan(model)
    assert plan["quantized"].all() and len(plan) == 4 * (7 if family == "llama" else 4)
    worst = 0.0
    for name in plan["name"]:
        before, after = _rows(model, name), _rows(quantized, name)
        change = np.abs(after.astype(np.float64) - before)
        assert (change <= round_trip_bound(before)).all(), name
        blocks = before.reshape(before.shape[0], -1, 32)
        step = (blocks.max(-1) - blocks.min(-1)) / 15  # (max − min) / 15 per block of 32
        worst = max(worst, float((change.reshape(blocks.shape).max(-1) / step).max()))
        assert (change > 0).mean() > 0.9  # most weights move: it is not a no-op
    assert 0.45 < worst < 0.51  # half a step, give or take float16's rounding of the step


@pytest.mark.parametrize("family", FAMILIES)
def test_norms_embeddings_biases_and_the_original_are_left_as_they_are(family):
    model = tiny_model(family)
    original = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = quantize_model(model)
    chosen = set(quantization_plan(model)["name"])
    for name, tensor in quantized.state_dict().items():
        if name in chosen:
            assert not torch.equal(tensor, original[name]), name
        else:  # embeddings, the head, norms, biases: bit for bit
            assert torch.equal(tensor, original[name]), name
    assert all(torch.equal(v, original[k]) for k, v in model.state_dict().items())  # a copy was changed
    assert not any(n.startswith(("model.embed", "gpt_neox.embed", "transformer.wte")) for n in chosen)


def test_the_glossary_offers_the_types_the_quantiser_takes():
    from zones.core.glossary import QUANT_TYPE_NAMES, TERMS
    from zones.core.quantize import QUANT_TYPES, block_size

    assert QUANT_TYPE_NAMES == QUANT_TYPES and TERMS["quant_type"].choices == QUANT_TYPES
    assert {block_size(t) for t in QUANT_TYPES} == {32}


def test_round_trip_is_deterministic_and_a_fixed_point():
    model = tiny_model("llama")
    first, second = quantize_model(model), quantize_model(model)
    assert model_fingerprint(first) == model_fingerprint(second) != model_fingerprint(model)
    # a Q4_1 block read back is a Q4_1 block: round-tripping again changes nothing
    assert model_fingerprint(quantize_model(first)) == model_fingerprint(first)


def test_rows_that_do_not_split_into_blocks_of_32_are_left_and_the_plan_says_so():
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).eval()
    plan = quantization_plan(model).set_index("name")
    left = plan[~plan["quantized"]]
    assert set(left["row_length"]) == {48} and left["reason"].str.contains("do not split").all()
    assert plan.loc["model.layers.0.mlp.down_proj.weight", "quantized"]  # rows of 64: two blocks
    quantized = quantize_model(model)
    for name in left.index:
        assert torch.equal(quantized.get_parameter(name), model.get_parameter(name))
    with pytest.raises(ValueError, match="do not split into Q4_1's blocks of 32"):
        round_trip(np.zeros((4, 48), dtype=np.float32))


def test_the_default_models_q4_1_blocks_are_a_fixed_point_of_the_round_trip():
    """The file's own Q4_1 weights, dequantised, come back unchanged: same quantiser, same blocks,
    same axis (blocks across the output features would move them)."""
    gguf = pytest.importorskip("gguf")
    from transformers import AutoModelForCausalLM, LlamaConfig

    from zones.core.models import builtin_gguf_path

    try:
        path = builtin_gguf_path("smollm2-135m")
    except Exception as err:  # noqa: BLE001 - the package that carries the file is not installed
        pytest.skip(f"the default model's GGUF file is not installed ({err})")
    reader = gguf.GGUFReader(path)
    tensors = {t.name: t for t in reader.tensors if t.name.startswith("blk.0.")}
    config = LlamaConfig(vocab_size=64, hidden_size=576, intermediate_size=1536, num_hidden_layers=1,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=64)
    model = AutoModelForCausalLM.from_config(config).eval()
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    with torch.no_grad():
        for short, module in names.items():
            tensor = tensors[f"blk.0.{short}.weight"]
            assert tensor.tensor_type.name == "Q4_1"
            values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)  # (out, in), as transformers keeps it
            model.get_parameter(f"model.layers.0.{module}.weight").copy_(torch.from_numpy(values))
    quantized = quantize_model(model)
    for module in names.values():
        name = f"model.layers.0.{module}.weight"
        assert torch.equal(quantized.get_parameter(name), model.get_parameter(name)), name
    q = model.get_parameter("model.layers.0.self_attn.q_proj.weight").detach().numpy()
    assert np.abs(round_trip(np.ascontiguousarray(q.T)).T - q).max() > 1e-2  # the other axis is not the file's


# --- what the round trip changes in a trained run ---------------------------------------------------

@pytest.fixture(scope="module")
def micro_run(micro_corpus):
    from zones.series import profile_config, train_model

    config = profile_config("cpu", 4, width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, steps=40,
                            lr=3e-3, eval_every=10, snapshot_every=10, checkpoint_every=15, eval_windows=8,
                            corpus=micro_corpus)
    return train_model(config, progress=False)


SMALL = dict(eval_tokens=31 * 8, n_resamples=200, n_permutations=200)


def test_a_trained_run_against_its_q4_1_round_trip(micro_run, monkeypatch):
    from zones.analysis import quantization
    from zones.analysis.importance import spearman
    from zones.measure.ablation import ablation_table
    from zones.series import heldout_windows, series_quantization

    tables = series_quantization([micro_run], **SMALL)
    matrices, blocks, summary = tables["matrices"], tables["blocks"], tables["summary"]
    run = ["model", "depth", "seed"]
    assert list(matrices.columns) == run + quantization.MATRIX_COLUMNS
    assert list(blocks.columns) == run + quantization.BLOCK_COLUMNS
    assert list(summary.columns) == run + quantization.SUMMARY_COLUMNS
    assert len(matrices) == 4 * 6 and blocks["layer"].tolist() == [0, 1, 2, 3] and len(summary) == 1
    row = summary.iloc[0]
    assert row["model"] == "depth 4, seed 0" and row["n_quantized"] == 16 and row["n_tokens"] == 31 * 8
    # α moved a little, and the largest |change| is the one the summary names
    assert matrices["alpha_change"].abs().max() == pytest.approx(abs(row["alpha_max_change"]))
    assert 0 < matrices["weight_change"].min() and matrices["weight_change"].max() < 0.2
    # every interval holds its estimate; the paired differences are the differences of the estimates
    for name in ("delta_loss_before", "delta_loss_after", "delta_loss_change"):
        assert ((blocks[f"{name}_low"] <= blocks[name]) & (blocks[name] <= blocks[f"{name}_high"])).all()
    assert np.allclose(blocks["delta_loss_change"], blocks["delta_loss_after"] - blocks["delta_loss_before"])
    for prefix in ("alpha_rho", "rho_before", "rho_after", "rho_change", "base_loss_change"):
        assert row[f"{prefix}_low"] <= row[prefix] + 1e-12 and row[prefix] <= row[f"{prefix}_high"] + 1e-12
    assert row["rho_change"] == pytest.approx(row["rho_after"] - row["rho_before"])
    assert row["n_blocks_moved"] == int(((blocks["delta_loss_change_low"] > 0)
                                         | (blocks["delta_loss_change_high"] < 0)).sum())
    # ΔLoss before is the one loss routine's on the same windows, and ρ before is spearman's
    loaded = micro_run.load()
    windows = heldout_windows(micro_run, SMALL["eval_tokens"])
    ablation = ablation_table(loaded.model, windows, batch_size=16, progress=False, n_resamples=200)
    assert np.allclose(blocks["delta_loss_before"], ablation["delta_loss"])
    assert np.allclose(blocks["delta_loss_before_low"], ablation["delta_loss_low"])
    expected = spearman(blocks["alpha_before"], blocks["delta_loss_before"], n_resamples=200, n_permutations=200)
    assert row["rho_before"] == pytest.approx(expected.rho) and row["rho_before_low"] == pytest.approx(expected.ci_low)

    # a second call reads the cache: nothing is quantised or scored again
    def refuse(*_, **__):
        raise AssertionError("quantised again")

    monkeypatch.setattr(quantization, "quantize_model", refuse)
    again = series_quantization([micro_run], **SMALL)
    for name, table in tables.items():
        pd.testing.assert_frame_equal(again[name], table)
    with pytest.raises(AssertionError, match="quantised again"):  # another parameter is another entry
        series_quantization([micro_run], **dict(SMALL, seed=1))


# --- the chapter's sentence --------------------------------------------------------------------------

def _summary(*changes, alpha_rho_low=0.95):
    rows = []
    for i, (low, high) in enumerate(changes):
        rows.append(dict(model=f"depth 8, seed {i}", depth=8, seed=i, alpha_max_change=-0.03, alpha_max_layer=2,
                         alpha_max_role="k", alpha_median_abs_change=0.004, alpha_rho=0.98,
                         alpha_rho_low=alpha_rho_low, alpha_rho_high=1.0, n_blocks_moved=1, n_blocks=8,
                         delta_loss_max_change=0.002, rho_change=(low + high) / 2, rho_change_low=low,
                         rho_change_high=high, rho_before_low=0.1, rho_before_high=0.9, rho_after_low=0.1,
                         rho_after_high=0.9))
    return pd.DataFrame(rows)


def test_the_4_bit_sentence_follows_the_intervals_of_the_change_of_rho():
    from zones.report.depth_series import ALPHA_ORDER_KEPT, quantization_text

    inside = quantization_text(_summary((-0.1, 0.08), (0.0, 0.12)))  # touching zero is including it
    assert "includes zero in every run" in inside and "unlikely to be an artefact" in inside
    assert "±0.12" in inside and "kept α's order" in inside and "1 of 8 blocks" not in inside
    assert "2 of 16 blocks" in inside
    moved = quantization_text(_summary((-0.1, 0.08), (0.01, 0.2)))
    assert "beyond its interval in 1 of 2 runs" in moved and "unlikely" not in moved and "4-bit model" in moved
    undefined = quantization_text(_summary((-0.1, 0.08), (float("nan"), float("nan"))))
    assert "undefined" in undefined and "not measured here" in undefined and "unlikely" not in undefined
    reordered = quantization_text(_summary((-0.1, 0.08), alpha_rho_low=ALPHA_ORDER_KEPT))  # on the line: not above
    assert "changed α's order" in reordered and "kept α's order" not in reordered
    assert "not measured" in quantization_text(_summary().iloc[:0])
    assert "verdict on ρ is a verdict on the 4-bit weights" not in inside
    flipped = _summary((-0.05, 0.06), (0.0, 0.2))
    flipped.loc[1, "rho_before_low"] = -0.01  # includes zero before the round trip, excludes it after
    flipped = quantization_text(flipped)
    assert ("Yet on depth 8, seed 1 ρ's interval includes zero with the float32 weights but excludes it after the "
            "Q4_1 round trip" in flipped and "depth 8, seed 0 ρ's" not in flipped)
    assert "of the 2 runs" in inside and "of the run through" in quantization_text(_summary((-0.1, 0.1)))
