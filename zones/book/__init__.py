"""Build the report: execute each chapter notebook with papermill, then run Jupyter Book.

One module per job, each on the ones before it:

* ``zones.book.toc``: the project and its chapters, in the order of ``_toc.yml`` (``RUN_LAST``:
  the chapters that read the others' tables, executed after them), and the text of each;
* ``zones.book.parameters``: what each chapter is given: ``--param`` values checked against the
  glossary, a budget's values (``class``, ``cpu``, ``gpu``), an error in the book's words;
* ``zones.book.notebooks``: a chapter as a notebook: the parameters it declares, ``run_notebook``
  (the one way the project executes a chapter: the book, the tests), its executed copy made fit
  for a page (no progress widgets, no log lines);
* ``zones.book.timing``: the reference forward timed on this machine, and the record of what each
  chapter cost; ``zones.book.estimate``: each chapter's expected cost and the time left;
* ``zones.book.execute``: the chapters executed in one kernel (``zones.kernel``), under one
  progress bar, a chapter replacing its page only once it finished, one build at a time;
* ``zones.book.build``: the HTML book (placeholders for chapters never executed, the assets the
  pages load, Jupyter Book), and the chapters with a budget's values for JupyterLab.

The names below are the book's to the rest of zones (the CLI, ``zones study``, the chapters'
tests); the other names are their module's.
"""
from __future__ import annotations

from zones.book.build import budget_table, build_book, lab_folder
from zones.book.estimate import budget_scale, expected_forwards, measured_budget
from zones.book.execute import ChapterFailed, execute_chapters
from zones.book.notebooks import declared_parameters, run_notebook
from zones.book.parameters import book_wording, check_parameters, name_values
from zones.book.toc import RUN_LAST, chapter_source, chapters, copy_project, execution_order, project_root

__all__ = [
    "RUN_LAST", "ChapterFailed", "book_wording", "budget_scale", "budget_table", "build_book", "chapter_source",
    "chapters", "check_parameters", "copy_project", "declared_parameters", "execute_chapters", "execution_order",
    "expected_forwards", "lab_folder", "measured_budget", "name_values", "project_root", "run_notebook",
]
