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
  ``removal``, re-run from the first affected block of a ``zones.blocks.BlockTrace``.
* ``sublayer_params``: parameters per sublayer; a block's norms are split between its two
  sublayers, so that a block's two sublayers hold exactly its parameters.
* ``sublayer_alpha`` / ``sublayer_importance`` / ``sublayer_rho_table``: the attention
  sublayer's ΔLoss (``zones.ablation``, ``parts=True``) against the α of the attention
  matrices (q, k, v, o), and the MLP's against the MLP matrices', Spearman ρ with bootstrap
  intervals and permutation p-values (``zones.importance.spearman``).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterable, Iterator, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from .ablation import PARTS, summarize
from .adapters import ATTENTION_ROLES, get_adapter
from .blocks import BlockTrace, skip_blocks
from .checks import check_choice
from .importance import ESTIMATORS, spearman
from .spectra import layer_alpha

Removal = tuple[tuple[int, str], ...]
IMPORTANCE_COLUMNS = ["layer", "part", "delta_loss", "delta_loss_low", "delta_loss_high", "alpha", "n_params"]
RHO_COLUMNS = ["part", "estimator", "role", "rho", "ci_low", "ci_high", "p_value", "n_layers"]


# --- notation ------------------------------------------------------------------------------------

def check_part(part: str) -> str:
    """``"attn"`` or ``"mlp"`` (``zones.checks.check_choice``)."""
    return check_choice(part, "part", PARTS)


def normalize_removal(removal: Iterable, n_blocks: int) -> Removal:
    """A removal as sorted, unique ``(layer, part)`` pairs. Items may be ``(layer, part)``,
    a bare block index (both parts) or the strings of :func:`parse_removal`."""
    if isinstance(removal, str):
        removal = parse_removal(removal)
    pairs = set()
    for item in removal:
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            pairs.update((int(item), p) for p in PARTS)
            continue
        layer, part = item
        pairs.add((int(layer), check_part(part)))
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


def sublayer_params(model: nn.Module) -> pd.DataFrame:
    """Parameters per sublayer: ``layer, part, n_params, block_params``.

    A sublayer holds its module's parameters plus half of whatever else the block holds (its
    norms), so ``attn + mlp = block`` exactly and equal-parameter comparisons with whole
    blocks are exact.
    """
    adapter = get_adapter(model)
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


def _output_arity(model: nn.Module, block: nn.Module, module: nn.Module) -> int:
    """0 if ``module`` returns a tensor, else the length of the tuple it returns (probed once
    per module with a two-token forward of the blocks up to ``block``)."""
    if module in _ARITY:
        return _ARITY[module]
    seen = []
    handle = module.register_forward_hook(lambda _m, _a, out: seen.append(len(out) if isinstance(out, tuple) else 0))
    blocks = get_adapter(model).blocks()
    index = next(i for i, b in enumerate(blocks) if b is block)
    try:
        with torch.inference_mode(), skip_blocks(model, range(index + 1, len(blocks))):
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
def removed_sublayers(model: nn.Module, removal: Iterable) -> Iterator[nn.Module]:
    """Run ``model`` without the sublayers of ``removal`` inside the ``with`` (a block without
    both is skipped); the model is restored on exit. Parameters are never touched."""
    adapter = get_adapter(model)
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
            arity[part] = _output_arity(model, block, module)
        swaps.append((block, _attribute(block, module), module, part))
    try:
        for block, name, _module, part in swaps:
            setattr(block, name, RemovedSublayer(arity[part]))
        with skip_blocks(model, skipped):
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
    with torch.inference_mode(), removed_sublayers(trace.model, [(l, p) for l, p in removal if l not in skipped]):
        hidden = trace.block_input(start)
        for layer in range(start, trace.n_blocks):
            if layer not in skipped:
                hidden = trace.run_block(layer, hidden)
    return hidden


# --- importance against α --------------------------------------------------------------------------

def part_roles(alphas: pd.DataFrame, part: str) -> list[str]:
    """The roles of the α table that belong to ``part``: q, k, v, o for attention; the rest."""
    roles = list(dict.fromkeys(alphas["role"]))
    return [r for r in roles if (r in ATTENTION_ROLES) == (check_part(part) == "attn")]


