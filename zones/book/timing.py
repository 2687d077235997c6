"""A build's clock: the reference forward timed on this machine, and the record of what each chapter cost.

Every time is also said in one unit, the same on every machine: the **reference forward** (one
float32 SmolLM2-135M forward of 2,048 tokens, ``zones.core.progress``), timed by
:func:`reference_forward_seconds`. Each build records, per chapter, its seconds, reference forwards
and the work it counted, in the cache (``cache_dir()/book``, :func:`last_record`): the next build
with the same parameters and budget weighs its estimate on it (``zones.book.estimate``).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from zones.core.cache import CacheError, entry_path
from zones.core.entries import read_entry, write_entry

REFERENCE_SEQ_LEN = 256         # the reference forward: 8 windows of 256 tokens


def reference_forward_seconds(repeats: int = 2) -> float | None:
    """Seconds of one reference forward on this machine now: the default model (SmolLM2-135M)
    in float32 over 2,048 tokens (8 stdlib eval windows of 256), body and LM head, the fastest
    of ``repeats`` after a one-window warm-up (about ``repeats`` + 0.2 reference forwards, and
    the model's load: a cold cache converts it here, once, instead of in the first chapter).
    ``None`` when the default model cannot be loaded (the estimate then runs on seconds)."""
    import torch

    from zones.core.data import corpus_windows
    from zones.core.models import DEFAULT_MODEL, load_model
    from zones.core.progress import REFERENCE_TOKENS

    try:
        loaded = load_model(DEFAULT_MODEL)
        windows = corpus_windows("stdlib", loaded.tokenizer, REFERENCE_SEQ_LEN, "eval",
                                 REFERENCE_TOKENS - REFERENCE_TOKENS // REFERENCE_SEQ_LEN)
    except Exception as err:  # the estimate is a courtesy: never stop a build over it
        print(f"zones book: no reference forward ({err}); estimating in seconds", file=sys.stderr)
        return None
    ids = windows.input_ids
    times = []
    with torch.inference_mode():
        loaded.model(input_ids=ids[:1], use_cache=False)
        for _ in range(repeats):
            start = time.perf_counter()
            loaded.model(input_ids=ids, use_cache=False)
            times.append(time.perf_counter() - start)
    return min(times)


def _timings_entry(parameters: dict[str, Any]) -> tuple[Path, dict]:
    parts = dict(kind="book_timings", parameters=parameters)
    return entry_path("book", parts, ext="seconds"), parts  # a JSON payload; its sidecar is the .json


def last_record(parameters: dict[str, Any]) -> dict[str, Any]:
    """The record of the last build with these parameters: ``reference_seconds`` (a reference
    forward's seconds then, before the chapters; ``reference_seconds_end``: after them), ``machine``, and ``chapters``: per chapter ``seconds``,
    ``reference_forwards`` (seconds / reference_seconds) and ``work`` (the reference forwards of
    work it counted, ``zones.core.progress``). ``{}`` if none; a damaged record is reported and
    ignored (only the estimate rests on it)."""
    path, parts = _timings_entry(parameters)
    try:
        found = read_entry(path, parts)
    except CacheError as err:
        print(f"zones book: {err}; estimating from the expected times instead", file=sys.stderr)
        return {}
    if found is None:
        return {}
    record = json.loads(found[0])
    if not isinstance(record, dict):
        return {}
    if "chapters" not in record:  # a record of seconds only (an older zones)
        record = dict(chapters={k: dict(seconds=float(v)) for k, v in record.items()})
    return record


def last_timings(parameters: dict[str, Any]) -> dict[str, float]:
    """Seconds each chapter took in the last build with these parameters ({} if none)."""
    return {k: float(v["seconds"]) for k, v in last_record(parameters).get("chapters", {}).items()}


def _store_timing(parameters: dict[str, Any], name: str, seconds: float, *, reference: float | None = None,
                  work: float | None = None, start: float | None = None) -> None:
    """Add chapter ``name``'s cost to the record (seconds; with a reference forward's seconds
    ``reference``, measured on this machine in this build around the chapter, also those and the
    reference forwards; ``work``: the reference forwards it counted; ``start``: the reference
    forward timed before the build's first chapter, the record's ``reference_seconds``)."""
    record = last_record(parameters)
    entry = dict(seconds=round(seconds, 1))
    if reference:
        entry["reference_forwards"] = round(seconds / reference, 1)
        entry["reference_seconds"] = round(reference, 3)  # the chapter's own: records merge builds
        record["reference_seconds"] = round(start or reference, 3)
        record["machine"] = machine_line()
    if work is not None:
        entry["work"] = round(work, 2)
    record.setdefault("chapters", {})[name] = entry
    _write_record(parameters, record)


def _store_reference_end(parameters: dict[str, Any], seconds: float) -> None:
    """Add the reference forward timed after the chapters to the record (``reference_seconds_end``)."""
    _write_record(parameters, {**last_record(parameters), "reference_seconds_end": round(seconds, 3)})


def _write_record(parameters: dict[str, Any], record: dict[str, Any]) -> None:
    path, parts = _timings_entry(parameters)
    write_entry(path, parts, json.dumps(record, indent=2, sort_keys=True).encode())


def overhead_line(seconds: float, work: float, before: float, after: float | None,
                  around: float | None = None) -> str:
    """The build's closing line: the chapters' seconds, the work they counted (reference
    forwards, RF) and the overhead, seconds / (work × a reference forward's seconds): on the
    reference forwards timed around each chapter (``around``: Σ work × the chapter's own timing,
    RF·s; :data:`REFERENCE_AROUND_SECONDS`), then on the mean of the one timed before the chapters
    and the one timed after them, and on each (a machine's speed drifts within a build, and the
    unit with it)."""
    head = f"zones book: the chapters took {seconds:,.0f} s and counted {work:.1f} RF of work"
    if work <= 0:
        return head
    if not after:
        return f"{head}; overhead {seconds / (work * before):.2f}× (a reference forward: {before:.2f} s)"
    unit = (before + after) / 2
    near = f"{seconds / around:.2f}× on the reference forwards timed around each chapter, " if around else ""
    return (f"{head}; overhead {near}{seconds / (work * unit):.2f}× on the mean reference forward, "
            f"{seconds / (work * before):.2f}× on the one before the chapters ({before:.2f} s) and "
            f"{seconds / (work * after):.2f}× on the one after them ({after:.2f} s)")


def machine_line() -> str:
    """The CPU, PyTorch's kernels, native bf16 or not, and the threads: what a timing ran on."""
    import platform

    import torch

    from zones.core.hardware import cpu_capability, native_bf16

    name = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return (f"{name}; PyTorch capability {cpu_capability()}; native bf16: {native_bf16('cpu')}; "
            f"threads {torch.get_num_threads()}")
