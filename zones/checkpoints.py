"""Spectral snapshots of a series of checkpoints, read from their weight files alone.

A checkpoint series is what a public training run publishes (Pythia's ``step0`` …
``step143000`` hub revisions), a glob of local checkpoint directories, or the checkpoints a
``zones train --keep-checkpoints`` run kept. For each checkpoint this module computes the
same snapshot rows the training run records (``zones.train.SNAPSHOT_COLUMNS``: ``step, layer,
role, stable_rank, alpha_shape, alpha_esd``)::

    table = lifecycle_snapshots("runs/*/checkpoint-*")                      # local directories
    table = lifecycle_snapshots("EleutherAI/pythia-160m@step0,step1000")   # hub revisions
    table = lifecycle_snapshots(train_run="results/train")                # a zones train run

Only the weights are read: no forward pass, no tokenizer, no model object. Matrices are
streamed one at a time from the safetensors shards (``SafetensorsFile``: the header, then
each tensor's bytes by a plain read, no memory map, so the file's pages never count against
the process; a ``pytorch_model.bin`` is memory-mapped with ``weights_only=True``) and handed to
``zones.spectra.spectral_table`` in groups of at most ``memory_budget`` bytes (as float64),
so peak memory is bounded by the budget plus one matrix, not by the model's size.

Each checkpoint's rows are cached (``cache_dir()/snapshots``) under its fingerprint, the
SHA-256 of its config and weight files' bytes, so an extended or interrupted sweep only
computes what is new. The checkpoints run as independent jobs through ``zones.executors``
(``local`` in-process, or ``ray``); whichever ran them, the driver stores every result in its
own cache and assembles one table.
"""
from __future__ import annotations

import glob as globlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import pandas as pd
import torch

VERSION = "checkpoints-1"  # bump when the rows computed from a checkpoint change
SNAPSHOT_COLUMNS = ["step", "layer", "role", "stable_rank", "alpha_shape", "alpha_esd"]
ESTIMATORS = ("shape", "esd", "companions")  # exactly what zones.train.spectral_snapshot computes
DEFAULT_MEMORY_BUDGET = 256 * 2**20  # bytes of float64 matrices handed to the spectra at once
CHECKPOINT_META = "zones-checkpoint.json"  # written by zones train --keep-checkpoints: {"step": N, ...}
STEP_IN_NAME = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_]?(\d+)", re.IGNORECASE)


class CheckpointError(ValueError):
    """A checkpoint could not be found, read or understood (the message names it)."""


@dataclass(frozen=True)
class Checkpoint:
    """One point of a series: where its weights are and which training step it is.

    ``source`` is a local directory or a hub id; ``revision`` the hub revision (None: local);
    ``depth`` is set when the series stacks several runs (a ``zones train`` series).
    """

    source: str
    step: int
    revision: str | None = None
    depth: int | None = None

    @property
    def label(self) -> str:
        return f"{self.source}@{self.revision}" if self.revision else self.source


# --- which checkpoints --------------------------------------------------------------------------

def hub_checkpoints(model: str, revisions: Iterable[str]) -> list[Checkpoint]:
    """One checkpoint per hub revision of ``model``; the step is the revision's ``step(\\d+)``."""
    revisions = [r.strip() for r in revisions if r and r.strip()]
    if not revisions:
        raise CheckpointError(f"no revisions given for {model!r}; pass e.g. step0,step1000")
    out = []
    for revision in revisions:
        match = re.fullmatch(r".*?step[-_]?(\d+)", revision)
        if match is None:
            raise CheckpointError(f"revision {revision!r} of {model!r} names no training step; "
                                  f"use revisions such as step1000")
        out.append(Checkpoint(model, int(match.group(1)), revision))
    return _ordered(out)


