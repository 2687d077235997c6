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
Chapters that read the others' tables (``RUN_LAST``: the claims scorecard) execute after them,
wherever ``_toc.yml`` places them.

The terminal shows one progress bar over the chapters, with the time elapsed and an
estimate of the time left: each chapter weighs its seconds in the last build with the same
parameters (kept in the cache, ``cache_dir()/book``), else its ``EXPECTED_SECONDS``, and the
bar's rate turns those weights into this machine's time. Nothing of it reaches the pages.

Every asset a page loads ships with the build: Vega (``zones.figures``) and MathJax (from
the ``django-static-mathjax`` package) are copied into ``book/_static``, and progress bars
left in an executed chapter (tqdm widgets, which would make the page load require.js and
the widget manager from CDNs) are removed with the widget state. The library's log lines
(``zones: converting … gguf``) leave the pages for the terminal (``drop_log_lines``).
"""
from __future__ import annotations

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

from zones.core.cache import CacheError, atomic_write_bytes, atomic_write_text, entry_path, read_entry, write_entry
from zones.core.checks import check_models
from zones.core.glossary import DEFAULT_BUDGET, TERMS, check_value, parse_text, preset
from zones.figures import BOOK_MODE_ENV, write_vega_bundle

RUN_LAST = ("claims",)  # chapters that read the tables the other chapters wrote
MATHJAX_PACKAGE = "django-static-mathjax"
MATHJAX_FILE = "tex-svg-full.js"  # TeX input, SVG output, every extension: no fonts or extensions to fetch
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# seconds a chapter takes cold on 2 cores with its default parameters (the book's time budget);
# a chapter not listed weighs DEFAULT_SECONDS, and a chapter's last build replaces the guess
EXPECTED_SECONDS = {"alpha_profile": 30, "layer_ablation": 240, "importance_vs_alpha": 10, "pruning": 240,
                    "depth_series": 300, "spectral_lifecycle": 10, "healing": 150, "sublayers": 120,
                    "predictors": 30, "claims": 5}
DEFAULT_SECONDS = 60
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
    """``names`` in table-of-contents order, but the ``RUN_LAST`` chapters after all others."""
    return [n for n in names if n not in RUN_LAST] + [n for n in names if n in RUN_LAST]


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
                 cwd: Path | None = None, note: str | None = None) -> Path:
    """Execute a chapter (``.md`` or ``.ipynb``) with papermill into ``target`` (``note``: a
    Markdown cell put at the top of the page)."""
    with tempfile.TemporaryDirectory() as tmp:
        papermill.execute_notebook(str(as_ipynb(source, Path(tmp), note)), str(target), parameters=parameters or {},
                                   cwd=str(cwd or Path(target).parent), kernel_name="python3",
                                   progress_bar=False, log_output=False)
    return Path(target)


def execute_chapter(root: Path, name: str, parameters: dict[str, Any],
                    declared: dict[str, Any] | None = None, log=print, note: str | None = None) -> Path:
    """Execute chapter ``name`` with the ``parameters`` it declares into ``book/chapters``
    (``note``: a Markdown cell at the top of its page). A failing chapter is a ``ChapterFailed``
    whose message is its exception's one line (see :func:`book_wording`)."""
    source = chapter_source(root, name)
    target_dir = root / "book" / "chapters"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.ipynb"
    # Executed into a side file, renamed only on success: a failed chapter is never built.
    running = target_dir / f"{name}.running.ipynb"
    failed = target_dir / f"{name}.failed.ipynb"
    target.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    params = chapter_parameters(source, parameters, declared)
    log(f"zones book: executing {name} with {params}")
    # The kernel inherits the environment: book mode, and no progress bars in the pages
    # (a bar in a notebook is a widget, and a widget makes the page load scripts from CDNs).
    quiet = {BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    saved = {key: os.environ.get(key) for key in quiet}
    os.environ.update(quiet)
    try:
        run_notebook(source, running, params, cwd=target_dir, note=note)
        drop_progress_widgets(running)
        for line in drop_log_lines(running):
            log(f"{name}: {line}")
        os.replace(running, target)
    except papermill.PapermillExecutionError as err:
        os.replace(running, failed)
        raise ChapterFailed(f"chapter {name} failed: {err.ename}: {book_wording(err.evalue, declared or params)} "
                            f"(the executed copy, with its traceback: {failed})") from err
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


def _timings_entry(parameters: dict[str, Any]) -> tuple[Path, dict]:
    parts = dict(kind="book_timings", parameters=parameters)
    return entry_path("book", parts, ext="seconds"), parts  # a JSON payload; its sidecar is the .json


def last_timings(parameters: dict[str, Any]) -> dict[str, float]:
    """Seconds each chapter took in the last build with these parameters ({} if none). Only an
    estimate rests on them: a damaged record is reported and ignored."""
    path, parts = _timings_entry(parameters)
    try:
        found = read_entry(path, parts)
    except CacheError as err:
        print(f"zones book: {err}; estimating from the expected times instead", file=sys.stderr)
        return {}
    if found is None:
        return {}
    timings = json.loads(found[0])
    return {k: float(v) for k, v in timings.items()} if isinstance(timings, dict) else {}


def _store_timing(parameters: dict[str, Any], name: str, seconds: float) -> None:
    path, parts = _timings_entry(parameters)
    timings = dict(last_timings(parameters), **{name: round(seconds, 1)})
    write_entry(path, parts, json.dumps(timings, indent=2, sort_keys=True).encode())


def chapter_weights(names: list[str], parameters: dict[str, Any]) -> dict[str, float]:
    """Each chapter's expected seconds: its last build with these parameters, else
    ``EXPECTED_SECONDS`` (``DEFAULT_SECONDS`` for a chapter not listed)."""
    last = last_timings(parameters)
    return {n: max(1.0, last.get(n, EXPECTED_SECONDS.get(n, DEFAULT_SECONDS))) for n in names}


def chapter_values(name: str, declared: dict[str, Any], budget: str, implicit: dict[str, Any],
                   parameters: dict[str, Any]) -> dict[str, Any]:
    """What chapter ``name`` is given: the ``budget``'s values of the parameters it declares
    (none at the default budget: its cells hold those), then ``implicit`` (``models``) and the
    explicit ``parameters`` it declares, each winning over the one before."""
    given = {**preset(budget, name, declared), **implicit, **parameters}
    return {key: value for key, value in given.items() if key in declared}


def execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
                     models: list[str] | None = None, budget: str = DEFAULT_BUDGET, from_text: bool = False,
                     progress: bool = True) -> list[Path]:
    """Execute chapters ``names`` in order, under one progress bar with an estimate of the time
    left (terminal only). ``models`` (a list; one string is one model) is given to the chapters
    that declare ``models``; ``budget`` gives each chapter that budget's values (the glossary's
    presets); every key of ``parameters`` must be declared by one of the chapters, and every
    value fit its type (``from_text``: YAML texts): both are checked before any chapter runs."""
    budget = check_value("budget", budget)
    declared = {n: declared_parameters(chapter_source(root, n)) for n in names}
    parameters = check_parameters(dict(parameters or {}), declared, from_text=from_text)  # before any chapter runs
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters, **({"budget": budget} if budget != DEFAULT_BUDGET else {})}
    weights = chapter_weights(names, key)

    def say(message: str) -> None:  # above the bar, in the terminal
        tqdm.write(message, file=sys.stderr) if progress else print(message, flush=True)

    minutes = sum(weights.values()) / 60
    say(f"zones book: {len(names)} chapters, about {minutes:.0f} min "
        f"({'the last build' if last_timings(key) else 'the expected times'})")
    bar = tqdm(total=round(sum(weights.values())), unit="s", file=sys.stderr, disable=not progress,
               desc=f"zones book: chapter 1/{len(names)} {names[0]}" if names else "zones book",
               bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed} elapsed, about {remaining} left")
    stop = threading.Event()

    def refresh():  # the bar's clock keeps running during a long chapter
        while not stop.wait(5):
            bar.refresh()

    ticker = threading.Thread(target=refresh, daemon=True)
    ticker.start()
    done = []
    try:
        for k, name in enumerate(names, 1):
            bar.set_description_str(f"zones book: chapter {k}/{len(names)} {name}")
            start = time.time()
            given = chapter_values(name, declared[name], budget, implicit, parameters)
            done.append(execute_chapter(root, name, given, declared[name], log=say, note=BUDGET_NOTES.get(budget)))
            seconds = time.time() - start
            _store_timing(key, name, seconds)
            bar.update(round(weights[name]))
            say(f"zones book: {name} done in {seconds:.0f} s")
    finally:
        stop.set()
        bar.close()
    return done


SUMMARY_PAGE = Path("book") / "chapters" / "claims_summary.md"   # the scorecard writes it; the intro includes it


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
    if execute:
        order = [n for n in execution_order(names) if not only or n in only]
        execute_chapters(root, order, parameters, models=models, budget=budget, from_text=from_text,
                         progress=progress)
    missing = [n for n in names if not (root / "book" / "chapters" / f"{n}.ipynb").exists()]
    if missing:
        raise FileNotFoundError(f"chapters never executed: {missing}; run without --only first")
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
