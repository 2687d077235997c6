"""Snapshots of checkpoint series read from weight files alone: equal to the in-memory α table
for every family, bounded memory, cached by fingerprint, and clear errors on bad checkpoints."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model
from transformers import AutoModelForCausalLM

from zones.core.cache import CacheError, entry_path, sidecar_path
from zones.core.executors import JobFailed
from zones.core.weights import iter_checkpoint_matrices
from zones.series import checkpoints, spectral_snapshot
from zones.series.checkpoints import Checkpoint, CheckpointError, checkpoint_snapshot, lifecycle_snapshots

pytestmark = pytest.mark.usefixtures("one_thread")
VALUES = ["stable_rank", "alpha_shape", "alpha_esd"]


def save_series(root: Path, family: str, steps=(0, 10, 20), n_layers: int = 3) -> list[Path]:
    """Tiny models of ``family`` saved as checkpoint directories ``root/step-N`` (no tokenizer)."""
    paths = []
    for k, step in enumerate(steps):
        path = root / f"step-{step}"
        tiny_model(family, n_layers=n_layers, seed=k).save_pretrained(path, safe_serialization=True)
        paths.append(path)
    return paths


def in_memory_rows(path: Path) -> pd.DataFrame:
    """What zones.series records for a model in memory: alpha_table on the loaded model."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return spectral_snapshot(model, step=0).drop(columns="step")


@pytest.mark.parametrize("budget", [None, 20_000])
def test_streamed_rows_equal_the_in_memory_alpha_table_for_every_family(family, budget, tmp_path):
    path = save_series(tmp_path, family, steps=(7,))[0]
    rows = checkpoint_snapshot(Checkpoint(str(path), 7), memory_budget=budget and budget / 2**20).rows
    expected = in_memory_rows(path)
    assert rows[["layer", "role"]].values.tolist() == expected[["layer", "role"]].values.tolist()
    np.testing.assert_allclose(rows[VALUES].to_numpy(), expected[VALUES].to_numpy(), rtol=1e-12, atol=0)


def test_matrices_stream_in_groups_within_the_memory_budget(tmp_path, monkeypatch):
    path = save_series(tmp_path, "llama", steps=(0,), n_layers=4)[0]
    sizes, real = [], checkpoints.spectral_table

    def spy(matrices, **kwargs):
        sizes.append(sum(m.numel() * 8 for m in matrices))
        return real(matrices, **kwargs)

    monkeypatch.setattr(checkpoints, "spectral_table", spy)
    largest = max(m.numel() * 8 for _, _, m in iter_checkpoint_matrices(path))
    budget = 2 * largest
    rows = checkpoints.snapshot_rows(iter_checkpoint_matrices(path), memory_budget=budget / 2**20)  # MB
    assert len(rows) == 4 * 7 and len(sizes) > 1
    assert max(sizes) <= budget
    sizes.clear()
    checkpoints.snapshot_rows(iter_checkpoint_matrices(path), memory_budget=None)
    assert len(sizes) == 1  # no bound: everything at once


def test_only_the_weights_are_read_never_a_model_or_tokenizer(tmp_path, monkeypatch):
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("a model or tokenizer was built")

    save_series(tmp_path, "gpt_neox")
    for name in ("AutoTokenizer", "AutoModelForCausalLM", "AutoConfig"):
        monkeypatch.setattr(transformers, name, type(name, (), {"from_pretrained": staticmethod(refuse),
                                                                "from_config": staticmethod(refuse)}))
    table = lifecycle_snapshots(str(tmp_path / "step-*"), progress=False)
    assert list(table.columns) == checkpoints.SNAPSHOT_COLUMNS
    assert sorted(table["step"].unique()) == [0, 10, 20] and len(table) == 3 * 3 * 6


def test_steps_come_from_metadata_then_names_and_order_the_series(tmp_path):
    a = save_series(tmp_path / "a", "gpt2", steps=(0,))[0]
    b = tmp_path / "runs" / "checkpoint-500"
    shutil.copytree(a, b)
    c = tmp_path / "runs" / "final"
    shutil.copytree(a, c)
    (c / "trainer_state.json").write_text(json.dumps({"global_step": 900}))
    d = tmp_path / "runs" / "weird"
    shutil.copytree(a, d)
    (d / "zones-checkpoint.json").write_text(json.dumps({"step": 50}))
    series = checkpoints.resolve_checkpoints([str(c), str(b), str(d), str(a)])
    assert [s.step for s in series] == [0, 50, 500, 900]
    assert [s.step for s in checkpoints.resolve_checkpoints(str(tmp_path / "runs" / "*"))] == [50, 500, 900]
    (tmp_path / "runs" / "nostep").mkdir()
    shutil.copy(a / "config.json", tmp_path / "runs" / "nostep")
    with pytest.raises(CheckpointError, match="cannot tell the training step of .*nostep"):
        checkpoints.resolve_checkpoints(str(tmp_path / "runs" / "*"))
    with pytest.raises(CheckpointError, match="two checkpoints claim step 500"):
        checkpoints.resolve_checkpoints([str(b), str(b)])
    with pytest.raises(CheckpointError, match="no checkpoint directories match"):
        checkpoints.resolve_checkpoints(str(tmp_path / "nothing-*"))


