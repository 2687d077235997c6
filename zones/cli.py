"""The ``zones`` command line: the library's operations, writing the same tables.

    zones alpha  --model M --out DIR            per-matrix α table      -> DIR/alpha.csv
    zones ablate --model M --corpus C --eval-tokens N --seq-len S --out DIR
                                                ΔLoss per block         -> DIR/ablation.csv
    zones prune  --model M --strategies a,b --k-max 8 --out DIR
                                                ΔPPL per strategy and k -> DIR/pruning.csv
    zones export --model M --remove 3,11 --out DIR   pruned model as a plain Hugging Face directory
    zones heal   --model M --strategy S --k 4 --method lora|bridge --out DIR   the same, healed first
    zones train  --depths 8,12,16 --out DIR     train a depth series   -> DIR/series.csv, ...
    zones book   [--model M] [--only NAME ...]  execute chapters, build the HTML book
    zones lab    [JUPYTERLAB OPTIONS]           open the notebooks in JupyterLab

One vocabulary: --model, --tokenizer, --device, --corpus, --seq-len, --batch-size,
--eval-tokens, --calibration-tokens, --dtype and --out mean the same in every command; --out is
checked before any work.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from tqdm import tqdm

from zones import __version__
from zones.book import build_book, project_root
from zones.core.cache import write_table
from zones.core.data import CorpusError, corpus_windows, load_corpus
from zones.core.executors import check_executor
from zones.core.models import DEFAULT_MODEL, load_model
from zones.measure.ablation import DEFAULT_EVAL_TOKENS as ABLATION_EVAL_TOKENS
from zones.measure.ablation import ablation_table
from zones.measure.evaluate import DEFAULT_DTYPE, DTYPES
from zones.pruning import (
    DEFAULT_CALIBRATION_TOKENS,
    DEFAULT_SEEDS,
    DEFAULT_STRATEGIES,
    available_strategies,
    check_strategy_names,
    parse_removed,
    pruning_table,
)
from zones.pruning import DEFAULT_EVAL_TOKENS as PRUNING_EVAL_TOKENS
from zones.pruning.export import ExportError, choose_removed, export_model
from zones.pruning.heal import DEFAULT_LR, DEFAULT_RANK, DEFAULT_TOKENS, METHODS, export_healed, heal
from zones.series import run_label, series_configs, series_history, series_snapshots, series_summary, train_model
from zones.series.checkpoints import lifecycle_snapshots
from zones.spectra import alpha_table, check_estimators, check_window
from zones.spectra.sweep import alpha_sweep


def _model_args(parser: argparse.ArgumentParser, tokenizer: bool = False) -> None:
    """--model, --device, --trust-remote-code; --tokenizer for commands that read text."""
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"built-in alias, local directory, .gguf file or hub id (default: {DEFAULT_MODEL})")
    if tokenizer:
        parser.add_argument("--tokenizer", default=None, metavar="PATH",
                            help="tokenizer directory or hub id to use instead of the model's own")
    _device_arg(parser)
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow the model's own Python code to run (off by default)")


def _device_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")


def _out_arg(parser: argparse.ArgumentParser, default: str = "results") -> None:
    parser.add_argument("--out", default=default, help=f"output folder (default: {default})")


def _load(args):
    """The model of ``--model``; its tokenizer only when the command has ``--tokenizer``."""

    text = dict(tokenizer=args.tokenizer) if hasattr(args, "tokenizer") else dict(load_tokenizer=False)
    return load_model(args.model, device=args.device, trust_remote_code=args.trust_remote_code, **text)


def check_out(out: str) -> Path:
    """``--out`` before any work: a folder, or one that can be created there, and writable."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; pass a folder for the results")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out} cannot be created: {existing} is a file; pass a folder for the results")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out} is not writable ({existing} denies writing); pass a folder you can write")
    return path


def _text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", default="stdlib",
                        help="stdlib, stdlib-code, wikitext2 or UTF-8 text file(s)/glob (default: stdlib)")
    parser.add_argument("--seq-len", type=int, default=256, help="window length in tokens (default: 256)")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per forward (default: 8)")


def _dtype_arg(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPES,
                        help=f"scoring precision of the forward passes (default: {DEFAULT_DTYPE})")


