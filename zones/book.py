"""Build the report: execute each chapter notebook with papermill, then run Jupyter Book.

The chapters are the ``book/chapters/NAME`` entries of ``_toc.yml``; each is a MyST Markdown
notebook ``notebooks/NAME.md`` (jupytext), executed into ``book/chapters/NAME.ipynb``
(working directory ``book/chapters``, so a chapter's tables land in
``book/chapters/results/NAME``). Parameters are passed only to the notebooks that declare
them; a parameter that none of the chapters being executed declares is refused before any
runs, with the list of those they do declare (a misspelt ``n_resamplez`` is never dropped
silently), and every value is checked against its type in ``zones.core.glossary`` (a
``--param eval_tokens=abc`` fails at once, naming the parameter). A *budget* (``class``, ``cpu``
— the notebooks' own values — or ``gpu``) gives each chapter the glossary's values for it
(``zones.core.glossary.preset``), under the parameters given explicitly; a ``class`` build says so
at the top of every page. ``run_notebook`` is the one way the project executes a chapter (the
book, the tests); ``lab_folder`` writes the chapters with a budget's values for JupyterLab.
Chapters that read the others' tables or cache (``RUN_LAST``: across_models, then the claims scorecard) execute after them,
wherever ``_toc.yml`` places them.

The terminal shows one progress bar over the chapters, with the time elapsed and an
estimate of the time left, in one unit on every machine: the **reference forward** (one
float32 SmolLM2-135M forward of 2,048 tokens, ``zones.core.progress``). The build first times
one (:func:`reference_forward_seconds`), again after each chapter expected to take longer than
``REFERENCE_AROUND_SECONDS`` and after the last, so each chapter's overhead (seconds / (work it
counted × a reference forward's seconds)) is taken on the unit measured around it. Each is timed
in the chapters' kernel (:func:`time_unit`), the process whose speed the chapters had (the same
forward runs a few per cent faster or slower from one process to another); the first also
imports torch and transformers there, which the first chapter paid before. Each chapter weighs its cost in the last build
with the same parameters and budget (the record kept in the cache, ``cache_dir()/book``: seconds,
reference forwards and the work the chapter counted), else its ``EXPECTED_REFERENCE_FORWARDS`` at
the budget being built (a budget not measured: the cpu cost scaled by the chapter's token budgets,
or no estimate, :func:`book_costs`); the first line names the budget and the chapters run; and while a chapter runs, the work it counts (windows,
removal sets, training steps, reported through the file named by ``$ZONES_PROGRESS``) moves
the bar and the estimate (:class:`Estimate`). Nothing of it reaches the pages.

Every asset a page loads ships with the build: Vega (``zones.figures``) and MathJax (from
the ``django-static-mathjax`` package) are copied into ``book/_static``, and progress bars
left in an executed chapter (tqdm widgets, which would make the page load require.js and
the widget manager from CDNs) are removed with the widget state. The library's log lines
(``zones: converting … gguf``) leave the pages for the terminal (``drop_log_lines``).

Nothing is lost: a chapter executes into ``book/chapters/NAME.running.ipynb`` and replaces
``NAME.ipynb`` only when it finished, so a failed, interrupted or killed chapter leaves the
previous one in place (a failure's executed copy is ``NAME.failed.ipynb``). One build at a time
per project (:func:`project_lock`): a second ``zones book`` says so and waits, and the first
thing a build does under the lock is remove what a killed build left (``*.running.ipynb``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import papermill
import yaml
from tqdm.auto import tqdm

from zones.core.atomic import atomic_write_bytes, atomic_write_text, folder_lock
from zones.core.cache import CacheError, entry_path
from zones.core.checks import check_models
from zones.core.entries import read_entry, write_entry
from zones.core.glossary import DEFAULT_BUDGET, TERMS, check_value, default, parse_text, preset
from zones.core.progress import PROGRESS_ENV, RUNNING_CAP, clock, quiet_nested_bars, read_progress
from zones.core.tally import counting
from zones.figures import BOOK_MODE_ENV, write_vega_bundle
from zones.kernel import ChapterKernel

RUN_LAST = ("across_models", "claims")  # chapters that read what the other chapters wrote (tables, cache)
MATHJAX_PACKAGE = "django-static-mathjax"
MATHJAX_FILE = "tex-svg-full.js"  # TeX input, SVG output, every extension: no fonts or extensions to fetch
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# What each chapter costs cold with its default parameters, per budget, in reference forwards (one
# float32 SmolLM2-135M forward of 2,048 tokens, ``zones.core.progress``): the same on every machine. A
# chapter not listed weighs DEFAULT_REFERENCE_FORWARDS; a chapter's last build replaces the guess.
# cpu and class: measured on cold builds (README: the budget), each chapter's seconds over the reference
# forward timed around it. gpu is not measured yet: its costs are the cpu ones scaled by the chapter's
# token budgets (:func:`budget_scale`), never the cpu figure itself.
EXPECTED_REFERENCE_FORWARDS = {   # measured: cold builds of 4dbaceb (Intel Xeon, 2 cores, AVX-512, float32)
    "cpu": {"primer": 76, "alpha_profile": 2, "layer_ablation": 29, "importance_vs_alpha": 1, "pruning": 87,
            "healing": 20, "task_accuracy": 105, "sublayers": 42, "predictors": 1, "depth_series": 9,
            "spectral_lifecycle": 1, "teaching": 1, "across_models": 3, "claims": 1},
    "class": {"primer": 20, "alpha_profile": 2, "layer_ablation": 7, "importance_vs_alpha": 1, "pruning": 11,
              "healing": 8, "task_accuracy": 11, "sublayers": 13, "predictors": 1, "depth_series": 2,
              "spectral_lifecycle": 1, "teaching": 1, "across_models": 3, "claims": 1},
    "gpu": {},
}
DEFAULT_REFERENCE_FORWARDS = 10
REFERENCE_SEQ_LEN = 256         # the reference forward: 8 windows of 256 tokens
REFERENCE_SECONDS_GUESS = 5.0   # a reference forward's seconds when it could not be timed (2 cores, AVX-512)
REFERENCE_AROUND_SECONDS = 30.0  # a chapter expected to take longer is followed by a reference forward (one more
#                                  timing, ~3 s): its unit is the mean of the timings just before and after it
PROGRESS_EVERY = 5              # seconds between updates of the estimate
# The note at the top of every page of a build at a budget other than the default (a Markdown cell).
BUDGET_NOTES = {
    "class": ":::{note}\nThis is a **class build** (`zones book --budget class`): every chapter runs on small "
             "token budgets, few seeds and a tiny depth series, so its intervals are wider than those of the "
             "default build and more of its verdicts are inconclusive. `zones book` builds the full book.\n:::",
    "gpu": ":::{note}\nThis page was built at the **gpu** budget (`zones book --budget gpu`): larger token "
           "budgets and the paper's depth series.\n:::",
}


class ChapterFailed(RuntimeError):
    """A chapter notebook raised while executing."""


def project_root(start: Path | None = None) -> Path:
    """The folder holding ``_toc.yml`` (searched upwards from ``start`` or the cwd)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "_toc.yml").exists() and (folder / "notebooks").is_dir():
            return folder
    raise FileNotFoundError("no _toc.yml with a notebooks/ folder here or above: run from the zones checkout")


