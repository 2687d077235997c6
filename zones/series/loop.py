"""The training loop: a seeded GPT-NeoX model, AdamW with warm-up and cosine decay, the held-out
loss curve (``zones.measure.scoring.evaluate_loss``, the one loss routine) and spectral snapshots, with
a resumable checkpoint. ``train_model(config)`` trains one run or loads the finished one."""
from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

from zones.core.cache import cache_dir, cache_key
from zones.core.checks import check_int
from zones.core.data import load_corpus
from zones.core.entries import entry_lock
from zones.core.hardware import check_precision, torch_threads
from zones.core.progress import count_training
from zones.measure.scoring import evaluate_loss
from zones.series.config import TrainConfig
from zones.series.io import (
    CHECKPOINT_FILE,
    HISTORY_COLUMNS,
    DamagedCheckpoint,
    SNAPSHOT_COLUMNS,
    TrainedRun,
    is_finished,
    load_checkpoint,
    load_run,
    partial_path,
    run_key,
    save_snapshot_model,
    write_checkpoint,
    write_run,
)
from zones.series.tokenizer import heldout_split, split_windows, tokenizer_and_tokens
from zones.spectra import alpha_table

SCORING_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # training precision -> evaluate_loss's dtype


class TrainingInterrupted(RuntimeError):
    """Training stopped early (``stop_after``); the checkpoint lets a later call resume."""


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


def build_model(config: TrainConfig) -> nn.Module:
    """A freshly initialised GPT-NeoX causal LM (Pythia's layout: parallel residual, rotary
    on a quarter of each head, untied embeddings, no dropout, SDPA attention), seeded by
    ``config.seed``."""
    hf_config = GPTNeoXConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size, num_hidden_layers=config.depth,
        num_attention_heads=config.n_heads, intermediate_size=config.mlp_ratio * config.hidden_size,
        max_position_embeddings=config.seq_len, rotary_pct=0.25, use_parallel_residual=True,
        tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=0, eos_token_id=0, use_cache=False, attn_implementation="sdpa")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = GPTNeoXForCausalLM(hf_config)
    return model


