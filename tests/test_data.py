"""Corpora and token windows."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from zones.core.data import CorpusError, corpus_windows, load_corpus, make_windows, tokenizer_fingerprint


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
    # spread through the split, not its first windows, and a prefix of any larger budget
    assert small.input_ids[:, 0].max() > 600
    larger = make_windows(ids, 10, "eval", max_tokens=9 * 8)
    assert torch.equal(larger.input_ids[:5], small.input_ids)
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


def test_a_corpus_is_tokenized_once_per_tokenizer_and_text(tmp_path, tiny_tokenizer):
    """Issue 37: every corpus_windows call tokenized the whole corpus again (about a second for the
    default corpus, dozens of times in a book). Now once per (corpus text, tokenizer); an edited
    text is tokenized again, and the windows are the same as a fresh tokenization's."""
    text = tmp_path / "a.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    calls = []

    class Counting:   # the tokenizer, counting its calls over a whole text
        def __init__(self, inner):
            self.inner = inner
            self.backend_tokenizer = inner.backend_tokenizer

        def __call__(self, *args, **kwargs):
            calls.append(1)
            return self.inner(*args, **kwargs)

    counting = Counting(tiny_tokenizer)
    first = corpus_windows(str(text), counting, seq_len=32, max_tokens=31 * 4)
    calibration = corpus_windows(str(text), counting, seq_len=16, split="calibration")
    again = corpus_windows(str(text), counting, seq_len=32, max_tokens=31 * 4)
    assert len(calls) == 1
    assert torch.equal(first.input_ids, again.input_ids) and first.fingerprint == again.fingerprint
    assert calibration.n_windows > 0
    text.write_text("Pack my box with five dozen liquor jugs. " * 200)   # another text: tokenized again
    edited = corpus_windows(str(text), counting, seq_len=32, max_tokens=31 * 4)
    assert len(calls) == 2 and not torch.equal(edited.input_ids, first.input_ids)
    fresh = make_windows(np.asarray(tiny_tokenizer(text.read_text(), add_special_tokens=False)["input_ids"]), 32,
                         "eval", 31 * 4)
    assert torch.equal(edited.input_ids, fresh.input_ids)


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
    from zones.core.cache import CacheError, cache_dir

    load_corpus("stdlib")
    cached = next((cache_dir() / "corpora").glob("stdlib-docstrings-*.txt"))
    cached.write_bytes(cached.read_bytes()[:1000])
    try:
        with pytest.raises(CacheError) as err:
            load_corpus("stdlib")
        assert str(cached) in str(err.value) and "delete" in str(err.value)
    finally:
        cached.unlink()  # the next load recomputes it


def test_the_stdlib_corpus_is_loaded_once_but_a_changed_entry_is_read_and_checked_again():
    """A book's chapters load the stdlib corpus ~40 times: it is read, checked and fingerprinted
    once per process, keyed by its cache entry's stamp (inode, size, times), so an entry damaged
    in place, even to the same size and modification time, is still caught."""
    import os

    from zones.core.cache import CacheError, cache_dir

    load_corpus("stdlib")   # writes the entry when this cache has none
    first = load_corpus("stdlib")
    assert load_corpus("stdlib") is first
    cached = next((cache_dir() / "corpora").glob("stdlib-docstrings-*.txt"))
    data, stat = cached.read_bytes(), cached.stat()
    try:
        cached.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))   # one bit flipped, the same size
        os.utime(cached, ns=(stat.st_atime_ns, stat.st_mtime_ns))   # and the same modification time
        with pytest.raises(CacheError, match="damaged"):
            load_corpus("stdlib")
    finally:
        cached.unlink()  # the next load recomputes it
    again = load_corpus("stdlib")
    assert again is not first and again == first


def test_an_empty_corpus_names_its_files(tmp_path):
    empty = tmp_path / "blank.txt"
    empty.write_text("  \n")
    with pytest.raises(CorpusError, match=r"empty: .*blank.txt hold\(s\) only whitespace; pass --corpus"):
        load_corpus(str(empty))


