"""The chapters' numbers and verdicts: one module per chapter, and the claims scorecard.

Each chapter module has a ``run(...)`` that does the chapter's work through the analysis
modules, writes its tables and ``summary.json`` to ``out_dir`` and returns a
:class:`~zones.report.common.ChapterResult` (tables, and the plain numbers and sentences
the page glues). ``verdicts`` holds the verdict vocabulary, the paper's figures and the rules
the chapters share with the scorecard (``claims``), so no chapter module imports the
scorecard. Every verdict a page states is made here, by a tested function with its
rule in the docstring; the notebooks only call ``run``, glue, draw and tell.

A chapter's parameters (its notebook's parameters cell, as ``zones book`` passes them) become
its ``run`` arguments one way, :func:`chapter_arguments`: the parameters ``run`` names. The page
passes those by name (``models=models, ...``) and ``zones study`` calls ``run`` with them, so
the study never reads a notebook's code (``tests/test_study.py`` checks that every page's call
passes exactly these).
"""
import importlib
import inspect
from typing import Any, Mapping

from zones.core.glossary import CHAPTERS  # the one list of the book's chapters

__all__ = [*CHAPTERS, "common", "format", "verdicts"]
CALLER_ARGUMENTS = ("out_dir", "progress")  # where and how a chapter runs: the caller's, not a parameter's


def __getattr__(name: str):
    """``report.pruning`` imports the chapter module on first use (``zones.report.format`` alone stays light)."""
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def chapter_run(name: str):
    """``zones.report.<name>.run``; an unknown chapter is a ``ValueError`` naming the chapters."""
    if name not in CHAPTERS:
        raise ValueError(f"unknown chapter {name!r}; the chapters: {', '.join(CHAPTERS)}")
    return importlib.import_module(f"{__name__}.{name}").run


def chapter_arguments(name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments chapter ``name``'s ``run`` takes from its ``parameters``: every parameter its
    signature names (in the signature's order), ``out_dir`` and ``progress`` left to the caller."""
    accepted = inspect.signature(chapter_run(name)).parameters
    return {key: parameters[key] for key in accepted if key in parameters and key not in CALLER_ARGUMENTS}
