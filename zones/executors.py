"""Running independent jobs (one per checkpoint, one per model) in-process or on Ray.

    results = run_jobs([Job("ckpt-1", fn, (checkpoint,)), ...], executor="local")

* ``local`` (the default): the jobs run one after the other in this process. No dependency.
* ``ray``: each job is a Ray task with its resource request (``cpus``; one GPU per job when
  the cluster has GPUs, unless ``gpus`` says otherwise). ``ray.init(address=...)`` takes
  ``ray_address`` or ``$RAY_ADDRESS``; with neither, Ray starts a local instance. An already
  initialised Ray (``ray.init(num_cpus=2)`` in a script or a test) is used as it is.
  Install it with ``pip install "zones[ray]"``.

A failed job is tried again up to ``retries`` times, unless its error is permanent (bad
input, an unsupported model, an unreachable hub: ``is_permanent``); on Ray a job whose worker
died (killed, out of memory) is rerun too, through Ray's own ``max_retries``. Jobs that still
fail are reported together, each with its name, its error and its attempts, in one
``JobFailed`` error raised after every other job has finished: results are returned for all
jobs or for none, so a table is never silently short of rows.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import pandas as pd

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
    if executor not in EXECUTORS:
        raise ValueError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if executor == "ray":
        _import_ray()
    return executor


def run_jobs(jobs: Sequence[Job], executor: str = "local", *, ray_address: str | None = None,
             retries: int = 2, progress: bool = True, desc: str = "jobs") -> list[Any]:
    """Each job's result, in the order of ``jobs``; ``JobFailed`` naming every job that failed."""
    check_executor(executor)
    if not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, not {retries!r}")
    for job in jobs:
        if not job.cpus > 0 or (job.gpus is not None and job.gpus < 0):
            raise ValueError(f"job {job.name}: need cpus > 0 and gpus >= 0, not {job.cpus}, {job.gpus}")
    if not jobs:
        return []
    run = _run_local if executor == "local" else _run_ray
    return run(list(jobs), retries=retries, progress=progress, desc=desc, ray_address=ray_address)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__


def is_permanent(err: BaseException) -> bool:
    """Errors that another attempt cannot fix (bad input, an unsupported model, no network)."""
    from .hub import HubUnreachableError

    return isinstance(err, (ValueError, TypeError, LookupError, ImportError, HubUnreachableError))


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
    from tqdm.auto import tqdm

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
    try:
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


def _run_ray(jobs, *, retries, progress, desc, ray_address=None):
    from tqdm.auto import tqdm

    ray = ray_connect(ray_address)
    has_gpus = ray.cluster_resources().get("GPU", 0) >= 1
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



# --- a sweep over models ------------------------------------------------------------------------

def model_alpha(name: str, *, device: str | None = None, trust_remote_code: bool = False) -> pd.DataFrame:
    """One model's α table (``zones.spectra.alpha_table``, cached as ``zones alpha`` caches it)
    with a ``model`` column first: the job of ``alpha_sweep``."""
    from .models import load_model
    from .spectra import alpha_table

    loaded = load_model(name, device=device, trust_remote_code=trust_remote_code, load_tokenizer=False)
    table = alpha_table(loaded.model)
    table.insert(0, "model", name)
    return table


def alpha_sweep(models: Sequence[str], executor: str = "local", *, ray_address: str | None = None,
                retries: int = 2, cpus_per_job: float = 1, device: str | None = None,
                trust_remote_code: bool = False, progress: bool = True) -> pd.DataFrame:
    """The α tables of several models stacked: ``model`` then ``zones.spectra.COLUMNS``; one
    job per model through ``run_jobs``."""
    import pandas as pd

    models = [m.strip() for m in models if m and m.strip()]
    if not models:
        raise ValueError("no models given; pass e.g. --models smollm2-135m,EleutherAI/pythia-160m")
    if len(set(models)) < len(models):
        raise ValueError(f"a model is listed twice in {models}")
    options = dict(device=device, trust_remote_code=trust_remote_code)
    jobs = [Job(name, model_alpha, (name,), options, cpus=cpus_per_job) for name in models]
    tables = run_jobs(jobs, executor, ray_address=ray_address, retries=retries, progress=progress,
                      desc="alpha tables")
    return pd.concat(tables, ignore_index=True)
