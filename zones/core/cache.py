"""Where expensive results live, how they are keyed, and how a read knows they are intact.

A cached result is a file ``cache_dir()/<kind>/<key>.<ext>``. The key hashes a JSON dict of
everything that determines the result (model fingerprint, corpus fingerprint, parameters);
the dict itself is saved beside the result as the sidecar ``<key>.json``, for people to read,
together with the payload's sha256 and schema (``"_entry"``: ``sha256, bytes`` and, for a
table, ``columns, rows``). Every read checks the payload against its sidecar: a damaged entry
(truncated, edited, a sidecar of another key) raises ``CacheError``, one line naming the file,
the cause and what to delete; it is never used. A payload without a verifiable sidecar (written
by an older zones, or a crash between the two writes) is recomputed.

Writes go to a temporary file that is renamed into place, so a crash never leaves a file a
later run would trust; payload and sidecar are committed under one lock, so concurrent runs
never pair one run's payload with another's sidecar. Sweeps that produce one row at a time
append to a journal (``<key>.partial.jsonl``), one JSON row per line with its own sha256; a
resumed sweep skips what the journal holds, and only the finished table is written under the
final name.

Every read of a verified entry and every entry written is noted (``note``): ``counting()``
tallies them over a run and the processes it starts ("N cached entries read, M computed"), and
``capture()`` collects the files of every entry a run read or wrote, so that another machine's
cache can take them in with ``store_captured`` (each file's sha256 checked on arrival).
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import secrets
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: entries are written without locks
    fcntl = None

ENTRY = "_entry"  # the sidecar's record of the payload: sha256, bytes, and columns/rows for a table
ROW_SHA = "_sha"  # a journal row's checksum field
ROW_KEY = "_key"  # a journal row's key: the cache key its journal was written under


class CacheError(RuntimeError):
    """A cache file is damaged or does not belong to its key (the message names it and the remedy).
    ``path`` and ``cause``, where given: the damaged file and what is wrong with it, for a caller
    that repairs the entry itself and says so in its own words."""

    def __init__(self, message: str, *, path: Path | None = None, cause: str | None = None):
        super().__init__(message)
        self.path, self.cause = path, cause


class DiskFullError(OSError):
    """A write ran out of space (the message names the file or folder being written)."""

    def __init__(self, path: Path, what: str = "writing"):
        self.message = (f"no space left on the device {what} {path}; free space there (or write elsewhere) "
                        f"and run again")
        super().__init__(self.message)
        self.errno = errno.ENOSPC
        self.filename = str(path)

    def __str__(self) -> str:
        return self.message


def is_disk_full(err: BaseException) -> bool:
    """Whether ``err`` says the disk is full: an ``OSError`` ENOSPC, or the text of one that a
    library in another language (safetensors' Rust writer) turned into its own exception."""
    if isinstance(err, DiskFullError):
        return False  # already names its path
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return True
    text = str(err)
    return "No space left on device" in text or "os error 28" in text or "StorageFull" in text


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


def _canonical(key_parts: Any) -> str:
    return json.dumps(key_parts, sort_keys=True, default=str)


def cache_key(key_parts: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable dict."""
    return hashlib.sha256(_canonical(key_parts).encode()).hexdigest()[:20]


def entry_path(kind: str, key_parts: dict[str, Any], ext: str = "parquet") -> Path:
    folder = cache_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{cache_key(key_parts)}.{ext}"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def readable_mode(path: Path, directory: bool = False) -> None:
    """Give a temporary file (0600) or folder (0700) the permissions the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


# A temporary is zones' own only where its marker says so: ``.NAME.<random>.tmp`` (file or folder)
# with ``.NAME.<random>.tmp.zones`` beside it, holding MARK_TEXT, written before the temporary exists
# and removed after it is gone. Clean-up removes marked temporaries only: a user's own
# ``.NAME.mybackup.tmp`` has no marker and is left alone.
MARK_SUFFIX = ".zones"
MARK_TEXT = b"zones: a temporary of an atomic write; the next write of the same name removes it\n"


def temporary_marker(tmp: Path) -> Path:
    """The marker beside the temporary ``tmp`` that says zones made it."""
    tmp = Path(tmp)
    return tmp.with_name(tmp.name + MARK_SUFFIX)


def mark_temporary(tmp: Path) -> Path:
    """Write ``tmp``'s marker (new: an existing file of that name is never overwritten)."""
    marker = temporary_marker(tmp)
    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
    try:
        os.write(fd, MARK_TEXT)
    finally:
        os.close(fd)
    return marker


def is_marked_temporary(tmp: Path) -> bool:
    """Whether zones made ``tmp``: its marker exists and holds zones' words."""
    marker = temporary_marker(tmp)
    try:
        return marker.is_file() and marker.read_bytes() == MARK_TEXT
    except OSError:
        return False


def make_temporary(target: Path, *, directory: bool = False) -> Path:
    """A new, empty temporary ``.NAME.<random>.tmp`` beside ``target`` (a folder with
    ``directory``, else a file), marked first (:func:`mark_temporary`), so a killed writer's
    leftovers are always recognisable as zones' own. Its mode is what the umask allows (not
    ``mkstemp``'s 0600): the result is an ordinary file or folder."""
    target = Path(target)
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            mark_temporary(tmp)
        except FileExistsError:
            continue
        try:
            if directory:
                os.mkdir(tmp, 0o777)
            else:
                os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:  # somebody else's file of that name: leave it, pick another
            temporary_marker(tmp).unlink(missing_ok=True)
        except BaseException:
            temporary_marker(tmp).unlink(missing_ok=True)
            raise
    raise FileExistsError(f"no free temporary name beside {target} after 100 tries")


def remove_temporary(tmp: Path) -> None:
    """Remove the temporary ``tmp`` (file or folder, if still there), then its marker."""
    tmp = Path(tmp)
    if tmp.is_dir() and not tmp.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
    elif tmp.exists() or tmp.is_symlink():
        tmp.unlink(missing_ok=True)
    temporary_marker(tmp).unlink(missing_ok=True)


def remove_stale_temporaries(target: Path, *, directory: bool | None = None) -> list[Path]:
    """Remove what killed writers of ``target`` left: the marked temporaries ``.NAME.*.tmp``
    (folders with ``directory=True``, files with ``False``, both with ``None``) and markers whose
    temporary is gone. Call it only while holding the lock every writer of ``target`` holds.
    Returns the temporaries removed; unmarked ones (not zones') are kept."""
    removed = []
    for stale in stale_temporaries(target, directory=directory):
        remove_temporary(stale)
        removed.append(stale)
    target = Path(target)
    if target.parent.exists():
        for marker in target.parent.glob(f".{target.name}.*.tmp{MARK_SUFFIX}"):
            tmp = marker.with_name(marker.name[: -len(MARK_SUFFIX)])
            if not tmp.exists() and is_marked_temporary(tmp):  # its writer was killed after removing it
                marker.unlink(missing_ok=True)
    return removed


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a marked temporary file (:func:`make_temporary`)
    renamed into place: old or new, never half. A full disk is a ``DiskFullError`` naming
    ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = make_temporary(path)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except OSError as err:
        if is_disk_full(err):
            raise DiskFullError(path, f"writing {len(data)} bytes to") from err
        raise
    finally:
        if tmp is not None:
            remove_temporary(tmp)


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


_HELD_FOLDERS: dict[tuple[int, int], int] = {}  # folders this process holds the writers' lock of: depth
_HELD_GUARD = threading.Lock()


@contextlib.contextmanager
def folder_lock(folder: Path, on_wait: Callable[[], None] | None = None):
    """Hold the writers' lock of ``folder`` (an ``flock`` on the folder itself: no lock file is
    left anywhere); the OS releases it if the process dies. Re-entrant within a process.
    ``on_wait()`` is called once when another process holds it (then this one waits). Without
    ``fcntl`` (not POSIX) it does nothing."""
    folder = Path(folder)
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    ident = (os.fstat(fd).st_dev, os.fstat(fd).st_ino)
    with _HELD_GUARD:
        held = _HELD_FOLDERS.get(ident, 0)
        _HELD_FOLDERS[ident] = held + 1
    try:
        if not held:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if on_wait is not None:
                    on_wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with _HELD_GUARD:
            _HELD_FOLDERS[ident] -= 1
            if not _HELD_FOLDERS[ident]:
                del _HELD_FOLDERS[ident]
        os.close(fd)  # closing the last descriptor releases the lock


@contextlib.contextmanager
def atomic_directory(target: Path, *, keep_existing: bool = False):
    """Yield a temporary folder beside ``target``; on success it is renamed onto ``target``.

    A failure inside the ``with`` block removes the temporary folder, so a half-written
    directory is never visible under the final name. An existing ``target`` is replaced (moved
    aside, then removed) unless ``keep_existing`` (another process finished the same work
    first: its copy is kept and this one discarded). Writers of one folder take its lock
    (:func:`folder_lock`) for the whole write, so the temporary folders ``.<target>.*.tmp`` a
    killed writer left are removed by the next writer of the same target: only those zones
    marked as its own (:func:`make_temporary`), never a user's folder of a similar name. A full
    disk is a ``DiskFullError`` naming ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(target.parent):
        remove_stale_temporaries(target, directory=True)  # every live writer of target would hold the lock
        tmp = make_temporary(target, directory=True)
        try:
            try:
                yield tmp
            except Exception as err:
                if is_disk_full(err):
                    raise DiskFullError(target) from err
                raise
            if target.exists():
                if keep_existing:
                    return
                old = make_temporary(target, directory=True)
                os.replace(target, old)  # a folder cannot be renamed onto a non-empty one
                try:
                    os.replace(tmp, target)
                finally:
                    remove_temporary(old)
            else:
                os.replace(tmp, target)
            note("computed", target)
        finally:
            remove_temporary(tmp)


def stale_temporaries(target: Path, *, directory: bool | None = True) -> list[Path]:
    """The marked temporaries (:func:`make_temporary`) killed writers left beside ``target``:
    folders (``directory=True``, what ``atomic_directory`` leaves), files (``False``) or both
    (``None``). A ``.NAME.*.tmp`` without zones' marker is somebody else's, never listed."""
    target = Path(target)
    if not target.parent.exists():
        return []
    return sorted(p for p in target.parent.glob(f".{target.name}.*.tmp")
                  if (directory is None or p.is_dir() == directory) and is_marked_temporary(p))


def write_table(df: pd.DataFrame, path: Path) -> Path:
    """Write a table as CSV or Parquet (by suffix), atomically."""
    path = Path(path)
    atomic_write_bytes(path, _table_bytes(df, path.suffix))
    return path


def _table_bytes(df: pd.DataFrame, suffix: str) -> bytes:
    buffer = io.BytesIO()
    if suffix == ".parquet":
        df.to_parquet(buffer, index=False)
    else:
        buffer.write(df.to_csv(index=False).encode("utf-8"))
    return buffer.getvalue()


def read_table(path: Path) -> pd.DataFrame:
    path = Path(path)
    return read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


def read_parquet(source: Path | bytes) -> pd.DataFrame:
    """A Parquet table (a file or its bytes), read without starting a thread. A process in which
    Arrow has started its thread pools may abort as it exits ("terminate called without an
    active exception", SIGABRT; 9 of 300 short processes under load here, with pandas'
    ``read_parquet``), failing a kernel, a worker or a CLI run after its work was done. Even
    ``use_threads=False`` starts one; ``ParquetFile.read`` on an in-memory buffer starts none.
    The book's tables are small: one thread reads them as fast."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = Path(source).read_bytes() if isinstance(source, (str, Path)) else source
    table = pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)
    return table.to_pandas(use_threads=False)


# --- refreshing: recompute instead of reading ------------------------------------------------------

REFRESH_ENV = "ZONES_REFRESH_SINCE"  # set inside refreshing(): what was written before it is not read


def refresh_since() -> int | None:
    """The start of the refresh this process is inside (the cache filesystem's clock, ns), or None."""
    value = os.environ.get(REFRESH_ENV, "")
    return int(value) if value.isdigit() else None


def _filesystem_now() -> int:
    """The cache filesystem's clock at its next tick (ns): the time stamp of a file written then,
    which what is written later reaches and what was written before does not (the kernel's file
    clock is coarser than ``time.time_ns``: a file written a moment ago may share the current
    tick, so the refresh starts at the next one, a few milliseconds away)."""
    fd, probe = tempfile.mkstemp(dir=cache_dir(), prefix=".refresh-clock.")
    try:
        first = os.fstat(fd).st_mtime_ns
        for _ in range(1000):  # a tick is 1-10 ms; give up after about a second
            time.sleep(0.001)
            os.utime(probe)
            now = os.stat(probe).st_mtime_ns
            if now > first:
                return now
        return first + 1
    finally:
        os.close(fd)
        os.remove(probe)


@contextlib.contextmanager
def refreshing(on: bool = True, since: int | None = None):
    """``--refresh``: inside the block, every cache entry and journal written before it began is
    recomputed instead of read, and replaced; those written inside are read as usual, so each is
    computed once. Processes started inside (notebook kernels, local Ray workers) inherit it
    (``$ZONES_REFRESH_SINCE``); ``since`` carries a driver's start to a job elsewhere. A block
    inside another refresh keeps the outer start. Converted models and trained runs (checksummed
    folders) are read as usual: ``zones train --refresh`` retrains."""
    if not on or refresh_since() is not None:
        yield
        return
    os.environ[REFRESH_ENV] = str(since if since is not None else _filesystem_now())
    try:
        yield
    finally:
        os.environ.pop(REFRESH_ENV, None)


def written_before_refresh(path: Path) -> bool:
    """Whether ``path`` exists and was written before the refresh this process is inside."""
    since = refresh_since()
    if since is None:
        return False
    try:
        return Path(path).stat().st_mtime_ns < since
    except OSError:
        return False


# --- verified entries ------------------------------------------------------------------------------

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
    sidecar = json.dumps({**json.loads(_canonical(key_parts)), ENTRY: record}, indent=2, sort_keys=True)
    with entry_lock(path):
        for written in (Path(path), sidecar_path(path)):  # every writer of the entry holds its lock: these are
            remove_stale_temporaries(written, directory=False)  # a killed writer's temporaries
        atomic_write_bytes(path, data)
        atomic_write_text(sidecar_path(path), sidecar)
    note("computed", path)


def read_entry(path: Path, key_parts: dict[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
    """The verified payload at ``path`` and its sidecar record, or None when there is no
    verifiable entry (no payload, or no sidecar with a checksum: recompute it), or when it was
    written before the refresh this process is inside (:func:`refreshing`).

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
        if stored != json.loads(_canonical(key_parts)):
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
    write_entry(path, key_parts, _table_bytes(df, ".parquet"), columns=[str(c) for c in df.columns],
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


# --- checksummed directories ------------------------------------------------------------------------

MANIFEST = "zones-manifest.json"  # a directory's record of its files: sha256 and bytes of each
FILES = "_files"


def file_stamp(path: Path) -> tuple | None:
    """(device, inode, size, mtime_ns, ctime_ns) of a file, None when absent: what an in-process
    memo of a file's content is keyed by. Rewriting, replacing or touching the file changes it
    (ctime too, which no caller can set back)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 16 MB pieces."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while piece := handle.read(16 * 2**20):
            digest.update(piece)
    return digest.hexdigest()


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
    manifest = {**json.loads(_canonical(key_parts)), FILES: files}
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
    if stored != json.loads(_canonical(key_parts)):
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


# --- journals of resumable sweeps ------------------------------------------------------------------

def _row_sha(row: dict[str, Any]) -> str:
    return hashlib.sha256(_canonical(row).encode()).hexdigest()[:16]


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
    refresh this process is inside (:func:`refreshing`), unless ``keep_stale`` (a journal shared
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
            if sha != _row_sha(row):
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
        line = json.dumps({**row, ROW_SHA: _row_sha(row)})
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


# --- what a run read and computed, and carrying entries to another cache -----------------------------

EVENTS_ENV = "ZONES_CACHE_EVENTS"  # a file every process appends its cache events to (see ``counting``)
UNCOUNTED_KINDS = ("book", "study")  # the book's timings, the study's records of its jobs: bookkeeping
NOT_CARRIED_KINDS = ("models", "study")  # converted GGUF copies: each machine converts its own (~0.5 GB each)
ENTRY_SUFFIXES = (".parquet", ".json", ".jsonl", ".npy", ".pt", ".seconds", ".txt", ".csv", ".lock")

_captures: list[_Capture] = []  # the captures open in this process, innermost last
_silenced = [0]  # > 0 while storing carried entries: storing is neither reading nor computing


def entry_id(path: Path | str) -> str | None:
    """``KIND/KEY`` of the cache entry ``path`` belongs to (its payload, sidecar, journal, folder
    or a file inside that folder), or None for a path outside the cache folder."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(cache_dir()))
    parts = Path(rel).parts
    if len(parts) < 2 or parts[0] == os.pardir:
        return None
    kind, name = parts[0], parts[1]
    for tail in (".partial.jsonl", ".partial"):  # a sweep's journal or a run in progress: the same entry
        if name.endswith(tail):
            return f"{kind}/{name[:-len(tail)]}"
    stem, ext = os.path.splitext(name)
    return f"{kind}/{stem if len(parts) == 2 and ext in ENTRY_SUFFIXES else name}"


def note(event: str, path: Path | str) -> None:
    """Record that the cache entry at ``path`` was ``"read"`` (verified and used) or
    ``"computed"`` (written): for the captures open in this process and, when
    ``$ZONES_CACHE_EVENTS`` names a file, in that file (one ``event<TAB>KIND/KEY`` line)."""
    if _silenced[0]:
        return
    ident = entry_id(path)
    if ident is None or ident.split("/")[0] in UNCOUNTED_KINDS:
        return
    for open_capture in _captures:
        open_capture.add(event, ident, Path(path))
    events = os.environ.get(EVENTS_ENV)
    if events:
        try:
            with open(events, "a", encoding="utf-8") as handle:
                handle.write(f"{event}\t{ident}\n")
        except OSError:  # the tally is a report, never a reason to fail the computation
            pass


@dataclass
class Tally:
    """The cache entries (``KIND/KEY``) a run read and those it computed."""

    read: set[str] = field(default_factory=set)
    computed: set[str] = field(default_factory=set)

    def add(self, event: str, ident: str) -> None:
        (self.computed if event == "computed" else self.read).add(ident)

    def update(self, other: Tally) -> None:
        self.read |= other.read
        self.computed |= other.computed

    @property
    def n_read(self) -> int:
        """Entries read and not computed in the same run."""
        return len(self.read - self.computed)

    @property
    def n_computed(self) -> int:
        return len(self.computed)

    def sentence(self) -> str:
        """``"12 cached entries read, 0 computed"``."""
        return f"{self.n_read} cached entr{'y' if self.n_read == 1 else 'ies'} read, {self.n_computed} computed"


EVENTS_PREFIX = "zones-cache-events-"   # + the pid of the process that counts, so its leftovers can be told apart


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (one of another user's counts as running)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_dead_event_files() -> list[Path]:
    """Remove the event files (``zones-cache-events-PID-*.tsv`` in the temporary folder) that a
    killed count left: those whose process is gone. A live count's file is kept. Returns the
    files removed."""
    removed = []
    for path in Path(tempfile.gettempdir()).glob(f"{EVENTS_PREFIX}*-*.tsv"):
        pid = path.name[len(EVENTS_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) > 0 and not pid_alive(int(pid)):
            with contextlib.suppress(OSError):  # another count may be removing it too
                path.unlink()
                removed.append(path)
    return removed


@contextlib.contextmanager
def counting():
    """Tally the cache entries read and computed inside the block by this process and by every
    process started meanwhile (a notebook kernel, a local Ray worker: they inherit
    ``$ZONES_CACHE_EVENTS``). Yields a ``Tally``, filled when the block ends. The events go to
    a file named with this process's id, removed when the block ends; one that a killed run left
    is removed by the next count on this machine (:func:`remove_dead_event_files`)."""
    tally = Tally()
    outer = os.environ.get(EVENTS_ENV)
    remove_dead_event_files()
    fd, events = tempfile.mkstemp(prefix=f"{EVENTS_PREFIX}{os.getpid()}-", suffix=".tsv")
    os.close(fd)
    os.environ[EVENTS_ENV] = events
    try:
        yield tally
    finally:
        if outer is None:
            os.environ.pop(EVENTS_ENV, None)
        else:
            os.environ[EVENTS_ENV] = outer
        with open(events, encoding="utf-8") as handle:
            lines = handle.read()
        os.remove(events)
        for line in lines.splitlines():
            event, _, ident = line.partition("\t")
            if ident:
                tally.add(event, ident)
        if outer:  # an enclosing count sees these events too
            with contextlib.suppress(OSError), open(outer, "a", encoding="utf-8") as handle:
                handle.write(lines)


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
    _captures.append(current)
    try:
        yield result
    finally:
        _captures.remove(current)
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


@contextlib.contextmanager
def _quiet():
    _silenced[0] += 1
    try:
        yield
    finally:
        _silenced[0] -= 1


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
    with _quiet():
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
        if not isinstance(row, dict) or row.pop(ROW_SHA, None) != _row_sha(row):
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
