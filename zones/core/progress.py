"""Work done, counted in reference forwards, for whoever watches (the book's estimate of the time left).

The unit is the **reference forward**: the multiply-adds of one float32 forward of SmolLM2-135M
(the default model: 30 blocks of 3,538,944 weights, an LM head of 49,152 × 576) over 2,048
tokens (8 windows of 256), :data:`REFERENCE_FLOPS` = 2 × 134,479,872 × 2,048 ≈ 5.5·10¹¹.
The measuring code counts what it runs — a block or an LM head over n tokens, a training step
(:func:`add_flops`) — so a chapter's count is the same on every machine and under any load;
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
