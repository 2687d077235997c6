"""Spectral snapshots of a series of checkpoints, read from their weight files alone.

A checkpoint series is what a public training run publishes (Pythia's ``step0`` …
``step143000`` hub revisions), a glob of local checkpoint directories, or the checkpoints a
``zones train --keep-checkpoints`` run kept. For each checkpoint this module computes the
same snapshot rows the training run records (``zones.series.SNAPSHOT_COLUMNS``: ``step, layer,
role, stable_rank, alpha_shape, alpha_esd``)::

    table = lifecycle_snapshots("runs/*/checkpoint-*")                      # local directories
    table = lifecycle_snapshots("EleutherAI/pythia-160m@step0,step1000")   # hub revisions
    table = lifecycle_snapshots(train_run="results/train")                # a zones train run

Only the weights are read: no forward pass, no tokenizer, no model object. Matrices are
streamed one at a time by ``zones.core.weights`` (named and split by the family's adapter) and
handed to ``zones.spectra.spectral_table`` in groups of at most ``memory_budget`` MB (as
float64), so peak memory is bounded by the budget plus one matrix, not by the model's size.
The checkpoints of one series must share a family and the shapes of their matrices (a
mixed glob is one error before anything is computed).

Each checkpoint's rows are a verified ``zones.core.cache`` entry (``cache_dir()/snapshots``, with
its checksummed sidecar) keyed by its fingerprint, the SHA-256 of its config and weight
files' bytes, so an extended or interrupted sweep only computes what is new; a damaged entry
is a ``CacheError`` naming the file, and ``refresh=True`` recomputes and replaces it. The
checkpoints run as independent jobs through ``zones.core.executors`` (``local`` in-process, or
``ray``); whichever ran them, the driver stores every result in its own cache and assembles
one table.
"""
from __future__ import annotations

import glob as globlib
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import huggingface_hub
import pandas as pd
import torch
from tqdm.auto import tqdm

from zones.core.atomic import hash_file
from zones.core.cache import CacheError, entry_path
from zones.core.checks import check_float, check_int
from zones.core.entries import read_cached_table, write_cached_table
from zones.core.executors import Job, run_jobs
from zones.core.glossary import default
from zones.core.hub import HubUnreachableError, hub_lookup
from zones.core.weights import (
    CheckpointError,
    checkpoint_shapes,
    config_adapter,
    iter_checkpoint_matrices,
    read_config,
    weight_files,
)
from zones.spectra import DEFAULT_WINDOW, EVALS_THRESHOLD, check_window, spectral_table
from zones.spectra import VERSION as SPECTRA_VERSION

VERSION = "checkpoints-1"  # bump when the rows computed from a checkpoint change
SNAPSHOT_COLUMNS = ["step", "layer", "role", "stable_rank", "alpha_shape", "alpha_esd"]
ESTIMATORS = ("shape", "esd", "companions")  # exactly what zones.series.spectral_snapshot computes
DEFAULT_MEMORY_BUDGET = default("memory_budget")  # MB of float64 matrices handed to the spectra at once
CHECKPOINT_META = "zones-checkpoint.json"  # written by zones train --keep-checkpoints: {"step": N, ...}
STEP_IN_NAME = re.compile(r"(?:step|checkpoint|ckpt|iter)[-_]?(\d+)", re.IGNORECASE)


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
                value = json.loads(path.read_text())[key]
            except (ValueError, KeyError, TypeError) as err:
                raise CheckpointError(f"{path} has no readable {key!r} ({err}); fix or delete it") from None
            try:  # 99.9 or true is no step (int() made them 99 and 1)
                return check_int(value, f"{key!r} in {path}", min=0)
            except ValueError as err:
                raise CheckpointError(f"{err}; fix or delete it") from None
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


