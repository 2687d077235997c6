"""Executing the chapters: each in the chapters' kernel, under one progress bar, timed and recorded.

A chapter executes with papermill into ``book/chapters/NAME.ipynb`` (working directory
``book/chapters``, so its tables land in ``book/chapters/results/NAME``). Nothing is lost: it
executes into ``book/chapters/NAME.running.ipynb`` and replaces ``NAME.ipynb`` only when it
finished, so a failed, interrupted or killed chapter leaves the previous one in place (a failure's
executed copy is ``NAME.failed.ipynb``). One build at a time per project (:func:`project_lock`): a
second ``zones book`` says so and waits, and the first thing a build does under the lock is remove
what a killed build left (``*.running.ipynb``).

The terminal shows one progress bar over the chapters, with the time elapsed and an estimate of the
time left (``zones.book.estimate``) in reference forwards. The build first times one
(:func:`time_unit`, in the chapters' kernel: the process whose speed the chapters had, as the same
forward runs a few per cent faster or slower from one process to another; the first also imports
torch and transformers there, which the first chapter paid before), again after each chapter
expected to take longer than ``REFERENCE_AROUND_SECONDS`` and after the last, so each chapter's
overhead (seconds / (work it counted × a reference forward's seconds)) is taken on the unit
measured around it. The first line names the budget and the chapters run; while a chapter runs, the
work it counts moves the bar and the estimate. Nothing of it reaches the pages.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import papermill
from tqdm.auto import tqdm

from zones.book.estimate import Estimate, book_costs, estimate_source, opening_line
from zones.book.notebooks import (
    chapter_parameters,
    declared_parameters,
    drop_log_lines,
    drop_progress_widgets,
    run_notebook,
)
from zones.book.parameters import BUDGET_NOTES, book_wording, chapter_values, check_parameters
from zones.book.timing import _store_reference_end, _store_timing, overhead_line
from zones.book.toc import chapter_source
from zones.core.atomic import folder_lock
from zones.core.checks import check_models
from zones.core.glossary import DEFAULT_BUDGET, check_value
from zones.core.progress import PROGRESS_ENV, clock, quiet_nested_bars, read_progress
from zones.figures import BOOK_MODE_ENV
from zones.kernel import ChapterKernel

REFERENCE_AROUND_SECONDS = 30.0  # a chapter expected to take longer is followed by a reference forward (one more
#                                  timing, ~3 s): its unit is the mean of the timings just before and after it
PROGRESS_EVERY = 5              # seconds between updates of the estimate
RUNNING_SUFFIX = ".running.ipynb"  # a chapter being executed; it becomes NAME.ipynb only when it finished


class ChapterFailed(RuntimeError):
    """A chapter notebook raised while executing."""


@contextlib.contextmanager
def project_lock(root: Path, log=print):
    """Hold the project's build lock (an ``flock`` on ``book/``, released by the OS if the
    process dies): a second build in the same project says so and waits for the first. Under
    the lock, the chapters a killed build was executing (``*.running.ipynb``) are removed."""
    folder = Path(root) / "book"
    folder.mkdir(parents=True, exist_ok=True)

    def waiting() -> None:
        log(f"zones book: another zones book is running in {Path(root).resolve()}; waiting for it to finish")

    with folder_lock(folder, on_wait=waiting):
        chapters_dir = folder / "chapters"
        for stale in sorted(chapters_dir.glob(f"*{RUNNING_SUFFIX}")) if chapters_dir.is_dir() else []:
            stale.unlink(missing_ok=True)  # its build was killed: no live build runs without the lock
        yield


def execute_chapter(root: Path, name: str, parameters: dict[str, Any],
                    declared: dict[str, Any] | None = None, log=print, note: str | None = None,
                    progress_file: Path | None = None, kernel: ChapterKernel | None = None) -> Path:
    """Execute chapter ``name`` with the ``parameters`` it declares into ``book/chapters``
    (``note``: a Markdown cell at the top of its page); the work it counts goes to
    ``progress_file`` (``zones.core.progress``). A failing chapter is a ``ChapterFailed``
    whose message is its exception's one line (see ``zones.book.parameters.book_wording``).

    The previous ``NAME.ipynb`` is replaced only by a chapter that finished: on a failure it
    stays (with ``NAME.failed.ipynb`` beside it), and an interruption leaves it untouched."""
    source = chapter_source(root, name)
    target_dir = root / "book" / "chapters"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.ipynb"
    # Executed into a side file, renamed only on success: a failed chapter is never built, and
    # the previous chapter stays until a new one has finished.
    running = target_dir / f"{name}{RUNNING_SUFFIX}"
    failed = target_dir / f"{name}.failed.ipynb"
    failed.unlink(missing_ok=True)
    params = chapter_parameters(source, parameters, declared)
    log(f"zones book: executing {name} with {params}")
    # The kernel inherits the environment: book mode, and no progress bars in the pages
    # (a bar in a notebook is a widget, and a widget makes the page load scripts from CDNs).
    quiet = {BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
             PROGRESS_ENV: str(progress_file or "")}
    saved = {key: os.environ.get(key) for key in quiet}
    os.environ.update(quiet)
    try:
        if kernel is not None:
            kernel.prepare(quiet, target_dir)
        run_notebook(source, running, params, cwd=target_dir, note=note, kernel=kernel)
        if kernel is not None:
            kernel.finish()
        drop_progress_widgets(running)
        for line in drop_log_lines(running):
            log(f"{name}: {line}")
        os.replace(running, target)
    except papermill.PapermillExecutionError as err:
        if kernel is not None:  # what the failed chapter left in it cannot be trusted
            kernel.restart()
        os.replace(running, failed)
        kept = f"; the previous {target.name} is kept" if target.exists() else ""
        raise ChapterFailed(f"chapter {name} failed: {err.ename}: {book_wording(err.evalue, declared or params)} "
                            f"(the executed copy, with its traceback: {failed}{kept})") from err
    except BaseException:
        running.unlink(missing_ok=True)  # interrupted: the previous chapter stays as it was
        raise
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return target


def execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
                     models: list[str] | None = None, budget: str = DEFAULT_BUDGET, from_text: bool = False,
                     progress: bool = True, time_reference: bool = True) -> list[Path]:
    """Execute chapters ``names`` in order, under one progress bar with an estimate of the time
    left (terminal only; :class:`Estimate`). ``models`` (a list; one string is one model) is
    given to the chapters that declare ``models``; ``budget`` gives each chapter that budget's
    values (the glossary's presets); every key of ``parameters`` must be declared by one of the
    chapters, and every value fit its type (``from_text``: YAML texts): both are checked before
    any chapter runs. A reference forward is timed first (``zones.book.timing.reference_forward_seconds``;
    ``time_reference=False`` skips it: the estimate then assumes ``REFERENCE_SECONDS_GUESS``), and each
    chapter's seconds, reference forwards and counted work are recorded (``zones.book.timing.last_record``)."""
    with project_lock(root, log=lambda message: print(message, file=sys.stderr, flush=True)):
        return _execute_chapters(root, names, parameters, models=models, budget=budget, from_text=from_text,
                                 progress=progress, time_reference=time_reference)


def time_unit(kernel: ChapterKernel, repeats: int = 2) -> float | None:
    """A reference forward's seconds, timed in the chapters' ``kernel``
    (:meth:`zones.kernel.ChapterKernel.reference_forward_seconds`)."""
    return kernel.reference_forward_seconds(repeats=repeats)


@dataclass
class _Plan:
    """What the chapters of one build are given, checked before any of them runs: the parameters each
    ``declared``, the explicit ``parameters``, the ``implicit`` ones (``models``), the ``budget``, the
    ``key`` of the build's record (``zones.book.timing``) and each chapter's expected ``costs``."""

    root: Path
    names: list[str]
    declared: dict[str, dict[str, Any]]
    parameters: dict[str, Any]
    implicit: dict[str, Any]
    budget: str
    key: dict[str, Any]
    costs: dict[str, dict[str, Any]]


def _plan(root: Path, names: list[str], parameters: dict[str, Any] | None, *, models: list[str] | None,
          budget: str, from_text: bool) -> _Plan:
    budget = check_value("budget", budget)
    declared = {n: declared_parameters(chapter_source(root, n)) for n in names}
    parameters = check_parameters(dict(parameters or {}), declared, from_text=from_text)  # before any chapter runs
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters, **({"budget": budget} if budget != DEFAULT_BUDGET else {})}
    costs = book_costs(root, names, parameters, budget=budget, models=models, declared=declared)
    return _Plan(root, names, declared, parameters, implicit, budget, key, costs)


