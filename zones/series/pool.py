"""Training several runs at once: on a CPU, each run in a process of its own, on its config's
``threads``, as many at a time as the cores allow; elsewhere (a GPU), one after the other.

A run's bits depend on its config alone (its ``threads`` included), never on how many runs
trained beside it, so ``train_runs(configs)`` gives the runs ``train_model`` gives one by one.
Why processes: a tiny model's step is many small operations, so two threads speed one step up
by only 1.4–1.7× (depth 8–16 of the cpu profile) while two runs side by side, one thread each,
train at almost twice the rate of one. Each worker is a fresh Python process running
:func:`_worker` (``WORKER_CODE``: no ``fork`` of a process holding OpenMP threads, no re-import
of the caller's script, and not ``-m zones.series.pool``, whose module the package has already
imported, which Python warns of); it stops when this process dies (:func:`watch_parent`), given
its runs up front, the longest first to the least loaded worker (:func:`assign`); it trains
them through ``train_model``, so the cache, checkpoints and resumption are the same, and
reports the work each counted (``zones.core.progress``), which this process adds to its own.

    runs = train_runs(series_configs("cpu"))   # D16 on one core, D8, D8, D12 on the other
"""
from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

from zones.core.checks import check_int
from zones.core.data import load_corpus
from zones.core.hardware import usable_cores
from zones.core.progress import PROGRESS_ENV, REFERENCE_FLOPS, add_flops, bars_shown, restart, work_done
from zones.series.config import TrainConfig, flops_per_token
from zones.series.io import TrainedRun, is_finished, run_path
from zones.series.loop import discard_run, train_model
from zones.series.tokenizer import tokenizer_and_tokens

POLL_SECONDS = 0.2  # how often the workers are looked at
WORK_LINE = "zones.series.pool counted "  # a worker's line after each run: the work it counted
WORKER_CODE = "import sys; from zones.series.pool import _worker; _worker(sys.argv[1:])"  # python -c WORKER_CODE
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent dies (Linux)
PARENT_GONE = 3  # a worker's exit status when it stopped because its parent died


def expected_flops(config: TrainConfig) -> float:
    """A run's training FLOPs (``flops_per_token`` × its tokens): the longest are started first."""
    return flops_per_token(config) * config.steps * config.tokens_per_step