def test_hub_revisions_take_their_step_from_the_name_and_fetch_only_config_and_weights(tmp_path, monkeypatch):
    import huggingface_hub

    local = {f"step{s}": p for s, p in zip((0, 1000, 143000), save_series(tmp_path, "gpt_neox", (0, 1, 2)))}
    asked = []

    def fake_download(repo_id, revision=None, allow_patterns=None, **kwargs):
        asked.append((repo_id, revision, tuple(allow_patterns)))
        return str(local.get((repo_id, revision), local.get(revision)))

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    table = lifecycle_snapshots("EleutherAI/pythia-160m@step143000,step0,step1000", progress=False)
    assert sorted(table["step"].unique()) == [0, 1000, 143000]
    assert table["step"].iloc[0] == 0  # ordered by step
    assert {r for _, r, _ in asked} == {"step0", "step1000", "step143000"}
    assert all(repo == "EleutherAI/pythia-160m" for repo, _, _ in asked)
    assert all("config.json" in p and not any("tokenizer" in x for x in p) for _, _, p in asked)
    expected = in_memory_rows(local["step1000"])
    got = table[table["step"] == 1000].reset_index(drop=True)
    np.testing.assert_allclose(got[VALUES].to_numpy(), expected[VALUES].to_numpy(), rtol=1e-12)
    with pytest.raises(CheckpointError, match="names no training step"):
        checkpoints.hub_checkpoints("EleutherAI/pythia-160m", ["main"])

    # Two models' series at once: each is one depth, named by its model, for Δα across sizes.
    deeper = save_series(tmp_path / "deeper", "gpt_neox", (0, 5), n_layers=5)
    local.update({("EleutherAI/pythia-410m", f"step{s}"): p for s, p in zip((0, 5), deeper)})
    both = lifecycle_snapshots(["EleutherAI/pythia-160m@step0,step1000", "EleutherAI/pythia-410m@step0,step5"],
                               progress=False)
    assert len(both) == 2 * 3 * 6 + 2 * 5 * 6
    assert list(both.columns[:2]) == ["model", "depth"]
    assert both.groupby("model")["depth"].unique().map(list).to_dict() == {
        "EleutherAI/pythia-160m": [3], "EleutherAI/pythia-410m": [5]}


def test_an_extended_sweep_computes_only_the_new_checkpoints_and_a_changed_weight_is_recomputed(
        tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))  # identical weights elsewhere share entries
    paths = save_series(tmp_path, "llama", steps=(0, 10, 20))
    computed = []
    real = checkpoints.snapshot_rows
    monkeypatch.setattr(checkpoints, "snapshot_rows", lambda entries, **kw: computed.append(1) or real(entries, **kw))
    first = lifecycle_snapshots([str(p) for p in paths[:2]], progress=False)
    assert len(computed) == 2
    extended = lifecycle_snapshots([str(p) for p in paths], progress=False)
    assert len(computed) == 3  # only step 20 was new
    pd.testing.assert_frame_equal(extended[extended["step"] < 20].reset_index(drop=True), first)

    from safetensors.torch import load_file, save_file

    weights = paths[1] / "model.safetensors"
    tensors = load_file(weights)
    tensors["model.layers.2.mlp.down_proj.weight"][3, 5] += 1.0  # one element of one matrix
    save_file(tensors, weights, metadata={"format": "pt"})
    again = lifecycle_snapshots([str(p) for p in paths], progress=False)
    assert len(computed) == 4  # the edited checkpoint has a new fingerprint
    changed = (again[VALUES] != extended[VALUES]).any(axis=1)
    assert set(again.loc[changed, "step"]) == {10} and set(again.loc[changed, "layer"]) == {2}


def _damage(entry: Path, how: str) -> None:
    """A cached snapshot edited as the reliability run did: values x10, one layer's rows deleted,
    or the file truncated; the result is a valid parquet file in the first two cases."""
    if how == "truncated":
        entry.write_bytes(entry.read_bytes()[:40])
        return
    table = pd.read_parquet(entry)
    if how == "values x10":
        table[VALUES] = table[VALUES] * 10
    else:
        table = table[table["layer"] != 1]
    table.to_parquet(entry, index=False)


