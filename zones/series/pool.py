"""Training several runs at once: on a CPU, each run in a process of its own, on its config's
``threads``, as many at a time as the cores allow; elsewhere (a GPU), one after the other.

A run's bits depend on its config alone (its ``threads`` included), never on how many runs
trained beside it, so ``train_runs(configs)`` gives the runs ``train_model`` gives one by one.
Why processes: a tiny model's step is many small operations, so two threads speed one step up
by only 1.4–1.7× (depth 8–16 of the cpu profile) while two runs side by side, one thread each,
train at almost twice the rate of one. Each worker is a fresh ``python -m zones.series.pool``
(no ``fork`` of a process holding OpenMP threads, no re-import of the caller's script); it
trains through ``train_model``, so the cache, checkpoints and resumption are the same, and
reports the work it counted (``zones.core.progress``), which this process adds to its own.

    runs = train_runs(series_configs("cpu"))   # D16 on one core, D8, D8, D12 on the other
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch
from tqdm.auto import tqdm

import zones
from zones.core.checks import check_int
from zones.core.data import load_corpus
from zones.core.hardware import usable_cores
from zones.core.progress import PROGRESS_ENV, REFERENCE_FLOPS, add_flops, bars_shown, restart, work_done
from zones.series.config import TrainConfig, flops_per_token
from zones.series.io import TrainedRun, is_finished, run_path
from zones.series.loop import discard_run, train_model
from zones.series.tokenizer import tokenizer_and_tokens

POLL_SECONDS = 0.2  # how often the workers are looked at


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
    side by side, ``workers`` at a time (None: :func:`default_workers`), longest first.
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


def _train_side_by_side(configs: list[TrainConfig], device: str, keep_checkpoints: bool, workers: int,
                        progress: bool) -> None:
    """Train ``configs`` in worker processes, ``workers`` at a time, the longest first; add the
    work each counted. A failed run stops the others from starting and raises, naming it."""
    queue = sorted(configs, key=expected_flops, reverse=True)
    env = {k: v for k, v in os.environ.items() if k != PROGRESS_ENV}  # a worker's count comes back here
    root = str(Path(zones.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    bar = tqdm(total=len(queue), unit="run", disable=not progress,
               desc=f"training {len(queue)} runs, {min(workers, len(queue))} at a time")
    running: list[tuple[TrainConfig, subprocess.Popen, Path]] = []
    failure = None
    with tempfile.TemporaryDirectory(prefix="zones-train-") as folder:
        try:
            while queue or running:
                while queue and len(running) < workers and failure is None:
                    config = queue.pop(0)
                    log = Path(folder) / f"run-{len(queue)}.log"
                    with open(log, "wb") as out:
                        command = [sys.executable, "-m", "zones.series.pool", json.dumps(config.as_dict()), device,
                                   "keep" if keep_checkpoints else "-"]
                        running.append((config, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                                                 env=env), log))
                if failure is not None:
                    queue.clear()
                time.sleep(POLL_SECONDS)
                for item in [r for r in running if r[1].poll() is not None]:
                    running.remove(item)
                    config, process, log = item
                    lines = log.read_text(errors="replace").strip().splitlines()
                    counted = [line for line in lines if line.startswith("work ")]
                    if process.returncode == 0 and counted:
                        add_flops(float(counted[-1].split()[1]) * REFERENCE_FLOPS)
                        bar.update(1)
                    elif failure is None:
                        failure = (f"training {_label(config)} failed in its worker process "
                                   f"(exit {process.returncode}): {lines[-1] if lines else 'no output'}")
        finally:
            for _, process, _ in running:  # interrupted: the checkpoints they wrote resume them
                process.terminate()
                process.wait()
            bar.close()
    if failure is not None:
        raise RuntimeError(failure)


def _worker(argv: list[str]) -> None:
    """One run in this process (``python -m zones.series.pool CONFIG DEVICE keep|-``); it ends by
    printing the work it counted, in reference forwards (``work N``)."""
    fields = json.loads(argv[0])
    config = TrainConfig(**fields)
    restart()
    train_model(config, device=argv[1], progress=False, keep_checkpoints=argv[2] == "keep")
    print(f"work {work_done()!r}", flush=True)


if __name__ == "__main__":
    _worker(sys.argv[1:])
