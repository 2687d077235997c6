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
  ``zones.measure.evaluate.evaluate_loss`` does (the reference).

The prefix sweep applies the final norm and LM head in chunks of tokens with a log-sum-exp,
so the (tokens × vocabulary) logits are never held at once.

Every ablation keeps its NLL on every window (``ablation_window_losses``: the long table),
and ``ablation_table`` gives each block's ΔLoss a 95% paired bootstrap interval over windows
(``zones.measure.stats``: one resample of windows for the base and every block alike). A base or
ablated loss that is not finite stops the sweep with an error naming the block and window.

Results are cached per (model fingerprint, windows fingerprint, parameters, scoring dtype).
The sweep is journaled one (batch, block) at a time, each row holding its windows' NLL: an
interrupted sweep resumes from the blocks already done, and only a finished sweep is stored.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.core.adapters import get_adapter
from zones.core.cache import Journal, entry_path, resumable_table
from zones.core.checks import check_choice, check_int
from zones.core.data import Windows
from zones.core.models import model_fingerprint
from zones.measure.blocks import BlockTrace, check_layers, skip_blocks, zero_sublayer
from zones.measure.evaluate import (
    DEFAULT_DTYPE,
    check_dtype,
    check_fit,
    forward_nll_windows,
    head_nll_windows,
    loss_name,
    model_device,
    scoring_precision,
)
from zones.measure.stats import LEVEL, N_RESAMPLES, SEED, check_finite, delta_loss_interval, interval_columns

VERSION = "2"
METHODS = ("prefix", "naive")
PARTS = ("attn", "mlp")
# Scored tokens for a CPU run of the chapter: 24 windows of 256, about 4 minutes on 2 idle cores
# for SmolLM2-135M (chosen by benchmarks/bench_precision.py and the book's 30-minute budget). A
# GPU run should score the whole eval split (``None``).
DEFAULT_EVAL_TOKENS = 6120

COLUMNS = ["layer", "loss", "base_loss", "delta_loss", "delta_loss_low", "delta_loss_high", "n_tokens"]
PART_COLUMNS = [c for p in PARTS for c in (f"loss_{p}", f"delta_loss_{p}", f"delta_loss_{p}_low",
                                           f"delta_loss_{p}_high")]
WINDOW_COLUMNS = ["layer", "window", "nll", "base_nll", "n_tokens"]
PART_WINDOW_COLUMNS = [f"nll_{p}" for p in PARTS]


class _BatchScorer:
    """Scores ablations of one batch at a time; keeps the batch's trace while it is current."""

    def __init__(self, model: nn.Module, windows: Windows, batches: list[torch.Tensor], method: str, dtype: str):
        self.model, self.windows, self.batches, self.method, self.dtype = model, windows, batches, method, dtype
        self.starts = np.cumsum([0] + [len(b) for b in batches])  # first window of each batch
        self.adapter = get_adapter(model)
        self.device = model_device(model)
        self.current: int | None = None

    def _check(self, nll: np.ndarray, label: str) -> np.ndarray:
        check_finite(nll[None], lambda _: label, loss_name(self.windows), first_window=int(self.starts[self.current]),
                     n_windows=self.windows.n_windows)
        return nll

    def _load(self, batch: int) -> None:
        if self.current == batch:
            return
        self.trace = None  # free the previous batch's trace first
        self.ids = self.batches[batch].to(self.device)
        self.current = batch
        with torch.inference_mode(), scoring_precision(self.model, self.dtype):
            if self.method == "prefix":
                self.trace = BlockTrace(self.model, self.ids)
                base = head_nll_windows(self.adapter, self.trace.final_hidden, self.ids)
            else:
                base = forward_nll_windows(self.model, self.ids)
        self.base_nll = self._check(base, "of the full model")

    def _prefix_nll(self, layer: int, part: str | None) -> np.ndarray:
        trace = self.trace
        hidden = trace.block_input(layer)
        for i in range(layer, trace.n_blocks):
            if i == layer and part is None:
                continue  # the removed block: its output is its input
            hidden = trace.run_block(i, hidden)
        return head_nll_windows(self.adapter, hidden, self.ids)

    def _ablated_nll(self, layer: int, part: str | None) -> np.ndarray:
        with torch.inference_mode(), scoring_precision(self.model, self.dtype):
            if self.method == "prefix":
                if part is None:
                    nll = self._prefix_nll(layer, None)
                else:  # the hook that zeroes the sublayer fires inside run_block
                    with zero_sublayer(self.model, layer, part):
                        nll = self._prefix_nll(layer, part)
            else:
                context = skip_blocks(self.model, [layer]) if part is None else zero_sublayer(self.model, layer, part)
                with context:
                    nll = forward_nll_windows(self.model, self.ids)
        what = f"with block {layer} removed" if part is None else f"with block {layer}'s {part} output removed"
        return self._check(nll, what)

    def row(self, batch: int, layer: int, parts: bool) -> dict:
        """One (batch, block): the per-window NLL sums of the full and the ablated model."""
        self._load(batch)
        n = self.ids.shape[0]
        row = dict(batch=batch, layer=layer, window=list(range(int(self.starts[batch]), int(self.starts[batch]) + n)),
                   n_tokens=[int(self.ids.shape[1] - 1)] * n, base_nll=self.base_nll.tolist(),
                   nll=self._ablated_nll(layer, None).tolist())
        if parts:
            for part in PARTS:
                row[f"nll_{part}"] = self._ablated_nll(layer, part).tolist()
        return row


