"""Scoring a model on token windows: mean cross-entropy (nats) and perplexity.

Protocol: non-overlapping windows of ``seq_len`` tokens; inside a window, every token after
the first is predicted from all tokens before it and counted once (``seq_len - 1`` per
window). Loss is the mean over all scored tokens; perplexity is ``exp(loss)``. No KV cache is
built. Comparisons between models (full vs. pruned) always use the same windows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from .blocks import BlockTrace, check_layers
from .data import Windows


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


def _batches(windows: Windows, batch_size: int) -> list[torch.Tensor]:
    if windows.n_windows == 0:
        raise ValueError("no windows to score")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, not {batch_size}")
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


def evaluate_removals(model: nn.Module, windows: Windows, removals: Sequence[Iterable[int]],
                      batch_size: int = 8, progress: bool = True,
                      desc: str = "removals") -> list[LossResult]:
    """Loss of the model with each set of blocks in ``removals`` skipped, on the same windows.

    Each batch is traced once through the full model; every removal set then re-runs only
    the blocks after its first removed block. An empty set gives the full model's loss.
    Results equal ``evaluate_loss`` under ``skip_blocks`` (to float rounding).
    """
    removals = [tuple(check_layers(model, r)) for r in removals]
    device = model_device(model)
    batches = _batches(windows, batch_size)
    totals = [0.0] * len(removals)
    counts = [0] * len(removals)
    bar = tqdm(total=len(batches) * len(removals), desc=desc, disable=not progress, leave=False)
    for ids in batches:
        ids = ids.to(device)
        trace = BlockTrace(model, ids)
        for j, removed in enumerate(removals):
            with torch.inference_mode():
                s, n = nll_sum(trace.logits_without(removed), ids)
            totals[j] += s
            counts[j] += n
            bar.update()
        del trace
    bar.close()
    return [LossResult(t / c, c) for t, c in zip(totals, counts)]
