"""The HTML book: every chapter's page (executed, or a placeholder), the assets the pages load, Jupyter Book.

Every asset a page loads ships with the build: Vega (``zones.figures``) and MathJax (from the
``django-static-mathjax`` package) are copied into ``book/_static``. ``lab_folder`` writes the
chapters with a budget's values for JupyterLab.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import nbformat

from zones.book.execute import execute_chapters, project_lock
from zones.book.notebooks import add_note, as_ipynb, declared_parameters
from zones.book.parameters import BUDGET_NOTES, chapter_values
from zones.book.toc import chapter_source, chapters, execution_order, project_root
from zones.core.atomic import atomic_write_bytes, atomic_write_text
from zones.core.glossary import DEFAULT_BUDGET, check_value
from zones.core.tally import counting
from zones.figures import write_vega_bundle

MATHJAX_PACKAGE = "django-static-mathjax"
MATHJAX_FILE = "tex-svg-full.js"  # TeX input, SVG output, every extension: no fonts or extensions to fetch
SUMMARY_PAGE = Path("book") / "chapters" / "claims_summary.md"   # the scorecard writes it; the intro includes it


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
