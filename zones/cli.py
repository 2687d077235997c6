"""The ``zones`` command line: the library's operations, writing the same tables.

    zones alpha  --model M --out DIR            per-matrix α table      -> DIR/alpha.csv
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


def _write(df, out: str, name: str) -> None:
    from .cache import write_table

    path = write_table(df, Path(out) / name)
    print(f"wrote {path} ({len(df)} rows)")


def cmd_alpha(args) -> None:
    from .spectra import alpha_table

    _write(alpha_table(_load(args).model), args.out, "alpha.csv")


def cmd_book(args) -> None:
    import yaml

    from .book import build_book

    params = {"model": args.model, "models": [args.model]} if args.model else {}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--param needs NAME=VALUE, not {item!r}")
        params[name] = yaml.safe_load(value)  # numbers and lists keep their types
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
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.set_defaults(func=cmd_alpha)

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