def checkpoint_step(directory: str | Path) -> int:
    """The training step of a checkpoint directory, from its metadata or its name.

    Read in this order: ``zones-checkpoint.json`` (``step``), ``trainer_state.json``
    (``global_step``, as the ``transformers`` Trainer writes), then the directory's name
    (``step-1000``, ``checkpoint-1000``, ``step1000``).
    """
    directory = Path(directory)
    for name, key in ((CHECKPOINT_META, "step"), ("trainer_state.json", "global_step")):
        path = directory / name
        if path.exists():
            try:
                return int(json.loads(path.read_text())[key])
            except (ValueError, KeyError, TypeError) as err:
                raise CheckpointError(f"{path} has no readable {key!r} ({err}); fix or delete it") from None
    match = STEP_IN_NAME.search(directory.name) or re.fullmatch(r"\D*?(\d+)", directory.name)
    if match is None:
        raise CheckpointError(f"cannot tell the training step of {directory}: it has no {CHECKPOINT_META} "
                              f"or trainer_state.json and no step number in its name (e.g. step-1000)")
    return int(match.group(1))


def directory_checkpoints(paths: str | Path | Sequence[str | Path]) -> list[Checkpoint]:
    """Checkpoints from local directories: a glob pattern or a list of paths, ordered by step."""
    if isinstance(paths, (str, Path)):
        pattern = str(Path(paths).expanduser())
        found = sorted(globlib.glob(pattern)) if globlib.has_magic(pattern) else [pattern]
        if not found:
            raise CheckpointError(f"no checkpoint directories match {pattern!r}")
    else:
        found = [str(Path(p).expanduser()) for p in paths]
    out = []
    for path in found:
        if not (Path(path) / "config.json").exists():
            raise CheckpointError(f"{path} holds no config.json: not a checkpoint directory")
        out.append(Checkpoint(str(path), checkpoint_step(path)))
    return _ordered(out)


def train_run_checkpoints(directory: str | Path) -> list[Checkpoint]:
    """The checkpoints a ``zones train --keep-checkpoints`` run kept.

    ``directory`` is one run (the model directory ``zones train`` prints, holding ``run.json``)
    or a ``zones train --out`` folder (its ``series.csv`` lists the runs; each checkpoint then
    carries its run's ``depth``).
    """
    directory = Path(directory).expanduser()
    if (directory / "run.json").exists():
        runs = [(directory, None)]
    elif (directory / "series.csv").exists():
        series = pd.read_csv(directory / "series.csv")
        runs = [(Path(p), int(d)) for p, d in zip(series["path"], series["depth"])]
    else:
        raise CheckpointError(f"{directory} is neither a training run (run.json) nor a zones train "
                              f"output folder (series.csv)")
    out = []
    for run, depth in runs:
        kept = sorted((run / "checkpoints").glob("step-*"))
        if not kept:
            raise CheckpointError(f"the run {run} kept no checkpoints; train it with zones train "
                                  f"--keep-checkpoints")
        out.extend(Checkpoint(str(p), checkpoint_step(p), depth=depth) for p in kept)
    return _ordered(out)


def resolve_checkpoints(checkpoints: Any = None, model: str | None = None,
                        revisions: Iterable[str] | str | None = None,
                        train_run: str | Path | None = None) -> list[Checkpoint]:
    """Any description of a series as an ordered list of ``Checkpoint``.

    Exactly one of: ``model`` with ``revisions`` (hub revisions, a list or comma-separated);
    ``train_run`` (see ``train_run_checkpoints``); ``checkpoints``: a glob or a list of local
    directories, ``"HUB_ID@rev1,rev2,..."``, a list of ``"HUB_ID@rev"``, or ``Checkpoint``s.
    """
    given = [x is not None for x in (checkpoints, revisions, train_run)]
    if sum(given) != 1:
        raise CheckpointError("give exactly one of checkpoints, revisions (with a model) or train_run")
    if revisions is not None:
        if not model:
            raise CheckpointError("revisions need the model they belong to (e.g. EleutherAI/pythia-160m)")
        return hub_checkpoints(model, revisions.split(",") if isinstance(revisions, str) else revisions)
    if train_run is not None:
        return train_run_checkpoints(train_run)
    items = [checkpoints] if isinstance(checkpoints, (str, Path, Checkpoint)) else list(checkpoints)
    if not items:
        raise CheckpointError("the list of checkpoints is empty")
    if all(isinstance(c, Checkpoint) for c in items):
        return _ordered(items)
    out: list[Checkpoint] = []
    for item in items:
        text = str(item)
        if "@" in text and not Path(text).expanduser().exists():
            hub_id, _, revs = text.partition("@")
            out.extend(hub_checkpoints(hub_id, revs.split(",")))
        else:
            out.extend(directory_checkpoints(text))
    return _ordered(out)