def _execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None, *,
                      models: list[str] | None, budget: str, from_text: bool, progress: bool,
                      time_reference: bool) -> list[Path]:
    plan = _plan(root, names, parameters, models=models, budget=budget, from_text=from_text)

    def say(message: str) -> None:  # above the bar, in the terminal
        tqdm.write(message, file=sys.stderr) if progress else print(message, flush=True)

    with ChapterKernel() as kernel:   # the chapters' process: the unit is timed there too
        reference = time_unit(kernel) if names and time_reference else None
        estimate = Estimate(plan.costs, reference)
        if reference:
            say(f"zones book: a reference forward (SmolLM2-135M, float32, 2,048 tokens) takes {reference:.2f} s here")
        say(opening_line(names, plan.costs, plan.budget, estimate.seconds_per_forward(),
                         estimate_source(names, plan.budget, plan.key)))
        bar = _ChapterBar(estimate, names, progress)
        try:
            run = _ChapterRun(plan, kernel, bar, reference, say)
            done = run.all()
            if reference and done:  # the unit moves with the machine: time it again at the end
                run.close()
        finally:
            bar.close()
        return done


class _ChapterBar:
    """The build's one progress bar: the chapter running, and the time left, moved every
    ``PROGRESS_EVERY`` seconds by the work the running chapter reports (its progress file)."""

    def __init__(self, estimate: Estimate, names: list[str], progress: bool):
        self.estimate, self.names = estimate, names
        self.quiet = quiet_nested_bars(progress)  # other tools' bars (in this process) stay out of the book's line
        terminal = self.quiet.__enter__()
        self.bar = tqdm(total=max(estimate.total, 1e-9), unit="ref", file=terminal, disable=not progress,
                        desc=f"zones book: chapter 1/{len(names)} {names[0]}" if names else "zones book",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed{postfix}")
        self.running: dict[str, Any] = dict(name=None, file=None)
        self.stop = threading.Event()
        self.ticker = threading.Thread(target=self.tick, daemon=True)
        self.refresh()
        self.ticker.start()

    def start(self, k: int, name: str, file: Path) -> None:
        """Chapter ``k``, ``name``, runs, counting its work in ``file``."""
        self.bar.set_description_str(f"zones book: chapter {k}/{len(self.names)} {name}")
        self.running.update(name=name, file=file)

    def finish(self) -> None:
        """The running chapter finished (its cost is in the estimate)."""
        self.running.update(name=None, file=None)
        self.refresh()

    def refresh(self) -> None:  # the estimate moves with the work the running chapter reports
        work = read_progress(self.running["file"]) if self.running["file"] else 0.0
        position = self.estimate.position(self.running["name"], work)
        self.bar.n = min(position, self.bar.total)
        unknown = f" + {len(self.estimate.unknown)} chapter(s) with no estimate" if self.estimate.unknown else ""
        self.bar.set_postfix_str(f"about {clock(self.estimate.seconds_left(position))} left{unknown}", refresh=False)
        self.bar.refresh()

    def tick(self) -> None:
        while not self.stop.wait(PROGRESS_EVERY):
            self.refresh()

    def close(self) -> None:
        self.stop.set()
        self.bar.close()
        self.quiet.__exit__(None, None, None)


class _ChapterRun:
    """The chapters of one build, executed one after the other in ``kernel``: each timed, its cost
    recorded (``zones.book.timing``) on the reference forwards timed around it, and said."""

    def __init__(self, plan: _Plan, kernel: ChapterKernel, bar: _ChapterBar, reference: float | None, say):
        self.plan, self.kernel, self.bar, self.reference, self.say = plan, kernel, bar, reference, say
        self.latest = reference               # the last reference forward timed
        self.spent = self.counted = self.around = 0.0   # the chapters' seconds, work and work × unit: the last line

    def all(self) -> list[Path]:
        """Execute every chapter; the executed notebooks."""
        with tempfile.TemporaryDirectory(prefix="zones-progress-") as folder:
            return [self.one(k, name, Path(folder) / f"{name}.work") for k, name in enumerate(self.plan.names, 1)]

    def one(self, k: int, name: str, work_file: Path) -> Path:
        """Execute chapter ``k``, ``name`` (its work counted in ``work_file``), record its cost and say it."""
        plan, estimate = self.plan, self.bar.estimate
        self.bar.start(k, name, work_file)
        long = bool(self.reference) and (plan.costs[name]["reference_forwards"] * estimate.seconds_per_forward()
                                         >= REFERENCE_AROUND_SECONDS)
        before = self.latest
        start = time.time()
        given = chapter_values(name, plan.declared[name], plan.budget, plan.implicit, plan.parameters)
        done = execute_chapter(plan.root, name, given, plan.declared[name], log=self.say,
                               note=BUDGET_NOTES.get(plan.budget), progress_file=work_file, kernel=self.kernel)
        seconds = time.time() - start
        work = read_progress(work_file)
        if long:   # the unit drifts with the machine: a long chapter is weighed on the timings around it
            # the fastest of two: the first forward after a chapter can run at half speed
            # (one build timed 5.62 s after the primer, against 2.58 s before it)
            self.latest = time_unit(self.kernel, repeats=2) or self.latest
        unit = (before + self.latest) / 2 if self.reference else None
        _store_timing(plan.key, name, seconds, reference=unit, work=work, start=self.reference)
        self.spent, self.counted = self.spent + round(seconds, 1), self.counted + round(work, 2)   # as recorded
        self.around += round(work, 2) * round(unit, 3) if unit else 0.0
        estimate.finish(name, seconds)
        self.bar.finish()
        cost = f", {seconds / unit:.0f} reference forwards" if unit else ""
        self.say(f"zones book: {name} done in {seconds:.0f} s{cost} ({work:.0f} counted)")
        return done

    def close(self) -> None:
        """A reference forward timed after the last chapter, recorded, and the build's closing line."""
        after = time_unit(self.kernel)
        if after:
            _store_reference_end(self.plan.key, after)
        self.say(overhead_line(self.spent, self.counted, self.reference, after, self.around))
