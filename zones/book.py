"""Build the report: execute each chapter notebook with papermill, then run Jupyter Book.

The chapters are the ``book/chapters/NAME`` entries of ``_toc.yml``; each is a MyST Markdown
notebook ``notebooks/NAME.md`` (jupytext), executed into ``book/chapters/NAME.ipynb``
(working directory ``book/chapters``, so a chapter's tables land in
``book/chapters/results/NAME``). Parameters are passed only to the notebooks that declare
them. ``run_notebook`` is the one way the project executes a chapter (the book, the tests).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from .figures import BOOK_MODE_ENV, write_vega_bundle


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


def chapter_source(root: Path, name: str) -> Path:
    """``notebooks/NAME.md``, the committed text of chapter ``name``."""
    source = Path(root) / "notebooks" / f"{name}.md"
    if not source.exists():
        raise FileNotFoundError(f"_toc.yml lists chapter {name!r} but {source} does not exist")
    return source


def as_ipynb(source: Path, folder: Path) -> Path:
    """A MyST (``.md``) notebook written as a clean ``.ipynb`` in ``folder``; an ``.ipynb``
    source is returned as it is."""
    import jupytext
    import nbformat

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
    import tempfile

    import papermill

    with tempfile.TemporaryDirectory() as tmp:
        return papermill.inspect_notebook(str(as_ipynb(source, Path(tmp))))


def chapter_parameters(notebook: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``given`` that ``notebook`` declares in its parameters cell."""
    declared = declared_parameters(notebook)
    return {key: value for key, value in given.items() if key in declared}


def run_notebook(source: Path, target: Path, parameters: dict[str, Any] | None = None, *,
                 cwd: Path | None = None) -> Path:
    """Execute a chapter (``.md`` or ``.ipynb``) with papermill into ``target``."""
    import tempfile

    import papermill

    with tempfile.TemporaryDirectory() as tmp:
        papermill.execute_notebook(str(as_ipynb(source, Path(tmp))), str(target), parameters=parameters or {},
                                   cwd=str(cwd or Path(target).parent), kernel_name="python3",
                                   progress_bar=False, log_output=False)
    return Path(target)


def execute_chapter(root: Path, name: str, parameters: dict[str, Any]) -> Path:
    import papermill

    source = chapter_source(root, name)
    target_dir = root / "book" / "chapters"
    target_dir.mkdir(parents=True, exist_ok=True)
    target = target_dir / f"{name}.ipynb"
    # Executed into a side file, renamed only on success: a failed chapter is never built.
    running = target_dir / f"{name}.running.ipynb"
    failed = target_dir / f"{name}.failed.ipynb"
    target.unlink(missing_ok=True)
    failed.unlink(missing_ok=True)
    params = chapter_parameters(source, parameters)
    print(f"zones book: executing {name} with {params}", flush=True)
    # The kernel inherits the environment: book mode, and no progress bars in the pages.
    saved = {key: os.environ.get(key) for key in (BOOK_MODE_ENV, "TQDM_DISABLE")}
    os.environ.update({BOOK_MODE_ENV: "1", "TQDM_DISABLE": "1"})
    try:
        run_notebook(source, running, params, cwd=target_dir)
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


def build_book(parameters: dict[str, Any] | None = None, only: list[str] | None = None,
               root: Path | None = None, execute: bool = True) -> Path:
    """Execute the chapters (all, or ``only``) and build the HTML book; return its index."""
    root = project_root(root)
    names = chapters(root)
    unknown = sorted(set(only or []) - set(names))
    if unknown:
        raise ValueError(f"unknown chapter(s) {unknown}; the book has {names}")
    if execute:
        for name in names:
            if only and name not in only:
                continue
            start = time.time()
            execute_chapter(root, name, parameters or {})
            print(f"zones book: {name} done in {time.time() - start:.0f} s", flush=True)
    missing = [n for n in names if not (root / "book" / "chapters" / f"{n}.ipynb").exists()]
    if missing:
        raise FileNotFoundError(f"chapters never executed: {missing}; run without --only first")
    write_vega_bundle(root / "book" / "_static")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book), "build", str(root), "--path-output",
               str(root / "book"), "--warningiserror", "--nitpick", "--keep-going"]
    print("zones book: building HTML", flush=True)
    subprocess.run(command, check=True, cwd=root)
    return root / "book" / "_build" / "html" / "index.html"
