"""``zones study`` on a real two-node Ray cluster on this machine, with one node killed mid-study.

The cluster is what a user starts by hand (README, "Study across models"): ``ray start --head``
and ``ray start --address`` processes on 127.0.0.1, each with its own CPUs, its own small object
store and its own ``ZONES_CACHE``, and token authentication on (the head's token handed to the
other node and to the driver, as on a real cluster). The driver is the ``zones study`` command.
The models are three tiny ones of three families (Llama, GPT-NeoX, GPT-2). While a job runs on
the worker node, that node's raylet is killed (SIGKILL: a machine lost). The study must write
each job's tables as it finishes, resubmit the lost job to the live node within
``LOST_NODE_SECONDS`` of the kill, finish anyway with every job once in ``jobs.csv``, give the
local executor's tables bit for bit (timings and places aside), hold every entry in the driver's
cache, and leave nothing for the book to compute. Its wall time against the local executor's is
``benchmarks/bench_study.py``'s to measure (a speed target, not a test).
Every process the test started is killed at the end, found by a marker in its environment.
"""
from __future__ import annotations

import importlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from conftest import autogroup_nice, tiny_model

ray = pytest.importorskip("ray", reason='the cluster test needs Ray: pip install "zones[ray]"')

from zones.core.executors import LOST_NODE_SECONDS  # noqa: E402
from zones.core.tally import counting  # noqa: E402
from zones.studies import STATE_FILE, book_calls, plan, stable_view, study, volatile  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"),
                                                   reason="finds the cluster's processes in /proc")]

ROOT = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
MARK = "ZONES_TEST_CLUSTER"  # in the environment of every process of the test's cluster
NODE = "ZONES_TEST_NODE"  # which node a process belongs to
FAMILIES = ("llama", "gpt_neox", "gpt2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


class LocalCluster:
    """Ray nodes as ``ray start`` processes on 127.0.0.1, each with its own ``ZONES_CACHE``.

    ``ray start`` leaves its processes running in the background; each of them (and every
    worker their raylet starts) inherits ``MARK=<this cluster's id>`` and ``NODE=<its node>``,
    which is how ``kill_node`` and ``shutdown`` find them (never by a program's name: other
    Ray instances on the machine are left alone)."""

    def __init__(self, root: Path):
        self.root = root
        self.id = secrets.token_hex(6)
        self.token = secrets.token_hex(32)  # token authentication, as a real head turns it on
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = Path(tempfile.mkdtemp(prefix="zr-", dir="/tmp"))  # short: Ray's socket paths must fit

    def env(self, node: str | None = None, cache: Path | None = None, token: bool = True) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_ADDRESS", "RAY_AUTH"))}
        env.update({MARK: self.id, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                    # a busy machine starts Ray's processes slowly; Ray's own wait is 10-15 s
                    "RAY_raylet_start_wait_time_s": "90"})
        if token:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=self.token)
        if node is not None:
            env[NODE] = node
        if cache is not None:
            env["ZONES_CACHE"] = str(cache)
        return env

    def start(self, node: str, cache: Path, cpus: int = 1, attempts: int = 3) -> None:
        """``ray start`` a node; tried again when it does not come up (on a busy machine a raylet may
        give up on its agents after Ray's fixed 15 s: "Timed out waiting for file ...port")."""
        head = node == "head"
        for attempt in range(attempts):
            if head:
                self.port = free_port()
                self.address = f"127.0.0.1:{self.port}"
            command = [RAY, "start", "--node-ip-address", "127.0.0.1", "--num-cpus", str(cpus), "--num-gpus", "0",
                       "--object-store-memory", str(100 * 2**20), "--disable-usage-stats"]
            command += (["--head", "--port", str(self.port), "--include-dashboard", "false",
                         "--temp-dir", str(self.temp)] if head else ["--address", self.address])
            starting = subprocess.Popen(command, env=self.env(node, cache), stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, start_new_session=True)
            autogroup_nice(starting.pid, -10)  # the node's own session: see autogroup_nice
            _, stderr = starting.communicate(timeout=600)
            for pid in self.pids(node)[:1]:  # the node's processes share one group: back to a fair share
                autogroup_nice(pid, 0)
            if starting.returncode == 0:
                return
            self.kill_node(node)  # what the failed attempt left running
            time.sleep(1)
        raise AssertionError(f"ray start ({node}) failed {attempts} times:\n{stderr[-3000:]}")

    def pids(self, node: str | None = None) -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid():
                env = environ_of(int(entry))
                if env.get(MARK) == self.id and (node is None or env.get(NODE) == node):
                    found.append(int(entry))
        return found

    def running_job(self, node: str) -> bool:
        """A zones job is running on ``node`` (Ray names a busy worker after its task)."""
        return any(cmdline_of(pid).startswith("ray::zones:") for pid in self.pids(node))

    def kill_node(self, node: str) -> None:
        for pid in self.pids(node):
            os.kill(pid, signal.SIGKILL)

    def kill_raylet(self, node: str) -> None:
        """SIGKILL the node's raylet only (its workers and agents are left to notice)."""
        for pid in self.pids(node):
            if Path(cmdline_of(pid).split(" ")[0]).name == "raylet":
                os.kill(pid, signal.SIGKILL)

    def shutdown(self) -> None:
        for _ in range(3):  # processes started while the first ones died
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)


