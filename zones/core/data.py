"""Text corpora and the token windows every measurement is scored on.

Corpora by name:

* ``stdlib``      English prose from the docstrings of Python's standard library (offline,
                  deterministic for a Python version).
* ``stdlib-code`` the source files of the standard library themselves (code, comments and
                  docstrings): a larger offline corpus, meant for training small models.
* ``wikitext2``   WikiText-2 raw, test split (``wikitext2:validation`` for the other), through
                  the ``datasets`` package; needs the network.
* a path or glob  local text files, concatenated in sorted order. They must be UTF-8 text: a
                  file with a NUL byte is binary and one that is not valid UTF-8 (Latin-1, say)
                  is a ``CorpusError`` naming the file and the byte offset, with the remedy
                  (convert it to UTF-8); nothing is ever decoded with replacement characters.
                  A UTF-8 byte-order mark is dropped.

Token windows: the corpus is tokenized once, cut into non-overlapping windows of ``seq_len``
tokens, and every fourth window goes to the ``calibration`` split, the rest to ``eval``, so
the two are disjoint and cover the same topics. Each split is one ordered set of windows
(:func:`nested_order`: the first, the middle, the quarters, the eighths, ...), and a token
budget takes its first windows: every prefix is spread through the whole split, and a smaller
budget is a prefix of a larger one, so chapters that score the same model on different budgets
share their forward passes (``zones.measure.scoring`` keeps each batch's losses once). Every
predicted token of a window is scored once: ``seq_len - 1`` per window.

A windows' fingerprint (the cache key of every table scored on them) covers what determines a
result: the window token ids themselves, and the tokenizer's content (its vocabulary, merges and
pipeline: :func:`tokenizer_fingerprint`), not its path.
"""
from __future__ import annotations

import ast
import glob
import hashlib
import json
import sys
import sysconfig
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from zones.core.atomic import file_stamp
from zones.core.cache import cache_dir, sidecar_path
from zones.core.checks import check_choice, check_int
from zones.core.entries import read_entry, write_entry
from zones.core.hub import HubUnreachableError, hub_lookup

SPLITS = ("calibration", "eval")
CALIBRATION_EVERY = 4  # window i is calibration when i % 4 == 3


class CorpusError(ValueError):
    """The corpus is unknown, empty, unreachable, or too small for the request."""


@dataclass(frozen=True)
class Corpus:
    name: str
    text: str
    fingerprint: str


@dataclass(frozen=True)
class Windows:
    """Token windows of one split: ``input_ids`` is (n_windows, seq_len)."""

    input_ids: torch.Tensor
    corpus: str
    split: str
    fingerprint: str  # identifies the window token ids, corpus, tokenizer content, split and seq_len

    @property
    def n_windows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def n_scored_tokens(self) -> int:
        return self.n_windows * (self.seq_len - 1)

    def take(self, start: int, stop: int | None = None) -> "Windows":
        """Windows ``start:stop`` of these, with a fingerprint of their own (so that a part and the
        whole are never taken for the same windows by a cache); a window appears in one part only."""
        ids = self.input_ids[start:stop]
        if len(ids) == 0:
            raise ValueError(f"windows {start}:{stop} of {self.n_windows} {self.split!r} windows are empty")
        return Windows(ids, self.corpus, self.split, _fingerprint(self.fingerprint, f"{start}:{stop}"))


