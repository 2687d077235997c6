"""Zero-shot tasks through lm-evaluation-harness, on a model zones loaded (or pruned, or healed).

:func:`evaluate_tasks` wraps the model in lm-eval's own ``HFLM`` (``lm_eval.models.huggingface``)
and runs ``lm_eval.simple_evaluate`` on the tasks, found by a ``TaskManager`` whose include
path holds zones' offline tasks (``offline/``): the log-likelihoods, the accuracies and their
standard errors are lm-eval's own computation, not zones'. So zones' loss routine
(``zones.measure.scoring``) is an independent check of them (:func:`loglik_agreement`).

Loading stays zones' (``zones.core.models``: no remote code, no pickles); lm-eval only scores.
The standard tasks (:data:`STANDARD_TASKS`) go by name and read their data wherever lm-eval
finds it (the ``datasets`` cache when offline); the offline tasks read the shipped files.

Every variant answers the same examples (``limit``: the first ``limit`` of each task), so two
variants are compared example by example (:func:`paired_differences`): the 95% interval of a
difference of accuracies comes from ``zones.measure.bootstrap.paired_bootstrap`` over examples.

Results of the offline tasks are cached (``zones.core.cache``) by the model's fingerprint, the
tokenizer's, the data file's sha256, ``limit``, the scoring precision, the lm-eval version and
:data:`VERSION`; the standard tasks' data is not ours to fingerprint, so they are never cached.
"""
from __future__ import annotations

import contextlib
import copy
import io
import logging
import subprocess
import sys
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from torch import nn

from zones.core.cache import entry_path
from zones.core.checks import check_int
from zones.core.data import Windows, tokenizer_fingerprint
from zones.core.entries import read_cached_table, write_cached_table
from zones.core.hub import hub_lookup
from zones.core.models import model_fingerprint
from zones.core.progress import count_module
from zones.measure.bootstrap import check_finite, paired_bootstrap
from zones.measure.scoring import DEFAULT_DTYPE, check_dtype, evaluate_loss, model_device, scoring_precision
from zones.measure.tasks.build import OFFLINE_DIR, TASKS
from zones.measure.tasks.offline_data import data_digest

VERSION = "1"
OFFLINE_TASKS = tuple(TASKS)
OFFLINE_GROUP = "zones_offline"          # the tag of both offline tasks
STANDARD_TASKS = ("piqa", "winogrande", "hellaswag", "arc_easy", "arc_challenge")
METRICS = ("acc", "acc_norm")
TABLE_COLUMNS = ["model", "removed", "task", "metric", "value", "stderr", "n"]
EXAMPLE_COLUMNS = ["model", "removed", "task", "example", "label", "acc", "acc_norm", "logliks"]
DIFFERENCE_COLUMNS = ["task", "metric", "variant", "reference", "difference", "difference_low",
                      "difference_high", "n"]
INSTALL = "install lm-evaluation-harness: pip install 'zones[eval]'"


class TaskError(ValueError):
    """A task request that cannot run (one line: the cause and the remedy)."""


@dataclass
class TaskResult:
    """``table``: one row per task and metric (:data:`TABLE_COLUMNS`); ``examples``: one row
    per example (:data:`EXAMPLE_COLUMNS`; ``logliks``: lm-eval's log-likelihood of each choice,
    ``;``-separated)."""

    table: pd.DataFrame
    examples: pd.DataFrame


def require_lm_eval():
    """The ``lm_eval`` module, or one line saying how to install it."""
    try:
        import lm_eval
    except ImportError:
        raise TaskError(f"zones evaluate runs tasks through lm-evaluation-harness, which is not installed; "
                        f"{INSTALL}") from None
    return lm_eval


def check_tasks(tasks: str | Iterable[str]) -> list[str]:
    """Task names: a list, or one comma-separated string; the offline group expands to its tasks."""
    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if str(t).strip()]
    if not names:
        raise TaskError(f"--tasks names no task; pass e.g. {','.join(OFFLINE_TASKS)} or {','.join(STANDARD_TASKS)}")
    expanded = []
    for name in names:
        for task in (OFFLINE_TASKS if name == OFFLINE_GROUP else (name,)):
            if task not in expanded:
                expanded.append(task)
    return expanded