def _swap_two_tokens(tokenizer_json: Path, first: str, second: str) -> None:
    """Swap the ids of two vocabulary entries in a saved ``tokenizer.json``."""
    state = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab = state["model"]["vocab"]
    vocab[first], vocab[second] = vocab[second], vocab[first]
    tokenizer_json.write_text(json.dumps(state, ensure_ascii=False), encoding="utf-8")


def test_windows_fingerprint_covers_the_tokenizer_content_not_its_path(tmp_path, tiny_tokenizer):
    (tmp_path / "a.txt").write_text("The quick brown fox jumps over the lazy dog. " * 200)
    corpus = load_corpus(str(tmp_path / "a.txt"))
    folder = tmp_path / "tokenizer"
    tiny_tokenizer.save_pretrained(folder)
    before = corpus_windows(corpus, AutoTokenizer.from_pretrained(folder), seq_len=32, max_tokens=31 * 4)
    reloaded = corpus_windows(corpus, AutoTokenizer.from_pretrained(folder), seq_len=32, max_tokens=31 * 4)
    assert reloaded.fingerprint == before.fingerprint  # stable: a cache hit for the same tokenizer
    called = AutoTokenizer.from_pretrained(folder)
    called.pad_token = called.eos_token
    called(["a b c", "a"], padding=True, truncation=True, max_length=2)  # leaves padding/truncation set
    assert called.backend_tokenizer.truncation is not None and called.backend_tokenizer.padding is not None
    assert tokenizer_fingerprint(called) == tokenizer_fingerprint(tiny_tokenizer)

    # The same path and vocabulary size, but two frequent tokens trade ids: other windows, another key.
    counts = np.bincount(before.input_ids.flatten().numpy())
    common = [tiny_tokenizer.convert_ids_to_tokens(int(i)) for i in np.argsort(counts)[::-1][:2]]
    _swap_two_tokens(folder / "tokenizer.json", *common)
    edited = AutoTokenizer.from_pretrained(folder)
    assert edited.name_or_path == AutoTokenizer.from_pretrained(folder).name_or_path and len(edited) == len(tiny_tokenizer)
    after = corpus_windows(corpus, edited, seq_len=32, max_tokens=31 * 4)
    assert not torch.equal(after.input_ids, before.input_ids)
    assert after.fingerprint != before.fingerprint
    assert tokenizer_fingerprint(edited) != tokenizer_fingerprint(tiny_tokenizer)


def test_windows_fingerprint_covers_the_ids_and_the_tokenizer_alone():
    ids = np.arange(100 * 10)
    same = make_windows(ids, 10, "eval", tokenizer_id="a")
    assert make_windows(ids.copy(), 10, "eval", tokenizer_id="a").fingerprint == same.fingerprint
    assert make_windows(ids, 10, "eval", tokenizer_id="b").fingerprint != same.fingerprint
    shuffled = ids.copy()
    shuffled[[64, 65]] = shuffled[[65, 64]]  # past what the corpus stand-in (first 64 ids, length) sees
    assert make_windows(shuffled, 10, "eval", tokenizer_id="a").fingerprint != same.fingerprint


def test_tokenizer_fingerprint_without_a_fast_backend(tiny_tokenizer):
    class Slow:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return dict(self.vocab)

    vocab = tiny_tokenizer.get_vocab()
    assert tokenizer_fingerprint(Slow(vocab)) == tokenizer_fingerprint(Slow(dict(reversed(list(vocab.items())))))
    swapped = dict(vocab)
    a, b = list(vocab)[:2]
    swapped[a], swapped[b] = vocab[b], vocab[a]
    assert tokenizer_fingerprint(Slow(swapped)) != tokenizer_fingerprint(Slow(vocab))


def test_window_arguments_are_checked_like_everywhere_else():
    ids = np.arange(100)
    assert make_windows(ids, np.int64(10)).seq_len == 10
    for kwargs, name in ((dict(seq_len=1), "seq_len"), (dict(seq_len=10.0), "seq_len"), (dict(seq_len=True), "seq_len"),
                         (dict(seq_len=10, max_tokens=45.5), "max_tokens")):
        with pytest.raises(ValueError, match=rf"^{name} must be an integer"):
            make_windows(ids, **kwargs)
