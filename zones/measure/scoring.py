"""Scoring a model on token windows: mean cross-entropy (nats) and perplexity.

Protocol: non-overlapping windows of ``seq_len`` tokens; inside a window, every token after
the first is predicted from all tokens before it and counted once (``seq_len - 1`` per
window). Loss is the mean over all scored tokens (the token-weighted mean of the windows);
perplexity is ``exp(loss)``. No KV cache is built. Comparisons between models (full vs.
pruned) always use the same windows, and every result keeps its per-window NLL sums, so that
``zones.measure.bootstrap`` can resample windows for a paired interval.

Precision (``dtype``, resolved at the door by ``zones.measure.subject``): ``"float32"`` runs the
model as it is; ``"bfloat16"`` runs the blocks under ``torch.autocast`` in bfloat16 (the weights
are never changed); ``"auto"`` is bfloat16 where it is native and float32 elsewhere. The final
norm, the LM head and the log-sum-exp always run in float32, and NLL sums are accumulated in
float64. bfloat16 is refused with one line on a device without native bf16 (an AVX2 CPU
emulates it about 100x slower than float32: ``zones.core.hardware.check_precision``).

Every score is checked: a NaN or infinite loss on any window stops with
``zones.measure.bootstrap.NonFiniteLossError`` naming the variant and the window, never a number.

:func:`score_windows` is the one scorer of removals (sets of blocks and/or sublayers,
``zones.measure.sublayer_removal``): every batch of windows is traced once through the full model
(``BlockTrace``); sets of whole blocks are visited in lexicographic order of their membership
(block 0 first), so consecutive sets share the hidden states up to the first block where they
differ, and a set with sublayers removed starts at its first affected block. Each set pays one
LM head, applied to chunks of tokens so the (tokens × vocabulary) logits are never held at
once. With ``cache=True`` every (batch, removal) is kept in the per-window loss store
(``zones.measure.store``) and never computed again, by this call or any other on the same
model, batch and precision; an interrupted sweep resumes from the sets already stored.
``evaluate_removals`` (block sets) and ``evaluate_loss`` (the full model) are its two common
uses; ``zones.measure.ablation`` and ``zones.measure.agreement`` read the same store.

The LM head is the costliest step per scored set (for SmolLM2-135M, 49,152 logits per token:
about eight blocks' worth of multiply-adds plus the log-sum-exp). It runs on ``HEAD_CHUNK``
tokens at a time: 512 tokens' logits (100 MB in float32) are read back by the log-sum-exp
while still largely in cache, where 2,048 tokens' (400 MB) are not. On a CPU the passes over the
vocabulary (the log-sum-exp's max, exp and sum; KL; argmax) then visit a chunk ``ROW_BLOCK_BYTES``
of logits at a time: 3 MB (16 rows of SmolLM2's) stay in the core's cache between those passes,
where a chunk's go back to memory after each; a small vocabulary's chunk fits whole and is one
block. The rows are independent, so neither the chunk nor the row block changes a number, to the
bit (``benchmarks/bench_book.py --head 512:1000000,512:16`` measures them). On a CPU the head's
product itself is computed ``VOCAB_BLOCK`` columns at a time (:func:`head_pass`): each block of
a chunk's logits (4 MB) is read by the log-sum-exp (a running max and a rescaled sum) and the
target's logit while still in cache, and the loss alone never writes a chunk's logits to memory.
KL from the full model and top-1 agreement (``metrics``) come from the same logits, and their NLL
is the same to the bit as the loss alone (the same blocks, in the same order).
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

from zones.core.checks import check_blocks, check_int
from zones.core.data import Windows
from zones.core.progress import add_flops, matmul_flops, module_weights
from zones.measure.blocks import BlockTrace
from zones.measure.bootstrap import check_finite
from zones.measure.store import METRICS, chunk_digest, open_store
from zones.measure.subject import (  # noqa: F401  (the precision names are imported from here too)
    AUTO,
    DEFAULT_DTYPE,
    DTYPES,
    Subject,
    as_subject,
    check_dtype,
    model_device,
)
from zones.measure.sublayer_removal import Removal, format_removal, normalize_removal, removal_hidden, whole_blocks

HEAD_CHUNK = 512  # tokens per LM-head call: bounds the logits held at once (see the module note)
VOCAB_BLOCK = 2048  # logits columns per LM-head product on a CPU: 4 MB of a chunk, read from cache (see the module note)
SETS_PER_PASS = 32  # removals scored on a batch before they are checked and stored together
BASE_LOGP_BYTES = 512 * 2 ** 20  # the full model's log-probabilities of a batch are kept when they fit
ROW_BLOCK_BYTES = 3 * 2 ** 20  # logits per vocabulary-wide pass on a CPU: in a core's cache (16 rows of 49,152 float32)


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


def scoring_precision(model: nn.Module | Subject, dtype: str = DEFAULT_DTYPE):
    """A context in which the model's blocks run in ``dtype`` (autocast for bfloat16)."""
    return as_subject(model, dtype).precision()


