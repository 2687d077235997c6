"""The ``zones`` command line: the library's operations, writing the same tables.

    zones alpha  --model M --out DIR            per-matrix α table      -> DIR/alpha.csv
    zones ablate --model M --corpus C --tokens N --seq-len S --out DIR
                                                ΔLoss per block         -> DIR/ablation.csv
    zones prune  --model M --strategies a,b --k-max 8 --out DIR
                                                ΔPPL per strategy and k -> DIR/pruning.csv
    zones train  --depths 4,6,8 --out DIR       train a depth series   -> DIR/series.csv, ...
    zones book   [--model M] [--only NAME ...]  execute chapters, build the HTML book
    zones lab                                   open the notebooks in JupyterLab
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .models import DEFAULT_MODEL


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help=f"built-in alias, local directory, .gguf file or hub id (default: {DEFAULT_MODEL})")
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow the model's own Python code to run (off by default)")


def _load(args):
    from .models import load_model

    return load_model(args.model, device=args.device, trust_remote_code=args.trust_remote_code)


def _text_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--corpus", default="stdlib", help="corpus name or text file(s) (default: stdlib)")
    parser.add_argument("--seq-len", type=int, default=256, help="window length in tokens (default: 256)")
    parser.add_argument("--batch-size", type=int, default=8, help="windows per forward (default: 8)")


def _budget(tokens: int | None, default: int) -> int | None:
    """A token budget flag: unset -> the chapter's default; 0 -> the whole split (None)."""
    return default if tokens is None else tokens or None


def _name_values(items: list[str], flag: str) -> dict:
    """``NAME=VALUE`` flags as a dict; values are YAML, so numbers and lists keep their types."""
    import yaml

    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"{flag} needs NAME=VALUE, not {item!r}")
        values[name] = yaml.safe_load(value)
    return values


def _write(df, out: str, name: str) -> None:
    from .cache import write_table

    path = write_table(df, Path(out) / name)
    print(f"wrote {path} ({len(df)} rows)")


def cmd_alpha(args) -> None:
    from .spectra import alpha_table, check_estimators, check_window

    window, estimators = check_window(args.window), check_estimators(args.estimators)  # before loading
    table = alpha_table(_load(args).model, window=window, estimators=estimators, cache=not args.no_cache,
                        progress=True)
    _write(table, args.out, "alpha.csv")
    noted = table[table["note"] != ""]
    if len(noted):
        print(f"{len(noted)} matrices have NaN estimates; see the note column")


def cmd_ablate(args) -> None:
    from .ablation import DEFAULT_EVAL_TOKENS, ablation_table
    from .data import corpus_windows, load_corpus

    tokens = _budget(args.tokens, DEFAULT_EVAL_TOKENS)
    corpus = load_corpus(args.corpus)  # an unknown or empty corpus fails before the model loads
    loaded = _load(args)
    windows = corpus_windows(corpus, loaded.tokenizer, args.seq_len, args.split, tokens)
    table = ablation_table(loaded.model, windows, parts=args.parts, method=args.method,
                           batch_size=args.batch_size)
    _write(table, args.out, "ablation.csv")


def cmd_prune(args) -> None:
    from .data import corpus_windows, load_corpus
    from .pruning import (DEFAULT_CALIBRATION_TOKENS, DEFAULT_EVAL_TOKENS, DEFAULT_STRATEGIES,
                          check_strategy_names, pruning_table)
    from .strategies import available_strategies

    if args.list_strategies:
        print(available_strategies().to_string(index=False))
        return
    names = check_strategy_names(args.strategies or DEFAULT_STRATEGIES)  # fail before the model loads
    corpus = load_corpus(args.corpus)
    loaded = _load(args)
    eval_windows = corpus_windows(corpus, loaded.tokenizer, args.seq_len, "eval",
                                  _budget(args.eval_tokens, DEFAULT_EVAL_TOKENS))
    calibration = corpus_windows(corpus, loaded.tokenizer, args.seq_len, "calibration",
                                 _budget(args.calibration_tokens, DEFAULT_CALIBRATION_TOKENS))
    table = pruning_table(loaded.model, eval_windows, calibration, strategies=names, k_max=args.k_max,
                          seeds=args.seeds, batch_size=args.batch_size, model_name=args.model)
    _write(table, args.out, "pruning.csv")


def cmd_train(args) -> None:
    import shutil

    from .train import series_configs, series_history, series_snapshots, series_summary, train_model

    overrides = dict(width=args.width, width_per_layer=args.width_per_layer, head_dim=args.head_dim,
                     vocab_size=args.vocab_size, seq_len=args.seq_len, batch_size=args.batch_size,
                     steps=args.steps, lr=args.lr, seed=args.seed, corpus=args.corpus,
                     snapshot_every=args.snapshot_every)
    overrides.update(_name_values(args.set, "--set"))
    try:
        depths = [int(d) for d in args.depths.split(",") if d.strip()] if args.depths else None
    except ValueError:
        raise ValueError(f"--depths needs comma-separated integers such as 4,6,8, not {args.depths!r}") from None
    configs = series_configs(args.profile, depths, **overrides)  # bad sizes fail before any work
    runs = [train_model(c, device=args.device, refresh=args.refresh) for c in configs]
    summary = series_summary(runs)
    _write(summary, args.out, "series.csv")
    _write(series_history(runs), args.out, "history.csv")
    _write(series_snapshots(runs), args.out, "snapshots.csv")
    for run in runs:
        target = Path(args.out) / "models" / f"depth-{run.config.depth}"
        if args.copy_models:
            shutil.copytree(run.path, target, dirs_exist_ok=True)
        print(f"depth {run.config.depth}: held-out loss {run.summary['final_heldout_loss']:.3f}, "
              f"trained in {run.summary['total_seconds']:.0f} s; model: {target if args.copy_models else run.path}")


