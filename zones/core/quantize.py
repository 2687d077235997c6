"""A model's block weight matrices round-tripped through a GGUF quantisation (Q4_1 by default),
exactly as llama.cpp's quantiser stores them: what 4-bit weights change, measurable on any model.

The default model's file (``SmolLM2-135M-Instruct.Q4_1.gguf``) stores every 2-D weight of every
decoder block as Q4_1, its token embedding (tied to the output head) as Q8_0 and its norms as
F32; zones dequantises it to float32. **Q4_1** cuts each row of a matrix (ggml's row: the input
features) into blocks of 32 consecutive weights; a block keeps ``d = (max − min) / 15`` and
``m = min`` as float16 and each weight as a 4-bit ``q = round((w − min) / d)`` in 0..15, read
back as ``d·q + m``. A weight moves by at most ``d / 2`` (plus the float16 rounding of ``d`` and
``m``: :func:`round_trip_bound`).

The quantiser is the ``gguf`` package's (``gguf.quants.quantize`` / ``dequantize``), the Python
port of ggml's reference quantiser (``quantize_row_q4_1_ref``, what ``llama-quantize`` runs
without an importance matrix). Round-tripping SmolLM2's dequantised weights changes them by
float rounding only (``tests/test_quantize.py``), so the blocks and the axis are the file's.

What is round-tripped (:func:`quantization_plan`): every 2-D weight inside a decoder block
(``zones.core.adapters``) whose rows split into whole blocks of the type's block size (32 for
Q4_1), as llama.cpp quantises them. The rest stays as it is: token embeddings and the output
head (SmolLM2's file keeps its embedding at 8 bits, Q8_0; this module leaves embeddings in
float32, so a comparison isolates the block matrices whose α the book reads), norms and biases
(1-D: llama.cpp keeps them in F32), and a block matrix whose rows do not split into whole
blocks (llama.cpp would fall back to another type; here it is left out and the plan says so).
"""
from __future__ import annotations

import copy

import numpy as np
import pandas as pd
import torch
from torch import nn

from zones.core.adapters import get_adapter
from zones.core.checks import check_choice
from zones.core.glossary import default

# The legacy GGUF types, with blocks of 32 weights along a row (the types gguf.quants can both
# quantise and dequantise in numpy); Q4_1 is the default model's.
QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")
DEFAULT_QUANT_TYPE = default("quant_type")
PLAN_COLUMNS = ["name", "layer", "rows", "cols", "row_length", "quantized", "reason"]


def _qtype(quant_type: str):
    import gguf  # imported here: reading a model needs no quantiser

    check_choice(quant_type, "quant_type", QUANT_TYPES)
    return gguf.GGMLQuantizationType[quant_type]


def block_size(quant_type: str = DEFAULT_QUANT_TYPE) -> int:
    """Weights per quantisation block of ``quant_type`` (32 for every type of ``QUANT_TYPES``)."""
    import gguf

    return int(gguf.GGML_QUANT_SIZES[_qtype(quant_type)][0])


def quantizer_version() -> str:
    """The ``gguf`` package's version: part of every cache key of a quantised result."""
    from importlib.metadata import version

    return version("gguf")


def round_trip(weights: np.ndarray, quant_type: str = DEFAULT_QUANT_TYPE) -> np.ndarray:
    """``weights`` (float32, rows along the last axis) quantised to ``quant_type`` and read back
    as float32, as a GGUF file stores and a loader dequantises them. The last axis must split
    into whole blocks (:func:`block_size`)."""
    qtype = _qtype(quant_type)
    import gguf

    array = np.ascontiguousarray(np.asarray(weights, dtype=np.float32))
    size = block_size(quant_type)
    if array.ndim < 1 or array.shape[-1] % size:
        raise ValueError(f"rows of length {array.shape[-1] if array.ndim else 0} do not split into {quant_type}'s "
                         f"blocks of {size}; quantise matrices whose row length is a multiple of {size}")
    return gguf.quants.dequantize(gguf.quants.quantize(array, qtype), qtype).reshape(array.shape).astype(np.float32)


