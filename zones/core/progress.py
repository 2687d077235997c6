"""Work done, counted in reference forwards, for whoever watches (the book's estimate of the time left).

The unit is the **reference forward**: the multiply-adds of one float32 forward of SmolLM2-135M
(the default model: 30 blocks of 3,538,944 weights, an LM head of 49,152 × 576) over 2,048
tokens (8 windows of 256), :data:`REFERENCE_FLOPS` = 2 × 134,479,872 × 2,048 ≈ 5.5·10¹¹.
The measuring code counts what it runs, from the shapes — a block or an LM head over n tokens
(:func:`count_module`), a training step (:func:`count_training`: forward, backward at twice the
forward, the optimizer's update), a spectrum (:func:`count_spectrum`), anything else through
:func:`add_flops` — so a chapter's count is the same on every machine and under any load;
``zones book`` turns it into time with the seconds of a reference forward timed in the same
run. Attention scores, norms and Python overhead are not counted (they are small next to the
weight matrices for the book's models), so a count is a floor of the work, not a timing.

When ``$ZONES_PROGRESS`` names a file (``zones book`` sets it for each chapter's kernel), the
running total is written there (at most once a second, and at exit); otherwise counting costs
one addition. Nothing of it reaches a page.
"""
from __future__ import annotations

import atexit
import os
import time
import weakref
from pathlib import Path

from torch import nn

from zones.core.cache import atomic_write_text

PROGRESS_ENV = "ZONES_PROGRESS"
BLOCK_WEIGHTS = 3_538_944          # SmolLM2-135M: q, k, v, o (GQA) and the MLP's three matrices
HEAD_WEIGHTS = 49_152 * 576        # its LM head (tied to the embedding)
REFERENCE_TOKENS = 2048            # 8 windows of 256
REFERENCE_FLOPS = 2.0 * (30 * BLOCK_WEIGHTS + HEAD_WEIGHTS) * REFERENCE_TOKENS
WRITE_EVERY = 1.0                  # seconds between writes of the progress file
BACKWARD_PASSES = 2                # a backward pass costs about two forwards (input and weight gradients)
OPTIMIZER_FLOPS = 12               # AdamW's update, per trained parameter (moments, bias corrections, decay)

_total = 0.0          # reference forwards counted in this process
_written_at = 0.0


def matmul_flops(weights: int | float, tokens: int | float) -> float:
    """Multiply-adds (×2) of applying ``weights`` weights to ``tokens`` tokens."""
    return 2.0 * float(weights) * float(tokens)


_WEIGHTS: "weakref.WeakKeyDictionary[nn.Module, int]" = weakref.WeakKeyDictionary()


def module_weights(module: nn.Module) -> int:
    """The weights of ``module``'s matrices (every parameter with two or more dimensions),
    counted once per module."""
    if module not in _WEIGHTS:
        _WEIGHTS[module] = int(sum(p.numel() for p in module.parameters() if p.dim() >= 2))
    return _WEIGHTS[module]


def count_module(module: nn.Module, tokens: int) -> None:
    """Count one pass of ``tokens`` tokens through ``module``'s matrices."""
    add_flops(matmul_flops(module_weights(module), tokens))


def training_flops(weights: int | float, tokens: int | float, trained: int | float) -> float:
    """One training step: a forward of ``weights`` weights over ``tokens`` tokens, its backward
    (``BACKWARD_PASSES`` forwards) and the optimizer's update of ``trained`` parameters."""
    return (1 + BACKWARD_PASSES) * matmul_flops(weights, tokens) + OPTIMIZER_FLOPS * float(trained)


def count_training(module: nn.Module, tokens: int, trained=None) -> None:
    """Count one training step of ``module`` on ``tokens`` tokens; ``trained``: the parameters
    the optimizer updates (default: those that require gradients; LoRA trains only its own)."""
    params = [p for p in module.parameters() if p.requires_grad] if trained is None else list(trained)
    add_flops(training_flops(module_weights(module), tokens, sum(p.numel() for p in params)))


def spectrum_flops(rows: int, cols: int) -> float:
    """An eigen- or singular-value decomposition of a ``rows`` × ``cols`` matrix: about
    2·m·n·min(m, n) (the Gram product; the decomposition of the small side is of the same order)."""
    return 2.0 * float(rows) * float(cols) * float(min(rows, cols))


def count_spectrum(rows: int, cols: int) -> None:
    """Count the spectrum of one ``rows`` × ``cols`` matrix (:func:`spectrum_flops`)."""
    add_flops(spectrum_flops(rows, cols))


def add_flops(flops: float) -> None:
    """Count ``flops`` of work done (see the module note); write the progress file when due."""
    global _total
    _total += float(flops) / REFERENCE_FLOPS
    if os.environ.get(PROGRESS_ENV) and time.monotonic() - _written_at >= WRITE_EVERY:
        flush()


def work_done() -> float:
    """Reference forwards counted in this process so far."""
    return _total


def flush() -> None:
    """Write the running total to ``$ZONES_PROGRESS`` now (nothing when it is not set)."""
    global _written_at
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    _written_at = time.monotonic()
    try:
        atomic_write_text(Path(path), f"{_total:.6f}\n")
    except OSError:  # a progress file is a courtesy: never fail a chapter over it
        pass


def read_progress(path: str | Path) -> float:
    """The total a process wrote to ``path`` (0 when there is none yet or it is unreadable)."""
    try:
        return float(Path(path).read_text().strip() or 0.0)
    except (OSError, ValueError):
        return 0.0


atexit.register(flush)
