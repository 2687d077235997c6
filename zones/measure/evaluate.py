"""Scoring a model on token windows: mean cross-entropy (nats) and perplexity.

Protocol: non-overlapping windows of ``seq_len`` tokens; inside a window, every token after
the first is predicted from all tokens before it and counted once (``seq_len - 1`` per
window). Loss is the mean over all scored tokens (the token-weighted mean of the windows);
perplexity is ``exp(loss)``. No KV cache is built. Comparisons between models (full vs.
pruned) always use the same windows, and every result keeps its per-window NLL sums, so that
``zones.measure.stats`` can resample windows for a paired interval.

Precision (``dtype``): ``"float32"`` runs the model as it is; ``"bfloat16"`` runs the blocks
under ``torch.autocast`` in bfloat16 (the weights are never changed). The final norm, the LM
head and the log-sum-exp always run in float32, and NLL sums are accumulated in float64.
bfloat16 is refused with one line on a device without native bf16 (an AVX2 CPU emulates it
about 100x slower than float32: ``zones.core.hardware.check_precision``).

Every score is checked: a NaN or infinite loss on any window stops with
``zones.measure.stats.NonFiniteLossError`` naming the variant and the window, never a number.

``evaluate_removals`` scores many sets of removed blocks on the same windows without a full
forward for each: every batch is traced once through the full model (``BlockTrace``), and
the sets are visited in lexicographic order of their membership (block 0 first), so
consecutive sets share the hidden states up to the first block where they differ. Each
(block, removed-prefix) pair runs once per batch, and each set pays one LM head, applied to
chunks of tokens so the (tokens × vocabulary) logits are never held at once. With a
``traces`` dict, the full model's trace of each batch is kept there and reused by the next
call on the same windows (a sweep scored in chunks of sets traces each batch once).

The LM head is the costliest step per scored set (for SmolLM2-135M, 49,152 logits per token:
about eight blocks' worth of multiply-adds plus the log-sum-exp). It runs on ``HEAD_CHUNK``
tokens at a time: 512 tokens' logits (100 MB in float32) are read back by the log-sum-exp
while still largely in cache, where 2,048 tokens' (400 MB) are not; the per-token NLL is the
same to the bit (``benchmarks/bench_book.py --head`` measures both).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.core.adapters import get_adapter
from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.hardware import check_precision
from zones.core.models import check_windows_fit
from zones.measure.blocks import BlockTrace, check_layers
from zones.measure.stats import check_finite

HEAD_CHUNK = 512  # tokens per LM-head call: bounds the logits held at once (see the module note)
DTYPES = ("float32", "bfloat16")
DEFAULT_DTYPE = "float32"


@dataclass(frozen=True)
class LossResult:
    loss: float       # mean cross-entropy per scored token, nats
    n_tokens: int     # scored tokens
    # per-window NLL sums (float64) and scored tokens, in the windows' order
    window_nll: np.ndarray | None = field(default=None, compare=False, repr=False)
    window_tokens: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def ppl(self) -> float:
        return math.exp(self.loss)


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_dtype(dtype: str, model: nn.Module | None = None) -> str:
    """The scoring precision, checked: ``"float32"`` or ``"bfloat16"``; with ``model``,
    bfloat16 on a device without native bf16 is refused (``zones.core.hardware.check_precision``)."""
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    if model is not None:
        check_precision(name, model_device(model), what="scoring dtype")
    return name


def scoring_precision(model: nn.Module, dtype: str = DEFAULT_DTYPE):
    """A context in which the model's blocks run in ``dtype`` (autocast for bfloat16)."""
    if check_dtype(dtype) == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=model_device(model).type, dtype=torch.bfloat16)


def check_fit(model: nn.Module, windows: Windows) -> None:
    """Sequence length and token ids against the model, before any forward
    (``zones.core.models.check_windows_fit``)."""
    check_windows_fit(model, windows)


