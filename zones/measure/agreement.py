"""Beyond perplexity: how far a reduced model's next-token distribution moves from the full model's.

For every scored token t of a window, with p the full model's next-token distribution and
q the reduced model's (a block or sublayers removed, ``zones.measure.sublayer_removal``):

* ``nll``: −log q(x_{t+1}) (the loss of ``zones.measure.scoring``, summed per window);
* ``kl``: KL(p ‖ q) = Σ_v p_v (log p_v − log q_v), nats (0 for the full model itself);
* ``top1``: 1 when argmax q = argmax p (counted per window; 1 per token for the full model).

All three are summed per eval window, like the NLL, so each reduced model gets paired
bootstrap intervals over windows (``zones.measure.bootstrap.paired_bootstrap``: the same resample of
windows for every variant): ``summarize_agreement`` reports ΔLoss, mean KL per token and the
top-1 agreement rate with their 95% intervals.

The three come from one pass of the LM head per variant (``zones.measure.scoring.head_metrics``,
float32 log-probabilities, float64 sums; the NLL is the loss routine's to the bit), through
``zones.measure.scoring.score_windows``: each batch is traced once, a removal re-runs only the
blocks from its first affected one, and with ``cache=True`` every (batch, removal) is kept in
the per-window loss store, shared with every other table of the model on the same batches.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from torch import nn

from zones.core.checks import check_int
from zones.core.data import Windows
from zones.measure.bootstrap import LEVEL, N_RESAMPLES, SEED, delta_loss_interval, interval_columns, paired_bootstrap
from zones.measure.scoring import base_log_probs, head_metrics, score_windows  # noqa: F401  (public here too)
from zones.measure.store import METRICS
from zones.measure.subject import Subject, as_subject
from zones.measure.sublayer_removal import format_removal, normalize_removal

WINDOW_COLUMNS = ["removed", "window", "nll", "base_nll", "kl", "top1", "n_tokens"]
SUMMARY_COLUMNS = ["removed", "loss", "delta_loss", "delta_loss_low", "delta_loss_high", "kl", "kl_low", "kl_high",
                   "top1", "top1_low", "top1_high", "n_tokens"]


def agreement_window_losses(model: nn.Module | Subject, windows: Windows, removals: Sequence[Iterable], *,
                            batch_size: int = 8, dtype: str | None = None, cache: bool = True,
                            progress: bool = True) -> pd.DataFrame:
    """NLL, KL from the full model and top-1 agreement of every removal on every window.

    ``removals``: sets of blocks and/or sublayers (``zones.measure.sublayer_removal.normalize_removal``:
    ``[3, (5, "attn")]`` or ``"3,5:attn"``; an empty set is the full model). One row per
    (removal, window): ``removed`` (``zones.measure.sublayer_removal.format_removal``), ``window``, ``nll``,
    ``base_nll`` (the full model's), ``kl``, ``top1`` (sums over the window's tokens),
    ``n_tokens``. Scored by ``zones.measure.scoring.score_windows`` (cached in the loss store).
    """
    batch_size = check_int(batch_size, "batch_size", min=1)
    subject = as_subject(model, dtype)
    sets = list(dict.fromkeys(normalize_removal(r, subject.n_blocks) for r in removals))
    if not sets:
        raise ValueError("removals is empty: give at least one set of blocks or sublayers")
    scored = score_windows(subject, windows, [()] + sets, metrics=METRICS, batch_size=batch_size, cache=cache,
                           progress=progress, desc="agreement (KL, top-1)")
    n = windows.n_windows
    frame = pd.DataFrame({"removed": np.repeat([format_removal(s) for s in sets], n),
                          "window": np.tile(np.arange(n), len(sets)),
                          "nll": scored["nll"][1:].reshape(-1), "base_nll": np.tile(scored["nll"][0], len(sets)),
                          "kl": scored["kl"][1:].reshape(-1), "top1": scored["top1"][1:].reshape(-1),
                          "n_tokens": windows.seq_len - 1})
    return frame[WINDOW_COLUMNS]


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
