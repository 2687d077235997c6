"""Checksummed folders: a folder entry (a converted model, a trained run, a tokenizer) records the
sha256 and size of every file in its manifest, ``zones-manifest.json``, checked on every read.

Write one inside ``zones.core.atomic.atomic_directory``, the manifest last, so the files and their
manifest appear together.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zones.core.atomic import atomic_write_text, file_sha256
from zones.core.cache import CacheError, canonical
from zones.core.tally import note

MANIFEST = "zones-manifest.json"  # a directory's record of its files: sha256 and bytes of each
FILES = "_files"


def _directory_files(directory: Path) -> list[Path]:
    return sorted(p for p in Path(directory).rglob("*")
                  if p.is_file() and p.name != MANIFEST and not p.name.endswith(".lock"))


def write_manifest(directory: Path, key_parts: dict[str, Any]) -> Path:
    """Record the sha256 and size of every file under ``directory`` (recursively), with the key
    ``key_parts``, in ``<directory>/zones-manifest.json``. Call it last, once every file is written
    (inside ``atomic_directory``, so the manifest and the files appear together)."""
    directory = Path(directory)
    files = {p.relative_to(directory).as_posix(): dict(sha256=file_sha256(p), bytes=p.stat().st_size)
             for p in _directory_files(directory)}
    manifest = {**json.loads(canonical(key_parts)), FILES: files}
    path = directory / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True))
    return path


def verify_manifest(directory: Path, key_parts: dict[str, Any]) -> bool:
    """Check every file of ``directory`` against its ``zones-manifest.json``.

    Returns False when the directory or its manifest is absent (nothing verifiable: recompute
    it), True when every file matches. Raises ``CacheError``, one line naming the damaged file
    and what to delete, when the manifest is unreadable or describes other ``key_parts``, or a file
    is missing, added, or differs in size or sha256.
    """
    directory = Path(directory)
    path = directory / MANIFEST
    if not directory.is_dir() or not path.exists():
        return False
    remedy = f"delete the folder {directory} to recompute it"
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CacheError(f"cache manifest {path} is not valid JSON ({err}); {remedy}", path=path,
                         cause=f"not valid JSON: {err}") from None
    if not isinstance(stored, dict) or not isinstance(stored.get(FILES), dict):
        raise CacheError(f"cache manifest {path} lists no files; {remedy}", path=path, cause="it lists no files")
    files = stored.pop(FILES)
    if stored != json.loads(canonical(key_parts)):
        raise CacheError(f"cache manifest {path} describes another computation than this folder's key; "
                         f"{remedy}", path=path, cause="it describes another computation")
    present = {p.relative_to(directory).as_posix(): p for p in _directory_files(directory)}
    for name, record in sorted(files.items()):
        file = directory / name
        if name not in present:
            raise CacheError(f"cache entry {directory} is damaged ({name} is missing); {remedy}", path=file,
                             cause="missing")
        size = file.stat().st_size
        if not isinstance(record, dict) or size != record.get("bytes") or file_sha256(file) != record.get("sha256"):
            cause = f"{size} bytes whose sha256 differs from the one its manifest recorded"
            raise CacheError(f"cache file {file} is damaged ({cause}); {remedy}", path=file, cause=cause)
    extra = sorted(set(present) - set(files))
    if extra:
        raise CacheError(f"cache entry {directory} is damaged ({directory / extra[0]} is not in its "
                         f"manifest); {remedy}", path=directory / extra[0], cause="not in its manifest")
    note("read", directory)
    return True
