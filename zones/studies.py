"""zones study: every chapter's tables for every model, as independent jobs, here or on a Ray cluster.

    zones study --models a,b,c [--executor local|ray] [--ray-address HOST:PORT]
                [--param NAME=VALUE ...] [--budget class|cpu|gpu] [--out results/study]
    zones study --status results/study        the jobs of that study: done, running, failed, waiting
    zones study --models a,b,c --plan         its jobs, their cost and time, before any work

The work of ``zones book --models a,b,c`` with the same parameters, cut into jobs that need
nothing from each other: one job per model and chapter (``alpha_profile · m``,
``pruning · m``, ...), one per trained run of the depth series (``train · depth 8, seed 0``),
and one per chapter that takes no model (``depth_series``, ``spectral_lifecycle``). A job calls
the chapter's ``zones.report.<chapter>.run`` with the chapter's parameters that ``run`` takes
(``zones.report.chapter_arguments``: the names its page passes; the values are its parameters
cell's, overridden by ``--param`` and ``--budget`` as in ``zones book``; no notebook code is
read), with ``models=[m]``, into a temporary folder.

Each job runs on the machine it lands on, with that machine's cache (its ``$ZONES_CACHE``),
inside ``zones.core.capture.capture``: every cache entry it read or wrote travels back with its
tables and is stored in this machine's cache (``store_captured``: every file's sha256 checked),
so that a following ``zones book --models a,b,c`` with the same parameters reads everything and
computes nothing (its log says how many entries it read and computed). Converted GGUF copies do
not travel: this machine converts its own before the jobs start.

Jobs that share work run in order: ``importance_vs_alpha`` and ``predictors`` after the model's
``layer_ablation``, ``predictors`` and ``healing`` after its ``pruning``, the chapters on the
depth series after its training; each receives the entries of those before it (without them it
would compute them again; nothing else depends on the order). A chapter that takes a model and
also a training ``profile`` (``sublayers``) does the depth series' part in its first model's
job only. ``zones book`` shows the first model of a chapter in detail; the study computes every
model's details, a superset.

Results come as jobs finish (:class:`Ledger`): each finished job's tables are written at once
to ``OUT/<chapter>/<model>/<table>.csv`` (model-free chapters: ``OUT/<chapter>/<table>.csv``)
and a line says so (``done pruning · m in 7 m 02 s (computed)``); ``OUT/jobs.csv`` (one row per
job: its status, where it ran, its seconds, its resources, the entries it read and computed,
its retries, its error) and ``OUT/study-state.json`` (what ``zones study --status OUT`` reads)
are rewritten as each job starts and ends, every file atomically. A job that fails is said as
it fails and reported by name after the others finish (``zones.core.executors``); its finished
neighbours are already in this cache and in ``OUT``, and a rerun computes only the rest: on
Ray, each job is sent the entries it read or wrote the last time (this cache records which,
under ``study/``), so it computes nothing again on whichever node it lands. SIGINT or SIGTERM
stop the study cleanly: the first after the running jobs (its line says so, and that a second
signal stops at once), a second at once; one line says what finished and the command that resumes
it (the same command), and ``zones study`` exits with 130 or 143.

One bar shows the study in computed work (``zones.core.progress.WorkBar``): each job weighs what it
is expected to count in reference forwards (:func:`stage_work`, as ``--plan`` prints it: a trained
run from its shapes, a chapter from the book's cost at the budget, scaled by its tokens and its
model's size), a running local job moves it with the work it counts; a job that computed nothing
(everything read from the cache) is not progress: its work leaves the bar's total and the line
counts it apart (``2.0 RF read from the cache``). The time left sums each job left's expected
seconds, a fixed cost plus a rate per reference forward, both fitted to the jobs that finished
computing (``zones.core.progress.job_cost_model``); other tools' bars (lm-eval's, datasets', a
training loop's) stay out of its line, and no cursor codes reach a log.
"""
from __future__ import annotations

import argparse
import ast
import functools
import importlib
import inspect
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from zones.analysis.importance import model_labels
from zones.book import (
    RUN_LAST,
    book_wording,
    budget_scale,
    chapter_source,
    chapters,
    check_parameters,
    declared_parameters,
    expected_forwards,
    measured_budget,
    name_values,
    project_root,
)
from zones.core.atomic import atomic_write_bytes, atomic_write_text
from zones.core.cache import CacheError, entry_path
from zones.core.capture import CapturedEntry, capture, collect_entries, store_captured
from zones.core.entries import read_entry, write_entry
from zones.core.refresh import refresh_since, refreshing
from zones.core.tables import write_table
from zones.core.tally import Tally, counting, pid_alive
from zones.core.checks import duplicate_models, duplicate_text
from zones.core.executors import Job, JobFailed, check_executor, ray_connect, run_jobs
from zones.core.glossary import DEFAULT_BUDGET, add_flag, check_value, default, preset, term
from zones.core.models import BUILTIN_MODELS, resolve_source
from zones.core.progress import (BLOCK_WEIGHTS, HEAD_WEIGHTS, REFERENCE_FLOPS, mark_from_cache, module_weights,
                                 training_flops)
from zones.report import chapter_arguments

TRAIN = "train"  # the stage that trains one run of the depth series
RECORDS = "study"  # cache kind of the records of which entries each stage read or wrote (bookkeeping)
RECORD_VERSION = "1"
MODEL_PARAMETERS = ("models", "model")  # a chapter declaring one of these runs once per model
ABOUT_THE_BOOK = ("teaching",)  # pages about the build itself (its timing record): nothing to compute per model
ACROSS = "across_models"  # the chapter run last, once over every studied model: one table and figure across them
ACROSS_READS = ("train", "layer_ablation", "pruning", "depth_series")  # the jobs whose entries it reads
SERIES_PARAMETER = "profile"
SERIES_IN_EVERY_JOB = ("primer",)  # chapters whose every model's job reads a trained run (cached: it only reads it)  # a chapter declaring it reads the trained depth series
# Work a chapter shares with another of the same model (speed only: without it, it is computed again)
SHARES = {"importance_vs_alpha": ("layer_ablation",), "predictors": ("layer_ablation", "pruning"),
          "healing": ("pruning",)}
VOLATILE_COLUMNS = ("seconds", "computed_seconds", "snapshot_fraction", "tokens_per_s", "speedup", "path", "device",
                    "from_cache")  # timings, places, whether this run or an earlier one computed it


class StudyError(ValueError):
    """The study cannot be planned as asked (a chapter call it cannot reproduce, a bad list of models)."""


@dataclass(frozen=True)
class Stage:
    """One job of the study: ``chapter`` (or ``train``) for ``model`` (None: no model), called with
    ``kwargs``; ``label`` names the model or the run; ``after``: the stages whose entries it takes."""

    chapter: str
    model: str | None
    label: str
    kwargs: dict
    after: tuple[str, ...] = ()
    fitted: tuple[str, ...] = ()  # the parameters clipped to what this model allows (fit_to_model), in words

    @property
    def name(self) -> str:
        return f"{self.chapter} · {self.label}" if self.label else self.chapter


