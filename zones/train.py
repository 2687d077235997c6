"""Training a depth series of small GPT-NeoX (Pythia-architecture) language models from scratch.

One call trains one model and watches its spectra form::

    run = train_model(profile_config("cpu", depth=6))
    run.path        # a model directory: load it with zones.models.load_model(run.path)
    run.history     # step, lr, train_loss, heldout_loss, tokens_seen, seconds
    run.snapshots   # step, layer, role, stable_rank, alpha_shape, alpha_esd

The recipe: a byte-level BPE tokenizer trained on the corpus; the corpus cut into windows of
``seq_len`` tokens, every ``heldout_every``-th window held out for the loss curve; AdamW with
linear warm-up and cosine decay; fixed seeds for the weights and the batch order. Every
``snapshot_every`` steps (and at step 0 and the last step) each weight matrix's stable rank
and α are measured with ``zones.spectra.alpha_table``; the time this takes is recorded.

Caching: a finished run is a directory ``cache_dir()/train/<key>`` keyed by every training
parameter, the corpus fingerprint and ``VERSION``, written under a temporary name and renamed
into place, so a second call loads instead of training. While training, a checkpoint
(weights, optimizer, step, logs so far) is written atomically to
``<key>.partial/checkpoint.safetensors`` every ``checkpoint_every`` steps; an interrupted run
resumes from it. The checkpoint is safetensors with a JSON header (no pickle is ever loaded),
and its run identity is checked before any tensor is read. ``keep_checkpoints=True`` keeps the
model of every snapshot step as a loadable directory, for ``zones.checkpoints``.

The trained series feeds the other chapters' analyses: ``heldout_windows(run)`` gives the
run's held-out windows as ``zones.data.Windows``, and ``series_importance(runs)`` runs the
single-block ablation and the α table on every depth (``zones.importance.ModelImportance``).

Profiles: ``cpu`` (the default; depths 4, 6, 8 at width 16·depth, a few minutes on a laptop)
and ``paper`` (depths 8, 12, 16 at width 64·depth, as in the paper; meant for a GPU). Every
field of ``TrainConfig`` can be overridden.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import torch
from torch import nn

from .cache import atomic_write_text, cache_dir, cache_key, read_table, write_table

VERSION = "train-1"
SNAPSHOT_COLUMNS = ["step", "layer", "role", "stable_rank", "alpha_shape", "alpha_esd"]
HISTORY_COLUMNS = ["step", "lr", "train_loss", "heldout_loss", "tokens_seen", "seconds"]
EOS_TOKEN = "<|endoftext|>"


class TrainingInterrupted(RuntimeError):
    """Training stopped early (``stop_after``); the checkpoint lets a later call resume."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model. Sizes are plain parameters.

    ``width=None`` means ``width_per_layer * depth`` (the paper keeps width/depth fixed).
    ``warmup_steps=None`` means 10 % of ``steps``. ``precision`` is ``fp32`` or ``bf16``
    (bf16 autocast for the forward pass; weights and optimizer stay in fp32).
    """

    depth: int
    width: int | None = None
    width_per_layer: int = 16
    head_dim: int = 16
    mlp_ratio: int = 4
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    corpus: str = "stdlib-code"
    heldout_every: int = 20
    eval_every: int = 25
    eval_windows: int = 32
    snapshot_every: int = 25
    checkpoint_every: int = 50
    precision: str = "fp32"

    def __post_init__(self):
        positive = ["depth", "width_per_layer", "head_dim", "mlp_ratio", "seq_len", "batch_size",
                    "steps", "eval_every", "eval_windows", "snapshot_every", "checkpoint_every"]
        for name in positive:
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        for name in ("vocab_size", "heldout_every", "seed"):
            if not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer, not {getattr(self, name)!r}")
        for name in ("width", "warmup_steps"):
            if getattr(self, name) is not None and not _is_int(getattr(self, name)):
                raise ValueError(f"{name} must be an integer or None, not {getattr(self, name)!r}")
        for name in ("lr", "min_lr_ratio", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, not {value!r}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, not {self.weight_decay}")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip must be >= 0 (0 = no clipping), not {self.grad_clip}")
        betas = self.betas
        if (isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2
                or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), e.g. betas=[0.9, 0.95], not {betas!r}")
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ValueError(f"corpus must be a corpus name or a path, not {self.corpus!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, not {self.seed}")
        if self.width is not None and (self.width < 1 or self.width % self.head_dim):
            raise ValueError(f"width {self.width} must be a positive multiple of head_dim {self.head_dim}")
        if self.hidden_size % self.head_dim:
            raise ValueError(f"width {self.hidden_size} is not a multiple of head_dim {self.head_dim}")
        if self.vocab_size < 260:
            raise ValueError(f"vocab_size must be at least 260 (256 bytes + specials), not {self.vocab_size}")
        if self.seq_len < 2:
            raise ValueError(f"seq_len must be at least 2, not {self.seq_len}")
        if not self.lr > 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"need lr > 0 and 0 <= min_lr_ratio <= 1, not {self.lr}, {self.min_lr_ratio}")
        if self.warmup_steps is not None and not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps), not {self.warmup_steps}")
        if self.heldout_every < 2:
            raise ValueError(f"heldout_every must be at least 2, not {self.heldout_every}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be 'fp32' or 'bf16', not {self.precision!r}")

    @property
    def hidden_size(self) -> int:
        return self.width if self.width is not None else self.width_per_layer * self.depth

    @property
    def n_heads(self) -> int:
        return self.hidden_size // self.head_dim

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 10)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "betas": list(self.betas)}


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


# Each profile fills the fields it names; the rest keep TrainConfig's defaults.
PROFILES: dict[str, dict[str, Any]] = {
    # Teaching scale: three depths, all trained in a few minutes on two CPU cores.
    "cpu": dict(depths=(4, 6, 8), width_per_layer=16, head_dim=16, vocab_size=4096, seq_len=128,
                batch_size=16, steps=400, lr=3e-3),
    # The paper's series D8/D12/D16 at width 64·depth (512, 768, 1024), for a GPU.
    "paper": dict(depths=(8, 12, 16), width_per_layer=64, head_dim=64, vocab_size=5120, seq_len=512,
                  batch_size=32, steps=2000, lr=6e-4, eval_windows=64, checkpoint_every=250,
                  precision="bf16"),
}


def profile_depths(profile: str = "cpu") -> tuple[int, ...]:
    _check_profile(profile)
    return tuple(PROFILES[profile]["depths"])


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")


def profile_config(profile: str = "cpu", depth: int | None = None, **overrides) -> TrainConfig:
    """The ``TrainConfig`` of one depth of a profile, with any field overridden."""
    _check_profile(profile)
    settings = {k: v for k, v in PROFILES[profile].items() if k != "depths"}
    known = {f.name for f in fields(TrainConfig)} - {"depth"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown training parameter(s) {unknown}; known: {sorted(known)}")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if depth is None:
        depth = PROFILES[profile]["depths"][0]
    return TrainConfig(depth=int(depth), **settings)  # validates every field (betas included)


def series_configs(profile: str = "cpu", depths: Iterable[int] | None = None,
                   **overrides) -> list[TrainConfig]:
    """One config per depth (the profile's depths unless given)."""
    if "depth" in overrides:
        raise ValueError("give the depths as depths=[...], not as the training parameter 'depth'")
    depths = profile_depths(profile) if depths is None else tuple(int(d) for d in depths)
    if not depths:
        raise ValueError("depths is empty")
    return [profile_config(profile, depth, **overrides) for depth in depths]


def parameter_count(config: TrainConfig) -> int:
    """Number of parameters of the model ``config`` builds (embeddings included, untied)."""
    d, L, V, m = config.hidden_size, config.depth, config.vocab_size, config.mlp_ratio
    per_block = (3 * d * d + 3 * d) + (d * d + d) + (m * d * d + m * d) + (m * d * d + d) + 4 * d
    return 2 * V * d + L * per_block + 2 * d


# --- tokenizer and tokens -------------------------------------------------------------------

def train_tokenizer(corpus, vocab_size: int):
    """A byte-level BPE tokenizer trained on ``corpus`` (a ``zones.data.Corpus``), cached.

    Returned as a ``transformers.PreTrainedTokenizerFast`` with ``<|endoftext|>`` as its
    end-of-text token, so it saves and loads like any model's tokenizer.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = cache_dir() / "tokenizers" / cache_key(
        dict(version=VERSION, corpus=corpus.fingerprint, vocab_size=vocab_size))
    if (folder / "tokenizer.json").exists():
        return PreTrainedTokenizerFast.from_pretrained(folder)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS_TOKEN], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(_chunks(corpus.text), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS_TOKEN)
    _save_atomically(folder, tokenizer.save_pretrained)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def _chunks(text: str, size: int = 200_000) -> list[str]:
    """Cut text at line ends into pieces of about ``size`` characters (parallel tokenizing)."""
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", min(start + size, len(text)))
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    return pieces


def tokenizer_and_tokens(corpus, vocab_size: int):
    """The corpus's BPE tokenizer of ``vocab_size`` and the corpus's token ids under it (cached)."""
    tokenizer = train_tokenizer(corpus, vocab_size)
    return tokenizer, corpus_tokens(corpus, tokenizer, cache_key(dict(corpus=corpus.fingerprint,
                                                                      vocab=vocab_size, version=VERSION)))


def corpus_tokens(corpus, tokenizer, tokenizer_id: str) -> np.ndarray:
    """All token ids of ``corpus`` under ``tokenizer`` (int32), cached as a .npy file."""
    path = cache_dir() / "tokens" / f"{cache_key(dict(corpus=corpus.fingerprint, tokenizer=tokenizer_id))}.npy"
    if path.exists():
        return np.load(path)
    encoded = tokenizer(_chunks(corpus.text), add_special_tokens=False, return_attention_mask=False,
                        verbose=False)["input_ids"]
    ids = np.concatenate([np.asarray(part, dtype=np.int32) for part in encoded])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npy")
    os.close(fd)
    np.save(tmp, ids)
    os.replace(tmp, path)
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


def batch_indices(n_windows: int, batch_size: int, step: int, seed: int) -> np.ndarray:
    """Indices of the training windows in batch ``step``: a fresh permutation every epoch.

    A pure function of (step, seed), so a resumed run sees exactly the batches it would have.
    """
    per_epoch = n_windows // batch_size
    if per_epoch < 1:
        raise ValueError(f"{n_windows} training windows cannot fill one batch of {batch_size}")
    epoch, position = divmod(step, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_windows)
    return order[position * batch_size:(position + 1) * batch_size]


def learning_rate(config: TrainConfig, step: int) -> float:
    """Linear warm-up to ``lr``, then cosine decay to ``min_lr_ratio * lr`` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - config.warmup)
    floor = config.lr * config.min_lr_ratio
    return floor + 0.5 * (config.lr - floor) * (1 + math.cos(math.pi * min(1.0, progress)))


