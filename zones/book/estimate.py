"""The time a build will take: each chapter's expected cost, and the estimate of the time left.

Each chapter weighs its cost in the last build with the same parameters and budget
(``zones.book.timing.last_record``), else its ``EXPECTED_REFERENCE_FORWARDS`` at the budget being
built (a budget not measured: the cpu cost scaled by the chapter's token budgets, or no estimate,
:func:`book_costs`); while a chapter runs, the work it counts (windows, removal sets, training
steps, reported through the file named by ``$ZONES_PROGRESS``) moves the estimate (:class:`Estimate`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from zones.book.notebooks import declared_parameters
from zones.book.parameters import chapter_values
from zones.book.timing import last_record, last_timings
from zones.book.toc import chapter_source
from zones.core.checks import check_models
from zones.core.glossary import DEFAULT_BUDGET, TERMS, default
from zones.core.progress import RUNNING_CAP

# What each chapter costs cold with its default parameters, per budget, in reference forwards (one
# float32 SmolLM2-135M forward of 2,048 tokens, ``zones.core.progress``): the same on every machine. A
# chapter not listed weighs DEFAULT_REFERENCE_FORWARDS; a chapter's last build replaces the guess.
# cpu and class: measured on cold builds (README: the budget), each chapter's seconds over the reference
# forward timed around it. gpu is not measured yet: its costs are the cpu ones scaled by the chapter's
# token budgets (:func:`budget_scale`), never the cpu figure itself.
EXPECTED_REFERENCE_FORWARDS = {   # measured: cold builds of 4dbaceb (Intel Xeon, 2 cores, AVX-512, float32)
    "cpu": {"primer": 76, "alpha_profile": 2, "layer_ablation": 29, "importance_vs_alpha": 1, "pruning": 87,
            "healing": 20, "task_accuracy": 105, "sublayers": 42, "predictors": 1, "depth_series": 9,
            "spectral_lifecycle": 1, "teaching": 1, "across_models": 3, "claims": 1},
    "class": {"primer": 20, "alpha_profile": 2, "layer_ablation": 7, "importance_vs_alpha": 1, "pruning": 11,
              "healing": 8, "task_accuracy": 11, "sublayers": 13, "predictors": 1, "depth_series": 2,
              "spectral_lifecycle": 1, "teaching": 1, "across_models": 3, "claims": 1},
    "gpu": {},
}
DEFAULT_REFERENCE_FORWARDS = 10
REFERENCE_SECONDS_GUESS = 5.0   # a reference forward's seconds when it could not be timed (2 cores, AVX-512)


def budget_scale(chapter: str, declared: dict[str, Any], given: dict[str, Any],
                 base: str = DEFAULT_BUDGET) -> float | None:
    """How many times the ``base`` budget's tokens ``chapter`` is ``given``: the sum of the token
    parameters it ``declared`` (glossary type ``tokens``) in ``given`` (else their cpu default,
    the notebook's own) over their sum at the ``base`` budget. 1.0 when it declares none (nothing to
    scale by); None when one is the whole split (None or 0: its size is not known here). Seeds and
    depths that a budget also changes are not weighed: a scaled cost is a rough guess until measured."""
    names = [n for n in declared if n in TERMS and TERMS[n].type == "tokens"]
    if not names:
        return 1.0
    now = [given.get(n, default(n, DEFAULT_BUDGET, chapter)) for n in names]
    then = [default(n, base, chapter) for n in names]
    if not all(isinstance(v, (int, float)) and v > 0 for v in then + now):
        return None
    return float(sum(now)) / float(sum(then))


def expected_forwards(name: str, budget: str = DEFAULT_BUDGET, scale: float | None = 1.0) -> float | None:
    """Chapter ``name``'s expected reference forwards at ``budget``, times ``scale`` (its tokens
    over those of the budget measured, :func:`budget_scale`): measured at ``budget``
    (``EXPECTED_REFERENCE_FORWARDS[budget]``), else at the cpu budget; None (no estimate) when
    the scale is unknown."""
    if scale is None:
        return None
    return float(EXPECTED_REFERENCE_FORWARDS[measured_budget(name, budget)].get(name, DEFAULT_REFERENCE_FORWARDS)) \
        * scale


def measured_budget(name: str, budget: str) -> str:
    """The budget whose expected cost of chapter ``name`` stands for ``budget``'s: itself where
    measured, else the cpu budget (scaled)."""
    return budget if name in EXPECTED_REFERENCE_FORWARDS.get(budget, {}) else DEFAULT_BUDGET


def chapter_costs(names: list[str], parameters: dict[str, Any], budget: str = DEFAULT_BUDGET,
                  scales: dict[str, float | None] | None = None) -> dict[str, dict[str, Any]]:
    """Each chapter's expected cost: ``reference_forwards`` (its last build with these
    parameters, else :func:`expected_forwards` at ``budget`` with its ``scales`` entry, default
    1.0), ``work`` (the work it counted then, else the same number: counted work is about one
    reference forward per reference forward of time) and ``estimated`` (False when there is no
    estimate: the chapter then weighs its cpu cost on the bar, and no time is quoted for it)."""
    record = last_record(parameters)
    last, reference = record.get("chapters", {}), record.get("reference_seconds")
    costs = {}
    for name in names:
        entry = last.get(name, {})
        forwards = entry.get("reference_forwards")
        if forwards is None and "seconds" in entry and reference:
            forwards = entry["seconds"] / reference
        if forwards is None and "seconds" in entry:
            forwards = entry["seconds"] / REFERENCE_SECONDS_GUESS
        estimated = True
        if forwards is None:
            forwards = expected_forwards(name, budget, (scales or {}).get(name, 1.0))
        if forwards is None:  # a weight for the bar only
            forwards, estimated = expected_forwards(name, DEFAULT_BUDGET), False
        work = entry.get("work") or forwards
        costs[name] = dict(reference_forwards=max(0.1, float(forwards)), work=max(0.1, float(work)),
                           estimated=estimated)
    return costs


def book_costs(root: Path, names: list[str], parameters: dict[str, Any] | None = None, *,
               budget: str = DEFAULT_BUDGET, models: list[str] | None = None,
               declared: dict[str, dict[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`chapter_costs` of chapters ``names`` of the project at ``root`` as ``zones book``
    would run them (``--budget``, ``--only``, ``--param``, ``--models``): each chapter's
    values at that budget, its token budgets scaled against the notebook's (:func:`budget_scale`)."""
    declared = declared or {n: declared_parameters(chapter_source(root, n)) for n in names}
    parameters = dict(parameters or {})
    implicit = {"models": check_models(models)} if models else {}
    key = {**implicit, **parameters, **({"budget": budget} if budget != DEFAULT_BUDGET else {})}
    scales = {n: budget_scale(n, declared[n], chapter_values(n, declared[n], budget, implicit, parameters),
                              base=measured_budget(n, budget)) for n in names}
    return chapter_costs(names, key, budget, scales)