def make_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """AdamW, fused (one kernel over all parameters, CPU and CUDA); weight decay on matrices
    only (nanoGPT's rule), biases and norms are not decayed."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [dict(params=decay, weight_decay=config.weight_decay), dict(params=no_decay, weight_decay=0.0)]
    return torch.optim.AdamW(groups, lr=config.lr, betas=tuple(config.betas), fused=True)


def spectral_snapshot(model: nn.Module, step: int) -> pd.DataFrame:
    """Stable rank and α of every block matrix, tagged with ``step`` (``SNAPSHOT_COLUMNS``)."""
    with torch.no_grad():
        table = alpha_table(model, cache=False, estimators=("shape", "esd", "companions"))
    missing = sorted(set(SNAPSHOT_COLUMNS[1:]) - set(table.columns))
    if missing:
        raise RuntimeError(f"zones.spectra.alpha_table returned no {missing} columns")
    return table.assign(step=step)[SNAPSHOT_COLUMNS]


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return torch.autocast(device.type, enabled=False)


class _Training:
    """One run in progress: model, optimizer, data and the logs so far (``state``)."""

    def __init__(self, config: TrainConfig, key: dict, partial_dir: Path, device: torch.device,
                 keep_checkpoints: bool, refresh_caches: bool = False):
        self.config, self.key, self.partial_dir, self.device = config, key, partial_dir, device
        corpus = load_corpus(config.corpus)
        self.tokenizer, ids = tokenizer_and_tokens(corpus, config.vocab_size, refresh=refresh_caches)
        self.train_windows, _ = split_windows(ids, config.seq_len, config.heldout_every)
        self.eval_windows = heldout_split(config, config.eval_windows, corpus=corpus, ids=ids)
        batch_indices(len(self.train_windows), config.batch_size, 0, config.seed)  # fails early if too small
        self.state = dict(step=0, history=[], snapshots=[], pending_losses=[], train_seconds=0.0,
                          snapshot_seconds=0.0, eval_seconds=0.0, keep_checkpoints=keep_checkpoints)
        self.fresh_model()
        self.resume(keep_checkpoints)

    def fresh_model(self) -> None:
        self.model = build_model(self.config).to(self.device)
        self.optimizer = make_optimizer(self.model, self.config)

    @property
    def checkpoint(self) -> Path:
        return self.partial_dir / CHECKPOINT_FILE

    def resume(self, keep_checkpoints: bool) -> None:
        if (self.partial_dir / "checkpoint.pt").exists():  # an older format (a pickle): never loaded
            print(f"zones: ignoring {self.partial_dir / 'checkpoint.pt'} (pickled checkpoints are not loaded)")
        if not self.checkpoint.exists():
            return
        try:
            saved = load_checkpoint(self.checkpoint, self.key, self.model, self.optimizer)
        except DamagedCheckpoint as err:  # never resumed: the run starts again
            print(f"zones: {err.reason}; training depth {self.config.depth}, seed {self.config.seed} from step 0",
                  file=sys.stderr, flush=True)
            shutil.rmtree(self.partial_dir, ignore_errors=True)
            self.fresh_model()
            return
        if keep_checkpoints and not saved.get("keep_checkpoints"):
            print(f"zones: the checkpoint in {self.partial_dir} kept no models before step {saved['step']}; "
                  f"training from step 0 to keep them all")
            shutil.rmtree(self.partial_dir, ignore_errors=True)
            self.fresh_model()
        else:
            self.state = saved

    @property
    def keep(self) -> bool:
        return bool(self.state.get("keep_checkpoints"))

    def save_checkpoint(self) -> None:
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        write_checkpoint(self.checkpoint, self.key, self.model, self.optimizer, self.state)

    def snapshot(self, step: int) -> None:
        start = time.perf_counter()
        self.state["snapshots"].extend(spectral_snapshot(self.model, step).to_dict("records"))
        self.state["snapshot_seconds"] += time.perf_counter() - start
        if self.keep:  # the model these rows were measured on, as a loadable directory
            save_snapshot_model(self.partial_dir, step, self.model, self.tokenizer,
                                dict(depth=self.config.depth, run_key=cache_key(self.key)))

    def evaluate(self, step: int) -> None:
        train_losses, self.state["pending_losses"] = self.state["pending_losses"], []
        start = time.perf_counter()
        self.model.eval()
        loss = evaluate_loss(self.model, self.eval_windows, batch_size=16,
                             dtype=SCORING_DTYPES[self.config.precision]).loss
        self.model.train()
        self.state["eval_seconds"] += time.perf_counter() - start
        self.state["history"].append(dict(
            step=step, lr=learning_rate(self.config, max(0, step - 1)),
            train_loss=float(np.mean(train_losses)) if train_losses else float("nan"),
            heldout_loss=loss, tokens_seen=step * self.config.tokens_per_step,
            seconds=self.state["train_seconds"]))

    def step(self) -> float:
        """One optimizer step; returns its training loss."""
        config, step = self.config, self.state["step"]
        start = time.perf_counter()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, step)
        rows = batch_indices(len(self.train_windows), config.batch_size, step, config.seed)
        batch = torch.from_numpy(self.train_windows[rows].astype(np.int64)).to(self.device)
        with _autocast(self.device, config.precision):
            loss = self.model(input_ids=batch, labels=batch).loss
        loss.backward()
        if config.grad_clip > 0:
            nn.utils.clip_grad_norm_(self.model.parameters(), config.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value):
            raise FloatingPointError(f"training loss became {loss_value} at step {step}; lower lr")
        self.state["pending_losses"].append(loss_value)
        count_training(self.model, batch.numel())  # forward, backward, AdamW: for zones.core.progress
        self.state["step"] = step + 1
        self.state["train_seconds"] += time.perf_counter() - start
        return loss_value

    def after_step(self, step: int, stop_after: int | None) -> None:
        """Evaluate, snapshot and checkpoint on their schedules after step ``step``."""
        config = self.config
        if step % config.eval_every == 0 or step == config.steps:
            self.evaluate(step)
        if config.is_snapshot(step):
            self.snapshot(step)
        if step == stop_after:
            self.save_checkpoint()
            raise TrainingInterrupted(f"stopped after step {step} of {config.steps}; "
                                      f"the checkpoint in {self.partial_dir} resumes it")
        if step % config.checkpoint_every == 0 and step < config.steps:
            self.save_checkpoint()

    def summary(self, history: pd.DataFrame) -> dict:
        state, config = self.state, self.config
        total = state["train_seconds"] + state["snapshot_seconds"] + state["eval_seconds"]
        return dict(
            depth=config.depth, width=config.hidden_size, heads=config.n_heads, seed=config.seed,
            parameters=int(sum(p.numel() for p in self.model.parameters())), steps=config.steps,
            tokens_seen=config.steps * config.tokens_per_step, total_seconds=total,
            train_seconds=state["train_seconds"], eval_seconds=state["eval_seconds"],
            snapshot_seconds=state["snapshot_seconds"],
            snapshot_fraction=state["snapshot_seconds"] / total if total else float("nan"),
            initial_heldout_loss=float(history["heldout_loss"].iloc[0]),
            final_heldout_loss=float(history["heldout_loss"].iloc[-1]), device=str(self.device))


def _run_loop(training: _Training, progress: bool, stop_after: int | None,
              on_step: Callable[[int, float], None] | None) -> None:
    config = training.config
    training.model.train()
    if training.state["step"] == 0 and not training.state["history"]:
        training.evaluate(0)
        training.snapshot(0)
    bar = tqdm(total=config.steps, initial=training.state["step"], disable=not progress, leave=False,
               desc=f"training depth {config.depth} (width {config.hidden_size}, seed {config.seed})")
    with bar:
        while training.state["step"] < config.steps:
            loss = training.step()
            step = training.state["step"]
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            if on_step is not None:
                on_step(step, loss)
            training.after_step(step, stop_after)


def discard_run(final_dir: Path) -> None:
    """Delete a run's finished folder and its checkpoint, if any: it will train from scratch."""
    shutil.rmtree(final_dir, ignore_errors=True)
    shutil.rmtree(partial_path(final_dir), ignore_errors=True)