# --- model -----------------------------------------------------------------------------------

def build_model(config: TrainConfig) -> nn.Module:
    """A freshly initialised GPT-NeoX causal LM (Pythia's layout: parallel residual, rotary
    on a quarter of each head, untied embeddings, no dropout), seeded by ``config.seed``."""
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    hf_config = GPTNeoXConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.depth,
        num_attention_heads=config.n_heads, intermediate_size=config.mlp_ratio * config.hidden_size,
        max_position_embeddings=config.seq_len, rotary_pct=0.25, use_parallel_residual=True,
        tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=0, eos_token_id=0, use_cache=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GPTNeoXForCausalLM(hf_config)
    return model


def _optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    # Weight decay on matrices only (nanoGPT's rule); biases and norms are not decayed.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [dict(params=decay, weight_decay=config.weight_decay), dict(params=no_decay, weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas))


@torch.no_grad()
def heldout_loss(model: nn.Module, windows: torch.Tensor, batch_size: int = 16,
                 precision: str = "fp32") -> float:
    """Mean next-token loss (nats) over every predicted token of ``windows``."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        batch = windows[start:start + batch_size].to(device)
        with _autocast(device, precision):
            logits = model(input_ids=batch).logits
        loss = nn.functional.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                           batch[:, 1:].reshape(-1), reduction="sum")
        total += float(loss)
        count += batch[:, 1:].numel()
    model.train(was_training)
    return total / count


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


def spectral_snapshot(model: nn.Module, step: int) -> pd.DataFrame:
    """Stable rank and α of every block matrix, tagged with ``step`` (``SNAPSHOT_COLUMNS``)."""
    from .spectra import alpha_table

    with torch.no_grad():
        table = alpha_table(model, cache=False, estimators=("shape", "esd", "companions"))
    missing = sorted(set(SNAPSHOT_COLUMNS[1:]) - set(table.columns))
    if missing:
        raise RuntimeError(f"zones.spectra.alpha_table returned no {missing} columns")
    return table.assign(step=step)[SNAPSHOT_COLUMNS]


# --- a training run ---------------------------------------------------------------------------

@dataclass
class TrainedRun:
    """A finished run: its model directory, config, loss history, spectral snapshots, summary.

    ``summary`` holds ``depth, width, heads, parameters, steps, tokens_seen, total_seconds``
    (training, held-out evaluation and snapshots), ``train_seconds`` (optimizer steps only),
    ``eval_seconds, snapshot_seconds, snapshot_fraction`` (of the total),
    ``initial_heldout_loss, final_heldout_loss, device``.
    """

    path: Path
    config: TrainConfig
    history: pd.DataFrame
    snapshots: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def load(self, device: str | None = None):
        """The trained model through ``zones.models.load_model`` (a ``LoadedModel``)."""
        from .models import load_model

        return load_model(str(self.path), device=device)


def run_key(config: TrainConfig, corpus_fingerprint: str) -> dict[str, Any]:
    """The cache key dict of a run: every parameter, the corpus and the code version."""
    return dict(version=VERSION, corpus_fingerprint=corpus_fingerprint, **config.as_dict())


def run_path(config: TrainConfig) -> Path:
    """Where the finished run of ``config`` lives (whether or not it exists yet)."""
    from .data import load_corpus

    return cache_dir() / "train" / cache_key(run_key(config, load_corpus(config.corpus).fingerprint))


def load_run(path: str | Path) -> TrainedRun:
    """A finished run from its directory."""
    path = Path(path)
    meta_path = path / "run.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{path} holds no run.json: not a finished training run")
    meta = json.loads(meta_path.read_text())
    settings = {k: v for k, v in meta["config"].items() if k in {f.name for f in fields(TrainConfig)}}
    settings["betas"] = tuple(settings["betas"])
    return TrainedRun(path, TrainConfig(**settings), read_table(path / "history.csv"),
                      read_table(path / "snapshots.parquet"), meta["summary"])


def train_model(config: TrainConfig, *, device: str | None = None, refresh: bool = False,
                progress: bool = True, stop_after: int | None = None,
                on_step: Callable[[int, float], None] | None = None,
                keep_checkpoints: bool = False) -> TrainedRun:
    """Train one model (or load the finished run from the cache) and return the run.

    ``stop_after=N`` stops after step N as an interruption would, after writing a checkpoint,
    and raises ``TrainingInterrupted``; the next call resumes from it. ``on_step(step, loss)``
    is called after every optimizer step. ``refresh=True`` retrains from scratch.
    ``keep_checkpoints=True`` also keeps the model at every snapshot step as a loadable
    directory ``run.path/checkpoints/step-NNNNNN`` (config, safetensors, tokenizer and
    ``zones-checkpoint.json`` with its step), for ``zones.checkpoints``; a cached run that
    kept none is trained again (the results are the same, bit for bit).
    """
    from tqdm.auto import tqdm

    from .data import load_corpus

    if stop_after is not None and not 0 < stop_after <= config.steps:
        raise ValueError(f"stop_after must be in 1..{config.steps}, not {stop_after}")
    corpus = load_corpus(config.corpus)
    key = run_key(config, corpus.fingerprint)
    final_dir = cache_dir() / "train" / cache_key(key)
    partial_dir = final_dir.with_name(final_dir.name + ".partial")
    if keep_checkpoints and (final_dir / "run.json").exists() and not (final_dir / "checkpoints").is_dir():
        print(f"zones: the cached run {final_dir} kept no checkpoints; training it again to keep them")
        refresh = True
    if refresh:
        shutil.rmtree(final_dir, ignore_errors=True)
        shutil.rmtree(partial_dir, ignore_errors=True)
    if (final_dir / "run.json").exists():
        return load_run(final_dir)

    tokenizer, ids = tokenizer_and_tokens(corpus, config.vocab_size)
    train_windows, heldout_windows = split_windows(ids, config.seq_len, config.heldout_every)
    pick = np.unique(np.linspace(0, len(heldout_windows) - 1, config.eval_windows).round().astype(int))
    eval_batch = torch.from_numpy(heldout_windows[pick].astype(np.int64))
    batch_indices(len(train_windows), config.batch_size, 0, config.seed)  # fails early if too small

    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    model = build_model(config).to(device)
    optimizer = _optimizer(model, config)
    state = dict(step=0, history=[], snapshots=[], pending_losses=[], train_seconds=0.0,
                 snapshot_seconds=0.0, eval_seconds=0.0, keep_checkpoints=keep_checkpoints)
    checkpoint = partial_dir / CHECKPOINT_FILE
    if (partial_dir / "checkpoint.pt").exists():  # an older format (a pickle): never loaded
        print(f"zones: ignoring {partial_dir / 'checkpoint.pt'} (pickled checkpoints are not loaded)")
    if checkpoint.exists():
        saved = load_checkpoint(checkpoint, key, model, optimizer)
        if keep_checkpoints and not saved.get("keep_checkpoints"):
            print(f"zones: the checkpoint in {partial_dir} kept no models before step {saved['step']}; "
                  f"training from step 0 to keep them all")
            shutil.rmtree(partial_dir, ignore_errors=True)
            model = build_model(config).to(device)
            optimizer = _optimizer(model, config)
        else:
            state = saved
    keep = bool(state.get("keep_checkpoints"))

    def save_checkpoint():
        partial_dir.mkdir(parents=True, exist_ok=True)
        write_checkpoint(checkpoint, key, model, optimizer, state)

    def snapshot(step):
        start = time.perf_counter()
        state["snapshots"].extend(spectral_snapshot(model, step).to_dict("records"))
        state["snapshot_seconds"] += time.perf_counter() - start
        if keep:  # the model these rows were measured on, as a loadable directory
            _save_atomically(partial_dir / "checkpoints" / f"step-{step:06d}",
                             lambda tmp: save_model_directory(tmp, model, tokenizer, dict(step=step, depth=config.depth,
                                                                                          run_key=cache_key(key))))

    def evaluate(step):
        train_losses, state["pending_losses"] = state["pending_losses"], []
        start = time.perf_counter()
        loss = heldout_loss(model, eval_batch, precision=config.precision)
        state["eval_seconds"] += time.perf_counter() - start
        state["history"].append(dict(
            step=step, lr=learning_rate(config, max(0, step - 1)),
            train_loss=float(np.mean(train_losses)) if train_losses else float("nan"),
            heldout_loss=loss, tokens_seen=step * config.tokens_per_step,
            seconds=state["train_seconds"]))

    model.train()
    if state["step"] == 0 and not state["history"]:
        evaluate(0)
        snapshot(0)
    bar = tqdm(total=config.steps, initial=state["step"], disable=not progress,
               desc=f"training depth {config.depth} (width {config.hidden_size})", leave=False)
    try:
        while state["step"] < config.steps:
            step = state["step"]
            start = time.perf_counter()
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(config, step)
            rows = batch_indices(len(train_windows), config.batch_size, step, config.seed)
            batch = torch.from_numpy(train_windows[rows].astype(np.int64)).to(device)
            with _autocast(device, config.precision):
                loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            if config.grad_clip > 0:
                nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_value = float(loss.detach())
            if not math.isfinite(loss_value):
                raise FloatingPointError(f"training loss became {loss_value} at step {step}; lower lr")
            state["pending_losses"].append(loss_value)
            state["step"] = step = step + 1
            state["train_seconds"] += time.perf_counter() - start
            bar.update(1)
            bar.set_postfix(loss=f"{loss_value:.3f}")
            if on_step is not None:
                on_step(step, loss_value)
            if step % config.eval_every == 0 or step == config.steps:
                evaluate(step)
            if step % config.snapshot_every == 0 or step == config.steps:
                snapshot(step)
            if step == stop_after:
                save_checkpoint()
                raise TrainingInterrupted(f"stopped after step {step} of {config.steps}; "
                                          f"the checkpoint in {partial_dir} resumes it")
            if step % config.checkpoint_every == 0 and step < config.steps:
                save_checkpoint()
    finally:
        bar.close()

    history = pd.DataFrame(state["history"], columns=HISTORY_COLUMNS)
    snapshots = pd.DataFrame(state["snapshots"], columns=SNAPSHOT_COLUMNS)
    total = state["train_seconds"] + state["snapshot_seconds"] + state["eval_seconds"]
    summary = dict(
        depth=config.depth, width=config.hidden_size, heads=config.n_heads,
        parameters=int(sum(p.numel() for p in model.parameters())), steps=config.steps,
        tokens_seen=config.steps * config.tokens_per_step, total_seconds=total, train_seconds=state["train_seconds"],
        eval_seconds=state["eval_seconds"], snapshot_seconds=state["snapshot_seconds"],
        snapshot_fraction=state["snapshot_seconds"] / total if total else float("nan"),
        initial_heldout_loss=float(history["heldout_loss"].iloc[0]),
        final_heldout_loss=float(history["heldout_loss"].iloc[-1]), device=str(device))

    def write(tmp: Path):
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if keep:
            os.replace(partial_dir / "checkpoints", tmp / "checkpoints")
        write_table(history, tmp / "history.csv")
        write_table(snapshots, tmp / "snapshots.parquet")
        atomic_write_text(tmp / "run.json", json.dumps(dict(config=config.as_dict(), key=key, summary=summary),
                                                       indent=2, default=str))

    _save_atomically(final_dir, write)
    shutil.rmtree(partial_dir, ignore_errors=True)
    return load_run(final_dir)


CHECKPOINT_FILE = "checkpoint.safetensors"  # tensors + a JSON header: no pickle is ever loaded


def _json_default(value):
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, torch.Tensor)):
        return float(value)
    raise TypeError(f"cannot store {type(value).__name__} in a checkpoint")


def write_checkpoint(path: Path, key: dict, model: nn.Module, optimizer: torch.optim.Optimizer,
                     state: dict) -> None:
    """Weights, optimizer state and the run's state so far, in one safetensors file.

    The run's identity (``key``), its state (step, logs) and the optimizer's non-tensor
    state live as JSON in the file's header, so a reader checks the identity before it
    reads a single tensor. Written to a temporary file and renamed: old or new, never half.
    """
    from safetensors.torch import save_file

    saved = optimizer.state_dict()
    tensors = {f"model.{name}": t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    scalars = {}
    for index, entry in saved["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"optimizer.{index}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{index}.{name}"] = value
    header = dict(key=key, state=state, param_groups=saved["param_groups"], optimizer_scalars=scalars)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"zones": json.dumps(header, default=_json_default)})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_checkpoint(path: Path, key: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore ``model`` and ``optimizer`` from ``write_checkpoint``'s file and return the run's
    state. The run identity is checked before any tensor is read; a checkpoint of another run
    or a damaged file is one clear error naming the file and what to delete."""
    from safetensors import safe_open

    remedy = f"delete {path.parent} to train this run from step 0"

    def damaged(err: Exception) -> RuntimeError:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        return RuntimeError(f"checkpoint {path} is damaged or incomplete ({type(err).__name__}: {first}); {remedy}")

    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            header = json.loads((handle.metadata() or {})["zones"])
            same_run = header.get("key") == key
            tensors = {name: handle.get_tensor(name) for name in handle.keys()} if same_run else {}
    except Exception as err:  # noqa: BLE001 - a truncated file, a foreign file, a bad header
        raise damaged(err) from None
    if not same_run:
        raise RuntimeError(f"checkpoint {path} belongs to another run; {remedy}")
    try:
        model.load_state_dict({n[len("model."):]: t for n, t in tensors.items() if n.startswith("model.")})
        entries: dict[int, dict] = {}
        for name, value in [*((n[len("optimizer."):], t) for n, t in tensors.items() if n.startswith("optimizer.")),
                            *header["optimizer_scalars"].items()]:
            index, _, field_name = name.partition(".")
            entries.setdefault(int(index), {})[field_name] = value
        groups = [dict(g, betas=tuple(g["betas"])) if "betas" in g else g for g in header["param_groups"]]
        optimizer.load_state_dict(dict(state=entries, param_groups=groups))
        return header["state"]
    except Exception as err:  # noqa: BLE001 - tensors that do not fit this run's model
        raise damaged(err) from None