@dataclass
class StageResult:
    """What a job sends back: its tables (file name → bytes), the cache entries it read or wrote
    (when carried), their tally, where it ran and for how long."""

    name: str
    tables: dict[str, bytes]
    entries: list[CapturedEntry]
    tally: Tally
    node: str
    seconds: float
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class StudyResult:
    """The study: ``jobs`` (one row per job), the ``tally`` of entries read and computed by every
    job, the entries stored in this machine's cache (``stored``, ``present``), the tables by
    ``(chapter, label)``, and the folder they were written to."""

    jobs: pd.DataFrame
    tally: Tally
    stored: int
    present: int
    tables: dict[tuple[str, str], dict[str, bytes]]
    out_dir: Path | None


# --- the chapters' calls: zones.report.<chapter>.run with the chapter's parameters ------------------------

def chapter_defaults(source: Path | str, declared: dict[str, Any] | None = None) -> dict[str, Any]:
    """The values of a chapter's parameters cell (``source``: its notebook, or its name when
    ``declared``, its ``declared_parameters``, is given)."""
    declared = declared_parameters(Path(source)) if declared is None else declared
    values = {}
    for name, info in declared.items():
        try:
            values[name] = ast.literal_eval(str(info["default"]))
        except (ValueError, SyntaxError):
            raise StudyError(f"{source}: parameter {name} = {info['default']} is not a literal value; the study "
                             f"reads the parameters cell as the book passes it") from None
    return values


# --- the plan -----------------------------------------------------------------------------------------

def parse_models(models: str | Sequence[str]) -> list[str]:
    """``"a,b,c"`` or a list → the list; empty names refused, and so is one model listed twice,
    under one spelling or two (``m,m/``: a local model is identified by its resolved path;
    ``zones.core.checks.duplicate_models``)."""
    names = [m.strip() for m in (models.split(",") if isinstance(models, str) else models)]
    if not names or any(not n for n in names):
        raise StudyError(f"--models must list models separated by commas, e.g. gpt2,EleutherAI/pythia-160m; got "
                         f"{models!r}")
    found = duplicate_models(names)
    if found:
        raise StudyError(duplicate_text("--models", found))
    return names


def looks_local(name: str) -> bool:
    """A model name written as a local path (absolute, ``./``, ``../``, ``~``, or a ``.gguf``
    file), not an alias or a hub id (``org/name``)."""
    return name.startswith(("/", "./", "../", "~")) or name.endswith(".gguf") or os.path.isabs(name)


def check_local_models(models: Sequence[str]) -> None:
    """Refuse, before any work, the models written as local paths that are not there (every
    one of them, in one line)."""
    missing = [m for m in models if looks_local(m) and not os.path.exists(os.path.expanduser(m))]
    if missing:
        many = len(missing) > 1
        raise StudyError(f"--models names {'paths' if many else 'a path'} that {'do' if many else 'does'} not exist: "
                         f"{', '.join(missing)}; fix {'them' if many else 'it'} (a local model directory or .gguf "
                         f"file) or leave {'them' if many else 'it'} out")


def _train_configs(params: dict[str, Any]) -> list:
    """The training runs a chapter reading the depth series uses (its ``profile``, ``depths``,
    ``seeds`` when it has them, ``train_overrides``)."""
    from zones.series import series_configs

    if params.get(SERIES_PARAMETER) is None or params.get("checkpoints"):
        return []
    seeds = params.get("seeds")
    return series_configs(params[SERIES_PARAMETER], params.get("depths"), seeds,
                          **dict(params.get("train_overrides") or {}))


def chapter_parameters(root: Path | None, names: Sequence[str], parameters: dict[str, Any],
                       budget: str = DEFAULT_BUDGET, from_text: bool = False) -> dict[str, dict[str, Any]]:
    """Each chapter's parameter values as ``zones book`` gives them: its parameters cell, then the
    ``budget``'s values (the glossary's presets), then those of ``parameters`` it declares
    (``from_text``: YAML texts, as ``--param`` gives them). A parameter no chapter declares, or a
    value that does not fit its type, is refused before anything runs."""
    declared = {n: chapter_declared(root, n) for n in names}
    parameters = check_parameters(parameters, declared, from_text=from_text)
    budget = check_value("budget", budget)
    return {n: {**chapter_defaults(n, declared[n]), **preset(budget, n, declared[n]),
                **{k: v for k, v in parameters.items() if k in declared[n]}} for n in names}


PACKAGED = Path(__file__).with_name("chapters.json")  # the chapters and their parameters cells, shipped with zones


def study_root(root: Path | None = None) -> Path | None:
    """Where the study reads the chapters and their parameters: ``root`` when given; else the
    checkout this zones package lives in (its ``_toc.yml`` and ``notebooks/``); else None, the
    copy shipped with the package (``PACKAGED``, :func:`write_packaged`). Never the current folder:
    a study runs the same from any folder."""
    if root is not None:
        return project_root(root)
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "_toc.yml").exists() and (checkout / "notebooks").is_dir():
        return checkout
    return None


def packaged_chapters() -> dict[str, Any]:
    """The shipped copy: ``{"chapters": [names in the table of contents' order], "declared": {name:
    its declared_parameters}}``."""
    try:
        return json.loads(PACKAGED.read_text())
    except (OSError, ValueError) as err:
        raise StudyError(f"{PACKAGED} cannot be read ({type(err).__name__}); reinstall zones") from None


def chapter_names(root: Path | None) -> list[str]:
    """The book's chapters in table-of-contents order: ``root``'s, or the shipped copy's (None)."""
    return chapters(root) if root is not None else list(packaged_chapters()["chapters"])


def chapter_declared(root: Path | None, name: str) -> dict[str, Any]:
    """Chapter ``name``'s ``declared_parameters``: from ``root``'s notebook, or the shipped copy (None)."""
    if root is not None:
        return declared_parameters(chapter_source(root, name))
    declared = packaged_chapters()["declared"]
    if name not in declared:
        raise StudyError(f"{PACKAGED} lacks chapter {name}; reinstall zones")
    return declared[name]


def write_packaged(root: Path | None = None, path: Path = PACKAGED) -> dict[str, Any]:
    """Write the shipped copy from the checkout's chapters (``make`` keeps it current;
    ``tests/test_study.py`` checks it equals the notebooks)."""
    root = project_root(root or Path(__file__).resolve().parents[1])
    names = chapters(root)
    record = dict(chapters=names, declared={n: declared_parameters(chapter_source(root, n)) for n in names})
    atomic_write_text(path, json.dumps(record, indent=1, sort_keys=True) + "\n")
    return record


