"""Running independent jobs (one per checkpoint, one per model) in-process or on Ray.

    results = run_jobs([Job("ckpt-1", fn, (checkpoint,)), ...], executor="local")

* ``local`` (the default): the jobs run one after the other in this process. No dependency.
* ``ray``: each job is a Ray task with its resource request (``cpus``; one GPU per job when
  the cluster has GPUs, unless ``gpus`` says otherwise: ``task_resources``). ``ray.init(address=...)``
  takes ``ray_address`` or ``$RAY_ADDRESS``; with neither, Ray starts a local instance. An already
  initialised Ray (``ray.init(num_cpus=2)`` in a script or a test) is used as it is.
  Install it with ``pip install "zones[ray]"``. An address is checked before Ray is asked to
  join it (``check_ray_address``): one that nothing answers on fails within
  ``PROBE_SECONDS``, one that answers but not as a Ray cluster this process may join (another
  service, a cluster whose authentication token this process lacks) within
  ``CONNECT_SECONDS``, each with one line naming the address and the remedy; Ray itself would
  retry for ever.

A failed job is tried again up to ``retries`` times only when its error is transient (a
dropped connection, a timeout, an I/O error other than a missing or forbidden file, memory
exhausted: ``is_transient``); a deterministic error (bad input, a damaged cache entry, an
unsupported model, an unreachable hub) would only fail again, and is reported at once. On
Ray a job whose worker or node died (killed, out of memory, its machine gone) is submitted
again, up to ``retries`` times, and each such retry is said on stderr and recorded in
``events``; a job asking for more CPUs or GPUs than the cluster has fails before anything
runs. The driver places each job on a node with room for it (so no job waits in a queue on a
node that may die, and it knows where each runs), and a job whose node is lost is resubmitted
to a live node, ahead of the jobs not started, within ``LOST_NODE_SECONDS`` (12 s): at once when
Ray reports the worker or node dead, else when ``LOST_AFTER`` looks ``POLL_SECONDS`` apart find
its node gone from ``ray.nodes()`` or its raylet not answering. The progress bar
(``zones.core.progress.WorkBar``) weighs each job by the work it is expected to count and names
the jobs running. Jobs that still
fail are reported together, each with its name, its error and its attempts, in one
``JobFailed`` error raised after every other job has finished: results are returned for all
jobs or for none, so a table is never silently short of rows.
"""
from __future__ import annotations

import contextlib
import logging
import os
import selectors
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from zones.core.checks import check_choice, check_float, check_int
from zones.core.progress import WorkBar, quiet_nested_bars

EXECUTORS = ("local", "ray")


class JobFailed(RuntimeError):
    """One or more jobs failed after their retries; the message names each one and why."""


@dataclass(frozen=True)
class Job:
    """``fn(*args, **kwargs)``, named ``name`` in every report, asking for ``cpus`` CPUs and
    ``gpus`` GPUs (None: one GPU where the cluster has any, else none), started only once the
    jobs named in ``after`` (of the same ``run_jobs`` call) have finished."""

    name: str
    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    cpus: float = 1
    gpus: float | None = None
    after: tuple[str, ...] = ()
    work: float = 1.0  # what it is expected to count, in run_jobs' unit (the progress bar's weight)


def check_executor(executor: str) -> str:
    check_choice(executor, "executor", EXECUTORS)
    if executor == "ray":
        _import_ray()
    return executor


