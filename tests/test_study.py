"""``zones study`` and what it stands on: cache entries carried between caches, the count of entries
read and computed, jobs in order, the Ray executor's requests and retries, and Ray addresses that
do not answer. The study on a real multi-node cluster is ``test_ray_cluster.py``."""
from __future__ import annotations

import ast
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from zones.book import RUN_LAST, chapter_source, chapters, declared_parameters
from zones.core.atomic import atomic_directory
from zones.core.cache import CacheError, cache_dir, entry_path
from zones.core.capture import capture, store_captured
from zones.core.entries import cached_table, read_cached_table
from zones.core.executors import Job, JobFailed, check_ray_address, check_resources, run_jobs, task_resources
from zones.core.journal import Journal
from zones.core.manifest import verify_manifest, write_manifest
from zones.core.tally import counting
from zones.report import chapter_arguments
from zones.studies import ABOUT_THE_BOOK, STATE_FILE, book_calls, plan, status, study

ROOT = Path(__file__).resolve().parents[1]


# --- entries carried from one cache to another -----------------------------------------------------------

def make_entries(tag: str) -> dict:
    """A table entry, a folder entry with its manifest and a journal, in the current cache."""
    parts = dict(kind="unit", tag=tag)
    table = cached_table("unit", parts, lambda: pd.DataFrame({"x": [1.5, 2.5], "tag": [tag, tag]}))
    folder = cache_dir() / "folders" / f"run-{tag}"
    with atomic_directory(folder) as tmp:
        (tmp / "weights.bin").write_bytes(b"\0\1\2" * 100)
        write_manifest(tmp, dict(kind="folder", tag=tag))
    journal = Journal(entry_path("sweeps", dict(kind="sweep", tag=tag), ext="jsonl"), required=("k",))
    journal.append(dict(k=1, loss=0.5))
    return dict(parts=parts, table=table, folder=folder, journal=journal.path)


def test_captured_entries_land_verified_in_another_cache_and_a_second_copy_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "worker"))
    with capture() as captured:
        made = make_entries("a")
    assert sorted(e.path for e in captured.entries) == sorted(
        [entry_path("unit", made["parts"]).relative_to(cache_dir()).as_posix(), "folders/run-a",
         made["journal"].relative_to(cache_dir()).as_posix()])
    assert captured.tally.n_computed == 3 and captured.tally.n_read == 0

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    assert store_captured(captured.entries) == (3, 0)
    assert store_captured(captured.entries) == (0, 3)  # already here, intact: kept as it is
    pd.testing.assert_frame_equal(read_cached_table(entry_path("unit", made["parts"]), made["parts"]), made["table"])
    assert verify_manifest(cache_dir() / "folders" / "run-a", dict(kind="folder", tag="a"))
    assert Journal(tmp_path / "driver" / made["journal"].relative_to(tmp_path / "worker")).rows() == [dict(k=1, loss=0.5)]


def test_a_journal_carried_in_is_merged_row_by_row(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "worker"))
    path = entry_path("sweeps", dict(kind="sweep"), ext="jsonl")
    journal = Journal(path, required=("k",))
    for k in (1, 2, 3):
        journal.append(dict(k=k))
    with capture() as captured:
        journal.rows()
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    here = Journal(entry_path("sweeps", dict(kind="sweep"), ext="jsonl"), required=("k",))
    here.append(dict(k=2))
    here.append(dict(k=9))
    assert store_captured(captured.entries) == (1, 0)
    assert [row["k"] for row in here.rows()] == [2, 9, 1, 3]  # every row once: the same key, the same row


def test_a_loss_store_journal_with_its_sidecar_is_merged_row_by_row(tmp_path, monkeypatch):
    """The loss store keeps its key beside its journal (``x.json``); a job's new rows for a store
    the driver already holds are merged, not dropped as "already here"."""
    from zones.measure.store import open_store

    key = dict(model="m", dtype="float32")
    nll = lambda v: dict(nll=np.array([v, v + 1.0]))  # noqa: E731
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    open_store(key).append("c", "1", nll(1.0))
    open_store(key).append("c", "3", nll(3.0))  # the driver's own row, from another job
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "worker"))
    with capture() as captured:
        store = open_store(key)
        store.append("c", "1", nll(1.0))
        store.append("c", "2:attn", nll(2.0))
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    assert store_captured(captured.entries) == (1, 0)
    here = open_store(key)
    assert all(here.get("c", removed, ("nll",)) is not None for removed in ("1", "2:attn", "3"))
    assert store_captured(captured.entries) == (0, 1)


def test_a_damaged_or_escaping_carried_entry_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "worker"))
    with capture() as captured:
        make_entries("b")
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    table = next(e for e in captured.entries if e.path.startswith("unit/"))
    torn = type(table)(table.path, table.folder, {k: v[:-3] for k, v in table.files.items()}, table.digests)
    with pytest.raises(CacheError, match=rf"cache file {table.path} from job x arrived damaged .*run again"):
        store_captured([torn], source="job x")
    escaping = type(table)("../outside.parquet", False, {"../outside.parquet": b"x"},
                           {"../outside.parquet": __import__("hashlib").sha256(b"x").hexdigest()})
    with pytest.raises(CacheError, match="outside the cache folder; refused"):
        store_captured([escaping])
    assert not (tmp_path / "outside.parquet").exists() and not entry_path("unit", dict(kind="unit", tag="b")).exists()