def _chapters(root: Path | None, only: Sequence[str] | None) -> tuple[Path | None, list[str]]:
    """Where the chapters are read (``study_root``) and the chapters the study runs per model or
    once (``only``: these, each checked against the study's chapters, ``ACROSS`` among them, as
    ``zones book --only`` checks the book's)."""
    root = study_root(root)
    names = [n for n in chapter_names(root) if n not in RUN_LAST + ABOUT_THE_BOOK]
    known = names + [ACROSS] * (ACROSS in chapter_names(root))
    unknown = [n for n in dict.fromkeys(only or []) if n not in known]
    if unknown:
        raise StudyError(f"--only names unknown chapter{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"the study's chapters are {', '.join(known)}")
    return root, [n for n in names if not only or n in only]


def across_stage(params: dict[str, Any], models: Sequence[str], before: Sequence[Stage]) -> Stage:
    """The study's last job: the across-models chapter (``ACROSS``) over every studied model, with
    its parameters as ``zones book`` gives them (``params``; ``models``: these), each bounded parameter fitted
    to every model (the smallest fit), after the jobs whose cache entries it reads (``ACROSS_READS``;
    appended last, it also runs last on the local executor)."""
    kwargs, fitted = chapter_arguments(ACROSS, dict(params, models=list(models))), []
    for model in models:
        kwargs, notes = fit_to_model(kwargs, model)
        fitted += [f"{note.split(' (')[0]} (for {model_labels([model])[0]})" for note in notes]
    return Stage(ACROSS, None, "", kwargs, tuple(s.name for s in before if s.chapter in ACROSS_READS),
                 tuple(fitted))


def book_calls(models: Sequence[str], parameters: dict[str, Any] | None = None, root: Path | None = None,
               only: Sequence[str] | None = None, budget: str = DEFAULT_BUDGET) -> list[tuple[str, dict[str, Any]]]:
    """``(chapter, run arguments)`` of every chapter the study covers, as ``zones book --models ...``
    with these parameters calls them: every model at once (``out_dir`` left out)."""
    root, names = _chapters(root, only)
    models = parse_models(models)
    calls = []
    for name, params in chapter_parameters(root, names, dict(parameters or {}), budget).items():
        if "models" in params:
            params["models"] = list(models)
        elif "model" in params:
            params["model"] = models[0]
        calls.append((name, chapter_arguments(name, params)))
    return calls


def _unique(label: str, taken: set[str]) -> str:
    """``label``, or ``label (2)``, ``label (3)``, ... when it is taken."""
    k, unique = 2, label
    while unique in taken:
        unique, k = f"{label} ({k})", k + 1
    return unique


def plan(models: Sequence[str], parameters: dict[str, Any] | None = None, root: Path | None = None,
         only: Sequence[str] | None = None, budget: str = DEFAULT_BUDGET, from_text: bool = False) -> list[Stage]:
    """The study's stages for ``models`` and the book's ``parameters`` (``chapter_parameters``);
    ``only``: these chapters. Training runs come first, each once however many chapters use it."""
    root, names = _chapters(root, only)
    across = not only or ACROSS in only  # the across-models job, last
    values = chapter_parameters(root, names + [ACROSS] * across, dict(parameters or {}), budget, from_text)
    across_params = values.pop(ACROSS, None)
    models = parse_models(models)
    labels = dict(zip(models, model_labels(models)))
    trains: dict[Any, Stage] = {}  # one stage per distinct training run
    stages: list[Stage] = []
    for name, params in values.items():
        configs = _train_configs(params) if SERIES_PARAMETER in params else []
        for config in configs:
            if config not in trains:
                label = _unique(f"depth {config.depth}, seed {config.seed}", {s.label for s in trains.values()})
                trains[config] = Stage(TRAIN, None, label, dict(config=config))
        series = tuple(trains[config].name for config in configs)
        per_model = [p for p in MODEL_PARAMETERS if p in params]
        if not per_model:
            stages.append(Stage(name, None, "", chapter_arguments(name, params), series))
            continue
        for index, model in enumerate(models):
            given = dict(params, **{per_model[0]: [model] if per_model[0] == "models" else model})
            if index > 0 and configs and name not in SERIES_IN_EVERY_JOB:  # the series' part: once, in the first job
                given[SERIES_PARAMETER] = None
            shared = tuple(f"{other} · {labels[model]}" for other in SHARES.get(name, ()) if other in names)
            kwargs, fitted = fit_to_model(chapter_arguments(name, given), model)
            stages.append(Stage(name, model, labels[model], kwargs, shared + (series if index == 0 else ()),
                                fitted))
    stages = list(trains.values()) + stages
    if across:
        stages.append(across_stage(across_params, models, stages))
    return stages


# --- what each job is expected to count (the progress bar's weights) ------------------------------------

REFERENCE_WEIGHTS = 30 * BLOCK_WEIGHTS + HEAD_WEIGHTS  # SmolLM2-135M's matrices: the book's costs are for it


@functools.lru_cache(maxsize=None)
def model_config(model: str | None):
    """A model's ``config.json`` as transformers reads it (a directory, or a hub id in this machine's
    hub cache; nothing downloaded); None for no model, a built-in alias or a ``.gguf`` file (read
    once converted) and a model whose config is not here."""
    if model is None or model in BUILTIN_MODELS or str(model).endswith(".gguf"):
        return None
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model, local_files_only=True)
    except Exception:  # noqa: BLE001 - a hint for the plan only: a model it cannot read is planned as given
        return None


FITTED = ("k_max", "k_values", "seq_len")  # the chapter parameters a model bounds: blocks removed, tokens per window


def model_bounds(model: str | None) -> tuple[int | None, int | None]:
    """``(blocks, positions)`` of a model from its ``model_config`` (None where unknown)."""
    config = model_config(model)
    if config is None:
        return None, None
    found = [next((getattr(config, key) for key in keys if isinstance(getattr(config, key, None), int)), None)
             for keys in (("num_hidden_layers", "n_layer", "num_layers"), ("max_position_embeddings", "n_positions"))]
    return found[0], found[1]


def removable_blocks(n_blocks: int) -> int:
    """How many of ``n_blocks`` blocks every block strategy may remove (at least two remain, protected
    ends never go: ``zones.pruning.Strategy.max_k``)."""
    from zones.pruning import BLOCK, get_strategy, strategy_names

    return min(get_strategy(name).max_k(n_blocks) for name in strategy_names(BLOCK))