def round_trip_bound(weights: np.ndarray) -> np.ndarray:
    """The largest change Q4_1 can make to each weight (same shape as ``weights``, rows along
    the last axis, blocks of 32): half its block's step ``d = (max − min) / 15``, plus the
    float16 rounding of the stored ``d`` (up to 15 steps) and ``m`` (relative 2⁻¹¹ each, or
    float16's smallest step near zero)."""
    array = np.asarray(weights, dtype=np.float64)
    blocks = array.reshape(*array.shape[:-1], -1, 32)
    high, low = blocks.max(axis=-1, keepdims=True), blocks.min(axis=-1, keepdims=True)
    step = (high - low) / 15
    half_ulp = 2.0 ** -11
    tiny = 2.0 ** -24  # float16's smallest subnormal step
    bound = step / 2 + 15 * (step * half_ulp + tiny) + np.abs(low) * half_ulp + tiny
    return np.broadcast_to(bound, blocks.shape).reshape(array.shape)


def _is_conv1d(module: nn.Module) -> bool:
    """GPT-2's Conv1D keeps its weight as (in_features, out_features): its rows are columns."""
    return type(module).__name__ == "Conv1D"


def _block_weights(model: nn.Module):
    """(name, layer, module, parameter) of every 2-D weight inside a decoder block."""
    adapter = get_adapter(model)
    parent, attribute = adapter.block_container()
    names = {id(m): n for n, m in model.named_modules()}
    blocks = getattr(parent, attribute)
    for layer, block in enumerate(blocks):
        for module in block.modules():
            for pname, parameter in module.named_parameters(recurse=False):
                if parameter.dim() == 2:
                    yield f"{names[id(module)]}.{pname}", layer, module, parameter


def quantization_plan(model: nn.Module, quant_type: str = DEFAULT_QUANT_TYPE) -> pd.DataFrame:
    """Which tensors :func:`quantize_model` round-trips: one row per 2-D weight of a decoder block
    (``PLAN_COLUMNS``: ``name``, ``layer``, ``rows, cols`` as (out, in) features, ``row_length``
    (in features: the quantised axis), ``quantized``, ``reason``). Embeddings, the output head,
    norms and biases are not listed: they are never quantised here (module note)."""
    size = block_size(quant_type)
    rows = []
    for name, layer, module, parameter in _block_weights(model):
        out_features, in_features = (parameter.shape[::-1] if _is_conv1d(module) else parameter.shape)
        fits = in_features % size == 0
        rows.append(dict(name=name, layer=layer, rows=int(out_features), cols=int(in_features),
                         row_length=int(in_features), quantized=bool(fits),
                         reason=f"{quant_type}: rows of {in_features} = {in_features // size} blocks of {size}" if fits
                         else f"left as it is: rows of {in_features} do not split into blocks of {size}"))
    return pd.DataFrame(rows, columns=PLAN_COLUMNS)


def quantize_model(model: nn.Module, quant_type: str = DEFAULT_QUANT_TYPE) -> nn.Module:
    """A copy of ``model`` whose decoder blocks' weight matrices went through ``quant_type`` and
    back (:func:`round_trip`, rows along the input features), in the model's dtype and device;
    the tensors :func:`quantization_plan` does not mark ``quantized`` (embeddings, head, norms,
    biases, matrices whose rows do not split into blocks) are the original's values. The copy has
    its own fingerprint, so its tables never read the original's cache entries."""
    plan = quantization_plan(model, quant_type)
    chosen = set(plan.loc[plan["quantized"], "name"])
    quantized = copy.deepcopy(model)
    with torch.no_grad():
        for name, _layer, module, parameter in _block_weights(quantized):
            if name not in chosen:
                continue
            conv = _is_conv1d(module)
            weights = parameter.detach().to("cpu", torch.float32).numpy()
            weights = weights.T if conv else weights
            result = round_trip(weights, quant_type)
            result = result.T if conv else result
            parameter.copy_(torch.from_numpy(np.ascontiguousarray(result)).to(parameter.device, parameter.dtype))
    return quantized.eval() if not model.training else quantized