@pytest.mark.parametrize("how", ["values x10", "rows deleted", "truncated"])
def test_a_damaged_snapshot_entry_is_one_error_naming_it_and_refresh_replaces_it(tmp_path, how):
    """Before: values x10 were used, deleted rows gave a short table, and --refresh kept the entry."""
    path = save_series(tmp_path, "gpt2", steps=(0,))[0]
    first = checkpoint_snapshot(Checkpoint(str(path), 0))
    entry = entry_path("snapshots", first.key_parts)
    assert sidecar_path(entry).exists() and "_entry" in json.loads(sidecar_path(entry).read_text())
    _damage(entry, how)
    with pytest.raises(CacheError) as err:
        checkpoint_snapshot(Checkpoint(str(path), 0))
    message = str(err.value)
    assert str(entry) in message and f"delete {entry}" in message and "\n" not in message
    with pytest.raises(JobFailed) as err:  # the series: no table built on it, no retry either
        lifecycle_snapshots([str(path)], progress=False)
    assert f"CacheError: cache entry {entry} is damaged" in str(err.value) and "1 attempt)" in str(err.value)
    refreshed = checkpoint_snapshot(Checkpoint(str(path), 0), refresh=True)
    assert refreshed.computed
    pd.testing.assert_frame_equal(refreshed.rows, first.rows)
    again = checkpoint_snapshot(Checkpoint(str(path), 0))  # the entry itself was replaced
    assert not again.computed
    pd.testing.assert_frame_equal(again.rows, first.rows)


def test_an_entry_written_without_a_checksum_is_recomputed_and_replaced(tmp_path):
    path = save_series(tmp_path, "llama", steps=(0,))[0]
    first = checkpoint_snapshot(Checkpoint(str(path), 0))
    entry = entry_path("snapshots", first.key_parts)
    sidecar_path(entry).write_text(json.dumps(first.key_parts))  # as an older zones wrote it
    pd.read_parquet(entry).assign(alpha_shape=0.0).to_parquet(entry, index=False)
    again = checkpoint_snapshot(Checkpoint(str(path), 0))
    assert again.computed
    pd.testing.assert_frame_equal(again.rows, first.rows)
    assert not checkpoint_snapshot(Checkpoint(str(path), 0)).computed


def test_a_series_mixing_architectures_or_shapes_is_one_error_before_computing(tmp_path, monkeypatch):
    """Before: two Llama and one GPT-NeoX checkpoint in one glob gave one table, silently."""
    save_series(tmp_path / "mixed", "llama", steps=(0, 10))
    tiny_model("gpt_neox", n_layers=3).save_pretrained(tmp_path / "mixed" / "step-20")
    monkeypatch.setattr(checkpoints, "snapshot_rows", lambda *a, **k: pytest.fail("computed before the check"))
    with pytest.raises(CheckpointError) as err:
        lifecycle_snapshots(str(tmp_path / "mixed" / "step-*"), progress=False)
    message = str(err.value)
    assert "share an architecture" in message and "llama" in message and "gpt_neox" in message
    assert str(tmp_path / "mixed" / "step-20") in message and "\n" not in message
    save_series(tmp_path / "deeper", "llama", steps=(0,), n_layers=3)
    save_series(tmp_path / "deeper", "llama", steps=(10,), n_layers=4)
    with pytest.raises(CheckpointError, match="has 3 blocks and .* 4"):
        lifecycle_snapshots(str(tmp_path / "deeper" / "step-*"), progress=False)
    from transformers import GPT2Config, GPT2LMHeadModel

    save_series(tmp_path / "wider", "gpt2", steps=(0,))
    small = json.loads((tmp_path / "wider" / "step-0" / "config.json").read_text())
    config = GPT2Config(**{k: v for k, v in small.items() if k in ("n_layer", "n_head", "vocab_size", "n_positions")},
                        n_embd=64)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "wider" / "step-10")
    with pytest.raises(CheckpointError, match=r"block 0 qkv is \(32, 96\) in .* and \(64, 192\) in"):
        lifecycle_snapshots(str(tmp_path / "wider" / "step-*"), progress=False)


@pytest.mark.parametrize("step", [99.9, True, "12", -3])
def test_a_step_that_is_no_integer_is_refused_naming_the_file(tmp_path, step):
    """Before: {"step": 99.9} became step 99 and {"step": true} step 1."""
    path = save_series(tmp_path, "gpt2", steps=(0,))[0]
    meta = path / "zones-checkpoint.json"
    meta.write_text(json.dumps({"step": step}))
    with pytest.raises(CheckpointError) as err:
        checkpoints.checkpoint_step(path)
    assert str(meta) in str(err.value) and "must be an integer" in str(err.value)
    meta.write_text(json.dumps({"step": 99}))
    assert checkpoints.checkpoint_step(path) == 99


