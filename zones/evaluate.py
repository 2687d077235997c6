"""Scoring a model on token windows: mean cross-entropy (nats) and perplexity.

Protocol: non-overlapping windows of ``seq_len`` tokens; inside a window, every token after
the first is predicted from all tokens before it and counted once (``seq_len - 1`` per
window). Loss is the mean over all scored tokens; perplexity is ``exp(loss)``. No KV cache is
built. Comparisons between models (full vs. pruned) always use the same windows.

``evaluate_removals`` scores many sets of removed blocks on the same windows without a full
forward for each: every batch is traced once through the full model (``BlockTrace``), and
the sets are visited in lexicographic order of their membership (block 0 first), so
consecutive sets share the hidden states up to the first block where they differ. Each
(block, removed-prefix) pair runs once per batch, and each set pays one LM head, applied to
chunks of tokens so the (tokens × vocabulary) logits are never held at once.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters import get_adapter
from .blocks import BlockTrace, check_layers
from .data import Windows

HEAD_CHUNK = 2048  # tokens per LM-head call: bounds the logits held at once


@dataclass(frozen=True)
class LossResult:
    loss: float       # mean cross-entropy per scored token, nats
    n_tokens: int     # scored tokens

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def nll_sum(logits: torch.Tensor, input_ids: torch.Tensor) -> tuple[float, int]:
    """Summed next-token negative log-likelihood (float64) and the number of tokens scored."""
    pred = logits[:, :-1].float()
    target = input_ids[:, 1:].to(pred.device)
    nll = nn.functional.cross_entropy(pred.reshape(-1, pred.shape[-1]), target.reshape(-1),
                                      reduction="sum")
    return float(nll.double()), int(target.numel())


def head_nll_sum(adapter, hidden: torch.Tensor, input_ids: torch.Tensor, *,
                 normed: bool = False) -> float:
    """Summed next-token NLL (float64) of the last hidden state, through norm and LM head.

    ``hidden`` is the input of the final norm (``normed=False``) or its output. The last
    position predicts nothing that is scored, so it is dropped before the head.
    """
    hidden = hidden[:, :-1]
    if not normed:
        hidden = adapter.final_norm()(hidden)
    hidden = hidden.reshape(-1, hidden.shape[-1])
    target = input_ids[:, 1:].reshape(-1).to(hidden.device)
    head = adapter.lm_head()
    total = torch.zeros((), dtype=torch.float64, device=hidden.device)
    for h, t in zip(hidden.split(HEAD_CHUNK), target.split(HEAD_CHUNK)):
        logits = head(h).float()
        nll = torch.logsumexp(logits, dim=-1) - logits.gather(1, t[:, None])[:, 0]
        total += nll.double().sum()
    return float(total)


def _batches(windows: Windows, batch_size: int) -> list[torch.Tensor]:
    if windows.n_windows == 0:
        raise ValueError("no windows to score")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    return list(windows.input_ids.split(batch_size))


def evaluate_loss(model: nn.Module, windows: Windows, batch_size: int = 8,
                  progress: bool = False) -> LossResult:
    """Mean token cross-entropy of ``model`` on ``windows`` (one full forward per batch)."""
    device = model_device(model)
    total, count = 0.0, 0
    with torch.inference_mode():
        for ids in tqdm(_batches(windows, batch_size), desc="scoring", disable=not progress, leave=False):
            ids = ids.to(device)
            logits = model(input_ids=ids, use_cache=False).logits
            s, n = nll_sum(logits, ids)
            total, count = total + s, count + n
    return LossResult(total / count, count)


def tree_order(removals: Sequence[Iterable[int]], n_blocks: int) -> list[int]:
    """Indices of ``removals`` in prefix-tree (depth-first) order: lexicographic on the
    membership of blocks 0, 1, ..., with "removed" before "kept"."""
    sets = [set(r) for r in removals]
    return sorted(range(len(sets)), key=lambda j: tuple(0 if b in sets[j] else 1 for b in range(n_blocks)))


def prefix_tree_work(removals: Sequence[Iterable[int]], n_blocks: int) -> dict[str, float]:
    """Work of scoring ``removals`` per batch, in units of the full model's blocks:
    ``tree`` (``evaluate_removals``' order), ``prefix`` (each set from its first removed
    block) and ``naive`` (a full forward per set); ``heads`` is the number of LM-head passes
    (one per set) for each."""
    sets = [tuple(sorted(set(int(b) for b in r))) for r in removals]
    tree, previous = 0, ()
    for j in tree_order(sets, n_blocks):
        diff = set(sets[j]) ^ set(previous)
        if diff:
            start = max(min(diff), min(sets[j], default=n_blocks))
            tree += sum(1 for b in range(start, n_blocks) if b not in sets[j])
        previous = sets[j]
    prefix = sum(sum(1 for b in range(min(s), n_blocks) if b not in s) if s else 0 for s in sets)
    naive = sum(n_blocks - len(s) for s in sets)
    return dict(tree=tree / n_blocks, prefix=prefix / n_blocks, naive=naive / n_blocks, heads=len(sets))


def _restart(path: list, trace: BlockTrace, n: int, first_change: int, first_removed: int) -> int:
    """Where to resume a set's forward: after the first block where it differs from the
    previous set, or, if later, at its first removed block (the full model's trace is exact
    up to there; copy it into the path)."""
    if first_removed <= first_change:
        return first_change
    for b in range(first_change, first_removed + 1):
        path[b] = trace.block_input(b) if b < n else trace.final_hidden
    return first_removed


def evaluate_removals(model: nn.Module, windows: Windows, removals: Sequence[Iterable[int]], *,
                      batch_size: int = 8, progress: bool = True,
                      desc: str = "removal sets") -> list[LossResult]:
    """Mean token loss with each set of blocks in ``removals`` skipped, all on the same
    windows, in the order given (an empty set is the full model). Equals ``evaluate_loss``
    under ``skip_blocks`` for each set, to float rounding; shared prefixes run once per batch.
    """
    sets = [tuple(check_layers(model, r)) for r in removals]
    batches = _batches(windows, batch_size)
    adapter = get_adapter(model)
    n = adapter.n_blocks
    order = tree_order(sets, n)
    device = model_device(model)
    totals, counts = [0.0] * len(sets), [0] * len(sets)
    bar = tqdm(total=len(batches) * len(sets), desc=desc, disable=not progress, leave=False)
    for ids in batches:
        ids = ids.to(device)
        trace = BlockTrace(model, ids)
        # path[b]: input of block b under the previous set; path[n]: its last hidden state
        path = [trace.block_input(b) for b in range(n)] + [trace.final_hidden]
        previous: set[int] = set()
        with torch.inference_mode():
            for j in order:
                removed = set(sets[j])
                diff = removed ^ previous
                if diff:
                    start = _restart(path, trace, n, min(diff), min(removed, default=n))
                    hidden = path[start]
                    for b in range(start, n):
                        path[b] = hidden
                        if b not in removed:
                            hidden = trace.run_block(b, hidden)
                    path[n] = hidden
                previous = removed
                totals[j] += head_nll_sum(adapter, path[n], ids)
                counts[j] += int(ids[:, 1:].numel())
                bar.update()
        del trace, path
    bar.close()
    return [LossResult(t / c, c) for t, c in zip(totals, counts)]
