"""The per-window loss store: every (model, batch of windows, precision, removal) scored once.

One journal per model and precision (``cache_dir()/window-losses/<key>.jsonl``; the key holds
the model's fingerprint, the scoring dtype, the weights' dtype and the device type). Each row
is one removal scored on one **chunk** — a batch of windows, named by the sha256 of its token
ids (:func:`chunk_digest`) — and holds the per-window sums ``nll`` (and ``kl``, ``top1`` when the
agreement scorer computed them), float64 values that survive JSON exactly. A removal is named
by ``zones.measure.sublayer_removal.format_removal`` (``""`` the full model, ``"3,7"`` blocks 3 and 7,
``"5:attn"`` block 5's attention).

Because a chunk is named by its contents, any two requests that score the same model on the
same batch share it: a chapter on a smaller budget of the same eval windows (a prefix of them,
``zones.core.data.nested_order``) reads the batches a larger one scored, the pruning sweep reads
the single-block removals of the ablation, and the healing chapter reads the pruning sweep's
sets. A batch's windows are scored together, always, so a value never depends on which request
came first: a chunk of another length is another chunk.

Rows are only ever appended (each with its checksum, ``zones.core.journal.Journal``); a damaged
row is an error naming the file. A later row for the same (chunk, removal) — with more metrics —
replaces the earlier one in memory.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from zones.core.atomic import atomic_write_text
from zones.core.cache import CacheError, entry_path
from zones.core.data import ids_digest
from zones.core.journal import Journal
from zones.core.refresh import refresh_since

VERSION = "2"  # bump when a stored number changes: 2, the LM head's log-sum-exp over vocabulary blocks
METRICS = ("nll", "kl", "top1")


def chunk_digest(input_ids: torch.Tensor) -> str:
    """A batch of windows by its contents: sha256 of the int64 token ids and their shape."""
    return ids_digest(input_ids.detach().cpu().numpy())[:20]


class LossStore:
    """The rows of one journal, indexed by (chunk, removal); see the module note."""

    def __init__(self, key: dict):
        self.key = dict(kind="window-losses", version=VERSION, **key)
        self.path = entry_path("window-losses", self.key, ext="jsonl")
        self.journal = Journal(self.path, required=("chunk", "removed", "nll"), keep_stale=True)  # shared
        sidecar = self.path.with_suffix(".json")  # the key, for people to read
        if not sidecar.exists():
            atomic_write_text(sidecar, json.dumps(self.key, indent=2, sort_keys=True) + "\n")
        self.rows: dict[tuple[str, str], dict] = {}
        self._size = -1
        self._since: int | None = None  # the refresh (zones.core.refresh.refreshing) the rows were read under
        self._skip = 0                  # rows written before it: not read, so computed again and appended
        self.refresh()

    def refresh(self) -> None:
        """Read rows other processes appended since the last read. Inside a refresh, the rows the
        journal held when this process first read it in that refresh are skipped: they are
        computed again, and the new rows (read after the old ones) replace them for every reader."""
        size = self.path.stat().st_size if self.path.exists() else 0
        since = refresh_since()
        if size == self._size and since == self._since:
            return
        try:
            rows = self.journal.rows()
        except CacheError:
            if since is None or since == self._since:
                raise
            self.journal.discard()  # --refresh replaces a damaged journal: its rows would be skipped anyway
            rows, size = [], 0
        if since != self._since:
            self._since, self._skip = since, (len(rows) if since is not None else 0)
        self.rows = {(row["chunk"], row["removed"]): row for row in rows[self._skip:]}
        self._size = size

    def get(self, chunk: str, removed: str, metrics: tuple[str, ...]) -> dict | None:
        """The row of ``removed`` on ``chunk`` if it holds every metric in ``metrics``."""
        row = self.rows.get((chunk, removed))
        return row if row is not None and all(m in row for m in metrics) else None

    def append(self, chunk: str, removed: str, values: dict[str, np.ndarray]) -> None:
        """Record one removal's per-window values on one chunk (kept metrics it had are merged)."""
        old = self.rows.get((chunk, removed), {})
        row = dict({m: old[m] for m in METRICS if m in old}, chunk=chunk, removed=removed,
                   **{m: [float(x) for x in np.asarray(v, dtype=np.float64)] for m, v in values.items()})
        self.journal.append(row)
        self.rows[(chunk, removed)] = row
        self._size = self.path.stat().st_size


_OPEN: dict[Path, LossStore] = {}


def open_store(key: dict) -> LossStore:
    """The store of one model and precision (``Subject.key()``), read once per process and
    refreshed when another process appended to it."""
    path = entry_path("window-losses", dict(kind="window-losses", version=VERSION, **key), ext="jsonl")
    store = _OPEN.get(path)
    if store is None or not path.parent.exists():
        store = _OPEN[path] = LossStore(key)
    else:
        store.refresh()
    return store