def fit_to_model(kwargs: dict[str, Any], model: str | None) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``kwargs`` with the ``FITTED`` parameters that cannot apply to ``model`` clipped to what fits
    (``k_max`` and every ``k_values`` entry to the blocks every strategy may remove, ``seq_len`` to
    the model's positions), and each change in words (``k_max=3 → 2 (at most 2 of its 4 blocks may
    go)``). A model whose bounds are unknown, or that has no block to spare, is left as given."""
    blocks, positions = model_bounds(model)
    fitted, notes = dict(kwargs), []
    cap = removable_blocks(blocks) if blocks else 0
    why = f"at most {cap} of its {blocks} blocks may go"
    if cap >= 1 and isinstance(kwargs.get("k_max"), int) and kwargs["k_max"] > cap:
        fitted["k_max"] = cap
        notes.append(f"k_max={kwargs['k_max']} → {cap} ({why})")
    values = kwargs.get("k_values")
    if cap >= 1 and isinstance(values, (list, tuple)) and any(int(k) > cap for k in values):
        fitted["k_values"] = sorted({min(int(k), cap) for k in values})
        notes.append(f"k_values={list(values)} → {fitted['k_values']} ({why})")
    if positions and isinstance(kwargs.get("seq_len"), int) and kwargs["seq_len"] > positions:
        fitted["seq_len"] = positions
        notes.append(f"seq_len={kwargs['seq_len']} → {positions} (its {positions} positions)")
    return fitted, tuple(notes)


def model_scale(model: str | None) -> float:
    """A model's matrix weights over SmolLM2-135M's (a chapter's work grows with them): from its
    ``model_config``, built on the meta device (no weights read); 1.0 for SmolLM2-135M itself and
    for a model whose config is not here."""
    config = model_config(model)
    if config is None:
        return 1.0
    try:
        import torch
        from transformers import AutoModelForCausalLM

        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
        return max(module_weights(built), 1) / REFERENCE_WEIGHTS
    except Exception:  # noqa: BLE001 - a weight for the bar only: any model it cannot read weighs as the reference
        return 1.0


def stage_work(stage: Stage, budget: str = DEFAULT_BUDGET, root: Path | None = None,
               scales: dict[str, float] | None = None) -> float:
    """What ``stage``'s job is expected to count, in reference forwards (``zones.core.progress``):
    a trained run, its steps' training work from its shapes; a chapter, its cost in the book at
    ``budget`` (``zones.book.expected_forwards``, for SmolLM2-135M) scaled by the token budgets it
    is given (``zones.book.budget_scale``) and by its model's ``model_scale`` (``scales``: by model)."""
    if stage.chapter == TRAIN:
        from zones.series.config import parameter_count

        config = stage.kwargs["config"]
        d, m = config.hidden_size, config.mlp_ratio
        weights = config.depth * (4 + 2 * m) * d * d + config.vocab_size * d  # blocks' matrices and the head
        step = training_flops(weights, config.batch_size * config.seq_len, parameter_count(config))
        return config.steps * step / REFERENCE_FLOPS
    declared = chapter_declared(study_root(root), stage.chapter)
    tokens = budget_scale(stage.chapter, declared, stage.kwargs, base=measured_budget(stage.chapter, budget))
    forwards = expected_forwards(stage.chapter, budget, tokens) or expected_forwards(stage.chapter)
    if stage.model is None:  # a chapter on the trained depth series: its runs' size, else the reference's
        return forwards * series_scale(stage.kwargs)
    scale = (scales or {}).get(stage.model)
    return forwards * (model_scale(stage.model) if scale is None else scale)


def series_scale(kwargs: dict[str, Any]) -> float:
    """The mean matrix weights of the trained runs a chapter without a model reads (its ``profile``'s
    depth series, :func:`_train_configs`) over SmolLM2-135M's; 1.0 when it reads none."""
    configs = _train_configs(kwargs) if SERIES_PARAMETER in kwargs else []
    if not configs:
        return 1.0
    weights = [c.depth * (4 + 2 * c.mlp_ratio) * c.hidden_size ** 2 + c.vocab_size * c.hidden_size for c in configs]
    return sum(weights) / len(weights) / REFERENCE_WEIGHTS


def study_work(stages: Sequence[Stage], budget: str = DEFAULT_BUDGET, root: Path | None = None) -> dict[str, float]:
    """Each stage's ``stage_work`` (each model's scale read once): the study bar's weights, and its total."""
    scales = {model: model_scale(model) for model in {s.model for s in stages if s.model is not None}}
    return {stage.name: stage_work(stage, budget, root, scales) for stage in stages}


# --- the plan as a table: zones study --plan ------------------------------------------------------------

PLAN_COLUMNS = ["job", "after", "reference_forwards", "seconds", "fitted"]


def forward_seconds() -> tuple[float, str]:
    """A reference forward's seconds on this machine (``zones.book.reference_forward_seconds``,
    timed once), and where the number comes from; ``REFERENCE_SECONDS_GUESS`` when it cannot be timed."""
    from zones.book import REFERENCE_SECONDS_GUESS, reference_forward_seconds

    seconds = reference_forward_seconds(repeats=1)
    return (seconds, "timed here") if seconds else (REFERENCE_SECONDS_GUESS, "guessed: none could be timed")


def plan_table(stages: Sequence[Stage], budget: str = DEFAULT_BUDGET, root: Path | None = None,
               seconds_per_forward: float = 1.0) -> pd.DataFrame:
    """The study's jobs before any runs: each one's ``after`` (the jobs it waits for), expected
    ``reference_forwards`` (``study_work``), estimated ``seconds`` at ``seconds_per_forward`` and
    the parameters ``fitted`` to its model."""
    works = study_work(stages, budget, root)
    return pd.DataFrame([dict(job=s.name, after=", ".join(s.after), reference_forwards=works[s.name],
                              seconds=round(works[s.name] * seconds_per_forward, 1), fitted="; ".join(s.fitted))
                         for s in stages], columns=PLAN_COLUMNS)


def plan_text(table: pd.DataFrame, seconds_per_forward: float, source: str) -> str:
    """What ``zones study --plan`` prints: a head line (jobs, work, time one after the other), one
    line per job (its cost, its time, what it waits for, what was fitted to its model)."""
    total = float(table["reference_forwards"].sum())
    lines = [f"zones study --plan: {len(table)} jobs, about {total:.3g} reference forwards, about "
             f"{duration(total * seconds_per_forward)} one after the other (a reference forward: "
             f"{seconds_per_forward:.2f} s, {source}); nothing run"]
    width = max([len(j) for j in table["job"]] + [3])
    for row in table.to_dict("records"):
        notes = [f"after {row['after']}"] * bool(row["after"]) + [f"fitted: {row['fitted']}"] * bool(row["fitted"])
        lines.append(f"  {row['job']:<{width}}  {row['reference_forwards']:>8.3g} RF  {duration(row['seconds']):>9}"
                     f"  {'; '.join(notes)}".rstrip())
    return "\n".join(lines)


# --- the figures across models ----------------------------------------------------------------------------

ACROSS_FIGURES = ("rho_by_model", "profiles_on_depth")  # zones.figures.across_models, as the chapter draws them


def across_figures(folder: Path) -> list[Path]:
    """The across-models chapter's figures (``zones.figures.across_models``: ρ per model against the
    paper's band, the profiles on relative depth) drawn from its tables in ``folder`` (the study's
    ``OUT/across_models``), each saved there as a page that opens offline (``NAME.html``, Vega
    inlined) and as its Vega-Lite spec (``NAME.json``). Returns the files written."""
    from zones.figures.across_models import profiles_on_depth, rho_by_model
    from zones.report.verdicts import PAPER_RHO

    models = pd.read_csv(folder / "models.csv")
    alphas, deltas = pd.read_csv(folder / "alpha_profiles.csv"), pd.read_csv(folder / "delta_profiles.csv")
    summary = json.loads((folder / "summary.json").read_text()) if (folder / "summary.json").exists() else {}
    title = f"{summary.get('role', 'q')} {summary.get('alpha_estimator', 'alpha_shape')}"
    charts = dict(rho_by_model=rho_by_model(models, PAPER_RHO),
                  profiles_on_depth=profiles_on_depth(alphas, deltas, alpha_title=title))
    written = []
    for name in ACROSS_FIGURES:
        chart = charts[name]
        atomic_write_text(folder / f"{name}.json", chart.to_json() + "\n")
        with tempfile.TemporaryDirectory(prefix=SCRATCH_PREFIX + "figure-") as scratch:
            page = Path(scratch) / f"{name}.html"
            chart.save(str(page), inline=True)  # the Vega scripts inside the page: no network to view it
            atomic_write_bytes(folder / f"{name}.html", page.read_bytes())
        written += [folder / f"{name}.html", folder / f"{name}.json"]
    return written


# --- a job ----------------------------------------------------------------------------------------------

def _node(on_ray: bool) -> tuple[str, dict[str, float]]:
    """This worker's Ray node id (short) and assigned resources, or this machine's name."""
    ray = sys.modules.get("ray")
    if on_ray and ray is not None and ray.is_initialized():
        context = ray.get_runtime_context()
        return context.get_node_id()[:12], dict(context.get_assigned_resources())
    return os.uname().nodename, {}


def run_stage(stage: Stage, inputs: Sequence[CapturedEntry] = (), carry: bool = True,
              refresh_since: int | None = None) -> StageResult:
    """Run one stage where this job landed: take ``inputs`` into this machine's cache, run the
    chapter (or train the run) inside a cache capture, and return its tables and, with ``carry``,
    the cache entries it read or wrote. ``refresh_since``: the driver's ``--refresh`` began then
    (``zones.core.refresh.refreshing``): what this machine's cache held before is computed again."""
    with refreshing(refresh_since is not None, since=refresh_since):
        return _run_stage(stage, inputs, carry)


SCRATCH_PREFIX = "zones-study-"  # + the pid of the process running the job: a job's scratch folder in the temp folder


def remove_scratch(pids: Sequence[int] | None = None) -> list[Path]:
    """Remove the jobs' scratch folders (``zones-study-PID-*`` in the temporary folder) that a
    killed study left: those whose process is gone, and those of ``pids`` (this process's, once its
    study stopped). A live study's are kept. Returns the folders removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = path.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if path.is_dir() and pid.isdigit() and (int(pid) in (pids or ()) or not pid_alive(int(pid))):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _run_stage(stage: Stage, inputs: Sequence[CapturedEntry], carry: bool) -> StageResult:
    from transformers.utils import logging as transformers_logging

    started = time.time()
    if inputs:
        store_captured(inputs, source="the study's driver")
    tables: dict[str, bytes] = {}
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # one bar, the study's, over the jobs
    try:
        with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as out, \
                capture(carry) as captured:
            if stage.chapter == TRAIN:
                from zones.series import train_model

                train_model(stage.kwargs["config"], progress=False)
            else:
                run = importlib.import_module(f"zones.report.{stage.chapter}").run
                accepted = inspect.signature(run).parameters
                extra = {key: value for key, value in (("out_dir", out), ("progress", False)) if key in accepted}
                run(**stage.kwargs, **extra)
                for path in sorted(Path(out).rglob("*")):
                    if path.is_file():
                        tables[path.relative_to(out).as_posix()] = path.read_bytes()
    finally:
        if bars:
            transformers_logging.enable_progress_bar()
    node, resources = _node(carry)  # jobs carry their entries on Ray only
    return StageResult(stage.name, tables, captured.entries, captured.tally, node, time.time() - started, resources)


# --- the driver --------------------------------------------------------------------------------------------

def _record(stage: Stage) -> tuple[Path, dict]:
    parts = dict(kind="study_stage", version=RECORD_VERSION, chapter=stage.chapter, model=stage.model,
                 kwargs=stage.kwargs)
    return entry_path(RECORDS, parts, ext="entries"), parts


def last_entries(stage: Stage) -> list[CapturedEntry]:
    """The entries the same stage read or wrote the last time this machine's study ran it, as far
    as this cache holds them (none when it never did): a rerun sends them with the job, so a job
    landing on a node without them computes nothing again. Only a hint: a damaged record is none."""
    path, parts = _record(stage)
    try:
        found = read_entry(path, parts)
    except CacheError:
        return []
    return collect_entries(json.loads(found[0])) if found else []


def remember_entries(stage: Stage, entries: Sequence[CapturedEntry]) -> None:
    path, parts = _record(stage)
    write_entry(path, parts, json.dumps(sorted(e.path for e in entries)).encode())


STUDY_FLAGS = ("models", "executor", "ray_address", "retries", "cpus_per_job", "gpus_per_job", "budget", "only",
               "out_dir")   # the study's own flags: a job's error naming one means that flag


def study_wording(message: str, stages: Sequence[Stage]) -> str:
    """A failed job's line as the study was given its parameters: a chapter parameter that the
    chapter's error names as a command-line flag (``--seq-len 512``) is named as the study takes
    it (``--param seq_len=512``; ``zones.book.book_wording``); the study's own flags stay."""
    declared = {name for stage in stages for name in stage.kwargs if name not in STUDY_FLAGS}
    return book_wording(message, declared)


def _prepare_models(models: Sequence[str]) -> None:
    """Convert the GGUF models here (converted copies do not travel with the jobs' entries)."""
    for model in models:
        if model in BUILTIN_MODELS or str(model).endswith(".gguf"):
            resolve_source(model)


def study(models: str | Sequence[str], parameters: dict[str, Any] | None = None, *, executor: str = "local",
          ray_address: str | None = None, retries: int = 2, cpus_per_job: float = 1,
          gpus_per_job: float | None = None, out_dir: str | Path | None = None, only: Sequence[str] | None = None,
          budget: str = DEFAULT_BUDGET, from_text: bool = False, root: Path | None = None, progress: bool = True,
          refresh: bool = False, log=print, python: bool = False) -> StudyResult:
    """Run the study (see the module's docstring) and return it; ``JobFailed`` names every job that
    failed, after the others finished (their entries are stored here already). ``refresh``: every
    job computes again what the caches held before the study began (``zones.core.refresh.refreshing``),
    and is sent none of the entries it used the last time. ``python``: called from Python (the API),
    so a failed job's error names chapter parameters as keywords (``seq_len=128``), not ``--param``."""
    check_executor(executor)
    stages = plan(models, parameters, root=root, only=only, budget=budget, from_text=from_text)
    models = parse_models(models)
    check_local_models(models)
    if out_dir is not None:
        check_record(out_dir, stages)
    remove_scratch()  # what killed studies left in the temporary folder
    carry = executor != "local"  # local jobs write this process's cache already
    by_name = {stage.name: stage for stage in stages}
    results: dict[str, StageResult] = {}
    stored = present = 0

    events: list = []
    command = resume_command(models, parameters, executor=executor, ray_address=ray_address, retries=retries,
                             cpus_per_job=cpus_per_job, gpus_per_job=gpus_per_job, out_dir=out_dir, only=only,
                             budget=budget, from_text=from_text)
    ledger = Ledger(stages, out_dir, command=command, executor=executor, cpus_per_job=cpus_per_job, events=events,
                    log=log)

    def prepare(job: Job, before: dict[str, StageResult]) -> Job:
        ledger.start(job.name)
        if not carry:  # local jobs use this cache itself
            return job
        inputs = {} if refresh else {entry.path: entry for entry in last_entries(by_name[job.name])}
        inputs.update({entry.path: entry for result in before.values() for entry in result.entries})
        return replace(job, args=(by_name[job.name], list(inputs.values()), carry, since))

    def take(job: Job, result: StageResult) -> None:
        nonlocal stored, present
        new, old = store_captured(result.entries, source=f"job {job.name} on {result.node}")
        stored, present = stored + new, present + old
        if carry:
            remember_entries(by_name[job.name], result.entries)
        results[job.name] = result
        if result.tally.n_computed == 0:  # read from the cache: not progress on the bar, nor its rate
            mark_from_cache(job.name)
        ledger.finish(by_name[job.name], result)  # its tables, jobs.csv, the state file and its line, at once
        if job.name == ACROSS and out_dir is not None and result.tables:
            log(f"across models: {', '.join(str(p) for p in across_figures(Path(out_dir) / ACROSS))}")
        if not any(job.name in s.after for s in stages):  # no job needs its entries any more
            result.entries = []

    with refreshing(refresh):  # the start of the refresh, on this machine's clock, for every job
        since = refresh_since()
    works = study_work(stages, budget, root)
    jobs = [Job(stage.name, run_stage, (stage, [], carry, since), cpus=cpus_per_job, gpus=gpus_per_job,
                after=stage.after, work=works[stage.name]) for stage in stages]
    where = (f"; tables and jobs.csv in {out_dir} as jobs finish (zones study --status {out_dir})"
             if out_dir is not None else "")
    log(f"zones study: {len(models)} model{'s' if len(models) > 1 else ''}, {len(jobs)} jobs ({executor}), about "
        f"{sum(works.values()):.3g} reference forwards of work (the bar's unit, RF){where}")
    started = time.time()
    here = Tally()
    signals = _StopOnSignals(log, lambda: [name for name, row in ledger.rows.items() if row["status"] == "running"])
    try:
        with counting() as here, signals:
            if executor == "ray":
                ray_connect(ray_address)  # an address that does not answer fails before any work
                signals.install()  # ray.init puts its own SIGTERM handler in place
            _prepare_models(models)
            try:
                run_jobs(jobs, executor, ray_address=ray_address, retries=retries, progress=progress,
                         desc="zones study", unit="RF", events=events, prepare=prepare, on_result=take,
                         stopping=signals.stopping,
                         on_failure=lambda job, why, attempts: ledger.fail(job.name, why, attempts))
            except JobFailed as err:
                raise JobFailed(str(err) if python else study_wording(str(err), stages)) from None
    except KeyboardInterrupt as err:  # SIGINT or SIGTERM: one line, what finished and how to resume
        signum = getattr(err, "signum", signal.SIGINT)
        remove_scratch([os.getpid()])  # the jobs cut off here: their scratch folders
        line = ledger.stop(signum)
        log(line)
        raise StudyStopped(line, signum) from None
    except BaseException:
        ledger.end(failed=True)
        raise
    finally:  # said also when a job failed: what the others did is in this cache
        tally = Tally()
        for result in [*results.values(), StageResult("", {}, [], here, "", 0.0)]:
            tally.update(result.tally)
        if ledger.state != "stopped":
            log(f"zones study: {len(results)} of {len(jobs)} jobs in {time.time() - started:.0f} s; "
                f"{tally.sentence()}; {stored} entries stored in this machine's cache ({present} already here)")
        signals.restore()  # after the stop's line: a signal during the clean stop cannot end it unsaid
    ledger.end(failed=False)
    tables = {(s.chapter, s.label): results[s.name].tables for s in stages if results[s.name].tables}
    return StudyResult(ledger.table(), tally, stored, present, tables, None if out_dir is None else Path(out_dir))



# --- the study as it runs: each job's tables, jobs.csv and the state file, kept as jobs finish ---------------

STATE_FILE = "study-state.json"  # OUT/study-state.json: every job's status, rewritten as jobs start and finish
STATE_VERSION = 1
JOB_COLUMNS = ["job", "chapter", "model", "label", "status", "node", "seconds", "computed_seconds", "cpus", "gpus",
               "read", "computed", "retries", "fitted", "error"]
# fitted: the parameters clipped to the model (fit_to_model), in words; computed_seconds: the seconds of the run
# that computed the job's tables (kept when a resumed study only reads them back from the cache)
STATUSES = ("done", "running", "failed", "waiting")  # the order --status lists them in


class StudyStopped(KeyboardInterrupt):
    """The study was stopped by a signal (``signum``: SIGINT or SIGTERM); its message is the line the
    study said: what finished and the command that resumes it. ``exit_code``: 128 + ``signum``."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + int(self.signum)


class _Signalled(KeyboardInterrupt):
    """Raised in the main thread by a SIGINT or SIGTERM while the study runs."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _StopOnSignals:
    """While the study runs (in the main thread), SIGINT and SIGTERM stop it instead of killing the
    process silently. The first asks it to stop after the running jobs (:meth:`stopping` tells
    ``run_jobs`` so: it starts no other job, and raises once those end) and says so in one line
    (``say``; ``running()``: the jobs running), naming the remedy: a second signal, which raises
    :class:`_Signalled` at once. A signal after that, during the clean stop, is ignored until
    :meth:`restore`, which the study calls once its stop line is said, so the line names the signal
    that ended it; the handlers before are restored at the end. ``install()`` again after something
    installed its own (``ray.init`` does)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)
    active = False

    def __init__(self, say=print, running=lambda: []):
        self.say, self.running = say, running

    def __enter__(self):
        self.active = threading.current_thread() is threading.main_thread()
        self.raised = False
        self.requested: int | None = None
        if self.active:
            self.previous = {s: signal.getsignal(s) for s in self.SIGNALS}
            self.install()
        return self

    def restore(self) -> None:
        """The handlers from before the study, back (once)."""
        if self.active:
            self.active = False
            for s, handler in self.previous.items():
                signal.signal(s, handler)

    def install(self) -> None:
        if self.active:
            for s in self.SIGNALS:
                signal.signal(s, self._handle)

    def stopping(self) -> "_Signalled | None":
        """What ``run_jobs`` raises once the running jobs end: the first signal's, when one came."""
        return None if self.requested is None else _Signalled(self.requested)

    def _handle(self, signum, frame):
        if self.raised:
            return  # the clean stop is under way: its line names the signal that ended it
        if self.requested is None:
            self.requested = signum
            running = list(self.running())
            after = f"after the running job{'s' if len(running) > 1 else ''} ({', '.join(running)})" if running \
                else "before the next job"
            self.say(f"zones study: {signal.Signals(signum).name}: stopping {after}; a second SIGINT or SIGTERM "
                     f"stops at once")
            return
        self.raised = True
        raise _Signalled(signum)

    def __exit__(self, *exc):
        if not self.raised and not (exc and isinstance(exc[1], _Signalled)):
            self.restore()  # stopping on a signal: the handler stays, ignoring another, until restore()
        else:
            self.raised = True
        return False


def duration(seconds: float) -> str:
    """``42 s``, ``7 m 02 s``, ``1 h 03 m``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} m {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} m"


def stage_folder(out_dir: Path, chapter: str, label: str) -> Path:
    """``OUT/<chapter>/<label>`` (``OUT/<chapter>`` for a job without a model)."""
    return Path(out_dir) / chapter / label if label else Path(out_dir) / chapter


def resume_command(models: Sequence[str], parameters: dict[str, Any] | None, *, executor: str = "local",
                   ray_address: str | None = None, retries: int = 2, cpus_per_job: float = 1,
                   gpus_per_job: float | None = None, out_dir: str | Path | None = None,
                   only: Sequence[str] | None = None, budget: str = DEFAULT_BUDGET, from_text: bool = False) -> str:
    """The ``zones study`` command that runs this study again (and so resumes it: what is cached is
    read, not computed): the flags that differ from their defaults, ``--param`` as given
    (``from_text``: YAML texts; else each value written as JSON, which YAML reads)."""
    words = ["zones", "study", "--models", ",".join(map(str, models))]
    for flag, value, usual in (("--executor", executor, "local"), ("--ray-address", ray_address, None),
                               ("--retries", retries, 2), ("--cpus-per-job", cpus_per_job, 1),
                               ("--gpus-per-job", gpus_per_job, None), ("--budget", budget, DEFAULT_BUDGET)):
        if value != usual:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    for name, value in (parameters or {}).items():
        words += ["--param", f"{name}={value if from_text else json.dumps(value, default=str)}"]
    if only:
        words += ["--only", *only]
    if out_dir is not None:
        words += ["--out", str(out_dir)]
    return shlex.join(words)


class Ledger:
    """What the study says and keeps as it runs. Each job's start and end is written at once,
    atomically (``zones.core.atomic.atomic_write_text``/``write_table``), to ``OUT/STATE_FILE``
    (every job's status: done, running, failed, waiting; the command that resumes the study)
    and, as each job ends, to ``OUT/jobs.csv``; a finished job's tables go to
    ``OUT/<chapter>/<label>/`` as it finishes, and a line says so (``done pruning · m in 7 m 02 s
    (computed)``). Without ``out_dir`` only the lines are said."""

    def __init__(self, stages: Sequence[Stage], out_dir: str | Path | None, *, command: str, executor: str,
                 cpus_per_job: float, events: list, log):
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.command, self.executor, self.cpus, self.events, self.log = command, executor, cpus_per_job, events, log
        self.started = time.time()
        self.state = "running"
        self.stopped_by: str | None = None
        earlier = _computed_seconds(self.out_dir) if self.out_dir is not None else {}
        self.rows = {s.name: dict(job=s.name, chapter=s.chapter, model=s.model or "", label=s.label,
                                  status="waiting", fitted="; ".join(s.fitted),
                                  computed_seconds=earlier.get(s.name)) for s in stages}
        self.begun: dict[str, float] = {}
        self.save()

    def count(self, status: str) -> int:
        return sum(row["status"] == status for row in self.rows.values())

    def start(self, name: str) -> None:
        self.rows[name]["status"] = "running"
        self.begun[name] = time.time()
        self.save()

    def finish(self, stage: Stage, result: StageResult) -> None:
        row = self.rows[stage.name]
        if result.tally.n_computed > 0 or row.get("computed_seconds") is None:  # this run computed it
            row["computed_seconds"] = round(result.seconds, 2)
        row.update(status="done", node=result.node, seconds=round(result.seconds, 2),
                   cpus=result.resources.get("CPU", self.cpus), gpus=result.resources.get("GPU", 0.0),
                   read=result.tally.n_read, computed=result.tally.n_computed, retries=self._retries(stage.name),
                   error="")
        if self.out_dir is not None:
            folder = stage_folder(self.out_dir, stage.chapter, stage.label)
            for name, data in result.tables.items():
                atomic_write_bytes(folder / name, data)
        self.save(jobs=True)
        how = "from cache" if result.tally.n_computed == 0 else "computed"
        self.log(f"done {stage.name} in {duration(result.seconds)} ({how}){self._fitted(stage.name)}; "
                 f"{self.count('done')} of {len(self.rows)} jobs done")

    def _fitted(self, name: str) -> str:
        """``, fitted to its model: k_max=3 → 2 (...)`` when the job's parameters were clipped."""
        fitted = self.rows[name]["fitted"]
        return f", fitted to its model: {fitted}" if fitted else ""

    def fail(self, name: str, why: str, attempts: int) -> None:
        row = self.rows[name]
        row.update(status="failed", seconds=round(time.time() - self.begun.get(name, time.time()), 2),
                   retries=self._retries(name), error=why)
        self.save(jobs=True)
        self.log(f"failed {name} ({why}; {attempts} attempt{'s' if attempts > 1 else ''}){self._fitted(name)}")

    def stop(self, signum: int) -> str:
        """The study was stopped: jobs cut off are waiting again; the line that says so."""
        for row in self.rows.values():
            if row["status"] == "running":
                row["status"] = "waiting"
        self.state, self.stopped_by = "stopped", signal.Signals(signum).name
        self.save(jobs=True)
        done, failed = self.count("done"), self.count("failed")
        kept = f"; their tables are in {self.out_dir}" if self.out_dir is not None and done else ""
        return (f"zones study: stopped by {self.stopped_by} after {duration(time.time() - self.started)}: {done} of "
                f"{len(self.rows)} jobs done{f', {failed} failed' if failed else ''}{kept}, and cached; resume with "
                f"the same command, which computes only the rest: {self.command}")

    def end(self, failed: bool) -> None:
        self.state = "failed" if failed else "finished"
        self.save(jobs=True)

    def _retries(self, name: str) -> int:
        return sum(1 for job, _, _ in self.events if job == name)

    def table(self) -> pd.DataFrame:
        """``jobs.csv``: one row per job of the plan, in its order, with its ``status``."""
        table = pd.DataFrame(list(self.rows.values()), columns=JOB_COLUMNS)
        return table.astype({"read": "Int64", "computed": "Int64", "retries": "Int64"})  # empty while not done

    def save(self, jobs: bool = False) -> None:
        if self.out_dir is None:
            return
        now = time.time()
        record = dict(version=STATE_VERSION, state=self.state, stopped_by=self.stopped_by, command=self.command,
                      executor=self.executor, pid=os.getpid(), host=socket.gethostname(), started=self.started,
                      updated=now, jobs=[dict(row, started=self.begun.get(name)) for name, row in self.rows.items()])
        atomic_write_text(self.out_dir / STATE_FILE, json.dumps(record, indent=1, default=str) + "\n")
        if jobs:
            write_table(self.table(), self.out_dir / "jobs.csv")


def _computed_seconds(out_dir: Path) -> dict[str, float]:
    """The seconds each done job of an earlier study in ``out_dir`` took where it was computed
    (``computed_seconds``, else its ``seconds``); empty when there is no readable record."""
    try:
        record = read_state(out_dir)
    except StudyError:
        return {}
    found = {}
    for job in record["jobs"]:
        seconds = job.get("computed_seconds", job.get("seconds"))
        if job.get("status") == "done" and isinstance(seconds, (int, float)) and not isinstance(seconds, bool):
            found[job["job"]] = float(seconds)
    return found


def check_record(out_dir: str | Path, stages: Sequence[Stage]) -> None:
    """Refuse to write a study's record (``STATE_FILE``, ``jobs.csv``) over the record in
    ``out_dir`` of a study with jobs this plan lacks: that study's record would be lost without a
    word. A record this plan covers (a rerun, a resumed study, a larger plan) is replaced; an
    unreadable one too."""
    planned = {stage.name for stage in stages}
    try:
        record = read_state(out_dir)
    except StudyError:
        return  # none, or not readable: nothing the study could keep
    recorded = [job.get("job") for job in record["jobs"] if isinstance(job, dict)]
    dropped = [name for name in recorded if name not in planned]
    if dropped:
        path = Path(out_dir) / STATE_FILE
        raise StudyError(f"{out_dir} holds the record ({STATE_FILE}, jobs.csv) of a study of {len(recorded)} jobs, "
                         f"{len(dropped)} of which this plan of {len(planned)} lacks ({', '.join(dropped[:3])}"
                         f"{', ...' if len(dropped) > 3 else ''}); write to another --out, or delete {path} to "
                         f"replace that record")


JOB_FIELDS = dict(job=str, chapter=str, label=str, status=str)  # what --status reads of each job in the state file


def read_state(out_dir: str | Path) -> dict:
    """The state file of the study in ``out_dir`` (``StudyError`` when there is none or it is not one)."""
    path = Path(out_dir) / STATE_FILE
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise StudyError(f"{out_dir} holds no study ({STATE_FILE} is missing); pass the --out folder of a zones "
                         f"study") from None
    except (OSError, ValueError) as err:
        raise StudyError(f"{path} cannot be read ({type(err).__name__}); the study rewrites it when it runs "
                         f"again") from None
    if not isinstance(record, dict) or record.get("version") != STATE_VERSION or "jobs" not in record:
        raise StudyError(f"{path} is not a state file of this zones version; run the study again to rewrite it")
    remedy = "run the study again to rewrite it"
    if not isinstance(record["jobs"], list):
        raise StudyError(f"{path}: field jobs is not a list of jobs; {remedy}")
    for k, job in enumerate(record["jobs"]):
        if not isinstance(job, dict):
            raise StudyError(f"{path}: jobs[{k}] is not a job record; {remedy}")
        for name, kind in JOB_FIELDS.items():
            if not isinstance(job.get(name), kind):
                what = "is missing" if name not in job else f"is {job[name]!r}, not a {kind.__name__}"
                raise StudyError(f"{path}: field {name} of jobs[{k}] {what}; {remedy}")
        for name in ("seconds", "computed_seconds", "started", "computed"):
            value = job.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise StudyError(f"{path}: field {name} of jobs[{k}] is {value!r}, not a number; {remedy}")
        if job["status"] not in STATUSES:
            raise StudyError(f"{path}: field status of jobs[{k}] is {job['status']!r}, not one of "
                             f"{', '.join(STATUSES)}; {remedy}")
    for name in ("pid", "updated", "started"):
        if name in record and record[name] is not None and not isinstance(record[name], (int, float)):
            raise StudyError(f"{path}: field {name} is {record[name]!r}, not a number; {remedy}")
    return record


def status(out_dir: str | Path) -> pd.DataFrame:
    """The jobs of the study in ``out_dir`` from its state file: ``job, chapter, label, status, seconds,
    how, error``, listed done, running, failed, waiting (each in the plan's order). ``seconds``:
    a finished job's time, a running job's time so far. ``how``: ``from cache`` or ``computed``
    for a finished job. A job recorded as running whose study process is gone (killed without a
    chance to say so) is ``stopped``."""
    record = read_state(out_dir)
    gone = (record.get("state") == "running" and record.get("host") == socket.gethostname()
            and not pid_alive(int(record.get("pid", 0))))
    rows = []
    for job in record["jobs"]:
        state = job["status"]
        if state == "running" and gone:
            state = "stopped"
        seconds = job.get("seconds")
        if state == "running" and job.get("started"):
            seconds = round(time.time() - job["started"], 2)
        how = "" if job["status"] != "done" else ("from cache" if not job.get("computed") else "computed")
        rows.append(dict(job=job["job"], chapter=job["chapter"], label=job["label"], status=state,
                         seconds=seconds, how=how, error=job.get("error") or ""))
    order = {s: k for k, s in enumerate(STATUSES + ("stopped",))}
    table = pd.DataFrame(rows, columns=["job", "chapter", "label", "status", "seconds", "how", "error"])
    return table.sort_values("status", key=lambda c: c.map(order), kind="stable").reset_index(drop=True)
    return True


def status_text(out_dir: str | Path) -> str:
    """What ``zones study --status OUT`` prints: a head line (the study's state and counts), one line
    per job, and the command that resumes the study when it did not finish."""
    record, table = read_state(out_dir), status(out_dir)
    counts = ", ".join(f"{int((table['status'] == s).sum())} {s}" for s in STATUSES + ("stopped",)
                       if s != "stopped" or (table["status"] == s).any())
    state = record.get("state")
    if state == "running" and (table["status"] == "stopped").any():
        state = f"stopped (its process {record.get('pid')} is gone)"
    elif state == "running":
        state = f"running (process {record.get('pid')} on {record.get('host')})"
    elif state == "stopped":
        state = f"stopped by {record.get('stopped_by')}"
    ago = duration(max(0.0, time.time() - float(record.get("updated", time.time()))))
    lines = [f"zones study in {out_dir}: {state}, updated {ago} ago; {len(table)} jobs: {counts}"]
    width = max([len(j) for j in table["job"]] + [3])
    for row in table.to_dict("records"):
        seconds = row["seconds"]
        shown = "" if seconds is None or pd.isna(seconds) else duration(float(seconds))
        note = {"done": row["how"], "failed": row["error"], "running": "so far"}.get(row["status"], "")
        lines.append(f"  {row['status']:<8} {row['job']:<{width}}  {shown:>9}  {note}".rstrip())
    if record.get("state") != "finished":
        lines.append(f"resume (computes only what is missing): {record.get('command')}")
    return "\n".join(lines)



def volatile(name: str) -> bool:
    """A column or summary key that records when or where a job ran (a ``VOLATILE_COLUMNS`` word
    in its name: seconds and shares of them, speeds, cache paths, devices), not what it computed."""
    return any(word in str(name) for word in VOLATILE_COLUMNS)


def stable_view(table: pd.DataFrame) -> pd.DataFrame:
    """A study table without its ``volatile`` columns: what must be equal, bit for bit, wherever
    the study ran."""
    return table[[c for c in table.columns if not volatile(c)]]


# --- the command -----------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``zones study`` (each a glossary term)."""
    chosen = parser.add_mutually_exclusive_group(required=True)  # run a study, or look at one
    add_flag(chosen, "models", "study", help="comma-separated models (aliases, directories, .gguf files or hub ids); "
             "every machine running jobs must be able to load each")
    add_flag(chosen, "status", "study", metavar="OUT")
    add_flag(parser, "plan", "study")
    for name in ("executor", "ray_address", "retries", "cpus_per_job", "gpus_per_job", "budget"):
        add_flag(parser, name, "study")
    add_flag(parser, "refresh", "study", help="recompute every cached result the jobs read, and replace it")
    add_flag(parser, "only", "study", nargs="*", type=str, metavar="CHAPTER")
    parser.add_argument("--param", action="append", default=default("param", context="study"), metavar="NAME=VALUE",
                        help=term("param").meaning + "; --param wins over --budget")
    add_flag(parser, "out_dir", "study")


def _say(message: str) -> None:
    """A line on stderr, above the progress bar."""
    from tqdm.auto import tqdm

    tqdm.write(message, file=sys.stderr)
    sys.stderr.flush()


def run(args: argparse.Namespace) -> int | None:
    """``zones study``: plan, run, store, write (each job's tables as it finishes); ``--status OUT``:
    the jobs of the study there. Stopped by SIGINT or SIGTERM: one line (what finished, how to
    resume), exit status 130 or 143."""
    if args.status is not None:
        print(status_text(args.status))
        return None
    if args.plan:
        stages = plan(args.models, name_values(args.param), only=args.only or None, budget=args.budget,
                      from_text=True)
        check_local_models(parse_models(args.models))
        seconds, source = forward_seconds()
        print(plan_text(plan_table(stages, args.budget, seconds_per_forward=seconds), seconds, source))
        return None
    try:
        result = study(args.models, name_values(args.param), executor=args.executor, ray_address=args.ray_address,
                       retries=args.retries, cpus_per_job=args.cpus_per_job, gpus_per_job=args.gpus_per_job,
                       out_dir=args.out_dir, only=args.only or None, budget=args.budget, from_text=True,
                       refresh=args.refresh, log=_say)
    except StudyStopped as stopped:  # its line is said
        return stopped.exit_code
    print(f"study: {result.out_dir} ({len(result.jobs)} jobs); zones book --models {','.join(args.models)} with the "
          f"same parameters now reads them from the cache")