def chapters(root: Path) -> list[str]:
    """Chapter names in table-of-contents order."""
    toc = yaml.safe_load((root / "_toc.yml").read_text())
    names = []

    def walk(entries):
        for entry in entries or []:
            file = str(entry.get("file", ""))
            if file.startswith("book/chapters/"):
                names.append(file.removeprefix("book/chapters/"))
            walk(entry.get("sections"))

    walk(toc.get("chapters"))
    return names


def execution_order(names: list[str]) -> list[str]:
    """``names`` in table-of-contents order, but the ``RUN_LAST`` chapters after all others, in
    ``RUN_LAST``'s order (the scorecard last)."""
    return [n for n in names if n not in RUN_LAST] + [n for n in RUN_LAST if n in names]


def mathjax_source() -> Path:
    """MathJax's single-file TeX-to-SVG build, from the installed ``django-static-mathjax``."""
    spec = importlib.util.find_spec("mathjax")
    folders = list(spec.submodule_search_locations or []) if spec else []
    for folder in folders:
        path = Path(folder) / "static" / "mathjax" / "es5" / MATHJAX_FILE
        if path.exists():
            return path
    raise FileNotFoundError(f"MathJax ({MATHJAX_FILE}) not found: install the {MATHJAX_PACKAGE} package "
                            f"(`pip install -e .` does) so that formulas typeset without a network")


def write_static_assets(static_dir: Path) -> list[Path]:
    """Copy every script the pages load into ``static_dir``: Vega's bundle and MathJax."""
    mathjax = Path(static_dir) / "mathjax" / MATHJAX_FILE
    data = mathjax_source().read_bytes()
    if not mathjax.exists() or mathjax.read_bytes() != data:
        mathjax.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(mathjax, data)
    return [write_vega_bundle(static_dir), mathjax]


def drop_progress_widgets(path: Path) -> int:
    """Remove progress bars (tqdm widgets) from an executed notebook, and its saved widget
    state when no other widget is left; return the number of bars removed.

    A bar is noise in a page, and any widget makes myst-nb add require.js and the
    jupyter-widgets embed script, both from CDNs, to the page.
    """
    notebook = nbformat.read(path, as_version=4)
    bar = re.compile(r"\d+%\|.*\|\s*\d+/\S+")  # "name:  40%|████  | 2/5 [00:01<00:02, ...]"
    removed, widgets_left = 0, False
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if WIDGET_VIEW in data:
                if bar.search(str(data.get("text/plain", ""))):
                    removed += 1
                    continue
                widgets_left = True
            kept.append(output)
        cell["outputs"] = kept
    if not removed and ("widgets" not in notebook.metadata or widgets_left):
        return 0
    if not widgets_left:
        notebook.metadata.pop("widgets", None)
    nbformat.write(notebook, path)
    return removed


LOG_LINE = re.compile(r"^zones( [a-z]+)?: ")  # "zones: converting ...", "zones book: ..."


def drop_log_lines(path: Path) -> list[str]:
    """Remove the library's log lines (``zones: converting … gguf``) from the printed output of
    an executed notebook, and return them: they belong in the terminal, not in the page. A
    printed output left empty is removed."""
    notebook = nbformat.read(path, as_version=4)
    dropped = []
    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                lines = str(output.get("text", "")).splitlines(keepends=True)
                logs = [line for line in lines if LOG_LINE.match(line)]
                if logs:
                    dropped += [line.rstrip("\n") for line in logs]
                    output["text"] = "".join(line for line in lines if not LOG_LINE.match(line))
                    if not output["text"].strip():
                        continue
            kept.append(output)
        cell["outputs"] = kept
    if dropped:
        nbformat.write(notebook, path)
    return dropped


