"""Adapters list the right blocks and matrices, and split fused projections as the model does."""
import pytest
import torch
from conftest import tiny_model
from torch import nn

from zones.core.adapters import UnsupportedArchitectureError, get_adapter

EXPECTED_ROLES = {
    "llama": {"q", "k", "v", "o", "mlp_gate", "mlp_up", "mlp_down"},
    "gpt_neox": {"q", "k", "v", "o", "mlp_in", "mlp_out"},
    "gpt2": {"q", "k", "v", "o", "mlp_in", "mlp_out"},
}


def test_blocks_roles_and_shapes(family):
    model = tiny_model(family, n_layers=3)
    adapter = get_adapter(model)
    assert adapter.n_blocks == 3
    rows = list(adapter.iter_matrices())
    assert [layer for layer, _, _ in rows] == sorted(layer for layer, _, _ in rows)
    for layer in range(3):
        roles = {role: m for l, role, m in rows if l == layer}
        assert set(roles) == EXPECTED_ROLES[family]
        hidden = 32
        q, k, v, o = roles["q"], roles["k"], roles["v"], roles["o"]
        assert q.shape == (hidden, hidden) and o.shape == (hidden, hidden)
        expected_kv = (16, hidden) if family == "llama" else (hidden, hidden)  # llama: 2 kv heads of 8
        assert k.shape == expected_kv and v.shape == expected_kv


def _capture(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return module(x)


def test_gpt2_qkv_split_matches_model():
    model = tiny_model("gpt2", n_layers=2)
    block = model.transformer.h[1]
    x = torch.randn(2, 5, 32)
    fused = _capture(block.attn.c_attn, x)
    # GPT2Attention splits the c_attn output this way in its forward.
    q_ref, k_ref, v_ref = fused.split(block.attn.split_size, dim=2)
    bias_q, bias_k, bias_v = block.attn.c_attn.bias.split(block.attn.split_size)
    mats = get_adapter(model).block_matrices(block)
    for ref, w, b in ((q_ref, mats["q"], bias_q), (k_ref, mats["k"], bias_k), (v_ref, mats["v"], bias_v)):
        torch.testing.assert_close(x @ w.T + b, ref)
    torch.testing.assert_close(x @ mats["o"].T + block.attn.c_proj.bias, _capture(block.attn.c_proj, x))
    torch.testing.assert_close(x @ mats["mlp_in"].T + block.mlp.c_fc.bias, _capture(block.mlp.c_fc, x))


def test_gpt_neox_qkv_split_matches_model():
    model = tiny_model("gpt_neox", n_layers=2)
    attn = model.gpt_neox.layers[0].attention
    x = torch.randn(2, 5, 32)
    fused = _capture(attn.query_key_value, x)
    # GPTNeoXAttention views the fused output as (heads, 3 * head_size) and chunks it.
    per_head = fused.view(2, 5, -1, 3 * attn.head_size)
    q_ref, k_ref, v_ref = (t.reshape(2, 5, -1) for t in per_head.chunk(3, dim=-1))
    bias = attn.query_key_value.bias.view(-1, 3 * attn.head_size)
    bias_q, bias_k, bias_v = (t.reshape(-1) for t in bias.chunk(3, dim=-1))
    mats = get_adapter(model).block_matrices(model.gpt_neox.layers[0])
    for ref, w, b in ((q_ref, mats["q"], bias_q), (k_ref, mats["k"], bias_k), (v_ref, mats["v"], bias_v)):
        torch.testing.assert_close(x @ w.T + b, ref)


def test_unknown_architecture_is_a_clear_error():
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=64))
    with pytest.raises(UnsupportedArchitectureError, match="bert.*Supported families.*llama.*gpt_neox.*gpt2"):
        get_adapter(model)


def test_adapters_declare_the_state_dict_keys_that_weight_files_use(family, tmp_path):
    """One naming for a loaded model and a weight file: each role's key is in the state dict,
    and the matrices read from a saved file (zones.core.weights) are the adapter's, fused q/k/v
    split by the same split_qkv."""
    from zones.core.weights import iter_checkpoint_matrices

    model = tiny_model(family, n_layers=2)
    adapter = get_adapter(model)
    state = model.state_dict()
    expected = {"llama": "model.layers.1.self_attn.q_proj.weight",
                "gpt_neox": "gpt_neox.layers.1.attention.query_key_value.weight",
                "gpt2": "transformer.h.1.attn.c_attn.weight"}[family]
    keys = adapter.state_dict_keys(1)
    assert expected in keys.values() and set(keys.values()) <= set(state)
    model.save_pretrained(tmp_path, safe_serialization=True)
    from_file = list(iter_checkpoint_matrices(tmp_path))
    in_memory = list(adapter.iter_matrices())
    assert [(l, r) for l, r, _ in from_file] == [(l, r) for l, r, _ in in_memory]
    for (_, _, a), (_, _, b) in zip(from_file, in_memory):
        torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
