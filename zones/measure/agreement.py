"""Beyond perplexity: how far a reduced model's next-token distribution moves from the full model's.

For every scored token t of a window, with p the full model's next-token distribution and
q the reduced model's (a block or sublayers removed, ``zones.measure.sublayers``):

* ``nll``: −log q(x_{t+1}) (the loss of ``zones.measure.evaluate``, summed per window);
* ``kl``: KL(p ‖ q) = Σ_v p_v (log p_v − log q_v), nats (0 for the full model itself);
* ``top1``: 1 when argmax q = argmax p (counted per window; 1 per token for the full model).

All three are summed per eval window, like the NLL, so each reduced model gets paired
bootstrap intervals over windows (``zones.measure.stats.paired_bootstrap``: the same resample of
windows for every variant): ``summarize_agreement`` reports ΔLoss, mean KL per token and the
top-1 agreement rate with their 95% intervals.

``zones.measure.evaluate`` scores only the loss; the per-token logits needed here come from this
module's :func:`head_metrics`, which applies the final norm and LM head in chunks of tokens
(float32 log-probabilities, float64 sums), so the (tokens × vocabulary)
logits of both models are never held at once.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.core.adapters import get_adapter
from zones.core.cache import cached_table
from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.models import model_fingerprint
from zones.measure.blocks import BlockTrace
from zones.measure.evaluate import (
    DEFAULT_DTYPE,
    check_dtype,
    check_fit,
    head_inputs,
    loss_name,
    model_device,
    scoring_precision,
)
from zones.measure.stats import (
    LEVEL,
    N_RESAMPLES,
    SEED,
    check_finite,
    delta_loss_interval,
    interval_columns,
    paired_bootstrap,
)
from zones.measure.sublayers import format_removal, normalize_removal, removal_hidden

VERSION = "1"
METRICS = ("nll", "kl", "top1")
# Tokens per LM-head call: two (tokens × vocabulary) float32 log-probability tables are held at
# once (256 × 49,152 × 4 bytes ≈ 50 MB each for SmolLM2).
CHUNK = 256
WINDOW_COLUMNS = ["removed", "window", "nll", "base_nll", "kl", "top1", "n_tokens"]
SUMMARY_COLUMNS = ["removed", "loss", "delta_loss", "delta_loss_low", "delta_loss_high", "kl", "kl_low", "kl_high",
                   "top1", "top1_low", "top1_high", "n_tokens"]


CACHE_BYTES = 512 * 2 ** 20  # the full model's log-probabilities of a batch are kept when they fit in this


def _head_inputs(adapter, hidden: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return head_inputs(adapter, hidden)


def base_log_probs(adapter, base_hidden: torch.Tensor) -> list[torch.Tensor] | None:
    """The full model's next-token log-probabilities (float32) in chunks of ``CHUNK`` tokens,
    or ``None`` when they would take more than ``CACHE_BYTES`` (then recomputed per variant)."""
    tokens = base_hidden.shape[0] * (base_hidden.shape[1] - 1)
    vocab = adapter.lm_head().weight.shape[0]
    if tokens * vocab * 4 > CACHE_BYTES:
        return None
    b = _head_inputs(adapter, base_hidden)
    with torch.inference_mode(), torch.autocast(device_type=b.device.type, enabled=False):
        return [torch.log_softmax(adapter.lm_head()(b[s:s + CHUNK]).float(), dim=-1) for s in range(0, tokens, CHUNK)]


def head_metrics(adapter, hidden: torch.Tensor, base_hidden: torch.Tensor, input_ids: torch.Tensor,
                 base: list[torch.Tensor] | None = None) -> dict:
    """Per-window sums (float64, shape (batch,)) of ``nll``, ``kl`` (KL(full ‖ reduced)) and
    ``top1`` (tokens whose argmax agrees), from the last hidden states (before the final norm)
    of the reduced model (``hidden``) and of the full model (``base_hidden``; or its
    :func:`base_log_probs` as ``base``)."""
    head = adapter.lm_head()
    batch, length = hidden.shape[0], hidden.shape[1] - 1
    out = {m: torch.empty(batch * length, dtype=torch.float64, device=hidden.device) for m in METRICS}
    h = _head_inputs(adapter, hidden)
    b = _head_inputs(adapter, base_hidden) if base is None else None
    with torch.inference_mode(), torch.autocast(device_type=hidden.device.type, enabled=False):
        target = input_ids[:, 1:].reshape(-1).to(hidden.device)
        for i, s in enumerate(range(0, target.shape[0], CHUNK)):
            part = slice(s, s + CHUNK)
            logq = torch.log_softmax(head(h[part]).float(), dim=-1)
            logp = torch.log_softmax(head(b[part]).float(), dim=-1) if base is None else base[i]
            out["nll"][part] = -logq.gather(1, target[part, None])[:, 0].double()
            out["kl"][part] = (logp.exp() * (logp - logq)).double().sum(-1).clamp_min(0.0)
            out["top1"][part] = (logq.argmax(-1) == logp.argmax(-1)).double()
    return {m: v.reshape(batch, length).sum(-1).cpu().numpy() for m, v in out.items()}


def _score(model: nn.Module, windows: Windows, removals: list, batch_size: int, dtype: str,
           progress: bool) -> pd.DataFrame:
    adapter = get_adapter(model)
    device = model_device(model)
    values = {m: np.zeros((len(removals), windows.n_windows)) for m in METRICS}
    base = np.zeros(windows.n_windows)
    first = 0
    bar = tqdm(total=len(removals) * windows.n_windows, desc="agreement (KL, top-1)", unit="window",
               disable=not progress, leave=False)
    for ids in windows.input_ids.split(batch_size):
        ids = ids.to(device)
        cols = slice(first, first + ids.shape[0])
        with torch.inference_mode(), scoring_precision(model, dtype):
            trace = BlockTrace(model, ids)
            logp = base_log_probs(adapter, trace.final_hidden)
            base[cols] = head_metrics(adapter, trace.final_hidden, trace.final_hidden, ids, logp)["nll"]
            for j, removal in enumerate(removals):
                metrics = head_metrics(adapter, removal_hidden(trace, removal), trace.final_hidden, ids, logp)
                for m in METRICS:
                    values[m][j, cols] = metrics[m]
                bar.update(ids.shape[0])
        labels = [format_removal(r) or "none" for r in removals]
        check_finite(base[None, cols], lambda _: "of the full model", loss_name(windows), first_window=first,
                     n_windows=windows.n_windows)
        for m in METRICS:
            check_finite(values[m][:, cols], lambda v: f"({m}) without {labels[v]}", loss_name(windows),
                         first_window=first, n_windows=windows.n_windows)
        first += ids.shape[0]
        del trace, logp
    bar.close()
    tokens = windows.seq_len - 1
    rows = [dict(removed=format_removal(r), window=w, nll=values["nll"][j, w], base_nll=base[w],
                 kl=values["kl"][j, w], top1=values["top1"][j, w], n_tokens=tokens)
            for j, r in enumerate(removals) for w in range(windows.n_windows)]
    return pd.DataFrame(rows, columns=WINDOW_COLUMNS)


def agreement_window_losses(model: nn.Module, windows: Windows, removals: Sequence[Iterable], *,
                            batch_size: int = 8, dtype: str = DEFAULT_DTYPE, cache: bool = True,
                            progress: bool = True) -> pd.DataFrame:
    """NLL, KL from the full model and top-1 agreement of every removal on every window.

    ``removals``: sets of blocks and/or sublayers (``zones.measure.sublayers.normalize_removal``:
    ``[3, (5, "attn")]`` or ``"3,5:attn"``; an empty set is the full model). One row per
    (removal, window): ``removed`` (``zones.measure.sublayers.format_removal``), ``window``, ``nll``,
    ``base_nll`` (the full model's), ``kl``, ``top1`` (sums over the window's tokens),
    ``n_tokens``. Each batch is traced once; a removal re-runs only the blocks from its first
    affected one. Cached under the model's and windows' fingerprints.
    """
    batch_size = check_int(batch_size, "batch_size", min=1)
    dtype = check_dtype(dtype)
    n = get_adapter(model).n_blocks
    sets = list(dict.fromkeys(normalize_removal(r, n) for r in removals))
    if not sets:
        raise ValueError("removals is empty: give at least one set of blocks or sublayers")
    check_fit(model, windows)
    compute = lambda: _score(model, windows, sets, batch_size, dtype, progress)  # noqa: E731
    if not cache:
        return compute()
    key = dict(kind="agreement", version=VERSION, model=model_fingerprint(model), windows=windows.fingerprint,
               n_windows=windows.n_windows, removals=[format_removal(s) for s in sets], batch_size=batch_size,
               dtype=dtype, device=model_device(model).type)
    return cached_table("agreement", key, compute)


def summarize_agreement(long: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
                        seed: int = SEED) -> pd.DataFrame:
    """One row per removal: ``loss``, ``delta_loss`` (nats), ``kl`` (mean KL(full ‖ reduced)
    per token, nats), ``top1`` (share of tokens whose top-1 prediction agrees with the full
    model), each with its paired 95% interval over windows (``_low``, ``_high``; the same
    resample of windows for every removal), and ``n_tokens``."""
    removed = list(dict.fromkeys(long["removed"]))
    wide = {c: long.pivot(index="removed", columns="window", values=c).loc[removed].to_numpy(dtype=float)
            for c in ["nll", "base_nll", "kl", "top1", "n_tokens"]}
    tokens, base = wide["n_tokens"][0], wide["base_nll"][0]
    kwargs = dict(n_resamples=n_resamples, level=level, seed=seed)
    out = pd.DataFrame({"removed": removed, "loss": wide["nll"].sum(1) / tokens.sum()})
    columns = interval_columns(delta_loss_interval(wide["nll"], base, tokens, **kwargs), "delta_loss")
    ratio = lambda x, t: x.sum(-1) / t.sum(-1)  # noqa: E731
    for metric in ("kl", "top1"):
        columns |= interval_columns(paired_bootstrap(ratio, (wide[metric], np.broadcast_to(tokens, wide[metric].shape)),
                                                     **kwargs), metric)
    for name, values in columns.items():
        out[name] = values
    out["n_tokens"] = int(tokens.sum())
    return out[SUMMARY_COLUMNS]


def agreement_difference(long: pd.DataFrame, first: str, second: str, *, n_resamples: int = N_RESAMPLES,
                         level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """``first − second`` (two ``removed`` labels) for ΔLoss, KL and top-1, with paired 95%
    intervals on the same windows: ``metric, difference, low, high``."""
    rows = []
    pick = lambda label, c: long[long["removed"] == label].sort_values("window")[c].to_numpy(dtype=float)  # noqa
    tokens = pick(first, "n_tokens")
    for metric, column in (("delta_loss", "nll"), ("kl", "kl"), ("top1", "top1")):
        a, b = pick(first, column), pick(second, column)
        iv = paired_bootstrap(lambda x, y, t: (x.sum(-1) - y.sum(-1)) / t.sum(-1), (a, b, tokens),
                              n_resamples=n_resamples, level=level, seed=seed)
        rows.append(dict(metric=metric, difference=float(iv.estimate), low=float(iv.low), high=float(iv.high)))
    return pd.DataFrame(rows, columns=["metric", "difference", "low", "high"])
