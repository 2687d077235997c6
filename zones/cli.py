"""The ``zones`` command line: the library's operations, writing the same tables.

    zones alpha     --model M --out DIR               per-matrix α table             -> DIR/alpha.csv
    zones ablate    --model M --corpus C --eval-tokens N --seq-len S --out DIR
                                                      ΔLoss per block                -> DIR/ablation.csv
    zones prune     --model M --strategies a,b --k-max 8 --out DIR
                                                      ΔPPL per strategy and k        -> DIR/pruning.csv
    zones export    --model M --remove 3,11 --out DIR   a pruned model as a plain Hugging Face directory
    zones heal      --model M --strategy S --k 4 --method lora|bridge --out DIR   the same, healed first
    zones train     --depths 8,12,16 --seeds 2 --out DIR   a depth series     -> DIR/series.csv, ...
    zones lifecycle --revisions step0,... --model M | --checkpoints GLOB | --train-run DIR --out DIR
                                                      spectral snapshots of checkpoints -> DIR/snapshots.csv
    zones sweep     --models a,b [--executor ray] --out DIR   α of several models -> DIR/alpha.csv
    zones book      [--models a,b | --model M] [--budget class|cpu|gpu] [--only NAME ...] [--param NAME=VALUE]
                                                      execute the chapters, build the HTML book
    zones evaluate  --model M [--remove 3,11 | --strategy S --k K] --tasks T --limit N --out DIR
                                                      zero-shot task accuracy (lm-evaluation-harness)
    zones study     --models a,b [--executor ray] [--budget class|cpu|gpu] [--param NAME=VALUE]
                                                      every chapter's tables for every model, as jobs
    zones lab       [--budget class|cpu|gpu] [JUPYTERLAB OPTIONS]   the chapters in JupyterLab

One vocabulary: every flag is a term of ``zones.core.glossary`` (its name, type, meaning and
default), so --model, --eval-tokens, --seeds (a count), --refresh, ... mean the same in every
command; ``tests/test_glossary.py`` holds every flag to it. --out is checked before any work.

A subcommand is a :class:`Command`: its flags (``add_arguments(parser)``) and its work
(``run(args)``). One that lives in a module of its own (with ``add_arguments``, ``run`` and a
docstring whose first line is its help) is registered with one line in ``COMMANDS``:
``"study": Command.of(zones.studies)``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from tqdm import tqdm

import zones.api as api
import zones.evaluation as evaluation
import zones.studies as studies
from zones.core.version import __version__
from zones.book import build_book, lab_folder, name_values, project_root
from zones.core.refresh import refreshing
from zones.core.tables import write_table
from zones.core.executors import check_executor
from zones.core.glossary import add_flag, default, term
from zones.pruning import available_strategies
from zones.series import run_label, series_configs, series_history, series_snapshots, series_summary, train_runs
from zones.series.checkpoints import lifecycle_snapshots
from zones.spectra.alpha_sweep import alpha_sweep


@dataclass(frozen=True)
class Command:
    """A subcommand: its help line, its flags and its work (``run(args)`` returns an exit code or None)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    description: str | None = None

    @classmethod
    def of(cls, module) -> "Command":
        """A subcommand in a module of its own: ``add_arguments``, ``run``, and its docstring."""
        doc = (module.__doc__ or "").strip()
        return cls(doc.splitlines()[0] if doc else module.__name__, module.add_arguments, module.run, doc or None)


# --- flags that several commands share ----------------------------------------------------------

def _model_flags(p: argparse.ArgumentParser, context: str, tokenizer: bool = False) -> None:
    """--model, --device, --trust-remote-code; --tokenizer for commands that read text."""
    add_flag(p, "model", context)
    if tokenizer:
        add_flag(p, "tokenizer", context, metavar="PATH")
    add_flag(p, "device", context)
    add_flag(p, "trust_remote_code", context)


def _text_flags(p: argparse.ArgumentParser, context: str) -> None:
    """The windows of text: --corpus, --seq-len, --batch-size."""
    for name in ("corpus", "seq_len", "batch_size"):
        add_flag(p, name, context)


def _executor_flags(p: argparse.ArgumentParser, context: str) -> None:
    for name in ("executor", "ray_address", "retries", "cpus_per_job"):
        add_flag(p, name, context)


def _model_options(args) -> dict:
    """The model flags every command passes to the API (``--tokenizer`` where it has one)."""
    options = dict(device=args.device, trust_remote_code=args.trust_remote_code)
    if hasattr(args, "tokenizer"):
        options["tokenizer"] = args.tokenizer
    return options