def test_a_converted_model_is_counted_but_not_carried(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    with capture() as captured:
        with atomic_directory(cache_dir() / "models" / "tiny.Q4_1-abc") as tmp:
            (tmp / "model.safetensors").write_bytes(b"weights")
            write_manifest(tmp, dict(kind="converted_gguf"))
    assert captured.tally.computed == {"models/tiny.Q4_1-abc"} and captured.entries == []


def test_counting_sees_reads_and_computations_of_processes_started_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    parts = dict(kind="unit", n=1)
    compute = "from zones.core.entries import cached_table; import pandas as pd; " \
              "cached_table('unit', {'kind': 'unit', 'n': 1}, lambda: pd.DataFrame({'a': [1]}))"
    with counting() as first:
        subprocess.run([sys.executable, "-c", compute], check=True, cwd=ROOT)
    with counting() as second:
        subprocess.run([sys.executable, "-c", compute], check=True, cwd=ROOT)
        cached_table("unit", parts, lambda: pytest.fail("recomputed"))
    assert (first.n_read, first.n_computed) == (0, 1) and first.sentence() == "0 cached entries read, 1 computed"
    assert (second.n_read, second.n_computed) == (1, 0) and second.sentence() == "1 cached entry read, 0 computed"


# --- the study's plan: each chapter called as its page calls it -------------------------------------------

def page_call(source: Path) -> dict[str, str]:
    """The keyword arguments of the page's ``run(...)`` call of its chapter (``report.NAME.run`` or
    ``X.run`` with ``X`` the chapter's module under another name): argument -> the source of its
    value. Read here, by the test only: the study itself never reads a notebook's code."""
    import jupytext

    name = Path(source).stem
    trees = []
    for cell in jupytext.read(source).cells:
        if cell.cell_type == "code":
            try:
                trees.append(ast.parse(cell.source))
            except SyntaxError:  # IPython magics
                continue
    nodes = [n for tree in trees for n in ast.walk(tree)]
    aliases = {a.asname or a.name for n in nodes if isinstance(n, ast.ImportFrom) and n.module == "zones.report"
               for a in n.names if a.name == name}
    for node in nodes:
        func = getattr(node, "func", None)
        if not (isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "run"):
            continue
        target = func.value
        if (isinstance(target, ast.Name) and target.id in aliases) or (
                isinstance(target, ast.Attribute) and target.attr == name):
            assert not node.args and all(k.arg for k in node.keywords), f"{source}: pass run's arguments by name"
            return {k.arg: ast.unparse(k.value) for k in node.keywords}
    raise AssertionError(f"{source} has no call of zones.report.{name}.run(...)")


def study_chapters() -> list[str]:
    return [n for n in chapters(ROOT) if n not in RUN_LAST + ABOUT_THE_BOOK]


@pytest.mark.parametrize("name", study_chapters())
def test_every_page_calls_run_with_exactly_what_the_study_passes(name):
    """The study calls ``zones.report.<chapter>.run`` with the chapter's parameters that ``run``
    takes (``chapter_arguments``); the page passes the same names, each its own parameter, so the
    book and the study compute the same thing."""
    source = chapter_source(ROOT, name)
    declared = declared_parameters(source)
    passed = chapter_arguments(name, {k: f"<{k}>" for k in declared})
    call = page_call(source)
    assert {k: v for k, v in call.items() if k != "out_dir"} == {k: k for k in passed}, name
    assert call.get("out_dir") == "out_dir", f"{name}: the page writes to its out_dir parameter"
    assert any(p in passed for p in ("model", "models", "profile")) or not any(
        p in declared for p in ("model", "models", "profile")), name


def test_the_study_reads_no_notebook_code(tmp_path, tiny_model_dir):
    """Before, the study read each page's ``run(...)`` call from its notebook: an edit to that cell
    changed what the study computed, and a call it could not parse stopped it. Now the call is the
    library's: a project whose page calls ``run(**params)`` plans the same stages."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(ROOT / "_toc.yml", root / "_toc.yml")
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    page = root / "notebooks" / "alpha_profile.md"
    text = page.read_text()
    start = text.index("result = report.alpha_profile.run(")
    end = text.index(")", text.index("n_resamples=n_resamples", start)) + 1
    page.write_text(text[:start] + "result = report.alpha_profile.run(**dict(models=models, out_dir=out_dir))"
                    + text[end:])
    models = [str(tiny_model_dir)]
    edited = plan(models, root=root, only=["alpha_profile"])
    assert [(s.name, s.kwargs) for s in edited] == [(s.name, s.kwargs) for s in plan(models, root=ROOT,
                                                                                     only=["alpha_profile"])]
    assert {"role", "alpha_estimator", "n_resamples"} <= set(edited[0].kwargs)


def test_the_plan_runs_shared_work_first_and_trains_each_run_once(tiny_model_dir, micro_corpus):
    models = [str(tiny_model_dir), "smollm2-135m"]
    params = dict(corpus=micro_corpus, depths=[2, 3], train_overrides=dict(steps=20, width=32, corpus=micro_corpus))
    stages = {s.name: s for s in plan(models, params, root=ROOT)}
    label = Path(tiny_model_dir).name
    assert stages[f"importance_vs_alpha · {label}"].after == (f"layer_ablation · {label}",)
    assert stages["predictors · smollm2-135m"].after == ("layer_ablation · smollm2-135m", "pruning · smollm2-135m")
    trains = [s for s in stages.values() if s.chapter == "train"]
    assert [s.label for s in trains] == [f"depth {d}, seed {k}" for d in (2, 3) for k in range(3)]  # one per run
    assert all(s.kwargs["config"].steps == 20 for s in trains)
    # the depth series' part of the sublayers chapter runs once, with the first model
    assert stages[f"sublayers · {label}"].kwargs["profile"] == "cpu"
    assert stages["sublayers · smollm2-135m"].kwargs["profile"] is None
    assert set(stages["depth_series"].after) == {s.name for s in trains}
    with pytest.raises(ValueError, match="unknown chapter parameter n_resamplez"):
        plan(models, dict(n_resamplez=3), root=ROOT)
    with pytest.raises(ValueError, match="--models lists 'smollm2-135m' twice"):
        plan(["smollm2-135m", "smollm2-135m"], root=ROOT)


def test_a_local_study_writes_every_table_and_the_book_that_follows_computes_nothing(
        tiny_model_dir, micro_corpus, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    models = [str(tiny_model_dir)]
    params = dict(corpus=micro_corpus, seq_len=32, eval_tokens=31 * 4, calibration_tokens=31 * 2, k_max=2, seeds=2,
                  batch_size=4, n_resamples=100, n_permutations=100)
    only = ["layer_ablation", "importance_vs_alpha", "pruning", "predictors"]
    lines, seen = [], []
    out = tmp_path / "out"
    label = Path(tiny_model_dir).name

    def log(line):  # at each job's line, its tables, jobs.csv and the state file are there already
        lines.append(line)
        if line.startswith("done "):
            chapter = line.split()[1]
            jobs = pd.read_csv(out / "jobs.csv")
            state = {job["job"]: job["status"] for job in json.loads((out / STATE_FILE).read_text())["jobs"]}
            seen.append((chapter, sorted(p.name for p in (out / chapter / label).iterdir()),
                         jobs.set_index("job")["status"].to_dict(), state))

    result = study(models, params, out_dir=out, only=only, root=ROOT, progress=False, log=log)
    assert result.jobs["job"].tolist() == [f"{c} · {label}" for c in only]
    assert [chapter for chapter, *_ in seen] == only  # one line per finished job, as it finishes
    for k, (chapter, files, jobs, state) in enumerate(seen):
        assert "summary.json" in files and any(f.endswith(".csv") for f in files), chapter
        assert jobs == state == {f"{c} · {label}": "done" if j <= k else "waiting" for j, c in enumerate(only)}
    done = [line for line in lines if line.startswith("done ")]
    assert re.fullmatch(rf"done layer_ablation · {re.escape(label)} in \d+ s \(computed\); 1 of 4 jobs done", done[0])
    assert done[1].startswith(f"done importance_vs_alpha · {label} in ") and "(from cache)" in done[1]
    assert status(out)["status"].tolist() == ["done"] * 4
    assert result.jobs.loc[result.jobs["chapter"] == "importance_vs_alpha", "computed"].item() == 0  # shared work
    assert (tmp_path / "out" / "pruning" / label / "pruning.csv").exists()
    assert pd.read_csv(tmp_path / "out" / "jobs.csv")["job"].tolist() == result.jobs["job"].tolist()
    assert lines[-1].startswith("zones study: 4 of 4 jobs in ") and result.tally.sentence() in lines[-1]
    assert result.tally.n_computed > 0

    with counting() as tally:  # the chapters as the book calls them, every model at once
        for chapter, kwargs in book_calls(models, params, root=ROOT, only=only):
            with tempfile.TemporaryDirectory() as out:
                importlib.import_module(f"zones.report.{chapter}").run(**kwargs, out_dir=out)
    assert tally.n_computed == 0 and tally.n_read >= 3


def test_study_with_ray_missing_is_one_line_before_any_work(tiny_model_dir, tmp_path, monkeypatch, capsys):
    from zones.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
    monkeypatch.chdir(ROOT)
    assert main(["study", "--models", str(tiny_model_dir), "--executor", "ray", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ['zones study: error: the ray executor needs Ray: pip install "zones[ray]" (or "ray[default]>=2.9")']
    assert not (tmp_path / "o" / "jobs.csv").exists()


# --- jobs in order ----------------------------------------------------------------------------------------

def double(x):
    return 2 * x


def add(*xs):
    return sum(xs)


def test_jobs_start_after_those_they_follow_and_take_their_results():
    order = []
    jobs = [Job("sum", add, (1,), after=("a", "b")), Job("a", double, (1,)), Job("b", double, (5,))]

    def prepare(job, before):
        return Job(job.name, job.fn, job.args + tuple(before[n] for n in job.after), after=job.after)

    assert run_jobs(jobs, progress=False, prepare=prepare, on_result=lambda job, r: order.append(job.name)) == [13, 2, 10]
    assert order == ["a", "b", "sum"]
    with pytest.raises(ValueError, match="job a comes after nope, which is not another job of this run"):
        run_jobs([Job("a", double, (1,), after=("nope",))], progress=False)
    with pytest.raises(ValueError, match="jobs a, b wait for each other in a cycle"):
        run_jobs([Job("a", double, (1,), after=("b",)), Job("b", double, (1,), after=("a",))], progress=False)
    with pytest.raises(ValueError, match="job names must be unique; a appear"):
        run_jobs([Job("a", double, (1,)), Job("a", double, (2,))], progress=False)


def test_a_job_runs_after_a_failed_one_and_both_outcomes_are_reported():
    jobs = [Job("bad", double, ("x", "y")), Job("next", double, (4,), after=("bad",))]
    seen = []
    with pytest.raises(JobFailed, match=r"1 of 2 jobs failed: bad \(TypeError"):
        run_jobs(jobs, progress=False, on_result=lambda job, r: seen.append((job.name, r)))
    assert seen == [("next", 8)]


# --- the Ray executor's requests and retries, on a stand-in for Ray ---------------------------------------

class FakeRef:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args


class FakeRay(types.ModuleType):
    """Just enough of Ray for the driver's side of ``run_jobs``: records each task's options, runs
    it on ``get``, and loses the worker of the jobs named in ``lose`` once."""

    def __init__(self, resources: dict, lose: tuple = (), node_cache: Path | None = None):
        super().__init__("ray")
        self.resources, self.requests, self.lose, self.node_cache = resources, [], set(lose), node_cache
        self.raylet = socket.create_server(("127.0.0.1", 0))  # what the driver's look at the node finds
        self.port = self.raylet.getsockname()[1]

        class RayError(Exception):
            pass

        class RayTaskError(RayError):
            pass

        class WorkerCrashedError(RayError):
            pass

        class NodeDiedError(RayError):
            pass

        self.exceptions = types.SimpleNamespace(RayError=RayError, RayTaskError=RayTaskError,
                                                WorkerCrashedError=WorkerCrashedError, NodeDiedError=NodeDiedError)
        self.util = types.SimpleNamespace(scheduling_strategies=types.SimpleNamespace(
            NodeAffinitySchedulingStrategy=lambda node, soft: (node, soft)))

    def nodes(self):  # one node with every resource; its raylet is this test's to answer
        return [dict(NodeID="fake-node-0123456789", Alive=True, Resources=dict(self.resources),
                     NodeManagerAddress="127.0.0.1", NodeManagerPort=self.port)]

    def cancel(self, ref, force=False):
        pass

    def is_initialized(self):
        return True

    def cluster_resources(self):
        return dict(self.resources)

    def remote(self, fn):
        ray = self

        class Task:
            def options(self, **options):
                ray.requests.append(options)
                return types.SimpleNamespace(remote=lambda *args: FakeRef(fn, args))

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        if ref.args[0] in self.lose:
            self.lose.discard(ref.args[0])
            raise self.exceptions.WorkerCrashedError("the worker died")
        if self.node_cache is None:
            return ref.fn(*ref.args)
        here = os.environ["ZONES_CACHE"]
        os.environ["ZONES_CACHE"] = str(self.node_cache)  # the job runs on a node with its own cache
        try:
            return ref.fn(*ref.args)
        finally:
            os.environ["ZONES_CACHE"] = here

    def get_runtime_context(self):
        return types.SimpleNamespace(get_node_id=lambda: "fake-node-0123456789",
                                     get_assigned_resources=lambda: {"CPU": 1.0})


def test_a_ray_job_asks_for_one_gpu_where_the_cluster_has_gpus(monkeypatch):
    jobs = [Job("a", double, (1,)), Job("b", double, (2,), cpus=2), Job("c", double, (3,), gpus=0.5)]
    for resources, gpus in (({"CPU": 8, "GPU": 2}, [1, 1, 0.5]), ({"CPU": 8}, [0, 0, 0.5])):
        fake = FakeRay(resources)
        monkeypatch.setitem(sys.modules, "ray", fake)
        results = run_jobs(jobs, "ray", progress=False) if resources.get("GPU") else None
        if results is None:  # a cluster without GPUs cannot run the job asking for half of one
            with pytest.raises(ValueError, match=r"job c asks for 0.5 GPUs but the Ray cluster .* has 0; lower "
                                                 r"--gpus-per-job to at most 0"):
                run_jobs(jobs, "ray", progress=False)
            run_jobs(jobs[:2], "ray", progress=False)
        else:
            assert results == [2, 4, 6]
        assert [r["num_gpus"] for r in fake.requests] == gpus[:len(fake.requests)]
        assert [r["num_cpus"] for r in fake.requests][:2] == [1, 2]
        assert all(r["max_retries"] == 0 for r in fake.requests)  # lost workers are retried here, said and counted
    assert task_resources(Job("g", double), {"GPU": 1.0}) == (1.0, 1.0)
    assert task_resources(Job("g", double, gpus=0), {"GPU": 4.0}) == (1.0, 0.0)
    with pytest.raises(ValueError, match="job g asks for 1 GPUs but the cluster has 0.5"):
        check_resources([Job("g", double, gpus=1)], {"CPU": 2, "GPU": 0.5}, "the cluster")


def test_a_ray_job_whose_worker_died_is_submitted_again_and_counted(monkeypatch, capsys):
    fake = FakeRay({"CPU": 2}, lose=("b",))
    monkeypatch.setitem(sys.modules, "ray", fake)
    events = []
    assert run_jobs([Job("a", double, (1,)), Job("b", double, (2,))], "ray", progress=False, events=events) == [2, 4]
    assert events == [("b", "retry", "WorkerCrashedError: the worker running it died")]
    assert ("zones: job b lost its worker (WorkerCrashedError); resubmitted to a live node (within 12 s of the loss); "
            "retry 1 of 2") in capsys.readouterr().err
    fake.lose = {"b"}
    with pytest.raises(JobFailed, match=r"b \(WorkerCrashedError: the worker running it died; 1 attempt\)"):
        run_jobs([Job("b", double, (2,))], "ray", retries=0, progress=False)


class TwoNodes(FakeRay):
    """Two nodes of one CPU; the second's raylet stops answering as its first job starts, and that
    job never returns (a machine gone silent: Ray itself would wait for its health check)."""

    def __init__(self):
        super().__init__({"CPU": 2})
        self.second = socket.create_server(("127.0.0.1", 0))
        self.second_port = self.second.getsockname()[1]
        self.hung: list = []

    def nodes(self):
        return [dict(NodeID=node, Alive=True, Resources={"CPU": 1.0}, NodeManagerAddress="127.0.0.1",
                     NodeManagerPort=port) for node, port in (("node-one", self.port), ("node-two", self.second_port))]

    def remote(self, fn):
        fake = self

        class Task:
            def options(self, **options):
                fake.requests.append(options)

                def remote(*args):
                    ref = FakeRef(fn, args)
                    if options["scheduling_strategy"][0] == "node-two" and not fake.hung:
                        fake.hung.append(ref)
                        fake.second.close()  # the node dies while this job runs
                    return ref

                return types.SimpleNamespace(remote=remote)

        return Task()

    def wait(self, refs, num_returns=1, timeout=None):
        ready = [r for r in refs if r not in self.hung][:num_returns]
        if not ready:
            time.sleep(timeout or 0)
        return ready, [r for r in refs if r not in ready]


def test_a_job_on_a_node_gone_silent_is_resubmitted_to_a_live_node_within_the_stated_bound(monkeypatch, capsys):
    from zones.core import executors

    monkeypatch.setattr(executors, "POLL_SECONDS", 0.2)
    bound = executors.LOST_AFTER * (0.2 + executors.NODE_PROBE_SECONDS)
    fake = TwoNodes()
    monkeypatch.setitem(sys.modules, "ray", fake)
    events = []
    started = time.monotonic()
    assert run_jobs([Job("a", double, (1,)), Job("b", double, (2,))], "ray", progress=False, events=events) == [2, 4]
    assert time.monotonic() - started <= bound + 1
    assert [r["scheduling_strategy"] for r in fake.requests] == [("node-one", False), ("node-two", False),
                                                                 ("node-one", False)]  # b again, on the live node
    assert events == [("b", "retry", "NodeLost: its node stopped answering")]
    assert "zones: job b lost its node (node-two did not answer for 3 looks); resubmitted to a live node" \
        in capsys.readouterr().err


# --- Ray addresses that do not answer ----------------------------------------------------------------------

@pytest.fixture
def hang_guard():
    """Fail instead of hanging (Ray retries an address that does not answer for ever)."""
    def hung(*_):
        raise TimeoutError("still waiting for the Ray address after 120 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def test_a_ray_address_nothing_answers_on_is_one_line_naming_it_and_the_remedy(tmp_path, monkeypatch, capsys,
                                                                                hang_guard):
    """Before: `zones lifecycle --executor ray --ray-address 127.0.0.1:1` printed Ray's GCS warnings for ever."""
    pytest.importorskip("ray")
    import ray
    from conftest import tiny_model

    from zones.cli import main
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("ray.init was called on a dead address"))
    tiny_model("gpt_neox", n_layers=2, seed=4242).save_pretrained(tmp_path / "step-0")  # nothing cached
    code = main(["lifecycle", "--executor", "ray", "--ray-address", "127.0.0.1:1", "--checkpoints",
                 str(tmp_path / "step-0"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1] == ("zones lifecycle: error: no Ray cluster answers at 127.0.0.1:1 (connection refused within 5 s); "
                       "start its head there with `ray start --head --port 1`, or pass a running head's address with "
                       "--ray-address or $RAY_ADDRESS")
    with pytest.raises(ValueError, match="Ray address '127.0.0.1' is not HOST:PORT"):
        check_ray_address("127.0.0.1")


def test_a_ray_address_that_answers_but_not_as_ray_fails_within_the_stated_time(hang_guard):
    pytest.importorskip("ray")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(server.accept()) for _ in range(8)], daemon=True).start()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(ConnectionError, match=rf"{address} accepts connections but did not let this process join "
                                                  r"it as a Ray cluster within 15 s; pass the head's address"):
            check_ray_address(address, connect_seconds=15)
    finally:
        server.close()


