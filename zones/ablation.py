"""Single-block ablation: how much the loss rises when one decoder block is removed.

For every block i, ``ablation_table`` scores the model with block i skipped (its output is
its input) on the same windows as the full model, and reports the rise in mean token
cross-entropy, ΔLoss_i = Loss(without i) − Loss(full). With ``parts=True`` it also removes
only the block's attention output, or only its MLP output.

Two methods give the same numbers:

* ``"prefix"`` (default) traces each batch once through the full model, keeping every block's
  input; the model without block i equals the full model up to block i, so its forward
  starts there. A sweep over L blocks costs about L/2 block-forwards per batch instead of L.
* ``"naive"`` runs one complete forward per ablation and scores its logits exactly as
  ``zones.evaluate.evaluate_loss`` does (the reference).

The prefix sweep applies the final norm and LM head in chunks of tokens with a log-sum-exp,
so the (tokens × vocabulary) logits are never held at once.

Results are cached per (model fingerprint, windows fingerprint, parameters). The sweep is
journaled one (batch, block) at a time: an interrupted sweep resumes from the blocks already
done, and only a finished sweep is stored as a table.
"""
from __future__ import annotations

import math
from typing import Iterable

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from .adapters import get_adapter
from .blocks import BlockTrace, check_layers, skip_blocks, zero_sublayer
from .cache import Journal, entry_path, resumable_table
from .data import Windows
from .evaluate import head_nll_sum, model_device, nll_sum
from .models import model_fingerprint

VERSION = "1"
METHODS = ("prefix", "naive")
PARTS = ("attn", "mlp")
# Scored tokens for a CPU run of the chapter: eight windows of 256 (one batch of 8). The sweep
# costs about 18 forwards of them on SmolLM2-135M, two minutes or so on 2 idle cores. A GPU run
# should score the whole eval split (``None``).
DEFAULT_EVAL_TOKENS = 2040

COLUMNS = ["layer", "loss", "base_loss", "delta_loss", "n_tokens"]
PART_COLUMNS = ["loss_attn", "delta_loss_attn", "loss_mlp", "delta_loss_mlp"]


class _BatchScorer:
    """Scores ablations of one batch at a time; keeps the batch's trace while it is current."""

    def __init__(self, model: nn.Module, batches: list[torch.Tensor], method: str):
        self.model, self.batches, self.method = model, batches, method
        self.adapter = get_adapter(model)
        self.device = model_device(model)
        self.current: int | None = None

    def _load(self, batch: int) -> None:
        if self.current == batch:
            return
        self.trace = None  # free the previous batch's trace first
        self.ids = self.batches[batch].to(self.device)
        if self.method == "prefix":
            self.trace = BlockTrace(self.model, self.ids)
            with torch.inference_mode():
                self.base_nll = head_nll_sum(self.adapter, self.trace.final_hidden, self.ids)
        else:
            self.base_nll = self._full_forward_nll()
        self.current = batch

    def _full_forward_nll(self) -> float:
        # Exactly what zones.evaluate.evaluate_loss computes for one batch.
        with torch.inference_mode():
            return nll_sum(self.model(input_ids=self.ids, use_cache=False).logits, self.ids)[0]

    def _prefix_nll(self, layer: int, part: str | None) -> float:
        trace = self.trace
        with torch.inference_mode():
            hidden = trace.block_input(layer)
            for i in range(layer, trace.n_blocks):
                if i == layer and part is None:
                    continue  # the removed block: its output is its input
                hidden = trace.run_block(i, hidden)
            return head_nll_sum(self.adapter, hidden, self.ids)

    def _ablated_nll(self, layer: int, part: str | None) -> float:
        if self.method == "prefix":
            if part is None:
                return self._prefix_nll(layer, None)
            # The hook that zeroes the sublayer fires inside run_block.
            with zero_sublayer(self.model, layer, part):
                return self._prefix_nll(layer, part)
        context = skip_blocks(self.model, [layer]) if part is None else zero_sublayer(self.model, layer, part)
        with context:
            return self._full_forward_nll()

    def row(self, batch: int, layer: int, parts: bool) -> dict:
        self._load(batch)
        row = dict(batch=batch, layer=layer, n_tokens=int(self.ids[:, 1:].numel()),
                   base_nll=self.base_nll, nll=self._ablated_nll(layer, None))
        if parts:
            for part in PARTS:
                row[f"nll_{part}"] = self._ablated_nll(layer, part)
        return row


def _check(model: nn.Module, windows: Windows, layers, method: str, batch_size: int) -> list[int]:
    if not isinstance(windows, Windows):
        raise TypeError(f"windows must be zones.data.Windows (from corpus_windows), not {type(windows).__name__}")
    if windows.n_windows == 0:
        raise ValueError("no windows to score: the windows are empty")
    if windows.seq_len < 2:
        raise ValueError(f"windows of {windows.seq_len} token(s) score nothing; seq_len must be at least 2")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    n_blocks = get_adapter(model).n_blocks
    layers = list(range(n_blocks)) if layers is None else check_layers(model, layers)
    if not layers:
        raise ValueError("no blocks to ablate: layers is empty")
    return layers


