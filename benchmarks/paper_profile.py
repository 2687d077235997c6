"""The ``paper`` training profile's depth series (D8/D12/D16, one seed each) trained from scratch,
written as small tables only (no weights), for a GPU machine without a network.

    PYTHONPATH=. python benchmarks/paper_profile.py --out results/reference/paper-profile \\
        [--depths 8,12,16] [--device cuda] [--time-limit 450] [--override KEY=VALUE ...] [--tiny]

For each depth it trains the profile's run through the series' own training loop
(``zones.series.loop``: the same model, data, schedule, held-out curve and spectral snapshots as
``zones train --profile paper``; the finished run is cached in ``$ZONES_CACHE/train`` as any run),
then scores the final model's single-block ablation on the run's held-out windows
(``zones.measure.ablation.ablation_table``, as ``zones.series.series_importance`` does). Written to
``--out`` after every depth, so a stop leaves what is done:

* ``history.csv``: ``depth, seed, step, lr, train_loss, heldout_loss, tokens_seen, seconds``;
* ``snapshots.csv``: ``depth, seed, step, layer, role, stable_rank, alpha_shape, alpha_esd`` (every
  block matrix at every snapshot step: ``zones.series.spectral_snapshot``);
* ``ablation.csv``: ``depth, seed, layer, loss, base_loss, delta_loss, delta_loss_low,
  delta_loss_high, n_tokens`` (95% paired bootstrap interval over held-out windows);
* ``provenance.json``: git commit, device, versions, each run's full config, parameters, FLOPs,
  tokens trained, seconds (training, held-out evaluation, snapshots, ablation), whether it finished.

``--time-limit S`` stops gracefully: training stops after the step where S seconds have passed
(that depth's history and snapshots so far are written, marked ``complete: false``, and its
ablation is skipped), and no later depth starts. ``--tiny`` shrinks every run (width, steps,
snapshots) so the whole script runs end to end on a CPU in seconds; ``--override KEY=VALUE``
sets any ``TrainConfig`` field (values read as JSON where they parse: ``steps=40``,
``precision="fp32"`` or ``precision=fp32``). Nothing here imports altair, Jupyter or the network:
the tokenizer and corpus are built from the Python standard library's own source files.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import transformers

from zones.core.atomic import atomic_write_text
from zones.core.cache import cache_dir, cache_key
from zones.core.data import load_corpus
from zones.core.hardware import cpu_capability, native_bf16, torch_threads
from zones.measure.ablation import ablation_table
from zones.series.config import TrainConfig, flops_per_token, parameter_count, series_configs
from zones.series.io import HISTORY_COLUMNS, SNAPSHOT_COLUMNS, is_finished, load_run, partial_path, run_key, write_run
from zones.series.loop import _run_loop, _Training, discard_run
from zones.series.tokenizer import heldout_windows

PROFILE = "paper"
DEFAULT_OUT = "results/reference/paper-profile"
# --tiny: every run a few seconds on one CPU thread (widths 32/48/64 at depths 8/12/16).
TINY = dict(width_per_layer=4, head_dim=16, vocab_size=320, seq_len=32, batch_size=8, steps=12, eval_every=6,
            eval_windows=4, snapshot_every=6, early_snapshot_every=2, early_snapshot_until=4, checkpoint_every=1000,
            precision="fp32")
TINY_EVAL_TOKENS = 1024
RUN_COLUMNS = ["depth", "seed"]
ABLATION_COLUMNS = [*RUN_COLUMNS, "layer", "loss", "base_loss", "delta_loss", "delta_loss_low", "delta_loss_high",
                    "n_tokens"]


class OutOfTime(Exception):
    """The time limit passed after optimizer step ``step``."""

    def __init__(self, step: int):
        super().__init__(step)
        self.step = step


def parse_overrides(items: list[str]) -> dict:
    """``KEY=VALUE`` strings as a dict; a value is read as JSON where it parses, else kept a string."""
    overrides = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--override takes KEY=VALUE (a TrainConfig field), got {item!r}")
        try:
            overrides[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key.strip()] = value
    return overrides


def git_commit() -> str:
    """``$ZONES_GIT_COMMIT`` when set (a copy of the tree without ``.git``, as on a device machine: pass
    it along), else the repository's HEAD commit (``+dirty`` when tracked files changed), else
    ``"unknown"``."""
    if os.environ.get("ZONES_GIT_COMMIT"):
        return os.environ["ZONES_GIT_COMMIT"]
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=20, check=True).stdout.strip()
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()} CPU ({cpu_capability()}, {os.cpu_count()} cores)"


def train_run(config: TrainConfig, device: torch.device, deadline: float, log_every: int,
              refresh: bool) -> dict:
    """Train one run (or read the finished one from the cache) through the series' loop, stopping
    after the step at which ``deadline`` (time.monotonic) passes. Returns the run's history,
    snapshots, summary, whether it finished, and the ``TrainedRun`` when it did."""
    key = run_key(config, load_corpus(config.corpus).fingerprint)
    final_dir = cache_dir() / "train" / cache_key(key)
    if refresh:
        discard_run(final_dir)
    if is_finished(final_dir):
        run = load_run(final_dir)
        print(f"depth {config.depth}: the finished run is in the cache ({final_dir}); not training it again",
              flush=True)
        return dict(run=run, history=run.history, snapshots=run.snapshots, summary=run.summary,
                    complete=True, from_cache=True, steps_done=config.steps)
    started, label = time.perf_counter(), f"depth {config.depth} (width {config.hidden_size}, seed {config.seed})"

    def on_step(step: int, loss: float) -> None:
        if step % log_every == 0 or step == config.steps:
            elapsed = time.perf_counter() - started
            rate = step * config.tokens_per_step / elapsed
            left = (config.steps - step) * elapsed / step
            print(f"{label}: step {step}/{config.steps}, train loss {loss:.3f}, {elapsed:.0f} s, "
                  f"{rate:,.0f} tokens/s, ~{left:.0f} s left", flush=True)
        if time.monotonic() >= deadline and step < config.steps:
            raise OutOfTime(step)

    complete = True
    with torch_threads(config.threads):  # as train_model: part of the run
        training = _Training(config, key, partial_path(final_dir), device, keep_checkpoints=False)
        try:
            _run_loop(training, progress=False, stop_after=None, on_step=on_step)
        except OutOfTime as stop:
            complete = False
            training.after_step(stop.step, None)  # this step's evaluation and snapshot, on their schedules
            print(f"{label}: time limit reached after step {stop.step} of {config.steps}; stopping", flush=True)
    history = pd.DataFrame(training.state["history"], columns=HISTORY_COLUMNS)
    snapshots = pd.DataFrame(training.state["snapshots"], columns=SNAPSHOT_COLUMNS)
    summary = training.summary(history)
    run = None
    if complete:  # the finished run, cached exactly as zones.series.train_model caches it
        write_run(final_dir, key, config, training.model, training.tokenizer, history, snapshots, summary)
        shutil.rmtree(partial_path(final_dir), ignore_errors=True)
        run = load_run(final_dir)
    return dict(run=run, history=history, snapshots=snapshots, summary=summary, complete=complete,
                from_cache=False, steps_done=int(training.state["step"]))


def ablate(run, device: torch.device, eval_tokens: int | None, batch_size: int, dtype: str) -> pd.DataFrame:
    """The final model's single-block ablation on its own held-out windows (``series_importance``'s)."""
    loaded = run.load(device=str(device))
    table = ablation_table(loaded.model, heldout_windows(run, eval_tokens), batch_size=batch_size, dtype=dtype,
                           progress=False)
    del loaded
    return table


def write_tables(out: Path, parts: dict[str, list[pd.DataFrame]], provenance: dict) -> None:
    columns = dict(history=[*RUN_COLUMNS, *HISTORY_COLUMNS], snapshots=[*RUN_COLUMNS, *SNAPSHOT_COLUMNS],
                   ablation=ABLATION_COLUMNS)
    for name, frames in parts.items():
        table = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        atomic_write_text(out / f"{name}.csv", table.reindex(columns=columns[name]).to_csv(index=False))
    atomic_write_text(out / "provenance.json", json.dumps(provenance, indent=2, default=str) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=DEFAULT_OUT, help=f"folder of the tables (default {DEFAULT_OUT})")
    parser.add_argument("--depths", default=None, help="comma-separated depths (default: the profile's, 8,12,16)")
    parser.add_argument("--seed", type=int, default=None, help="the training seed of every depth (default: 0)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--time-limit", type=float, default=None,
                        help="seconds: stop gracefully after the step where they have passed, writing what is done")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a TrainConfig field for every run (repeatable), e.g. steps=200")
    parser.add_argument("--tiny", action="store_true", help="tiny runs (width 4·depth, 12 steps) for a CPU test")
    parser.add_argument("--eval-tokens", type=int, default=None,
                        help="held-out tokens the ablation scores (default: the whole held-out split; "
                             f"--tiny: {TINY_EVAL_TOKENS})")
    parser.add_argument("--batch-size", type=int, default=32, help="windows per ablation forward (default 32)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"],
                        help="the ablation's scoring precision (default float32)")
    parser.add_argument("--log-every", type=int, default=None, help="steps between progress lines (default steps/20)")
    parser.add_argument("--refresh", action="store_true", help="train again even when the run is cached")
    args = parser.parse_args(argv)

    transformers.utils.logging.disable_progress_bar()  # the weights' save/load bars: one line per step chunk is ours
    wall = time.perf_counter()
    deadline = time.monotonic() + args.time_limit if args.time_limit else float("inf")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    overrides = {**(TINY if args.tiny else {}), **parse_overrides(args.override)}
    if args.seed is not None:
        overrides["seed"] = args.seed
    notes = []
    base = series_configs(PROFILE, [8], **overrides)[0]
    if base.precision == "bf16" and not native_bf16(device):
        overrides["precision"] = "fp32"
        notes.append(f"bf16 is not native on {device}: trained in fp32")
        print(f"paper_profile: {notes[-1]} (--override precision=fp32 says so up front)", flush=True)
    depths = None if args.depths is None else [int(d) for d in args.depths.split(",") if d.strip()]
    configs = series_configs(PROFILE, depths, **overrides)
    eval_tokens = args.eval_tokens if args.eval_tokens is not None else (TINY_EVAL_TOKENS if args.tiny else None)
    eval_tokens = eval_tokens or None  # 0: the whole split
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    corpus = load_corpus(configs[0].corpus)
    provenance = dict(
        script="benchmarks/paper_profile.py", argv=sys.argv[1:] if argv is None else list(argv),
        git_commit=git_commit(), profile=PROFILE, tiny=bool(args.tiny), overrides=overrides, notes=notes,
        device=str(device), device_name=device_name(device), torch=torch.__version__,
        transformers=transformers.__version__, numpy=np.__version__, pandas=pd.__version__,
        python=platform.python_version(), platform=platform.platform(), zones_cache=str(cache_dir()),
        corpus=dict(name=configs[0].corpus, fingerprint=corpus.fingerprint, characters=len(corpus.text)),
        time_limit_s=args.time_limit, ablation=dict(eval_tokens=eval_tokens, batch_size=args.batch_size,
                                                    dtype=args.dtype, split="heldout"),
        runs=[], not_started=[], stopped_early=False, seconds_total=0.0, tokens_trained=0)
    parts: dict[str, list[pd.DataFrame]] = dict(history=[], snapshots=[], ablation=[])
    for config in configs:
        n_params, per_token = parameter_count(config), flops_per_token(config)
        tokens = config.steps * config.tokens_per_step
        print(f"paper_profile: depth {config.depth}, width {config.hidden_size}, {n_params:,} parameters, "
              f"{config.steps} steps of {config.tokens_per_step:,} tokens ({tokens:,}), "
              f"{6 * n_params * tokens:.3g} FLOPs (6·N·D), snapshots {config.snapshot_text()}, "
              f"{config.precision} on {device}", flush=True)
    for config in configs:
        if time.monotonic() >= deadline:
            provenance["stopped_early"] = True
            provenance["not_started"].append(config.depth)
            print(f"paper_profile: time limit reached; depth {config.depth} not started", flush=True)
            continue
        start = time.perf_counter()
        log_every = args.log_every or max(1, config.steps // 20)
        trained = train_run(config, device, deadline, log_every, args.refresh)
        train_wall = time.perf_counter() - start
        tags = dict(depth=config.depth, seed=config.seed)
        parts["history"].append(trained["history"].assign(**tags))
        parts["snapshots"].append(trained["snapshots"].assign(**tags))
        ablation_seconds, ablation_note = 0.0, None
        if not trained["complete"]:
            provenance["stopped_early"] = True
            ablation_note = "not scored: training stopped at the time limit"
        elif time.monotonic() >= deadline:
            provenance["stopped_early"] = True
            ablation_note = "not scored: the time limit passed before it started"
        else:
            t0 = time.perf_counter()
            table = ablate(trained["run"], device, eval_tokens, args.batch_size, args.dtype)
            ablation_seconds = time.perf_counter() - t0
            parts["ablation"].append(table.assign(**tags))
            print(f"depth {config.depth}: ablation of {len(table)} blocks on {int(table['n_tokens'].iloc[0]):,} "
                  f"held-out tokens in {ablation_seconds:.1f} s; largest ΔLoss "
                  f"{table['delta_loss'].max():.4f} (block {int(table.loc[table['delta_loss'].idxmax(), 'layer'])})",
                  flush=True)
        summary = trained["summary"]
        tokens_done = trained["steps_done"] * config.tokens_per_step
        seconds = dict(train=summary.get("train_seconds"), eval=summary.get("eval_seconds"),
                       snapshot=summary.get("snapshot_seconds"), training_total=summary.get("total_seconds"),
                       wall=train_wall + ablation_seconds, ablation=ablation_seconds)
        provenance["runs"].append(dict(
            depth=config.depth, seed=config.seed, config=config.as_dict(),
            run_key=cache_key(run_key(config, corpus.fingerprint)),
            parameters=parameter_count(config), flops_per_token=flops_per_token(config),
            flops_6nd=6.0 * parameter_count(config) * tokens_done, complete=trained["complete"],
            from_cache=trained["from_cache"], steps_done=trained["steps_done"], tokens_trained=tokens_done,
            n_snapshots=int(trained["snapshots"]["step"].nunique()),
            final_heldout_loss=float(trained["history"]["heldout_loss"].iloc[-1]),
            seconds=seconds, ablation=ablation_note or "scored"))
        provenance["tokens_trained"] += tokens_done
        provenance["seconds_total"] = time.perf_counter() - wall
        write_tables(out, parts, provenance)
        print(f"depth {config.depth}: {'finished' if trained['complete'] else 'stopped'} at step "
              f"{trained['steps_done']}/{config.steps}, held-out loss "
              f"{provenance['runs'][-1]['final_heldout_loss']:.4f}, {seconds['wall']:.1f} s", flush=True)
    provenance["seconds_total"] = time.perf_counter() - wall
    write_tables(out, parts, provenance)
    done = sum(r["complete"] for r in provenance["runs"])
    print(f"paper_profile: {done} of {len(configs)} depths finished, {provenance['tokens_trained']:,} tokens trained, "
          f"{provenance['seconds_total']:.1f} s in all on {provenance['device_name']}; tables in {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
