"""Caching: keys, atomic tables, and sweeps that resume."""
import json
import os

import pandas as pd
import pytest

from zones.core.atomic import atomic_directory, stale_temporaries
from zones.core.cache import CacheError, cache_dir, cache_key, entry_path, sidecar_path
from zones.core.entries import cached_table
from zones.core.journal import Journal, resumable_table
from zones.core.manifest import MANIFEST, verify_manifest, write_manifest


def test_cached_table_computes_once():
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"a": [1, 2]})

    parts = {"kind": "unit", "x": 1}
    assert cached_table("unit", parts, compute).equals(cached_table("unit", parts, compute))
    assert len(calls) == 1
    umask = os.umask(0)
    os.umask(umask)
    assert entry_path("unit", parts).stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    assert cache_key({"x": 1, "y": 2}) == cache_key({"y": 2, "x": 1}) != cache_key({"x": 2, "y": 2})


def test_interrupted_sweep_resumes_and_never_looks_complete():
    parts = {"kind": "sweep", "n": 5}
    done = []

    def run(task):
        if task == 3 and not done.count("crashed"):
            done.append("crashed")
            raise KeyboardInterrupt
        done.append(task)
        return {"task": task, "value": task * task}

    with pytest.raises(KeyboardInterrupt):
        resumable_table("unit", parts, range(5), str, run)
    assert not entry_path("unit", parts).exists()  # no final table after a crash
    table = resumable_table("unit", parts, range(5), str, run)
    assert table["value"].tolist() == [0, 1, 4, 9, 16]
    assert done == [0, 1, 2, "crashed", 3, 4]  # 0..2 were not recomputed
    assert not entry_path("unit", parts).with_suffix(".partial.jsonl").exists()


def test_journal_ignores_a_torn_last_line(tmp_path):
    journal = Journal(tmp_path / "j.jsonl")
    journal.append({"a": 1})
    with open(journal.path, "a") as handle:
        handle.write('{"a": 2, "b"')
    assert journal.rows() == [{"a": 1}]
    resumed = Journal(journal.path)
    resumed.append({"a": 3})
    assert resumed.rows() == [{"a": 1}, {"a": 3}]


# --- damaged entries are detected, named, and never used -------------------------------------------

def _stored(parts):
    table = pd.DataFrame({"a": range(50), "b": [0.5 * i for i in range(50)]})
    cached_table("unit", parts, lambda: table)
    return entry_path("unit", parts), table


def test_a_truncated_cached_table_is_an_error_naming_it():
    parts = {"kind": "damage", "case": "truncated"}
    path, _ = _stored(parts)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CacheError) as err:
        cached_table("unit", parts, lambda: pytest.fail("a damaged entry is not silently recomputed"))
    message = str(err.value)
    assert str(path) in message and "damaged" in message and "delete" in message and "\n" not in message


def test_an_edited_cached_table_with_intact_parquet_is_an_error():
    parts = {"kind": "damage", "case": "edited"}
    path, table = _stored(parts)
    edited = table.copy()
    edited.loc[3, "b"] = 99.0
    edited.to_parquet(path, index=False)  # a valid parquet file with a changed value
    with pytest.raises(CacheError, match="sha256"):
        cached_table("unit", parts, lambda: table)


def test_a_sidecar_of_another_key_or_broken_json_is_an_error():
    parts = {"kind": "damage", "case": "sidecar"}
    path, table = _stored(parts)
    other_path, _ = _stored({"kind": "damage", "case": "other"})
    sidecar_path(path).write_text(sidecar_path(other_path).read_text())
    with pytest.raises(CacheError, match="another computation"):
        cached_table("unit", parts, lambda: table)
    sidecar_path(path).write_text("{not json")
    with pytest.raises(CacheError, match="not valid JSON") as err:
        cached_table("unit", parts, lambda: table)
    assert str(sidecar_path(path)) in str(err.value)


def test_an_entry_without_a_checksum_is_recomputed_not_trusted():
    parts = {"kind": "damage", "case": "legacy"}
    path, table = _stored(parts)
    pd.DataFrame({"a": [7], "b": [7.0]}).to_parquet(path, index=False)  # an unverifiable old entry
    sidecar_path(path).write_text('{"kind": "damage", "case": "legacy"}')
    assert cached_table("unit", parts, lambda: table).equals(table)
    assert cached_table("unit", parts, lambda: pytest.fail("now verified")).equals(table)


