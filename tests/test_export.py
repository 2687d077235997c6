"""zones.pruning.export: a pruned model as a plain Hugging Face directory, reloaded without zones."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model

from zones.core.data import make_windows
from zones.measure.blocks import skip_blocks
from zones.measure.scoring import evaluate_loss
from zones.pruning.export import PROVENANCE, ExportError, choose_removed, export_model, pruned_copy, read_provenance

# Runs in a fresh interpreter that never imports zones: loss on the windows, and greedy
# generation with and without the KV cache.
RELOAD = r"""
import json, sys
import numpy as np, torch
from transformers import AutoModelForCausalLM
directory, ids_file = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(directory).eval()
ids = torch.from_numpy(np.load(ids_file))
with torch.no_grad():
    logits = model(input_ids=ids, use_cache=False).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
    prompt = ids[:1, :8]
    kw = dict(max_new_tokens=12, do_sample=False, pad_token_id=0)
    cached = model.generate(prompt, use_cache=True, **kw)[0].tolist()
    uncached = model.generate(prompt, use_cache=False, **kw)[0].tolist()
print(json.dumps(dict(loss=float(nll), cached=cached, uncached=uncached,
                      n_layers=model.config.num_hidden_layers, zones="zones" in sys.modules)))
"""


def reload_elsewhere(directory: Path, ids: torch.Tensor, tmp_path: Path) -> dict:
    ids_file = tmp_path / "ids.npy"
    np.save(ids_file, ids.numpy())
    script = tmp_path / "reload.py"
    script.write_text(RELOAD)
    done = subprocess.run([sys.executable, str(script), str(directory), str(ids_file)], capture_output=True,
                          text=True, cwd=tmp_path, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                                        "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def windows(n: int = 3, seq_len: int = 24, vocab: int = 256):
    rng = np.random.default_rng(0)
    return make_windows(rng.integers(0, vocab, size=n * seq_len * 2), seq_len, "eval", n * (seq_len - 1))


def test_export_round_trips_in_plain_transformers(family, tmp_path, one_thread):
    model = tiny_model(family, n_layers=5)
    removed = [1, 3]
    win = windows()
    with skip_blocks(model, removed):
        expected = evaluate_loss(model, win).loss
    out = export_model(model, removed, tmp_path / "pruned", source="tiny", strategy="manual")
    found = reload_elsewhere(out, win.input_ids, tmp_path)
    assert not found["zones"]
    assert found["n_layers"] == 3
    assert abs(found["loss"] - expected) < 1e-5
    assert found["cached"] == found["uncached"]
    assert len(found["cached"]) == 8 + 12
    record = read_provenance(out)
    assert record["removed"] == removed and record["kept"] == [0, 2, 4] and record["strategy"] == "manual"
    assert record["source_blocks"] == 5 and len(record["source_fingerprint"]) == 16
    assert (out / "model.safetensors").exists() and (out / PROVENANCE).exists()


def test_pruned_copy_renumbers_blocks_and_leaves_the_source(family):
    model = tiny_model(family, n_layers=5)
    before = [p.clone() for p in model.parameters()]
    pruned = pruned_copy(model, [0, 2])
    indices = sorted({m.layer_idx for m in pruned.modules() if getattr(m, "layer_idx", None) is not None})
    assert indices == [0, 1, 2]
    assert pruned.config.num_hidden_layers == 3 and model.config.num_hidden_layers == 5
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_pruned_copy_copies_only_the_kept_blocks(family):
    """The removed blocks are left out of the copy, not copied and dropped (~1 s a copy of the
    default model); the copy equals the kept blocks of the source, parameter for parameter."""
    from zones.core.adapters import get_adapter

    model = tiny_model(family, n_layers=5)
    blocks = get_adapter(model).blocks()
    for i in (1, 3):
        object.__setattr__(blocks[i], "__deepcopy__", lambda memo, i=i: pytest.fail(f"removed block {i} copied"))
    pruned = pruned_copy(model, [1, 3])
    kept = [blocks[i] for i in (0, 2, 4)]
    copies = get_adapter(pruned).blocks()
    assert len(copies) == 3 and all(c is not b for c, b in zip(copies, kept))
    for copy_, block in zip(copies, kept):
        pairs = list(zip(copy_.parameters(), block.parameters()))
        assert pairs and all(torch.equal(a, b) and a.data_ptr() != b.data_ptr() for a, b in pairs)
    outside = [(n, p) for n, p in model.named_parameters() if ".h." not in n and ".layers." not in n]
    found = dict(pruned.named_parameters())
    assert all(torch.equal(found[n], p) for n, p in outside)


def test_per_block_config_lists_are_pruned():
    model = tiny_model("llama", n_layers=4)
    model.config.layer_types = ["full_attention"] * 3 + ["sliding_attention"]
    pruned = pruned_copy(model, [1])
    assert pruned.config.layer_types == ["full_attention", "full_attention", "sliding_attention"]


def test_export_refuses_bad_requests(tmp_path):
    model = tiny_model("llama", n_layers=3)
    with pytest.raises(ExportError, match="names block 5, but the model has blocks 0..2"):
        export_model(model, [5], tmp_path / "x")
    with pytest.raises(ExportError, match="at least one block must remain"):
        export_model(model, [0, 1, 2], tmp_path / "x")
    assert not (tmp_path / "x").exists()
    gpt2 = tiny_model("gpt2", n_layers=3)
    gpt2.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ExportError, match="layer_idx"):
        export_model(gpt2, [1], tmp_path / "y")


def test_choose_removed_follows_the_strategy():
    model = tiny_model("llama", n_layers=6)
    assert choose_removed(model, "last_n", 2) == [5, 4]
    with pytest.raises(ExportError, match="--k must be"):
        choose_removed(model, "last_n", 9)


def test_cli_export_with_a_strategy(tiny_model_dir, tmp_path, one_thread):
    from zones.cli import main

    out = tmp_path / "cli-pruned"
    assert main(["export", "--model", str(tiny_model_dir), "--strategy", "last_n_keep_last", "--k", "2",
                 "--out", str(out), "--device", "cpu"]) == 0
    record = read_provenance(out)
    assert record["strategy"] == "last_n_keep_last" and record["removed"] == [3, 4]
    assert (out / "tokenizer.json").exists()
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4
    assert main(["export", "--model", str(tiny_model_dir), "--remove", "0,2", "--out", str(out),
                 "--device", "cpu"]) == 0
    assert read_provenance(out)["removed"] == [0, 2]


@pytest.mark.slow
def test_default_model_export_round_trips(user_cache, tmp_path):
    from zones.core.data import corpus_windows
    from zones.core.models import load_model

    loaded = load_model("smollm2-135m", device="cpu")
    win = corpus_windows("stdlib", loaded.tokenizer, 64, "eval", 2 * 63)
    removed = [3, 11, 20, 27]
    with skip_blocks(loaded.model, removed):
        expected = evaluate_loss(loaded.model, win).loss
    out = export_model(loaded.model, removed, tmp_path / "smollm2-pruned", tokenizer=loaded.tokenizer,
                       source="smollm2-135m", fingerprint=loaded.fingerprint)
    found = reload_elsewhere(out, win.input_ids, tmp_path)
    assert found["n_layers"] == 26 and not found["zones"]
    assert abs(found["loss"] - expected) < 1e-5
    assert found["cached"] == found["uncached"]