def save_model_directory(target: Path, model: nn.Module, tokenizer, meta: dict) -> None:
    """A loadable model directory (config, safetensors weights, tokenizer) with ``meta`` (its
    step, ...) in ``zones-checkpoint.json``."""
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    atomic_write_text(Path(target) / "zones-checkpoint.json", json.dumps(meta, indent=2))


def _save_atomically(target: Path, write: Callable[[Path], Any]) -> None:
    """Fill a temporary directory with ``write(tmp)`` and rename it to ``target``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the result is an ordinary folder
        write(tmp)
        if target.exists():  # another process finished the same run first; keep theirs
            return
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def heldout_windows(run: TrainedRun, max_tokens: int | None = None):
    """The run's held-out windows (never trained on) as ``zones.data.Windows``, for the
    analyses that score a model on text: ``max_tokens`` scored tokens, evenly spaced."""
    from .data import Windows, load_corpus

    config = run.config
    corpus = load_corpus(config.corpus)
    _, ids = tokenizer_and_tokens(corpus, config.vocab_size)
    _, heldout = split_windows(ids, config.seq_len, config.heldout_every)
    n_take = len(heldout) if max_tokens is None else max_tokens // (config.seq_len - 1)
    if not 1 <= n_take <= len(heldout):
        raise ValueError(f"max_tokens={max_tokens} asks for {n_take} windows of {config.seq_len}; the held-out "
                         f"split has {len(heldout)} ({len(heldout) * (config.seq_len - 1)} scored tokens)")
    chosen = np.unique(np.linspace(0, len(heldout) - 1, n_take).round().astype(int))
    fingerprint = cache_key(dict(corpus=corpus.fingerprint, split="heldout", vocab_size=config.vocab_size,
                                 seq_len=config.seq_len, heldout_every=config.heldout_every,
                                 windows=chosen.tolist(), version=VERSION))
    return Windows(torch.from_numpy(heldout[chosen].astype(np.int64)), config.corpus, "heldout", fingerprint)


def series_importance(runs: list[TrainedRun], *, eval_tokens: int | None = 8128, batch_size: int = 16,
                      device: str | None = None, progress: bool = True) -> list:
    """Single-block ablation (``zones.ablation.ablation_table``) and α table of every run on
    its own held-out windows, as ``zones.importance.ModelImportance`` labelled ``depth N``;
    both tables are cached like any model's."""
    from .ablation import ablation_table
    from .importance import ModelImportance
    from .spectra import alpha_table

    results = []
    for run in runs:
        loaded = run.load(device=device)
        windows = heldout_windows(run, eval_tokens)
        ablation = ablation_table(loaded.model, windows, batch_size=batch_size, progress=progress)
        results.append(ModelImportance(str(run.path), f"depth {run.config.depth}", loaded.fingerprint,
                                       run.config.depth, ablation, alpha_table(loaded.model)))
    return results


