"""Where expensive results live and how they are named.

A cached result is a file ``cache_dir()/<kind>/<key>.<ext>`` (:func:`entry_path`). The key
hashes a JSON dict of everything that determines the result (model fingerprint, corpus
fingerprint, parameters), written canonically (:func:`canonical`); the dict itself is saved
beside the result as the sidecar ``<key>.json`` (:func:`sidecar_path`), for people to read. A
damaged or misplaced file is a ``CacheError``: one line naming the file, the cause and what to
delete.

The rest of the cache, one module per job, each on the ones before it:

* ``zones.core.tally``: what a run read and computed (``note``, ``counting``);
* ``zones.core.atomic``: atomic writes of files and folders, the locks of their writers, file hashes;
* ``zones.core.tables``: tables as CSV or Parquet files;
* ``zones.core.refresh``: ``--refresh``, recomputing what was written before it began;
* ``zones.core.entries``: verified entries, a payload checked against its sidecar, and cached tables;
* ``zones.core.manifest``: checksummed folders, every file checked against the folder's manifest;
* ``zones.core.journal``: journals of resumable sweeps, one checksummed row at a time;
* ``zones.core.capture``: the entries a run read or wrote, carried to another machine's cache.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


class CacheError(RuntimeError):
    """A cache file is damaged or does not belong to its key (the message names it and the remedy).
    ``path`` and ``cause``, where given: the damaged file and what is wrong with it, for a caller
    that repairs the entry itself and says so in its own words."""

    def __init__(self, message: str, *, path: Path | None = None, cause: str | None = None):
        super().__init__(message)
        self.path, self.cause = path, cause


def cache_dir() -> Path:
    """``$ZONES_CACHE``, or ``~/.cache/zones`` (created when missing)."""
    given = os.environ.get("ZONES_CACHE")
    root = Path(given).expanduser() if given else Path.home() / ".cache" / "zones"
    where = f"ZONES_CACHE={given}" if given else f"the cache folder {root}"
    if root.exists() and not root.is_dir():
        raise CacheError(f"{where} is a file, not a folder; point ZONES_CACHE at a folder (or unset it)")
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise CacheError(f"cannot create {where} ({err.strerror}); point ZONES_CACHE at a writable "
                         f"folder") from None
    return root


def canonical(key_parts: Any) -> str:
    """``key_parts`` as JSON, keys sorted, what JSON cannot hold as its ``str``: the text a key hashes."""
    return json.dumps(key_parts, sort_keys=True, default=str)


def cache_key(key_parts: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable dict."""
    return hashlib.sha256(canonical(key_parts).encode()).hexdigest()[:20]


def entry_path(kind: str, key_parts: dict[str, Any], ext: str = "parquet") -> Path:
    folder = cache_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{cache_key(key_parts)}.{ext}"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")
