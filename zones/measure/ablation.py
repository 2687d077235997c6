"""Single-block ablation: how much the loss rises when one decoder block is removed.

For every block i, ``ablation_table`` scores the model with block i skipped (its output is
its input) on the same windows as the full model, and reports the rise in mean token
cross-entropy, ΔLoss_i = Loss(without i) − Loss(full). With ``parts=True`` it also removes
only the block's attention output, or only its MLP output.

Two methods give the same numbers:

* ``"prefix"`` (default) is ``zones.measure.scoring.score_windows``: each batch is traced once
  through the full model, keeping every block's input; the model without block i equals the
  full model up to block i, so its forward starts there. A sweep over L blocks costs about L/2
  block-forwards per batch instead of L.
* ``"naive"`` runs one complete forward per ablation and scores its logits exactly as
  ``zones.measure.scoring.evaluate_loss`` does (the reference; never cached).

Every ablation keeps its NLL on every window (``ablation_window_losses``: the long table),
and ``ablation_table`` gives each block's ΔLoss a 95% paired bootstrap interval over windows
(``zones.measure.bootstrap``: one resample of windows for the base and every block alike). A base or
ablated loss that is not finite stops the sweep with an error naming the block and window.

With ``cache=True`` every (batch, removal) lives in the per-window loss store
(``zones.measure.store``), keyed by the model's fingerprint, the batch's tokens and the scoring
dtype: an interrupted sweep resumes from the removals already stored, and every other table of
the same model on the same batches (a pruning sweep's single blocks, a smaller budget of the
same windows) reads them instead of computing them again.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
import torch
from torch import nn

from zones.core.checks import check_choice, check_int
from zones.core.data import Windows
from zones.core.glossary import default
from zones.measure.blocks import check_layers, skip_blocks, zero_sublayer
from zones.measure.bootstrap import LEVEL, N_RESAMPLES, SEED, check_finite, delta_loss_interval, interval_columns
from zones.measure.scoring import forward_nll_windows, loss_name, score_windows
from zones.measure.subject import Subject, as_subject
from zones.measure.sublayer_removal import PARTS

METHODS = ("prefix", "naive")
# Scored tokens for a CPU run of the chapter: 24 windows of 256, about 4 minutes on 2 idle cores
# for SmolLM2-135M (chosen by benchmarks/bench_precision.py and the book's 30-minute budget). A
# GPU run should score the whole eval split (``None``).
DEFAULT_EVAL_TOKENS = default("eval_tokens", context="ablate")  # the glossary's, written once there
# The chapters' scoring precision for the ablation (layer ablation, importance, predictors, one
# value so they read one cache): the glossary's ("auto": bfloat16 where native), which
# benchmarks/bench_book_precision.py holds to the float32 build's conclusions.
CHAPTER_DTYPE = default("dtype", context="layer_ablation")

COLUMNS = ["layer", "loss", "base_loss", "delta_loss", "delta_loss_low", "delta_loss_high", "n_tokens"]
PART_COLUMNS = [c for p in PARTS for c in (f"loss_{p}", f"delta_loss_{p}", f"delta_loss_{p}_low",
                                           f"delta_loss_{p}_high")]
WINDOW_COLUMNS = ["layer", "window", "nll", "base_nll", "n_tokens"]
PART_WINDOW_COLUMNS = [f"nll_{p}" for p in PARTS]


def _check(subject: Subject, windows: Windows, layers, method: str, batch_size: int) -> list[int]:
    if not isinstance(windows, Windows):
        raise TypeError(f"windows must be zones.core.data.Windows (from corpus_windows), not {type(windows).__name__}")
    if windows.n_windows == 0:
        raise ValueError("no windows to score: the windows are empty")
    if windows.seq_len < 2:
        raise ValueError(f"windows of {windows.seq_len} token(s) score nothing; seq_len must be at least 2")
    check_choice(method, "ablation_method", METHODS)
    check_int(batch_size, "batch_size", min=1)
    layers = list(range(subject.n_blocks)) if layers is None else check_layers(subject.model, layers, subject.adapter)
    if not layers:
        raise ValueError("no blocks to ablate: layers is empty")
    return layers


def _naive(subject: Subject, windows: Windows, layers: list[int], parts: bool, batch_size: int) -> dict:
    """Per-window NLL of the full model and of every ablation, one complete forward each."""
    out = {"base": [], **{(layer, part): [] for layer in layers for part in (None, *(PARTS if parts else ()))}}
    first = 0
    for ids in windows.input_ids.split(batch_size):
        ids = ids.to(subject.device)
        check = lambda nll, label: check_finite(nll[None], lambda _: label, loss_name(windows),  # noqa: E731
                                                first_window=first, n_windows=windows.n_windows)
        with torch.inference_mode(), subject.precision():
            base = forward_nll_windows(subject.model, ids)
            check(base, "of the full model")
            out["base"].append(base)
            for layer in layers:
                for part in (None, *(PARTS if parts else ())):
                    context = (skip_blocks(subject.model, [layer], subject.adapter) if part is None
                               else zero_sublayer(subject.model, layer, part))
                    with context:
                        nll = forward_nll_windows(subject.model, ids)
                    check(nll, f"with block {layer} removed" if part is None
                          else f"with block {layer}'s {part} output removed")
                    out[(layer, part)].append(nll)
        first += ids.shape[0]
    return {k: np.concatenate(v) for k, v in out.items()}


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


def ablation_window_losses(model: nn.Module | Subject, windows: Windows, *, parts: bool = False,
                           ablation_method: str = "prefix", batch_size: int = 8, cache: bool = True, progress: bool = True,
                           layers: Iterable[int] | None = None, dtype: str | None = None) -> pd.DataFrame:
    """The NLL of every single-block ablation on every window: the long table.

    One row per (block, window): ``layer, window`` (index in ``windows``), ``nll`` (summed
    next-token NLL, nats, with the block removed), ``base_nll`` (the full model's, same
    window), ``n_tokens``; with ``parts=True`` also ``nll_attn, nll_mlp``. Arguments as in
    :func:`ablation_table`, which summarizes this table.
    """
    subject = as_subject(model, dtype)
    layers = _check(subject, windows, layers, ablation_method, batch_size)
    subject.check_fit(windows)
    if ablation_method == "naive":
        nll = _naive(subject, windows, layers, parts, batch_size)
    else:
        removals = [()] + [(layer,) for layer in layers]
        removals += [((layer, part),) for part in PARTS for layer in layers] if parts else []
        scored = score_windows(subject, windows, removals, batch_size=batch_size, cache=cache, progress=progress,
                               desc="ablation")["nll"]
        nll = {"base": scored[0], **{(layer, None): scored[1 + i] for i, layer in enumerate(layers)}}
        if parts:
            offset = 1 + len(layers)
            nll.update({(layer, part): scored[offset + p * len(layers) + i]
                        for p, part in enumerate(PARTS) for i, layer in enumerate(layers)})
    n = windows.n_windows
    table = {"layer": np.repeat(np.asarray(layers, dtype=int), n), "window": np.tile(np.arange(n), len(layers)),
             "nll": np.concatenate([nll[(layer, None)] for layer in layers]),
             "base_nll": np.tile(nll["base"], len(layers)), "n_tokens": np.full(n * len(layers), windows.seq_len - 1)}
    if parts:
        for part in PARTS:
            table[f"nll_{part}"] = np.concatenate([nll[(layer, part)] for layer in layers])
    long = pd.DataFrame(table)
    order = np.argsort(long["layer"].to_numpy(), kind="stable")
    return long.iloc[order].reset_index(drop=True)


def ablation_table(model: nn.Module | Subject, windows: Windows, *, parts: bool = False, ablation_method: str = "prefix",
                   batch_size: int = 8, cache: bool = True, progress: bool = True,
                   layers: Iterable[int] | None = None, dtype: str | None = None,
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

    ``ablation_method="prefix"`` reuses each batch's shared prefix; ``"naive"`` runs one full forward
    per ablation (same numbers to float rounding). ``layers`` restricts the sweep to some
    blocks. ``dtype`` is the scoring precision (``"float32"`` (None), ``"bfloat16"`` or
    ``"auto"``, ``zones.measure.subject``). Intervals: ``zones.measure.bootstrap`` (``n_resamples``,
    ``level``, ``seed``; NaN with a single window). With ``cache=True`` every (batch, removal)
    is read from or written to the loss store (module note), so a sweep resumes after an
    interruption. A non-finite loss is an error.
    """
    long = ablation_window_losses(model, windows, parts=parts, ablation_method=ablation_method, batch_size=batch_size,
                                  cache=cache, progress=progress, layers=layers, dtype=dtype)
    return summarize(long, parts, n_resamples=n_resamples, level=level, seed=seed)

