"""Ray executor overhead per job against local, on tiny checkpoints (computed, not cached).

    .venv/bin/python benchmarks/bench_ray.py
"""
import os
import sys
import tempfile
import time

os.environ["ZONES_CACHE"] = tempfile.mkdtemp()
os.environ["TQDM_DISABLE"] = "1"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torch

torch.set_num_threads(1)
from conftest import tiny_model

from zones.core.executors import Job, run_jobs
from zones.series import checkpoints

N = 16
root = tempfile.mkdtemp()
for k in range(N):
    tiny_model("gpt_neox", n_layers=4, seed=k).save_pretrained(f"{root}/step-{k}")
series = checkpoints.resolve_checkpoints(f"{root}/step-*")
jobs = [Job(c.label, checkpoints.checkpoint_snapshot, (c,), dict(refresh=True)) for c in series]

def timed(executor, repeats=3):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run_jobs(jobs, executor, progress=False)
        best = min(best, time.perf_counter() - start)
    return best

local = timed("local")
import ray

for cpus in (1, 2):
    start = time.perf_counter()
    ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    init = time.perf_counter() - start
    run_jobs(jobs[:cpus], "ray", progress=False)  # start the workers
    remote = timed("ray")
    noop = [Job(f"noop-{k}", abs, (k,)) for k in range(200)]
    start = time.perf_counter(); run_jobs(noop, "ray", progress=False); dispatch = (time.perf_counter() - start) / 200
    ray.shutdown()
    print(f"  ray dispatch of a no-op job: {1000 * dispatch:.2f} ms/job")
    print(f"{N} jobs: local {local:.3f} s ({1000 * local / N:.1f} ms/job); ray num_cpus={cpus}: {remote:.3f} s "
          f"({1000 * remote / N:.1f} ms/job, overhead {1000 * (remote - local) / N:+.1f} ms/job); ray.init {init:.1f} s")