def default_workers(configs: Sequence[TrainConfig]) -> int:
    """Runs trained at once on a CPU: the cores this process may use over the threads a run takes."""
    threads = max((c.threads for c in configs), default=1)
    return max(1, usable_cores() // threads)


def _pending(configs: Sequence[TrainConfig], keep_checkpoints: bool) -> list[TrainConfig]:
    """The configs ``train_model`` would train (not finished, or finished without the checkpoints
    asked for), each once."""
    out = []
    for config in dict.fromkeys(configs):
        path = run_path(config)
        if not is_finished(path) or (keep_checkpoints and not (path / "checkpoints").is_dir()):
            out.append(config)
    return out


def train_runs(configs: Sequence[TrainConfig], *, device: str | None = None, refresh: bool = False,
               progress: bool | None = None, keep_checkpoints: bool = False,
               workers: int | None = None) -> list[TrainedRun]:
    """Train (or load) the run of every config, in order; on a CPU the runs not yet trained train
    side by side in ``workers`` processes (None: :func:`default_workers`; :func:`assign`).
    ``refresh`` and ``keep_checkpoints`` are ``train_model``'s."""
    configs, progress = list(configs), bars_shown(progress)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    workers = default_workers(configs) if workers is None else check_int(workers, "workers", min=1)
    if refresh:  # here, once, not in each worker: the tokenizer is shared by the runs
        for config in dict.fromkeys(configs):
            discard_run(run_path(config))
        for corpus, vocab in dict.fromkeys((c.corpus, c.vocab_size) for c in configs):
            tokenizer_and_tokens(load_corpus(corpus), vocab, refresh=True)
    pending = _pending(configs, keep_checkpoints)
    if torch.device(device).type == "cpu" and len(pending) > 1 and workers > 1:
        for corpus, vocab in dict.fromkeys((c.corpus, c.vocab_size) for c in pending):
            tokenizer_and_tokens(load_corpus(corpus), vocab)  # built once, before the workers read it
        _train_side_by_side(pending, device, keep_checkpoints, workers, progress)
    return [train_model(c, device=device, progress=progress, keep_checkpoints=keep_checkpoints) for c in configs]


def _label(config: TrainConfig) -> str:
    return f"depth {config.depth}, seed {config.seed}"


def assign(configs: Sequence[TrainConfig], workers: int) -> list[list[TrainConfig]]:
    """The runs of each worker: the longest first, each to the worker with the least work so far
    (a worker process pays its start, ~3 s of imports, once for all its runs)."""
    queues: list[list[TrainConfig]] = [[] for _ in range(min(workers, len(configs)))]
    loads = [0.0] * len(queues)
    for config in sorted(configs, key=expected_flops, reverse=True):
        k = loads.index(min(loads))
        queues[k].append(config)
        loads[k] += expected_flops(config)
    return queues


def _train_side_by_side(configs: list[TrainConfig], device: str, keep_checkpoints: bool, workers: int,
                        progress: bool) -> None:
    """Train ``configs`` in ``workers`` worker processes (:func:`assign`); add the work each run
    counted. A failed run stops its worker; the others finish theirs, then it is raised, named."""
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV}  # a worker's count comes back here
    root = str(Path(__file__).resolve().parents[2])  # the folder holding zones/
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    queues = assign(configs, workers)
    bar = tqdm(total=len(configs), unit="run", disable=not progress,
               desc=f"training {len(configs)} runs, {len(queues)} at a time")
    failures, done = [], {}
    with tempfile.TemporaryDirectory(prefix="zones-train-") as folder:
        running = []
        try:
            for k, queue in enumerate(queues):
                log = Path(folder) / f"worker-{k}.log"
                command = [sys.executable, "-c", WORKER_CODE, str(os.getpid()), device,
                           "keep" if keep_checkpoints else "-", *(json.dumps(c.as_dict()) for c in queue)]
                with open(log, "wb") as out:
                    running.append((queue, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env),
                                    log))
            while running:
                time.sleep(POLL_SECONDS)
                for item in list(running):
                    queue, process, log = item
                    finished = process.poll() is not None
                    text = log.read_text(errors="replace")
                    lines = text[:text.rfind("\n") + 1].splitlines()  # whole lines only: it may be writing
                    counted = [float(line[len(WORK_LINE):]) for line in lines if line.startswith(WORK_LINE)]
                    for work in counted[done.get(id(process), 0):]:  # runs finished since the last look
                        add_flops(work * REFERENCE_FLOPS)
                        bar.update(1)
                    done[id(process)] = len(counted)
                    if not finished:
                        continue
                    running.remove(item)
                    if process.returncode != 0 or len(counted) < len(queue):
                        which = _label(queue[len(counted)]) if len(counted) < len(queue) else _label(queue[-1])
                        failures.append(f"training {which} failed in its worker process "
                                        f"(exit {process.returncode}): {worker_cause(text, process.returncode)}")
        finally:
            for _, process, _ in running:  # interrupted: the checkpoints they wrote resume them
                process.terminate()
                process.wait()
            bar.close()
    if failures:
        raise RuntimeError("; ".join(failures))


def worker_cause(text: str, returncode: int | None) -> str:
    """Why a worker failed, from its output and exit status: the last line of its last traceback
    (the exception), else the signal that killed it, else its last line; never a warning it
    printed on the way."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if starts:
        tail = [line for line in lines[starts[-1]:] if line.strip() and not line.startswith((" ", "\t"))]
        if len(tail) > 1:
            return tail[-1].strip()
    if returncode is not None and returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    if returncode == PARENT_GONE:
        return "its parent process died"
    shown = [line.strip() for line in lines if line.strip() and not line.startswith(WORK_LINE)]
    return shown[-1] if shown else "no output"


def watch_parent(parent: int) -> None:
    """Stop this process when process ``parent`` (the one that started it) dies, even by
    ``kill -9``: on Linux the kernel sends it SIGTERM (``prctl(PR_SET_PDEATHSIG)``); everywhere,
    a daemon thread sees its parent's id change (it is adopted) and exits with ``PARENT_GONE``."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        except (OSError, AttributeError):  # no libc to call: the thread below suffices
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(POLL_SECONDS)
        os._exit(PARENT_GONE)

    if os.getppid() != parent:  # it died before we could watch it
        os._exit(PARENT_GONE)
    threading.Thread(target=watch, name="zones-watch-parent", daemon=True).start()


def _worker(argv: list[str]) -> None:
    """Runs in this process, one after the other (``python -c WORKER_CODE PARENT_PID DEVICE
    keep|- CONFIG...``, each config as JSON), while its parent lives (:func:`watch_parent`);
    after each it prints the work it counted, in reference forwards (``WORK_LINE`` and the
    number)."""
    watch_parent(int(argv[0]))
    device, keep = argv[1], argv[2] == "keep"
    for fields in argv[3:]:
        restart()
        train_model(TrainConfig(**json.loads(fields)), device=device, progress=False, keep_checkpoints=keep)
        print(f"{WORK_LINE}{work_done()!r}", flush=True)


if __name__ == "__main__":  # python -m zones.series.pool DEVICE keep|- CONFIG...: started by hand
    _worker([str(os.getppid()), *sys.argv[1:]])