def _fingerprint(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def _is_prose(docstring: str) -> bool:
    """Keep docstrings that read as sentences, not signatures, tables or doctests."""
    words = docstring.split()
    if len(words) < 12 or ">>>" in docstring:
        return False
    letters = sum(c.isalpha() or c.isspace() for c in docstring)
    return letters / len(docstring) > 0.85


def stdlib_files() -> list[Path]:
    """The standard library's own .py files (no tests, no third-party packages), sorted."""
    return list(_stdlib_files(sysconfig.get_paths()["stdlib"]))


@lru_cache(maxsize=2)
def _stdlib_files(root: str) -> tuple[Path, ...]:
    # walking the tree costs ~0.7 s, and a training run asks once per model: once per process
    skip = {"test", "tests", "site-packages", "idlelib", "lib2to3"}
    return tuple(sorted(p for p in Path(root).rglob("*.py") if not skip & set(p.relative_to(root).parts)))


@lru_cache(maxsize=2)
def _stdlib_code(root: str) -> str:
    # the standard library's source is read once per process (a series trains several models on it)
    return "\n\n".join(p.read_text(encoding="utf-8", errors="replace") for p in _stdlib_files(root))


def stdlib_docstrings(python_files: list[Path] | None = None) -> str:
    """Module, class and function docstrings of the standard library, parsed (not imported)."""
    python_files = stdlib_files() if python_files is None else python_files
    chunks = []
    for path in python_files:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        nodes = [tree] + [n for n in ast.walk(tree)
                          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        for node in nodes:
            doc = ast.get_docstring(node, clean=True)
            if doc and _is_prose(doc):
                chunks.append(doc.strip())
    return "\n\n".join(chunks)


def _stdlib_docstrings_path(tag: str) -> Path:
    return cache_dir() / "corpora" / f"stdlib-docstrings-{tag}.txt"


def _cached_stdlib_docstrings(tag: str) -> str:
    """The stdlib corpus, cached as a checksummed entry (a damaged copy is an error naming it)."""
    path = _stdlib_docstrings_path(tag)
    parts = dict(kind="stdlib-docstrings", tag=tag)
    found = read_entry(path, parts)
    if found is not None:
        return found[0].decode("utf-8")
    text = stdlib_docstrings()
    if text.strip():
        write_entry(path, parts, text.encode("utf-8"))
    return text


def read_text_file(path: str | Path) -> str:
    """A text file's contents: UTF-8 (a leading byte-order mark dropped), or a ``CorpusError``.

    A NUL byte means a binary file; an invalid UTF-8 sequence names its byte offset.
    """
    data = Path(path).read_bytes()
    nul = data.find(b"\0")
    if nul >= 0:
        raise CorpusError(f"{path} is a binary file (NUL byte at offset {nul}), not text; "
                          f"pass UTF-8 text files as the corpus")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                          f"convert it to UTF-8, e.g. iconv -f latin1 -t utf-8") from None


def _load_wikitext2(split: str) -> str:
    """WikiText-2 raw through ``datasets``: from the hub, or its local cache when offline."""
    try:
        import datasets  # imported here: a heavy package that only this corpus needs

        with hub_lookup(f"wikitext2 ({split})", "use a local corpus instead: --corpus 'path/to/*.txt'"):
            rows = datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split=split)
    except HubUnreachableError as err:
        raise CorpusError(str(err)) from None
    except Exception as err:  # the datasets library raises many kinds
        raise CorpusError(f"wikitext2 ({split}) could not be loaded: {str(err).strip().splitlines()[0]}; "
                          f"it needs the network or a local datasets cache") from err
    return "".join(rows["text"])


_CORPORA: dict[tuple, Corpus] = {}   # the stdlib corpora loaded in this process (immutable)


def load_corpus(name: str = "stdlib") -> Corpus:
    """Load a corpus by name (``stdlib``, ``wikitext2[:split]``) or path/glob of text files.

    The stdlib corpora are loaded once per process (a book's chapters ask ~40 times, each a read,
    a checksum and a fingerprint of the text): ``stdlib`` keyed by its cache entry's and sidecar's
    :func:`~zones.core.atomic.file_stamp` (a rewritten entry is read and verified again),
    ``stdlib-code`` by the standard library's folder (its text is read once per process anyway)."""
    stdlib_root = sysconfig.get_paths()["stdlib"]
    if name in ("stdlib", "stdlib-code"):
        tag = "python-" + ".".join(map(str, sys.version_info[:3]))
        entry = _stdlib_docstrings_path(tag) if name == "stdlib" else None
        stamp = (file_stamp(entry), file_stamp(sidecar_path(entry))) if entry else None   # before reading
        key = (name, tag, stdlib_root, cache_dir() if entry else None, stamp)
        if key not in _CORPORA:
            corpus = _load_corpus(name, stdlib_root)
            if stamp is None or None not in stamp:   # a first build's entry is stamped on the next call
                _CORPORA[key] = corpus
            return corpus
        return _CORPORA[key]
    return _load_corpus(name, stdlib_root)