def _series_key(c: Checkpoint) -> tuple:
    """Which series a checkpoint belongs to: its run's depth, or its hub repository."""
    return (c.depth or 0, c.source if c.revision else "")


def _ordered(checkpoints: list[Checkpoint]) -> list[Checkpoint]:
    ordered = sorted(checkpoints, key=lambda c: (*_series_key(c), c.step))
    seen: dict[tuple, Checkpoint] = {}
    for c in ordered:
        other = seen.setdefault((*_series_key(c), c.step), c)
        if other is not c:
            raise CheckpointError(f"two checkpoints claim step {c.step}: {other.label} and {c.label}")
    return ordered


# --- the files of one checkpoint ------------------------------------------------------------------

# what a hub checkpoint needs besides config.json: safetensors if it has them, else the .bin files
WEIGHT_PATTERNS = (["*.safetensors", "*.safetensors.index.json"],
                   ["pytorch_model*.bin", "pytorch_model.bin.index.json"])


def local_directory(checkpoint: Checkpoint) -> Path:
    """The directory holding the checkpoint's config and weights (fetched from the hub if needed:
    only ``config.json`` and the weight files, preferring safetensors)."""
    if checkpoint.revision is None:
        return Path(checkpoint.source)
    from huggingface_hub import snapshot_download

    from .hub import HubUnreachableError, hub_lookup

    try:
        with hub_lookup(checkpoint.label, "run where the hub is reachable, or pass downloaded checkpoint "
                                          "directories with --checkpoints") as offline:
            for patterns in WEIGHT_PATTERNS:
                folder = Path(snapshot_download(checkpoint.source, revision=checkpoint.revision,
                                                allow_patterns=["config.json", *patterns], local_files_only=offline))
                if _weight_files(folder, required=False):
                    return folder
    except HubUnreachableError:
        raise
    except Exception as err:  # unknown repo or revision, a failed download
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"could not fetch {checkpoint.label} from the hub ({first}); check the id, "
                              f"the revision and the network") from None
    raise CheckpointError(f"{checkpoint.label} has no safetensors or pytorch_model.bin weights on the hub")


def _weight_files(directory: Path, required: bool = True) -> list[Path]:
    """The weight files of a model directory: safetensors shards, else pytorch_model*.bin."""
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