def test_a_journal_row_missing_a_field_is_an_error_not_a_different_result():
    parts = {"kind": "damage", "case": "journal"}
    with pytest.raises(KeyboardInterrupt):
        resumable_table("unit", parts, range(4), str,
                        lambda t: {"loss": 1.0 + t} if t < 3 else (_ for _ in ()).throw(KeyboardInterrupt))
    journal = entry_path("unit", parts).with_suffix(".partial.jsonl")
    lines = journal.read_text().splitlines()
    row = json.loads(lines[1])
    del row["loss"], row["_sha"]
    lines[1] = json.dumps(row)  # the row a hand edit (or a bug) left without its loss
    journal.write_text("\n".join(lines) + "\n")
    with pytest.raises(CacheError) as err:
        resumable_table("unit", parts, range(4), str, lambda t: {"loss": 1.0 + t})
    assert f"journal {journal} line 2" in str(err.value) and "delete" in str(err.value)


def test_journal_rows_keep_their_checksums_and_required_fields(tmp_path):
    journal = Journal(tmp_path / "j.jsonl", required=("loss",))
    journal.append({"loss": 0.25, "removed": [1, 2]})
    assert journal.rows() == [{"loss": 0.25, "removed": [1, 2]}]
    text = journal.path.read_text().replace("0.25", "0.35")
    journal.path.write_text(text)
    with pytest.raises(CacheError, match="checksum"):
        journal.rows()
    journal.path.write_text('{"removed": [1]}\n')
    with pytest.raises(CacheError, match="line 1"):
        journal.rows()
    journal.path.write_text("garbage\n" + text)
    with pytest.raises(CacheError, match="not a JSON row"):
        Journal(journal.path).rows()


def test_a_journal_row_without_its_task_is_an_error_not_a_key_error():
    parts = {"kind": "damage", "case": "task"}
    Journal(entry_path("unit", parts).with_suffix(".partial.jsonl")).append({"loss": 1.0})  # no _task
    with pytest.raises(CacheError, match=r"line 1 is damaged \(missing '_task'\); delete .*partial.jsonl"):
        resumable_table("unit", parts, range(2), str, lambda t: {"loss": 1.0})


def test_concurrent_writers_never_pair_a_payload_with_another_sidecar(monkeypatch):
    import threading

    import zones.core.entries as entries

    parts = {"kind": "race"}
    path = entry_path("unit", parts)
    first, second = (pd.DataFrame({"v": [float(i)] * (100 + i)}) for i in range(2))  # different bytes
    paused, resume = threading.Event(), threading.Event()
    write_sidecar = entries.atomic_write_text

    def slow_sidecar(target, text):  # the first writer stops between its payload and its sidecar
        if threading.current_thread().name == "first":
            paused.set()
            resume.wait(10)
        write_sidecar(target, text)

    monkeypatch.setattr(entries, "atomic_write_text", slow_sidecar)
    a = threading.Thread(target=entries.write_cached_table, args=(first, path, parts), name="first")
    a.start()
    assert paused.wait(10)
    b = threading.Thread(target=entries.write_cached_table, args=(second, path, parts), name="second")
    b.start()
    b.join(0.5)  # without the lock, the second writer finishes here, and the first then
    resume.set()  # writes its sidecar over the second's payload
    a.join()
    b.join()
    assert len(entries.read_cached_table(path, parts)) == 101  # the last complete write, intact


# --- directories written atomically and checked file by file ----------------------------------------

