"""Running independent jobs (one per checkpoint, one per model) in-process or on Ray.

    results = run_jobs([Job("ckpt-1", fn, (checkpoint,)), ...], executor="local")

* ``local`` (the default): the jobs run one after the other in this process. No dependency.
* ``ray``: each job is a Ray task with its resource request (``cpus``; one GPU per job when
  the cluster has GPUs, unless ``gpus`` says otherwise). ``ray.init(address=...)`` takes
  ``ray_address`` or ``$RAY_ADDRESS``; with neither, Ray starts a local instance. An already
  initialised Ray (``ray.init(num_cpus=2)`` in a script or a test) is used as it is.
  Install it with ``pip install "zones[ray]"``.

A failed job is tried again up to ``retries`` times only when its error is transient (a
dropped connection, a timeout, an I/O error other than a missing or forbidden file, memory
exhausted: ``is_transient``); a deterministic error (bad input, a damaged cache entry, an
unsupported model, an unreachable hub) would only fail again, and is reported at once. On
Ray a job whose worker died (killed, out of memory) is rerun too, through Ray's own
``max_retries``; a job asking for more CPUs or GPUs than the cluster has fails before
anything runs. Jobs that still
fail are reported together, each with its name, its error and its attempts, in one
``JobFailed`` error raised after every other job has finished: results are returned for all
jobs or for none, so a table is never silently short of rows.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from tqdm.auto import tqdm

from zones.core.checks import check_choice, check_float, check_int

EXECUTORS = ("local", "ray")


class JobFailed(RuntimeError):
    """One or more jobs failed after their retries; the message names each one and why."""


@dataclass(frozen=True)
class Job:
    """``fn(*args, **kwargs)``, named ``name`` in every report, asking for ``cpus`` CPUs and
    ``gpus`` GPUs (None: one GPU where the cluster has any, else none)."""

    name: str
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    cpus: float = 1
    gpus: float | None = None


def check_executor(executor: str) -> str:
    check_choice(executor, "executor", EXECUTORS)
    if executor == "ray":
        _import_ray()
    return executor


def run_jobs(jobs: Sequence[Job], executor: str = "local", *, ray_address: str | None = None,
             retries: int = 2, progress: bool = True, desc: str = "jobs") -> list[Any]:
    """Each job's result, in the order of ``jobs``; ``JobFailed`` naming every job that failed."""
    check_executor(executor)
    retries = check_int(retries, "retries", min=0)
    for job in jobs:
        check_float(job.cpus, f"job {job.name}: cpus", min=0, min_inclusive=False)
        if job.gpus is not None:
            check_float(job.gpus, f"job {job.name}: gpus", min=0)
    if not jobs:
        return []
    run = _run_local if executor == "local" else _run_ray
    return run(list(jobs), retries=retries, progress=progress, desc=desc, ray_address=ray_address)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


# I/O errors that another attempt meets again: the file is missing, forbidden or of the wrong kind
DETERMINISTIC_OS_ERRORS = (FileNotFoundError, FileExistsError, PermissionError, IsADirectoryError,
                           NotADirectoryError)