def checkpoint_fingerprint(directory: str | Path) -> str:
    """SHA-256 of the bytes of ``config.json`` and every weight file (read in 16 MB pieces)."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in [directory / "config.json", *_weight_files(directory)]:
        digest.update(path.name.encode() + b"\0")
        try:
            with open(path, "rb") as handle:
                while piece := handle.read(16 * 2**20):
                    digest.update(piece)
        except OSError as err:
            raise CheckpointError(f"cannot read {path} ({err.strerror})") from None
    return digest.hexdigest()[:24]


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


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
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            numel = 1
            for dim in info["shape"]:
                numel *= dim
            if end - begin != numel * dtype.itemsize or self._start + end > size:
                raise ValueError(f"tensor {name} runs past the end of the file or has the wrong size")
        self._header = header

    def keys(self):
        return self._header.keys()

    def get_tensor(self, name: str) -> torch.Tensor:
        info = self._header[name]
        begin, end = info["data_offsets"]
        with open(self.path, "rb") as handle:
            handle.seek(self._start + begin)
            data = bytearray(handle.read(end - begin))
        dtype = _SAFETENSORS_DTYPES[info["dtype"]]
        flat = torch.frombuffer(data, dtype=dtype) if data else torch.empty(0, dtype=dtype)
        return flat.reshape(info["shape"])


def _load_bin(path: Path) -> dict:
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
        self.directory = directory
        self.files = _weight_files(directory)
        self._where: dict[str, Any] = {}
        for path in self.files:
            try:
                if path.suffix == ".safetensors":
                    handle = SafetensorsFile(path)
                else:
                    handle = _load_bin(path)
            except Exception as err:
                raise CheckpointError(f"cannot read the weights {path} ({type(err).__name__}: {err}); "
                                      f"the file is damaged or incomplete: download or save it again") from None
            for name in handle.keys():
                self._where[name] = handle

    def names(self) -> set[str]:
        return set(self._where)

    def get(self, name: str) -> torch.Tensor:
        handle = self._where[name]
        tensor = handle.get_tensor(name) if hasattr(handle, "get_tensor") else handle[name]
        return tensor.to(torch.float32)  # as zones.models.load_model loads it


# --- which tensors are the block matrices (the adapters' naming, on file keys) ---------------------

# family -> (block prefixes tried in order, {role: key suffix}); fused q/k/v are split below.
NAME_MAPS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "llama": (("model.layers.{i}.", "layers.{i}."), {
        "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight", "v": "self_attn.v_proj.weight",
        "o": "self_attn.o_proj.weight", "mlp_gate": "mlp.gate_proj.weight", "mlp_up": "mlp.up_proj.weight",
        "mlp_down": "mlp.down_proj.weight"}),
    "gpt_neox": (("gpt_neox.layers.{i}.", "layers.{i}."), {
        "qkv": "attention.query_key_value.weight", "o": "attention.dense.weight",
        "mlp_in": "mlp.dense_h_to_4h.weight", "mlp_out": "mlp.dense_4h_to_h.weight"}),
    "gpt2": (("transformer.h.{i}.", "h.{i}."), {
        "qkv": "attn.c_attn.weight", "o": "attn.c_proj.weight", "mlp_in": "mlp.c_fc.weight",
        "mlp_out": "mlp.c_proj.weight"}),
}


def _read_config(directory: Path) -> dict:
    path = directory / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} ({err}); it must be a transformers config.json") from None


def _family(config: dict, path: Path) -> str:
    from .adapters import adapter_for_model_type

    model_type = config.get("model_type")
    if not model_type:
        raise CheckpointError(f"{path} has no model_type; not a transformers config")
    return adapter_for_model_type(model_type).family


def _n_layers(config: dict) -> int:
    return int(config.get("num_hidden_layers", config.get("n_layer", 0)))


def iter_checkpoint_matrices(directory: str | Path) -> Iterator[tuple[int, str, torch.Tensor]]:
    """Yield (layer, role, matrix of shape (out, in), float32) for every block matrix of a
    checkpoint directory, reading one tensor at a time; the order and the splitting of fused
    projections are those of ``zones.adapters``."""
    directory = Path(directory)
    config_path = directory / "config.json"
    config = _read_config(directory)
    family = _family(config, config_path)
    prefixes, suffixes = NAME_MAPS[family]
    reader = WeightReader(directory)
    names = reader.names()
    first_suffix = next(iter(suffixes.values()))
    prefix = next((p for p in prefixes if p.format(i=0) + first_suffix in names), None)
    n_layers = _n_layers(config)
    if prefix is None:
        raise CheckpointError(f"the weights in {directory} hold no {prefixes[0].format(i=0) + first_suffix}: "
                              f"they do not match their config's model_type {config.get('model_type')!r}")
    in_weights = sum(1 for i in range(n_layers + 1) if prefix.format(i=i) + first_suffix in names)
    if in_weights != n_layers:
        raise CheckpointError(f"{config_path} says {n_layers} layers but the weights in {directory} hold "
                              f"{in_weights}: the config and the weights disagree")
    for layer in range(n_layers):
        base = prefix.format(i=layer)
        for role, suffix in suffixes.items():
            key = base + suffix
            if key not in names:
                raise CheckpointError(f"the weights in {directory} lack {key}")
            matrix = reader.get(key)
            if family == "gpt2":
                matrix = matrix.T  # Conv1D keeps (in, out)
            if role != "qkv":
                yield layer, role, matrix
                continue
            yield from ((layer, r, m) for r, m in zip(("q", "k", "v"), _split_qkv(family, matrix, config)))


def _split_qkv(family: str, fused: torch.Tensor, config: dict) -> list[torch.Tensor]:
    """Split a fused (3·d, d) projection exactly as the model (and ``zones.adapters``) does."""
    if family == "gpt_neox":  # per head [q | k | v]
        heads = int(config["num_attention_heads"])
        per_head = fused.view(heads, 3, fused.shape[0] // (3 * heads), fused.shape[-1])
        return [per_head[:, i].reshape(-1, fused.shape[-1]) for i in range(3)]
    return list(fused.split(int(config["n_embd"]), dim=0))  # gpt2: [q; k; v]


# --- the snapshot of one checkpoint -----------------------------------------------------------------

def snapshot_rows(entries: Iterable[tuple[int, str, torch.Tensor]], *, window=None,
                  memory_budget: int | None = DEFAULT_MEMORY_BUDGET, device: str | None = None,
                  progress: bool = False) -> pd.DataFrame:
    """``layer, role, stable_rank, alpha_shape, alpha_esd`` of a stream of (layer, role, matrix).

    Matrices are gathered until they would pass ``memory_budget`` bytes as float64 (None: no
    bound, everything at once), handed to ``zones.spectra.spectral_table`` and dropped.
    """
    from tqdm.auto import tqdm

    from .spectra import DEFAULT_WINDOW, spectral_table

    window = DEFAULT_WINDOW if window is None else window
    keys: list[tuple[int, str]] = []
    parts: list[pd.DataFrame] = []
    batch: list[torch.Tensor] = []
    used = 0
    bar = tqdm(desc="matrices", unit="matrix", disable=not progress, leave=False)

    def flush():
        nonlocal batch, used
        if batch:
            parts.append(spectral_table(batch, window=window, estimators=ESTIMATORS))
            bar.update(len(batch))
            batch, used = [], 0

    for layer, role, matrix in entries:
        size = matrix.numel() * 8
        if memory_budget is not None and batch and used + size > memory_budget:
            flush()
        keys.append((layer, role))
        batch.append(matrix.to(device) if device else matrix)
        used += size
    flush()
    bar.close()
    if not keys:
        raise CheckpointError("the checkpoint has no block matrices")
    table = pd.concat(parts, ignore_index=True)
    table.insert(0, "role", [r for _, r in keys])
    table.insert(0, "layer", [l for l, _ in keys])
    return table[SNAPSHOT_COLUMNS[1:]]


@dataclass
class SnapshotResult:
    """What one job returns: the checkpoint, its fingerprint, its rows (no step column), the
    cache key parts, and whether the rows were computed now (False: read from a cache)."""

    checkpoint: Checkpoint
    fingerprint: str
    rows: pd.DataFrame
    parts: dict = field(default_factory=dict)
    computed: bool = True


def _cache_parts(fingerprint: str, window) -> dict:
    from .spectra import EVALS_THRESHOLD
    from .spectra import VERSION as SPECTRA_VERSION

    return dict(kind="checkpoint_snapshot", version=VERSION, spectra=SPECTRA_VERSION, weights=fingerprint,
                window=list(window), estimators=list(ESTIMATORS), threshold=EVALS_THRESHOLD)


def _read_cached(parts: dict) -> pd.DataFrame | None:
    """The cached rows for ``parts``, or None when absent or unreadable (then recomputed)."""
    from .cache import entry_path, read_table

    path = entry_path("snapshots", parts)
    if not path.exists():
        return None
    try:
        table = read_table(path)
    except Exception as err:
        print(f"zones: ignoring the damaged cache entry {path} ({type(err).__name__}); recomputing it")
        return None
    if list(table.columns) != SNAPSHOT_COLUMNS[1:] or table.empty:
        print(f"zones: ignoring the cache entry {path} (unexpected columns {list(table.columns)}); recomputing it")
        return None
    return table


def store_snapshot(parts: dict, rows: pd.DataFrame) -> None:
    """Write a checkpoint's rows into this process's cache (atomically; a present entry is kept)."""
    from .cache import atomic_write_text, entry_path, write_table

    path = entry_path("snapshots", parts)
    if _read_cached(parts) is None:
        write_table(rows, path)
        atomic_write_text(path.with_suffix(".json"), json.dumps(parts, indent=2, default=str))


def checkpoint_snapshot(checkpoint: Checkpoint, *, window=None, memory_budget: int | None = DEFAULT_MEMORY_BUDGET,
                        device: str | None = None, refresh: bool = False, progress: bool = False) -> SnapshotResult:
    """The snapshot rows of one checkpoint, from the cache when its fingerprint is known there.

    This is the job an executor runs, wherever it runs: it fetches the weights if needed,
    fingerprints them, and computes (and caches) the rows on a miss.
    """
    from .spectra import DEFAULT_WINDOW, check_window

    window = check_window(DEFAULT_WINDOW if window is None else window)
    device = device or ("cuda" if torch.cuda.is_available() else None)  # a GPU where the job has one
    directory = local_directory(checkpoint)
    _family(_read_config(directory), directory / "config.json")  # an unsupported model fails before hashing
    fingerprint = checkpoint_fingerprint(directory)
    parts = _cache_parts(fingerprint, window)
    rows = None if refresh else _read_cached(parts)
    computed = rows is None
    if computed:
        with torch.no_grad():
            rows = snapshot_rows(iter_checkpoint_matrices(directory), window=window, memory_budget=memory_budget,
                                 device=device, progress=progress)
        store_snapshot(parts, rows)
    return SnapshotResult(checkpoint, fingerprint, rows, parts, computed)


# --- a series -----------------------------------------------------------------------------------------

def lifecycle_snapshots(checkpoints: Any = None, model: str | None = None, *,
                        revisions: Iterable[str] | str | None = None, train_run: str | Path | None = None,
                        executor: str = "local", ray_address: str | None = None, retries: int = 2,
                        cpus_per_job: float = 1, window=None, memory_budget: int | None = DEFAULT_MEMORY_BUDGET,
                        device: str | None = None, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """The snapshot table of a checkpoint series: one row per (step, layer, role).

    Columns ``step, layer, role, stable_rank, alpha_shape, alpha_esd`` (``zones.train``'s
    ``SNAPSHOT_COLUMNS``), with ``depth`` first when the series stacks several runs of a
    ``zones train`` series, and ``model, depth`` first for the revisions of several hub
    models (e.g. Pythia-160m and Pythia-410m: Δα against depth across sizes). The
    checkpoints are given as in ``resolve_checkpoints`` (``model`` names the hub repository of
    ``revisions``, or is the prefix of ``"ID@rev,..."`` strings). One job per checkpoint runs
    through ``zones.executors.run_jobs(executor=...)``; every result lands in this process's
    cache, and a failed job stops the call with an error naming its checkpoint (never a
    missing row).
    """
    from .executors import Job, run_jobs

    series = resolve_checkpoints(checkpoints, model, revisions, train_run)
    options = dict(window=window, memory_budget=memory_budget, device=device, refresh=refresh)
    jobs = [Job(c.label, checkpoint_snapshot, (c,), options, cpus=cpus_per_job) for c in series]
    results = run_jobs(jobs, executor, ray_address=ray_address, retries=retries, progress=progress,
                       desc="checkpoint snapshots")
    if executor != "local":  # per-node caches are merged here (a local job stored its own)
        for result in results:
            store_snapshot(result.parts, result.rows)
    computed = sum(r.computed for r in results)
    if progress:
        print(f"zones: {len(results)} checkpoints: {computed} computed, {len(results) - computed} from the cache")
    hub_models = sorted({c.source for c in series if c.revision})
    frames = [r.rows.assign(step=c.step, depth=c.depth, model=c.source) for c, r in zip(series, results)]
    table = pd.concat(frames, ignore_index=True)
    if len(hub_models) > 1:  # several models' series: each is one depth, named by its model
        table["depth"] = table.groupby("model")["layer"].transform("max") + 1
        return table[["model", "depth", *SNAPSHOT_COLUMNS]]
    if table["depth"].isna().all():
        return table[SNAPSHOT_COLUMNS]
    table["depth"] = table["depth"].astype(int)
    return table[["depth", *SNAPSHOT_COLUMNS]]
