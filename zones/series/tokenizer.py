"""The training corpus as token ids: a byte-level BPE tokenizer trained on it, the corpus's ids
under that tokenizer, and the (train, held-out) windows. Both caches go through ``zones.core.cache``:
the tokenizer folder has a manifest (sha256 of every file), the ids are a checksummed entry
keyed by the tokenizer's own bytes, so a replaced tokenizer or ids file is an error naming the
file and what to delete, never a silent wrong training set."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from zones.core.atomic import atomic_directory, file_sha256
from zones.core.cache import CacheError, cache_dir, cache_key, entry_path
from zones.core.checks import check_int
from zones.core.data import Windows, load_corpus
from zones.core.entries import read_entry, write_entry
from zones.core.manifest import verify_manifest, write_manifest
from zones.series.config import VERSION, TrainConfig

EOS_TOKEN = "<|endoftext|>"
TOKENIZER_FILE = "tokenizer.json"


def _chunks(text: str, size: int = 200_000) -> list[str]:
    """Cut text at line ends into pieces of about ``size`` characters (parallel tokenizing)."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text)))
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def tokenizer_parts(corpus, vocab_size: int) -> dict:
    """The cache key of the corpus's tokenizer of ``vocab_size``."""
    return dict(kind="tokenizer", version=VERSION, corpus=corpus.fingerprint, vocab_size=int(vocab_size))


def tokenizer_folder(corpus, vocab_size: int) -> Path:
    return cache_dir() / "tokenizers" / cache_key(tokenizer_parts(corpus, vocab_size))


def _load_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    try:
        return PreTrainedTokenizerFast.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - a bad tokenizer.json: name the file, not the parser
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise CacheError(f"cached tokenizer {folder / TOKENIZER_FILE} cannot be read ({type(err).__name__}: "
                         f"{first}); delete the folder {folder} to train it again") from None


def train_tokenizer(corpus, vocab_size: int, refresh: bool = False) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus`` (a ``zones.core.data.Corpus``), cached.

    Returned as a ``transformers.PreTrainedTokenizerFast`` with ``<|endoftext|>`` as its
    end-of-text token, so it saves and loads like any model's tokenizer. The cached folder is
    verified against its manifest before it is used (``CacheError`` when a file changed);
    ``refresh=True`` trains it again and replaces the folder, damaged or not (BPE training is
    deterministic: an intact copy is replaced by the same bytes).
    """
    parts = tokenizer_parts(corpus, vocab_size)
    folder = tokenizer_folder(corpus, vocab_size)
    if not refresh and verify_manifest(folder, parts):
        return _load_tokenizer(folder)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_chunks(corpus.text), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TOKEN)
    with atomic_directory(folder) as tmp:
        tokenizer.save_pretrained(tmp)
        write_manifest(tmp, parts)
    return _load_tokenizer(folder)


def tokenizer_and_tokens(corpus, vocab_size: int, refresh: bool = False):
    """The corpus's BPE tokenizer of ``vocab_size`` and the corpus's token ids under it (cached;
    ``refresh=True`` computes both again and replaces the cached copies, damaged or not)."""
    tokenizer = train_tokenizer(corpus, vocab_size, refresh=refresh)
    tokenizer_sha = file_sha256(tokenizer_folder(corpus, vocab_size) / TOKENIZER_FILE)
    return tokenizer, corpus_tokens(corpus, tokenizer, tokenizer_sha, refresh=refresh)


def corpus_tokens(corpus, tokenizer, tokenizer_id: str, refresh: bool = False) -> np.ndarray:
    """All token ids of ``corpus`` under ``tokenizer`` (int32), a checksummed cache entry keyed
    by the corpus and ``tokenizer_id`` (the sha256 of the tokenizer's file); ``refresh=True``
    recomputes and replaces it."""
    parts = dict(kind="tokens", version=VERSION, corpus=corpus.fingerprint, tokenizer=tokenizer_id)
    path = entry_path("tokens", parts, ext="npy")
    found = None if refresh else read_entry(path, parts)  # CacheError when the file was replaced or truncated
    if found is not None:
        try:
            return np.load(io.BytesIO(found[0]), allow_pickle=False)
        except ValueError as err:
            raise CacheError(f"cache entry {path} is not a token array ({err}); delete {path} and "
                             f"{path.with_suffix('.json').name} to recompute it") from None
    encoded = tokenizer(_chunks(corpus.text), add_special_tokens=False, return_attention_mask=False,
                        verbose=False)["input_ids"]
    ids = np.concatenate([np.asarray(part, dtype=np.int32) for part in encoded])
    buffer = io.BytesIO()
    np.save(buffer, ids, allow_pickle=False)
    write_entry(path, parts, buffer.getvalue(), n_tokens=int(len(ids)))
    return ids


def split_windows(ids: np.ndarray, seq_len: int, heldout_every: int) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) windows of ``seq_len`` tokens: every ``heldout_every``-th is held out."""
    n = len(ids) // seq_len
    windows = ids[: n * seq_len].reshape(n, seq_len)
    heldout = np.arange(n) % heldout_every == heldout_every - 1
    if heldout.sum() < 1 or (~heldout).sum() < 1:
        raise ValueError(f"the corpus has {n} windows of {seq_len} tokens: too few to hold out every "
                         f"{heldout_every}th")
    return windows[~heldout], windows[heldout]


def heldout_split(config: TrainConfig, n_windows: int | None = None, *, corpus=None, ids=None) -> Windows:
    """``n_windows`` of the config's held-out windows (never trained on; all when None), evenly
    spaced, as ``zones.core.data.Windows``: what the training loop's loss curve and the analyses score."""
    corpus = load_corpus(config.corpus) if corpus is None else corpus
    if ids is None:
        _, ids = tokenizer_and_tokens(corpus, config.vocab_size)
    _, heldout = split_windows(ids, config.seq_len, config.heldout_every)
    n_take = len(heldout) if n_windows is None else n_windows
    if not 1 <= n_take <= len(heldout):
        raise ValueError(f"asked for {n_take} held-out windows of {config.seq_len} tokens; the held-out split "
                         f"has {len(heldout)} ({len(heldout) * (config.seq_len - 1)} scored tokens)")
    chosen = np.unique(np.linspace(0, len(heldout) - 1, n_take).round().astype(int))
    fingerprint = cache_key(dict(corpus=corpus.fingerprint, split="heldout", vocab_size=config.vocab_size,
                                 seq_len=config.seq_len, heldout_every=config.heldout_every,
                                 tokens=cache_key(dict(ids=int(len(ids)), head=ids[:64].tolist())),
                                 windows=chosen.tolist(), version=VERSION))
    return Windows(torch.from_numpy(heldout[chosen].astype(np.int64)), config.corpus, "heldout", fingerprint)


def heldout_windows(run, max_tokens: int | None = None) -> Windows:
    """The run's held-out windows (never trained on) as ``zones.core.data.Windows``, for the
    analyses that score a model on text: ``max_tokens`` scored tokens, evenly spaced."""
    config = run.config
    n_take = None
    if max_tokens is not None:
        n_take = check_int(max_tokens, "max_tokens", min=1) // (config.seq_len - 1)
    return heldout_split(config, n_take)
