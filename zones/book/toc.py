"""The book's chapters: the project that holds them, their order, and the text of each.

The chapters are the ``book/chapters/NAME`` entries of ``_toc.yml``; each is a MyST Markdown
notebook ``notebooks/NAME.md`` (jupytext). Chapters that read the others' tables or cache
(``RUN_LAST``: across_models, the claims scorecard, then the teachers' page) execute after them, wherever ``_toc.yml``
places them.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

# chapters that read what the other chapters wrote: tables and cache (across_models, the claims scorecard),
# then the teachers' page, which reads every chapter's time in the build record (its own from an earlier build)
RUN_LAST = ("across_models", "claims", "teaching")
GENERATED = ("_build", "chapters", "mathjax", "vega-bundle.js", ".*")  # written by the build, never copied


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
    ``RUN_LAST``'s order (the teachers' page last)."""
    return [n for n in names if n not in RUN_LAST] + [n for n in RUN_LAST if n in names]


def chapter_source(root: Path, name: str) -> Path:
    """``notebooks/NAME.md``, the committed text of chapter ``name``."""
    source = Path(root) / "notebooks" / f"{name}.md"
    if not source.exists():
        raise FileNotFoundError(f"_toc.yml lists chapter {name!r} but {source} does not exist")
    return source


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