def _budget_args(parser: argparse.ArgumentParser, calibration_help: str) -> None:
    """The token budgets, by split: --eval-tokens and --calibration-tokens."""
    parser.add_argument("--eval-tokens", type=int, default=None,
                        help="scored eval tokens; 0 = the whole split (default: the chapter's CPU budget)")
    parser.add_argument("--calibration-tokens", type=int, default=None, help=calibration_help)


def _budget(tokens: int | None, default: int) -> int | None:
    """A token budget flag: unset -> the chapter's default; 0 -> the whole split (None)."""
    return default if tokens is None else tokens or None


def _name_values(items: list[str], flag: str) -> dict:
    """``NAME=VALUE`` flags as a dict; values are YAML, so numbers and lists keep their types."""

    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} needs NAME=VALUE, not {item!r}")
        values[name] = yaml.safe_load(value)
    return values


def _write(df, out: str, name: str) -> None:

    path = write_table(df, Path(out) / name)
    print(f"wrote {path} ({len(df)} rows)")


def cmd_alpha(args) -> None:

    window, estimators = check_window(args.window), check_estimators(args.estimators)  # before loading
    table = alpha_table(_load(args).model, window=window, estimators=estimators, refresh=args.refresh,
                        progress=True)
    _write(table, args.out, "alpha.csv")
    noted = table[table["note"] != ""]
    if len(noted):
        print(f"{len(noted)} matrices have NaN estimates; see the note column")


def _split_budget(args) -> int | None:
    """ablate's budget: the chosen split's flag."""

    other = "calibration" if args.split == "eval" else "eval"
    if getattr(args, f"{other}_tokens") is not None:
        raise ValueError(f"--{other}-tokens sets the {other} split's budget, but --split is {args.split}; "
                         f"pass --{args.split}-tokens")
    tokens = getattr(args, f"{args.split}_tokens")
    return _budget(tokens, ABLATION_EVAL_TOKENS)


def cmd_ablate(args) -> None:

    tokens = _split_budget(args)
    corpus = load_corpus(args.corpus)  # an unknown or empty corpus fails before the model loads
    loaded = _load(args)
    windows = corpus_windows(corpus, loaded.tokenizer, args.seq_len, args.split, tokens)
    table = ablation_table(loaded.model, windows, parts=args.parts, method=args.method,
                           batch_size=args.batch_size, dtype=args.dtype)
    _write(table, args.out, "ablation.csv")


def cmd_prune(args) -> None:

    if args.list_strategies:
        print(available_strategies().to_string(index=False))
        return
    names = check_strategy_names(args.strategies or DEFAULT_STRATEGIES)  # fail before the model loads
    corpus = load_corpus(args.corpus)
    loaded = _load(args)
    eval_windows = corpus_windows(corpus, loaded.tokenizer, args.seq_len, "eval",
                                  _budget(args.eval_tokens, PRUNING_EVAL_TOKENS))
    calibration = corpus_windows(corpus, loaded.tokenizer, args.seq_len, "calibration",
                                 _budget(args.calibration_tokens, DEFAULT_CALIBRATION_TOKENS))
    table = pruning_table(loaded.model, eval_windows, calibration, strategies=names, k_max=args.k_max,
                          seeds=DEFAULT_SEEDS if args.seeds is None else args.seeds,
                          batch_size=args.batch_size, model_name=args.model, dtype=args.dtype)
    _write(table, args.out, "pruning.csv")