def chapter_source(root: Path, name: str) -> Path:
    """``notebooks/NAME.md``, the committed text of chapter ``name``."""
    source = Path(root) / "notebooks" / f"{name}.md"
    if not source.exists():
        raise FileNotFoundError(f"_toc.yml lists chapter {name!r} but {source} does not exist")
    return source


def as_ipynb(source: Path, folder: Path, note: str | None = None) -> Path:
    """A MyST (``.md``) notebook written as a clean ``.ipynb`` in ``folder``; an ``.ipynb``
    source is returned as it is unless a ``note`` is to be added (see :func:`add_note`)."""
    source = Path(source)
    if source.suffix == ".ipynb" and note is None:
        return source
    notebook = nbformat.read(source, as_version=4) if source.suffix == ".ipynb" else jupytext.read(source)
    notebook.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                                "language": "python"})
    if note:
        add_note(notebook, note)
    target = Path(folder) / f"{source.stem}.source.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return target


def add_note(notebook, note: str) -> None:
    """Put the Markdown ``note`` at the top of the page: after the cell holding its title, or first."""
    cells = notebook.cells
    first = next((i for i, c in enumerate(cells) if c.cell_type == "markdown" and c.source.lstrip().startswith("# ")),
                 None)
    cells.insert(0 if first is None else first + 1, nbformat.v4.new_markdown_cell(note))


def declared_parameters(source: Path) -> dict[str, Any]:
    """The parameters a chapter (``.md`` or ``.ipynb``) declares, as papermill reads them."""
    with tempfile.TemporaryDirectory() as tmp:
        return papermill.inspect_notebook(str(as_ipynb(source, Path(tmp))))


def chapter_parameters(notebook: Path, given: dict[str, Any], declared: dict[str, Any] | None = None
                       ) -> dict[str, Any]:
    """The subset of ``given`` that ``notebook`` declares in its parameters cell (``declared``:
    its ``declared_parameters``, when already read)."""
    declared = declared_parameters(notebook) if declared is None else declared
    return {key: value for key, value in given.items() if key in declared}


def name_values(items: list[str], flag: str = "--param") -> dict[str, str]:
    """``NAME=VALUE`` flags (``--param``) as a dict of their texts."""
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{flag} needs NAME=VALUE, not {item!r}")
        values[name.strip()] = value
    return values


def check_parameters(given: dict[str, Any], declared: dict[str, dict[str, Any]], *,
                     from_text: bool = False) -> dict[str, Any]:
    """Refuse a parameter that no chapter declares (``declared``: chapter -> its parameters),
    naming the parameters they do declare; return the values checked against their types in the
    glossary (``from_text``: the values are YAML texts, as ``zones book --param`` gives them).
    A bad value is one line naming the parameter, before any chapter runs."""
    known = sorted(set().union(*declared.values())) if declared else []
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown chapter parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                         f"the chapter{'s' if len(declared) > 1 else ''} {', '.join(declared)} declare "
                         f"{', '.join(known) or 'none'}")
    checked = {}
    for name, value in given.items():
        if name in TERMS:
            checked[name] = parse_text(name, value) if from_text else check_value(name, value)
        else:  # a chapter's own name outside the glossary (tests/test_glossary.py keeps the book's chapters in it)
            checked[name] = yaml.safe_load(value) if from_text else value
    return checked


FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?:[ =](-?\d+(?:\.\d+)?))?")  # a flag and the number after it


def book_wording(message: str, declared: dict[str, Any] | None = None) -> str:
    """An exception's first line as ``zones book`` says it: a command-line flag that is a
    parameter of the chapter (``--seq-len 256``) named as the book's (``--param seq_len=256``)."""
    line = next((part for part in str(message).splitlines() if part.strip()), "").strip()

    def book(match: re.Match) -> str:
        name = match.group(1).replace("-", "_")
        if declared is not None and name not in declared or name not in TERMS:
            return match.group(0)
        return f"--param {name}={match.group(2) or '...'}"

    return FLAG.sub(book, line)


def run_notebook(source: Path, target: Path, parameters: dict[str, Any] | None = None, *,
                 cwd: Path | None = None, note: str | None = None, kernel: ChapterKernel | None = None) -> Path:
    """Execute a chapter (``.md`` or ``.ipynb``) with papermill into ``target`` (``note``: a
    Markdown cell put at the top of the page), in a new kernel or in ``kernel`` (made fresh by
    its caller: :class:`zones.kernel.ChapterKernel`)."""
    shared = {} if kernel is None else {"km": kernel.manager}
    with tempfile.TemporaryDirectory() as tmp:
        notebook = as_ipynb(source, Path(tmp), note)
        # ``target`` exists from the start (a killed build's is found and removed under the lock), but
        # is written once, at the end (or with the failing cell's traceback): papermill's save after
        # every cell's start and end rewrites the whole notebook, outputs and all, ~0.5 s a chapter.
        shutil.copyfile(notebook, target)
        papermill.execute_notebook(str(notebook), str(target), parameters=parameters or {},
                                   cwd=str(cwd or Path(target).parent), kernel_name="python3",
                                   progress_bar=False, log_output=False, request_save_on_cell_execute=False,
                                   **shared)
    if kernel is not None:  # a shared kernel counts on from the chapter before: number the cells as a new one would
        renumber_cells(Path(target))
    return Path(target)


