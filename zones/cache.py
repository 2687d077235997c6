"""Where expensive results live, and how they are keyed.

A cached result is a file ``cache_dir()/<kind>/<key>.<ext>``. The key hashes a JSON dict of
everything that determines the result (model fingerprint, corpus fingerprint, parameters);
the dict itself is saved beside the result as ``<key>.json`` for people to read.

Writes go to a temporary file that is renamed into place, so a crash never leaves a file a
later run would trust. Sweeps that produce one row at a time append to a journal
(``<key>.partial.jsonl``); a resumed sweep skips what the journal holds, and only the finished
table is written under the final name.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import pandas as pd


def cache_dir() -> Path:
    """``$ZONES_CACHE``, or ``~/.cache/zones``."""
    root = Path(os.environ.get("ZONES_CACHE") or Path.home() / ".cache" / "zones")
    root.mkdir(parents=True, exist_ok=True)
    return root


def cache_key(parts: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable dict."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def entry_path(kind: str, parts: dict[str, Any], ext: str = "parquet") -> Path:
    folder = cache_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{cache_key(parts)}.{ext}"


def readable_mode(path: Path, directory: bool = False) -> None:
    """Give a temporary file (0600) or folder (0700) the permissions the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    readable_mode(tmp)
    os.replace(tmp, path)


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """Write a table as CSV or Parquet (by suffix), atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if path.suffix == ".parquet":
            df.to_parquet(tmp, index=False)
        else:
            df.to_csv(tmp, index=False)
        readable_mode(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read_table(path: Path) -> pd.DataFrame:
    path = Path(path)
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def cached_table(kind: str, parts: dict[str, Any], compute: Callable[[], pd.DataFrame],
                 refresh: bool = False) -> pd.DataFrame:
    """Return the cached table for ``parts``, computing and storing it on a miss."""
    path = entry_path(kind, parts)
    if path.exists() and not refresh:
        return read_table(path)
    df = compute()
    write_table(df, path)
    atomic_write_text(path.with_suffix(".json"), json.dumps(parts, indent=2, default=str))
    return df


class Journal:
    """Append-only record of finished rows of a resumable sweep.

    Each line is one complete JSON row; a torn last line (a crash mid-write) is ignored.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        """Cut a last line that a crash left unfinished, so new rows start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        rows = []
        for line in self.path.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return rows

    def append(self, row: dict[str, Any]) -> None:
        with open(self.path, "a") as handle:
            handle.write(json.dumps(row, default=float) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def resumable_table(kind: str, parts: dict[str, Any], tasks: Iterable[Any],
                    task_id: Callable[[Any], str], run: Callable[[Any], dict[str, Any]],
                    refresh: bool = False) -> pd.DataFrame:
    """A table with one row per task, computed row by row and resumed after an interruption.

    ``run(task)`` returns the row (a dict); ``task_id(task)`` names the task in the journal.
    Only when every task is done is the table written under its final name.
    """
    path = entry_path(kind, parts)
    if path.exists() and not refresh:
        return read_table(path)
    journal = Journal(path.with_suffix(".partial.jsonl"))
    if refresh:
        journal.discard()
    done = {row["_task"]: row for row in journal.rows()}
    rows = []
    for task in tasks:
        tid = task_id(task)
        if tid not in done:
            row = dict(run(task), _task=tid)
            journal.append(row)
            done[tid] = row
        rows.append(done[tid])
    df = pd.DataFrame(rows).drop(columns="_task")
    write_table(df, path)
    atomic_write_text(path.with_suffix(".json"), json.dumps(parts, indent=2, default=str))
    journal.discard()
    return df
