"""Loading models: local directories, the built-in default, and clear errors."""
import json
from pathlib import Path

import pytest
import torch

from zones.core.adapters import UnsupportedArchitectureError, get_adapter
from zones.core.models import ModelLoadError, load_model, model_fingerprint


def test_local_directory_loads_in_eval_mode(tiny_model_dir):
    loaded = load_model(str(tiny_model_dir), device="cpu")
    assert not loaded.model.training
    assert get_adapter(loaded.model).n_blocks == 6
    assert loaded.tokenizer("hello world")["input_ids"]
    assert load_model(str(tiny_model_dir), device="cpu").fingerprint == loaded.fingerprint


def test_fingerprint_changes_with_the_weights(tiny_model_dir):
    model = load_model(str(tiny_model_dir), device="cpu").model
    before = model_fingerprint(model)
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[0, 0] += 1.0
    assert model_fingerprint(model) != before


def test_missing_paths_are_clear_errors(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nothing.gguf"))
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model("./no/such/model")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path))


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="not a built-in alias"):
        load_model("zones-test/definitely-not-a-model")


def test_unsupported_architecture_fails_before_loading_weights(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    # No weights file: the architecture check must fail first.
    with pytest.raises(UnsupportedArchitectureError, match="Supported families"):
        load_model(str(tmp_path))


def test_remote_code_never_runs_unless_asked(tmp_path):
    marker = tmp_path / "ran.txt"
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "zones_custom", "auto_map": {"AutoConfig": "custom.CustomConfig",
                                                   "AutoModelForCausalLM": "custom.CustomModel"}}))
    (tmp_path / "custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(Exception):
        load_model(str(tmp_path))
    assert not marker.exists()


@pytest.mark.slow
def test_default_model_has_30_llama_blocks(user_cache):
    loaded = load_model("smollm2-135m", device="cpu")
    assert loaded.model.config.model_type == "llama"
    assert get_adapter(loaded.model).n_blocks == 30
    assert any((user_cache / "models").glob("SmolLM2-135M-Instruct*/model.safetensors"))


# --- exact fingerprint ---------------------------------------------------------------------


def test_fingerprint_sees_every_element_and_buffer():
    from conftest import tiny_model

    model = tiny_model("llama", n_layers=2)
    before = model_fingerprint(model)
    embed = model.get_input_embeddings().weight  # 256 x 32: more than 4096 values
    with torch.no_grad():
        embed.view(-1)[1] += 1e-3  # one value off any stride
    edited = model_fingerprint(model)
    assert edited != before
    with torch.no_grad():
        embed.view(-1)[1] -= 1e-3
        assert model_fingerprint(model) == before
        model.model.rotary_emb.inv_freq[-1] *= 2  # a buffer, not a parameter
    assert model_fingerprint(model) != before


# --- config against weights ----------------------------------------------------------------


def _saved_tiny(path, family="llama", n_layers=4, tokenizer=None):
    from conftest import tiny_model

    tiny_model(family, n_layers=n_layers).save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def _edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("change, expected", [
    ({"num_hidden_layers": 6}, "missing from the weights.*model.layers.4"),
    ({"num_hidden_layers": 2}, "in the weights but not in the config.*model.layers.2"),
    ({"intermediate_size": 48}, "of a different shape"),
])
def test_config_that_disagrees_with_its_weights_is_an_error(tmp_path, change, expected):
    _edit_config(_saved_tiny(tmp_path), **change)
    with pytest.raises(ModelLoadError, match=f"config.json does not match its weights: .*{expected}"):
        load_model(str(tmp_path), device="cpu", load_tokenizer=False)
    loaded = load_model(str(tmp_path), device="cpu", load_tokenizer=False, allow_mismatch=True)
    assert get_adapter(loaded.model).n_blocks == loaded.model.config.num_hidden_layers


# --- the tokenizer is optional -------------------------------------------------------------


def test_weights_only_directory_needs_no_tokenizer_unless_asked(tmp_path, tiny_model_dir, family):
    _saved_tiny(tmp_path, family)
    loaded = load_model(str(tmp_path), device="cpu", load_tokenizer=False)
    assert loaded.tokenizer is None and get_adapter(loaded.model).n_blocks == 4
    with pytest.raises(ModelLoadError, match=f"^{tmp_path} has no tokenizer; pass --tokenizer PATH"):
        load_model(str(tmp_path), device="cpu")
    with_tokenizer = load_model(str(tmp_path), device="cpu", tokenizer=str(tiny_model_dir))
    assert with_tokenizer.tokenizer("hello")["input_ids"]
    assert with_tokenizer.fingerprint == loaded.fingerprint


# --- every local load failure says what is wrong -------------------------------------------


def test_bad_json_config_is_named(tmp_path):
    _saved_tiny(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "llama",')
    with pytest.raises(ModelLoadError, match=r"config.json is not valid JSON \(.*line 1") as err:
        load_model(str(tmp_path), device="cpu")
    assert "hub" not in str(err.value) and "\n" not in str(err.value)


def test_pickle_only_weights_are_refused_unread(tmp_path):
    import pickle

    marker = tmp_path / "unpickled.txt"

    class Planted:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    _saved_tiny(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    (tmp_path / "pytorch_model.bin").write_bytes(pickle.dumps(Planted()))
    with pytest.raises(ModelLoadError, match="pytorch_model.bin: pickle-only weights are refused") as err:
        load_model(str(tmp_path), device="cpu")
    assert "hub" not in str(err.value)
    assert not marker.exists()


def test_damaged_safetensors_are_named(tmp_path):
    _saved_tiny(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelLoadError, match=f"^{weights} is damaged .*re-download or re-save"):
        load_model(str(tmp_path), device="cpu", load_tokenizer=False)


def test_config_from_a_newer_transformers_is_refused(tmp_path):
    _saved_tiny(tmp_path)
    _edit_config(tmp_path, transformers_version="99.0.0")
    with pytest.raises(ModelLoadError, match="written by transformers 99.0.0"):
        load_model(str(tmp_path), device="cpu", load_tokenizer=False)


# --- sequence length and vocabulary --------------------------------------------------------


def test_windows_longer_than_the_positions_or_beyond_the_vocabulary_are_refused(family):
    from conftest import tiny_model

    from zones.core.models import check_windows_fit

    model = tiny_model(family, n_layers=1)  # 256 positions (RoPE for llama and gpt_neox), 256 ids
    check_windows_fit(model, torch.zeros(2, 256, dtype=torch.long))
    with pytest.raises(ValueError, match="--seq-len 300 exceeds the model's 256 positions"):
        check_windows_fit(model, torch.zeros(2, 300, dtype=torch.long))
    ids = torch.zeros(2, 16, dtype=torch.long)
    ids[1, 3] = 300
    with pytest.raises(ValueError, match="tokenizer ids up to 300 exceed the model's vocabulary of 256"):
        check_windows_fit(model, ids)


# --- offline hub look-ups fail fast ---------------------------------------------------------


@pytest.fixture
def unreachable_hub(monkeypatch):
    """No offline variable, and a hub endpoint that refuses connections (a closed local port)."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")


def test_unreachable_hub_fails_fast_with_one_line(unreachable_hub):
    import time

    start = time.perf_counter()
    with pytest.raises(ModelLoadError, match="'zones-test/not-a-model' .*hub id: the hub is unreachable "
                                             ".*pass a local model directory") as err:
        load_model("zones-test/not-a-model")
    assert time.perf_counter() - start < 10  # not 26-28 s of retries
    assert "\n" not in str(err.value)


def test_unreachable_wikitext_fails_fast_with_one_line(unreachable_hub):
    import time

    from zones.core.data import CorpusError, load_corpus

    start = time.perf_counter()
    with pytest.raises(CorpusError, match=r"wikitext2 \(test\): the hub is unreachable .*--corpus"):
        load_corpus("wikitext2")
    assert time.perf_counter() - start < 10


# --- GGUF conversion: plain tensors, concurrent first uses, damaged copies ------------------


def test_gguf_converts_to_plain_safetensors(tiny_gguf):
    from safetensors import safe_open

    from zones.core.models import converted_gguf_dir

    loaded = load_model(str(tiny_gguf), device="cpu")
    assert get_adapter(loaded.model).n_blocks == 2 and len(loaded.tokenizer) == 400
    target = converted_gguf_dir(tiny_gguf)
    config = json.loads((target / "config.json").read_text())
    assert "quantization_config" not in config
    with safe_open(str(target / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(k).dtype for k in weights.keys()} == {torch.float32}


def test_concurrent_first_conversions_both_succeed(tiny_gguf, tmp_path):
    import os
    import subprocess
    import sys

    convert = ("import sys; from pathlib import Path; from zones.core.models import converted_gguf_dir; "
               "print(converted_gguf_dir(Path(sys.argv[1])))")
    env = dict(os.environ, ZONES_CACHE=str(tmp_path), OMP_NUM_THREADS="1")
    runs = [subprocess.Popen([sys.executable, "-c", convert, str(tiny_gguf)], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-500:] for _, err in outputs]
    targets = {out.strip().splitlines()[-1] for out, _ in outputs}
    assert len(targets) == 1
    (target,) = targets
    assert (Path(target) / "model.safetensors").exists()
    assert [p.name for p in (tmp_path / "models").iterdir() if p.is_dir()] == [Path(target).name]


def test_deleted_weights_and_killed_conversions_are_repaired(tiny_gguf, tmp_path, monkeypatch):
    from zones.core.atomic import mark_temporary
    from zones.core.models import converted_gguf_dir

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    target = converted_gguf_dir(tiny_gguf)
    fingerprint = load_model(str(tiny_gguf), device="cpu").fingerprint
    (target / "model.safetensors").unlink()  # cached weights deleted by hand
    stale = target.parent / f".{target.name}.killed.tmp"  # a killed conversion's folder, marked as zones'
    stale.mkdir()
    mark_temporary(stale)
    assert load_model(str(tiny_gguf), device="cpu").fingerprint == fingerprint
    assert not stale.exists()
    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a torn copy
    assert load_model(str(tiny_gguf), device="cpu").fingerprint == fingerprint


def test_legacy_buffers_that_transformers_ignores_are_not_a_mismatch(tmp_path):
    """Old Pythia and GPT-2 checkpoints carry attention-mask buffers the model no longer has."""
    from safetensors.torch import load_file, save_file

    for family, extra in (("gpt_neox", ["gpt_neox.layers.0.attention.bias", "gpt_neox.layers.0.attention.masked_bias",
                                        "gpt_neox.layers.0.attention.rotary_emb.inv_freq"]),
                          ("gpt2", ["transformer.h.0.attn.bias"])):
        path = _saved_tiny(tmp_path / family, family)
        weights = load_file(path / "model.safetensors")
        weights.update({name: torch.ones(4) for name in extra})
        save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
        assert get_adapter(load_model(str(path), device="cpu", load_tokenizer=False).model).n_blocks == 4


def test_an_edited_converted_copy_is_converted_again_not_used(tiny_gguf, tmp_path, monkeypatch, capsys):
    """Values edited in place (a whole, readable safetensors file) were used as they were."""
    from safetensors.torch import load_file, save_file

    from zones.core.models import converted_gguf_dir

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    target = converted_gguf_dir(tiny_gguf)
    fingerprint = load_model(str(tiny_gguf), device="cpu").fingerprint
    weights = load_file(target / "model.safetensors")
    weights = {name: tensor * 10 for name, tensor in weights.items()}
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    assert load_model(str(tiny_gguf), device="cpu").fingerprint == fingerprint
    said = capsys.readouterr().err  # one line naming the damaged file, on stderr (issue 40)
    assert f"is damaged: {target / 'model.safetensors'}" in said and f"converting {tiny_gguf.name} again" in said
    assert (target / "zones-manifest.json").exists()
