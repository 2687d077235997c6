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
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import tempfile
import threading
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
    """A cache file is damaged or does not belong to its key (the message names it and the remedy)."""


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


def _canonical(parts: Any) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


def cache_key(parts: dict[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable dict."""
    return hashlib.sha256(_canonical(parts).encode()).hexdigest()[:20]


def entry_path(kind: str, parts: dict[str, Any], ext: str = "parquet") -> Path:
    folder = cache_dir() / kind
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{cache_key(parts)}.{ext}"


def sidecar_path(path: Path) -> Path:
    return Path(path).with_suffix(".json")


def readable_mode(path: Path, directory: bool = False) -> None:
    """Give a temporary file (0600) or folder (0700) the permissions the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, (0o777 if directory else 0o666) & ~umask)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed into place: old or new, never
    half. A full disk is a ``DiskFullError`` naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        readable_mode(tmp)
        os.replace(tmp, path)
    except OSError as err:
        if is_disk_full(err):
            raise DiskFullError(path, f"writing {len(data)} bytes to") from err
        raise
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


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
    killed writer left are removed by the next writer of the same target. A full disk is a
    ``DiskFullError`` naming ``target``.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with folder_lock(target.parent):
        for stale in stale_temporaries(target):  # every live writer of target would hold the lock
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
        try:
            readable_mode(tmp, directory=True)  # mkdtemp makes it private; the result is an ordinary folder
            try:
                yield tmp
            except Exception as err:
                if is_disk_full(err):
                    raise DiskFullError(target) from err
                raise
            if target.exists():
                if keep_existing:
                    return
                old = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
                os.replace(target, old)  # a folder cannot be renamed onto a non-empty one
                try:
                    os.replace(tmp, target)
                finally:
                    shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


def stale_temporaries(target: Path) -> list[Path]:
    """The temporary folders ``atomic_directory`` left beside ``target`` when its writer died."""
    target = Path(target)
    if not target.parent.exists():
        return []
    return sorted(p for p in target.parent.glob(f".{target.name}.*.tmp") if p.is_dir())


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
    return pd.read_parquet(path) if path.suffix == ".parquet" else pd.read_csv(path)


# --- verified entries ------------------------------------------------------------------------------

@contextlib.contextmanager
def entry_lock(path: Path, shared: bool = False):
    """Hold a lock on ``path``'s entry (shared for reading, exclusive for writing); the OS
    releases it if the process dies. Without ``fcntl`` (not POSIX) it does nothing."""
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    lock = Path(path).with_suffix(".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _damaged(path: Path, cause: str) -> CacheError:
    side = sidecar_path(path)
    return CacheError(f"cache entry {path} is damaged ({cause}); delete {path} and {side.name} "
                      f"to recompute it")


def write_entry(path: Path, parts: dict[str, Any], data: bytes, **schema: Any) -> None:
    """Store ``data`` at ``path`` and its sidecar: ``parts`` plus sha256, size and ``schema``
    (under the entry's lock, which also lets it remove the temporaries a killed writer left)."""
    record = dict(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), **schema)
    sidecar = json.dumps({**json.loads(_canonical(parts)), ENTRY: record}, indent=2, sort_keys=True)
    with entry_lock(path):
        for written in (Path(path), sidecar_path(path)):  # every writer of the entry holds its lock: these are
            for stale in written.parent.glob(f".{written.name}.*.tmp"):  # a killed writer's temporaries
                if stale.is_file():
                    stale.unlink(missing_ok=True)
        atomic_write_bytes(path, data)
        atomic_write_text(sidecar_path(path), sidecar)


def read_entry(path: Path, parts: dict[str, Any]) -> tuple[bytes, dict[str, Any]] | None:
    """The verified payload at ``path`` and its sidecar record, or None when there is no
    verifiable entry (no payload, or no sidecar with a checksum: recompute it).

    Raises ``CacheError`` when the sidecar is unreadable or belongs to other parts, or the
    payload's size or sha256 differs from the sidecar's.
    """
    path = Path(path)
    side = sidecar_path(path)
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
        if stored != json.loads(_canonical(parts)):
            raise CacheError(f"cache sidecar {side} describes another computation than its key "
                             f"{path.stem}; delete {side} and {path.name} to recompute the entry")
        data = path.read_bytes()
    if len(data) != record.get("bytes") or hashlib.sha256(data).hexdigest() != record.get("sha256"):
        raise _damaged(path, f"{len(data)} bytes whose sha256 differs from the one its sidecar "
                             f"recorded for {record.get('bytes')} bytes")
    return data, record


def cached_table(kind: str, parts: dict[str, Any], compute: Callable[[], pd.DataFrame],
                 refresh: bool = False) -> pd.DataFrame:
    """Return the cached table for ``parts``, computing and storing it on a miss."""
    path = entry_path(kind, parts)
    if not refresh:
        found = read_cached_table(path, parts)
        if found is not None:
            return found
    df = compute()
    write_cached_table(df, path, parts)
    return df


def write_cached_table(df: pd.DataFrame, path: Path, parts: dict[str, Any]) -> None:
    write_entry(path, parts, _table_bytes(df, ".parquet"), columns=[str(c) for c in df.columns],
                rows=len(df))


def read_cached_table(path: Path, parts: dict[str, Any]) -> pd.DataFrame | None:
    """The verified table at ``path`` (None on a miss; ``CacheError`` when damaged)."""
    found = read_entry(path, parts)
    if found is None:
        return None
    data, record = found
    try:
        df = pd.read_parquet(io.BytesIO(data))
    except Exception as err:  # noqa: BLE001 - any parse failure is a damaged entry
        raise _damaged(Path(path), f"unreadable parquet: {err}") from None
    if [str(c) for c in df.columns] != record.get("columns") or len(df) != record.get("rows"):
        raise _damaged(Path(path), f"columns/rows {list(df.columns)}/{len(df)} differ from the "
                                   f"sidecar's {record.get('columns')}/{record.get('rows')}")
    return df


# --- checksummed directories ------------------------------------------------------------------------

MANIFEST = "zones-manifest.json"  # a directory's record of its files: sha256 and bytes of each
FILES = "_files"


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


def write_manifest(directory: Path, parts: dict[str, Any]) -> Path:
    """Record the sha256 and size of every file under ``directory`` (recursively), with the key
    ``parts``, in ``<directory>/zones-manifest.json``. Call it last, once every file is written
    (inside ``atomic_directory``, so the manifest and the files appear together)."""
    directory = Path(directory)
    files = {p.relative_to(directory).as_posix(): dict(sha256=file_sha256(p), bytes=p.stat().st_size)
             for p in _directory_files(directory)}
    manifest = {**json.loads(_canonical(parts)), FILES: files}
    path = directory / MANIFEST
    atomic_write_text(path, json.dumps(manifest, indent=2, sort_keys=True))
    return path


def verify_manifest(directory: Path, parts: dict[str, Any]) -> bool:
    """Check every file of ``directory`` against its ``zones-manifest.json``.

    Returns False when the directory or its manifest is absent (nothing verifiable: recompute
    it), True when every file matches. Raises ``CacheError``, one line naming the damaged file
    and what to delete, when the manifest is unreadable or describes other ``parts``, or a file
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
        raise CacheError(f"cache manifest {path} is not valid JSON ({err}); {remedy}") from None
    if not isinstance(stored, dict) or not isinstance(stored.get(FILES), dict):
        raise CacheError(f"cache manifest {path} lists no files; {remedy}")
    files = stored.pop(FILES)
    if stored != json.loads(_canonical(parts)):
        raise CacheError(f"cache manifest {path} describes another computation than this folder's key; "
                         f"{remedy}")
    present = {p.relative_to(directory).as_posix(): p for p in _directory_files(directory)}
    for name, record in sorted(files.items()):
        file = directory / name
        if name not in present:
            raise CacheError(f"cache entry {directory} is damaged ({name} is missing); {remedy}")
        size = file.stat().st_size
        if not isinstance(record, dict) or size != record.get("bytes") or file_sha256(file) != record.get("sha256"):
            raise CacheError(f"cache file {file} is damaged ({size} bytes whose sha256 differs from the "
                             f"one its manifest recorded); {remedy}")
    extra = sorted(set(present) - set(files))
    if extra:
        raise CacheError(f"cache entry {directory} is damaged ({directory / extra[0]} is not in its "
                         f"manifest); {remedy}")
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
    by an older zones) cannot be checked and is started again.
    """

    def __init__(self, path: Path, required: Sequence[str] = ()):
        self.path = Path(path)
        self.required = tuple(required)
        self.key = self.path.name.split(".", 1)[0]
        self.path.parent.mkdir(parents=True, exist_ok=True)
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

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


def resumable_table(kind: str, parts: dict[str, Any], tasks: Iterable[Any],
                    task_id: Callable[[Any], str], run: Callable[[Any], dict[str, Any]],
                    refresh: bool = False) -> pd.DataFrame:
    """A table with one row per task, computed row by row and resumed after an interruption.

    ``run(task)`` returns the row (a dict); ``task_id(task)`` names the task in the journal.
    Only when every task is done is the table written under its final name. Journal rows
    that lack a field the others have are damaged (``CacheError``).
    """
    path = entry_path(kind, parts)
    if not refresh:
        found = read_cached_table(path, parts)
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
    write_cached_table(df, path, parts)
    journal.discard()
    return df