def check_out(out_dir: str) -> Path:
    """``--out`` before any work: a folder, or one that can be created there, and writable."""
    path = Path(out_dir).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out_dir} is a file, not a folder; pass a folder for the results")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise ValueError(f"--out {out_dir} cannot be created: {existing} is a file; pass a folder for the results")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out_dir} is not writable ({existing} denies writing); pass a folder you can write")
    return path


def _write(df, out: str, name: str) -> None:
    path = write_table(df, Path(out) / name)
    print(f"wrote {path} ({len(df)} rows)")


# --- zones alpha ------------------------------------------------------------------------------

def alpha_arguments(p: argparse.ArgumentParser) -> None:
    _model_flags(p, "alpha")
    add_flag(p, "estimators", "alpha", nargs="+", type=str, metavar="NAME", choices=term("estimators").choices,
             help="which to compute, space-separated: shape, esd, hill, companions (the other columns stay empty)")
    add_flag(p, "window", "alpha", nargs=2, type=float, metavar=("LO", "HI"))
    add_flag(p, "refresh", "alpha")
    add_flag(p, "out_dir", "alpha")


def alpha_run(args) -> None:
    table = api.alpha_table.__wrapped__(args.model, window=args.window, estimators=args.estimators,
                                        refresh=args.refresh, device=args.device,
                                        trust_remote_code=args.trust_remote_code, progress=True)
    _write(table, args.out_dir, "alpha.csv")
    noted = table[table["note"] != ""]
    if len(noted):
        print(f"{len(noted)} matrices have NaN estimates; see the note column")


# --- zones ablate -----------------------------------------------------------------------------

def ablate_arguments(p: argparse.ArgumentParser) -> None:
    _model_flags(p, "ablate", tokenizer=True)
    _text_flags(p, "ablate")
    add_flag(p, "eval_tokens", "ablate")
    add_flag(p, "calibration_tokens", "ablate", help="scored calibration tokens with --split calibration; "
                                                      "None (or 0): the whole split")
    add_flag(p, "dtype", "ablate")
    add_flag(p, "split", "ablate")
    add_flag(p, "ablation_method", "ablate")
    add_flag(p, "parts", "ablate")
    add_flag(p, "refresh", "ablate")
    add_flag(p, "out_dir", "ablate")


def _split_budget(args) -> int | None:
    """ablate's budget: the chosen split's flag; the other split's flag is refused if changed."""
    other = "calibration" if args.split == "eval" else "eval"
    if getattr(args, f"{other}_tokens") != default(f"{other}_tokens", context="ablate"):
        raise ValueError(f"--{other}-tokens sets the {other} split's budget, but --split is {args.split}; "
                         f"pass --{args.split}-tokens")
    return getattr(args, f"{args.split}_tokens")


def ablate_run(args) -> None:
    _split_budget(args)   # a flag of the other split is refused (the API takes both budgets as they are)
    table = api.ablate.__wrapped__(args.model, corpus=args.corpus, seq_len=args.seq_len, batch_size=args.batch_size,
                                   eval_tokens=args.eval_tokens, calibration_tokens=args.calibration_tokens,
                                   dtype=args.dtype, split=args.split, ablation_method=args.ablation_method,
                                   parts=args.parts, refresh=args.refresh, **_model_options(args))
    _write(table, args.out_dir, "ablation.csv")


# --- zones prune ------------------------------------------------------------------------------

def prune_arguments(p: argparse.ArgumentParser) -> None:
    _model_flags(p, "prune", tokenizer=True)
    _text_flags(p, "prune")
    add_flag(p, "strategies", "prune", help="comma-separated strategy names (see --list-strategies)")
    add_flag(p, "k_max", "prune")
    add_flag(p, "seeds", "prune")
    add_flag(p, "eval_tokens", "prune")
    add_flag(p, "calibration_tokens", "prune")
    add_flag(p, "dtype", "prune")
    add_flag(p, "list_strategies", "prune")
    add_flag(p, "refresh", "prune")
    add_flag(p, "out_dir", "prune")


def prune_run(args) -> None:
    if args.list_strategies:
        print(available_strategies().to_string(index=False))
        return
    table = api.prune.__wrapped__(args.model, strategies=args.strategies, k_max=args.k_max, seeds=args.seeds,
                                  corpus=args.corpus, seq_len=args.seq_len, batch_size=args.batch_size,
                                  eval_tokens=args.eval_tokens, calibration_tokens=args.calibration_tokens,
                                  dtype=args.dtype, refresh=args.refresh, **_model_options(args))
    _write(table, args.out_dir, "pruning.csv")


