"""Peak RSS of one checkpoint's snapshot on the default model: streamed vs whole model.

    .venv/bin/python benchmarks/bench_rss.py            # runs each mode in a fresh subprocess
"""
import os
import subprocess
import sys
import tempfile

MODES = {
    "baseline (import torch + zones, no work)": "None",
    "streamed, 64 MB budget": "stream(64 * 2**20)",
    "streamed, 256 MB budget (default)": "stream(256 * 2**20)",
    "streamed, no budget (all matrices at once)": "stream(None)",
    "load_model + alpha_table (whole model in memory)": "whole()",
}
CHILD = r'''
import os, sys, time, resource, json
import torch
from zones.series import checkpoints
from zones.core.models import resolve_source, load_model
from zones.spectra import alpha_table
source = resolve_source("smollm2-135m")
def stream(budget):
    return checkpoints.checkpoint_snapshot(checkpoints.Checkpoint(source, 0), memory_budget=budget, refresh=True).rows
def whole():
    return alpha_table(load_model("smollm2-135m", device="cpu").model, cache=False, estimators=("shape", "esd", "companions"))
start = time.perf_counter()
rows = MODE
seconds = time.perf_counter() - start
status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l)
print(json.dumps(dict(peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, seconds=seconds,
                      rss_anon=status.get("RssAnon", "").strip(), rss_file=status.get("RssFile", "").strip())))
'''
if __name__ == "__main__":
    env = dict(os.environ, ZONES_CACHE=tempfile.mkdtemp(), TQDM_DISABLE="1")
    models = os.path.expanduser("~/.cache/zones/models")
    os.symlink(models, os.path.join(env["ZONES_CACHE"], "models"))  # reuse the converted default model
    for label, call in MODES.items():
        out = subprocess.run([sys.executable, "-c", CHILD.replace("MODE", call)], env=env, capture_output=True, text=True)
        line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 else out.stderr.strip().splitlines()[-1]
        print(f"{label:52s} {line}", flush=True)
