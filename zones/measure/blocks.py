"""Removing decoder blocks, and re-running a model from the middle.

``skip_blocks(model, {3, 7})`` removes blocks for the duration of a ``with``: each removed
block's output is its input. It swaps the model's ModuleList of blocks for one without the
removed blocks (parameters are never touched) and always restores the original list.

``BlockTrace`` runs the full model once and keeps the input of every block. A model with a
set S of blocks removed computes exactly the same thing as the full model up to block
min(S), so ``trace.logits_without(S)`` starts there and runs only the remaining blocks.
That turns a sweep of single-block ablations from L full forwards into about L/2.

``zero_sublayer(model, layer, "attn" | "mlp")`` removes only a block's attention or MLP
contribution to the residual stream (its output is replaced with zeros).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterable, Iterator

import torch
from torch import nn

from zones.core.adapters import get_adapter
from zones.core.checks import check_blocks
from zones.core.progress import count_module


def check_layers(model: nn.Module, layers: Iterable[int], adapter=None, name: str = "blocks") -> list[int]:
    """Validate block indices against the model (``zones.core.checks.check_blocks``: integers,
    not bools or floats, each once, each a block of the model); return them sorted. ``adapter``:
    the model's, when the caller has it (``zones.measure.subject``); else it is looked up."""
    return check_blocks(layers, name, (adapter or get_adapter(model)).n_blocks)


@contextmanager
def skip_blocks(model: nn.Module, layers: Iterable[int], adapter=None) -> Iterator[nn.Module]:
    """Run ``model`` without the given blocks inside the ``with``; restore it on exit."""
    adapter = adapter or get_adapter(model)
    removed = set(check_layers(model, layers, adapter))
    parent, name = adapter.block_container()
    original = getattr(parent, name)
    kept = nn.ModuleList([block for i, block in enumerate(original) if i not in removed])
    # nn.Module.__setattr__ registers the new list as the submodule.
    setattr(parent, name, kept)
    try:
        yield model
    finally:
        setattr(parent, name, original)


@contextmanager
def zero_sublayer(model: nn.Module, layer: int, part: str) -> Iterator[nn.Module]:
    """Remove one block's attention (``part="attn"``) or MLP (``"mlp"``) output."""
    adapter = get_adapter(model)
    (layer,) = check_layers(model, [layer])
    block = adapter.blocks()[layer]
    if part not in ("attn", "mlp"):
        raise ValueError(f"part must be 'attn' or 'mlp', not {part!r}")
    module = adapter.attention(block) if part == "attn" else adapter.mlp(block)

    def zero_output(_module, _args, output):
        if isinstance(output, tuple):
            return (torch.zeros_like(output[0]),) + tuple(output[1:])
        return torch.zeros_like(output)

    handle = module.register_forward_hook(zero_output)
    try:
        yield model
    finally:
        handle.remove()


def _run_body(model: nn.Module, input_ids: torch.Tensor) -> None:
    """Run the model's transformer body (everything but the LM head)."""
    model.base_model(input_ids=input_ids, use_cache=False)


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


class BlockTrace:
    """One full forward of ``input_ids`` that remembers every block's input.

    The arguments each block was called with are kept too (attention mask, rotary position
    embeddings, ...), so re-running a block from the trace is exactly what the model does.
    """

    def __init__(self, model: nn.Module, input_ids: torch.Tensor, adapter=None):
        self.input_ids = input_ids
        self.model = model
        self.adapter = adapter or get_adapter(model)
        self.calls: list[tuple[tuple, dict]] = []
        blocks = self.adapter.blocks()

        def remember(_module, args, kwargs):
            self.calls.append((args, kwargs))

        self.final_hidden: torch.Tensor | None = None

        def remember_final(_module, args):
            self.final_hidden = args[0]

        handles = [b.register_forward_pre_hook(remember, with_kwargs=True) for b in blocks]
        handles.append(self.adapter.final_norm().register_forward_pre_hook(remember_final))
        try:
            with torch.inference_mode():
                # The LM head of the full model is applied later, on demand (logits are large).
                _run_body(model, input_ids)
        finally:
            for handle in handles:
                handle.remove()
        if len(self.calls) != len(blocks) or self.final_hidden is None:
            raise RuntimeError(f"traced {len(self.calls)} block calls for {len(blocks)} blocks")
        for block in blocks:  # work done, for zones.core.progress
            count_module(block, input_ids.numel())

    @property
    def n_blocks(self) -> int:
        return len(self.calls)

    def block_input(self, layer: int) -> torch.Tensor:
        args, kwargs = self.calls[layer]
        return args[0] if args else kwargs["hidden_states"]

    def run_block(self, layer: int, hidden: torch.Tensor) -> torch.Tensor:
        """Block ``layer`` applied to ``hidden`` with the arguments the model gave it."""
        args, kwargs = self.calls[layer]
        if args:
            args = (hidden,) + tuple(args[1:])
        else:
            kwargs = dict(kwargs, hidden_states=hidden)
        block = self.adapter.blocks()[layer]
        count_module(block, hidden.shape[0] * hidden.shape[1])
        return _first(block(*args, **kwargs))

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head."""
        return self.adapter.lm_head()(self.adapter.final_norm()(hidden))

    def hidden_without(self, removed: Iterable[int]) -> torch.Tensor:
        """Last hidden state (before the final norm) with ``removed`` blocks skipped."""
        removed = set(check_layers(self.model, removed))
        if not removed:
            return self.final_hidden
        start = min(removed)
        with torch.inference_mode():
            hidden = self.block_input(start)
            for layer in range(start, self.n_blocks):
                if layer not in removed:
                    hidden = self.run_block(layer, hidden)
        return hidden

    def logits_without(self, removed: Iterable[int]) -> torch.Tensor:
        """Logits of the model with ``removed`` blocks skipped, reusing the shared prefix."""
        with torch.inference_mode():
            return self.head(self.hidden_without(removed))