def _load_corpus(name: str, stdlib_root: str) -> Corpus:
    if name == "stdlib":
        tag = "python-" + ".".join(map(str, sys.version_info[:3]))
        text = _cached_stdlib_docstrings(tag)
        source = f"no prose docstrings in the standard library at {stdlib_root}"
    elif name == "stdlib-code":
        tag = "python-" + ".".join(map(str, sys.version_info[:3]))
        text = _stdlib_code(stdlib_root)
        source = f"no .py files in the standard library at {stdlib_root}"
    elif name.startswith("wikitext2"):
        split = name.partition(":")[2] or "test"
        text, tag = _load_wikitext2(split), split
        source = f"the {split} split holds no text"
    else:
        files = sorted(glob.glob(str(Path(name).expanduser()), recursive=True))
        files = [f for f in files if Path(f).is_file()]
        if not files:
            raise CorpusError(f"unknown corpus {name!r}: not 'stdlib', 'wikitext2', nor an existing file or glob")
        text, tag = "\n\n".join(read_text_file(f) for f in files), ""
        source = f"{', '.join(files[:3])}{' ...' if len(files) > 3 else ''} hold(s) only whitespace"
    if not text.strip():
        raise CorpusError(f"corpus {name!r} is empty: {source}; pass --corpus with a non-empty text file")
    return Corpus(name, text, _fingerprint(name, tag, text))


def tokenize(corpus: Corpus, tokenizer) -> np.ndarray:
    """All token ids of a corpus, as one int64 array (no special tokens)."""
    ids = tokenizer(corpus.text, add_special_tokens=False, return_attention_mask=False,
                    verbose=False)["input_ids"]
    return np.asarray(ids, dtype=np.int64)


def tokenizer_fingerprint(tokenizer) -> str:
    """A digest of what makes a tokenizer's token ids: for a fast tokenizer its whole serialized
    pipeline (vocabulary, merges, normalizer, pre-tokenizer, added tokens; not the per-call
    truncation and padding settings), else its vocabulary. Its path plays no part: an edited
    ``tokenizer.json`` in the same directory gives a different fingerprint."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        content = _pipeline_state(backend)
    else:
        content = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return _fingerprint(type(tokenizer).__name__, content)


def _pipeline_state(backend) -> str:
    """A ``tokenizers.Tokenizer``'s serialization with truncation and padding off (transformers
    sets them on each call; they do not change a text's ids), restored afterwards."""
    truncation, padding = backend.truncation, backend.padding
    if truncation is None and padding is None:
        return backend.to_str()
    backend.no_truncation()
    backend.no_padding()
    try:
        return backend.to_str()
    finally:
        if truncation is not None:
            backend.enable_truncation(**truncation)
        if padding is not None:
            backend.enable_padding(**padding)