def test_bad_checkpoints_give_one_line_naming_the_file(tmp_path):
    path = save_series(tmp_path, "gpt_neox", steps=(0,), n_layers=4)[0]
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(dict(config, num_hidden_layers=6)))
    with pytest.raises(CheckpointError, match="says 6 layers but the weights .* hold 4"):
        checkpoint_snapshot(Checkpoint(str(path), 0))
    (path / "config.json").write_text(json.dumps(config))
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError) as err:
        checkpoint_snapshot(Checkpoint(str(path), 0))
    assert str(weights) in str(err.value) and "\n" not in str(err.value)
    (path / "config.json").write_text(json.dumps(dict(config, model_type="mamba")))
    with pytest.raises(ValueError, match="mamba"):
        checkpoint_snapshot(Checkpoint(str(path), 0))


def test_cli_lifecycle_writes_the_snapshot_table(tmp_path):
    from zones.cli import main

    save_series(tmp_path / "runs", "gpt2")
    out = tmp_path / "out"
    assert main(["lifecycle", "--checkpoints", str(tmp_path / "runs" / "step-*"), "--out", str(out)]) == 0
    table = pd.read_csv(out / "snapshots.csv")
    assert list(table.columns) == checkpoints.SNAPSHOT_COLUMNS and sorted(set(table["step"])) == [0, 10, 20]
    assert main(["lifecycle", "--revisions", "step0", "--out", str(out)]) == 1  # no --model


def test_pytorch_bin_checkpoints_load_without_running_code_in_either_torch_format(tmp_path):
    path = save_series(tmp_path, "gpt2", steps=(0,))[0]
    expected = checkpoint_snapshot(Checkpoint(str(path), 0)).rows
    state = tiny_model("gpt2", n_layers=3, seed=0).state_dict()
    (path / "model.safetensors").unlink()
    for zipfile in (True, False):  # the current format is memory-mapped, the old one loads whole
        torch.save(state, path / "pytorch_model.bin", _use_new_zipfile_serialization=zipfile)
        rows = checkpoint_snapshot(Checkpoint(str(path), 0), refresh=True).rows
        pd.testing.assert_frame_equal(rows, expected)


@pytest.mark.slow
def test_the_default_model_streamed_equals_its_alpha_table(user_cache, tmp_path, monkeypatch):
    from zones.core.models import load_model, resolve_source
    from zones.spectra import alpha_table

    source = resolve_source("smollm2-135m")  # the converted safetensors directory
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))  # compute, do not read the user's entries
    rows = checkpoint_snapshot(Checkpoint(source, 0), memory_budget=64).rows
    expected = alpha_table(load_model(source, device="cpu").model, cache=False)
    assert len(rows) == 30 * 7
    np.testing.assert_allclose(rows[VALUES].to_numpy(), expected[VALUES].to_numpy(), rtol=1e-10)


def test_an_unreachable_hub_fails_fast_in_one_line_naming_the_revision(monkeypatch):
    import time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(Exception) as err:
        checkpoint_snapshot(Checkpoint("EleutherAI/pythia-160m", 1000, "step1000"))
    assert time.perf_counter() - start < 10
    message = str(err.value)
    assert "EleutherAI/pythia-160m@step1000" in message and "\n" not in message


def test_cli_lifecycle_refuses_a_damaged_entry_and_refresh_replaces_it(tmp_path, capsys):
    """Before: one layer's rows deleted gave a short snapshots.csv ("from the cache"), and
    --refresh wrote correct rows but kept the damaged entry for the next run."""
    from zones.cli import main

    paths = save_series(tmp_path / "runs", "llama", steps=(0, 10))
    args = ["lifecycle", "--checkpoints", str(tmp_path / "runs" / "step-*"), "--out", str(tmp_path / "out")]
    assert main(args) == 0
    full = pd.read_csv(tmp_path / "out" / "snapshots.csv")
    entry = entry_path("snapshots", checkpoint_snapshot(Checkpoint(str(paths[1]), 10)).key_parts)
    _damage(entry, "rows deleted")
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"cache entry {entry} is damaged" in err and f"delete {entry}" in err
    assert main([*args, "--refresh"]) == 0
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / "snapshots.csv"), full)
    assert main(args) == 0  # the next run reads the replaced entry
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / "snapshots.csv"), full)
