"""Shared fixtures: tiny random-initialised models of each supported family (no downloads)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def _tiny_config(family: str, n_layers: int = 4, vocab: int = 256):
    from transformers import GPT2Config, GPTNeoXConfig, LlamaConfig

    if family == "llama":
        return LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    if family == "gpt_neox":
        return GPTNeoXConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=n_layers,
                             num_attention_heads=4, max_position_embeddings=256)
    if family == "gpt2":
        return GPT2Config(vocab_size=vocab, n_embd=32, n_layer=n_layers, n_head=4, n_positions=256)
    raise ValueError(family)


def tiny_model(family: str, n_layers: int = 4, seed: int = 0, vocab: int = 256):
    """A random tiny causal LM of ``family`` in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(_tiny_config(family, n_layers, vocab))
    # Random init leaves blocks close to the identity; scale weights up so that removing a
    # block changes the output measurably.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "wte" not in name and "embed" not in name:
                p.mul_(8.0)
    return model.eval()


FAMILIES = ("llama", "gpt_neox", "gpt2")


@pytest.fixture
def one_thread():
    """Tiny models gain nothing from threads, and lose a lot when the cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(params=FAMILIES)
def family(request) -> str:
    return request.param


USER_CACHE = os.environ.get("ZONES_CACHE") or str(Path.home() / ".cache" / "zones")


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory):
    """Every test session writes its results to a temporary cache."""
    os.environ["ZONES_CACHE"] = str(tmp_path_factory.mktemp("zones-cache"))
    yield
    os.environ["ZONES_CACHE"] = USER_CACHE


@pytest.fixture
def user_cache(monkeypatch):
    """The user's real cache: the default model's converted weights are reused, as in use."""
    monkeypatch.setenv("ZONES_CACHE", USER_CACHE)
    return Path(USER_CACHE)


def train_tiny_tokenizer(vocab_size: int = 256):
    """A byte-level BPE tokenizer trained on a little stdlib prose (offline, ~1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from zones.core.data import load_corpus

    text = load_corpus("stdlib").text[:200_000]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A saved tiny Llama-family model with its tokenizer, loadable by ``zones.core.models``."""
    path = tmp_path_factory.mktemp("tiny-llama")
    model = tiny_model("llama", n_layers=6, vocab=len(tiny_tokenizer))
    model.save_pretrained(path, safe_serialization=True)
    tiny_tokenizer.save_pretrained(path)
    return path


def write_tiny_gguf(path: Path, tokenizer, n_layers: int = 2, hidden: int = 16, ffn: int = 32,
                    heads: int = 2, kv_heads: int = 1, context: int = 64) -> Path:
    """A tiny float32 Llama GGUF file (random weights, ``tokenizer``'s BPE vocabulary and merges)."""
    import json

    import gguf
    import numpy as np

    vocab = tokenizer.backend_tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(n_layers)
    writer.add_context_length(context)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(hidden // heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if token == tokenizer.eos_token else 1 for token in tokens])
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    writer.add_bos_token_id(tokenizer.eos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    kv = kv_heads * (hidden // heads)
    writer.add_tensor("token_embd.weight", normal(len(tokens), hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    for i in range(n_layers):
        for name, shape in (("attn_q", (hidden, hidden)), ("attn_k", (kv, hidden)), ("attn_v", (kv, hidden)),
                            ("attn_output", (hidden, hidden)), ("ffn_gate", (ffn, hidden)),
                            ("ffn_up", (ffn, hidden)), ("ffn_down", (hidden, ffn))):
            writer.add_tensor(f"blk.{i}.{name}.weight", normal(*shape))
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    """A tiny Llama GGUF file (2 blocks, a 400-token BPE vocabulary with merges), ~1 MB."""
    return write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", train_tiny_tokenizer(400))


@pytest.fixture(scope="session")
def micro_corpus(tmp_path_factory) -> str:
    """About 120 kB of standard-library source as a text file: a corpus that trains in seconds."""
    from zones.core.data import stdlib_files

    text, files = "", iter(stdlib_files())
    while len(text) < 120_000:
        text += next(files).read_text(encoding="utf-8", errors="replace") + "\n\n"
    path = tmp_path_factory.mktemp("micro-corpus") / "code.txt"
    path.write_text(text[:120_000])
    return str(path)


def autogroup_nice(pid: int | str, nice: int) -> int | None:
    """Set the scheduling weight of ``pid``'s session (a Linux autogroup; ``"self"``: this one)
    where allowed (root), and return the previous one (None when not allowed).

    A Ray node's raylet waits a fixed 15 s for its agents to start and aborts after that; on a
    machine whose cores are shared by many busy sessions, an agent's imports alone can take
    longer, and ``nice`` does not act across sessions. The Ray tests weight a starting node up
    for those seconds, then set it back. Elsewhere (CI, a user) nothing changes, and nothing
    needs to."""
    path = Path(f"/proc/{pid}/autogroup")
    try:
        previous = int(path.read_text().split("nice")[-1])
        path.write_text(str(nice))
    except (OSError, ValueError):
        return None
    return previous


NOT_ON_THE_MICRO_MODEL = ("task_accuracy",)  # its answers (up to ~270 characters) exceed the micro model's 32 positions


@pytest.fixture(scope="session")
def micro_book_root(micro_corpus, tmp_path_factory) -> Path:
    """The project folder of the whole book built once per session on the micro model, every
    chapter but those in NOT_ON_THE_MICRO_MODEL (their pages: the placeholder of a chapter not
    executed; tests/test_tasks.py runs task_accuracy on a tiny model of enough positions)."""
    from test_browser import micro_model, tiny_book_parameters

    from zones.book import build_book, chapters, copy_project

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the kernels inherit it
    model = micro_model(micro_corpus)
    root = copy_project(tmp_path_factory.mktemp("book") / "project", root=Path(__file__).resolve().parents[1])
    names = [n for n in chapters(root) if n not in NOT_ON_THE_MICRO_MODEL]
    build_book(tiny_book_parameters(model, micro_corpus), only=names, root=root)
    return root