def run_jobs(jobs: Sequence[Job], executor: str = "local", *, ray_address: str | None = None,
             retries: int = 2, progress: bool = True, desc: str = "jobs", unit: str = "job",
             events: list[tuple[str, str, str]] | None = None,
             prepare: Callable[[Job, dict[str, Any]], Job] | None = None,
             on_result: Callable[[Job, Any], None] | None = None,
             on_failure: Callable[[Job, str, int], None] | None = None,
             stopping: Callable[[], BaseException | None] | None = None) -> list[Any]:
    """Each job's result, in the order of ``jobs``; ``JobFailed`` naming every job that failed.

    A job with ``after`` starts once those jobs have finished (each job is started as soon as it
    may: a cluster's workers stay busy); ``prepare(job, results)``, when given, is called here
    just before each job starts, with the results of the jobs it comes after that succeeded,
    and returns the job to run (its arguments completed from theirs). A job runs even when one it comes after
    failed (that one is reported). ``on_result(job, result)`` is called here as each job
    succeeds, ``on_failure(job, why, attempts)`` as each job fails for good (both as they happen,
    so a caller can record every outcome before the last job ends). ``events``, when given,
    receives ``(job name, "retry", why)`` for every attempt that failed and was tried again (a
    transient error, or on Ray a worker or node that died). The progress bar (``WorkBar``) weighs
    each job by its ``work``, in ``unit``s (1 each: jobs); other tools' bars stay out of its line.
    ``stopping()``, when given, is asked before each job starts: once it returns an exception (a
    signal asked the caller to stop), no other job starts, and it is raised when no job runs."""
    check_executor(executor)
    retries = check_int(retries, "retries", min=0)
    for job in jobs:
        check_float(job.cpus, f"job {job.name}: cpus", min=0, min_inclusive=False)
        check_float(job.work, f"job {job.name}: work", min=0)
        if job.gpus is not None:
            check_float(job.gpus, f"job {job.name}: gpus", min=0)
    if not jobs:
        return []
    _check_order(jobs)
    run = _run_local if executor == "local" else _run_ray
    with quiet_nested_bars(progress) as terminal, \
            WorkBar({job.name: job.work for job in jobs}, desc, unit, enabled=progress, live=executor == "local",
                    file=terminal) as bar:
        return run(list(jobs), retries=retries, bar=bar, ray_address=ray_address,
                   events=events if events is not None else [], prepare=prepare, on_result=on_result,
                   on_failure=on_failure, stopping=stopping or (lambda: None))


def _check_order(jobs: Sequence[Job]) -> None:
    """Unique names; every ``after`` names another job of the list; no cycle."""
    names = [job.name for job in jobs]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"job names must be unique; {', '.join(twice)} appear more than once")
    for job in jobs:
        unknown = [n for n in job.after if n not in names or n == job.name]
        if unknown:
            raise ValueError(f"job {job.name} comes after {', '.join(unknown)}, which is not another job of this run")
    done: set[str] = set()
    left = list(jobs)
    while left:
        ready = [job for job in left if set(job.after) <= done]
        if not ready:
            raise ValueError(f"jobs {', '.join(job.name for job in left)} wait for each other in a cycle")
        done |= {job.name for job in ready}
        left = [job for job in left if job.name not in done]


def _ready(jobs: Sequence[Job], finished: set[int], started: set[int]) -> list[int]:
    """Indices of the jobs not started yet whose ``after`` jobs have all finished."""
    names = {jobs[k].name for k in finished}
    return [k for k, job in enumerate(jobs) if k not in started and set(job.after) <= names]


def _prepared(job: Job, prepare, jobs: Sequence[Job], results: list, succeeded: set[int]) -> Job:
    if prepare is None:
        return job
    index = {j.name: k for k, j in enumerate(jobs)}
    return prepare(job, {name: results[index[name]] for name in job.after if index[name] in succeeded})


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


def attempt(name: str, fn: Callable[..., Any], args: tuple, kwargs: dict, retries: int,
            events: list | None = None) -> tuple[bool, Any]:
    """``(True, fn(*args, **kwargs))``, trying again up to ``retries`` times after an error that is
    not permanent; ``(False, (why, attempts))`` when it still fails. Runs where the job runs;
    each retry is appended to ``events``."""
    for k in range(retries + 1):
        try:
            return True, fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - returned with the job's name, reported by the driver
            why = _first_line(err)
            if is_permanent(err) or k == retries:
                return False, (why, k + 1)
            print(f"zones: job {name} failed ({why}); retry {k + 1} of {retries}", file=sys.stderr)
            if events is not None:
                events.append((name, "retry", why))
    raise AssertionError("unreachable")


