"""Architecture adapters: where the decoder blocks and their weight matrices live.

Each adapter is a small class that knows one family's module names. Every weight matrix
comes back as a tensor of shape (out_features, in_features), under a canonical role:

    q, k, v, o                      attention projections
    mlp_gate, mlp_up, mlp_down      gated MLP (Llama family)
    mlp_in, mlp_out                 plain MLP (GPT-NeoX, GPT-2)

Fused projections are split the way the model itself splits them.
"""
from __future__ import annotations

from typing import Iterator

import torch
from torch import nn

ATTENTION_ROLES = ("q", "k", "v", "o")


class UnsupportedArchitectureError(ValueError):
    """Raised for a model whose family has no adapter."""


class Adapter:
    """Base class: subclasses name the modules of one family."""

    family: str = ""
    model_types: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    def __init__(self, model: nn.Module):
        self.model = model

    # --- where things live -------------------------------------------------------------
    def block_container(self) -> tuple[nn.Module, str]:
        """(parent module, attribute name) of the ModuleList of decoder blocks."""
        raise NotImplementedError

    def final_norm(self) -> nn.Module:
        raise NotImplementedError

    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def attention(self, block: nn.Module) -> nn.Module:
        raise NotImplementedError

    def mlp(self, block: nn.Module) -> nn.Module:
        return block.mlp

    def block_matrices(self, block: nn.Module) -> dict[str, torch.Tensor]:
        """Weight matrices of one block, role -> (out_features, in_features)."""
        raise NotImplementedError

    # --- derived -------------------------------------------------------------------------
    def blocks(self) -> nn.ModuleList:
        parent, name = self.block_container()
        return getattr(parent, name)

    @property
    def n_blocks(self) -> int:
        return len(self.blocks())

    def iter_matrices(self) -> Iterator[tuple[int, str, torch.Tensor]]:
        """Yield (layer, role, matrix) for every matrix of every block, in depth order."""
        for layer, block in enumerate(self.blocks()):
            for role, matrix in self.block_matrices(block).items():
                yield layer, role, matrix


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = ("llama", "mistral", "qwen2", "qwen3", "smollm3")
    roles = ATTENTION_ROLES + ("mlp_gate", "mlp_up", "mlp_down")

    def block_container(self):
        return self.model.model, "layers"

    def final_norm(self):
        return self.model.model.norm

    def attention(self, block):
        return block.self_attn

    def block_matrices(self, block):
        attn, mlp = block.self_attn, block.mlp
        return {
            "q": attn.q_proj.weight, "k": attn.k_proj.weight,
            "v": attn.v_proj.weight, "o": attn.o_proj.weight,
            "mlp_gate": mlp.gate_proj.weight, "mlp_up": mlp.up_proj.weight,
            "mlp_down": mlp.down_proj.weight,
        }


class GPTNeoXAdapter(Adapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    roles = ATTENTION_ROLES + ("mlp_in", "mlp_out")

    def block_container(self):
        return self.model.gpt_neox, "layers"

    def final_norm(self):
        return self.model.gpt_neox.final_layer_norm

    def attention(self, block):
        return block.attention

    def block_matrices(self, block):
        attn = block.attention
        # query_key_value's output is viewed as (heads, 3 * head_size): per head [q | k | v].
        fused = attn.query_key_value.weight
        per_head = fused.view(attn.config.num_attention_heads, 3, attn.head_size, fused.shape[-1])
        q, k, v = (per_head[:, i].reshape(-1, fused.shape[-1]) for i in range(3))
        return {
            "q": q, "k": k, "v": v, "o": attn.dense.weight,
            "mlp_in": block.mlp.dense_h_to_4h.weight, "mlp_out": block.mlp.dense_4h_to_h.weight,
        }


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    roles = ATTENTION_ROLES + ("mlp_in", "mlp_out")

    def block_container(self):
        return self.model.transformer, "h"

    def final_norm(self):
        return self.model.transformer.ln_f

    def attention(self, block):
        return block.attn

    def block_matrices(self, block):
        # GPT-2 uses Conv1D, whose weight is (in_features, out_features): transpose it.
        fused = block.attn.c_attn.weight.T
        q, k, v = fused.split(block.attn.split_size, dim=0)
        return {
            "q": q, "k": k, "v": v, "o": block.attn.c_proj.weight.T,
            "mlp_in": block.mlp.c_fc.weight.T, "mlp_out": block.mlp.c_proj.weight.T,
        }


ADAPTERS: tuple[type[Adapter], ...] = (LlamaAdapter, GPTNeoXAdapter, GPT2Adapter)


def supported_families() -> str:
    return "; ".join(f"{a.family} ({', '.join(a.model_types)})" for a in ADAPTERS)


def adapter_for_model_type(model_type: str) -> type[Adapter]:
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    raise UnsupportedArchitectureError(
        f"model_type {model_type!r} is not supported. Supported families: {supported_families()}."
    )


def get_adapter(model: nn.Module) -> Adapter:
    """The adapter for a loaded `transformers` causal LM."""
    model_type = getattr(getattr(model, "config", None), "model_type", type(model).__name__)
    return adapter_for_model_type(model_type)(model)
