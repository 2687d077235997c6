"""Loading models: local directories, the built-in default, and clear errors."""
import json

import pytest
import torch

from zones.adapters import UnsupportedArchitectureError, get_adapter
from zones.models import ModelLoadError, load_model, model_fingerprint


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
