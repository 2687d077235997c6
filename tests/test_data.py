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


@pytest.mark.parametrize("content, match", [
    (b"plain text \x00\x01\x02 then binary", r"binary file \(NUL byte at offset 11\)"),
    ("caf\u00e9 au lait, na\u00efve r\u00e9sum\u00e9\n".encode("latin-1") * 20,
     r"not UTF-8 text \(byte 0xe9 at offset 3\).*convert it to UTF-8"),
])
def test_binary_and_non_utf8_corpora_are_errors_naming_the_file(tmp_path, content, match):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(CorpusError, match=match) as err:
        load_corpus(str(path))
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_utf8_corpora_keep_every_character(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes("\ufeffcaf\u00e9 \u2014 \u00fcber\n".encode("utf-8"))
    assert load_corpus(str(path)).text == "caf\u00e9 \u2014 \u00fcber\n"  # the byte-order mark dropped


def test_a_truncated_cached_corpus_is_an_error_naming_it():
    from zones.cache import CacheError, cache_dir

    load_corpus("stdlib")
    cached = next((cache_dir() / "corpora").glob("stdlib-docstrings-*.txt"))
    cached.write_bytes(cached.read_bytes()[:1000])
    try:
        with pytest.raises(CacheError) as err:
            load_corpus("stdlib")
        assert str(cached) in str(err.value) and "delete" in str(err.value)
    finally:
        cached.unlink()  # the next load recomputes it


def test_an_empty_corpus_names_its_files(tmp_path):
    empty = tmp_path / "blank.txt"
    empty.write_text("  \n")
    with pytest.raises(CorpusError, match=r"empty: .*blank.txt hold\(s\) only whitespace; pass --corpus"):
        load_corpus(str(empty))