def _check(model: nn.Module, windows: Windows, layers, method: str, batch_size: int) -> list[int]:
    if not isinstance(windows, Windows):
        raise TypeError(f"windows must be zones.core.data.Windows (from corpus_windows), not {type(windows).__name__}")
    if windows.n_windows == 0:
        raise ValueError("no windows to score: the windows are empty")
    if windows.seq_len < 2:
        raise ValueError(f"windows of {windows.seq_len} token(s) score nothing; seq_len must be at least 2")
    check_choice(method, "method", METHODS)
    check_int(batch_size, "batch_size", min=1)
    n_blocks = get_adapter(model).n_blocks
    layers = list(range(n_blocks)) if layers is None else check_layers(model, layers)
    if not layers:
        raise ValueError("no blocks to ablate: layers is empty")
    return layers


def _explode(rows: pd.DataFrame, parts: bool) -> pd.DataFrame:
    """Journal rows (one per batch and block, holding lists over windows) -> the long table."""
    columns = WINDOW_COLUMNS + (PART_WINDOW_COLUMNS if parts else [])
    lists = [c for c in columns if c != "layer"]
    long = rows[columns].explode(lists, ignore_index=True)
    long = long.astype({c: float for c in lists if "nll" in c} | {"layer": int, "window": int, "n_tokens": int})
    return long.sort_values(["layer", "window"]).reset_index(drop=True)