def test_atomic_directory_appears_whole_or_not_at_all(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "a.txt").write_text("half")
            raise RuntimeError("killed mid-write")
    assert not target.exists() and not stale_temporaries(target)
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("first")
        assert not target.exists()  # invisible until the block succeeds
    assert (target / "a.txt").read_text() == "first"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700
    with atomic_directory(target) as tmp:  # an existing folder is replaced whole
        (tmp / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    with atomic_directory(target, keep_existing=True) as tmp:  # ... or kept, when asked
        (tmp / "c.txt").write_text("third")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert not stale_temporaries(target)


def test_manifest_names_the_damaged_file_and_what_to_delete(tmp_path):
    parts = {"kind": "unit", "x": 1}
    folder = tmp_path / "entry"
    (folder / "sub").mkdir(parents=True)
    (folder / "weights.bin").write_bytes(bytes(range(200)))
    (folder / "sub" / "vocab.json").write_text('{"a": 1}')
    assert not verify_manifest(folder, parts)  # nothing to verify: recompute
    write_manifest(folder, parts)
    assert (folder / MANIFEST).exists() and verify_manifest(folder, parts)
    with pytest.raises(CacheError, match="another computation"):
        verify_manifest(folder, {"kind": "unit", "x": 2})
    (folder / "sub" / "vocab.json").write_text('{"a": 2}')  # same size, other bytes
    with pytest.raises(CacheError) as err:
        verify_manifest(folder, parts)
    message = str(err.value)
    assert str(folder / "sub" / "vocab.json") in message and f"delete the folder {folder}" in message
    assert "\n" not in message
    (folder / "sub" / "vocab.json").write_text('{"a": 1}')
    (folder / "weights.bin").unlink()
    with pytest.raises(CacheError, match="weights.bin is missing"):
        verify_manifest(folder, parts)
    (folder / "weights.bin").write_bytes(bytes(range(200)))
    (folder / "extra.txt").write_text("x")
    with pytest.raises(CacheError, match="not in its manifest"):
        verify_manifest(folder, parts)
    (folder / "extra.txt").unlink()
    (folder / MANIFEST).write_text("{broken")
    with pytest.raises(CacheError, match="not valid JSON"):
        verify_manifest(folder, parts)


def test_zones_cache_pointing_at_a_file_is_one_error_naming_the_variable(tmp_path, monkeypatch):
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    monkeypatch.setenv("ZONES_CACHE", str(file))
    with pytest.raises(CacheError) as err:  # was: [Errno 17] File exists: '...'
        cache_dir()
    assert f"ZONES_CACHE={file}" in str(err.value) and "is a file" in str(err.value)
    monkeypatch.setenv("ZONES_CACHE", str(file / "below"))
    with pytest.raises(CacheError, match="ZONES_CACHE="):  # was: [Errno 20] Not a directory
        cache_dir()


def test_inside_a_refresh_what_was_cached_before_is_computed_once_again(monkeypatch, tmp_path):
    """``refreshing()`` (``--refresh``): an entry or journal written before the block is computed
    again and replaced; one written inside it is read, so each is computed once per refresh."""
    from zones.core.refresh import refreshing

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))
    calls = []

    def compute():
        calls.append(1)
        return pd.DataFrame({"a": [len(calls)]})

    parts = {"kind": "unit", "case": "refresh"}
    cached_table("unit", parts, compute)
    journal = Journal(tmp_path / "sweep.partial.jsonl")
    journal.append({"_task": "old"})
    with refreshing():
        assert cached_table("unit", parts, compute)["a"].tolist() == [2]   # computed again ...
        assert cached_table("unit", parts, compute)["a"].tolist() == [2]   # ... once
        assert Journal(tmp_path / "sweep.partial.jsonl").rows() == []      # its old rows: not read
    assert cached_table("unit", parts, compute)["a"].tolist() == [2] and len(calls) == 2  # the replacement stays
    with refreshing(on=False):
        assert cached_table("unit", parts, compute)["a"].tolist() == [2]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through Linux's /proc")
def test_reading_a_cached_table_starts_no_thread_that_could_abort_the_process_at_exit(tmp_path):
    """Arrow's thread pools, once started, can abort a process as it exits (SIGABRT, "terminate
    called without an active exception"): a finished kernel or CLI run would fail. Writes and
    reads start none; counted in a fresh process, where no earlier test started them."""
    import subprocess
    import sys

    script = (
        "import os; from pathlib import Path; import pandas as pd; "
        "from zones.core.entries import cached_table; from zones.core.tables import read_table, write_table; "
        "threads = lambda: len(os.listdir('/proc/self/task')); "
        "parts = {'kind': 'unit', 'case': 'threads'}; before = threads(); "
        "cached_table('unit', parts, lambda: pd.DataFrame({'a': [1, 2]})); "
        "write_table(pd.DataFrame({'a': [3]}), Path(os.environ['ZONES_CACHE']) / 'plain.parquet'); "
        "cached_table('unit', parts, lambda: None); "
        "read_table(Path(os.environ['ZONES_CACHE']) / 'plain.parquet'); "
        "print(before, threads())"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "ZONES_CACHE": str(tmp_path)})
    before, after = map(int, done.stdout.split())
    assert after == before, f"writing and reading tables started {after - before} threads"