def run_lock(final_dir: Path, config: TrainConfig):
    """The lock a run is trained under (``zones.core.entries.entry_lock``: the file
    ``<run>.lock`` beside its folder, released by the OS if the trainer dies): a second trainer
    of the same run says so on stderr and waits for the first, then finds the run finished
    (or resumes its checkpoint, if the first failed)."""
    def waiting() -> None:
        print(f"zones: depth {config.depth}, seed {config.seed} ({final_dir.name}) is being trained by another "
              f"process; waiting for it to finish", file=sys.stderr, flush=True)

    return entry_lock(final_dir, on_wait=waiting)


def train_model(config: TrainConfig, *, device: str | None = None, refresh: bool = False,
                progress: bool = True, stop_after: int | None = None,
                on_step: Callable[[int, float], None] | None = None,
                keep_checkpoints: bool = False) -> TrainedRun:
    """Train one model (or load the finished run from the cache) and return the run.

    ``stop_after=N`` stops after step N as an interruption would, after writing a checkpoint,
    and raises ``TrainingInterrupted``; the next call resumes from it. ``on_step(step, loss)``
    is called after every optimizer step. ``refresh=True`` retrains from scratch, with the
    corpus's tokenizer and token ids computed again too (so it gets past a damaged copy).
    ``keep_checkpoints=True`` also keeps the model at every snapshot step as a loadable
    directory ``run.path/checkpoints/step-NNNNNN`` (config, safetensors, tokenizer and
    ``zones-checkpoint.json`` with its step), for ``zones.series.checkpoints``; a cached run that
    kept none is trained again (the results are the same, bit for bit). ``precision='bf16'``
    on a device without native bf16 is refused (``zones.core.hardware.check_precision``).
    The run trains on ``config.threads`` CPU threads; :func:`zones.series.pool.train_runs` trains
    several side by side.
    """
    if stop_after is not None:
        check_int(stop_after, "stop_after", min=1, max=config.steps)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_precision(config.precision, device, what=f"training precision {config.precision!r} (set precision='fp32')")
    key = run_key(config, load_corpus(config.corpus).fingerprint)
    refresh_caches = refresh  # asked for: the tokenizer and token caches are replaced too
    final_dir = cache_dir() / "train" / cache_key(key)
    partial_dir = partial_path(final_dir)
    with run_lock(final_dir, config):  # one trainer of a run at a time: a second waits, then loads it
        if keep_checkpoints and is_finished(final_dir) and not (final_dir / "checkpoints").is_dir():
            print(f"zones: the cached run {final_dir} kept no checkpoints; training it again to keep them")
            refresh = True
        if refresh:
            discard_run(final_dir)
        if is_finished(final_dir):
            return load_run(final_dir)
        with torch_threads(config.threads):  # part of the run: a CPU run's bits depend on it
            training = _Training(config, key, partial_dir, device, keep_checkpoints, refresh_caches)
            _run_loop(training, progress, stop_after, on_step)
        history = pd.DataFrame(training.state["history"], columns=HISTORY_COLUMNS)
        snapshots = pd.DataFrame(training.state["snapshots"], columns=SNAPSHOT_COLUMNS)
        kept = partial_dir / "checkpoints" if training.keep else None
        write_run(final_dir, key, config, training.model, training.tokenizer, history, snapshots,
                  training.summary(history), kept=kept)
        shutil.rmtree(partial_dir, ignore_errors=True)
        return load_run(final_dir)
