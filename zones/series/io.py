"""A training run on disk: the resumable checkpoint of a run in progress, the finished run's
model directory (weights, tokenizer, ``history.csv``, ``snapshots.parquet``, ``run.json``) and
reading it back. Every directory is written with ``zones.core.atomic.atomic_directory`` and carries a
manifest (``zones.core.manifest.write_manifest``) that is verified on every read, so an edited history or
a replaced weight file is one ``CacheError`` naming the file and what to delete."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from safetensors import safe_open
from safetensors.torch import load as safetensors_tensors
from safetensors.torch import save as safetensors_bytes
from torch import nn

from zones.core.atomic import atomic_directory, atomic_write_text
from zones.core.cache import CacheError, cache_dir, cache_key, sidecar_path
from zones.core.data import load_corpus
from zones.core.entries import read_entry, write_entry
from zones.core.manifest import verify_manifest, write_manifest
from zones.core.models import load_model
from zones.core.tables import read_table, write_table
from zones.series.config import VERSION, TrainConfig

SNAPSHOT_COLUMNS = ["step", "layer", "role", "stable_rank", "alpha_shape", "alpha_esd"]
HISTORY_COLUMNS = ["step", "lr", "train_loss", "heldout_loss", "tokens_seen", "seconds"]
CHECKPOINT_FILE = "checkpoint.safetensors"  # tensors + a JSON header: no pickle is ever loaded
RUN_FILE = "run.json"


@dataclass
class TrainedRun:
    """A finished run: its model directory, config, loss history, spectral snapshots, summary.

    ``summary`` holds ``depth, width, heads, seed, parameters, steps, tokens_seen, total_seconds``
    (training, held-out evaluation and snapshots), ``train_seconds`` (optimizer steps only),
    ``eval_seconds, snapshot_seconds, snapshot_fraction`` (of the total),
    ``initial_heldout_loss, final_heldout_loss, device``.
    """

    path: Path
    config: TrainConfig
    history: pd.DataFrame
    snapshots: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def load(self, device: str | None = None):
        """The trained model through ``zones.core.models.load_model`` (a ``LoadedModel``)."""
        return load_model(str(self.path), device=device)


def run_key(config: TrainConfig, corpus_fingerprint: str) -> dict[str, Any]:
    """The cache key dict of a run: every parameter, the corpus and the code version."""
    return dict(version=VERSION, corpus_fingerprint=corpus_fingerprint, **config.as_dict())


def run_path(config: TrainConfig) -> Path:
    """Where the finished run of ``config`` lives (whether or not it exists yet)."""
    return cache_dir() / "train" / cache_key(run_key(config, load_corpus(config.corpus).fingerprint))


def partial_path(final_dir: Path) -> Path:
    """The folder of a run in progress (its checkpoint) beside the finished run's folder."""
    return final_dir.with_name(final_dir.name + ".partial")


def is_finished(path: Path) -> bool:
    return (Path(path) / RUN_FILE).exists()


def load_run(path: str | Path) -> TrainedRun:
    """A finished run from its directory, every file checked against the directory's manifest
    (``CacheError`` naming the changed file and what to delete)."""
    path = Path(path)
    meta_path = path / RUN_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"{path} holds no {RUN_FILE}: not a finished training run")
    meta = json.loads(meta_path.read_text())
    if not verify_manifest(path, meta["key"]):
        raise FileNotFoundError(f"{path} has no zones-manifest.json (written by an older zones); delete the "
                                f"folder {path} to train the run again")
    settings = {k: v for k, v in meta["config"].items() if k in {f.name for f in fields(TrainConfig)}}
    settings["betas"] = tuple(settings["betas"])
    return TrainedRun(path, TrainConfig(**settings), read_table(path / "history.csv"),
                      read_table(path / "snapshots.parquet"), meta["summary"])


def save_model_directory(target: Path, model: nn.Module, tokenizer, meta: dict) -> None:
    """A loadable model directory (config, safetensors weights, tokenizer) with ``meta`` (its
    step, ...) in ``zones-checkpoint.json``."""
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    atomic_write_text(Path(target) / "zones-checkpoint.json", json.dumps(meta, indent=2))


def save_snapshot_model(partial_dir: Path, step: int, model: nn.Module, tokenizer, meta: dict) -> None:
    """Keep the model of a snapshot step as ``<partial>/checkpoints/step-NNNNNN``."""
    with atomic_directory(partial_dir / "checkpoints" / f"step-{step:06d}") as tmp:
        save_model_directory(tmp, model, tokenizer, dict(meta, step=step))