def is_transient(err: BaseException) -> bool:
    """Errors another attempt may not meet: a dropped connection or a timeout, an I/O error other
    than a missing or forbidden file, memory exhausted (also a GPU's). Everything else (bad
    input, a damaged cache entry, an unsupported model, an unreachable hub, a bug) is
    deterministic and reported at once."""
    if isinstance(err, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(err, OSError) and not isinstance(err, DETERMINISTIC_OS_ERRORS)


def is_permanent(err: BaseException) -> bool:
    """Errors that another attempt cannot fix: those that are not ``is_transient``."""
    return not is_transient(err)


def attempt(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict, retries: int) -> tuple[bool, Any]:
    """``(True, fn(*args, **kwargs))``, trying again up to ``retries`` times after an error that is
    not permanent; ``(False, (why, attempts))`` when it still fails. Runs where the job runs."""
    for k in range(retries + 1):
        try:
            return True, fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - returned with the job's name, reported by the driver
            why = _first_line(err)
            if is_permanent(err) or k == retries:
                return False, (why, k + 1)
            print(f"zones: job {name} failed ({why}); retry {k + 1} of {retries}", file=sys.stderr)
    raise AssertionError("unreachable")


def _report(failures: list[tuple[str, str, int]], total: int) -> JobFailed:
    listed = "; ".join(f"{name} ({why}; {n} attempt{'s' if n > 1 else ''})" for name, why, n in failures)
    return JobFailed(f"{len(failures)} of {total} jobs failed: {listed}. Finished jobs are cached; fix the cause "
                     f"and rerun to compute only the rest")


def _run_local(jobs, *, retries, progress, desc, ray_address=None):
    results: list[Any] = [None] * len(jobs)
    failures = []
    for k, job in enumerate(tqdm(jobs, desc=desc, unit="job", disable=not progress)):
        ok, value = attempt(job.name, job.fn, job.args, job.kwargs, retries)
        if ok:
            results[k] = value
        else:
            failures.append((job.name, *value))
    if failures:
        raise _report(failures, len(jobs))
    return results


def _import_ray():
    try:  # an optional dependency: imported only for the ray executor
        import ray
    except ImportError:
        raise ImportError('the ray executor needs Ray: pip install "zones[ray]" (or "ray[default]>=2.9")') from None
    return ray


def _call(name, fn, args, kwargs, retries):
    """The body of every Ray task (module level, so workers import it instead of unpickling code)."""
    return attempt(name, fn, args, kwargs, retries)


def ray_connect(address: str | None = None):
    """Ray, initialised: the running instance, else ``ray.init(address=address or $RAY_ADDRESS)``
    (a local instance when neither is set)."""
    ray = _import_ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        print(f"zones: connecting to Ray at {address}" if address else "zones: starting a local Ray instance",
              file=sys.stderr)
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return ray


def check_resources(jobs: Sequence[Job], available: dict[str, float], where: str) -> None:
    """Refuse at once a job asking for more CPUs or GPUs than ``available`` holds in all (Ray
    would wait for them forever)."""
    for job in jobs:
        for resource, asked, option in (("CPU", job.cpus, "--cpus-per-job"), ("GPU", job.gpus or 0, "gpus")):
            have = available.get(resource, 0)
            if asked > have:
                raise ValueError(f"job {job.name} asks for {asked:g} {resource}s but {where} has {have:g}; "
                                 f"lower {option} to at most {have:g}")


def _run_ray(jobs, *, retries, progress, desc, ray_address=None):
    ray = _import_ray()
    if not ray.is_initialized() and not (ray_address or os.environ.get("RAY_ADDRESS")):
        check_resources(jobs, {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()},
                        "this machine (a local Ray instance)")  # before starting Ray at all
    ray = ray_connect(ray_address)
    resources = ray.cluster_resources()
    check_resources(jobs, resources, "the Ray cluster (ray.cluster_resources())")
    has_gpus = resources.get("GPU", 0) >= 1
    task = ray.remote(_call)
    refs = {}
    for k, job in enumerate(jobs):
        gpus = (1 if has_gpus else 0) if job.gpus is None else job.gpus
        # max_retries: Ray reruns a task whose worker died; errors raised by the job retry inside it
        ref = task.options(num_cpus=job.cpus, num_gpus=gpus, max_retries=retries, retry_exceptions=False,
                           name=f"zones:{job.name}"[:200]).remote(job.name, job.fn, job.args, job.kwargs, retries)
        refs[ref] = k
    results: list[Any] = [None] * len(jobs)
    failures = []
    pending = list(refs)
    with tqdm(total=len(jobs), desc=desc, unit="job", disable=not progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            for ref in done:
                k = refs[ref]
                try:
                    ok, value = ray.get(ref)
                except ray.exceptions.RayError as err:  # its worker died (killed, out of memory, ...)
                    ok, value = False, (f"{type(err).__name__}: the worker running it died", retries + 1)
                if ok:
                    results[k] = value
                else:
                    failures.append((jobs[k].name, *value))
                bar.update(1)
    if failures:
        raise _report(failures, len(jobs))
    return results