def test_joining_a_ray_address_works_when_this_process_holds_over_a_thousand_descriptors(hang_guard):
    """A long test or study process may hold more than 1023 open files; the join must not rely on
    select(), which refuses such descriptors (the CI run of 5 Dec failed so)."""
    pytest.importorskip("ray")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard if hard != resource.RLIM_INFINITY else 4096) < 1200:
        pytest.skip("this machine allows fewer than 1200 open files")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    threading.Thread(target=lambda: [server.accept() for _ in range(8)], daemon=True).start()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        with pytest.raises(ConnectionError, match=rf"{address} accepts connections but did not let this process join"):
            check_ray_address(address, connect_seconds=3)
    finally:
        server.close()
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_study_on_nodes_with_their_own_caches_carries_every_entry_home_and_a_rerun_sends_them_back(
        tiny_model_dir, micro_corpus, tmp_path, monkeypatch, one_thread):
    """Each job runs with its node's cache: its entries come back to this cache; run again on a node
    whose cache is empty, each job gets the entries it used the last time and computes nothing."""
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver"))
    models = [str(tiny_model_dir)]
    params = dict(corpus=micro_corpus, seq_len=32, eval_tokens=31 * 4, batch_size=4, n_resamples=100,
                  n_permutations=100)
    only = ["layer_ablation", "importance_vs_alpha"]
    first = FakeRay({"CPU": 2}, node_cache=tmp_path / "node-1")
    monkeypatch.setitem(sys.modules, "ray", first)
    ran = study(models, params, executor="ray", only=only, root=ROOT, progress=False, log=lambda _: None)
    assert ran.jobs["computed"].tolist()[0] > 0 and ran.stored > 0
    assert ran.jobs["node"].tolist() == ["fake-node-01"] * 2  # the first 12 characters of the node id
    with counting() as tally:  # the chapters on this cache: all there
        for chapter, kwargs in book_calls(models, params, root=ROOT, only=only):
            with tempfile.TemporaryDirectory() as out:
                importlib.import_module(f"zones.report.{chapter}").run(**kwargs, out_dir=out)
    assert tally.n_computed == 0

    monkeypatch.setitem(sys.modules, "ray", FakeRay({"CPU": 2}, node_cache=tmp_path / "node-2"))
    again = study(models, params, executor="ray", only=only, root=ROOT, progress=False, log=lambda _: None)
    assert again.jobs["computed"].tolist() == [0, 0] and again.tally.n_computed == 0
    assert again.tables == ran.tables