def train_series(depths: Iterable[int] | None = None, profile: str = "cpu", *, device: str | None = None,
                 refresh: bool = False, progress: bool = True, **overrides) -> list[TrainedRun]:
    """Train (or load) one model per depth of a profile; every ``TrainConfig`` field may be
    overridden (e.g. ``steps=200``, ``width=64``)."""
    configs = series_configs(profile, depths, **overrides)
    return [train_model(c, device=device, refresh=refresh, progress=progress) for c in configs]


def series_summary(runs: list[TrainedRun]) -> pd.DataFrame:
    """One row per run: ``depth, width, heads, parameters, steps, tokens_seen, total_seconds,
    train_seconds, eval_seconds, snapshot_seconds, snapshot_fraction, initial_heldout_loss,
    final_heldout_loss, device, path`` (see ``TrainedRun``)."""
    return pd.DataFrame([dict(run.summary, path=str(run.path)) for run in runs])


def series_history(runs: list[TrainedRun]) -> pd.DataFrame:
    """The loss histories of a series stacked, with a ``depth`` column first."""
    return pd.concat([run.history.assign(depth=run.config.depth) for run in runs], ignore_index=True)[
        ["depth", *HISTORY_COLUMNS]]


def series_snapshots(runs: list[TrainedRun]) -> pd.DataFrame:
    """The spectral snapshots of a series stacked, with a ``depth`` column first."""
    return pd.concat([run.snapshots.assign(depth=run.config.depth) for run in runs], ignore_index=True)[
        ["depth", *SNAPSHOT_COLUMNS]]