@pytest.fixture(scope="module")
def study_models(tmp_path_factory, tiny_tokenizer) -> list[str]:
    """One tiny model of each family (4 blocks, the tiny BPE tokenizer)."""
    root = tmp_path_factory.mktemp("study-models")
    paths = []
    for family in FAMILIES:
        path = root / f"tiny-{family}"
        tiny_model(family, n_layers=4, vocab=len(tiny_tokenizer)).save_pretrained(path)
        tiny_tokenizer.save_pretrained(path)
        paths.append(str(path))
    return paths


def study_parameters(corpus: str) -> dict:
    """Every chapter's budget cut to seconds: 4 windows of 32 tokens, k ≤ 2, one 20-step trained run."""
    train = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, lr=3e-3, eval_every=10,
                 snapshot_every=10, checkpoint_every=15, eval_windows=4, steps=20, corpus=corpus)
    return dict(corpus=corpus, seq_len=32, eval_tokens=31 * 4, calibration_tokens=31 * 2, heal_tokens=31 * 2,
                k_values=[1], batch_size=4, k_max=2, n_resamples=100, n_permutations=100, speed_repeats=1,
                depths=[2], train_overrides=train, series_eval_tokens=31 * 4)


def read_tables(out: Path) -> dict[str, object]:
    """Every file the study wrote (``jobs.csv`` and the state file aside): tables as frames, summaries as dicts."""
    tables = {}
    for path in sorted(out.rglob("*")):
        name = path.relative_to(out).as_posix()
        if not path.is_file() or name in ("jobs.csv", STATE_FILE):
            continue
        if path.suffix == ".csv":
            tables[name] = stable_view(pd.read_csv(path))
        elif path.suffix == ".json":
            tables[name] = drop_volatile(json.loads(path.read_text()))
        else:
            tables[name] = path.read_bytes()
    return tables


def drop_volatile(value):
    if isinstance(value, dict):
        return {k: drop_volatile(v) for k, v in value.items() if not volatile(k)}
    if isinstance(value, list):
        return [drop_volatile(v) for v in value]
    return value


def cache_files(cache: Path) -> dict[str, Path]:
    """The finished entries' files of a cache: no lock, temporary, journal of a sweep in progress
    or converted model."""
    return {p.relative_to(cache).as_posix(): p for p in cache.rglob("*")
            if p.is_file() and not p.name.endswith((".lock", ".partial.jsonl", ".tmp"))
            and not any(part.startswith(".") or part.endswith(".partial") for part in p.relative_to(cache).parts)
            and p.relative_to(cache).parts[0] != "models"}