def renumber_cells(path: Path) -> None:
    """Number an executed notebook's code cells 1, 2, … (and their results) as a new kernel would."""
    notebook = nbformat.read(path, as_version=4)
    count = 0
    for cell in notebook.cells:
        if cell.cell_type != "code" or cell.get("execution_count") is None:
            continue
        count += 1
        cell.execution_count = count
        for output in cell.get("outputs", []):
            if "execution_count" in output:
                output["execution_count"] = count
    nbformat.write(notebook, str(path))


RUNNING_SUFFIX = ".running.ipynb"  # a chapter being executed; it becomes NAME.ipynb only when it finished


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
    whose message is its exception's one line (see :func:`book_wording`).

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


GENERATED = ("_build", "chapters", "mathjax", "vega-bundle.js", ".*")  # written by the build, never copied


def copy_project(dest: Path, names: list[str] | None = None, root: Path | None = None) -> Path:
    """A copy of the book's sources (config, pages, chapters ``names`` or all) in ``dest``, to
    build there without touching this checkout's ``book/``; the toc keeps only those chapters."""
    root = project_root(root)
    names = chapters(root) if names is None else list(names)
    dest = Path(dest)
    (dest / "notebooks").mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(chapter_source(root, name), dest / "notebooks")
    shutil.copytree(root / "book", dest / "book", ignore=shutil.ignore_patterns(*GENERATED), dirs_exist_ok=True)
    shutil.copy(root / "_config.yml", dest)
    toc = yaml.safe_load((root / "_toc.yml").read_text())

    def keep(entries):
        kept = []
        for entry in entries or []:
            file = str(entry.get("file", ""))
            if file.startswith("book/chapters/") and file.removeprefix("book/chapters/") not in names:
                continue
            if "sections" in entry:
                entry = dict(entry, sections=keep(entry["sections"]))
            kept.append(entry)
        return kept

    toc["chapters"] = keep(toc.get("chapters"))
    (dest / "_toc.yml").write_text(yaml.safe_dump(toc, sort_keys=False, allow_unicode=True))
    return dest


# --- the time budget: reference forwards, the record of each build, the estimate of the time left ----