def _report(failures: list[tuple[str, str, int]], total: int) -> JobFailed:
    listed = "; ".join(f"{name} ({why}; {n} attempt{'s' if n > 1 else ''})" for name, why, n in failures)
    return JobFailed(f"{len(failures)} of {total} jobs failed: {listed}. Finished jobs are cached; fix the cause "
                     f"and rerun to compute only the rest")


def _run_local(jobs, *, retries, bar, events, prepare=None, on_result=None, on_failure=None, ray_address=None,
               stopping=lambda: None):
    results: list[Any] = [None] * len(jobs)
    failures = []
    finished: set[int] = set()
    succeeded: set[int] = set()
    while len(finished) < len(jobs):
        stop = stopping()
        if stop is not None:  # asked to stop: the job before has ended, no other starts
            raise stop
        k = _ready(jobs, finished, finished)[0]  # in list order, once its `after` jobs are done
        job = _prepared(jobs[k], prepare, jobs, results, succeeded)
        bar.start(job.name)
        bar.redraw(f"running {job.name}")
        ok, value = attempt(job.name, job.fn, job.args, job.kwargs, retries, events)
        finished.add(k)
        if ok:
            results[k] = value
            succeeded.add(k)
            if on_result is not None:
                on_result(job, value)
        else:
            failures.append((job.name, *value))
            if on_failure is not None:
                on_failure(job, *value)
        bar.finish(job.name)
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
    """The body of every Ray task (module level, so workers import it instead of unpickling code):
    ``(ok, value, retries made)``."""
    events: list = []
    ok, value = attempt(name, fn, args, kwargs, retries, events)
    return ok, value, events


# --- joining a Ray cluster ---------------------------------------------------------------------------

PROBE_SECONDS = 5  # for something to accept a connection at the address
CONNECT_SECONDS = 120  # for Ray to join the cluster there (a process start, an import of Ray, a handshake)
# the probe: a driver that joins the cluster and leaves (Ray's own handshake, authentication included)
_JOIN = ("import sys, ray\n"
         "ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, logging_level='ERROR')\n"
         "ray.shutdown()\n")
_AUTH_FAILED = (b"InvalidAuthToken", b"Unauthenticated", b"authentication token")


