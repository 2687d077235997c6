"""Every chapter ends with exercises whose solutions run.

The fast checks read the notebooks' text: every chapter but the teachers' page has 2–4
numbered exercises (``sphinx-exercise``), each with a collapsed solution whose code sits in
``{code-cell}`` blocks between the gated ``{solution-start}``/``{solution-end}`` directives
(so papermill runs it when the book builds and its numbers are real).

The slow check builds the micro book (every chapter on a 6-block model trained for seconds,
tiny budgets: as ``tests/test_browser.py`` does, with ``--warningiserror``), then checks that
every solution's code cells ran in the executed chapter without an error, and that the pages
show each exercise numbered, its solution a collapsed dropdown.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import NOT_ON_THE_MICRO_MODEL

from zones.book import chapters

ROOT = Path(__file__).resolve().parents[1]
WITHOUT_EXERCISES = ("teaching",)  # the teachers' page is no chapter a student works through
EXERCISE = re.compile(r"^```\{exercise\}[^\n]*\n:label: (\S+)", re.MULTILINE)
SOLUTION_START = re.compile(r"^```\{solution-start\} (\S+)\n((?::[a-z-]+:[^\n]*\n)*)", re.MULTILINE)
SOLUTION_END = re.compile(r"^```\{solution-end\}", re.MULTILINE)


@dataclass
class Solution:
    label: str                 # the exercise it solves
    options: str               # its directive options (":class: dropdown")
    code: list[str] = field(default_factory=list)  # the sources of its code cells, in order


def exercise_chapters(root: Path = ROOT) -> list[str]:
    return [name for name in chapters(root) if name not in WITHOUT_EXERCISES]


def solutions(cells) -> list[Solution]:
    """The solutions of a notebook's cells (nbformat or jupytext cells, in order), each with the
    code cells between its ``{solution-start}`` and its ``{solution-end}``; a solution left open
    or nested is an AssertionError."""
    found, current = [], None
    for cell in cells:
        if cell.cell_type == "code":
            if current is not None:
                current.code.append(cell.source)
            continue
        # a markdown cell may hold an end, then a start (prose between two solutions)
        events = sorted([(m.start(), "start", m) for m in SOLUTION_START.finditer(cell.source)]
                        + [(m.start(), "end", m) for m in SOLUTION_END.finditer(cell.source)], key=lambda e: e[0])
        for _, kind, match in events:
            if kind == "start":
                assert current is None, f"solution {match.group(1)} starts inside solution {current.label}"
                current = Solution(match.group(1), match.group(2))
                found.append(current)
            else:
                assert current is not None, "a {solution-end} without its {solution-start}"
                current = None
    assert current is None, f"solution {current.label} is never closed with {{solution-end}}"
    return found


def read_chapter(name: str):
    import jupytext

    return jupytext.read(ROOT / "notebooks" / f"{name}.md")


@pytest.mark.parametrize("name", exercise_chapters())
def test_every_chapter_ends_with_two_to_four_exercises_each_with_a_collapsed_solution(name):
    notebook = read_chapter(name)
    text = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    labels = EXERCISE.findall(text)
    assert 2 <= len(labels) <= 4, f"{name}: {len(labels)} exercises (2–4 wanted)"
    assert len(set(labels)) == len(labels), f"{name}: a label used twice: {labels}"
    # ex-<chapter>-<n> in order, or the chapter's own names (the primer's came first: primer-ex-square)
    numbered = labels == [f"ex-{name}-{n}" for n in range(1, len(labels) + 1)]
    assert numbered or all(re.fullmatch(r"[a-z]+-ex-[a-z0-9-]+", label) for label in labels), f"{name}: labels {labels}"
    found = solutions(notebook.cells)
    assert [s.label for s in found] == labels, f"{name}: solutions {[s.label for s in found]} for {labels}"
    for solution in found:
        assert ":class: dropdown" in solution.options, f"{name}: solution of {solution.label} is not collapsed"
    # the exercises close the chapter: no section after the first of them
    first = text.index("```{exercise}")
    assert text.find("\n## ", first) == -1, f"{name}: a section after the exercises"


def test_solutions_are_read_with_their_code_cells_in_order():
    import nbformat

    md, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    cells = [md("```{exercise}\n:label: ex-a-1\n\nQ\n```\n\n```{solution-start} ex-a-1\n:class: dropdown\n```\n\nWhy."),
             code("x = 1"), code("y = 2"),
             md("```{solution-end}\n```\n\n```{solution-start} ex-a-2\n:class: dropdown\n```"), code("z = 3"),
             md("```{solution-end}\n```"), code("outside = 4")]
    found = solutions(cells)
    assert [(s.label, s.code) for s in found] == [("ex-a-1", ["x = 1", "y = 2"]), ("ex-a-2", ["z = 3"])]
    with pytest.raises(AssertionError, match="never closed"):
        solutions(cells[:2])
    with pytest.raises(AssertionError, match="without its"):
        solutions(cells[-2:])


# --- the micro book: every solution runs, and the pages show them numbered and collapsed -------------

@pytest.fixture(scope="module")
def micro_book(request, tmp_path_factory) -> Path:
    """The project folder of the whole book built on the micro model (``ZONES_BOOK_ROOT=DIR``:
    check an existing micro build's project folder instead, e.g. ``/tmp/exbuild/project``)."""
    if os.environ.get("ZONES_BOOK_ROOT"):
        return Path(os.environ["ZONES_BOOK_ROOT"]).resolve()
    return request.getfixturevalue("micro_book_root")


@pytest.mark.slow
def test_every_solution_runs_on_the_micro_model_and_shows_numbered_and_collapsed(micro_book):
    import nbformat
    from bs4 import BeautifulSoup

    numbers = []
    names = [n for n in exercise_chapters(micro_book) if n not in NOT_ON_THE_MICRO_MODEL]
    for name in names:
        executed = nbformat.read(micro_book / "book" / "chapters" / f"{name}.ipynb", as_version=4)
        found = solutions(executed.cells)
        assert found, f"{name}: no solutions in the executed chapter"
        for solution in found:
            for cell in (c for c in executed.cells if c.cell_type == "code" and c.source in solution.code):
                assert cell.get("execution_count"), f"{name}: a code cell of {solution.label} never ran"
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                assert not errors, f"{name}: {solution.label} raised {errors[0].get('ename')}"
        # every number the exercises' prose cites was glued by the chapter or by its solutions
        glued = {o["metadata"]["scrapbook"]["name"] for c in executed.cells if c.cell_type == "code"
                 for o in c.get("outputs", []) if "scrapbook" in o.get("metadata", {})}
        prose = "\n".join(c.source for c in executed.cells if c.cell_type == "markdown")
        cited = set(re.findall(r"\{glue:text\}`([a-z_0-9]+)`", prose[prose.index("```{exercise}"):]))
        assert cited <= glued, f"{name}: cited but never glued: {sorted(cited - glued)}"
        page = BeautifulSoup((micro_book / "book" / "_build" / "html" / "book" / "chapters" / f"{name}.html")
                             .read_text(), "html.parser")
        exercises = page.select("div.exercise")
        shown = page.select("div.solution")
        assert len(exercises) == len(found) == len(shown), f"{name}: {len(exercises)} exercises, {len(shown)} solutions"
        for exercise in exercises:
            title = exercise.select_one(".admonition-title").get_text(" ", strip=True)
            match = re.match(r"Exercise (\d+)", title)
            assert match, f"{name}: an exercise without its number: {title!r}"
            numbers.append(int(match.group(1)))
        for solution in shown:
            assert "dropdown" in solution["class"], f"{name}: a solution shown open"
            assert solution.select_one(".admonition-title a[href]"), f"{name}: a solution that links no exercise"
    assert len(numbers) >= 2 * len(names) and len(set(numbers)) == len(numbers)  # numbered once each
