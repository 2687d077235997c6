"""What a run read from the cache and what it computed.

Every read of a verified entry and every entry written is noted (:func:`note`): ``counting()``
tallies them over a run and the processes it starts ("N cached entries read, M computed"), and
the listeners open in this process (``zones.core.capture.capture``, :func:`listening`) hear each
one, to collect the files of every entry a run read or wrote.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from zones.core.cache import cache_dir

EVENTS_ENV = "ZONES_CACHE_EVENTS"  # a file every process appends its cache events to (see ``counting``)
UNCOUNTED_KINDS = ("book", "study")  # the book's timings, the study's records of its jobs: bookkeeping
ENTRY_SUFFIXES = (".parquet", ".json", ".jsonl", ".npy", ".pt", ".seconds", ".txt", ".csv", ".lock")

_listeners: list = []  # the captures open in this process, innermost last (``add(event, ident, path)``)
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
    for listener in _listeners:
        listener.add(event, ident, Path(path))
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


@contextlib.contextmanager
def listening(listener):
    """Inside the block, ``listener.add(event, ident, path)`` hears every event :func:`note` records
    in this process (``zones.core.capture.capture`` collects the entries behind them)."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


@contextlib.contextmanager
def silenced():
    """Inside the block, nothing is noted: storing entries carried from another cache is neither
    reading nor computing them."""
    _silenced[0] += 1
    try:
        yield
    finally:
        _silenced[0] -= 1