def check_limit(limit) -> int | None:
    """``limit``: examples per task (the first ones), or None for all."""
    return None if limit is None else check_int(limit, "--limit", min=1)


def git_commit_quietly() -> str | None:
    """The current folder's git commit (``git describe --always``), or None outside a repository or
    without git: lm-eval's own probe lets git print "fatal: not a git repository" on stderr."""
    try:
        found = subprocess.run(["git", "describe", "--always"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return found.stdout.strip() or None if found.returncode == 0 else None


@contextlib.contextmanager
def _quiet():
    """lm-eval logs at INFO and WARNING for every task and request; keep its errors only, and keep
    it from reaching any hub (the offline tasks need none; a standard one reads the local cache).
    Its git probe is made quietly (:func:`git_commit_quietly`)."""
    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    evaluator = sys.modules.get("lm_eval.evaluator")
    probe = getattr(evaluator, "get_git_commit_hash", None)
    if probe is not None:
        evaluator.get_git_commit_hash = git_commit_quietly
    try:
        yield
    finally:
        logger.setLevel(level)
        if probe is not None:
            evaluator.get_git_commit_hash = probe


def task_manager(tasks: Sequence[str], include_path: Sequence[str] = (), include_defaults: bool | None = None):
    """lm-eval's ``TaskManager`` with zones' offline tasks on its include path, and lm-eval's own
    tasks too (``include_defaults``; by default unless every task asked for is an offline one:
    indexing lm-eval's thousands of task files takes seconds). An unknown name is one line."""
    require_lm_eval()
    from lm_eval.tasks import TaskManager

    defaults = any(t not in OFFLINE_TASKS for t in tasks) if include_defaults is None else include_defaults
    with _quiet():
        manager = TaskManager(include_path=[str(OFFLINE_DIR), *map(str, include_path)], include_defaults=defaults)
    unknown = [t for t in tasks if t not in manager.all_tasks]
    if unknown:
        raise TaskError(f"unknown task(s) {', '.join(unknown)}: lm-eval knows no such task; the offline ones are "
                        f"{', '.join(OFFLINE_TASKS)}, the standard five {', '.join(STANDARD_TASKS)}")
    return manager


class TooFewPositions(TaskError):
    """The model's window cannot hold a task's longest answer: ``positions`` (lm-eval's
    ``max_length``), ``needed`` (the longest answer, in tokens)."""

    def __init__(self, positions: int, needed: int):
        super().__init__(f"the model has {positions} positions; the longest answer takes {needed} tokens")
        self.positions, self.needed = positions, needed


def _check_answers_fit(lm) -> None:
    """Make ``lm`` refuse, as :class:`TooFewPositions`, requests whose answer (continuation) is
    longer than its window, before lm-eval's bare ``assert len(continuation_enc) <= max_length``:
    lm-eval keeps each answer whole and cuts only the context."""
    score = lm._loglikelihood_tokens

    def checked(requests, *args, **kwargs):
        longest = max((len(r[2]) for r in requests if isinstance(r, tuple) and len(r) == 3), default=0)
        if longest > lm.max_length:
            raise TooFewPositions(int(lm.max_length), int(longest))
        return score(requests, *args, **kwargs)

    lm._loglikelihood_tokens = checked


def _count_calls(lm, model: nn.Module) -> None:
    """Count every forward lm-eval makes (``zones.core.progress``): each call's tokens, padding
    included (it runs), through the model's matrices."""
    call = lm._model_call

    def counted(inps, *args, **kwargs):
        count_module(model, inps.numel())
        return call(inps, *args, **kwargs)

    lm._model_call = counted


def hflm(model: nn.Module, tokenizer, batch_size: int = 8):
    """lm-eval's ``HFLM`` around a model zones loaded (a copy of the tokenizer: lm-eval may set its
    padding token); an answer longer than the model's window is :class:`TooFewPositions`; its
    forwards are counted (:func:`_count_calls`)."""
    require_lm_eval()
    from lm_eval.models.huggingface import HFLM

    with _quiet():
        lm = HFLM(pretrained=model, tokenizer=copy.deepcopy(tokenizer), batch_size=int(batch_size),
                  device=str(model_device(model)))
    _check_answers_fit(lm)
    _count_calls(lm, model)
    return lm


def _examples(samples: list[dict], model_name: str, removed: str, task: str) -> pd.DataFrame:
    rows = []
    for s in sorted(samples, key=lambda s: int(s["doc_id"])):
        logliks = [float(r[0]) for r in s["filtered_resps"]]
        rows.append(dict(model=model_name, removed=removed, task=task, example=int(s["doc_id"]),
                         label=int(s["target"]), acc=float(s["acc"]), acc_norm=float(s["acc_norm"]),
                         logliks=";".join(repr(v) for v in logliks)))
    return pd.DataFrame(rows, columns=EXAMPLE_COLUMNS)


def _table(results: dict, model_name: str, removed: str, task: str) -> pd.DataFrame:
    found, n = results["results"][task], results["n-samples"][task]["effective"]
    rows = []
    for metric in METRICS:
        stderr = found.get(f"{metric}_stderr,none")
        rows.append(dict(model=model_name, removed=removed, task=task, metric=metric,
                         value=float(found[f"{metric},none"]),
                         stderr=float(stderr) if isinstance(stderr, (int, float)) else float("nan"), n=int(n)))
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


def _run(model, tokenizer, tasks: list[str], *, limit, batch_size, dtype, include_path) -> tuple[dict, dict]:
    """lm-eval's results and logged samples for ``tasks`` (one simple_evaluate call)."""
    lm_eval = require_lm_eval()
    import lm_eval.evaluator  # noqa: F401 - imported before _quiet, which replaces its git probe
    manager = task_manager(tasks, include_path)
    lm = hflm(model, tokenizer, batch_size)
    # A standard task's data comes from the hub, or from the local datasets cache when the hub is
    # unreachable (then a miss is one line); the offline tasks read the shipped files only.
    hub = (hub_lookup(f"the data of {', '.join(t for t in tasks if t not in OFFLINE_TASKS)}",
                      f"fetch it once on a machine with a network, or run the offline tasks "
                      f"({', '.join(OFFLINE_TASKS)})")
           if any(t not in OFFLINE_TASKS for t in tasks) else contextlib.nullcontext(True))
    with _quiet(), hub, scoring_precision(model, dtype), contextlib.redirect_stdout(io.StringIO()):
        results = lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                          log_samples=True, bootstrap_iters=1000, num_fewshot=0)
    return results, results["samples"]


def evaluate_tasks(model: nn.Module, tokenizer, tasks: str | Sequence[str], *, limit: int | None = None,
                   batch_size: int = 8, dtype: str = DEFAULT_DTYPE, model_name: str = "",
                   removed: Sequence[int] | str = "", include_path: Sequence[str] = (), cache: bool = True,
                   refresh: bool = False, fingerprint: str | None = None) -> TaskResult:
    """Run ``tasks`` on ``model`` through lm-eval (module docstring): the tidy table and the
    per-example results, labelled ``model_name`` and ``removed`` (the blocks removed, source
    numbering, for the tables only: ``model`` is scored as it is)."""
    tasks = check_tasks(tasks)
    limit = check_limit(limit)
    batch_size = check_int(batch_size, "batch_size", min=1)
    dtype = check_dtype(dtype, model)
    removed = removed if isinstance(removed, str) else ",".join(str(int(b)) for b in sorted(removed))
    model_name = model_name or str(getattr(model.config, "name_or_path", "")) or "model"
    require_lm_eval()
    import lm_eval

    # Read what is cached; run every other task in ONE lm-eval call (each call pays for lm-eval's
    # set-up); store each offline task's answers, with lm-eval's numbers, as its own entry.
    keys: dict[str, dict] = {}
    if cache and any(t in OFFLINE_TASKS for t in tasks):
        fingerprint = fingerprint or model_fingerprint(model)
        tok = tokenizer_fingerprint(tokenizer)
        keys = {t: dict(kind="lm-eval-task", version=VERSION, model=fingerprint, tokenizer=tok, task=t,
                        data=data_digest(t), limit=limit, dtype=dtype, batch_size=batch_size,
                        lm_eval=lm_eval.__version__) for t in tasks if t in OFFLINE_TASKS}
    found: dict[str, pd.DataFrame] = {}
    for task, key in keys.items():
        hit = None if refresh else read_cached_table(entry_path("lm-eval-task", key), key)
        if hit is not None:
            found[task] = hit
    missing = [t for t in tasks if t not in found]
    if missing:
        try:
            results, samples = _run(model, tokenizer, missing, limit=limit, batch_size=batch_size, dtype=dtype,
                                    include_path=include_path)
        except TooFewPositions as err:
            raise TaskError(f"model {model_name} has {err.positions} positions, too few for {', '.join(missing)}: "
                            f"lm-eval keeps each answer whole in the window and the longest takes {err.needed} "
                            f"tokens; evaluate a model with at least {err.needed} positions, or other tasks") from None
        for task in missing:
            answers = _examples(samples[task], "", "", task)
            summary = _table(results, "", "", task)
            for metric in METRICS:   # lm-eval's own value and stderr ride along in every row
                row = summary[summary["metric"] == metric].iloc[0]
                answers[f"{metric}_value"], answers[f"{metric}_stderr"] = row["value"], row["stderr"]
            found[task] = answers
            if task in keys:
                write_cached_table(answers, entry_path("lm-eval-task", keys[task]), keys[task])
    tables, examples = [], []
    for task in tasks:
        answers = found[task].assign(model=model_name, removed=removed)
        check_finite(np.array([[sum(float(v) for v in row.split(";")) for row in answers["logliks"]]]),
                     lambda _: f"of {model_name}", f"log-likelihood on {task}")
        tables.append(pd.DataFrame([dict(model=model_name, removed=removed, task=task, metric=metric,
                                         value=float(answers[f"{metric}_value"].iloc[0]),
                                         stderr=float(answers[f"{metric}_stderr"].iloc[0]), n=len(answers))
                                    for metric in METRICS], columns=TABLE_COLUMNS))
        examples.append(answers[EXAMPLE_COLUMNS])
    return TaskResult(pd.concat(tables, ignore_index=True), pd.concat(examples, ignore_index=True))


# --------------------------------------------------------------------------------------------
# Paired differences between variants
# --------------------------------------------------------------------------------------------

def variant_label(model: str, removed: str) -> str:
    """How a variant is named in a comparison: the model, and the blocks removed if any (in words:
    "m without blocks 1,3"; "−" means only a difference, "variant − reference")."""
    if not removed:
        return str(model)
    return f"{model} without block{'s' if ',' in str(removed) else ''} {removed}"


def paired_differences(examples: pd.DataFrame, metric: str = "acc", pairs: Sequence[tuple[str, str]] | None = None,
                       **bootstrap) -> pd.DataFrame:
    """Δaccuracy of variants on the same examples, with 95% paired intervals.

    ``examples``: :func:`evaluate_tasks`' per-example rows of several variants (a variant is a
    (model, removed) pair, named by :func:`variant_label`). ``pairs``: (variant, reference)
    labels; by default every variant against the first. For each task, difference = mean
    ``metric`` of the variant − of the reference over the examples both answered; its interval
    is one paired bootstrap over examples for every pair of the task
    (``zones.measure.bootstrap.paired_bootstrap``). Columns :data:`DIFFERENCE_COLUMNS`.
    """
    if metric not in METRICS:
        raise TaskError(f"metric must be one of {METRICS}, not {metric!r}")
    labelled = examples.assign(variant=[variant_label(m, r) for m, r in zip(examples["model"], examples["removed"])])
    variants = list(dict.fromkeys(labelled["variant"]))
    if pairs is None:
        pairs = [(v, variants[0]) for v in variants[1:]]
    missing = sorted({v for pair in pairs for v in pair} - set(variants))
    if missing:
        raise TaskError(f"no examples of {missing}; the variants are {variants}")
    rows = []
    for task, part in labelled.groupby("task", sort=False):
        wide = part.pivot_table(index="variant", columns="example", values=metric, aggfunc="first")
        wide = wide.dropna(axis=1)  # the examples every variant answered
        index = {v: i for i, v in enumerate(wide.index)}
        usable = [(a, b) for a, b in pairs if a in index and b in index]
        if not usable:
            continue
        a_rows = np.array([index[a] for a, _ in usable])
        b_rows = np.array([index[b] for _, b in usable])
        interval = paired_bootstrap(lambda x: x[a_rows].mean(-1) - x[b_rows].mean(-1), (wide.to_numpy(),),
                                    **bootstrap)
        for j, (a, b) in enumerate(usable):
            rows.append(dict(task=task, metric=metric, variant=a, reference=b, difference=float(interval.estimate[j]),
                             difference_low=float(interval.low[j]), difference_high=float(interval.high[j]),
                             n=int(wide.shape[1])))
    return pd.DataFrame(rows, columns=DIFFERENCE_COLUMNS)


# --------------------------------------------------------------------------------------------
# The independent check: lm-eval's log-likelihoods against zones' own loss
# --------------------------------------------------------------------------------------------

def loglik_agreement(model: nn.Module, tokenizer, task: str = OFFLINE_TASKS[0], n_examples: int = 3,
                     batch_size: int = 8) -> pd.DataFrame:
    """lm-eval's log-likelihood of each choice of the first ``n_examples`` examples of ``task``
    (those whose every choice fits the model's positions: lm-eval would cut a longer context)
    against zones' loss on the same tokens (lm-eval's own tokenization): ``example, choice,
    n_tokens, lm_eval, zones, difference`` (nats; zones' = −[NLL(context + choice) −
    NLL(context)], each an ``evaluate_loss`` window sum, which leaves the continuation's NLL
    since the model is causal)."""
    import torch
    from lm_eval.api.instance import Instance

    lm = hflm(model, tokenizer, batch_size)
    manager = task_manager([task])
    with _quiet():
        task_obj = manager.load([task])["tasks"][task]
    n_examples = check_int(n_examples, "n_examples", min=1)
    config = model.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None) or 10 ** 9
    requests, tokens, taken = [], [], 0
    for i, doc in enumerate(task_obj.test_docs()):
        context = task_obj.doc_to_text(doc)
        pairs = [(choice, lm._encode_pair(context, task_obj.config.target_delimiter + choice))
                 for choice in task_obj.doc_to_choice(doc)]
        if any(len(a) + len(b) > int(positions) for _, (a, b) in pairs):
            continue  # lm-eval would cut the context to the model's positions; compare whole examples only
        for j, (choice, (context_ids, continuation_ids)) in enumerate(pairs):
            continuation = task_obj.config.target_delimiter + choice
            requests.append(Instance("loglikelihood", doc, (context, continuation), idx=j))
            tokens.append((i, j, context_ids, continuation_ids))
        taken += 1
        if taken == n_examples:
            break
    with _quiet():
        logliks = [float(ll) for ll, _ in lm.loglikelihood(requests, disable_tqdm=True)]
    rows = []
    for (i, j, context_ids, continuation_ids), ll in zip(tokens, logliks):
        whole = Windows(torch.tensor([context_ids + continuation_ids]), task, "eval", "agreement")
        prefix = Windows(torch.tensor([context_ids]), task, "eval", "agreement")
        nll = (evaluate_loss(model, whole, 1).window_nll[0]
               - (evaluate_loss(model, prefix, 1).window_nll[0] if len(context_ids) > 1 else 0.0))
        rows.append(dict(example=i, choice=j, n_tokens=len(continuation_ids), lm_eval=ll, zones=-float(nll),
                         difference=ll + float(nll)))
    return pd.DataFrame(rows, columns=["example", "choice", "n_tokens", "lm_eval", "zones", "difference"])
