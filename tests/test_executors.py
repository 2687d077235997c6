"""Executors: local and Ray give the same table; a failed or killed job is retried or reported
by name, never dropped."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import autogroup_nice, tiny_model

from zones.core.executors import Job, JobFailed, run_jobs
from zones.series import checkpoints
from zones.spectra.alpha_sweep import alpha_sweep

pytestmark = pytest.mark.usefixtures("one_thread")


def flaky(marker: str, value: int, failures: int = 1):
    """Fails its first ``failures`` calls (counted in the file ``marker``), then returns value²."""
    path = Path(marker)
    calls = int(path.read_text()) if path.exists() else 0
    path.write_text(str(calls + 1))
    if calls < failures:
        raise OSError(f"transient failure {calls + 1}")
    return value * value


def dies_once(marker: str, checkpoint):
    """Kills its own process on the first attempt (as an out-of-memory kill would), then computes."""
    if not os.path.exists(marker):
        Path(marker).write_text("died")
        os._exit(1)
    return checkpoints.checkpoint_snapshot(checkpoint)


def always_dies(checkpoint):
    os._exit(1)


def test_local_jobs_return_in_order_and_a_transient_failure_is_retried(tmp_path, capsys):
    jobs = [Job(f"job-{k}", flaky, (str(tmp_path / f"m{k}"), k, 1 if k == 2 else 0)) for k in range(4)]
    assert run_jobs(jobs, progress=False) == [0, 1, 4, 9]
    assert "job job-2 failed (OSError: transient failure 1); retry 1 of 2" in capsys.readouterr().err


def test_a_job_failing_every_attempt_is_reported_by_name_and_no_result_is_returned(tmp_path):
    jobs = [Job("good", flaky, (str(tmp_path / "a"), 3, 0)), Job("ckpt step-7", flaky, (str(tmp_path / "b"), 1, 9))]
    with pytest.raises(JobFailed, match=r"1 of 2 jobs failed: ckpt step-7 \(OSError: transient failure 2; "
                                        r"2 attempts\)"):
        run_jobs(jobs, retries=1, progress=False)
    assert (tmp_path / "b").read_text() == "2"  # bounded: one try and one retry
    with pytest.raises(ValueError, match="executor must be one of 'local', 'ray'; got 'dask'"):
        run_jobs(jobs, "dask")


def test_a_permanent_error_is_reported_at_once_not_retried(tmp_path):
    from zones.series.checkpoints import Checkpoint, checkpoint_snapshot

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "mamba"}')
    job = Job("ckpt", checkpoint_snapshot, (Checkpoint(str(tmp_path / "ckpt"), 0),))
    with pytest.raises(JobFailed, match=r"1 of 1 jobs failed: ckpt \(.*mamba.*; 1 attempt\)"):
        run_jobs([job], retries=3, progress=False)


def save_series(root: Path, steps=(0, 10, 20, 30)) -> list[Path]:
    paths = []
    for k, step in enumerate(steps):
        tiny_model("gpt_neox", n_layers=2, seed=100 + k).save_pretrained(root / f"step-{step}")
        paths.append(root / f"step-{step}")
    return paths


@pytest.fixture(scope="module")
def ray_instance():
    ray = pytest.importorskip("ray", reason='the Ray executor tests need Ray: pip install "zones[ray]"')
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test file
    previous = autogroup_nice("self", -10)  # Ray's agents must start within 15 s: see autogroup_nice
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    finally:
        if previous is not None:
            autogroup_nice("self", previous)
    yield ray
    ray.shutdown()


def test_ray_executor_gives_the_local_table_and_fills_the_drivers_cache(ray_instance, tmp_path, monkeypatch):
    paths = [str(p) for p in save_series(tmp_path)]
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "local-cache"))
    local = checkpoints.lifecycle_snapshots(paths, progress=False)
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "driver-cache"))
    remote = checkpoints.lifecycle_snapshots(paths, executor="ray", progress=False)
    pd.testing.assert_frame_equal(remote, local)
    stored = sorted((tmp_path / "driver-cache" / "snapshots").glob("*.parquet"))
    assert len(stored) == len(paths)  # every result landed in the driver's cache
    computed = []
    monkeypatch.setattr(checkpoints, "snapshot_rows", lambda *a, **k: computed.append(1))
    again = checkpoints.lifecycle_snapshots(paths, progress=False)  # local, from that cache
    assert computed == [] and again.equals(local)


def test_a_killed_ray_job_is_retried_and_one_that_always_dies_is_reported(ray_instance, tmp_path):
    series = checkpoints.resolve_checkpoints([str(p) for p in save_series(tmp_path, steps=(0, 5))])
    marker = str(tmp_path / "died-once")
    jobs = [Job(c.label, dies_once, (marker, c)) for c in series]
    results = run_jobs(jobs, "ray", retries=2, progress=False)
    assert Path(marker).exists()  # one attempt died ...
    expected = [checkpoints.checkpoint_snapshot(c).rows for c in series]
    for result, rows in zip(results, expected):  # ... and its retry computed the same rows
        pd.testing.assert_frame_equal(result.rows, rows)
    with pytest.raises(JobFailed, match=rf"1 of 2 jobs failed: {series[1].label} "
                                        r"\(.*the worker running it died; 2 attempts\)"):
        run_jobs([jobs[0], Job(series[1].label, always_dies, (series[1],))], "ray", retries=1, progress=False)


def test_cli_sweep_stacks_the_alpha_tables_of_several_models(tiny_model_dir, tiny_tokenizer, tmp_path):
    from zones.cli import main
    from zones.core.models import load_model
    from zones.spectra import alpha_table

    other = tmp_path / "gpt2"
    tiny_model("gpt2", n_layers=2, vocab=len(tiny_tokenizer)).save_pretrained(other)
    tiny_tokenizer.save_pretrained(other)
    models = [str(tiny_model_dir), str(other)]
    assert main(["sweep", "--models", ",".join(models), "--out", str(tmp_path / "out")]) == 0
    table = pd.read_csv(tmp_path / "out" / "alpha.csv")
    assert table["model"].drop_duplicates().tolist() == models
    for name in models:
        expected = alpha_table(load_model(name, device="cpu").model)
        got = table[table["model"] == name]
        assert got["alpha_shape"].to_numpy() == pytest.approx(expected["alpha_shape"].to_numpy(), rel=1e-9)
    with pytest.raises(ValueError, match="twice; list each model once"):
        alpha_sweep(models + models[:1])
    with pytest.raises(ValueError, match="one model twice"):  # one model under two spellings (issue 40)
        alpha_sweep(models + [models[0] + "/"])


# --- deterministic errors are not retried; impossible requests fail at once -------------------------

def fails_with(marker: str, error: BaseException):
    """Counts its calls in the file ``marker``, then raises ``error``."""
    path = Path(marker)
    path.write_text(str(int(path.read_text()) + 1 if path.exists() else 1))
    raise error


@pytest.mark.parametrize("error", [RuntimeError("a deterministic bug"), FileNotFoundError(2, "no such file"),
                                   ValueError("bad input")])
def test_a_deterministic_error_is_tried_once(tmp_path, error):
    """Before: anything but ValueError/TypeError/LookupError/ImportError was tried retries + 1 times."""
    from zones.core.cache import CacheError

    for err in (error, CacheError("cache entry x is damaged; delete x")):
        marker = tmp_path / f"calls-{type(err).__name__}"
        with pytest.raises(JobFailed, match="1 attempt\\)"):
            run_jobs([Job("job", fails_with, (str(marker), err))], retries=2, progress=False)
        assert marker.read_text() == "1"


def test_cli_sweep_does_not_retry_a_missing_model(tmp_path, capsys):
    from zones.cli import main

    assert main(["sweep", "--models", str(tmp_path / "missing-model"), "--out", str(tmp_path / "out")]) == 1
    captured = capsys.readouterr()
    assert "retry 1 of" not in captured.err and "does not exist; 1 attempt)" in captured.err


def test_more_cpus_than_the_machine_has_fail_before_ray_starts(monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a fresh process
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    with pytest.raises(ValueError, match=r"job a asks for 100 CPUs but this machine .* has 2; lower "
                                         r"--cpus-per-job to at most 2"):
        run_jobs([Job("a", flaky, ("x", 1), cpus=100)], "ray", progress=False)


def test_more_cpus_than_the_ray_cluster_has_fail_at_once(ray_instance, tmp_path):
    """Before: the job waited for 100 CPUs forever (0/1, no message)."""
    import signal

    def hung(*_):
        raise TimeoutError("run_jobs waited for resources the cluster does not have")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        with pytest.raises(ValueError, match=r"asks for 100 CPUs but the Ray cluster .* has 2"):
            run_jobs([Job("a", flaky, (str(tmp_path / "m"), 1), cpus=100)], "ray", progress=False)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def draws_its_own_bar(steps: int) -> int:
    """A job that runs a tool with its own progress bar (as lm-eval, datasets or a training loop
    do), explicitly enabled, and says one line of its own."""
    from tqdm import tqdm

    for _ in tqdm(range(steps), desc="nested-bar", disable=False, mininterval=0):
        pass
    print("a line of the job's own", file=sys.stderr)
    return steps


def test_the_bar_counts_each_jobs_work_and_other_bars_stay_out_of_its_line(capsys):
    jobs = [Job("a", draws_its_own_bar, (20,), work=3.0), Job("b", draws_its_own_bar, (30,), work=5.0)]
    assert run_jobs(jobs, progress=True, desc="study", unit="RF") == [20, 30]
    err = capsys.readouterr().err
    assert "nested-bar" not in err  # nothing of the job's own bar reaches the terminal
    assert "a line of the job's own" in err  # its other lines do, above the bar
    assert "8.0/8.0 RF" in err and "3.0/8.0 RF" in err  # the bar's total is the jobs' work; a job adds its own
    assert sys.stderr is not None and type(sys.stderr).__name__ != "_NestedBars"  # put back


def test_the_time_left_is_the_work_left_at_the_measured_rate(monkeypatch):
    from zones.core import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    bar = progress.WorkBar({"a": 1.0, "b": 3.0}, "jobs", "RF", enabled=False)
    assert bar.total == 4.0 and bar.seconds_left(0.0) is None  # no figure before any work is counted
    now[0] = 100.0
    bar.finish("a")
    assert bar.position() == 1.0
    assert bar.seconds_left(bar.position()) == pytest.approx(300.0)  # 3 RF left at 100 s per RF
    bar.close()

    live = progress.WorkBar({"a": 1.0, "b": 3.0}, "jobs", "RF", enabled=False, live=True)
    live.start("b")
    progress.add_flops(1.5 * progress.REFERENCE_FLOPS)  # the running job counts half its expected work
    assert live.position() == pytest.approx(1.5)
    progress.add_flops(10 * progress.REFERENCE_FLOPS)  # more than expected: never done before it ends
    assert live.position() == pytest.approx(progress.RUNNING_CAP * 3.0)
    live.finish("b")
    assert live.position() == 3.0
    live.close()


def test_the_work_bar_shows_its_text_right_after_the_bar_with_no_stray_characters():
    """Issue 53: tqdm's postfix put "| ," after the bar. Now the bar's text follows it directly."""
    import io

    from zones.core import progress

    out = io.StringIO()
    bar = progress.WorkBar({"a {x}": 1.0}, "zones study", "RF", file=out)
    bar.redraw("running a {x}")
    bar.close()
    drawn = out.getvalue().split("\r")[-1]
    assert "| ," not in out.getvalue() and "| 0.0/1.0 RF computed, 00:00 elapsed, estimating the time left; running a {x}" \
        in drawn, drawn


def test_cached_work_is_not_progress_and_the_time_left_counts_each_jobs_fixed_cost(monkeypatch):
    """Issue 53: the study's bar opened at 40% (a cached training counted as done work), and its time
    left was the work left at one rate (at 1:00 of a 3:57 study: 1:17 left). Now a job read from the
    cache leaves the bar's total and is counted apart, and each job left is expected to take what
    the finished jobs of its kind took, a fixed cost plus a rate per unit of work."""
    from zones.core import progress

    now = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    works = {"train · a": 4.0, "pruning · m1": 1.0, "pruning · m2": 3.0, "healing · m1": 2.0, "healing · m2": 2.0}
    bar = progress.WorkBar(works, "zones study", "RF", enabled=False)
    bar.start("train · a")
    now[0] = 1.0
    progress.mark_from_cache("train · a")  # as the study says it, before the bar finishes the job
    bar.finish("train · a")
    assert bar.position() == 0.0 and bar.computed_total() == 8.0  # not progress: out of the total
    assert "0.0/8.0 RF computed (4.0 RF read from the cache)" in bar.text()
    assert bar.seconds_left() is None  # nothing computed yet: no figure (not the cache's speed)
    for name, seconds in (("pruning · m1", 12.0), ("pruning · m2", 16.0)):  # 10 s + 2 s per RF
        bar.start(name)
        now[0] += seconds
        bar.finish(name)
    # healing never ran: it takes what pruning took per job (the only kind measured), 10 s + 2 s per RF each
    assert bar.seconds_left() == pytest.approx(2 * (10 + 2 * 2.0) * (now[0] - 0.0) / (1.0 + 12.0 + 16.0))
    bar.start("healing · m1")
    now[0] += 20.0
    bar.finish("healing · m1")  # healing's own cost, measured: 20 s; m2 is expected to take as long
    busy = 1.0 + 12.0 + 16.0 + 20.0
    assert bar.seconds_left() == pytest.approx(20.0 * now[0] / busy)
    bar.close()


def test_a_jobs_cost_is_a_fixed_part_and_a_rate_fitted_to_the_jobs_that_finished():
    from zones.core.progress import job_cost_model

    assert job_cost_model([]) is None
    assert job_cost_model([(2.0, 10.0)]) == (0.0, 5.0)  # one job: its rate
    assert job_cost_model([(1.0, 11.0), (3.0, 13.0)]) == pytest.approx((10.0, 1.0))
    assert job_cost_model([(1.0, 13.0), (3.0, 11.0)]) == pytest.approx((12.0, 0.0))  # never a negative rate
    assert job_cost_model([(1.0, 1.0), (3.0, 9.0)]) == pytest.approx((0.0, 2.5))  # nor a negative fixed cost


def test_the_work_bar_writes_no_cursor_codes_when_another_bar_is_alive():
    """Issue 53: ``[A`` escape codes in the study's output: another tqdm alive (a tool's, left open)
    pushed the bar to line 2, and every redraw moved the cursor up."""
    import io

    from tqdm.auto import tqdm

    from zones.core import progress

    other = tqdm(total=3, file=io.StringIO())
    out = io.StringIO()
    try:
        with progress.WorkBar({"a": 1.0, "b": 2.0}, "zones study", "RF", file=out) as bar:
            bar.start("a")
            bar.finish("a")
            tqdm.write("a line above the bar", file=out)
    finally:
        other.close()
    assert "\x1b[A" not in out.getvalue() and "a line above the bar" in out.getvalue()


def test_a_dead_raylets_log_tail_stays_out_of_the_studys_lines():
    """Issue 53: at a node kill, 43 lines of the head raylet's ``[state-dump]`` log reached the
    study's output through Ray's driver warning; its first sentence is kept, the tail dropped."""
    import io
    import logging

    from zones.core.executors import RaylogFilter

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RaylogFilter())
    logger = logging.getLogger("ray._private.worker.test-zones")
    logger.addHandler(handler)
    try:
        logger.warning("Raylet is terminated: ip=10.0.0.2, id=abc. Termination is unexpected. Last 20 lines of the "
                       "Raylet logs:\n    [state-dump] NodeManager.deadline_timer - 1 total\n    [state-dump] x")
        logger.warning("an ordinary warning stays as it is")
    finally:
        logger.removeHandler(handler)
    said = stream.getvalue()
    assert "[state-dump]" not in said and "Raylet is terminated: ip=10.0.0.2" in said
    assert "an ordinary warning stays as it is" in said and said.count("\n") == 2
