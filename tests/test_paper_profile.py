"""benchmarks/paper_profile.py: the paper profile's D8/D12/D16 as small tables, run end to end on a
CPU at its tiny size, in a subprocess where altair, Jupyter and the network cannot be reached
(as on the GPU machine it is written for)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import transformers

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "paper_profile.py"
BLOCKED = ("altair", "vl_convert", "jupyter_book", "papermill", "nbclient", "myst_nb", "ipykernel")
ROLES = {"q", "k", "v", "o", "mlp_in", "mlp_out"}

RUNNER = """
import runpy, socket, sys
for name in {blocked!r}:
    sys.modules[name] = None  # import fails: the script must not need it

def no_network(*args, **kwargs):
    raise OSError("the network is blocked in this test")

socket.socket.connect = no_network
socket.create_connection = no_network
sys.argv = [{script!r}, *{args!r}]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as stop:
    if stop.code:
        raise
"""


def load_script():
    spec = importlib.util.spec_from_file_location("paper_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tiny_series(micro_corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("paper-profile") / "tables"
    cache = tmp_path_factory.mktemp("fresh-cache")
    args = ["--tiny", "--device", "cpu", "--out", str(out), "--override", f"corpus={micro_corpus}"]
    env = dict(os.environ, ZONES_CACHE=str(cache), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")
    env.pop("ZONES_GIT_COMMIT", None)
    code = RUNNER.format(blocked=BLOCKED, script=str(SCRIPT), args=args)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


def test_the_tiny_paper_profile_writes_only_small_tables_with_altair_and_the_network_blocked(tiny_series):
    out, stdout = tiny_series
    assert sorted(p.name for p in out.iterdir()) == ["ablation.csv", "history.csv", "provenance.json",
                                                     "snapshots.csv"]  # no weights
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("paper_profile: 3 of 3 depths finished, 9,216 tokens trained"), last
    assert "tables in" in last


def test_history_snapshots_and_ablation_hold_one_finite_row_set_per_depth(tiny_series):
    out, _ = tiny_series
    history, snapshots, ablation = (pd.read_csv(out / f"{name}.csv") for name in ("history", "snapshots", "ablation"))
    assert list(history.columns) == ["depth", "seed", "step", "lr", "train_loss", "heldout_loss", "tokens_seen",
                                     "seconds"]
    assert list(snapshots.columns) == ["depth", "seed", "step", "layer", "role", "stable_rank", "alpha_shape",
                                       "alpha_esd"]
    assert list(ablation.columns) == ["depth", "seed", "layer", "loss", "base_loss", "delta_loss", "delta_loss_low",
                                      "delta_loss_high", "n_tokens"]
    for table in (history, snapshots, ablation):
        assert sorted(table["depth"].unique()) == [8, 12, 16] and set(table["seed"]) == {0}
    for depth, runs in history.groupby("depth"):
        assert runs["step"].tolist() == [0, 6, 12]  # --tiny: 12 steps, held-out loss every 6
        assert np.isfinite(runs["heldout_loss"]).all() and np.isfinite(runs["train_loss"].iloc[1:]).all()
        assert runs["heldout_loss"].iloc[-1] < runs["heldout_loss"].iloc[0]
    for depth, snaps in snapshots.groupby("depth"):
        assert sorted(snaps["step"].unique()) == [0, 2, 4, 6, 12]  # every 6 steps, every 2 up to step 4, the last
        assert (snaps.groupby("step").size() == depth * len(ROLES)).all()
        assert set(snaps["role"]) == ROLES and set(snaps["layer"]) == set(range(depth))
    assert np.isfinite(snapshots[["stable_rank", "alpha_shape", "alpha_esd"]]).all().all()
    assert (snapshots["stable_rank"] >= 1).all()
    for depth, blocks in ablation.groupby("depth"):
        assert blocks["layer"].tolist() == list(range(depth))
    values = ablation[["loss", "base_loss", "delta_loss", "delta_loss_low", "delta_loss_high"]]
    assert np.isfinite(values).all().all()
    assert (ablation["delta_loss_low"] <= ablation["delta_loss"]).all()
    assert (ablation["delta_loss"] <= ablation["delta_loss_high"]).all()
    assert (ablation["n_tokens"] == 1023).all()  # --tiny: 1,024 held-out tokens in windows of 32 → 33 windows of 31


def test_provenance_names_the_code_machine_versions_configs_seconds_and_tokens(tiny_series, micro_corpus):
    out, _ = tiny_series
    provenance = json.loads((out / "provenance.json").read_text())
    assert isinstance(provenance["git_commit"], str) and provenance["git_commit"]
    assert provenance["device"] == "cpu" and provenance["device_name"]
    assert provenance["torch"] == torch.__version__ and provenance["transformers"] == transformers.__version__
    assert provenance["profile"] == "paper" and provenance["tiny"] is True and not provenance["stopped_early"]
    assert [r["depth"] for r in provenance["runs"]] == [8, 12, 16]
    for run in provenance["runs"]:
        config = run["config"]
        assert config["depth"] == run["depth"] and config["corpus"] == micro_corpus
        assert config["steps"] == 12 and config["precision"] == "fp32" and config["width_per_layer"] == 4
        assert run["complete"] and run["ablation"] == "scored" and run["n_snapshots"] == 5
        assert run["tokens_trained"] == 12 * config["batch_size"] * config["seq_len"]
        assert run["flops_6nd"] == 6 * run["parameters"] * run["tokens_trained"]
        assert all(math.isfinite(s) and s >= 0 for s in run["seconds"].values())
    assert provenance["tokens_trained"] == sum(r["tokens_trained"] for r in provenance["runs"])
    assert provenance["seconds_total"] >= sum(r["seconds"]["wall"] for r in provenance["runs"])


def test_a_time_limit_stops_training_and_writes_what_is_done(micro_corpus, tmp_path, monkeypatch, capsys):
    """Stopped in depth 8: its history and snapshots so far are written, it is not ablated, and
    depths 12 and 16 do not start."""
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("ZONES_GIT_COMMIT", "abc1234")  # what a copy of the tree without .git is told
    script = load_script()
    assert script.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "out"), "--time-limit", "2",
                        "--override", f"corpus={micro_corpus}", "--override", "steps=100000",
                        "--log-every", "1000"]) == 0
    provenance = json.loads((tmp_path / "out" / "provenance.json").read_text())
    assert provenance["stopped_early"] and provenance["not_started"] == [12, 16]
    assert provenance["git_commit"] == "abc1234"
    (run,) = provenance["runs"]
    assert run["depth"] == 8 and not run["complete"] and 0 < run["steps_done"] < 100000
    assert run["ablation"].startswith("not scored")
    history = pd.read_csv(tmp_path / "out" / "history.csv")
    assert len(history) >= 1 and set(history["depth"]) == {8}
    assert pd.read_csv(tmp_path / "out" / "ablation.csv").empty
    assert "0 of 3 depths finished" in capsys.readouterr().out.strip().splitlines()[-1]
