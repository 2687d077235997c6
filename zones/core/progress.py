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

While a job or a chapter runs, the terminal shows one bar over this counted work
(:class:`WorkBar`: ``zones study``'s jobs, each weighed by the work it is expected to count,
the time left at the rate measured so far), and other tools' progress bars (lm-eval's,
datasets', transformers', a training loop's) stay out of its line (:func:`quiet_nested_bars`).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
import weakref
from pathlib import Path

from torch import nn
from tqdm.auto import tqdm

from zones.core.atomic import atomic_write_text

PROGRESS_ENV = "ZONES_PROGRESS"
BOOK_MODE_ENV = "ZONES_BOOK_BUILD"  # set by `zones book` in its chapters' kernel
BLOCK_WEIGHTS = 3_538_944          # SmolLM2-135M: q, k, v, o (GQA) and the MLP's three matrices
HEAD_WEIGHTS = 49_152 * 576        # its LM head (tied to the embedding)
REFERENCE_TOKENS = 2048            # 8 windows of 256
REFERENCE_FLOPS = 2.0 * (30 * BLOCK_WEIGHTS + HEAD_WEIGHTS) * REFERENCE_TOKENS
WRITE_EVERY = 1.0                  # seconds between writes of the progress file
RUNNING_CAP = 0.98                 # a running job or chapter never shows as done before it ends
MIN_CONCURRENCY = 0.2             # the time left never grows more than 5× for the gaps between jobs
REDRAW_EVERY = 2.0                 # seconds between redraws of a WorkBar (the running job's counted work)
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


def restart() -> None:
    """Count from 0 again: a chapter run in a kernel that ran another before it (``zones.kernel``)."""
    global _total, _written_at
    _total, _written_at = 0.0, 0.0


def bars_shown(progress: bool | None) -> bool:
    """The glossary's ``progress``: True/False as given; None, bars everywhere but in the book's pages."""
    return os.environ.get(BOOK_MODE_ENV) != "1" if progress is None else bool(progress)


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


# --- what the terminal shows --------------------------------------------------------------------------