def check_fit(model: nn.Module | Subject, windows: Windows) -> None:
    """Sequence length and token ids against the model, before any forward
    (``zones.core.models.check_windows_fit``)."""
    as_subject(model).check_fit(windows)


def _full_precision(device: torch.device):
    return torch.autocast(device_type=device.type, enabled=False)


# --- the LM head: every head-side scorer (loss, KL, top-1) starts here ---------------------------

def row_blocks(logits: torch.Tensor) -> list[slice]:
    """The row blocks in which the vocabulary-wide passes read a chunk of ``logits`` (rows ×
    vocabulary): ``ROW_BLOCK_BYTES`` at a time on a CPU (each block's max, exp and sum then read
    it from cache, not memory; a small vocabulary's chunk is one block, not many small calls), all
    of it at once elsewhere (a GPU wants few, large kernels). Each row's numbers do not depend on
    the block it is in."""
    n = logits.shape[0]
    row_bytes = max(1, logits.shape[-1] * logits.element_size())
    step = max(1, ROW_BLOCK_BYTES // row_bytes) if logits.device.type == "cpu" else max(n, 1)
    return [slice(s, min(s + step, n)) for s in range(0, n, step)]


def head_inputs(adapter, hidden: torch.Tensor, *, normed: bool = False) -> torch.Tensor:
    """What the LM head reads, shape (batch·(length−1), width): the last hidden state of every
    position that predicts a scored token, through the final norm (unless ``normed``), in the
    head's dtype and full precision."""
    weight = next(adapter.lm_head().parameters())
    with _full_precision(hidden.device):
        hidden = hidden[:, :-1].to(weight.dtype)
        if not normed:
            hidden = adapter.final_norm()(hidden)
    return hidden.reshape(-1, hidden.shape[-1])


def _logits(adapter, inputs: torch.Tensor, start: int) -> torch.Tensor:
    """float32 logits of ``HEAD_CHUNK`` head inputs from ``start`` (the work is counted)."""
    head = adapter.lm_head()
    part = inputs[start:start + HEAD_CHUNK]
    add_flops(matmul_flops(module_weights(head), part.shape[0]))
    return head(part).float()


def vocab_blocks(head: nn.Module, device: torch.device) -> list[slice]:
    """The vocabulary blocks an LM head's product is computed in: ``VOCAB_BLOCK`` columns at a time
    for a linear head on a CPU, the whole vocabulary otherwise (a GPU wants few, large kernels)."""
    vocab = head.weight.shape[0] if isinstance(head, nn.Linear) else None
    if vocab is None or device.type != "cpu":
        return [slice(None)]
    return [slice(v, min(v + VOCAB_BLOCK, vocab)) for v in range(0, vocab, VOCAB_BLOCK)]


def head_pass(adapter, inputs: torch.Tensor, start: int, target: torch.Tensor, keep: bool = False):
    """One chunk of ``HEAD_CHUNK`` head inputs from ``start`` through the LM head, a vocabulary
    block at a time (:func:`vocab_blocks`): each block's logits are read for the log-sum-exp and the
    target's logit while they are still in cache. Returns (log-sum-exp, target logit) per token,
    float32, and with ``keep`` the chunk's float32 logits too (else None). The log-sum-exp is
    combined over blocks (running max and rescaled sum), so every head scorer (loss, KL, top-1)
    gets the same bits from it. The work is counted."""
    head = adapter.lm_head()
    part = inputs[start:start + HEAD_CHUNK]
    add_flops(matmul_flops(module_weights(head), part.shape[0]))
    blocks = vocab_blocks(head, part.device)
    if blocks == [slice(None)]:
        whole = head(part).float()
        logits = whole if keep else None
        blocks, compute = [slice(0, whole.shape[1])], (lambda cols: whole[:, cols])
    else:
        weight, bias = head.weight, head.bias
        logits = torch.empty(part.shape[0], weight.shape[0], device=part.device) if keep else None
        if logits is not None and bias is None and weight.dtype == torch.float32:  # written in place: no copy
            compute = (lambda cols: torch.mm(part, weight[cols].t(), out=logits[:, cols]))
        else:
            compute = (lambda cols: nn.functional.linear(part, weight[cols], None if bias is None else bias[cols])
                       .float())
    top = total = None
    picked = torch.empty(part.shape[0], device=part.device)
    for cols in blocks:
        block = compute(cols)
        if logits is not None and block.data_ptr() != logits[:, cols].data_ptr():
            logits[:, cols] = block
        mine = ((target >= cols.start) & (target < cols.stop)).nonzero()[:, 0]
        picked[mine] = block[mine, target[mine] - cols.start]
        high = block.amax(dim=1)
        if top is None:
            top, total = high, (block - high[:, None]).exp_().sum(dim=1)
        else:
            new = torch.maximum(top, high)
            total = total * (top - new).exp_() + (block - new[:, None]).exp_().sum(dim=1)
            top = new
    return top + total.log(), picked, logits


def head_nll_windows(adapter, hidden: torch.Tensor, input_ids: torch.Tensor, *,
                     normed: bool = False) -> np.ndarray:
    """Summed next-token NLL of each window (float64, shape (batch,)) from the last hidden
    state, through the final norm and LM head in full precision.

    ``hidden`` is the input of the final norm (``normed=False``) or its output. The last
    position predicts nothing that is scored, so it is dropped before the head.
    """
    batch, length = hidden.shape[0], hidden.shape[1] - 1
    with torch.inference_mode():
        inputs = head_inputs(adapter, hidden, normed=normed)
        with _full_precision(inputs.device):
            target = input_ids[:, 1:].reshape(-1).to(inputs.device)
            per_token = torch.empty(target.shape[0], dtype=torch.float64, device=inputs.device)
            for start in range(0, target.shape[0], HEAD_CHUNK):
                lse, picked, _ = head_pass(adapter, inputs, start, target[start:start + HEAD_CHUNK])
                per_token[start:start + lse.shape[0]] = (lse - picked).double()
    return per_token.reshape(batch, length).sum(-1).cpu().numpy()


def base_log_probs(adapter, base_hidden: torch.Tensor) -> list[torch.Tensor] | None:
    """The full model's next-token log-probabilities (float32) in chunks of ``HEAD_CHUNK``
    tokens, or ``None`` when they would take more than ``BASE_LOGP_BYTES`` (then recomputed
    per variant by :func:`head_metrics`)."""
    tokens = base_hidden.shape[0] * (base_hidden.shape[1] - 1)
    vocab = next(adapter.lm_head().parameters()).shape[0]
    if tokens * vocab * 4 > BASE_LOGP_BYTES:
        return None
    with torch.inference_mode():
        inputs = head_inputs(adapter, base_hidden)
        with _full_precision(inputs.device):
            return [_log_probs(_logits(adapter, inputs, s)) for s in range(0, tokens, HEAD_CHUNK)]


def _log_probs(logits: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(logits)
    for rows in row_blocks(logits):
        out[rows] = logits[rows] - torch.logsumexp(logits[rows], dim=-1, keepdim=True)
    return out


def head_metrics(adapter, hidden: torch.Tensor, base_hidden: torch.Tensor, input_ids: torch.Tensor,
                 base: list[torch.Tensor] | None = None) -> dict:
    """Per-window sums (float64, shape (batch,)) of ``nll``, ``kl`` (KL(full ‖ reduced), nats)
    and ``top1`` (tokens whose argmax agrees with the full model's), from the last hidden
    states (before the final norm) of the reduced model (``hidden``) and of the full model
    (``base_hidden``; or its :func:`base_log_probs` as ``base``). ``nll`` equals
    :func:`head_nll_windows` to the bit."""
    batch, length = hidden.shape[0], hidden.shape[1] - 1
    out = {m: torch.empty(batch * length, dtype=torch.float64, device=hidden.device) for m in METRICS}
    with torch.inference_mode():
        h = head_inputs(adapter, hidden)
        b = head_inputs(adapter, base_hidden) if base is None else None
        with _full_precision(hidden.device):
            target = input_ids[:, 1:].reshape(-1).to(hidden.device)
            for i, s in enumerate(range(0, target.shape[0], HEAD_CHUNK)):
                lses, picked, chunk = head_pass(adapter, h, s, target[s:s + HEAD_CHUNK], keep=True)
                base_chunk = _log_probs(_logits(adapter, b, s)) if base is None else base[i]
                for rows in row_blocks(chunk):
                    part = slice(s + rows.start, s + rows.stop)
                    logits, logp, lse = chunk[rows], base_chunk[rows], lses[rows]
                    out["nll"][part] = (lse - picked[rows]).double()
                    logq = logits - lse[:, None]
                    out["kl"][part] = (logp.exp() * (logp - logq)).double().sum(-1).clamp_min(0.0)
                    out["top1"][part] = (logits.argmax(-1) == logp.argmax(-1)).double()
    return {m: v.reshape(batch, length).sum(-1).cpu().numpy() for m, v in out.items()}


def forward_nll_windows(model: nn.Module, input_ids: torch.Tensor) -> np.ndarray:
    """Per-window NLL sums of one plain forward: the model's body (in the current precision),
    then its LM head in full precision."""
    subject = as_subject(model)
    hidden = model.base_model(input_ids=input_ids, use_cache=False)[0]  # after the final norm
    for block in subject.adapter.blocks():
        add_flops(matmul_flops(module_weights(block), input_ids.numel()))
    return head_nll_windows(subject.adapter, hidden, input_ids, normed=True)


# --- names for errors ----------------------------------------------------------------------------

def _batches(windows: Windows, batch_size: int) -> list[torch.Tensor]:
    if windows.n_windows == 0:
        raise ValueError("no windows to score")
    return list(windows.input_ids.split(check_int(batch_size, "batch_size", min=1)))


def _result(nll: np.ndarray, tokens: np.ndarray) -> LossResult:
    return LossResult(float(nll.sum() / tokens.sum()), int(tokens.sum()), nll, tokens)


def loss_name(windows: Windows) -> str:
    """How an error names a loss: ``"loss on the eval windows"``."""
    return f"loss on the {windows.split} windows" if windows.split else "loss"


def removal_label(removed: Iterable) -> str:
    """How an error names a removal: ``"of the full model"``, ``"with blocks [3, 7] removed"``,
    ``"without 5:attn"`` (a removal with sublayers, ``zones.measure.sublayer_removal.format_removal``)."""
    removed = list(removed)
    if removed and not all(isinstance(r, (int, np.integer)) for r in removed):
        pairs = tuple(removed)
        blocks = whole_blocks(pairs)
        if 2 * len(blocks) != len(pairs):
            return f"without {format_removal(pairs)}"
        removed = blocks
    removed = sorted(int(b) for b in removed)
    if not removed:
        return "of the full model"
    return f"with block{'s' if len(removed) > 1 else ''} {removed if len(removed) > 1 else removed[0]} removed"


# --- the plain loss ------------------------------------------------------------------------------

def evaluate_loss(model: nn.Module | Subject, windows: Windows, batch_size: int = 8,
                  progress: bool = False, dtype: str | None = None, *, cache: bool = False) -> LossResult:
    """Mean token cross-entropy of ``model`` on ``windows``: one full forward per batch, or,
    with ``cache=True``, the full model's row of the loss store (:func:`score_windows`; the
    same number as the base of every removal scored there)."""
    subject = as_subject(model, dtype)
    if cache:
        return evaluate_removals(subject, windows, [[]], batch_size=batch_size, progress=progress, cache=True)[0]
    batches = _batches(windows, batch_size)
    subject.check_fit(windows)
    parts = []
    with torch.inference_mode(), subject.precision():
        for ids in tqdm(batches, desc="scoring", disable=not progress, leave=False):
            parts.append(forward_nll_windows(subject.model, ids.to(subject.device)))
    nll = np.concatenate(parts)
    check_finite(nll[None], lambda _: "of the model", loss_name(windows))
    return _result(nll, np.full(len(nll), windows.seq_len - 1, dtype=np.int64))


# --- many removals on the same windows -----------------------------------------------------------

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


def _visit_order(removals: list[Removal], n: int) -> list[Removal]:
    """Sets of whole blocks in prefix-tree order, then the sets with sublayers by their first
    affected block."""
    blocks = [r for r in removals if 2 * len(whole_blocks(r)) == len(r)]
    partial = [r for r in removals if 2 * len(whole_blocks(r)) != len(r)]
    order = [blocks[j] for j in tree_order([whole_blocks(r) for r in blocks], n)]
    return order + sorted(partial, key=lambda r: (min(layer for layer, _ in r), format_removal(r)))


class _ChunkScorer:
    """The removals of one batch: its trace, the path of the previous set of whole blocks, and
    the full model's head outputs, each computed once."""

    def __init__(self, subject: Subject, ids: torch.Tensor, metrics: tuple[str, ...], traces: dict | None,
                 digest: str):
        self.subject, self.ids, self.metrics = subject, ids, metrics
        n = subject.n_blocks
        key = (id(subject.model), digest, subject.dtype)
        self.trace = traces.get(key) if traces is not None else None
        if self.trace is None:
            with subject.precision():
                self.trace = BlockTrace(subject.model, ids, subject.adapter)
            if traces is not None:
                traces[key] = self.trace
        # path[b]: input of block b under the previous set of whole blocks; path[n]: its last hidden state
        self.path = [self.trace.block_input(b) for b in range(n)] + [self.trace.final_hidden]
        self.previous: set[int] = set()
        self.logp = base_log_probs(subject.adapter, self.trace.final_hidden) if metrics != ("nll",) else None

    def _blocks_hidden(self, removed: set[int]) -> torch.Tensor:
        n, trace, path = self.subject.n_blocks, self.trace, self.path
        diff = removed ^ self.previous
        if diff:
            start = _restart(path, trace, n, min(diff), min(removed, default=n))
            hidden = path[start]
            for b in range(start, n):
                path[b] = hidden
                if b not in removed:
                    hidden = trace.run_block(b, hidden)
            path[n] = hidden
        self.previous = removed
        return path[n]

    def values(self, removal: Removal) -> dict[str, np.ndarray]:
        """The metrics of ``removal`` on this batch (called inside :func:`_scoring_region`)."""
        adapter = self.subject.adapter
        if 2 * len(whole_blocks(removal)) == len(removal):
            hidden = self._blocks_hidden(set(whole_blocks(removal)))
        else:
            hidden = removal_hidden(self.trace, removal)
        if self.metrics == ("nll",):
            return dict(nll=head_nll_windows(adapter, hidden, self.ids))
        found = head_metrics(adapter, hidden, self.trace.final_hidden, self.ids, self.logp)
        return {m: found[m] for m in self.metrics}


@contextlib.contextmanager
def _scoring_region(subject: Subject):
    """One region for all the removals of a batch: no autograd, and the scoring precision. Under
    bfloat16 autocast, ``no_grad`` (not ``inference_mode``) lets autocast keep each weight's bf16
    copy for the whole region instead of casting it again at every block run (the numbers are the
    same: the same casts of the same weights)."""
    with torch.no_grad(), subject.precision():
        yield


def _check_metrics(metrics) -> tuple[str, ...]:
    metrics = tuple(dict.fromkeys(("nll", *metrics)))
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; choose from {METRICS}")
    return tuple(m for m in METRICS if m in metrics)


def score_windows(model: nn.Module | Subject, windows: Windows, removals: Sequence, *,
                  metrics: Sequence[str] = ("nll",), batch_size: int = 8, dtype: str | None = None,
                  cache: bool = False, progress: bool = True, desc: str = "removal sets",
                  traces: dict | None = None) -> dict[str, np.ndarray]:
    """Per-window sums of ``metrics`` (``nll``; ``kl`` and ``top1`` against the full model,
    ``head_metrics``) of the model with each removal in ``removals``, all on the same windows:
    a dict metric → array (removals, windows), in the order given.

    A removal is a set of blocks and/or sublayers in any notation of
    ``zones.measure.sublayer_removal.normalize_removal`` (``[3, 7]``, ``[(5, "attn")]``, ``"3,5:mlp"``);
    an empty one is the full model. Equals ``evaluate_loss`` under ``skip_blocks`` /
    ``removed_sublayers`` for each, to float rounding. ``cache=True`` reads and writes the
    per-window loss store (module note); ``traces``: a dict in which the full model's trace of
    each batch is kept for later calls with the same dict (blocks × tokens × width floats).
    """
    subject = as_subject(model, dtype)
    metrics = _check_metrics(metrics)
    n = subject.n_blocks
    sets = [normalize_removal(r, n) for r in removals]
    batches = _batches(windows, batch_size)
    subject.check_fit(windows)
    store = open_store(subject.key()) if cache else None
    labels = {s: format_removal(s) for s in sets}
    distinct = list(dict.fromkeys(sets))
    digests = [chunk_digest(ids) for ids in batches]
    todo = [[s for s in distinct if store is None or store.get(d, labels[s], metrics) is None] for d in digests]
    out = {m: np.zeros((len(sets), windows.n_windows)) for m in metrics}
    bar = tqdm(total=sum(map(len, todo)), desc=f"{desc} ({subject.dtype})", disable=not progress, leave=False)
    first = 0
    for ids, digest, missing in zip(batches, digests, todo):
        ids = ids.to(subject.device)
        found = {s: store.get(digest, labels[s], metrics) for s in distinct if s not in missing} if store else {}
        if missing:
            found.update(_score_chunk(subject, windows, ids, first, digest, missing, metrics, store, traces, bar))
        for j, s in enumerate(sets):
            for m in metrics:
                out[m][j, first:first + ids.shape[0]] = found[s][m]
        first += ids.shape[0]
    bar.close()
    return out


def _score_chunk(subject: Subject, windows: Windows, ids: torch.Tensor, first: int, digest: str,
                 missing: list[Removal], metrics: tuple[str, ...], store, traces: dict | None, bar) -> dict:
    """Score the ``missing`` removals on one batch, check them and store them, a pass of
    ``SETS_PER_PASS`` at a time (the full model is checked first, so a broken full model is
    named as such, not by a set containing it)."""
    with _scoring_region(subject):
        return _score_passes(subject, windows, ids, first, digest, missing, metrics, store, traces, bar)


def _score_passes(subject: Subject, windows: Windows, ids: torch.Tensor, first: int, digest: str,
                  missing: list[Removal], metrics: tuple[str, ...], store, traces: dict | None, bar) -> dict:
    scorer = _ChunkScorer(subject, ids, metrics, traces, digest)
    what = loss_name(windows)
    stored = store.get(digest, "", metrics) if store is not None else None
    base = {m: np.asarray(v) for m, v in stored.items() if m in metrics} if stored else scorer.values(())
    check_finite(base["nll"][None], lambda _: "of the full model", what, first_window=first,
                 n_windows=windows.n_windows)
    found = {}
    order = _visit_order(missing, subject.n_blocks)
    for start in range(0, len(order), SETS_PER_PASS):
        group = order[start:start + SETS_PER_PASS]
        values = {}
        for removal in group:
            values[removal] = base if not removal else scorer.values(removal)
            bar.update()
        by_size = sorted(group, key=len)  # a set's error is named by the smallest broken set
        for m in ("nll", "kl") if "kl" in metrics else ("nll",):
            check_finite(np.stack([values[r][m] for r in by_size]),
                         lambda i: removal_label(by_size[i]) if m == "nll" else f"({m}) without "
                         f"{format_removal(by_size[i]) or 'nothing'}", what, first_window=first,
                         n_windows=windows.n_windows)
        if store is not None:
            for removal in group:
                store.append(digest, format_removal(removal), values[removal])
        found.update(values)
    return found


def evaluate_removals(model: nn.Module | Subject, windows: Windows, removals: Sequence[Iterable[int]], *,
                      batch_size: int = 8, progress: bool = True, desc: str = "removal sets",
                      dtype: str | None = None, traces: dict | None = None, cache: bool = False) -> list[LossResult]:
    """Mean token loss with each set of blocks in ``removals`` skipped, all on the same
    windows, in the order given (an empty set is the full model): :func:`score_windows` with
    its per-window NLL sums kept in each result (``window_nll``, ``window_tokens``)."""
    subject = as_subject(model, dtype)
    sets = [check_blocks(r, f"removals[{j}]", subject.n_blocks) for j, r in enumerate(removals)]
    nll = score_windows(subject, windows, sets, batch_size=batch_size, cache=cache, progress=progress, desc=desc,
                        traces=traces)["nll"]
    tokens = np.full(windows.n_windows, windows.seq_len - 1, dtype=np.int64)
    return [_result(nll[j], tokens) for j in range(len(sets))]
