"""``--refresh``: recompute what the cache held before the refresh began, instead of reading it.

Inside :func:`refreshing`, every entry and journal written before the block began is recomputed
and replaced; what is written inside is read as usual, so each is computed once.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path

from zones.core.cache import cache_dir

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