def check_one_architecture(series: Sequence[Checkpoint]) -> None:
    """Refuse a series whose local checkpoints mix families or matrix shapes (read from their
    configs and weight headers): their rows would be compared as if they were one model.
    Each ``zones train`` depth, and each hub repository, is its own series."""
    first: dict[tuple, tuple[Checkpoint, str, dict]] = {}
    for c in series:
        if c.revision is not None:
            continue  # the revisions of one hub repository share its architecture
        family, shapes = checkpoint_shapes(c.source)
        seen = first.setdefault(_series_key(c), (c, family, shapes))
        other, other_family, other_shapes = seen
        if other is c:
            continue
        if family != other_family:
            why = f"{other.label} is a {other_family} model and {c.label} a {family} model"
        elif len({l for l, _ in shapes}) != len({l for l, _ in other_shapes}):
            why = f"{other.label} has {len({l for l, _ in other_shapes})} blocks and {c.label} " \
                  f"{len({l for l, _ in shapes})}"
        else:
            key = next((k for k in other_shapes if shapes.get(k) != other_shapes[k]), None)
            if key is None:
                continue
            why = (f"block {key[0]} {key[1]} is {other_shapes[key]} in {other.label} and {shapes.get(key)} "
                   f"in {c.label}")
        raise CheckpointError(f"the checkpoints of one series must share an architecture, but {why}; "
                              f"pass each model's checkpoints as a series of its own")


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
    try:
        with hub_lookup(checkpoint.label, "run where the hub is reachable, or pass downloaded checkpoint "
                                          "directories with --checkpoints") as offline:
            for patterns in WEIGHT_PATTERNS:
                folder = Path(huggingface_hub.snapshot_download(checkpoint.source, revision=checkpoint.revision,
                                                allow_patterns=["config.json", *patterns], local_files_only=offline))
                if weight_files(folder, required=False):
                    return folder
    except HubUnreachableError:
        raise
    except Exception as err:  # unknown repo or revision, a failed download
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"could not fetch {checkpoint.label} from the hub ({first}); check the id, "
                              f"the revision and the network") from None
    raise CheckpointError(f"{checkpoint.label} has no safetensors or pytorch_model.bin weights on the hub")


def checkpoint_fingerprint(directory: str | Path) -> str:
    """SHA-256 of the bytes of ``config.json`` and every weight file (read in 16 MB pieces)."""
    directory = Path(directory)
    digest = hashlib.sha256()
    for path in [directory / "config.json", *weight_files(directory)]:
        digest.update(path.name.encode() + b"\0")
        try:
            hash_file(digest, path)
        except OSError as err:
            raise CheckpointError(f"cannot read {path} ({err.strerror})") from None
    return digest.hexdigest()[:24]


# --- the snapshot of one checkpoint -----------------------------------------------------------------

def snapshot_rows(entries: Iterable[tuple[int, str, torch.Tensor]], *, window=None,
                  memory_budget: float | None = DEFAULT_MEMORY_BUDGET, device: str | None = None,
                  progress: bool = False) -> pd.DataFrame:
    """``layer, role, stable_rank, alpha_shape, alpha_esd`` of a stream of (layer, role, matrix).

    Matrices are gathered until they would pass ``memory_budget`` MB as float64 (None or 0: no
    bound, everything at once), handed to ``zones.spectra.spectral_table`` and dropped.
    """
    limit = memory_budget * 2**20 if memory_budget else None   # MB, as the glossary's memory_budget
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
        if limit is not None and batch and used + size > limit:
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
    cache key's parts (``key_parts``), and whether the rows were computed now (False: read from a cache)."""

    checkpoint: Checkpoint
    fingerprint: str
    rows: pd.DataFrame
    key_parts: dict = field(default_factory=dict)
    computed: bool = True


def _cache_parts(fingerprint: str, window) -> dict:
    return dict(kind="checkpoint_snapshot", version=VERSION, spectra=SPECTRA_VERSION, weights=fingerprint,
                window=list(window), estimators=list(ESTIMATORS), threshold=EVALS_THRESHOLD)


def _read_cached(key_parts: dict) -> pd.DataFrame | None:
    """The verified cached rows for ``key_parts``; None on a miss (or an entry written before
    entries were checksummed: recomputed). A damaged entry (edited, truncated, rows deleted)
    raises ``CacheError`` naming the file and what to delete."""
    path = entry_path("snapshots", key_parts)
    table = read_cached_table(path, key_parts)
    if table is not None and (list(table.columns) != SNAPSHOT_COLUMNS[1:] or table.empty):
        raise CacheError(f"cache entry {path} holds columns {list(table.columns)} and {len(table)} rows, not "
                         f"a checkpoint snapshot; delete {path} and {path.with_suffix('.json').name} to recompute it")
    return table


