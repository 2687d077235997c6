"""The offline tasks' shipped data: read, checked against the manifest, handed to lm-eval.

The task YAML files (``offline/*.yaml``) name :func:`next_sentence` and :func:`next_line` as
their ``custom_dataset``: lm-eval calls them instead of downloading anything. Each reads its
JSONL file beside the YAML and checks its sha256 against ``offline/manifest.json`` (written by
``zones.measure.tasks.build``), so a damaged or edited file is one error line, never a score.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from zones.measure.tasks.build import MANIFEST, OFFLINE_DIR, TASKS

REMEDY = "reinstall zones, or rebuild the files with: python -m zones.measure.tasks.build"


class TaskDataError(ValueError):
    """An offline task's data file is missing, damaged or not the one the manifest names."""


def read_manifest(folder: Path = OFFLINE_DIR) -> dict:
    """The manifest of the shipped data files (build parameters, sha256 of each file)."""
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskDataError(f"{path} is missing; {REMEDY}") from None
    except ValueError as err:
        raise TaskDataError(f"{path} is not valid JSON ({err}); {REMEDY}") from None


def task_rows(task: str, folder: Path = OFFLINE_DIR) -> list[dict]:
    """The examples of an offline task (``id, context, choices, label``), checked."""
    if task not in TASKS:
        raise TaskDataError(f"unknown offline task {task!r}; the offline tasks are {', '.join(TASKS)}")
    entry = read_manifest(folder)["tasks"].get(task)
    if entry is None:
        raise TaskDataError(f"{Path(folder) / MANIFEST} lists no {task}; {REMEDY}")
    path = Path(folder) / entry["file"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TaskDataError(f"{path} is missing; {REMEDY}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise TaskDataError(f"{path} is damaged or edited (sha256 {digest[:12]}…, the manifest says "
                            f"{entry['sha256'][:12]}…); {REMEDY}")
    return [json.loads(line) for line in data.decode("utf-8").splitlines()]


def data_digest(task: str, folder: Path = OFFLINE_DIR) -> str:
    """The sha256 of an offline task's data file as the manifest records it (a cache key part)."""
    return read_manifest(folder)["tasks"][task]["sha256"]


def _dataset(task: str):
    import datasets  # lm-eval has it; only a run of the tasks needs it

    rows = task_rows(task)
    features = datasets.Features(dict(id=datasets.Value("int64"), context=datasets.Value("string"),
                                      choices=datasets.Sequence(datasets.Value("string")),
                                      label=datasets.Value("int64")))
    return datasets.DatasetDict(test=datasets.Dataset.from_list(rows, features=features))


def next_sentence(**_metadata):
    """lm-eval's ``custom_dataset`` of ``zones_next_sentence`` (its metadata is not needed)."""
    return _dataset("zones_next_sentence")


def next_line(**_metadata):
    """lm-eval's ``custom_dataset`` of ``zones_next_line``."""
    return _dataset("zones_next_line")