def reference_forward_seconds(repeats: int = 2) -> float | None:
    """Seconds of one reference forward on this machine now: the default model (SmolLM2-135M)
    in float32 over 2,048 tokens (8 stdlib eval windows of 256), body and LM head, the fastest
    of ``repeats`` after a one-window warm-up (about ``repeats`` + 0.2 reference forwards, and
    the model's load: a cold cache converts it here, once, instead of in the first chapter).
    ``None`` when the default model cannot be loaded (the estimate then runs on seconds)."""
    import torch

    from zones.core.data import corpus_windows
    from zones.core.models import DEFAULT_MODEL, load_model
    from zones.core.progress import REFERENCE_TOKENS

    try:
        loaded = load_model(DEFAULT_MODEL)
        windows = corpus_windows("stdlib", loaded.tokenizer, REFERENCE_SEQ_LEN, "eval",
                                 REFERENCE_TOKENS - REFERENCE_TOKENS // REFERENCE_SEQ_LEN)
    except Exception as err:  # the estimate is a courtesy: never stop a build over it
        print(f"zones book: no reference forward ({err}); estimating in seconds", file=sys.stderr)
        return None
    ids = windows.input_ids
    times = []
    with torch.inference_mode():
        loaded.model(input_ids=ids[:1], use_cache=False)
        for _ in range(repeats):
            start = time.perf_counter()
            loaded.model(input_ids=ids, use_cache=False)
            times.append(time.perf_counter() - start)
    return min(times)


def _timings_entry(parameters: dict[str, Any]) -> tuple[Path, dict]:
    parts = dict(kind="book_timings", parameters=parameters)
    return entry_path("book", parts, ext="seconds"), parts  # a JSON payload; its sidecar is the .json


def last_record(parameters: dict[str, Any]) -> dict[str, Any]:
    """The record of the last build with these parameters: ``reference_seconds`` (a reference
    forward's seconds then, before the chapters; ``reference_seconds_end``: after them), ``machine``, and ``chapters``: per chapter ``seconds``,
    ``reference_forwards`` (seconds / reference_seconds) and ``work`` (the reference forwards of
    work it counted, ``zones.core.progress``). ``{}`` if none; a damaged record is reported and
    ignored (only the estimate rests on it)."""
    path, parts = _timings_entry(parameters)
    try:
        found = read_entry(path, parts)
    except CacheError as err:
        print(f"zones book: {err}; estimating from the expected times instead", file=sys.stderr)
        return {}
    if found is None:
        return {}
    record = json.loads(found[0])
    if not isinstance(record, dict):
        return {}
    if "chapters" not in record:  # a record of seconds only (an older zones)
        record = dict(chapters={k: dict(seconds=float(v)) for k, v in record.items()})
    return record


def last_timings(parameters: dict[str, Any]) -> dict[str, float]:
    """Seconds each chapter took in the last build with these parameters ({} if none)."""
    return {k: float(v["seconds"]) for k, v in last_record(parameters).get("chapters", {}).items()}


def _store_timing(parameters: dict[str, Any], name: str, seconds: float, *, reference: float | None = None,
                  work: float | None = None, start: float | None = None) -> None:
    """Add chapter ``name``'s cost to the record (seconds; with a reference forward's seconds
    ``reference``, measured on this machine in this build around the chapter, also those and the
    reference forwards; ``work``: the reference forwards it counted; ``start``: the reference
    forward timed before the build's first chapter, the record's ``reference_seconds``)."""
    record = last_record(parameters)
    entry = dict(seconds=round(seconds, 1))
    if reference:
        entry["reference_forwards"] = round(seconds / reference, 1)
        entry["reference_seconds"] = round(reference, 3)  # the chapter's own: records merge builds
        record["reference_seconds"] = round(start or reference, 3)
        record["machine"] = machine_line()
    if work is not None:
        entry["work"] = round(work, 2)
    record.setdefault("chapters", {})[name] = entry
    _write_record(parameters, record)


def _store_reference_end(parameters: dict[str, Any], seconds: float) -> None:
    """Add the reference forward timed after the chapters to the record (``reference_seconds_end``)."""
    _write_record(parameters, {**last_record(parameters), "reference_seconds_end": round(seconds, 3)})


def _write_record(parameters: dict[str, Any], record: dict[str, Any]) -> None:
    path, parts = _timings_entry(parameters)
    write_entry(path, parts, json.dumps(record, indent=2, sort_keys=True).encode())


def overhead_line(seconds: float, work: float, before: float, after: float | None,
                  around: float | None = None) -> str:
    """The build's closing line: the chapters' seconds, the work they counted (reference
    forwards, RF) and the overhead, seconds / (work × a reference forward's seconds): on the
    reference forwards timed around each chapter (``around``: Σ work × the chapter's own timing,
    RF·s; :data:`REFERENCE_AROUND_SECONDS`), then on the mean of the one timed before the chapters
    and the one timed after them, and on each (a machine's speed drifts within a build, and the
    unit with it)."""
    head = f"zones book: the chapters took {seconds:,.0f} s and counted {work:.1f} RF of work"
    if work <= 0:
        return head
    if not after:
        return f"{head}; overhead {seconds / (work * before):.2f}× (a reference forward: {before:.2f} s)"
    unit = (before + after) / 2
    near = f"{seconds / around:.2f}× on the reference forwards timed around each chapter, " if around else ""
    return (f"{head}; overhead {near}{seconds / (work * unit):.2f}× on the mean reference forward, "
            f"{seconds / (work * before):.2f}× on the one before the chapters ({before:.2f} s) and "
            f"{seconds / (work * after):.2f}× on the one after them ({after:.2f} s)")


def machine_line() -> str:
    """The CPU, PyTorch's kernels, native bf16 or not, and the threads: what a timing ran on."""
    import platform

    import torch

    from zones.core.hardware import cpu_capability, native_bf16

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return (f"{name}; PyTorch capability {cpu_capability()}; native bf16: {native_bf16('cpu')}; "
            f"threads {torch.get_num_threads()}")


def budget_scale(chapter: str, declared: dict[str, Any], given: dict[str, Any],
                 base: str = DEFAULT_BUDGET) -> float | None:
    """How many times the ``base`` budget's tokens ``chapter`` is ``given``: the sum of the token
    parameters it ``declared`` (glossary type ``tokens``) in ``given`` (else their cpu default,
    the notebook's own) over their sum at the ``base`` budget. 1.0 when it declares none (nothing to
    scale by); None when one is the whole split (None or 0: its size is not known here). Seeds and
    depths that a budget also changes are not weighed: a scaled cost is a rough guess until measured."""
    names = [n for n in declared if n in TERMS and TERMS[n].type == "tokens"]
    if not names:
        return 1.0
    now = [given.get(n, default(n, DEFAULT_BUDGET, chapter)) for n in names]
    then = [default(n, base, chapter) for n in names]
    if not all(isinstance(v, (int, float)) and v > 0 for v in then + now):
        return None
    return float(sum(now)) / float(sum(then))


def expected_forwards(name: str, budget: str = DEFAULT_BUDGET, scale: float | None = 1.0) -> float | None:
    """Chapter ``name``'s expected reference forwards at ``budget``, times ``scale`` (its tokens
    over those of the budget measured, :func:`budget_scale`): measured at ``budget``
    (``EXPECTED_REFERENCE_FORWARDS[budget]``), else at the cpu budget; None (no estimate) when
    the scale is unknown."""
    if scale is None:
        return None
    return float(EXPECTED_REFERENCE_FORWARDS[measured_budget(name, budget)].get(name, DEFAULT_REFERENCE_FORWARDS)) \
        * scale


def measured_budget(name: str, budget: str) -> str:
    """The budget whose expected cost of chapter ``name`` stands for ``budget``'s: itself where
    measured, else the cpu budget (scaled)."""
    return budget if name in EXPECTED_REFERENCE_FORWARDS.get(budget, {}) else DEFAULT_BUDGET


def chapter_costs(names: list[str], parameters: dict[str, Any], budget: str = DEFAULT_BUDGET,
                  scales: dict[str, float | None] | None = None) -> dict[str, dict[str, Any]]:
    """Each chapter's expected cost: ``reference_forwards`` (its last build with these
    parameters, else :func:`expected_forwards` at ``budget`` with its ``scales`` entry, default
    1.0), ``work`` (the work it counted then, else the same number: counted work is about one
    reference forward per reference forward of time) and ``estimated`` (False when there is no
    estimate: the chapter then weighs its cpu cost on the bar, and no time is quoted for it)."""
    record = last_record(parameters)
    last, reference = record.get("chapters", {}), record.get("reference_seconds")
    costs = {}
    for name in names:
        entry = last.get(name, {})
        forwards = entry.get("reference_forwards")
        if forwards is None and "seconds" in entry and reference:
            forwards = entry["seconds"] / reference
        if forwards is None and "seconds" in entry:
            forwards = entry["seconds"] / REFERENCE_SECONDS_GUESS
        estimated = True
        if forwards is None:
            forwards = expected_forwards(name, budget, (scales or {}).get(name, 1.0))
        if forwards is None:  # a weight for the bar only
            forwards, estimated = expected_forwards(name, DEFAULT_BUDGET), False
        work = entry.get("work") or forwards
        costs[name] = dict(reference_forwards=max(0.1, float(forwards)), work=max(0.1, float(work)),
                           estimated=estimated)
    return costs


def book_costs(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
               budget: str = DEFAULT_BUDGET, models: list[str] | None = None,
               declared: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`chapter_costs` of chapters ``names`` of the project at ``root`` as ``zones book``
    would run them (``--budget``, ``--only``, ``--param``, ``--models``): each chapter's
    values at that budget, its token budgets scaled against the notebook's (:func:`budget_scale`)."""
    declared = declared or {n: declared_parameters(chapter_source(root, n)) for n in names}
    parameters = dict(parameters or {})
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters, **({"budget": budget} if budget != DEFAULT_BUDGET else {})}
    scales = {n: budget_scale(n, declared[n], chapter_values(n, declared[n], budget, implicit, parameters),
                              base=measured_budget(n, budget)) for n in names}
    return chapter_costs(names, key, budget, scales)


def estimate_source(names: list[str], budget: str, key: dict[str, Any]) -> str:
    """What the opening estimate rests on: the last build with these parameters (``key``), else the
    expected costs, "scaled from the cpu budget by tokens" where ``budget`` was not measured for a
    chapter (:func:`measured_budget`)."""
    if last_timings(key):
        return "the last build"
    scaled = any(measured_budget(n, budget) != budget for n in names)
    return f"the expected costs{', scaled from the cpu budget by tokens' if scaled else ''}"


def opening_line(names: list[str], costs: dict[str, dict[str, Any]], budget: str, seconds_per_forward: float,
                 source: str) -> str:
    """The build's first estimate: the chapters, the budget, the minutes and reference forwards
    of those with an estimate, and the chapters with none."""
    known = sum(c["reference_forwards"] for c in costs.values() if c.get("estimated", True))
    missing = [n for n in names if not costs[n].get("estimated", True)]
    line = (f"zones book: {len(names)} chapter{'s' if len(names) != 1 else ''} at the {budget} budget, about "
            f"{known * seconds_per_forward / 60:.0f} min ({known:.0f} reference forwards; {source})")
    return line + (f"; no estimate for {', '.join(missing)} (not measured at this budget)" if missing else "")


class Estimate:
    """The time left, from the work done: chapters done count their expected reference forwards,
    the running chapter the share of its expected work it has counted so far (never quite all of
    it), and a reference forward costs what it cost in the chapters done (before the first
    ends: the reference forward timed at the start)."""

    def __init__(self, costs: dict[str, dict[str, float]], reference: float | None):
        self.costs, self.reference = costs, reference or REFERENCE_SECONDS_GUESS
        self.total = sum(c["reference_forwards"] for c in costs.values())
        self.done = 0.0          # expected reference forwards of the chapters done
        self.done_seconds = 0.0
        # chapters with no estimate (a budget not measured): on the bar, but no time is quoted for them
        self.unknown = {n for n, c in costs.items() if not c.get("estimated", True)}

    def position(self, name: str | None = None, work: float = 0.0) -> float:
        """Reference forwards done, with ``work`` counted so far in the running chapter ``name``."""
        if name is None:
            return self.done
        cost = self.costs[name]
        return self.done + min(work / cost["work"], RUNNING_CAP) * cost["reference_forwards"]

    def finish(self, name: str, seconds: float) -> None:
        self.done += self.costs[name]["reference_forwards"]
        self.done_seconds += seconds
        self.unknown.discard(name)

    def seconds_per_forward(self) -> float:
        return self.done_seconds / self.done if self.done > 0 and self.done_seconds > 0 else self.reference

    def seconds_left(self, position: float) -> float:
        """Seconds left after ``position``, not counting the chapters with no estimate still to run."""
        unknown = sum(self.costs[n]["reference_forwards"] for n in self.unknown)
        return max(0.0, self.total - position - unknown) * self.seconds_per_forward()


def chapter_values(name: str, declared: dict[str, Any], budget: str, implicit: dict[str, Any],
                   parameters: dict[str, Any]) -> dict[str, Any]:
    """What chapter ``name`` is given: the ``budget``'s values of the parameters it declares
    (none at the default budget: its cells hold those), then ``implicit`` (``models``) and the
    explicit ``parameters`` it declares, each winning over the one before."""
    given = {**preset(budget, name, declared), **implicit, **parameters}
    return {key: value for key, value in given.items() if key in declared}


def execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
                     models: list[str] | None = None, budget: str = DEFAULT_BUDGET, from_text: bool = False,
                     progress: bool = True, time_reference: bool = True) -> list[Path]:
    """Execute chapters ``names`` in order, under one progress bar with an estimate of the time
    left (terminal only; :class:`Estimate`). ``models`` (a list; one string is one model) is
    given to the chapters that declare ``models``; ``budget`` gives each chapter that budget's
    values (the glossary's presets); every key of ``parameters`` must be declared by one of the
    chapters, and every value fit its type (``from_text``: YAML texts): both are checked before
    any chapter runs. A reference forward is timed first (:func:`reference_forward_seconds`;
    ``time_reference=False`` skips it: the estimate then assumes ``REFERENCE_SECONDS_GUESS``), and each
    chapter's seconds, reference forwards and counted work are recorded (:func:`last_record`)."""
    with project_lock(root, log=lambda message: print(message, file=sys.stderr, flush=True)):
        return _execute_chapters(root, names, parameters, models=models, budget=budget, from_text=from_text,
                                 progress=progress, time_reference=time_reference)