def cmd_book(args) -> None:
    from .book import build_book

    params = {"model": args.model, "models": [args.model]} if args.model else {}
    params.update(_name_values(args.param, "--param"))
    index = build_book(params, only=args.only or None, execute=not args.no_execute)
    print(f"book: {index}")


def cmd_lab(args) -> None:
    import subprocess

    from .book import project_root

    subprocess.run([str(Path(sys.executable).with_name("jupyter-lab")),
                    str(project_root() / "notebooks"), *args.lab_args], check=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zones", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("alpha", help="fit α for every weight matrix of every block")
    _model_args(p)
    p.add_argument("--estimators", "--estimator", nargs="+", default=["shape", "esd", "hill", "companions"],
                   choices=["shape", "esd", "hill", "companions"], metavar="NAME",
                   help="which to compute: shape, esd, hill, companions (default: all; the other "
                        "columns are left empty)")
    p.add_argument("--window", nargs=2, type=float, default=[0.0, 0.5], metavar=("LO", "HI"),
                   help="rank window of the spectral-shape fit, as fractions of n (default: 0 0.5)")
    p.add_argument("--no-cache", action="store_true", help="recompute instead of reading the cache")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.set_defaults(func=cmd_alpha)

    p = sub.add_parser("ablate", help="ΔLoss of removing each decoder block in turn")
    _model_args(p)
    _text_args(p)
    p.add_argument("--tokens", type=int, default=None,
                   help="scored-token budget; 0 = the whole split (default: the chapter's CPU budget, "
                        "zones.ablation.DEFAULT_EVAL_TOKENS)")
    p.add_argument("--split", default="eval", choices=["eval", "calibration"], help="windows to score")
    p.add_argument("--method", default="prefix", choices=["prefix", "naive"],
                   help="prefix: reuse the shared prefix (default); naive: one full forward per block")
    p.add_argument("--parts", action="store_true", help="also remove only attention / only MLP")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("prune", help="ΔPPL of removing k = 1..K blocks, chosen by each pruning strategy")
    _model_args(p)
    _text_args(p)
    p.add_argument("--strategies", default=None,
                   help="comma-separated strategy names (default: zone_aware, last_n, random and the "
                        "field's baselines; see --list-strategies)")
    p.add_argument("--k-max", type=int, default=8, help="remove k = 1..K blocks (default: 8)")
    p.add_argument("--seeds", type=int, default=5, help="seeds of the random strategy (default: 5)")
    p.add_argument("--eval-tokens", type=int, default=None,
                   help="scored eval tokens; 0 = the whole split (default: the chapter's CPU budget)")
    p.add_argument("--calibration-tokens", type=int, default=None,
                   help="calibration tokens for the baselines; 0 = the whole split (default: the chapter's)")
    p.add_argument("--list-strategies", action="store_true", help="list the registered strategies and exit")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.set_defaults(func=cmd_prune)

    p = sub.add_parser("train", help="train a depth series of GPT-NeoX models with spectral snapshots")
    p.add_argument("--depths", default=None, help="comma-separated depths, e.g. 4,6,8 (default: the profile's)")
    p.add_argument("--profile", default="cpu", choices=["cpu", "paper"],
                   help="cpu: minutes on a laptop (default); paper: D8/D12/D16 at width 64·depth, for a GPU")
    p.add_argument("--width", type=int, default=None, help="hidden size for every depth (default: per layer × depth)")
    p.add_argument("--width-per-layer", type=int, default=None, help="hidden size per block of depth")
    p.add_argument("--head-dim", type=int, default=None, help="attention head size")
    p.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size")
    p.add_argument("--seq-len", type=int, default=None, help="training window length in tokens")
    p.add_argument("--batch-size", type=int, default=None, help="windows per step")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate")
    p.add_argument("--seed", type=int, default=None, help="seed of the weights and the batch order")
    p.add_argument("--corpus", default=None, help="training corpus (default: stdlib-code)")
    p.add_argument("--snapshot-every", type=int, default=None, help="steps between spectral snapshots (default: 25)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="any other training parameter of zones.train.TrainConfig")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--refresh", action="store_true", help="retrain even if the run is cached")
    p.add_argument("--copy-models", action="store_true", help="copy the trained models to OUT/models/depth-N")
    p.add_argument("--out", default="results/train", help="output folder (default: results/train)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("book", help="execute the chapter notebooks and build the book")
    p.add_argument("--model", default=None, help="model for every chapter (default: each notebook's own)")
    p.add_argument("--only", nargs="*", default=[], help="execute only these chapters")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="notebook parameter (YAML value), passed to the chapters that declare it")
    p.add_argument("--no-execute", action="store_true", help="rebuild HTML from executed chapters")
    p.set_defaults(func=cmd_book)

    p = sub.add_parser("lab", help="open the notebooks in JupyterLab")
    p.add_argument("lab_args", nargs=argparse.REMAINDER, help="passed to jupyter-lab")
    p.set_defaults(func=cmd_lab)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("interrupted; finished work is cached and a rerun resumes", file=sys.stderr)
        return 130
    except Exception as err:  # one clear line for the user; the traceback with ZONES_DEBUG=1
        import os

        if os.environ.get("ZONES_DEBUG"):
            raise
        print(f"zones {args.command}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
