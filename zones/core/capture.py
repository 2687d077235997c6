"""The cache entries a run read or wrote, carried to another machine's cache.

``capture()`` collects the files of every entry a run read or wrote (it listens to
``zones.core.tally.note``), so that another machine's cache can take them in with
:func:`store_captured`, each file's sha256 checked on arrival, then each entry as its own kind is
checked: a payload against its sidecar, a folder against its manifest, a journal row by row.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from zones.core.atomic import MARK_SUFFIX, atomic_directory, atomic_write_bytes
from zones.core.cache import CacheError, cache_dir, sidecar_path
from zones.core.entries import ENTRY, entry_lock, read_entry
from zones.core.journal import ROW_SHA, row_sha
from zones.core.manifest import FILES, MANIFEST, verify_manifest
from zones.core.tally import Tally, listening, silenced

NOT_CARRIED_KINDS = ("models", "study")  # converted GGUF copies: each machine converts its own (~0.5 GB each)


@dataclass(frozen=True)
class CapturedEntry:
    """The files of one cache entry, to store in another machine's cache (``store_captured``).

    ``path``: the entry's payload, journal or folder, relative to the cache folder; ``folder``:
    whether it is a folder; ``files``: each file (relative to the cache folder) and its bytes;
    ``digests``: each file's sha256, computed where the entry was captured."""

    path: str
    folder: bool
    files: dict[str, bytes]
    digests: dict[str, str]


@dataclass
class Captured:
    """What ``capture`` saw: the ``tally`` of entries read and computed, and (when carried) the
    ``entries`` themselves."""

    tally: Tally = field(default_factory=Tally)
    entries: list[CapturedEntry] = field(default_factory=list)


class _Capture:
    def __init__(self):
        self.root = Path(os.path.abspath(cache_dir()))
        self.tally = Tally()
        self.paths: set[Path] = set()

    def add(self, event: str, ident: str, path: Path) -> None:
        self.tally.add(event, ident)
        self.paths.add(Path(os.path.abspath(path)))


@contextlib.contextmanager
def capture(carry: bool = True):
    """Collect every cache entry read or computed inside the block, in this process. Yields a
    ``Captured``; when the block ends, its ``tally`` holds their keys and, with ``carry``, its
    ``entries`` hold their files as they are then (an entry of ``NOT_CARRIED_KINDS`` is
    counted, not carried)."""
    current = _Capture()
    result = Captured(current.tally)
    with listening(current):
        yield result
    if carry:
        result.entries.extend(_collect(current.root, current.paths))


def _scratch(rel: Path) -> bool:
    """A lock file, a writer's temporary (``.NAME.*.tmp``) or its marker: never part of an entry."""
    return rel.name.endswith(".lock") or any(p.startswith(".") and p.endswith((".tmp", f".tmp{MARK_SUFFIX}"))
                                             for p in rel.parts)


def collect_entries(paths: Iterable[Path | str]) -> list[CapturedEntry]:
    """The entries of this cache at ``paths`` (payloads, journals, folders; relative to the cache
    folder or absolute), as ``capture`` collects them, to store in another cache; an entry that
    is not here is left out."""
    root = Path(os.path.abspath(cache_dir()))
    return _collect(root, [Path(os.path.abspath(root / p)) for p in paths])


def _collect(root: Path, paths: Iterable[Path]) -> list[CapturedEntry]:
    """The entries (payload and sidecar, journal, or folder with every file) behind ``paths``; an
    entry gone since (a finished sweep's journal, a training run's partial folder) is skipped."""
    units = set()
    for path in paths:
        try:
            rel = path.relative_to(root)
        except ValueError:  # written under another ZONES_CACHE
            continue
        if len(rel.parts) >= 2 and rel.parts[0] not in NOT_CARRIED_KINDS:
            units.add(root / rel.parts[0] / rel.parts[1])  # a file entry, or the top of a folder entry
    entries = []
    for unit in sorted(units):
        if unit.is_dir():
            files = [p for p in sorted(unit.rglob("*")) if p.is_file() and not _scratch(p.relative_to(root))]
        elif unit.is_file() and not _scratch(unit.relative_to(root)):
            side = sidecar_path(unit)
            files = [unit] + ([side] if side != unit and side.exists() else [])
        else:
            continue
        data = {f.relative_to(root).as_posix(): f.read_bytes() for f in files}
        entries.append(CapturedEntry(unit.relative_to(root).as_posix(), unit.is_dir(), data,
                                     {name: hashlib.sha256(b).hexdigest() for name, b in data.items()}))
    return entries