def time_unit(kernel: ChapterKernel, repeats: int = 2) -> float | None:
    """A reference forward's seconds, timed in the chapters' ``kernel``
    (:meth:`zones.kernel.ChapterKernel.reference_forward_seconds`)."""
    return kernel.reference_forward_seconds(repeats=repeats)


def _execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None, *,
                      models: list[str] | None, budget: str, from_text: bool, progress: bool,
                      time_reference: bool) -> list[Path]:
    budget = check_value("budget", budget)
    declared = {n: declared_parameters(chapter_source(root, n)) for n in names}
    parameters = check_parameters(dict(parameters or {}), declared, from_text=from_text)  # before any chapter runs
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters, **({"budget": budget} if budget != DEFAULT_BUDGET else {})}
    costs = book_costs(root, names, parameters, budget=budget, models=models, declared=declared)

    def say(message: str) -> None:  # above the bar, in the terminal
        tqdm.write(message, file=sys.stderr) if progress else print(message, flush=True)

    with ChapterKernel() as kernel:   # the chapters' process: the unit is timed there too
        reference = time_unit(kernel) if names and time_reference else None
        estimate = Estimate(costs, reference)
        if reference:
            say(f"zones book: a reference forward (SmolLM2-135M, float32, 2,048 tokens) takes {reference:.2f} s here")
        say(opening_line(names, costs, budget, estimate.seconds_per_forward(), estimate_source(names, budget, key)))
        quiet = quiet_nested_bars(progress)  # other tools' bars (in this process) stay out of the book's line
        terminal = quiet.__enter__()
        bar = tqdm(total=max(estimate.total, 1e-9), unit="ref", file=terminal, disable=not progress,
                   desc=f"zones book: chapter 1/{len(names)} {names[0]}" if names else "zones book",
                   bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed{postfix}")
        running: dict[str, Any] = dict(name=None, file=None)
        stop = threading.Event()

        def refresh():  # the estimate moves with the work the running chapter reports
            work = read_progress(running["file"]) if running["file"] else 0.0
            position = estimate.position(running["name"], work)
            bar.n = min(position, bar.total)
            unknown = f" + {len(estimate.unknown)} chapter(s) with no estimate" if estimate.unknown else ""
            bar.set_postfix_str(f"about {clock(estimate.seconds_left(position))} left{unknown}", refresh=False)
            bar.refresh()

        def tick():
            while not stop.wait(PROGRESS_EVERY):
                refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        refresh()
        ticker.start()
        done = []
        spent = counted = around = 0.0   # the chapters' seconds, work and work × unit, for the closing line
        latest = reference               # the last reference forward timed
        try:
            with tempfile.TemporaryDirectory(prefix="zones-progress-") as folder:
                for k, name in enumerate(names, 1):
                    bar.set_description_str(f"zones book: chapter {k}/{len(names)} {name}")
                    running.update(name=name, file=Path(folder) / f"{name}.work")
                    long = bool(reference) and (costs[name]["reference_forwards"] * estimate.seconds_per_forward()
                                                >= REFERENCE_AROUND_SECONDS)
                    before = latest
                    start = time.time()
                    given = chapter_values(name, declared[name], budget, implicit, parameters)
                    done.append(execute_chapter(root, name, given, declared[name], log=say, note=BUDGET_NOTES.get(budget),
                                                 progress_file=running["file"], kernel=kernel))
                    seconds = time.time() - start
                    work = read_progress(running["file"])
                    if long:   # the unit drifts with the machine: a long chapter is weighed on the timings around it
                        # the fastest of two: the first forward after a chapter can run at half speed
                        # (one build timed 5.62 s after the primer, against 2.58 s before it)
                        latest = time_unit(kernel, repeats=2) or latest
                    unit = (before + latest) / 2 if reference else None
                    _store_timing(key, name, seconds, reference=unit, work=work, start=reference)
                    spent, counted = spent + round(seconds, 1), counted + round(work, 2)   # as recorded
                    around += round(work, 2) * round(unit, 3) if unit else 0.0
                    estimate.finish(name, seconds)
                    running.update(name=None, file=None)
                    refresh()
                    cost = f", {seconds / unit:.0f} reference forwards" if unit else ""
                    say(f"zones book: {name} done in {seconds:.0f} s{cost} ({work:.0f} counted)")
            if reference and done:  # the unit moves with the machine: time it again at the end
                after = time_unit(kernel)
                if after:
                    _store_reference_end(key, after)
                say(overhead_line(spent, counted, reference, after, around))
        finally:
            stop.set()
            bar.close()
            quiet.__exit__(None, None, None)
        return done


SUMMARY_PAGE = Path("book") / "chapters" / "claims_summary.md"   # the scorecard writes it; the intro includes it


def write_chapter_placeholder(root: Path, name: str) -> bool:
    """A page for chapter ``name`` when it was never executed in this project (a build with
    ``--only`` on a fresh clone): its title and a line saying how to build it. An executed
    chapter is never touched. Returns whether a placeholder was written."""
    target = root / "book" / "chapters" / f"{name}.ipynb"
    if target.exists():
        return False
    title = next((line.lstrip("#").strip() for line in chapter_source(root, name).read_text().splitlines()
                  if line.startswith("# ")), name)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell(
        f"# {title}\n\nThis chapter has not been executed in this build (it was built with `zones book --only`). "
        f"`zones book --only {name}` executes it; `zones book` executes every chapter.")]
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, nbformat.writes(notebook))
    return True


