"""Architecture adapters: where the decoder blocks and their weight matrices live.

Each adapter is a small class that knows one family's module names. Every weight matrix
comes back as a tensor of shape (out_features, in_features), under a canonical role:

    q, k, v, o                      attention projections
    mlp_gate, mlp_up, mlp_down      gated MLP (Llama family)
    mlp_in, mlp_out                 plain MLP (GPT-NeoX, GPT-2)

Each adapter also declares where those matrices are in a state dict (a checkpoint's weight
files use the same names), so ``zones.core.weights`` reads them from files without building a
model: block ``i``'s tensors are named ``block_prefix(i) + weight_keys[role]``, e.g. Llama's
``model.layers.{i}.self_attn.q_proj.weight``, GPT-NeoX's fused
``gpt_neox.layers.{i}.attention.query_key_value.weight`` and GPT-2's Conv1D (stored
transposed, ``transposed = True``) ``transformer.h.{i}.attn.c_attn.weight``. A fused ``qkv``
matrix is split by ``split_qkv``, once, the way the model itself splits it, for a loaded
model and a weight file alike.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import torch
from torch import nn

ATTENTION_ROLES = ("q", "k", "v", "o")


class UnsupportedArchitectureError(ValueError):
    """Raised for a model whose family has no adapter."""


class Adapter:
    """Base class: subclasses name the modules of one family and the state-dict keys of its
    block matrices."""

    family: str = ""
    model_types: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    # state-dict names of block i: the prefixes tried in order (with the base model's name, and
    # without it as some checkpoints store them), and the key of each role's weight within a block
    # ("qkv": a fused projection, split into q, k, v by split_qkv)
    block_prefixes: tuple[str, ...] = ()
    weight_keys: dict[str, str] = {}
    transposed: bool = False  # the file keeps (in_features, out_features), as GPT-2's Conv1D does
    heads_key: str = "num_attention_heads"  # the config entry split_qkv needs

    def __init__(self, model: nn.Module):
        self.model = model

    # --- the state-dict keys of the block matrices -------------------------------------------
    @classmethod
    def state_dict_keys(cls, layer: int, prefix: str | None = None) -> dict[str, str]:
        """Role -> full state-dict key of block ``layer``'s weights (``prefix``: one of
        ``block_prefixes``, the first by default), e.g. ``{"q": "model.layers.0.self_attn.q_proj.weight", ...}``."""
        base = (prefix or cls.block_prefixes[0]).format(i=layer)
        return {role: base + key for role, key in cls.weight_keys.items()}

    @classmethod
    def split_qkv(cls, fused: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v of a fused (3·d, d) projection, split as the model splits its output."""
        raise NotImplementedError(f"{cls.family} has no fused q/k/v projection")

    @classmethod
    def matrices(cls, tensor: Callable[[str], torch.Tensor], config: Mapping[str, Any] | Any
                 ) -> dict[str, torch.Tensor]:
        """Role -> (out_features, in_features) matrix of one block, where ``tensor(key)``
        returns the block's tensor named ``key`` (one of ``weight_keys``' values) and
        ``config`` is a config.json dict or a model config (for the number of heads)."""
        out: dict[str, torch.Tensor] = {}
        for role, key in cls.weight_keys.items():
            matrix = tensor(key)
            if cls.transposed:
                matrix = matrix.T
            if role == "qkv":
                heads = config[cls.heads_key] if isinstance(config, Mapping) else getattr(config, cls.heads_key)
                out.update(zip(("q", "k", "v"), cls.split_qkv(matrix, int(heads))))
            else:
                out[role] = matrix
        return out

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
        return self.matrices(block.get_parameter, self.model.config)

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
    block_prefixes = ("model.layers.{i}.", "layers.{i}.")
    weight_keys = {
        "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight", "mlp_gate": "mlp.gate_proj.weight", "mlp_up": "mlp.up_proj.weight",
        "mlp_down": "mlp.down_proj.weight",
    }

    def block_container(self):
        return self.model.model, "layers"

    def final_norm(self):
        return self.model.model.norm

    def attention(self, block):
        return block.self_attn


class GPTNeoXAdapter(Adapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    roles = ATTENTION_ROLES + ("mlp_in", "mlp_out")
    block_prefixes = ("gpt_neox.layers.{i}.", "layers.{i}.")
    weight_keys = {
        "qkv": "attention.query_key_value.weight", "o": "attention.dense.weight",
        "mlp_in": "mlp.dense_h_to_4h.weight", "mlp_out": "mlp.dense_4h_to_h.weight",
    }

    def block_container(self):
        return self.model.gpt_neox, "layers"

    def final_norm(self):
        return self.model.gpt_neox.final_layer_norm

    def attention(self, block):
        return block.attention

    @classmethod
    def split_qkv(cls, fused, n_heads):
        # query_key_value's output is viewed as (heads, 3 * head_size): per head [q | k | v].
        per_head = fused.view(n_heads, 3, fused.shape[0] // (3 * n_heads), fused.shape[-1])
        q, k, v = (per_head[:, i].reshape(-1, fused.shape[-1]) for i in range(3))
        return q, k, v


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    roles = ATTENTION_ROLES + ("mlp_in", "mlp_out")
    block_prefixes = ("transformer.h.{i}.", "h.{i}.")
    weight_keys = {
        "qkv": "attn.c_attn.weight", "o": "attn.c_proj.weight", "mlp_in": "mlp.c_fc.weight",
        "mlp_out": "mlp.c_proj.weight",
    }
    transposed = True  # Conv1D keeps (in_features, out_features)
    heads_key = "n_head"

    def block_container(self):
        return self.model.transformer, "h"

    def final_norm(self):
        return self.model.transformer.ln_f

    def attention(self, block):
        return block.attn

    @classmethod
    def split_qkv(cls, fused, n_heads):
        # c_attn's output is [q | k | v], each of split_size = n_embd features
        q, k, v = fused.split(fused.shape[0] // 3, dim=0)
        return q, k, v


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