def test_a_study_on_a_two_node_cluster_survives_a_lost_node_and_leaves_the_book_nothing_to_compute(
        study_models, micro_corpus, tmp_path, monkeypatch, one_thread):
    params = study_parameters(micro_corpus)
    stages = plan(study_models, params, root=ROOT)

    # the reference: the same study with the local executor, in this process, one thread as a Ray job has
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "local-cache"))
    local_started = time.time()
    local = study(study_models, params, executor="local", out_dir=tmp_path / "local", root=ROOT, progress=False,
                  log=lambda _: None)
    local_seconds = time.time() - local_started
    assert local.jobs["job"].tolist() == [s.name for s in stages]

    cluster = LocalCluster(tmp_path)
    caches = {node: tmp_path / f"{node}-cache" for node in ("head", "worker", "driver")}
    lost: dict[str, float] = {}
    try:
        cluster.start("head", caches["head"])
        cluster.start("worker", caches["worker"])

        # a driver without the head's token is told how to get it (Ray itself would retry for ever)
        probe = ("from zones.core.executors import check_ray_address; "
                 f"check_ray_address({cluster.address!r}, connect_seconds=90)")
        refused = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=200,
                                 env=dict(cluster.env(token=False), HOME=str(tmp_path)))  # no ~/.ray/auth_token
        assert refused.returncode != 0
        assert "refused this process's authentication token; run with RAY_AUTH_MODE=token" in refused.stderr

        def kill_the_worker_during_a_job():
            deadline = time.time() + 600
            while time.time() < deadline and not cluster.running_job("worker"):
                time.sleep(0.2)
            cluster.kill_raylet("worker")  # as a machine lost: its raylet gone, SIGKILL
            lost["at"] = time.time()

        killer = threading.Thread(target=kill_the_worker_during_a_job, daemon=True)
        killer.start()
        command = [sys.executable, "-m", "zones", "study", "--models", ",".join(study_models), "--executor", "ray",
                   "--ray-address", cluster.address, "--out", str(tmp_path / "ray")]
        command += [arg for name, value in params.items()
                    for arg in ("--param", f"{name}={json.dumps(value)}")]  # JSON is YAML
        started = time.time()
        driver = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=cluster.env("driver", caches["driver"]))
        said: list[tuple[float, str]] = []  # the driver's lines, with when it said them
        reader = threading.Thread(target=lambda: said.extend((time.time(), line) for line in driver.stderr),
                                  daemon=True)
        reader.start()
        tables_before_the_end = 0
        while driver.poll() is None:  # each job's tables appear as it finishes, before the study ends
            tables_before_the_end = max(tables_before_the_end, len(list((tmp_path / "ray").rglob("*.csv"))) - 1)
            time.sleep(0.5)
        ended = time.time()
        driver.wait(timeout=1500)
        reader.join(timeout=10)
        killer.join(timeout=5)
    finally:
        cluster.shutdown()
    stderr = "".join(line for _, line in said)
    assert driver.returncode == 0, stderr[-4000:]
    assert "[state-dump]" not in stderr, stderr[-4000:]   # a dead raylet's log tail stays out of the study's lines
    assert cluster.pids() == []  # nothing of the cluster outlives the test
    assert started < lost["at"] < ended, "the worker node was never seen running a job"
    assert tables_before_the_end > 0

    # the lost node's job was resubmitted to a live node within the stated bound
    resubmitted = [when for when, line in said if "resubmitted to a live node" in line]
    assert resubmitted, stderr[-4000:]
    assert resubmitted[0] - lost["at"] <= LOST_NODE_SECONDS + 1, (resubmitted[0] - lost["at"], stderr[-4000:])
    print(f"lost node: job resubmitted {resubmitted[0] - lost['at']:.1f} s after the raylet was killed; "
          f"study {ended - started:.0f} s with the kill, local {local_seconds:.0f} s")

    # the study finished every job once, and the lost node's job was run again elsewhere
    jobs = pd.read_csv(tmp_path / "ray" / "jobs.csv")
    assert jobs["job"].tolist() == [s.name for s in stages]  # no job missing or twice
    assert (jobs["status"] == "done").all()
    assert jobs["retries"].sum() >= 1
    assert (jobs["gpus"] == 0).all() and (jobs["cpus"] == 1).all()

    # every table equals the local executor's, bit for bit (when and where it ran aside): no row missing or twice
    ray_tables, local_tables = read_tables(tmp_path / "ray"), read_tables(tmp_path / "local")
    assert sorted(ray_tables) == sorted(local_tables) and len(local_tables) > 40
    for name, expected in local_tables.items():
        if isinstance(expected, pd.DataFrame):
            pd.testing.assert_frame_equal(ray_tables[name], expected, check_exact=True, obj=name)
        else:
            assert ray_tables[name] == expected, name

    # the driver's cache holds every finished entry of the surviving node, byte for byte
    driver = cache_files(caches["driver"])
    for name, path in cache_files(caches["head"]).items():
        assert name in driver, f"{name} of the head node's cache is not in the driver's"
        if path.suffix == ".jsonl":  # a journal: the driver's holds every row
            assert set(path.read_bytes().splitlines()) <= set(driver[name].read_bytes().splitlines())
        else:
            assert driver[name].read_bytes() == path.read_bytes(), name

    # the book that follows, on the driver, reads everything and computes nothing
    monkeypatch.setenv("ZONES_CACHE", str(caches["driver"]))
    with counting() as tally:
        for chapter, kwargs in book_calls(study_models, params, root=ROOT):
            with tempfile.TemporaryDirectory() as out:
                importlib.import_module(f"zones.report.{chapter}").run(**kwargs, out_dir=out)
    assert tally.n_computed == 0, sorted(tally.computed)
    assert tally.n_read > 0
    assert f"{tally.n_read} cached entries read, 0 computed" in tally.sentence()