# --- zones export and zones heal ----------------------------------------------------------------

def _pruning_flags(p: argparse.ArgumentParser, context: str) -> None:
    _model_flags(p, context, tokenizer=True)
    _text_flags(p, context)
    add_flag(p, "remove", context, help="blocks to remove, comma-separated (e.g. 3,11,20,27)")
    add_flag(p, "strategy", context, help="or: a pruning strategy (zones prune --list-strategies) ...")
    add_flag(p, "k", context, help="... and the number of blocks it removes")
    add_flag(p, "seed", context, help="seed of a seeded strategy (and of the healing)")
    add_flag(p, "calibration_tokens", context, help="calibration tokens a strategy plans on; None (or 0): the "
                                                     "whole split")


def export_arguments(p: argparse.ArgumentParser) -> None:
    _pruning_flags(p, "export")
    add_flag(p, "refresh", "export", help="recompute what a strategy plans on instead of reading the cache")
    add_flag(p, "out_dir", "export", required=True, help="output model directory (written atomically)")


def _pruning_request(args) -> dict:
    """What zones export and zones heal pass on: the blocks (``--remove``, or ``--strategy`` and
    ``--k``) and what a strategy plans on."""
    return dict(remove=args.remove, strategy=args.strategy, k=args.k, seed=args.seed, corpus=args.corpus,
                seq_len=args.seq_len, batch_size=args.batch_size, calibration_tokens=args.calibration_tokens,
                refresh=args.refresh, **_model_options(args))


def export_run(args) -> None:
    row = api.export.__wrapped__(args.model, args.out_dir, **_pruning_request(args)).iloc[0]
    print(f"wrote {row['out_dir']} (blocks {row['removed'].replace(',', ', ')} removed; loads with "
          f"AutoModelForCausalLM.from_pretrained)")


def heal_arguments(p: argparse.ArgumentParser) -> None:
    _pruning_flags(p, "heal")
    add_flag(p, "method", "heal", help="lora: LoRA fine-tuning merged on save (peft); bridge: a least-squares "
                                       "linear map folded into an MLP's last projection (--bridges)")
    add_flag(p, "bridges", "heal", help="one: one bridge at the last kept block, pulling the last hidden state towards "
                                        "the full model's (the same capacity for every removal set); per_span: one "
                                        "per removed span, at the block before it (unequal capacity)")
    add_flag(p, "heal_tokens", "heal")
    add_flag(p, "heal_batch_size", "heal")
    add_flag(p, "lr", "heal", help="LoRA learning rate")
    add_flag(p, "rank", "heal")
    add_flag(p, "refresh", "heal", help="heal again instead of reading the cache")
    add_flag(p, "out_dir", "heal", required=True, help="output model directory (written atomically)")


def heal_run(args) -> None:
    row = api.heal.__wrapped__(args.model, args.out_dir, method=args.method, bridges=args.bridges,
                               heal_tokens=args.heal_tokens, lr=args.lr, rank=args.rank,
                               heal_batch_size=args.heal_batch_size, **_pruning_request(args)).iloc[0]
    print(f"calibration loss {row['healing_calibration_loss_before']:.4f} -> "
          f"{row['healing_calibration_loss_after']:.4f} nats ({args.method}); wrote {row['out_dir']}")


# --- zones train ------------------------------------------------------------------------------

TRAIN_SIZES = ("width", "width_per_layer", "head_dim", "vocab_size", "seq_len", "batch_size", "steps", "lr",
               "corpus", "snapshot_every")  # flags that override one field of the profile's TrainConfig


def train_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "depths", "train", help="comma-separated depths, e.g. 8,12,16 (default: the profile's)")
    seeds = p.add_mutually_exclusive_group()
    add_flag(seeds, "seeds", "train", help="training seeds of every depth, a count: seeds 0..N-1 (default: the "
                                           "profile's; cpu: 3 at every depth)")
    add_flag(seeds, "seed", "train", help="train this one seed at every depth")
    add_flag(p, "profile", "train", help="cpu: D8/D12/D16 at width 8·depth, minutes on two cores; paper: "
                                         "D8/D12/D16 at width 64·depth, bf16, for a GPU; class: a tiny series")
    for name in TRAIN_SIZES:
        add_flag(p, name, "train")
    p.add_argument("--set", action="append", default=default("set", context="train"), metavar="NAME=VALUE",
                   help=term("set").meaning)
    add_flag(p, "device", "train")
    add_flag(p, "refresh", "train", help="retrain even if the run is cached")
    add_flag(p, "copy_models", "train")
    add_flag(p, "keep_checkpoints", "train")
    add_flag(p, "out_dir", "train")