def _full_precision(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


def head_inputs(adapter, hidden: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
    """What the LM head reads, shape (batch·(length−1), width): the last hidden state of every
    position that predicts a scored token, through the final norm (unless ``normed``), in the
    head's dtype and full precision. Every head-side scorer (loss, KL, top-1) starts here."""
    weight = next(adapter.lm_head().parameters())
    with _full_precision(hidden.device):
        hidden = hidden[:, :-1].to(weight.dtype)
        if not normed:
            hidden = adapter.final_norm()(hidden)
    return hidden.reshape(-1, hidden.shape[-1])


def head_nll_windows(adapter, hidden: torch.Tensor, input_ids: torch.Tensor, *,
                     normed: bool = False) -> np.ndarray:
    """Summed next-token NLL of each window (float64, shape (batch,)) from the last hidden
    state, through the final norm and LM head in full precision.

    ``hidden`` is the input of the final norm (``normed=False``) or its output. The last
    position predicts nothing that is scored, so it is dropped before the head.
    """
    head = adapter.lm_head()
    batch, length = hidden.shape[0], hidden.shape[1] - 1
    hidden = head_inputs(adapter, hidden, normed=normed)
    with _full_precision(hidden.device):
        target = input_ids[:, 1:].reshape(-1).to(hidden.device)
        per_token = torch.empty(target.shape[0], dtype=torch.float64, device=hidden.device)
        for start in range(0, target.shape[0], HEAD_CHUNK):
            logits = head(hidden[start:start + HEAD_CHUNK]).float()
            t = target[start:start + HEAD_CHUNK]
            nll = torch.logsumexp(logits, dim=-1) - logits.gather(1, t[:, None])[:, 0]
            per_token[start:start + HEAD_CHUNK] = nll.double()
    return per_token.reshape(batch, length).sum(-1).cpu().numpy()


def forward_nll_windows(model: nn.Module, input_ids: torch.Tensor) -> np.ndarray:
    """Per-window NLL sums of one plain forward: the model's body (in the current precision),
    then its LM head in full precision."""
    hidden = model.base_model(input_ids=input_ids, use_cache=False)[0]  # after the final norm
    return head_nll_windows(get_adapter(model), hidden, input_ids, normed=True)


def _batches(windows: Windows, batch_size: int) -> list[torch.Tensor]:
    if windows.n_windows == 0:
        raise ValueError("no windows to score")
    return list(windows.input_ids.split(check_int(batch_size, "batch_size", min=1)))


def _result(nll: np.ndarray, tokens: np.ndarray) -> LossResult:
    return LossResult(float(nll.sum() / tokens.sum()), int(tokens.sum()), nll, tokens)


def loss_name(windows: Windows) -> str:
    """How an error names a loss: ``"loss on the eval windows"``."""
    return f"loss on the {windows.split} windows" if windows.split else "loss"


def removal_label(removed: Iterable[int]) -> str:
    """How an error names a removal set: ``"of the full model"``, ``"with blocks [3, 7] removed"``."""
    removed = sorted(int(b) for b in removed)
    if not removed:
        return "of the full model"
    return f"with block{'s' if len(removed) > 1 else ''} {removed if len(removed) > 1 else removed[0]} removed"


def evaluate_loss(model: nn.Module, windows: Windows, batch_size: int = 8,
                  progress: bool = False, dtype: str = DEFAULT_DTYPE) -> LossResult:
    """Mean token cross-entropy of ``model`` on ``windows`` (one full forward per batch)."""
    dtype = check_dtype(dtype, model)
    batches = _batches(windows, batch_size)
    check_fit(model, windows)
    device = model_device(model)
    parts = []
    with torch.inference_mode(), scoring_precision(model, dtype):
        for ids in tqdm(batches, desc="scoring", disable=not progress, leave=False):
            parts.append(forward_nll_windows(model, ids.to(device)))
    nll = np.concatenate(parts)
    check_finite(nll[None], lambda _: "of the model", loss_name(windows))
    return _result(nll, np.full(len(nll), windows.seq_len - 1, dtype=np.int64))


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
                      batch_size: int = 8, progress: bool = True, desc: str = "removal sets",
                      dtype: str = DEFAULT_DTYPE, traces: dict | None = None) -> list[LossResult]:
    """Mean token loss with each set of blocks in ``removals`` skipped, all on the same
    windows, in the order given (an empty set is the full model). Equals ``evaluate_loss``
    under ``skip_blocks`` for each set, to float rounding; shared prefixes run once per batch.
    Each result keeps its per-window NLL sums (``window_nll``, ``window_tokens``).

    ``traces``: a dict in which the full model's trace of each batch is kept and reused by
    later calls with the same dict, windows, batch size and dtype (it holds every block's
    input for every batch: blocks × tokens × hidden size floats).
    """
    dtype = check_dtype(dtype, model)
    sets = [tuple(check_layers(model, r)) for r in removals]
    batches = _batches(windows, batch_size)
    check_fit(model, windows)
    adapter = get_adapter(model)
    n = adapter.n_blocks
    order = tree_order(sets, n)
    device = model_device(model)
    nll = np.zeros((len(sets), windows.n_windows))
    bar = tqdm(total=len(batches) * len(sets), desc=desc, disable=not progress, leave=False)
    first = 0
    for ids in batches:
        ids = ids.to(device)
        rows = slice(first, first + ids.shape[0])
        with scoring_precision(model, dtype):
            key = (id(model), windows.fingerprint, first, ids.shape[0], dtype)
            trace = traces.get(key) if traces is not None else None
            if trace is None:
                trace = BlockTrace(model, ids)
                if traces is not None:
                    traces[key] = trace
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
                    nll[j, rows] = head_nll_windows(adapter, path[n], ids)
                    bar.update()
        # Smallest sets first: a broken full model is named as such, not by a set containing it.
        by_size = sorted(range(len(sets)), key=lambda j: len(sets[j]))
        check_finite(nll[by_size, rows], lambda i: removal_label(sets[by_size[i]]), loss_name(windows),
                     first_window=first, n_windows=windows.n_windows)
        first += ids.shape[0]
        del trace, path
    bar.close()
    tokens = np.full(windows.n_windows, windows.seq_len - 1, dtype=np.int64)
    return [_result(nll[j], tokens) for j in range(len(sets))]