def sublayer_alpha(alphas: pd.DataFrame, estimator: str = "alpha_shape", role: str = "weighted") -> pd.DataFrame:
    """One value per sublayer: ``layer, part, alpha``. ``role="weighted"``: the mean over the
    part's matrices weighted by parameter count (``zones.spectra.layer_alpha`` on those rows);
    a role name: that matrix only (for the part it belongs to)."""
    frames = []
    for part in PARTS:
        roles = part_roles(alphas, part)
        if role != "weighted" and role not in roles:
            continue
        rows = alphas[alphas["role"].isin(roles)]
        series = layer_alpha(rows, estimator=estimator, role=role)
        frames.append(pd.DataFrame({"layer": series.index.astype(int), "part": part, "alpha": series.to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def sublayer_importance(long: pd.DataFrame, alphas: pd.DataFrame, params: pd.DataFrame | None = None, *,
                        estimator: str = "alpha_shape", role: str = "weighted", **interval) -> pd.DataFrame:
    """Attention-only and MLP-only ΔLoss of every block with the sublayer's α beside it.

    ``long``: ``zones.ablation.ablation_window_losses(..., parts=True)``. Columns:
    ``layer, part, delta_loss, delta_loss_low, delta_loss_high`` (paired 95% interval over
    windows), ``alpha`` (:func:`sublayer_alpha`), ``n_params`` (NaN without ``params``).
    """
    if not {f"nll_{p}" for p in PARTS} <= set(long.columns):
        raise ValueError("the ablation table has no attention/MLP columns: run ablation_window_losses(parts=True)")
    table = summarize(long, parts=True, **interval)
    rows = []
    for part in PARTS:
        rows.append(pd.DataFrame({"layer": table["layer"], "part": part, "delta_loss": table[f"delta_loss_{part}"],
                                  "delta_loss_low": table[f"delta_loss_{part}_low"],
                                  "delta_loss_high": table[f"delta_loss_{part}_high"]}))
    out = pd.concat(rows, ignore_index=True).merge(sublayer_alpha(alphas, estimator, role), on=["layer", "part"],
                                                   how="left")
    out["n_params"] = (out.merge(params, on=["layer", "part"], how="left")["n_params"].to_numpy()
                       if params is not None else np.nan)
    order = {p: i for i, p in enumerate(PARTS)}
    out = out.sort_values(["part", "layer"], key=lambda s: s.map(order) if s.name == "part" else s)
    return out.reset_index(drop=True)[IMPORTANCE_COLUMNS]


def sublayer_rho_table(long: pd.DataFrame, alphas: pd.DataFrame, *, estimators: Sequence[str] | None = None,
                       n_boot: int = 2000, n_perm: int = 10000, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ between a sublayer's ΔLoss and its α, per part × estimator × role (the
    parameter-weighted ``"weighted"`` and each of the part's own matrices). Columns:
    ``part, estimator, role, rho, ci_low, ci_high, p_value, n_layers``."""
    table = summarize(long, parts=True, n_resamples=100)
    if estimators is None:
        estimators = [e for e in ESTIMATORS if e in alphas.columns and alphas[e].notna().any()]
    rows = []
    for part in PARTS:
        importance = table.set_index("layer")[f"delta_loss_{part}"]
        for estimator in estimators:
            for role in ["weighted", *part_roles(alphas, part)]:
                alpha = sublayer_alpha(alphas, estimator, role)
                alpha = alpha[alpha["part"] == part].set_index("layer")["alpha"].reindex(importance.index)
                c = spearman(alpha.to_numpy(), importance.to_numpy(), n_boot=n_boot, n_perm=n_perm, seed=seed)
                rows.append(dict(part=part, estimator=estimator, role=role, rho=c.rho, ci_low=c.ci_low,
                                 ci_high=c.ci_high, p_value=c.p_value, n_layers=c.n))
    return pd.DataFrame(rows, columns=RHO_COLUMNS)