def test_a_job_that_fails_is_named_after_the_others_whose_tables_are_kept(tiny_model_dir, tmp_path, monkeypatch,
                                                                           one_thread):
    """Before, a failed job left nothing to look at: no table and no jobs.csv (the work was only in
    the cache). Now the finished job's tables are in OUT, and jobs.csv and the state file say which
    job failed and why."""
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    missing = str(tmp_path / "no-such-model")
    os.mkdir(missing)  # a folder, but no model: a missing path is refused before any job (issue 55)
    lines = []
    with pytest.raises(JobFailed, match=r"1 of 2 jobs failed: alpha_profile · no-such-model \(.*; 1 attempt\)"):
        study([missing, str(tiny_model_dir)], dict(n_resamples=50), out_dir=tmp_path / "out", only=["alpha_profile"],
              root=ROOT, progress=False, log=lines.append)
    assert lines[-1].startswith("zones study: 1 of 2 jobs in ") and "1 computed" in lines[-1]  # the other one's α
    assert list((tmp_path / "cache").glob("alpha/*.parquet"))
    assert lines[1].startswith("failed alpha_profile · no-such-model (") and lines[2].startswith("done alpha_profile")
    label = Path(tiny_model_dir).name
    assert (tmp_path / "out" / "alpha_profile" / label / "summary.json").exists()
    assert not (tmp_path / "out" / "alpha_profile" / "no-such-model").exists()
    jobs = pd.read_csv(tmp_path / "out" / "jobs.csv", keep_default_na=False).set_index("label")
    assert jobs["status"].to_dict() == {"no-such-model": "failed", label: "done"}
    assert "no-such-model" in jobs.loc["no-such-model", "error"] and jobs.loc[label, "error"] == ""
    state = json.loads((tmp_path / "out" / STATE_FILE).read_text())
    assert state["state"] == "failed" and state["command"].startswith(f"zones study --models {missing},")
    assert status(tmp_path / "out")["status"].tolist() == ["done", "failed"]  # done first, then failed


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_the_study_with_one_line_and_keeps_what_finished(signum, tiny_model_dir, tmp_path, monkeypatch,
                                                                         capsys, one_thread):
    """Before, SIGTERM killed the local study silently (and SIGINT left a bare "interrupted") with
    nothing in OUT. Now the signal stops the study after the running job (a line says so, and that a
    second signal stops at once); the finished job's tables, jobs.csv and the state file are there;
    one line says what finished and the command that resumes the study; the exit status is 128 + the
    signal."""
    import zones.studies as study_module
    from zones.cli import main

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    first = study_module.run_stage

    def run_stage(stage, *args):
        if stage.label == "second":
            raise AssertionError("the signal did not stop the study after the first job")
        os.kill(os.getpid(), signum)  # the signal arrives while the first job runs: it finishes
        return first(stage, *args)

    monkeypatch.setattr(study_module, "run_stage", run_stage)
    out = tmp_path / "out"
    (tmp_path / "second").mkdir()  # a local path that exists: never loaded, its job is stopped first
    models = f"{tiny_model_dir},{tmp_path / 'second'}"
    argv = ["study", "--models", models, "--only", "alpha_profile", "--param", "n_resamples=50", "--out", str(out)]
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}  # Ray, if run earlier, installs its own
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 128 + signum
    assert "Traceback" not in err and "interrupted" not in err
    stops = [line for line in err.splitlines() if "stopped" in line]
    name = signal.Signals(signum).name
    label = Path(tiny_model_dir).name
    assert f"zones study: {name}: stopping after the running job (alpha_profile · {label}); a second SIGINT or " \
           f"SIGTERM stops at once" in err
    assert len(stops) == 1 and stops[0] == (
        f"zones study: stopped by {name} after {stops[0].split(' after ')[1].split(':')[0]}: 1 of 2 jobs done; their "
        f"tables are in {out}, and cached; resume with the same command, which computes only the rest: zones study "
        f"--models {models} --param n_resamples=50 --only alpha_profile --out {out}")
    label = Path(tiny_model_dir).name
    assert (out / "alpha_profile" / label / "summary.json").exists()
    assert pd.read_csv(out / "jobs.csv").set_index("label")["status"].to_dict() == {label: "done", "second": "waiting"}
    state = json.loads((out / STATE_FILE).read_text())
    assert state["state"] == "stopped" and state["stopped_by"] == name
    assert {s: signal.getsignal(s) for s in before} == before  # the study's handlers are gone, the old ones back


