"""Caching: keys, atomic tables, and sweeps that resume."""
import os

import pandas as pd
import pytest

from zones.cache import Journal, cache_key, cached_table, entry_path, resumable_table


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
