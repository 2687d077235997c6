"""Sublayers: a block's attention and its MLP, removed one at a time or in sets.

A decoder block adds two residual branches to the stream: its attention's output and its
MLP's output. Removing a **sublayer** sets that branch's output to zero; removing both
sublayers of a block is exactly removing the block (its output is its input), for the
sequential (Llama, GPT-2) and the parallel-residual (GPT-NeoX) blocks alike.

A removal is a set of ``(layer, part)`` pairs, ``part`` in ``PARTS = ("attn", "mlp")``,
written ``"3:attn,5,7:mlp"`` (a bare block index removes the whole block; ``format_removal``
and ``parse_removal``).

* ``removed_sublayers(model, removal)``: a context in which the model runs without them. A
  removed sublayer's module is swapped for a stub that returns zeros without computing
  anything (so a pruned model's tokens/s is real), and a block without both is skipped.
* ``removal_hidden(trace, removal)``: the last hidden state of the model without
  ``removal``, re-run from the first affected block of a ``zones.measure.blocks.BlockTrace``.
* ``sublayer_params``: parameters per sublayer; a block's norms are split between its two
  sublayers, so that a block's two sublayers hold exactly its parameters.

Their importance against α is ``zones.analysis.sublayer_importance``.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Iterator

import pandas as pd
import torch
from torch import nn

from zones.core.adapters import get_adapter
from zones.core.checks import check_choice, check_int
from zones.measure.blocks import BlockTrace, skip_blocks

PARTS = ("attn", "mlp")
Removal = tuple[tuple[int, str], ...]


# --- notation ------------------------------------------------------------------------------------

def check_part(part: str) -> str:
    """``"attn"`` or ``"mlp"`` (``zones.core.checks.check_choice``)."""
    return check_choice(part, "part", PARTS)


def normalize_removal(removal: Iterable, n_blocks: int) -> Removal:
    """A removal as sorted, unique ``(layer, part)`` pairs. Items may be ``(layer, part)``,
    a bare block index (both parts) or the strings of :func:`parse_removal`."""
    if isinstance(removal, str):
        removal = parse_removal(removal)
    pairs = set()
    for item in removal:
        if isinstance(item, (tuple, list)) and len(item) == 2:
            layer, part = item
            pairs.add((check_int(layer, "a removal's block index", min=0), check_part(part)))
            continue
        pairs.update((check_int(item, "a removal's block index", min=0), p) for p in PARTS)
    bad = sorted({layer for layer, _ in pairs if not 0 <= layer < n_blocks})
    if bad:
        raise IndexError(f"block index {bad} out of range: the model has blocks 0..{n_blocks - 1}")
    return tuple(sorted(pairs, key=lambda lp: (lp[0], PARTS.index(lp[1]))))


def format_removal(removal: Iterable) -> str:
    """``((3, "attn"), (5, "attn"), (5, "mlp"))`` -> ``"3:attn,5"`` (a whole block as its index)."""
    by_layer: dict[int, set[str]] = {}
    for layer, part in removal:
        by_layer.setdefault(int(layer), set()).add(part)
    items = []
    for layer in sorted(by_layer):
        parts = by_layer[layer]
        items += [str(layer)] if parts == set(PARTS) else [f"{layer}:{p}" for p in PARTS if p in parts]
    return ",".join(items)


def parse_removal(text: str) -> list:
    """Inverse of :func:`format_removal`: ``"3:attn,5"`` -> ``[(3, "attn"), 5]``."""
    items: list = []
    for token in str(text or "").split(","):
        token = token.strip()
        if not token:
            continue
        if ":" in token:
            layer, part = token.split(":", 1)
            items.append((int(layer), check_part(part.strip())))
        else:
            items.append(int(token))
    return items


def whole_blocks(removal: Removal) -> list[int]:
    """The blocks both of whose sublayers are in ``removal``."""
    by_layer: dict[int, set[str]] = {}
    for layer, part in removal:
        by_layer.setdefault(layer, set()).add(part)
    return sorted(layer for layer, parts in by_layer.items() if parts == set(PARTS))


# --- parameters ----------------------------------------------------------------------------------

def _count(module: nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def sublayer_params(model: nn.Module, adapter=None) -> pd.DataFrame:
    """Parameters per sublayer: ``layer, part, n_params, block_params``.

    A sublayer holds its module's parameters plus half of whatever else the block holds (its
    norms), so ``attn + mlp = block`` exactly and equal-parameter comparisons with whole
    blocks are exact.
    """
    adapter = get_adapter(model) if adapter is None else adapter
    rows = []
    for layer, block in enumerate(adapter.blocks()):
        attn, mlp, total = _count(adapter.attention(block)), _count(adapter.mlp(block)), _count(block)
        rest = total - attn - mlp
        rows.append(dict(layer=layer, part="attn", n_params=attn + rest / 2, block_params=total))
        rows.append(dict(layer=layer, part="mlp", n_params=mlp + rest / 2, block_params=total))
    return pd.DataFrame(rows, columns=["layer", "part", "n_params", "block_params"])


def removal_params(params: pd.DataFrame, removal: Iterable) -> float:
    """Parameters removed by ``removal`` (a table of :func:`sublayer_params`)."""
    lookup = params.set_index(["layer", "part"])["n_params"]
    return float(sum(lookup[(int(layer), part)] for layer, part in removal))


# --- running a model without sublayers ------------------------------------------------------------

class RemovedSublayer(nn.Module):
    """Stands in for a removed attention or MLP: returns zeros shaped like its input hidden
    states (in the structure the real module returns: a tensor, or a tuple padded with None)."""

    def __init__(self, arity: int):
        super().__init__()
        self.arity = arity

    def forward(self, *args, **kwargs):
        hidden = args[0] if args else kwargs["hidden_states"]
        zeros = torch.zeros_like(hidden)
        return zeros if self.arity == 0 else (zeros,) + (None,) * (self.arity - 1)


_ARITY: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


def _output_arity(model: nn.Module, adapter, block: nn.Module, module: nn.Module) -> int:
    """0 if ``module`` returns a tensor, else the length of the tuple it returns (probed once
    per module with a two-token forward of the blocks up to ``block``)."""
    if module in _ARITY:
        return _ARITY[module]
    seen = []
    handle = module.register_forward_hook(lambda _m, _a, out: seen.append(len(out) if isinstance(out, tuple) else 0))
    blocks = adapter.blocks()
    index = next(i for i, b in enumerate(blocks) if b is block)
    try:
        with torch.inference_mode(), skip_blocks(model, range(index + 1, len(blocks)), adapter):
            ids = torch.zeros(1, 2, dtype=torch.long, device=next(model.parameters()).device)
            model.base_model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()
    _ARITY[module] = seen[0]
    return seen[0]


def _attribute(parent: nn.Module, child: nn.Module) -> str:
    for name, module in parent.named_children():
        if module is child:
            return name
    raise RuntimeError(f"{type(child).__name__} is not a direct child of {type(parent).__name__}")


@contextlib.contextmanager
def removed_sublayers(model: nn.Module, removal: Iterable, adapter=None) -> Iterator[nn.Module]:
    """Run ``model`` without the sublayers of ``removal`` inside the ``with`` (a block without
    both is skipped); the model is restored on exit. Parameters are never touched. ``adapter``:
    the model's, when the caller has it already (``zones.measure.subject``)."""
    adapter = get_adapter(model) if adapter is None else adapter
    removal = normalize_removal(removal, adapter.n_blocks)
    skipped = set(whole_blocks(removal))
    swaps = []
    arity: dict[str, int] = {}
    for layer, part in removal:
        if layer in skipped:
            continue
        block = adapter.blocks()[layer]
        module = adapter.attention(block) if part == "attn" else adapter.mlp(block)
        if part not in arity:
            arity[part] = _output_arity(model, adapter, block, module)
        swaps.append((block, _attribute(block, module), module, part))
    try:
        for block, name, _module, part in swaps:
            setattr(block, name, RemovedSublayer(arity[part]))
        with skip_blocks(model, skipped, adapter):
            yield model
    finally:
        for block, name, module, _part in swaps:
            setattr(block, name, module)


def removal_hidden(trace: BlockTrace, removal: Removal) -> torch.Tensor:
    """Last hidden state (before the final norm) of ``trace``'s model without ``removal``
    (normalized): the traced prefix is reused, only blocks from the first affected one run."""
    if not removal:
        return trace.final_hidden
    skipped = set(whole_blocks(removal))
    start = min(layer for layer, _ in removal)
    # Whole blocks are skipped here, not by skip_blocks: the trace indexes the full list of blocks.
    with torch.no_grad(), removed_sublayers(trace.model, [(l, p) for l, p in removal if l not in skipped],
                                            trace.adapter):
        hidden = trace.block_input(start)
        for layer in range(start, trace.n_blocks):
            if layer not in skipped:
                hidden = trace.run_block(layer, hidden)
    return hidden