def write_summary_placeholder(root: Path) -> bool:
    """A book built without the scorecard chapter (a partial copy, say) still needs the verdict
    list the front page includes: write a line saying where it comes from, unless it exists."""
    path = root / SUMMARY_PAGE
    if path.exists():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, "The verdict list appears here once the scorecard chapter (`claims`) has run "
                            "with the book.\n")
    return True


def build_book(parameters: dict[str, Any] | None = None, only: list[str] | None = None,
               root: Path | None = None, execute: bool = True, models: list[str] | None = None,
               budget: str = DEFAULT_BUDGET, from_text: bool = False, progress: bool = True) -> Path:
    """Execute the chapters (all, or ``only``) and build the HTML book; return its index.

    ``parameters`` go to the chapters that declare them (one that none of the executed
    chapters declares is refused; ``from_text``: their values are YAML texts); ``models`` to
    those that declare ``models``; ``budget`` (class, cpu, gpu) gives every chapter that
    budget's values, under ``parameters``. Everything is checked before any chapter runs.
    """
    root = project_root(root)
    names = chapters(root)
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"unknown chapter(s) {unknown}; the book has {names}")
    with project_lock(root, log=lambda message: print(message, file=sys.stderr, flush=True)):
        return _build_book(root, names, parameters, only, execute, models, budget, from_text, progress)