def test_the_study_bar_counts_each_jobs_expected_work_in_reference_forwards(tiny_model_dir, micro_corpus,
                                                                             monkeypatch, tmp_path):
    import zones.studies as study_module
    from zones.book import expected_forwards
    from zones.core.progress import REFERENCE_FLOPS, training_flops
    from zones.series.config import parameter_count
    from zones.studies import TRAIN, model_scale, study_work

    models = [str(tiny_model_dir), "smollm2-135m"]
    params = dict(corpus=micro_corpus, depths=[2], seeds=1)
    stages = plan(models, params, root=ROOT, only=["pruning", "sublayers"])
    works = study_work(stages, root=ROOT)
    scale = model_scale(str(tiny_model_dir))
    assert 0 < scale < 0.01 and model_scale("smollm2-135m") == 1.0  # a tiny model weighs a sliver of SmolLM2
    label = Path(tiny_model_dir).name
    assert works["pruning · smollm2-135m"] == expected_forwards("pruning")  # the book's cost at the cpu budget
    assert works[f"pruning · {label}"] == pytest.approx(expected_forwards("pruning") * scale)
    train = next(s for s in stages if s.chapter == TRAIN)
    c = train.kwargs["config"]
    weights = c.depth * (4 + 2 * c.mlp_ratio) * c.hidden_size ** 2 + c.vocab_size * c.hidden_size
    assert works[train.name] == pytest.approx(c.steps * training_flops(weights, c.batch_size * c.seq_len,
                                                                       parameter_count(c)) / REFERENCE_FLOPS)

    seen = {}

    def recorded(jobs, executor, **kwargs):
        seen.update(unit=kwargs["unit"], works={job.name: job.work for job in jobs})
        raise JobFailed("recorded")

    monkeypatch.setattr(study_module, "run_jobs", recorded)
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    with pytest.raises(JobFailed):
        study(models, params, only=["pruning", "sublayers"], root=ROOT, progress=False, log=lambda _: None)
    assert seen == dict(unit="RF", works=works)  # the bar's total: the jobs' expected work, not their count


