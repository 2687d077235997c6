"""Verified cache entries: a payload with its sidecar, checked on every read.

The sidecar ``<key>.json`` holds the key's dict and the payload's sha256 and schema (``"_entry"``:
``sha256, bytes`` and, for a table, ``columns, rows``). Every read checks the payload against its
sidecar: a damaged entry (truncated, edited, a sidecar of another key) raises ``CacheError``, one
line naming the file, the cause and what to delete; it is never used. A payload without a
verifiable sidecar (written by an older zones, or a crash between the two writes) is recomputed.
Payload and sidecar are committed under one lock (:func:`entry_lock`), so concurrent runs never
pair one run's payload with another's sidecar.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any, Callable

import pandas as pd

from zones.core.atomic import atomic_write_bytes, atomic_write_text, remove_stale_temporaries
from zones.core.cache import CacheError, canonical, entry_path, sidecar_path
from zones.core.refresh import written_before_refresh
from zones.core.tables import read_parquet, table_bytes
from zones.core.tally import note

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: entries are written without locks
    fcntl = None

ENTRY = "_entry"  # the sidecar's record of the payload: sha256, bytes, and columns/rows for a table


@contextlib.contextmanager
def entry_lock(path: Path, shared: bool = False, on_wait: Callable[[], None] | None = None):
    """Hold a lock on ``path``'s entry (shared for reading, exclusive for writing; the file
    ``path.with_suffix(".lock")``); the OS releases it if the process dies. ``on_wait()`` is
    called once when another process holds it (then this one waits). Without ``fcntl`` (not
    POSIX) it does nothing."""
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    lock = Path(path).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if on_wait is not None:
                on_wait()
            fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _damaged(path: Path, cause: str) -> CacheError:
    side = sidecar_path(path)
    return CacheError(f"cache entry {path} is damaged ({cause}); delete {path} and {side.name} "
                      f"to recompute it", path=Path(path), cause=cause)


def write_entry(path: Path, key_parts: dict[str, Any], data: bytes, **schema: Any) -> None:
    """Store ``data`` at ``path`` and its sidecar: ``key_parts`` plus sha256, size and ``schema``
    (under the entry's lock, which also lets it remove the temporaries a killed writer left)."""
    record = dict(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), **schema)
    sidecar = json.dumps({**json.loads(canonical(key_parts)), ENTRY: record}, indent=2, sort_keys=True)
    with entry_lock(path):
        for written in (Path(path), sidecar_path(path)):  # every writer of the entry holds its lock: these are
            remove_stale_temporaries(written, directory=False)  # a killed writer's temporaries
        atomic_write_bytes(path, data)
        atomic_write_text(sidecar_path(path), sidecar)
    note("computed", path)


def read_entry(path: Path, key_parts: dict[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
    """The verified payload at ``path`` and its sidecar record, or None when there is no
    verifiable entry (no payload, or no sidecar with a checksum: recompute it), or when it was
    written before the refresh this process is inside (``zones.core.refresh.refreshing``).

    Raises ``CacheError`` when the sidecar is unreadable or belongs to other key parts, or the
    payload's size or sha256 differs from the sidecar's.
    """
    path = Path(path)
    side = sidecar_path(path)
    if written_before_refresh(path):  # --refresh: recomputed, then replaced by its writer
        return None
    with entry_lock(path, shared=True):
        if not path.exists() or not side.exists():
            return None
        try:
            stored = json.loads(side.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise CacheError(f"cache sidecar {side} is not valid JSON ({err}); delete {side} and "
                             f"{path.name} to recompute the entry") from None
        if not isinstance(stored, dict) or not isinstance(stored.get(ENTRY), dict):
            return None  # written before entries were checksummed: not trusted, recomputed
        record = stored.pop(ENTRY)
        if stored != json.loads(canonical(key_parts)):
            raise CacheError(f"cache sidecar {side} describes another computation than its key "
                             f"{path.stem}; delete {side} and {path.name} to recompute the entry")
        data = path.read_bytes()
    if len(data) != record.get("bytes") or hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise _damaged(path, f"{len(data)} bytes whose sha256 differs from the one its sidecar "
                             f"recorded for {record.get('bytes')} bytes")
    note("read", path)
    return data, record


def cached_table(kind: str, key_parts: dict[str, Any], compute: Callable[[], pd.DataFrame],
                 refresh: bool = False) -> pd.DataFrame:
    """Return the cached table for ``key_parts``, computing and storing it on a miss."""
    path = entry_path(kind, key_parts)
    if not refresh:
        found = read_cached_table(path, key_parts)
        if found is not None:
            return found
    df = compute()
    write_cached_table(df, path, key_parts)
    return df


def write_cached_table(df: pd.DataFrame, path: Path, key_parts: dict[str, Any]) -> None:
    write_entry(path, key_parts, table_bytes(df, ".parquet"), columns=[str(c) for c in df.columns],
                rows=len(df))


def read_cached_table(path: Path, key_parts: dict[str, Any]) -> pd.DataFrame | None:
    """The verified table at ``path`` (None on a miss; ``CacheError`` when damaged)."""
    found = read_entry(path, key_parts)
    if found is None:
        return None
    data, record = found
    try:
        df = read_parquet(data)
    except Exception as err:  # noqa: BLE001 - any parse failure is a damaged entry
        raise _damaged(Path(path), f"unreadable parquet: {err}") from None
    if [str(c) for c in df.columns] != record.get("columns") or len(df) != record.get("rows"):
        raise _damaged(Path(path), f"columns/rows {list(df.columns)}/{len(df)} differ from the "
                                   f"sidecar's {record.get('columns')}/{record.get('rows')}")
    return df