def clock(seconds: float) -> str:
    """``04:05``, ``1:02:03``: a time left."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 \
        else f"{seconds // 60:02d}:{seconds % 60:02d}"


def job_cost_model(samples) -> tuple[float, float] | None:
    """``(overhead, rate)``: a computed job's seconds ≈ ``overhead`` + ``rate`` × its expected work,
    fitted by least squares, neither below 0, to ``samples``: the ``(work, seconds)`` of the jobs
    that finished computing. One sample, or works all alike: no overhead, the rate of their sums
    (the measured rate); an overhead fitted below 0 the same; a rate below 0: the mean seconds,
    whatever the work. None without samples."""
    samples = [(float(w), float(s)) for w, s in samples]
    if not samples:
        return None
    works, seconds = [w for w, _ in samples], [s for _, s in samples]
    n, mean_w, mean_s = len(samples), sum(works) / len(works), sum(seconds) / len(seconds)
    spread = sum((w - mean_w) ** 2 for w in works)
    ratio = (0.0, sum(seconds) / sum(works)) if sum(works) > 0 else (mean_s, 0.0)
    if n < 2 or spread <= 1e-12 * max(mean_w * mean_w, 1e-300):
        return ratio
    rate = sum((w - mean_w) * (s - mean_s) for w, s in samples) / spread
    if rate < 0:
        return mean_s, 0.0
    overhead = mean_s - rate * mean_w
    return (overhead, rate) if overhead >= 0 else ratio


def job_kind(name: str) -> str:
    """The kind of job ``name``: its name before `` · `` (``zones study``'s ``pruning · m``: the
    chapter), the name itself without one. Jobs of a kind cost alike: the first to finish
    measures the others."""
    return name.split(" · ", 1)[0]


_ACTIVE: "list[WorkBar]" = []  # the WorkBars open in this process, the newest last (mark_from_cache's)


def mark_from_cache(name: str) -> None:
    """Job ``name`` of the open :class:`WorkBar` computed nothing: it read everything from the cache
    (``zones study`` says so as a job's result comes in, before the bar finishes it)."""
    if _ACTIVE:
        _ACTIVE[-1].from_cache(name)


def amount(work: float) -> str:
    """``12.5``, ``0.0362``: work with one decimal, or three significant digits below 1 (a tiny
    model's jobs)."""
    return f"{work:.1f}" if work >= 1 or work == 0 else f"{work:.3g}"


class WorkBar:
    """One bar over jobs weighed by the work each is expected to count (``works``: job name →
    its expected work, in ``unit``s: reference forwards for ``zones study``; 1 each counts jobs).

    The bar counts only computed work: a finished job counts its expected work; with ``live``, a
    running job (in this process) counts the share of its expected work it has counted so far
    (:func:`work_done`, never more than ``RUNNING_CAP`` of it). A job that read everything from the
    cache (:meth:`from_cache`) is not progress: its work leaves the bar's total and the line says
    how much was read from the cache, apart. The time left sums each job left's expected seconds,
    ``overhead + rate × work`` (:func:`job_cost_model`, fitted to the finished computed jobs of its
    :func:`job_kind`; a kind not measured yet: the median of the measured kinds' costs for its
    work; a running job's less its time so far), over the jobs' measured concurrency (job seconds per wall
    second): no figure before a job finished computing, and one that neither counts cached jobs as
    fast work nor ignores a job's fixed cost (loading its model, its tables), as one rate would."""

    BAR = "{desc}: {percentage:3.0f}%|{bar}| "  # then the line's text (not tqdm's postfix: it adds ", ")

    def __init__(self, works: dict[str, float], desc: str, unit: str = "job", *, enabled: bool = True,
                 live: bool = False, file=None):
        self.works, self.unit, self.live = dict(works), unit, live
        self.total = float(sum(self.works.values()))
        self.done = 0.0
        self.cached: dict[str, float] = {}   # job → its work, read from the cache (not progress)
        self.samples: dict[str, tuple[float, float]] = {}  # job that finished computing → (work, seconds)
        self.busy = 0.0  # seconds of the finished jobs, cached or not
        self.running: dict[str, float] = {}  # job → work_done() when it started
        self.begun: dict[str, float] = {}    # job → when it started
        self.note = ""
        self.started = time.monotonic()
        self.lock = threading.Lock()
        # position=0: another tqdm alive (a leaked one, a tool's) would push the bar down a line and
        # every redraw would write cursor-up codes ("\x1b[A") into the output
        self.bar = tqdm(total=max(self.total, 1e-9), desc=desc, unit=unit, disable=not enabled,
                        file=file or sys.stderr, bar_format=self.BAR, position=0)
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        if enabled and live:
            self.ticker.start()
        _ACTIVE.append(self)
        self.redraw()

    def start(self, name: str) -> None:
        with self.lock:
            self.running[name] = work_done()
            self.begun[name] = time.monotonic()
        self.redraw()

    def from_cache(self, name: str) -> None:
        """Job ``name`` read everything from the cache: its work is not progress (the bar's total
        loses it; the line counts it apart) and its seconds do not measure the rate."""
        with self.lock:
            self.cached[name] = self.works[name]

    def finish(self, name: str) -> None:
        with self.lock:
            self.running.pop(name, None)
            seconds = time.monotonic() - self.begun.pop(name, self.started)
            self.busy += seconds
            if name not in self.cached:
                self.done += self.works[name]
                self.samples[name] = (self.works[name], seconds)
        self.redraw()

    def requeue(self, name: str) -> None:
        """``name`` is running again from its start (its node was lost): what it counted is not done."""
        with self.lock:
            self.running.pop(name, None)
            self.begun.pop(name, None)

    def computed_total(self) -> float:
        """The work the bar counts to: every job's, less what was read from the cache."""
        return max(self.total - sum(self.cached.values()), 0.0)

    def position(self) -> float:
        """Work computed: the finished jobs', and (``live``) the running jobs' share so far."""
        with self.lock:
            now = work_done()
            partial = sum(min((now - begun) / self.works[name], RUNNING_CAP) * self.works[name]
                          for name, begun in self.running.items() if self.live and self.works[name] > 0)
            return min(self.done + partial, self.computed_total())

    def seconds_left(self, position: float | None = None) -> float | None:
        """The expected seconds of the jobs left (:func:`job_cost_model`; a running job's less its
        time so far) over the measured concurrency; None before a job finished computing. (``position``:
        unused, the work shown.)"""
        with self.lock:
            model = job_cost_model(self.samples.values())
            if model is None:
                return None
            kinds = {}
            for name, sample in self.samples.items():
                kinds.setdefault(job_kind(name), []).append(sample)
            models = {kind: job_cost_model(samples) for kind, samples in kinds.items()}

            def unseen(work: float) -> float:  # a kind not measured yet: the median of the measured kinds'
                guesses = sorted(c + r * work for c, r in models.values())
                middle = len(guesses) // 2
                return guesses[middle] if len(guesses) % 2 else (guesses[middle - 1] + guesses[middle]) / 2
            now = time.monotonic()
            finished = set(self.samples) | set(self.cached)
            left = 0.0
            for name, work in self.works.items():
                if name in finished:
                    continue
                kind = job_kind(name)
                expected = models[kind][0] + models[kind][1] * work if kind in models else unseen(work)
                left += max(expected - (now - self.begun[name]), 0.0) if name in self.begun else expected
            elapsed = now - self.started
            busy = self.busy + sum(now - begun for begun in self.begun.values())
            concurrency = busy / elapsed if elapsed > 0 and busy > 0 else 1.0  # below 1: the gaps between jobs
            return left / max(concurrency, MIN_CONCURRENCY)

    def text(self) -> str:
        """The line after the bar: work computed of the work to compute, what was read from the cache
        (apart), the time so far and left, and the note."""
        position, left = self.position(), self.seconds_left()
        cached = sum(self.cached.values())
        eta = "estimating the time left" if left is None else f"about {clock(left)} left"
        apart = f" ({amount(cached)} {self.unit} read from the cache)" if self.cached else ""
        return (f"{amount(position)}/{amount(self.computed_total())} {self.unit} computed{apart}, "
                f"{clock(time.monotonic() - self.started)} elapsed, {eta}{'; ' + self.note if self.note else ''}")

    def redraw(self, note: str | None = None) -> None:
        if note is not None:
            self.note = note
        text = self.text()
        self.bar.total = max(self.computed_total(), 1e-9)
        self.bar.n = self.position()
        self.bar.bar_format = self.BAR + text.replace("{", "{{").replace("}", "}}")  # after the bar: the text alone
        self.bar.refresh()

    def _tick(self) -> None:
        while not self.stop.wait(REDRAW_EVERY):
            self.redraw()

    def close(self) -> None:
        self.stop.set()
        if self.ticker.is_alive():
            self.ticker.join()
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        self.bar.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _NestedBars:
    """``sys.stderr`` while a :class:`WorkBar` runs: each whole line goes above the bar
    (``tqdm.write``); a line redrawn in place (carriage returns, cursor moves: another tool's
    progress bar) is dropped."""

    REDRAWN = ("\r", "\x1b[A")

    def __init__(self, target):
        self.target, self.line = target, ""

    def write(self, text: str) -> int:
        *lines, self.line = (self.line + text).split("\n")
        for line in lines:
            if line and not any(mark in line for mark in self.REDRAWN):
                tqdm.write(line, file=self.target)
        if "\r" in self.line:  # a bar redrawing itself: only its last state is kept, to be dropped
            self.line = "\r" + self.line.rsplit("\r", 1)[1]
        return len(text)

    def flush(self) -> None:
        self.target.flush()

    def __getattr__(self, name):  # encoding, fileno, isatty, ...: the terminal's
        return getattr(self.target, name)


@contextlib.contextmanager
def quiet_nested_bars(enabled: bool = True):
    """While it lasts, other tools' progress bars (any tqdm writing to ``sys.stderr``: lm-eval,
    datasets, the hub, a training loop) do not print into the bar's line; their other lines
    still show, above it. Yields the terminal's stream, for the bar itself."""
    terminal = sys.stderr
    if not enabled or isinstance(terminal, _NestedBars):
        yield terminal
        return
    sys.stderr = _NestedBars(terminal)
    try:
        yield terminal
    finally:
        sys.stderr = terminal