def test_a_second_signal_during_the_clean_stop_leaves_the_line_of_the_signal_that_ended_it(tiny_model_dir, tmp_path):
    """Issue 55: after SIGINT the study restored the old handlers before it wrote its record and
    said its line, so a SIGTERM meanwhile killed it at once (exit -15) with no line, or after a
    line that named SIGINT. Now a second signal during the clean stop is ignored: the one line
    names SIGINT and the exit status is 130. (Issue 53: the first signal asks to stop after the
    running job, the second stops at once; a third during the clean stop is the one ignored.)"""
    script = ("import os, signal, sys, time\nimport zones.studies as s\n"
              "def run_stage(stage, *args):\n    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(0.2)\n"
              "    os.kill(os.getpid(), signal.SIGINT)\n    time.sleep(30)\n"
              "s.run_stage = run_stage\nstop = s.Ledger.stop\n"
              "def stop_slowly(self, signum):\n    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(0.5)\n"
              "    return stop(self, signum)\n"
              "s.Ledger.stop = stop_slowly\nfrom zones.cli import main\n"
              "sys.exit(main(['study', '--models', sys.argv[1], '--only', 'alpha_profile', '--out', sys.argv[2]]))\n")
    env = dict(os.environ, ZONES_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_dir), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    stops = [line for line in done.stderr.splitlines() if "stopped by" in line]
    assert done.returncode == 130, (done.returncode, done.stderr[-2000:])
    assert len(stops) == 1 and "stopped by SIGINT" in stops[0], stops
    assert json.loads((tmp_path / "out" / STATE_FILE).read_text())["stopped_by"] == "SIGINT"