def train_run(args) -> None:
    overrides = {name: getattr(args, name) for name in TRAIN_SIZES}
    overrides.update({k: yaml.safe_load(v) for k, v in name_values(args.set, "--set").items()})
    if args.seed is not None:
        overrides["seed"] = args.seed  # one training seed at every depth
    configs = series_configs(args.profile, args.depths, args.seeds, **overrides)  # bad sizes fail before any work
    runs = train_runs(configs, device=args.device, refresh=args.refresh, keep_checkpoints=args.keep_checkpoints)
    _write(series_summary(runs), args.out_dir, "series.csv")
    _write(series_history(runs), args.out_dir, "history.csv")
    _write(series_snapshots(runs), args.out_dir, "snapshots.csv")
    for run in runs:
        target = Path(args.out_dir) / "models" / f"depth-{run.config.depth}-seed-{run.config.seed}"
        if args.copy_models:
            shutil.copytree(run.path, target, dirs_exist_ok=True)
        print(f"{run_label(run)}: held-out loss {run.summary['final_heldout_loss']:.3f}, "
              f"trained in {run.summary['total_seconds']:.0f} s; model: {target if args.copy_models else run.path}")


# --- zones lifecycle and zones sweep --------------------------------------------------------------

def lifecycle_arguments(p: argparse.ArgumentParser) -> None:
    source = p.add_mutually_exclusive_group(required=True)
    add_flag(source, "revisions", "lifecycle")
    add_flag(source, "checkpoints", "lifecycle", nargs="+", type=str, metavar="DIR_OR_GLOB",
             help="local checkpoint directories or a quoted glob, e.g. 'runs/*/checkpoint-*'")
    add_flag(source, "train_run", "lifecycle", metavar="DIR")
    add_flag(p, "model", "lifecycle", help="the hub id whose --revisions to read, e.g. EleutherAI/pythia-160m")
    _executor_flags(p, "lifecycle")
    add_flag(p, "memory_budget", "lifecycle", help="MB of float64 matrices decomposed at once (0: no bound); "
                                                   "the weights stream from disk one matrix at a time")
    add_flag(p, "device", "lifecycle")
    add_flag(p, "refresh", "lifecycle")
    add_flag(p, "out_dir", "lifecycle")


def lifecycle_run(args) -> None:
    check_executor(args.executor)  # before any work
    if args.model and args.revisions is None:
        raise ValueError("--model names the hub repository of --revisions; pass --revisions step0,step1000,...")
    table = lifecycle_snapshots(args.checkpoints, args.model, revisions=args.revisions, train_run=args.train_run,
                                executor=args.executor, ray_address=args.ray_address, retries=args.retries,
                                cpus_per_job=args.cpus_per_job, device=args.device, refresh=args.refresh,
                                memory_budget=args.memory_budget or None)
    _write(table, args.out_dir, "snapshots.csv")


def sweep_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "models", "sweep", required=True, help="comma-separated models (aliases, directories or hub ids)")
    _executor_flags(p, "sweep")
    add_flag(p, "device", "sweep")
    add_flag(p, "trust_remote_code", "sweep")
    add_flag(p, "refresh", "sweep")
    add_flag(p, "out_dir", "sweep")


def sweep_run(args) -> None:
    check_executor(args.executor)
    table = alpha_sweep(args.models, args.executor, ray_address=args.ray_address, retries=args.retries,
                        cpus_per_job=args.cpus_per_job, device=args.device, trust_remote_code=args.trust_remote_code,
                        refresh=args.refresh)
    _write(table, args.out_dir, "alpha.csv")


# --- zones book and zones lab ---------------------------------------------------------------------

def book_arguments(p: argparse.ArgumentParser) -> None:
    chosen = p.add_mutually_exclusive_group()
    add_flag(chosen, "models", "book", help="comma-separated models for every chapter (default: each notebook's own)")
    add_flag(chosen, "model", "book", help="one model for every chapter")
    add_flag(p, "budget", "book")
    add_flag(p, "only", "book", nargs="*", type=str, metavar="CHAPTER")
    p.add_argument("--param", action="append", default=default("param", context="book"), metavar="NAME=VALUE",
                   help=term("param").meaning + "; --param wins over --budget")
    add_flag(p, "no_execute", "book")
    add_flag(p, "refresh", "book", help="recompute every cached result the chapters read, and replace it")