def ids_digest(ids: np.ndarray) -> str:
    """sha256 of an id array's shape and int64 values."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    return hashlib.sha256(str(ids.shape).encode() + b"\0" + ids.tobytes()).hexdigest()


def nested_order(n: int) -> np.ndarray:
    """The indices ``0..n-1`` in the order windows are taken from a split: the van der Corput
    sequence in base 2 scaled to ``n`` (0, n/2, n/4, 3n/4, n/8, ...), repeats dropped. Every
    prefix is spread evenly through the split, to within a factor of two of the spacing."""
    n = check_int(n, "n", min=0)
    if n == 0:
        return np.zeros(0, dtype=int)
    bits = max(1, int(np.ceil(np.log2(n))))
    k = np.arange(2 ** bits)
    reversed_bits = np.zeros_like(k)
    for bit in range(bits):  # the bits of k in reverse order: k's van der Corput fraction × 2**bits
        reversed_bits |= ((k >> bit) & 1) << (bits - 1 - bit)
    order = (reversed_bits * n) // 2 ** bits
    _, first = np.unique(order, return_index=True)
    return order[np.sort(first)]


def make_windows(token_ids: np.ndarray, seq_len: int, split: str = "eval",
                 max_tokens: int | None = None, *, corpus: Corpus | None = None,
                 tokenizer_id: str = "") -> Windows:
    """Non-overlapping windows of ``seq_len`` tokens from one split.

    ``max_tokens`` bounds the scored tokens (``n_windows * (seq_len - 1)``); windows are the
    first of the split's :func:`nested_order`, so a smaller budget is a prefix of a larger one.
    ``None`` takes the whole split (in the same order). The fingerprint covers the
    windows' token ids, the corpus, ``tokenizer_id`` (:func:`tokenizer_fingerprint`), the split
    and ``seq_len``.
    """
    split = check_choice(split, "split", SPLITS)
    seq_len = check_int(seq_len, "seq_len", min=2)
    if max_tokens is not None:
        max_tokens = check_int(max_tokens, "max_tokens")
    n_all = len(token_ids) // seq_len
    if n_all == 0:
        raise CorpusError(f"corpus has {len(token_ids)} tokens: fewer than one window of {seq_len}")
    all_windows = np.asarray(token_ids[: n_all * seq_len]).reshape(n_all, seq_len)
    is_calibration = np.arange(n_all) % CALIBRATION_EVERY == CALIBRATION_EVERY - 1
    pool = all_windows[is_calibration if split == "calibration" else ~is_calibration]
    if len(pool) == 0:
        raise CorpusError(f"corpus is too small to have a {split!r} split at seq_len={seq_len}")
    n_take = len(pool)
    if max_tokens is not None:
        n_take = max_tokens // (seq_len - 1)
        if n_take < 1:
            raise ValueError(f"max_tokens={max_tokens} is less than one window ({seq_len - 1} scored tokens)")
        if n_take > len(pool):
            budget = f"--{split}-tokens {max_tokens}" if split in ("eval", "calibration") else f"{max_tokens}"
            raise CorpusError(
                f"token budget {budget} needs {n_take} windows of {seq_len}, but the {split!r} split "
                f"has only {len(pool)} ({len(pool) * (seq_len - 1)} scored tokens); ask for at most "
                f"{len(pool) * (seq_len - 1)} tokens, or use a larger corpus")
    chosen = nested_order(len(pool))[:n_take]
    taken = pool[chosen]
    ids = torch.from_numpy(taken.copy())
    corpus_fp = corpus.fingerprint if corpus else _fingerprint(str(token_ids[:64].tolist()), str(len(token_ids)))
    fp = _fingerprint(corpus_fp, tokenizer_id, split, str(seq_len), str(chosen.tolist()), ids_digest(taken))
    return Windows(ids, corpus.name if corpus else "", split, fp)


_TOKENS: "OrderedDict[tuple[str, str], np.ndarray]" = OrderedDict()   # (corpus, tokenizer) -> ids
TOKENS_KEPT = 4   # corpora × tokenizers held at once (the book: one corpus, one or two tokenizers)


def corpus_tokens(corpus: Corpus, tokenizer, tokenizer_id: str | None = None) -> np.ndarray:
    """:func:`tokenize`, once per (corpus fingerprint, tokenizer fingerprint) in this process:
    a book's chapters window one corpus dozens of times (eval, calibration, every budget), and
    each tokenization of the default corpus takes about a second. The array is read-only."""
    key = (corpus.fingerprint, tokenizer_id or tokenizer_fingerprint(tokenizer))
    if key in _TOKENS:
        _TOKENS.move_to_end(key)
        return _TOKENS[key]
    ids = tokenize(corpus, tokenizer)
    ids.flags.writeable = False
    _TOKENS[key] = ids
    while len(_TOKENS) > TOKENS_KEPT:
        _TOKENS.popitem(last=False)
    return ids


def corpus_windows(corpus: Corpus | str, tokenizer, seq_len: int = 256, split: str = "eval",
                   max_tokens: int | None = None) -> Windows:
    """Load (if named), tokenize (:func:`corpus_tokens`) and window a corpus in one call."""
    if isinstance(corpus, str):
        corpus = load_corpus(corpus)
    tokenizer_id = tokenizer_fingerprint(tokenizer)
    return make_windows(corpus_tokens(corpus, tokenizer, tokenizer_id), seq_len, split, max_tokens,
                        corpus=corpus, tokenizer_id=tokenizer_id)
