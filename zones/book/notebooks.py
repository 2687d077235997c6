"""A chapter as a notebook: its text as an ``.ipynb``, the parameters it declares, its execution, its
executed copy made fit for a page.

``run_notebook`` is the one way the project executes a chapter (the book, the tests). Progress bars
left in an executed chapter (tqdm widgets, which would make the page load require.js and the widget
manager from CDNs) are removed with the widget state (``drop_progress_widgets``), and the library's
log lines (``zones: converting … gguf``) leave the page for the terminal (``drop_log_lines``).
"""
from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jupytext
import nbformat
import papermill

from zones.kernel import ChapterKernel

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
LOG_LINE = re.compile(r"^zones( [a-z]+)?: ")  # "zones: converting ...", "zones book: ..."


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