def cmd_train(args) -> None:


    overrides = dict(width=args.width, width_per_layer=args.width_per_layer, head_dim=args.head_dim,
                     vocab_size=args.vocab_size, seq_len=args.seq_len, batch_size=args.batch_size,
                     steps=args.steps, lr=args.lr, corpus=args.corpus, snapshot_every=args.snapshot_every)
    overrides.update(_name_values(args.set, "--set"))
    try:
        depths = [int(d) for d in args.depths.split(",") if d.strip()] if args.depths else None
    except ValueError:
        raise ValueError(f"--depths needs comma-separated integers such as 4,6,8, not {args.depths!r}") from None
    if args.seed is not None:
        overrides["seed"] = args.seed  # one training seed at every depth
    configs = series_configs(args.profile, depths, args.seeds, **overrides)  # bad sizes fail before any work
    runs = [train_model(c, device=args.device, refresh=args.refresh, keep_checkpoints=args.keep_checkpoints)
            for c in configs]
    summary = series_summary(runs)
    _write(summary, args.out, "series.csv")
    _write(series_history(runs), args.out, "history.csv")
    _write(series_snapshots(runs), args.out, "snapshots.csv")
    for run in runs:
        target = Path(args.out) / "models" / f"depth-{run.config.depth}-seed-{run.config.seed}"
        if args.copy_models:
            shutil.copytree(run.path, target, dirs_exist_ok=True)
        print(f"{run_label(run)}: held-out loss {run.summary['final_heldout_loss']:.3f}, "
              f"trained in {run.summary['total_seconds']:.0f} s; model: {target if args.copy_models else run.path}")


def cmd_book(args) -> None:

    params = _name_values(args.param, "--param")  # refused when no chapter declares one
    models = [args.model] if args.model else [m.strip() for m in args.models.split(",") if m.strip()] \
        if args.models else None
    index = build_book(params, only=args.only or None, execute=not args.no_execute, models=models)
    print(f"book: {index}")


def lab_command(lab_args: list[str]) -> list[str]:
    """The jupyter-lab command line: the notebooks folder and JupyterLab's own options
    (a ``--`` separator dropped; ``--allow-root`` added when running as root)."""

    options = [a for a in lab_args if a != "--"]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not any("allow-root" in a or "allow_root" in a
                                                                 for a in options):
        options.append("--allow-root")
    return [str(Path(sys.executable).with_name("jupyter-lab")), str(project_root() / "notebooks"), *options]


def cmd_lab(args) -> int:

    return subprocess.run(lab_command(args.lab_args), check=False).returncode


# --- engineer D: zones lifecycle and zones sweep --------------------------------------------------

def _executor_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", default="local", choices=["local", "ray"],
                        help="local: in this process (default); ray: one Ray task per job (pip install \"zones[ray]\")")
    parser.add_argument("--ray-address", default=None,
                        help="Ray cluster to join (default: $RAY_ADDRESS, else a local Ray instance)")
    parser.add_argument("--retries", type=int, default=2, help="retries of a failed job (default: 2)")
    parser.add_argument("--cpus-per-job", type=float, default=1, help="CPUs each job asks for (default: 1)")


def cmd_lifecycle(args) -> None:

    check_executor(args.executor)  # before any work
    if not args.memory_budget >= 0:
        raise ValueError(f"--memory-budget must be a number of MB >= 0 (0: no bound), not {args.memory_budget}")
    if args.model and args.revisions is None:
        raise ValueError("--model names the hub repository of --revisions; pass --revisions step0,step1000,...")
    table = lifecycle_snapshots(args.checkpoints, args.model, revisions=args.revisions, train_run=args.train_run,
                                executor=args.executor, ray_address=args.ray_address, retries=args.retries,
                                cpus_per_job=args.cpus_per_job, device=args.device, refresh=args.refresh,
                                memory_budget=int(args.memory_budget * 2**20) or None)
    _write(table, args.out, "snapshots.csv")


def cmd_sweep(args) -> None:

    check_executor(args.executor)
    table = alpha_sweep(args.models.split(","), args.executor, ray_address=args.ray_address, retries=args.retries,
                        cpus_per_job=args.cpus_per_job, device=args.device, trust_remote_code=args.trust_remote_code)
    _write(table, args.out, "alpha.csv")