# --- budgets that fit the model (issue 53) -------------------------------------------------------------------

@pytest.fixture(scope="module")
def four_block_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A saved tiny Llama of 4 blocks and 48 positions: the class budget's k_max=3, k_values=[2, 3]
    and seq_len=64 do not fit it."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=48)
    path = tmp_path_factory.mktemp("four-blocks")
    AutoModelForCausalLM.from_config(config).save_pretrained(path, safe_serialization=True)
    tiny_tokenizer.save_pretrained(path)
    return path


def test_parameters_a_model_cannot_take_are_clipped_to_it_and_said(four_block_dir, tiny_model_dir):
    """Before, the class budget's k_max=3 failed pruning, healing and task accuracy on a 4-block model
    ("k_max=3 is too large ... at most 2 of this model's 4 blocks"), and seq_len=256 a model of 128
    positions. Now each job's parameters are clipped to its model, and the job says so."""
    from zones.studies import fit_to_model

    stages = {s.name: s for s in plan([str(four_block_dir), str(tiny_model_dir)], root=ROOT, budget="class",
                                      only=["pruning", "healing"])}
    four, six = Path(four_block_dir).name, Path(tiny_model_dir).name
    assert stages[f"pruning · {four}"].kwargs["k_max"] == 2 and stages[f"pruning · {four}"].kwargs["seq_len"] == 48
    assert stages[f"healing · {four}"].kwargs["k_values"] == [2]
    assert stages[f"pruning · {four}"].fitted == ("k_max=3 → 2 (at most 2 of its 4 blocks may go)",
                                                  "seq_len=64 → 48 (its 48 positions)")
    assert stages[f"pruning · {six}"].kwargs["k_max"] == 3 and stages[f"pruning · {six}"].fitted == ()
    assert fit_to_model(dict(k_max=1, seq_len=16), str(four_block_dir)) == (dict(k_max=1, seq_len=16), ())
    assert fit_to_model(dict(k_max=9), "no/such-model-here") == (dict(k_max=9), ())  # bounds unknown: as given