def _build_book(root: Path, names: list[str], parameters: dict[str, Any] | None, only: list[str] | None,
                execute: bool, models: list[str] | None, budget: str, from_text: bool, progress: bool) -> Path:
    if execute:
        order = [n for n in execution_order(names) if not only or n in only]
        with counting() as tally:  # the cache entries the chapters' kernels read and computed
            execute_chapters(root, order, parameters, models=models, budget=budget, from_text=from_text,
                             progress=progress)
        print(f"zones book: {tally.sentence()}", file=sys.stderr, flush=True)
    for name in names:  # chapters never executed here (``--only`` on a fresh clone) get a page saying so
        write_chapter_placeholder(root, name)
    write_static_assets(root / "book" / "_static")
    write_summary_placeholder(root)
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book), "build", str(root), "--path-output",
               str(root / "book"), "--warningiserror", "--nitpick", "--keep-going"]
    print("zones book: building HTML", flush=True)
    subprocess.run(command, check=True, cwd=root)
    return root / "book" / "_build" / "html" / "index.html"


def lab_folder(root: Path, budget: str) -> Path:
    """The chapters as notebooks with ``budget``'s values, for JupyterLab: ``lab/BUDGET/NAME.ipynb``
    under ``root``, each with the budget's values injected after its parameters cell (as
    papermill does) and the budget's note at its top; no code of its own. A notebook already
    there is kept (a student's edits survive); delete it for a fresh copy."""
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    budget = check_value("budget", budget)
    folder = Path(root) / "lab" / budget
    folder.mkdir(parents=True, exist_ok=True)
    for name in chapters(root):
        target = folder / f"{name}.ipynb"
        if target.exists():
            print(f"zones lab: kept {target} (delete it for a fresh copy)", file=sys.stderr)
            continue
        source = chapter_source(root, name)
        with tempfile.TemporaryDirectory() as tmp:  # papermill's own reading: the metadata it expects
            notebook = load_notebook_node(str(as_ipynb(source, Path(tmp))))
        values = chapter_values(name, declared_parameters(source), budget, {}, {})
        if values:
            notebook = parameterize_notebook(notebook, values, comment=f"The {budget} budget's values "
                                             f"(zones.core.glossary)", kernel_name="python3", language="python")
        if BUDGET_NOTES.get(budget):
            add_note(notebook, BUDGET_NOTES[budget])
        nbformat.write(notebook, target)
    return folder


def budget_table(root: Path | None = None) -> list[dict[str, str]]:
    """The presets of the book's chapters (``zones.core.glossary.budget_table`` over the
    parameters each chapter declares, in the book's order): the README's budget table."""
    from zones.core.glossary import budget_table as table

    root = project_root(root)
    return table({name: declared_parameters(chapter_source(root, name)) for name in chapters(root)})
