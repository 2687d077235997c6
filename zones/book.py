"""Build the report: execute each chapter notebook with papermill, then run Jupyter Book.

The chapters are the ``book/chapters/NAME`` entries of ``_toc.yml``; each is a MyST Markdown
notebook ``notebooks/NAME.md`` (jupytext), executed into ``book/chapters/NAME.ipynb``
(working directory ``book/chapters``, so a chapter's tables land in
``book/chapters/results/NAME``). Parameters are passed only to the notebooks that declare
them; a parameter that none of the chapters being executed declares is refused before any
runs, with the list of those they do declare (a misspelt ``n_resamplez`` is never dropped
silently). ``run_notebook`` is the one way the project executes a chapter (the book, the
tests). Chapters that read the others' tables (``RUN_LAST``: the claims scorecard) execute
after them, wherever ``_toc.yml`` places them.

The terminal shows one progress bar over the chapters, with the time elapsed and an
estimate of the time left: each chapter weighs its seconds in the last build with the same
parameters (kept in the cache, ``cache_dir()/book``), else its ``EXPECTED_SECONDS``, and the
bar's rate turns those weights into this machine's time. Nothing of it reaches the pages.

Every asset a page loads ships with the build: Vega (``zones.figures``) and MathJax (from
the ``django-static-mathjax`` package) are copied into ``book/_static``, and progress bars
left in an executed chapter (tqdm widgets, which would make the page load require.js and
the widget manager from CDNs) are removed with the widget state.
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


def chapter_source(root: Path, name: str) -> Path:
    """``notebooks/NAME.md``, the committed text of chapter ``name``."""
    source = Path(root) / "notebooks" / f"{name}.md"
    if not source.exists():
        raise FileNotFoundError(f"_toc.yml lists chapter {name!r} but {source} does not exist")
    return source


def as_ipynb(source: Path, folder: Path) -> Path:
    """A MyST (``.md``) notebook written as a clean ``.ipynb`` in ``folder``; an ``.ipynb``
    source is returned as it is."""
    source = Path(source)
    if source.suffix == ".ipynb":
        return source
    notebook = jupytext.read(source)
    notebook.metadata.setdefault("kernelspec", {"name": "python3", "display_name": "Python 3",
                                                "language": "python"})
    target = Path(folder) / f"{source.stem}.source.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    return target


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


def check_parameters(given: dict[str, Any], declared: dict[str, dict[str, Any]]) -> None:
    """Refuse a parameter that no chapter declares (``declared``: chapter -> its parameters),
    naming the parameters they do declare."""
    known = sorted(set().union(*declared.values())) if declared else []
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown chapter parameter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                         f"the chapter{'s' if len(declared) > 1 else ''} {', '.join(declared)} declare "
                         f"{', '.join(known) or 'none'}")


def run_notebook(source: Path, target: Path, parameters: dict[str, Any] | None = None, *,
                 cwd: Path | None = None) -> Path:
    """Execute a chapter (``.md`` or ``.ipynb``) with papermill into ``target``."""
    with tempfile.TemporaryDirectory() as tmp:
        papermill.execute_notebook(str(as_ipynb(source, Path(tmp))), str(target), parameters=parameters or {},
                                   cwd=str(cwd or Path(target).parent), kernel_name="python3",
                                   progress_bar=False, log_output=False)
    return Path(target)


def execute_chapter(root: Path, name: str, parameters: dict[str, Any],
                    declared: dict[str, Any] | None = None, log=print) -> Path:
    """Execute chapter ``name`` with the ``parameters`` it declares into ``book/chapters``."""
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
        run_notebook(source, running, params, cwd=target_dir)
        drop_progress_widgets(running)
        os.replace(running, target)
    except papermill.PapermillExecutionError as err:
        os.replace(running, failed)
        raise ChapterFailed(f"chapter {name!r} failed in cell {err.exec_count}:\n{err.source}\n"
                            f"{err.ename}: {err.evalue}\n(executed copy with the traceback: {failed})") from err
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


def execute_chapters(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
                     models: list[str] | None = None, progress: bool = True) -> list[Path]:
    """Execute chapters ``names`` in order, under one progress bar with an estimate of the time
    left (terminal only). ``models`` (a list; one string is one model) is given to the chapters
    that declare ``models``; every key of ``parameters`` must be declared by one of the chapters."""
    parameters = dict(parameters or {})
    declared = {n: declared_parameters(chapter_source(root, n)) for n in names}
    check_parameters(parameters, declared)  # before any chapter runs
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters}
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
            given = {**{p: v for p, v in implicit.items() if p in declared[name]}, **parameters}
            done.append(execute_chapter(root, name, given, declared[name], log=say))
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
               progress: bool = True) -> Path:
    """Execute the chapters (all, or ``only``) and build the HTML book; return its index.

    ``parameters`` go to the chapters that declare them (one that none of the executed
    chapters declares is refused); ``models`` to those that declare ``models``.
    """
    root = project_root(root)
    names = chapters(root)
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"unknown chapter(s) {unknown}; the book has {names}")
    if execute:
        order = [n for n in execution_order(names) if not only or n in only]
        execute_chapters(root, order, parameters, models=models, progress=progress)
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
