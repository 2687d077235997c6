"""Reading a model directory's weight files without building a model.

A checkpoint directory holds ``config.json`` and its weights: ``model.safetensors`` (or its
shards, listed by ``model.safetensors.index.json``), else ``pytorch_model.bin`` (or its
shards). This module reads them one tensor at a time:

- ``SafetensorsFile``: the header, checked against the file's size, then each tensor's bytes
  by a plain read (no memory map, so the file's pages never count against the process);
- ``load_bin``: a ``pytorch_model.bin`` with ``weights_only=True`` (no pickled code is ever
  run: untrusted files are never unpickled), memory-mapped when its format allows;
- ``WeightReader``: the tensors of a directory by name, as float32;
- ``iter_checkpoint_matrices``: every block matrix as (layer, role, (out, in) matrix), named
  and split by the family's ``zones.core.adapters`` adapter (its ``block_prefixes``,
  ``weight_keys`` and ``split_qkv``), exactly as the adapter returns them for a loaded model.

Every failure is a ``CheckpointError``, one line naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

import torch

from zones.core.adapters import Adapter, adapter_for_model_type
from zones.core.models import is_pickle_refusal, pickle_refused

SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                      "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                      "U8": torch.uint8, "BOOL": torch.bool}


class CheckpointError(ValueError):
    """A checkpoint (a model directory's config and weights) could not be found, read or
    understood (the message names it)."""


def weight_files(directory: Path, required: bool = True) -> list[Path]:
    """The weight files of a model directory: safetensors shards, else pytorch_model*.bin."""
    directory = Path(directory)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (directory / index).exists():
            try:
                shards = sorted(set(json.loads((directory / index).read_text())["weight_map"].values()))
            except (ValueError, KeyError) as err:
                raise CheckpointError(f"{directory / index} is not a weight index ({err}); re-download it") from None
            return [directory / s for s in shards]
        if (directory / single).exists():
            return [directory / single]
    files = sorted(directory.glob("*.safetensors"))
    if not files and required:
        raise CheckpointError(f"{directory} holds no weights (model.safetensors, its shards, or pytorch_model.bin)")
    return files


def read_config(directory: Path) -> dict:
    """The directory's ``config.json`` as a dict."""
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} ({err}); it must be a transformers config.json") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path} is not a JSON object; it must be a transformers config.json")
    return config


def config_adapter(config: dict, path: Path) -> type[Adapter]:
    """The adapter of a config's ``model_type`` (``UnsupportedArchitectureError`` names the
    supported families)."""
    model_type = config.get("model_type")
    if not model_type:
        raise CheckpointError(f"{path} has no model_type; not a transformers config")
    return adapter_for_model_type(model_type)


def n_layers(config: dict) -> int:
    """The number of decoder blocks a config declares."""
    return int(config.get("num_hidden_layers", config.get("n_layer", 0)))


class SafetensorsFile:
    """One safetensors file read tensor by tensor with plain reads (no memory map), so only the
    tensor asked for is ever in memory. The header is checked against the file's size."""

    def __init__(self, path: Path):
        self.path = path
        size = path.stat().st_size
        with open(path, "rb") as handle:
            head = handle.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 0 < n <= min(size - 8, 100_000_000):
                raise ValueError(f"header length {n} does not fit a file of {size} bytes")
            header = json.loads(handle.read(n))
        header.pop("__metadata__", None)
        self._start = 8 + n
        for name, info in header.items():
            begin, end = info["data_offsets"]
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            numel = 1
            for dim in info["shape"]:
                numel *= dim
            if end - begin != numel * dtype.itemsize or self._start + end > size:
                raise ValueError(f"tensor {name} runs past the end of the file or has the wrong size")
        self._header = header

    def keys(self):
        return self._header.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._header[name]["shape"])

    def get_tensor(self, name: str) -> torch.Tensor:
        info = self._header[name]
        begin, end = info["data_offsets"]
        with open(self.path, "rb") as handle:
            handle.seek(self._start + begin)
            data = bytearray(handle.read(end - begin))
        dtype = SAFETENSORS_DTYPES[info["dtype"]]
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        return flat.reshape(info["shape"])