def installed_copy(tmp_path: Path) -> Path:
    """The zones package alone, as an install puts it in site-packages (no checkout around it: no
    _toc.yml, no notebooks/): the folder to put on PYTHONPATH."""
    site = tmp_path / "site"
    shutil.copytree(ROOT / "zones", site / "zones", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_a_study_runs_from_any_folder_on_an_installed_zones_and_fits_the_class_budget_to_a_4_block_model(
        tmp_path, tiny_tokenizer, micro_corpus):
    """Issue 53: from any folder but the checkout the study stopped at "no _toc.yml with a notebooks/
    folder here or above: run from the zones checkout"; the class budget failed pruning, healing and
    task accuracy on the class profile's 4-block model (k_max=3, k_values=[2, 3]); lm-eval printed
    "fatal: not a git repository" outside a repository. Now: rc 0, the clipping said in the jobs'
    lines and recorded in jobs.csv, the tables where --out says, no git noise."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import _tiny_config

    model = tmp_path / "four"
    AutoModelForCausalLM.from_config(_tiny_config("llama", 4, len(tiny_tokenizer))).save_pretrained(model)
    tiny_tokenizer.save_pretrained(model)
    work = tmp_path / "work"
    work.mkdir()
    env = dict(os.environ, ZONES_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(installed_copy(tmp_path)),
               GIT_CEILING_DIRECTORIES=str(tmp_path))
    only = ["pruning", "healing", "task_accuracy"]
    done = subprocess.run([sys.executable, "-m", "zones.cli", "study", "--models", str(model), "--budget", "class",
                           "--only", *only, "--param", f"corpus={micro_corpus}", "--out", "out"],
                          cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "not a git repository" not in done.stdout + done.stderr
    assert "fitted to its model: k_max=3 → 2 (at most 2 of its 4 blocks may go)" in done.stderr
    jobs = pd.read_csv(work / "out" / "jobs.csv", keep_default_na=False).set_index("chapter")
    assert jobs["status"].tolist() == ["done"] * 3
    assert jobs.loc["healing", "fitted"] == "k_values=[2, 3] → [2] (at most 2 of its 4 blocks may go)"
    assert (work / "out" / "pruning" / "four" / "pruning.csv").exists()
    assert pd.read_csv(work / "out" / "pruning" / "four" / "pruning.csv")["k"].max() == 2


def test_the_shipped_chapters_equal_the_notebooks(tmp_path):
    """The study's copy of the chapters' parameters cells (``zones/chapters.json``, shipped with the
    package) is the notebooks'; refresh it with ``python -c "from zones.studies import write_packaged;
    write_packaged()"``."""
    from zones.studies import PACKAGED, write_packaged

    assert json.loads(PACKAGED.read_text()) == write_packaged(ROOT, tmp_path / "chapters.json"), \
        "zones/chapters.json is stale: python -c 'from zones.studies import write_packaged; write_packaged()'"


def test_two_sigints_stop_a_running_study_the_first_after_its_job_the_second_at_once(tiny_model_dir, tmp_path):
    """Issue 53: once a SIGINT was lost under load, a second SIGINT and a SIGTERM were ignored too (the
    handler ignored every signal after the first): only SIGKILL stopped the study. Now the first
    signal asks it to stop after the running job and says that a second stops at once; the second
    does."""
    script = ("import sys, time\nimport zones.studies as s\n"
              "def run_stage(stage, *args):\n    time.sleep(120)\n"
              "s.run_stage = run_stage\nfrom zones.cli import main\n"
              "sys.exit(main(['study', '--models', sys.argv[1], '--only', 'alpha_profile', '--out', sys.argv[2]]))\n")
    env = dict(os.environ, ZONES_CACHE=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    out, log = tmp_path / "out", tmp_path / "stderr.txt"
    with open(log, "w") as err:
        process = subprocess.Popen([sys.executable, "-c", script, str(tiny_model_dir), str(out)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=err)
    try:
        def wait_for(check, seconds=90.0):
            end = time.monotonic() + seconds
            while not check() and time.monotonic() < end and process.poll() is None:
                time.sleep(0.1)
            return check()

        def running():  # the job has started (its status in the state file)
            try:
                return any(job["status"] == "running" for job in json.loads((out / STATE_FILE).read_text())["jobs"])
            except (OSError, ValueError):
                return False

        assert wait_for(running), log.read_text()[-2000:]
        process.send_signal(signal.SIGINT)
        assert wait_for(lambda: "a second SIGINT or SIGTERM stops at once" in log.read_text()), log.read_text()
        assert process.poll() is None  # the job runs on
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 130
    finally:
        if process.poll() is None:
            process.kill()
    lines = log.read_text()
    assert lines.count("stopped by SIGINT") == 1 and "Traceback" not in lines
    assert json.loads((out / STATE_FILE).read_text())["state"] == "stopped"


def test_plan_prints_the_jobs_their_cost_and_time_and_runs_nothing(four_block_dir, tmp_path, monkeypatch, capsys):
    """Issue 53: the cost before a study was "about 5.69 reference forwards", with no time and no way
    to see the plan without running it. ``--plan`` prints each job, its cost and time, and exits."""
    import zones.studies as study_module
    from zones.cli import main

    monkeypatch.setattr(study_module, "forward_seconds", lambda: (2.0, "timed here"))
    monkeypatch.setattr(study_module, "run_jobs", lambda *a, **k: pytest.fail("--plan ran the study"))
    out = tmp_path / "out"
    assert main(["study", "--models", str(four_block_dir), "--budget", "class", "--only", "pruning", "healing",
                 "--plan", "--out", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    stages = plan([str(four_block_dir)], root=ROOT, budget="class", only=["pruning", "healing"])
    works = study_module.study_work(stages, "class", ROOT)
    total = sum(works.values())
    assert lines[0].startswith(f"zones study --plan: 2 jobs, about {total:.3g} reference forwards, about ")
    assert "(a reference forward: 2.00 s, timed here); nothing run" in lines[0]
    label = Path(four_block_dir).name
    assert lines[1].split()[:3] == ["pruning", "·", label] and "fitted: k_max=3 → 2" in lines[1]
    assert f"after pruning · {label}" in lines[2]
    assert not out.exists()


def test_the_study_ends_with_one_table_and_figure_across_its_models(four_block_dir, tiny_model_dir, micro_corpus,
                                                                   tmp_path, monkeypatch, one_thread):
    """Issue 53: a study's output was ``OUT/<chapter>/<model>/*.csv`` only; the across-models chapter
    was not one of its jobs, and no table or figure set the models side by side. Now its last job is
    the across-models chapter over every studied model (after the jobs whose entries it reads), its
    tables in ``OUT/across_models`` with its figures as pages that open offline and as specs."""
    from zones.studies import ACROSS

    models = [str(four_block_dir), str(tiny_model_dir)]
    params = dict(corpus=micro_corpus, profile=None, n_resamples=50, n_permutations=50)
    only = ["layer_ablation", "pruning", ACROSS]
    stages = plan(models, params, root=ROOT, budget="class", only=only)
    last = stages[-1]
    four, six = Path(four_block_dir).name, Path(tiny_model_dir).name
    assert last.name == ACROSS and last.kwargs["models"] == models
    assert set(last.after) == {f"{c} · {m}" for c in ("layer_ablation", "pruning") for m in (four, six)}
    assert last.kwargs["seq_len"] == 48 and "seq_len=64 → 48 (for four-blocks" in last.fitted[0]  # fits both
    assert ACROSS not in [s.chapter for s in plan(models, dict(corpus=micro_corpus), root=ROOT, only=["pruning"])]

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    lines = []
    out = tmp_path / "out"
    result = study(models, params, budget="class", only=only, out_dir=out, root=ROOT, progress=False,
                   log=lines.append)
    assert result.jobs["status"].tolist() == ["done"] * 5 and result.jobs["job"].iloc[-1] == ACROSS
    across = pd.read_csv(out / ACROSS / "models.csv")
    assert across["model"].tolist() == [four, six]  # one row per studied model
    for name in ("rho_by_model", "profiles_on_depth"):
        page = (out / ACROSS / f"{name}.html").read_text()
        assert "vega-embed" in page and "cdn.jsdelivr" not in page  # its scripts inside: opens offline
        assert json.loads((out / ACROSS / f"{name}.json").read_text())["$schema"].startswith("https://vega")
    assert any(line.startswith("across models: ") and "rho_by_model.html" in line for line in lines)


def test_a_resumed_job_keeps_the_seconds_of_the_run_that_computed_it(tiny_model_dir, tmp_path, monkeypatch):
    """Issue 53: jobs.csv lost a resumed job's original seconds (the rerun read its tables back from
    the cache in a fraction of the time, and that was all the table kept)."""
    import zones
    from zones.studies import JOB_COLUMNS

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    run = dict(n_resamples=50, only=["alpha_profile"], out_dir=tmp_path / "out", root=ROOT, progress=False,
               log=lambda _: None)
    first = zones.study([str(tiny_model_dir)], **run)
    record = json.loads((tmp_path / "out" / STATE_FILE).read_text())
    record["jobs"][0]["seconds"] = record["jobs"][0]["computed_seconds"] = 123.0   # as if it took long
    (tmp_path / "out" / STATE_FILE).write_text(json.dumps(record))
    again = zones.study([str(tiny_model_dir)], **run)
    assert "computed_seconds" in JOB_COLUMNS and first["computed"].tolist() != [0]
    assert again["computed"].tolist() == [0] and again["computed_seconds"].tolist() == [123.0]
    assert again["seconds"].tolist() != [123.0]   # this run's own time, beside it
