"""Atomic files and folders: a write leaves the old content or the new, never half; and a file's hash.

Writes go to a temporary beside the target that is renamed into place, so a crash never leaves a
file a later run would trust. A temporary is zones' own only where its marker says so
(:func:`make_temporary`); the writers of one folder hold its lock (:func:`folder_lock`), so the
next writer of a target removes what a killed one left. A full disk is a ``DiskFullError`` that
names the file or folder being written.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import threading
from pathlib import Path
from typing import Callable

from zones.core.tally import note

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: entries are written without locks
    fcntl = None


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


def file_stamp(path: Path) -> tuple | None:
    """(device, inode, size, mtime_ns, ctime_ns) of a file, None when absent: what an in-process
    memo of a file's content is keyed by. Rewriting, replacing or touching the file changes it
    (ctime too, which no caller can set back)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def hash_file(digest, path: Path):
    """``digest`` (a ``hashlib`` hash) updated with a file's bytes, read in 16 MB pieces."""
    with open(path, "rb") as handle:
        while piece := handle.read(16 * 2**20):
            digest.update(piece)
    return digest


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 16 MB pieces."""
    return hash_file(hashlib.sha256(), path).hexdigest()