def parse_ray_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address ``HOST:PORT`` (or ``ray://HOST:PORT``); None for
    ``auto`` and ``local``, which name no machine. A malformed address is a ``ValueError``."""
    text = str(address).strip()
    if text in ("auto", "local"):
        return None
    bare = text.removeprefix("ray://")
    host, sep, port = bare.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"Ray address {address!r} is not HOST:PORT (e.g. 10.0.0.5:6379, the address "
                         f"`ray start --head` prints); fix --ray-address or $RAY_ADDRESS")
    return host.strip("[]"), int(port)


def check_ray_address(address: str, probe_seconds: float = PROBE_SECONDS,
                      connect_seconds: float = CONNECT_SECONDS) -> None:
    """Fail within a stated time, with one line, when the Ray cluster at ``address`` cannot be
    joined (``ray.init`` would retry for ever, printing Ray's warnings):

    * nothing accepts a connection at HOST:PORT within ``probe_seconds`` (no head there);
    * something does, but a driver that joins there (a separate process) does not succeed
      within ``connect_seconds``: the cluster refused this process's authentication token, or
      the port is another service's.

    ``auto``/``local`` are not checked; a Ray Client address (``ray://``) gets the first check.
    """
    where = parse_ray_address(address)
    if where is None:
        return
    host, port = where
    try:
        socket.create_connection((host, port), timeout=probe_seconds).close()
    except OSError as err:
        why = "no answer" if isinstance(err, socket.timeout) else (err.strerror or type(err).__name__).lower()
        raise ConnectionError(f"no Ray cluster answers at {address} ({why} within {probe_seconds:g} s); start "
                              f"its head there with `ray start --head --port {port}`, or pass a running head's "
                              f"address with --ray-address or $RAY_ADDRESS") from None
    if str(address).strip().startswith("ray://"):
        return
    _join_once(str(address).strip(), connect_seconds)


def _join_once(address: str, seconds: float) -> None:
    """Join the cluster at ``address`` from a child process and leave; stop it early on an
    authentication failure, kill it after ``seconds``."""
    process = subprocess.Popen([sys.executable, "-c", _JOIN, address], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + seconds
    output = b""
    watch = selectors.DefaultSelector()  # epoll/poll: select() refuses descriptors past 1023
    watch.register(process.stderr, selectors.EVENT_READ)
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConnectionError(f"{address} accepts connections but did not let this process join it as a "
                                      f"Ray cluster within {seconds:g} s; pass the head's address (`ray start "
                                      f"--head` prints it; port 6379 by default) with --ray-address or $RAY_ADDRESS")
            ready = watch.select(min(left, 1.0))
            chunk = os.read(process.stderr.fileno(), 65536) if ready else b""
            output += chunk
            if any(marker in output for marker in _AUTH_FAILED):
                raise ConnectionError(f"the Ray cluster at {address} refused this process's authentication token; "
                                      f"run with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the head's token> (`ray "
                                      f"get-auth-token` on the head machine prints it)")
            if ready and not chunk:  # stderr closed: the child is done
                break
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
        if code != 0:
            last = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
            raise ConnectionError(f"joining the Ray cluster at {address} failed: "
                                  f"{last[-1].strip() if last else f'exit status {code}'}")
    except subprocess.TimeoutExpired:
        raise ConnectionError(f"joining the Ray cluster at {address} did not finish within {seconds:g} s") from None
    finally:
        watch.close()
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


class RaylogFilter(logging.Filter):
    """Ray's driver warns when a node's raylet dies and appends the last 20 lines of that raylet's
    log (dozens of ``[state-dump]`` lines), which landed among the study's own lines. Kept: the
    warning's first sentences (which node, why); dropped: the log tail, which ``ray logs
    raylet.out`` still shows."""

    TAIL = "Last 20 lines of the Raylet logs"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if self.TAIL in message or "[state-dump]" in message:
            head = message.split(self.TAIL)[0].strip()
            lines = [line for line in head.splitlines() if "[state-dump]" not in line]
            record.msg, record.args = " ".join(lines).strip() or "a Ray node's raylet stopped", ()
        return True


def quiet_ray_logs() -> None:
    """Put :class:`RaylogFilter` on the handlers of Ray's logger (its child loggers write through
    them), once."""
    for handler in logging.getLogger("ray").handlers:
        if not any(isinstance(f, RaylogFilter) for f in handler.filters):
            handler.addFilter(RaylogFilter())


def ray_connect(address: str | None = None):
    """Ray, initialised: the running instance, else ``ray.init(address=address or $RAY_ADDRESS)``
    (a local instance when neither is set) once ``check_ray_address`` has passed."""
    ray = _import_ray()
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or None
        if address:
            check_ray_address(address)
        else:  # a busy machine starts Ray's processes slowly; Ray's own wait for them is 10-15 s
            os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
        print(f"zones: connecting to Ray at {address}" if address else "zones: starting a local Ray instance",
              file=sys.stderr)
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    quiet_ray_logs()
    return ray


# --- resources, and the jobs as Ray tasks ----------------------------------------------------------------

def task_resources(job: Job, cluster: dict[str, float]) -> tuple[float, float]:
    """``(CPUs, GPUs)`` the Ray task of ``job`` asks for: its ``cpus``; its ``gpus``, or, when
    that is None, one GPU where ``cluster`` (``ray.cluster_resources()``) has a GPU, else none."""
    gpus = (1.0 if cluster.get("GPU", 0) >= 1 else 0.0) if job.gpus is None else float(job.gpus)
    return float(job.cpus), gpus


def check_resources(jobs: Sequence[Job], available: dict[str, float], where: str) -> None:
    """Refuse at once a job asking for more CPUs or GPUs than ``available`` holds in all (Ray
    would wait for them forever)."""
    for job in jobs:
        cpus, gpus = task_resources(job, available)
        for resource, asked, option in (("CPU", cpus, "--cpus-per-job"), ("GPU", gpus, "--gpus-per-job")):
            have = available.get(resource, 0)
            if asked > have:
                raise ValueError(f"job {job.name} asks for {asked:g} {resource}s but {where} has {have:g}; "
                                 f"lower {option} to at most {have:g}")


def _lost_worker(err: BaseException, ray) -> bool:
    """A task that died with its worker or node (killed, out of memory, the machine gone), not one
    whose code raised: worth another attempt elsewhere."""
    return isinstance(err, ray.exceptions.RayError) and not isinstance(err, ray.exceptions.RayTaskError)


def _left(jobs: Sequence[Job], pending) -> str:
    """The progress bar's note: the jobs running (on a node, or queued there for a free CPU)."""
    names = [jobs[k].name for k in sorted(pending)]
    more = f" +{len(names) - 2}" if len(names) > 2 else ""
    return f"running: {', '.join(names[:2])}{more}" if names else ""


# --- a lost node, in bounded time -------------------------------------------------------------------------

POLL_SECONDS = 2.0   # the driver looks at the nodes running its jobs this often
NODE_PROBE_SECONDS = 2.0  # for a node's raylet to accept a connection
LOST_AFTER = 3       # looks in a row at which a node is dead (Ray says so, or its raylet does not answer)
# A job whose node died is resubmitted to a live node within this many seconds: at once when Ray
# reports its worker lost; else after LOST_AFTER looks, POLL_SECONDS apart, each waiting at most
# NODE_PROBE_SECONDS for the node's raylet (Ray's own health check of a silent machine takes
# longer, and a task queued or running on it would wait for it).
LOST_NODE_SECONDS = LOST_AFTER * (POLL_SECONDS + NODE_PROBE_SECONDS)


def _live_nodes(ray, lost: set[str]) -> dict[str, dict]:
    """The cluster's nodes Ray lists as alive, less those found ``lost``: node id → its
    ``ray.nodes()`` record."""
    return {n["NodeID"]: n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in lost}


def raylet_answers(node: dict, seconds: float = NODE_PROBE_SECONDS) -> bool:
    """The node's raylet accepts a connection within ``seconds`` (a busy node does: the kernel
    accepts; a dead process or a machine gone does not)."""
    try:
        socket.create_connection((node["NodeManagerAddress"], int(node["NodeManagerPort"])), timeout=seconds).close()
        return True
    except (OSError, KeyError, ValueError):
        return False


def _room(node: dict, placed: list[tuple[float, float]], asked: tuple[float, float]) -> bool:
    """``asked`` (CPUs, GPUs) fits beside the jobs ``placed`` on ``node``."""
    have = node.get("Resources", {})
    return all(sum(p[i] for p in placed) + asked[i] <= have.get(r, 0) + 1e-9 for i, r in enumerate(("CPU", "GPU")))


def _run_ray(jobs, *, retries, bar, events, prepare=None, on_result=None, on_failure=None, ray_address=None,
             stopping=lambda: None):
    """Each job a Ray task placed by this driver on a node with room for it (``NodeAffinitySchedulingStrategy``):
    so it knows where each job runs, and a job whose node is lost (Ray reports its worker or node
    dead, or ``LOST_AFTER`` looks find the node dead) is resubmitted at once to a live node, ahead
    of the jobs not started, within ``LOST_NODE_SECONDS`` (:class:`_RayDriver`)."""
    ray = _import_ray()
    if not ray.is_initialized() and not (ray_address or os.environ.get("RAY_ADDRESS")):
        check_resources(jobs, {"CPU": os.cpu_count() or 1, "GPU": torch.cuda.device_count()},
                        "this machine (a local Ray instance)")  # before starting Ray at all
    ray = ray_connect(ray_address)
    resources = ray.cluster_resources()
    check_resources(jobs, resources, "the Ray cluster (ray.cluster_resources())")
    return _RayDriver(ray, jobs, resources, retries=retries, bar=bar, events=events, prepare=prepare,
                      on_result=on_result, on_failure=on_failure, stopping=stopping).run()


class _RayDriver:
    """One ``_run_ray``: the jobs placed on the cluster's nodes, waited for, and those of a lost node
    resubmitted. Ray retries nothing itself (``max_retries=0``): a lost job is resubmitted here,
    counted and said."""

    def __init__(self, ray, jobs: Sequence[Job], resources: dict[str, float], *, retries, bar, events, prepare,
                 on_result, on_failure, stopping=lambda: None):
        self.ray, self.jobs, self.resources = ray, jobs, resources
        self.stopping = stopping   # asked before each placement and each wait: a signal's exception, or None
        self.retries, self.bar, self.events = retries, bar, events
        self.prepare, self.on_result, self.on_failure = prepare, on_result, on_failure
        self.affinity = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy
        self.task = ray.remote(_call)
        self.results: list[Any] = [None] * len(jobs)
        self.prepared: dict[int, Job] = {}
        self.finished: set[int] = set()
        self.succeeded: set[int] = set()
        self.refs: dict[Any, int] = {}          # task → job
        self.where: dict[int, str] = {}         # job → the node it was placed on
        self.lost: set[str] = set()             # nodes found dead
        self.misses: dict[str, int] = {}        # node → looks in a row that found it dead
        self.first: list[int] = []              # jobs to place before any other (their node was lost)
        self.attempts = [1] * len(jobs)
        self.failures: list[tuple[str, str, int]] = []

    def run(self) -> list[Any]:
        """Every job's result, in order, once all have finished (``JobFailed`` when any failed)."""
        nodes = self.look()
        self.place(nodes)
        self.bar.redraw(_left(self.jobs, self.refs.values()))
        looked = time.monotonic()
        while len(self.finished) < len(self.jobs):
            stop = self.stopping()
            if stop is not None and not self.refs:  # asked to stop, and the running jobs have ended
                raise stop
            if not self.refs and not _live_nodes(self.ray, self.lost):
                raise RuntimeError("every node of the Ray cluster is lost; start its nodes again and rerun the same "
                                   "command: the finished jobs are cached")
            done = self.wait()
            for ref in done:
                self.collect(ref)
            if time.monotonic() - looked >= POLL_SECONDS or not done:
                nodes, looked = self.look(), time.monotonic()
            nodes = {n: record for n, record in nodes.items() if n not in self.lost and not self.misses.get(n)}
            if not nodes:
                continue
            self.place(nodes)
            if not self.refs:  # nothing could start: the jobs no live node can hold fail
                self.fail_unplaceable(nodes)
            self.bar.redraw(_left(self.jobs, self.refs.values()))
        if self.failures:
            raise _report(self.failures, len(self.jobs))
        return self.results

    def asked(self, k: int) -> tuple[float, float]:
        return task_resources(self.prepared.get(k, self.jobs[k]), self.resources)

    def waiting(self) -> list[int]:
        """The jobs that may start: those whose node was lost first, then the others ready."""
        return list(self.first) + [k for k in _ready(self.jobs, self.finished, set(self.prepared))
                                   if k not in self.first]

    def submit(self, k: int, node: str) -> None:
        job = self.prepared.setdefault(k, _prepared(self.jobs[k], self.prepare, self.jobs, self.results,
                                                    self.succeeded))
        cpus, gpus = task_resources(job, self.resources)
        self.where[k] = node
        options = dict(num_cpus=cpus, num_gpus=gpus, max_retries=0, retry_exceptions=False,
                       scheduling_strategy=self.affinity(node, soft=False), name=f"zones:{job.name}"[:200])
        self.refs[self.task.options(**options).remote(job.name, job.fn, job.args, job.kwargs, self.retries)] = k
        self.bar.start(job.name)

    def place(self, nodes: dict[str, dict]) -> None:
        """Start the jobs that may start, lost ones first, each on a node with room for it; a lost
        job goes to the least busy live node even when it has no room (it runs next there)."""
        if self.stopping() is not None:  # asked to stop: the running jobs end, no other starts
            return
        running = {n: [self.asked(k) for k in self.refs.values() if self.where[k] == n] for n in nodes}
        for k in self.waiting():
            node = next((n for n in nodes if _room(nodes[n], running[n], self.asked(k))), None)
            if node is None and k in self.first:
                fits = [n for n in nodes if _room(nodes[n], [], self.asked(k))]
                node = min(fits, key=lambda n: len(running[n]), default=None)
            if node is None:
                continue
            if k in self.first:
                self.first.remove(k)
            self.submit(k, node)
            running[node].append(self.asked(k))

    def wait(self) -> list:
        """The tasks finished within ``POLL_SECONDS`` (at most one); none when nothing runs (a node
        was just lost: the next look places the jobs)."""
        if self.refs:
            done, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=POLL_SECONDS)
            return done
        time.sleep(POLL_SECONDS)
        return []

    def collect(self, ref) -> None:
        """A finished task: its job's result or failure, or, where its worker or node died, the job again."""
        ray = self.ray
        k = self.refs.pop(ref)
        try:
            ok, value, job_events = ray.get(ref)
            self.events.extend(job_events)
        except ray.exceptions.RayError as err:
            if _lost_worker(err, ray):
                if isinstance(err, ray.exceptions.NodeDiedError):
                    self.lost.add(self.where[k])  # nothing more goes there
                self.again(k, f"{type(err).__name__}: the worker running it died",
                           f"lost its worker ({type(err).__name__})")
                return
            ok, value = False, (_first_line(err), self.attempts[k])
        self.end(k, ok, value)

    def end(self, k: int, ok: bool, value) -> None:
        self.finished.add(k)
        if ok:
            self.results[k] = value
            self.succeeded.add(k)
            if self.on_result is not None:
                self.on_result(self.prepared[k], value)
        else:
            self.failures.append((self.jobs[k].name, *value))
            if self.on_failure is not None:
                self.on_failure(self.prepared[k], *value)
        self.bar.finish(self.jobs[k].name)

    def again(self, k: int, why: str, line: str) -> None:
        """Job ``k`` lost its worker or node: resubmitted (first in line), or failed after its retries."""
        if self.attempts[k] > self.retries:
            self.end(k, False, (why, self.attempts[k]))
            return
        print(f"zones: job {self.jobs[k].name} {line}; resubmitted to a live node (within {LOST_NODE_SECONDS:g} s "
              f"of the loss); retry {self.attempts[k]} of {self.retries}", file=sys.stderr)
        self.events.append((self.jobs[k].name, "retry", why))
        self.attempts[k] += 1
        self.bar.requeue(self.jobs[k].name)
        self.first.append(k)

    def look(self) -> dict[str, dict]:
        """The live nodes; the jobs of a node found dead ``LOST_AFTER`` times in a row are lost."""
        nodes = _live_nodes(self.ray, self.lost)
        busy = {self.where[k] for k in self.refs.values()}
        for node in set(self.misses) - busy:  # a node without jobs is looked at again when it has one
            self.misses.pop(node)
        for node in busy:
            dead = node not in nodes or not raylet_answers(nodes[node])
            self.misses[node] = self.misses.get(node, 0) + 1 if dead else 0
            if self.misses[node] >= LOST_AFTER:
                self.lost.add(node)
                nodes.pop(node, None)
                for ref, k in list(self.refs.items()):
                    if self.where[k] == node:
                        self.refs.pop(ref)
                        with contextlib.suppress(Exception):  # a dead node's task: nothing to stop there
                            self.ray.cancel(ref, force=True)
                        self.again(k, "NodeLost: its node stopped answering",
                                   f"lost its node ({node[:12]} did not answer for {LOST_AFTER} looks)")
        return nodes

    def fail_unplaceable(self, nodes: dict[str, dict]) -> None:
        """Fail the jobs that may start but that no live node has the CPUs or GPUs for."""
        for k in self.waiting():
            if not any(_room(n, [], self.asked(k)) for n in nodes.values()):
                if k in self.first:
                    self.first.remove(k)
                self.prepared.setdefault(k, self.jobs[k])
                self.end(k, False, ("no live node of the Ray cluster has the CPUs or GPUs it asks for",
                                    self.attempts[k]))