def summarize(rows: pd.DataFrame, parts: bool) -> pd.DataFrame:
    """Per-(batch, block) NLL sums -> one row per block (the ``ablation_table`` columns)."""
    sums = rows.groupby("layer", sort=True)[
        ["n_tokens", "base_nll", "nll"] + ([f"nll_{p}" for p in PARTS] if parts else [])].sum()
    n = sums["n_tokens"]
    out = pd.DataFrame({"layer": sums.index.astype(int), "loss": sums["nll"] / n,
                        "base_loss": sums["base_nll"] / n})
    out["delta_loss"] = out["loss"] - out["base_loss"]
    out["n_tokens"] = n.astype(int)
    if parts:
        for part in PARTS:
            out[f"loss_{part}"] = sums[f"nll_{part}"] / n
            out[f"delta_loss_{part}"] = out[f"loss_{part}"] - out["base_loss"]
    return out.reset_index(drop=True)[COLUMNS + (PART_COLUMNS if parts else [])]


def ablation_table(model: nn.Module, windows: Windows, *, parts: bool = False, method: str = "prefix",
                   batch_size: int = 8, cache: bool = True, progress: bool = True,
                   layers: Iterable[int] | None = None) -> pd.DataFrame:
    """ΔLoss of removing each decoder block, on ``windows`` (from ``zones.data.corpus_windows``).

    One row per block, in depth order:

    ==================  ==============================================================
    ``layer``           block index (0 = first)
    ``loss``            mean token cross-entropy (nats) with the block removed
    ``base_loss``       the same for the full model, on the same tokens
    ``delta_loss``      ``loss - base_loss``: the block's importance
    ``n_tokens``        scored tokens
    ``loss_attn``       with only the block's attention output removed (``parts=True``)
    ``delta_loss_attn`` ``loss_attn - base_loss``
    ``loss_mlp``        with only the block's MLP output removed (``parts=True``)
    ``delta_loss_mlp``  ``loss_mlp - base_loss``
    ==================  ==============================================================

    ``method="prefix"`` reuses each batch's shared prefix; ``"naive"`` runs one full forward
    per ablation (same numbers to float rounding). ``layers`` restricts the sweep to some
    blocks. With ``cache=True`` the sweep is stored under the model's and the windows'
    fingerprints and resumes after an interruption.
    """
    layers = _check(model, windows, layers, method, batch_size)
    batches = list(windows.input_ids.split(batch_size))
    tasks = [(b, layer) for b in range(len(batches)) for layer in layers]
    scorer = _BatchScorer(model, batches, method)
    key = None
    if cache:
        key = dict(kind="ablation", version=VERSION, model=model_fingerprint(model),
                   windows=windows.fingerprint, n_windows=windows.n_windows, layers=layers,
                   parts=bool(parts), method=method, batch_size=batch_size,
                   dtype=str(next(model.parameters()).dtype), device=model_device(model).type)
        # Blocks journaled by an interrupted run are not recomputed; start the bar past them.
        done = len(Journal(entry_path("ablation", key).with_suffix(".partial.jsonl")).rows())
    bar = None

    def run(task):
        nonlocal bar
        if bar is None:
            bar = tqdm(total=len(tasks), initial=done if cache else 0, desc="ablation",
                       unit="block", disable=not progress, leave=False)
        row = scorer.row(*task, parts)
        bar.update()
        return row

    if cache:
        rows = resumable_table("ablation", key, tasks, task_id=lambda t: f"{t[0]}:{t[1]}", run=run)
    else:
        rows = pd.DataFrame([run(task) for task in tasks])
    if bar is not None:
        bar.close()
    return summarize(rows, parts)


def ablation_summary(table: pd.DataFrame, k: int = 3) -> dict:
    """The numbers a chapter cites about one ablation table, as plain Python values.

    ``n_blocks, n_tokens, base_loss, base_ppl``; ``top`` (the ``k`` most important blocks,
    most important first) and ``top_delta`` (their ΔLoss); ``median_delta``; ``top_share``
    (their share of the summed positive ΔLoss); ``n_lowering`` (blocks with ΔLoss ≤ 0).
    """
    delta = table.set_index("layer")["delta_loss"]
    top = [int(i) for i in delta.nlargest(k).index]
    positive = float(delta.clip(lower=0).sum())
    base_loss = float(table["base_loss"].iloc[0])
    return {
        "n_blocks": int(len(table)), "n_tokens": int(table["n_tokens"].iloc[0]),
        "base_loss": base_loss, "base_ppl": float(math.exp(base_loss)),
        "top": top, "top_delta": [float(delta[i]) for i in top],
        "median_delta": float(delta.median()),
        "top_share": float(delta[top].clip(lower=0).sum() / positive) if positive > 0 else float("nan"),
        "n_lowering": int((delta <= 0).sum()),
    }