def _add_lifecycle_and_sweep(sub) -> None:
    p = sub.add_parser("lifecycle", allow_abbrev=False, help="spectral snapshots of a series of checkpoints (weights only)",
                       description="One snapshot (stable rank, alpha_shape, alpha_esd of every block matrix) "
                                   "per checkpoint, from hub revisions, local checkpoint directories or the "
                                   "checkpoints of a zones train --keep-checkpoints run -> OUT/snapshots.csv")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--revisions", default=None, help="hub revisions of --model, e.g. step0,step1000,step2000")
    source.add_argument("--checkpoints", nargs="+", default=None, metavar="DIR_OR_GLOB",
                        help="local checkpoint directories or a quoted glob, e.g. 'runs/*/checkpoint-*'")
    source.add_argument("--train-run", default=None, metavar="DIR",
                        help="a zones train run directory or zones train --out folder (with --keep-checkpoints)")
    p.add_argument("--model", default=None, help="hub id whose --revisions to read, e.g. EleutherAI/pythia-160m")
    _executor_args(p)
    p.add_argument("--memory-budget", type=float, default=256,
                   help="MB of float64 matrices decomposed at once (default: 256; 0: no bound); the "
                        "weights stream from disk one matrix at a time")
    _device_arg(p)
    p.add_argument("--refresh", action="store_true", help="recompute instead of reading the cache")
    _out_arg(p, "results/lifecycle")
    p.set_defaults(func=cmd_lifecycle)

    p = sub.add_parser("sweep", allow_abbrev=False, help="zones alpha over a list of models, one job per model",
                       description="The alpha table of every model -> OUT/alpha.csv with a model column")
    p.add_argument("--models", required=True, help="comma-separated models (aliases, directories or hub ids)")
    _executor_args(p)
    _device_arg(p)
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the models' own Python code to run (off by default)")
    _out_arg(p)
    p.set_defaults(func=cmd_sweep)

# --- end of engineer D's block ------------------------------------------------------------------------


# --- H6: export and heal (cmd_export, cmd_heal and their parsers) -----------------------------------

def _pruned_blocks(args, loaded, calibration):
    """--remove 3,11 or --strategy NAME --k K: the blocks to remove, and the strategy's name."""

    if args.remove is not None:
        if args.strategy is not None or args.k is not None:
            raise ExportError("pass either --remove or --strategy with --k, not both")
        return parse_removed(args.remove), None
    if args.strategy is None or args.k is None:
        raise ExportError("pass --remove 3,11,20 or --strategy NAME --k K")
    return choose_removed(loaded.model, args.strategy, args.k, calibration=calibration, seed=args.seed,
                          batch_size=args.batch_size), args.strategy


def _calibration(args, loaded, tokens: int | None = None):
    """Calibration windows: the strategies plan on --calibration-tokens (default: the pruning
    chapter's, so a strategy picks the blocks the book reports); ``tokens`` (healing) takes that
    many, or the whole split when it is smaller."""

    if tokens is None:
        return corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "calibration",
                              _budget(args.calibration_tokens, DEFAULT_CALIBRATION_TOKENS))
    try:
        return corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "calibration", tokens)
    except CorpusError:  # a budget beyond the split: LoRA cycles through the whole split
        return corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "calibration", None)


def cmd_export(args) -> None:

    loaded = _load(args)
    calibration = _calibration(args, loaded) if args.strategy else None
    removed, strategy = _pruned_blocks(args, loaded, calibration)
    out = export_model(loaded.model, removed, args.out, tokenizer=loaded.tokenizer, source=args.model,
                       strategy=strategy, seed=args.seed if strategy else None, fingerprint=loaded.fingerprint)
    print(f"wrote {out} (blocks {sorted(removed)} removed; loads with AutoModelForCausalLM.from_pretrained)")


def cmd_heal(args) -> None:

    loaded = _load(args)
    removed, strategy = _pruned_blocks(args, loaded, _calibration(args, loaded) if args.strategy else None)
    calibration = _calibration(args, loaded, args.heal_tokens)
    healed = heal(loaded.model, removed, calibration, method=args.method, tokens=args.heal_tokens, seed=args.seed,
                  lr=args.lr, rank=args.rank, batch_size=args.batch_size, refresh=args.refresh,
                  fingerprint=loaded.fingerprint)
    out = export_healed(healed, args.out, tokenizer=loaded.tokenizer, source=args.model, strategy=strategy)
    first, last = healed.history["loss"].iloc[0], healed.history["loss"].iloc[-1]
    print(f"calibration loss {first:.4f} -> {last:.4f} nats ({args.method}); wrote {out}")