def summarize(windows: pd.DataFrame, parts: bool = False, *, n_resamples: int = N_RESAMPLES,
              level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """The long table (one row per block and window) -> one row per block: the
    ``ablation_table`` columns, each ΔLoss with its paired bootstrap interval."""
    layers = np.sort(windows["layer"].unique())
    wide = {c: windows.pivot(index="layer", columns="window", values=c).loc[layers]
            for c in ["nll", "base_nll", "n_tokens"] + ([f"nll_{p}" for p in PARTS] if parts else [])}
    base, tokens = wide["base_nll"].iloc[0].to_numpy(), wide["n_tokens"].iloc[0].to_numpy()
    n = tokens.sum()
    out = pd.DataFrame({"layer": layers.astype(int), "loss": wide["nll"].sum(axis=1).to_numpy() / n,
                        "base_loss": base.sum() / n})
    kwargs = dict(n_resamples=n_resamples, level=level, seed=seed)
    for name, nll in [("", wide["nll"])] + ([(f"_{p}", wide[f"nll_{p}"]) for p in PARTS] if parts else []):
        out[f"loss{name}"] = nll.sum(axis=1).to_numpy() / n
        for column, values in interval_columns(delta_loss_interval(nll.to_numpy(), base, tokens, **kwargs),
                                               f"delta_loss{name}").items():
            out[column] = values
    out["n_tokens"] = int(n)
    return out[COLUMNS + (PART_COLUMNS if parts else [])]


def ablation_window_losses(model: nn.Module, windows: Windows, *, parts: bool = False, method: str = "prefix",
                           batch_size: int = 8, cache: bool = True, progress: bool = True,
                           layers: Iterable[int] | None = None, dtype: str = DEFAULT_DTYPE) -> pd.DataFrame:
    """The NLL of every single-block ablation on every window: the long table.

    One row per (block, window): ``layer, window`` (index in ``windows``), ``nll`` (summed
    next-token NLL, nats, with the block removed), ``base_nll`` (the full model's, same
    window), ``n_tokens``; with ``parts=True`` also ``nll_attn, nll_mlp``. Arguments as in
    :func:`ablation_table`, which summarizes this table (and shares its cache entry).
    """
    layers = _check(model, windows, layers, method, batch_size)
    dtype = check_dtype(dtype, model)
    check_fit(model, windows)
    batches = list(windows.input_ids.split(batch_size))
    tasks = [(b, layer) for b in range(len(batches)) for layer in layers]
    scorer = _BatchScorer(model, windows, batches, method, dtype)
    key = None
    if cache:
        key = dict(kind="ablation", version=VERSION, model=model_fingerprint(model),
                   windows=windows.fingerprint, n_windows=windows.n_windows, layers=layers,
                   parts=bool(parts), method=method, batch_size=batch_size, dtype=dtype,
                   weights_dtype=str(next(model.parameters()).dtype), device=model_device(model).type)
        # Blocks journaled by an interrupted run are not recomputed; start the bar past them.
        done = len(Journal(entry_path("ablation", key).with_suffix(".partial.jsonl")).rows())
    bar = None

    def run(task):
        nonlocal bar
        if bar is None:
            bar = tqdm(total=len(tasks), initial=done if cache else 0, desc=f"ablation ({dtype})",
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
    return _explode(rows, parts)


def ablation_table(model: nn.Module, windows: Windows, *, parts: bool = False, method: str = "prefix",
                   batch_size: int = 8, cache: bool = True, progress: bool = True,
                   layers: Iterable[int] | None = None, dtype: str = DEFAULT_DTYPE,
                   n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """ΔLoss of removing each decoder block, on ``windows`` (from ``zones.core.data.corpus_windows``).

    One row per block, in depth order:

    =======================  ==============================================================
    ``layer``                block index (0 = first)
    ``loss``                 mean token cross-entropy (nats) with the block removed
    ``base_loss``            the same for the full model, on the same tokens
    ``delta_loss``           ``loss - base_loss``: the block's importance
    ``delta_loss_low/high``  its ``level`` (95%) paired bootstrap interval over windows
    ``n_tokens``             scored tokens
    ``loss_attn``            with only the block's attention output removed (``parts=True``)
    ``delta_loss_attn``      ``loss_attn - base_loss`` (and ``_low``/``_high``)
    ``loss_mlp``             with only the block's MLP output removed (``parts=True``)
    ``delta_loss_mlp``       ``loss_mlp - base_loss`` (and ``_low``/``_high``)
    =======================  ==============================================================

    ``method="prefix"`` reuses each batch's shared prefix; ``"naive"`` runs one full forward
    per ablation (same numbers to float rounding). ``layers`` restricts the sweep to some
    blocks. ``dtype`` is the scoring precision (``"float32"`` or ``"bfloat16"``,
    ``zones.measure.evaluate``). Intervals: ``zones.measure.stats`` (``n_resamples``, ``level``, ``seed``;
    NaN with a single window). With ``cache=True`` the sweep is stored under the model's and
    the windows' fingerprints and resumes after an interruption. A non-finite loss is an error.
    """
    long = ablation_window_losses(model, windows, parts=parts, method=method, batch_size=batch_size, cache=cache,
                                  progress=progress, layers=layers, dtype=dtype)
    return summarize(long, parts, n_resamples=n_resamples, level=level, seed=seed)