def book_run(args) -> None:
    models = [args.model] if args.model else args.models
    texts = name_values(args.param, "--param")  # YAML texts, checked against the glossary before any chapter runs
    with refreshing(args.refresh):  # the chapters' kernels inherit it
        index = build_book(texts, only=args.only or None, execute=not args.no_execute, models=models,
                           budget=args.budget, from_text=True)
    print(f"book: {index}")


def lab_arguments(p: argparse.ArgumentParser) -> None:
    add_flag(p, "budget", "lab", help="cpu: the notebooks as they are; class or gpu: copies with that budget's "
                                      "values in book/lab/BUDGET (your edits there are kept)")


def lab_command(lab_args: list[str], folder: Path | None = None) -> list[str]:
    """The jupyter-lab command line: the notebooks folder (or ``folder``) and JupyterLab's own
    options (a ``--`` separator dropped; ``--allow-root`` added when running as root)."""
    options = [a for a in lab_args if a != "--"]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and not any("allow-root" in a or "allow_root" in a
                                                                 for a in options):
        options.append("--allow-root")
    notebooks = folder or project_root() / "notebooks"
    return [str(Path(sys.executable).with_name("jupyter-lab")), str(notebooks), *options]


def lab_run(args) -> int:
    folder = None if args.budget == default("budget") else lab_folder(project_root(), args.budget)
    return subprocess.run(lab_command(args.lab_args, folder), check=False).returncode


LAB_DESCRIPTION = ("Open the chapters in JupyterLab: notebooks/ as they are, or with --budget class|gpu copies "
                   "whose parameters are that budget's. Every other option (--no-browser, --port 8899, ...; also "
                   "after --) goes to jupyter-lab; --allow-root is added when running as root.")

# Every subcommand, in the order of the help. A subcommand in its own module: "name": Command.of(module).
COMMANDS: dict[str, Command] = {
    "alpha": Command("fit α for every weight matrix of every block", alpha_arguments, alpha_run),
    "ablate": Command("ΔLoss of removing each decoder block in turn", ablate_arguments, ablate_run),
    "prune": Command("ΔPPL of removing k = 1..K blocks, chosen by each pruning strategy", prune_arguments,
                     prune_run),
    "export": Command("write a pruned model as a plain Hugging Face directory", export_arguments, export_run,
                      "Remove blocks (--remove, or a strategy's k blocks) and write config, safetensors, tokenizer "
                      "and zones-provenance.json to --out"),
    "heal": Command("heal a pruned model (LoRA or a linear bridge) and export it", heal_arguments, heal_run,
                    "Remove blocks, heal on calibration tokens (disjoint from the eval split) and write the healed "
                    "model like zones export"),
    "train": Command("train a depth series of GPT-NeoX models with spectral snapshots", train_arguments, train_run),
    "lifecycle": Command("spectral snapshots of a series of checkpoints (weights only)", lifecycle_arguments,
                         lifecycle_run, "One snapshot (stable rank, alpha_shape, alpha_esd of every block matrix) "
                         "per checkpoint, from hub revisions, local checkpoint directories or the checkpoints of a "
                         "zones train --keep-checkpoints run -> OUT/snapshots.csv"),
    "sweep": Command("zones alpha over a list of models, one job per model", sweep_arguments, sweep_run,
                     "The alpha table of every model -> OUT/alpha.csv with a model column"),
    "book": Command("execute the chapter notebooks and build the book", book_arguments, book_run),
    "study": Command.of(studies),
    "evaluate": Command.of(evaluation),
    "lab": Command("open the notebooks in JupyterLab", lab_arguments, lab_run, LAB_DESCRIPTION),
}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line like every other error: ``zones CMD: error: ...``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="zones", description=__doc__, allow_abbrev=False,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"zones {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        p = sub.add_parser(name, help=command.help, description=command.description or command.help,
                           allow_abbrev=False)  # no abbreviations: each flag has one spelling
        command.add_arguments(p)
        p.set_defaults(func=command.run)
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
        if getattr(args, "out_dir", None) is not None:
            check_out(args.out_dir)  # a bad --out fails before any work
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