def write_run(final_dir: Path, key: dict, config: TrainConfig, model: nn.Module, tokenizer, history: pd.DataFrame,
              snapshots: pd.DataFrame, summary: dict, kept: Path | None = None) -> None:
    """The finished run's directory, written atomically with its manifest. ``kept`` is a
    folder of snapshot models moved in as ``checkpoints/``."""
    with atomic_directory(final_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if kept is not None:
            kept.rename(tmp / "checkpoints")
        write_table(history, tmp / "history.csv")
        write_table(snapshots, tmp / "snapshots.parquet")
        atomic_write_text(tmp / RUN_FILE, json.dumps(dict(config=config.as_dict(), key=key, summary=summary),
                                                     indent=2, default=str))
        write_manifest(tmp, key)


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, torch.Tensor)):
        return float(value)
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint")


class DamagedCheckpoint(RuntimeError):
    """A run's checkpoint whose bytes fail their checksum, or that cannot be read or verified:
    never resumed. ``reason``: what is wrong, naming the file (one line)."""

    def __init__(self, path: Path, reason: str):
        self.path, self.reason = Path(path), reason
        super().__init__(f"{reason}; delete {Path(path).parent} to train this run from step 0")


def write_checkpoint(path: Path, key: dict, model: nn.Module, optimizer: torch.optim.Optimizer,
                     state: dict) -> None:
    """Weights, optimizer state and the run's state so far, in one safetensors file.

    The run's identity (``key``), its state (step, logs) and the optimizer's non-tensor
    state live as JSON in the file's header, so a reader checks the identity before it
    reads a single tensor. Written with ``zones.core.entries.write_entry`` (atomically, with the
    sha256 of its bytes in the sidecar ``checkpoint.json``), so one flipped byte is found on
    reading.
    """
    saved = optimizer.state_dict()
    tensors = {f"model.{name}": t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    scalars = {}
    for index, entry in saved["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{name}"] = value
    header = dict(key=key, state=state, param_groups=saved["param_groups"], optimizer_scalars=scalars)
    data = safetensors_bytes(tensors, metadata={"zones": json.dumps(header, default=_json_default)})
    write_entry(path, key, data, format="zones training checkpoint")


def _checkpoint_header(data: bytes) -> dict:
    """The ``zones`` header of a safetensors file's bytes (8-byte length, then the JSON header)."""
    length = int.from_bytes(data[:8], "little")
    return json.loads(json.loads(data[8:8 + length])["__metadata__"]["zones"])


def load_checkpoint(path: Path, key: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore ``model`` and ``optimizer`` from ``write_checkpoint``'s file and return the run's
    state. The run identity is checked before any tensor is read (a checkpoint of another run is
    a ``RuntimeError`` naming the file and what to delete); a file whose bytes differ from the
    sha256 recorded beside it, that has no checksum, or that cannot be read is a
    :class:`DamagedCheckpoint`, never resumed."""
    path = Path(path)

    def damaged(err: Exception) -> DamagedCheckpoint:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return DamagedCheckpoint(path, f"checkpoint {path} is damaged or incomplete ({type(err).__name__}: {first})")

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            same_run = json.loads((handle.metadata() or {})["zones"]).get("key") == key
    except Exception as err:  # noqa: BLE001 - a truncated file, a foreign file, a bad header
        raise damaged(err) from None
    if not same_run:
        raise RuntimeError(f"checkpoint {path} belongs to another run; delete {path.parent} to train this run "
                           f"from step 0")
    try:
        found = read_entry(path, key)
    except CacheError as err:
        cause = err.cause or str(err).split("; delete")[0]
        raise DamagedCheckpoint(path, f"checkpoint {path} is damaged ({cause})") from None
    if found is None:
        raise DamagedCheckpoint(path, f"checkpoint {path} has no checksum beside it ({sidecar_path(path).name}: "
                                      f"written by an older zones, or cut short) and cannot be verified")
    data = found[0]
    try:
        header, tensors = _checkpoint_header(data), safetensors_tensors(data)
        model.load_state_dict({n[len("model."):]: t for n, t in tensors.items() if n.startswith("model.")})
        entries: dict[int, dict] = {}
        for name, value in [*((n[len("optimizer."):], t) for n, t in tensors.items() if n.startswith("optimizer.")),
                            *header["optimizer_scalars"].items()]:
            index, _, field_name = name.partition(".")
            entries.setdefault(int(index), {})[field_name] = value
        groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in header["param_groups"]]
        optimizer.load_state_dict(dict(state=entries, param_groups=groups))
        return header["state"]
    except Exception as err:  # noqa: BLE001 - tensors that do not fit this run's model
        raise damaged(err) from None
