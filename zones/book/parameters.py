"""What each chapter is given: the ``--param`` values checked, a budget's values, and an error in the book's words.

Parameters are passed only to the notebooks that declare them; a parameter that none of the
chapters being executed declares is refused before any runs, with the list of those they do
declare (a misspelt ``n_resamplez`` is never dropped silently), and every value is checked against
its type in ``zones.core.glossary`` (a ``--param eval_tokens=abc`` fails at once, naming the
parameter). A *budget* (``class``, ``cpu`` — the notebooks' own values — or ``gpu``) gives each
chapter the glossary's values for it (``zones.core.glossary.preset``), under the parameters given
explicitly; a build at another budget than the default says so at the top of every page
(``BUDGET_NOTES``).
"""
from __future__ import annotations

import re
from typing import Any

import yaml

from zones.core.glossary import TERMS, check_value, parse_text, preset

# The note at the top of every page of a build at a budget other than the default (a Markdown cell).
BUDGET_NOTES = {
    "class": ":::{note}\nThis is a **class build** (`zones book --budget class`): every chapter runs on small "
             "token budgets, few seeds and a tiny depth series, so its intervals are wider than those of the "
             "default build and more of its verdicts are inconclusive. `zones book` builds the full book.\n:::",
    "gpu": ":::{note}\nThis page was built at the **gpu** budget (`zones book --budget gpu`): larger token "
           "budgets and the paper's depth series.\n:::",
}


FLAG = re.compile(r"--([a-z][a-z0-9-]*)(?:[ =](-?\d+(?:\.\d+)?))?")  # a flag and the number after it


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


def chapter_values(name: str, declared: dict[str, Any], budget: str, implicit: dict[str, Any],
                   parameters: dict[str, Any]) -> dict[str, Any]:
    """What chapter ``name`` is given: the ``budget``'s values of the parameters it declares
    (none at the default budget: its cells hold those), then ``implicit`` (``models``) and the
    explicit ``parameters`` it declares, each winning over the one before."""
    given = {**preset(budget, name, declared), **implicit, **parameters}
    return {key: value for key, value in given.items() if key in declared}
