"""Journals of resumable sweeps: one checksummed JSON row a line, appended as each row is done.

A sweep that produces one row at a time appends to a journal (``<key>.partial.jsonl``), each row
with its own sha256 and the key it belongs to; a resumed sweep skips what the journal holds, and
only the finished table is written under the final name (:func:`resumable_table`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

from zones.core.atomic import DiskFullError, is_disk_full
from zones.core.cache import CacheError, canonical, entry_path
from zones.core.entries import read_cached_table, write_cached_table
from zones.core.refresh import written_before_refresh
from zones.core.tally import note

ROW_SHA = "_sha"  # a journal row's checksum field
ROW_KEY = "_key"  # a journal row's key: the cache key its journal was written under


def row_sha(row: dict[str, Any]) -> str:
    """A journal row's checksum (``_sha``): of its canonical JSON, the checksum itself left out."""
    return hashlib.sha256(canonical(row).encode()).hexdigest()[:16]


class Journal:
    """Append-only record of finished rows of a resumable sweep.

    Each line is one complete JSON row with its checksum (``_sha``) and the key it belongs to
    (``_key``: the cache key in the journal's file name, ``<key>.jsonl`` or
    ``<key>.partial.jsonl``); neither is returned by ``rows``. A torn last line (a crash
    mid-write) is ignored. Any other unreadable line, a row whose checksum fails, one missing a
    ``required`` field, or one that names another key (a journal copied or renamed from another
    computation: another model's, say) raises ``CacheError`` naming the file and the line: the
    journal is never silently half-used, nor borrowed. A journal whose rows name no key (written
    by an older zones) cannot be checked and is started again, and so is one written before the
    refresh this process is inside (``zones.core.refresh.refreshing``), unless ``keep_stale`` (a journal shared
    by many computations, which skips the rows it held itself: the loss store).
    """

    def __init__(self, path: Path, required: Sequence[str] = (), *, keep_stale: bool = False):
        self.path = Path(path)
        self.required = tuple(required)
        self.key = self.path.name.split(".", 1)[0]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not keep_stale and written_before_refresh(self.path):  # --refresh: its rows are computed again
            self.discard()
        self._drop_torn_tail()
        self._drop_unkeyed()

    def _drop_torn_tail(self) -> None:
        """Cut a last line that a crash left unfinished, so new rows start on a fresh line."""
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        if data and not data.endswith(b"\n"):
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def _drop_unkeyed(self) -> None:
        """Start again a journal whose first row names no key (an older zones wrote it: nothing ties
        its rows to this computation)."""
        if not self.path.exists():
            return
        with open(self.path, "rb") as handle:
            first = handle.readline()
        try:
            row = json.loads(first)
        except ValueError:
            return  # rows() names the damaged line
        if isinstance(row, dict) and ROW_SHA in row and ROW_KEY not in row:
            self.path.unlink()

    def _damaged(self, line_no: int, cause: str) -> CacheError:
        return CacheError(f"journal {self.path} line {line_no} is damaged ({cause}); delete {self.path} "
                          f"to recompute the sweep")

    def rows(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        data = self.path.read_bytes()
        torn = not data.endswith(b"\n")  # a crash mid-write: the last line is unfinished
        lines = data.decode("utf-8", errors="replace").splitlines()
        rows = []
        for no, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                if torn and no == len(lines):
                    break
                raise self._damaged(no, "not a JSON row") from None
            if not isinstance(row, dict) or ROW_SHA not in row:
                raise self._damaged(no, "no checksum")
            sha = row.pop(ROW_SHA)
            if sha != row_sha(row):
                raise self._damaged(no, "checksum mismatch: the row was edited or corrupted")
            key = row.pop(ROW_KEY, None)
            if key != self.key:
                raise CacheError(f"journal {self.path} line {no} belongs to another computation (its row names "
                                 f"the key {key}, this journal's is {self.key}): it was copied or renamed from "
                                 f"another run; delete {self.path} to recompute the sweep")
            missing = [f for f in self.required if f not in row]
            if missing:
                raise self._damaged(no, f"missing {', '.join(map(repr, missing))}")
            rows.append(row)
        if rows:
            note("read", self.path)
        return rows

    def append(self, row: dict[str, Any]) -> None:
        row = json.loads(json.dumps({**row, ROW_KEY: self.key}, default=float))  # the row as it will read back
        line = json.dumps({**row, ROW_SHA: row_sha(row)})
        try:
            with open(self.path, "a") as handle:
                handle.write(line + "\n")
                handle.flush()
                os.fsync(handle.fileno())
        except OSError as err:
            if is_disk_full(err):
                raise DiskFullError(self.path, "appending to") from err
            raise
        note("computed", self.path)

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def resumable_table(kind: str, key_parts: dict[str, Any], tasks: Iterable[Any],
                    task_id: Callable[[Any], str], run: Callable[[Any], dict[str, Any]],
                    refresh: bool = False) -> pd.DataFrame:
    """A table with one row per task, computed row by row and resumed after an interruption.

    ``run(task)`` returns the row (a dict); ``task_id(task)`` names the task in the journal.
    Only when every task is done is the table written under its final name. Journal rows
    that lack a field the others have are damaged (``CacheError``).
    """
    path = entry_path(kind, key_parts)
    if not refresh:
        found = read_cached_table(path, key_parts)
        if found is not None:
            return found
    journal = Journal(path.with_suffix(".partial.jsonl"), required=("_task",))
    if refresh:
        journal.discard()
    journaled = journal.rows()
    fields = set().union(*journaled) if journaled else set()
    for no, row in enumerate(journaled, 1):
        if set(row) != fields:
            raise journal._damaged(no, f"missing {', '.join(map(repr, sorted(fields - set(row))))}")
    done = {row["_task"]: row for row in journaled}
    rows = []
    for task in tasks:
        tid = task_id(task)
        if tid not in done:
            row = dict(run(task), _task=tid)
            journal.append(row)
            done[tid] = row
        rows.append(done[tid])
    df = pd.DataFrame(rows).drop(columns="_task")
    write_cached_table(df, path, key_parts)
    journal.discard()
    return df