def store_snapshot(key_parts: dict, rows: pd.DataFrame, refresh: bool = False) -> None:
    """Write a checkpoint's rows into this process's cache as a verified entry (atomically);
    an intact entry is kept, unless ``refresh`` (which also replaces a damaged one)."""
    if refresh or _read_cached(key_parts) is None:
        write_cached_table(rows, entry_path("snapshots", key_parts), key_parts)


def checkpoint_snapshot(checkpoint: Checkpoint, *, window=None, memory_budget: float | None = DEFAULT_MEMORY_BUDGET,
                        device: str | None = None, refresh: bool = False, progress: bool = False) -> SnapshotResult:
    """The snapshot rows of one checkpoint, from the cache when its fingerprint is known there.

    This is the job an executor runs, wherever it runs: it fetches the weights if needed,
    fingerprints them, and computes (and caches) the rows on a miss. ``refresh``: compute
    them again and replace the entry (also a damaged one, which otherwise is a ``CacheError``).
    """
    window = check_window(DEFAULT_WINDOW if window is None else window)
    if memory_budget is not None:
        memory_budget = check_float(memory_budget, "memory_budget", min=0)
    device = device or ("cuda" if torch.cuda.is_available() else None)  # a GPU where the job has one
    directory = local_directory(checkpoint)
    config_adapter(read_config(directory), directory / "config.json")  # an unsupported model fails before hashing
    fingerprint = checkpoint_fingerprint(directory)
    key_parts = _cache_parts(fingerprint, window)
    rows = None if refresh else _read_cached(key_parts)
    computed = rows is None
    if computed:
        with torch.no_grad():
            rows = snapshot_rows(iter_checkpoint_matrices(directory), window=window, memory_budget=memory_budget,
                                 device=device, progress=progress)
        store_snapshot(key_parts, rows, refresh=refresh)
    return SnapshotResult(checkpoint, fingerprint, rows, key_parts, computed)


# --- a series -----------------------------------------------------------------------------------------

def lifecycle_snapshots(checkpoints: Any = None, model: str | None = None, *,
                        revisions: Iterable[str] | str | None = None, train_run: str | Path | None = None,
                        executor: str = "local", ray_address: str | None = None, retries: int = 2,
                        cpus_per_job: float = 1, window=None, memory_budget: float | None = DEFAULT_MEMORY_BUDGET,
                        device: str | None = None, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """The snapshot table of a checkpoint series: one row per (step, layer, role).

    Columns ``step, layer, role, stable_rank, alpha_shape, alpha_esd`` (``zones.series``'s
    ``SNAPSHOT_COLUMNS``), with ``depth`` first when the series stacks several runs of a
    ``zones train`` series, and ``model, depth`` first for the revisions of several hub
    models (e.g. Pythia-160m and Pythia-410m: Δα against depth across sizes). The
    checkpoints are given as in ``resolve_checkpoints`` (``model`` names the hub repository of
    ``revisions``, or is the prefix of ``"ID@rev,..."`` strings). One job per checkpoint runs
    through ``zones.core.executors.run_jobs(executor=...)``; every result lands in this process's
    cache, and a failed job stops the call with an error naming its checkpoint (never a
    missing row). The local checkpoints of one series must share a family and matrix shapes
    (``check_one_architecture``).
    """
    series = resolve_checkpoints(checkpoints, model, revisions, train_run)
    check_one_architecture(series)
    options = dict(window=window, memory_budget=memory_budget, device=device, refresh=refresh)
    jobs = [Job(c.label, checkpoint_snapshot, (c,), options, cpus=cpus_per_job) for c in series]
    results = run_jobs(jobs, executor, ray_address=ray_address, retries=retries, progress=progress,
                       desc="checkpoint snapshots")
    if executor != "local":  # per-node caches are merged here (a local job stored its own)
        for result in results:
            store_snapshot(result.key_parts, result.rows, refresh=refresh)
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