def load_bin(path: Path) -> dict:
    """A ``pytorch_model.bin`` with no code run (``weights_only=True``), memory-mapped when its
    format allows (pages are read when a tensor is used); an old-format file loads whole."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as err:
        if "mmap" not in str(err):
            raise
        print(f"zones: {path} is in torch's old format and cannot be memory-mapped; loading it whole")
        return torch.load(path, map_location="cpu", weights_only=True)


class WeightReader:
    """Tensors of a model directory by name, one at a time, without loading the rest."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.files = weight_files(self.directory)
        self._where: dict[str, Any] = {}
        for path in self.files:
            try:
                handle = SafetensorsFile(path) if path.suffix == ".safetensors" else load_bin(path)
            except Exception as err:
                if is_pickle_refusal(err):  # torch's advice to turn weights_only off is never passed on
                    raise CheckpointError(pickle_refused(path)) from None
                raise CheckpointError(f"cannot read the weights {path} ({type(err).__name__}: {err}); "
                                      f"the file is damaged or incomplete: download or save it again") from None
            for name in handle.keys():
                self._where[name] = handle

    def names(self) -> set[str]:
        return set(self._where)

    def shape(self, name: str) -> tuple[int, ...]:
        """A tensor's shape (from the safetensors header: no data is read)."""
        handle = self._where[name]
        return handle.shape(name) if isinstance(handle, SafetensorsFile) else tuple(handle[name].shape)

    def get(self, name: str) -> torch.Tensor:
        handle = self._where[name]
        tensor = handle.get_tensor(name) if hasattr(handle, "get_tensor") else handle[name]
        return tensor.to(torch.float32)  # as zones.core.models.load_model loads it


def block_prefix(adapter: type[Adapter], names: set[str], directory: Path) -> str:
    """Which of the adapter's ``block_prefixes`` the weight names use (block 0's first key)."""
    first = next(iter(adapter.weight_keys.values()))
    prefix = next((p for p in adapter.block_prefixes if p.format(i=0) + first in names), None)
    if prefix is None:
        raise CheckpointError(f"the weights in {directory} hold no {adapter.block_prefixes[0].format(i=0) + first}: "
                              f"they do not match their config's model_type ({adapter.family} family)")
    return prefix


def iter_checkpoint_matrices(directory: str | Path) -> Iterator[tuple[int, str, torch.Tensor]]:
    """Yield (layer, role, matrix of shape (out, in), float32) for every block matrix of a
    checkpoint directory, reading one tensor at a time; the names, the order and the splitting
    of fused projections are those of the family's ``zones.core.adapters`` adapter."""
    directory = Path(directory)
    config_path = directory / "config.json"
    config = read_config(directory)
    adapter = config_adapter(config, config_path)
    reader = WeightReader(directory)
    names = reader.names()
    prefix = block_prefix(adapter, names, directory)
    first = next(iter(adapter.weight_keys.values()))
    depth = n_layers(config)
    in_weights = sum(1 for i in range(depth + 1) if prefix.format(i=i) + first in names)
    if in_weights != depth:
        raise CheckpointError(f"{config_path} says {depth} layers but the weights in {directory} hold "
                              f"{in_weights}: the config and the weights disagree")
    for layer in range(depth):
        base = prefix.format(i=layer)

        def tensor(key: str) -> torch.Tensor:
            if base + key not in names:
                raise CheckpointError(f"the weights in {directory} lack {base + key}")
            return reader.get(base + key)

        for role, matrix in adapter.matrices(tensor, config).items():
            yield layer, role, matrix


def checkpoint_shapes(directory: str | Path) -> tuple[str, dict[tuple[int, str], tuple | None]]:
    """A checkpoint's family and the stored shape of each block weight, ``(layer, key role)
    -> shape`` (None: absent), from its config and the weight headers (a safetensors tensor is
    not read): the checkpoints of one series must agree on both."""
    directory = Path(directory)
    config = read_config(directory)
    adapter = config_adapter(config, directory / "config.json")
    reader = WeightReader(directory)
    names = reader.names()
    prefix = block_prefix(adapter, names, directory)
    shapes = {(layer, role): reader.shape(key) if key in names else None
              for layer in range(n_layers(config))
              for role, key in adapter.state_dict_keys(layer, prefix).items()}
    return adapter.family, shapes