def _inside(root: Path, name: str) -> Path:
    """``root / name`` for a relative path that stays inside ``root`` (a carried name is data)."""
    rel = Path(name)
    if rel.is_absolute() or os.pardir in rel.parts or not rel.parts:
        raise CacheError(f"a carried cache entry names the path {name!r}, outside the cache folder; refused")
    return root / rel


def store_captured(entries: Iterable[CapturedEntry], source: str = "another machine") -> tuple[int, int]:
    """Take entries captured elsewhere (``capture``) into this machine's cache.

    Every file's sha256 is checked against the digest it travelled with, then a payload against
    its sidecar (``read_entry``), a folder against its manifest (``verify_manifest``); a journal's
    rows are checked one by one and those this cache's journal lacks are appended to it. An entry
    this cache already holds intact is kept as it is (the same key: the same computation). A file
    that arrived damaged is a ``CacheError`` naming it and ``source``. Returns ``(stored, already
    here)``.
    """
    root = cache_dir()
    stored = present = 0
    with silenced():
        for entry in entries:
            for name, data in entry.files.items():
                _inside(root, name)
                if hashlib.sha256(data).hexdigest() != entry.digests.get(name):
                    raise CacheError(f"cache file {name} from {source} arrived damaged (its sha256 differs from "
                                     f"the one computed where it was made); run again to carry it anew")
            target = _inside(root, entry.path)
            if entry.folder:
                new = _store_folder(target, entry, root)
            elif target.suffix == ".jsonl":  # a journal (the loss store's has its key beside it): rows merged
                new = _merge_journal(target, entry.files[entry.path], source)
                new |= _store_key_file(target, entry)
            else:
                new = _store_file(target, entry)
            stored += new
            present += not new
    return stored, present


def _store_key_file(journal: Path, entry: CapturedEntry) -> bool:
    """A journal's key file (``x.json`` beside ``x.jsonl``) where this cache has none yet."""
    side = sidecar_path(journal)
    data = entry.files.get(side.relative_to(cache_dir()).as_posix())
    if data is None or side.exists():
        return False
    atomic_write_bytes(side, data)
    return True


def _store_file(target: Path, entry: CapturedEntry) -> bool:
    payload = entry.files[entry.path]
    side = sidecar_path(target)
    side_name = side.relative_to(cache_dir()).as_posix()
    if side_name not in entry.files or side == target:  # a plain file: kept when already the same
        if target.exists() and target.read_bytes() == payload:
            return False
        atomic_write_bytes(target, payload)
        return True
    stored = json.loads(entry.files[side_name])
    key_parts = {k: v for k, v in stored.items() if k != ENTRY} if isinstance(stored, dict) else {}
    try:
        if read_entry(target, key_parts) is not None:
            return False
    except CacheError:  # this cache's copy is damaged: the verified one replaces it
        pass
    with entry_lock(target):
        atomic_write_bytes(target, payload)
        atomic_write_bytes(side, entry.files[side_name])
    read_entry(target, key_parts)  # CacheError naming the file when it does not verify
    return True


def _store_folder(target: Path, entry: CapturedEntry, root: Path) -> bool:
    manifest = entry.files.get(f"{entry.path}/{MANIFEST}")
    key_parts = None
    if manifest is not None:
        stored = json.loads(manifest)
        key_parts = {k: v for k, v in stored.items() if k != FILES}
        try:
            if verify_manifest(target, key_parts):
                return False
        except CacheError:  # damaged here: replaced by the verified copy
            pass
    with atomic_directory(target) as tmp:
        for name, data in entry.files.items():
            atomic_write_bytes(tmp / Path(name).relative_to(entry.path), data)
    if key_parts is not None:
        verify_manifest(target, key_parts)
    return True


def _merge_journal(target: Path, data: bytes, source: str) -> bool:
    """Append to ``target`` the complete, checksummed rows of ``data`` it lacks (a journal is a
    set of rows: the same key, the same row)."""
    lines = data.split(b"\n")[:-1]  # a torn last line (a write in progress where it was read) is left out
    for no, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or row.pop(ROW_SHA, None) != row_sha(row):
            raise CacheError(f"journal {target.name} line {no} from {source} arrived damaged (its checksum fails); "
                             f"run again to carry it anew")
    with entry_lock(target):
        here = target.read_bytes() if target.exists() else b""
        if here and not here.endswith(b"\n"):
            here = here[: here.rfind(b"\n") + 1]
        known = set(here.split(b"\n"))
        new = [line for line in dict.fromkeys(lines) if line not in known]
        if new:
            atomic_write_bytes(target, here + b"".join(line + b"\n" for line in new))
    return bool(new)
