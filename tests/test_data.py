"""Corpora and token windows."""
import numpy as np
import pytest

from zones.data import CorpusError, load_corpus, make_windows, corpus_windows


def test_stdlib_corpus_is_prose_and_deterministic():
    first, second = load_corpus("stdlib"), load_corpus("stdlib")
    assert first.fingerprint == second.fingerprint and first.text == second.text
    assert len(first.text) > 100_000
    words = first.text.split()
    assert sum(w.isalpha() for w in words) / len(words) > 0.6


def test_splits_are_disjoint_and_budgeted():
    ids = np.arange(100 * 10)  # 100 windows of 10, every token unique
    cal = make_windows(ids, 10, "calibration")
    ev = make_windows(ids, 10, "eval")
    assert cal.n_windows == 25 and ev.n_windows == 75
    assert not set(cal.input_ids.flatten().tolist()) & set(ev.input_ids.flatten().tolist())
    small = make_windows(ids, 10, "eval", max_tokens=9 * 5)
    assert small.n_windows == 5 and small.n_scored_tokens == 45
    # evenly spaced through the split, not its first windows
    assert small.input_ids[-1, 0] > 900
    assert small.fingerprint != make_windows(ids, 10, "eval", max_tokens=9 * 6).fingerprint


def test_budget_and_input_errors():
    ids = np.arange(100)
    with pytest.raises(CorpusError, match="only"):
        make_windows(ids, 10, "eval", max_tokens=10_000)
    with pytest.raises(CorpusError, match="fewer than one window"):
        make_windows(np.arange(5), 10)
    with pytest.raises(ValueError, match="split"):
        make_windows(ids, 10, "train")


def test_empty_and_unknown_corpora(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("   \n")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(empty))
    with pytest.raises(CorpusError, match="unknown corpus"):
        load_corpus(str(tmp_path / "missing*.txt"))


def test_local_text_files_are_windows(tmp_path, tiny_tokenizer):
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)
    windows = corpus_windows(str(tmp_path / "*.txt"), tiny_tokenizer, seq_len=32, split="eval", max_tokens=31 * 4)
    assert windows.input_ids.shape == (4, 32)
    assert windows.n_scored_tokens == 124