def _add_export_and_heal(sub) -> None:

    for name in ("export", "heal"):
        if name == "export":
            p = sub.add_parser("export", allow_abbrev=False, help="write a pruned model as a plain Hugging Face directory",
                               description="Remove blocks (--remove, or a strategy's k blocks) and write "
                                           "config, safetensors, tokenizer and zones-provenance.json to --out")
        else:
            p = sub.add_parser("heal", allow_abbrev=False, help="heal a pruned model (LoRA or a linear bridge) and export it",
                               description="Remove blocks, heal on calibration tokens (disjoint from the "
                                           "eval split) and write the healed model like zones export")
        _model_args(p, tokenizer=True)
        _text_args(p)
        p.add_argument("--remove", default=None, help="blocks to remove, comma-separated (e.g. 3,11,20,27)")
        p.add_argument("--strategy", default=None, help="or: a pruning strategy (zones prune --list-strategies)")
        p.add_argument("--k", type=int, default=None, help="blocks the strategy removes")
        p.add_argument("--seed", type=int, default=0, help="seed of a seeded strategy and of the healing")
        p.add_argument("--calibration-tokens", type=int, default=None,
                       help="calibration tokens a strategy plans on; 0 = the whole split (default: the "
                            "pruning chapter's); healing reads --heal-tokens calibration tokens")
        if name == "heal":
            p.add_argument("--method", default="lora", choices=METHODS,
                           help="lora: LoRA fine-tuning merged on save (peft); bridge: a least-squares "
                                "linear map over each removed span, folded into the preceding block")
            p.add_argument("--heal-tokens", type=int, default=DEFAULT_TOKENS,
                           help=f"healing budget in calibration tokens (default: {DEFAULT_TOKENS})")
            p.add_argument("--lr", type=float, default=DEFAULT_LR, help=f"LoRA learning rate (default: {DEFAULT_LR})")
            p.add_argument("--rank", type=int, default=DEFAULT_RANK, help=f"LoRA rank (default: {DEFAULT_RANK})")
            p.add_argument("--refresh", action="store_true", help="heal again instead of reading the cache")
        p.add_argument("--out", required=True, help="output model directory (written atomically)")
        p.set_defaults(func=cmd_export if name == "export" else cmd_heal)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zones", description=__doc__, allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"zones {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("alpha", allow_abbrev=False, help="fit α for every weight matrix of every block")
    _model_args(p)
    p.add_argument("--estimators", nargs="+", default=["shape", "esd", "hill", "companions"],
                   choices=["shape", "esd", "hill", "companions"], metavar="NAME",
                   help="which to compute: shape, esd, hill, companions (default: all; the other "
                        "columns are left empty)")
    p.add_argument("--window", nargs=2, type=float, default=[0.0, 0.5], metavar=("LO", "HI"),
                   help="rank window of the spectral-shape fit, as fractions of n (default: 0 0.5)")
    p.add_argument("--refresh", action="store_true", help="recompute instead of reading the cache")
    _out_arg(p)
    p.set_defaults(func=cmd_alpha)

    p = sub.add_parser("ablate", allow_abbrev=False, help="ΔLoss of removing each decoder block in turn")
    _model_args(p, tokenizer=True)
    _text_args(p)
    _budget_args(p, "scored calibration tokens with --split calibration; 0 = the whole split")
    _dtype_arg(p)
    p.add_argument("--split", default="eval", choices=["eval", "calibration"], help="windows to score")
    p.add_argument("--method", default="prefix", choices=["prefix", "naive"],
                   help="prefix: reuse the shared prefix (default); naive: one full forward per block")
    p.add_argument("--parts", action="store_true", help="also remove only attention / only MLP")
    _out_arg(p)
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("prune", allow_abbrev=False, help="ΔPPL of removing k = 1..K blocks, chosen by each pruning strategy")
    _model_args(p, tokenizer=True)
    _text_args(p)
    p.add_argument("--strategies", default=None,
                   help="comma-separated strategy names (default: zone_aware, last_n, random and the "
                        "field's baselines; see --list-strategies)")
    p.add_argument("--k-max", type=int, default=8, help="remove k = 1..K blocks (default: 8)")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds of each seeded strategy (default: zones.pruning.DEFAULT_SEEDS)")
    _budget_args(p, "calibration tokens for the baselines; 0 = the whole split (default: the chapter's)")
    _dtype_arg(p)
    p.add_argument("--list-strategies", action="store_true", help="list the registered strategies and exit")
    _out_arg(p)
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("train", allow_abbrev=False, help="train a depth series of GPT-NeoX models with spectral snapshots")
    p.add_argument("--depths", default=None, help="comma-separated depths, e.g. 8,12,16 (default: the profile's)")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument("--seeds", type=int, default=None,
                       help="training seeds of every depth, a count: seeds 0..N-1 (default: the profile's; "
                            "cpu: 2 for D8 and D12, 1 for D16)")
    seeds.add_argument("--seed", type=int, default=None, help="train this one seed at every depth")
    p.add_argument("--profile", default="cpu", choices=["cpu", "paper"],
                   help="cpu: D8/D12/D16 at width 8·depth, two seeds, minutes on two cores (default); "
                        "paper: D8/D12/D16 at width 64·depth, bf16, for a GPU")
    p.add_argument("--width", type=int, default=None, help="hidden size for every depth (default: per layer × depth)")
    p.add_argument("--width-per-layer", type=int, default=None, help="hidden size per block of depth")
    p.add_argument("--head-dim", type=int, default=None, help="attention head size")
    p.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size")
    p.add_argument("--seq-len", type=int, default=None, help="training window length in tokens")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate")
    p.add_argument("--corpus", default=None, help="training corpus (default: stdlib-code)")
    p.add_argument("--snapshot-every", type=int, default=None, help="steps between spectral snapshots (default: 25)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any other training parameter of zones.series.TrainConfig")
    _device_arg(p)
    p.add_argument("--refresh", action="store_true", help="retrain even if the run is cached")
    p.add_argument("--copy-models", action="store_true", help="copy the trained models to OUT/models/depth-N-seed-S")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep the model of every snapshot step (RUN/checkpoints/step-N) for zones lifecycle")
    _out_arg(p, "results/train")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("book", allow_abbrev=False, help="execute the chapter notebooks and build the book")
    chosen = p.add_mutually_exclusive_group()
    chosen.add_argument("--models", default=None,
                        help="comma-separated models for every chapter (default: each notebook's own)")
    chosen.add_argument("--model", default=None, help="one model for every chapter")
    p.add_argument("--only", nargs="*", default=[], help="execute only these chapters")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="notebook parameter (YAML value), passed to the chapters that declare it")
    p.add_argument("--no-execute", action="store_true", help="rebuild HTML from executed chapters")
    p.set_defaults(func=cmd_book)

    p = sub.add_parser("lab", allow_abbrev=False, help="open the notebooks in JupyterLab",
                       description="Open notebooks/ in JupyterLab. Every other option (--no-browser, "
                                   "--port 8899, ...; also after --) goes to jupyter-lab; --allow-root is "
                                   "added when running as root.")
    p.set_defaults(func=cmd_lab)

    # --- engineer D: lifecycle and sweep (cmd_lifecycle, cmd_sweep and their parsers) go here ---
    _add_lifecycle_and_sweep(sub)
    _add_export_and_heal(sub)  # H6: zones export, zones heal

    # zones evaluate: task accuracy through lm-evaluation-harness (its own module)
    from zones import evaluate as evaluate_command
    p = sub.add_parser("evaluate", help="zero-shot task accuracy through lm-evaluation-harness",
                       description=evaluate_command.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    evaluate_command.add_arguments(p)
    p.set_defaults(func=evaluate_command.run)

    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse; only ``zones lab`` accepts options it does not know (they are JupyterLab's)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "lab":
        args.lab_args = extra
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _close_progress_bars() -> None:
    """Close the progress bars an error left open (they would share the error's line)."""

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if getattr(args, "out", None) is not None:
            check_out(args.out)  # a bad --out fails before any work
        code = args.func(args)
    except KeyboardInterrupt:
        print("interrupted; finished work is cached and a rerun resumes", file=sys.stderr)
        return 130
    except Exception as err:  # one clear line for the user; the traceback with ZONES_DEBUG=1
        if os.environ.get("ZONES_DEBUG"):
            raise
        _close_progress_bars()  # so the error starts a line of its own
        message = " ".join(str(err).split()) or type(err).__name__
        print(f"zones {args.command}: error: {message}", file=sys.stderr)
        return 1
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