def estimate_source(names: list[str], budget: str, key: dict[str, Any]) -> str:
    """What the opening estimate rests on: the last build with these parameters (``key``), else the
    expected costs, "scaled from the cpu budget by tokens" where ``budget`` was not measured for a
    chapter (:func:`measured_budget`)."""
    if last_timings(key):
        return "the last build"
    scaled = any(measured_budget(n, budget) != budget for n in names)
    return f"the expected costs{', scaled from the cpu budget by tokens' if scaled else ''}"


def opening_line(names: list[str], costs: dict[str, dict[str, Any]], budget: str, seconds_per_forward: float,
                 source: str) -> str:
    """The build's first estimate: the chapters, the budget, the minutes and reference forwards
    of those with an estimate, and the chapters with none."""
    known = sum(c["reference_forwards"] for c in costs.values() if c.get("estimated", True))
    missing = [n for n in names if not costs[n].get("estimated", True)]
    line = (f"zones book: {len(names)} chapter{'s' if len(names) != 1 else ''} at the {budget} budget, about "
            f"{known * seconds_per_forward / 60:.0f} min ({known:.0f} reference forwards; {source})")
    return line + (f"; no estimate for {', '.join(missing)} (not measured at this budget)" if missing else "")


class Estimate:
    """The time left, from the work done: chapters done count their expected reference forwards,
    the running chapter the share of its expected work it has counted so far (never quite all of
    it), and a reference forward costs what it cost in the chapters done (before the first
    ends: the reference forward timed at the start)."""

    def __init__(self, costs: dict[str, dict[str, float]], reference: float | None):
        self.costs, self.reference = costs, reference or REFERENCE_SECONDS_GUESS
        self.total = sum(c["reference_forwards"] for c in costs.values())
        self.done = 0.0          # expected reference forwards of the chapters done
        self.done_seconds = 0.0
        # chapters with no estimate (a budget not measured): on the bar, but no time is quoted for them
        self.unknown = {n for n, c in costs.items() if not c.get("estimated", True)}

    def position(self, name: str | None = None, work: float = 0.0) -> float:
        """Reference forwards done, with ``work`` counted so far in the running chapter ``name``."""
        if name is None:
            return self.done
        cost = self.costs[name]
        return self.done + min(work / cost["work"], RUNNING_CAP) * cost["reference_forwards"]

    def finish(self, name: str, seconds: float) -> None:
        self.done += self.costs[name]["reference_forwards"]
        self.done_seconds += seconds
        self.unknown.discard(name)

    def seconds_per_forward(self) -> float:
        return self.done_seconds / self.done if self.done > 0 and self.done_seconds > 0 else self.reference

    def seconds_left(self, position: float) -> float:
        """Seconds left after ``position``, not counting the chapters with no estimate still to run."""
        unknown = sum(self.costs[n]["reference_forwards"] for n in self.unknown)
        return max(0.0, self.total - position - unknown) * self.seconds_per_forward()
