"""``zones evaluate``: zero-shot task accuracy through lm-evaluation-harness, of a model, of the
same model with blocks removed on the fly, or of an exported (healed) model directory.

    zones evaluate --model smollm2-135m --tasks zones_next_sentence --limit 50 --out results/eval
    zones evaluate --model smollm2-135m --remove 3,11,20,27 --tasks zones_offline --out results/eval
    zones evaluate --model smollm2-135m --strategy zone_aware,last_n_keep_last --k 8 --out results/eval
    zones evaluate --model smollm2-135m --model healed/k8 --tasks arc_easy --out results/eval

Every ``--model`` is loaded by zones' rules (``zones.core.models``: no remote code unless
``--trust-remote-code``, no pickles); ``--remove`` (repeatable) and ``--strategy`` with ``--k``
add variants of the first model with those blocks removed (``zones.pruning.export.pruned_copy``;
a strategy chooses its blocks as ``zones export`` does). A directory written by ``zones export``
or ``zones heal`` is labelled with the blocks its provenance says were removed.

Writes ``tasks.csv`` (model, removed, task, metric, value, stderr, n: lm-eval's numbers),
``examples.csv`` (each variant's answer to each example) and, with two variants or more,
``differences.csv``: each variant's accuracy minus the first variant's (the first ``--model``),
with 95% paired intervals over the same examples.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from zones.core.cache import write_table
from zones.core.data import corpus_windows
from zones.core.models import DEFAULT_MODEL, load_model
from zones.measure.evaluate import DEFAULT_DTYPE, DTYPES
from zones.measure.tasks import (
    METRICS,
    OFFLINE_GROUP,
    check_tasks,
    evaluate_tasks,
    paired_differences,
    variant_label,
)
from zones.measure.tasks.harness import check_limit, require_lm_eval
from zones.pruning import DEFAULT_CALIBRATION_TOKENS, check_strategy_names, parse_removed
from zones.pruning.export import ExportError, choose_removed, pruned_copy, read_provenance


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``zones evaluate`` (the shared ones mean what they mean in every command)."""
    p.add_argument("--model", action="append", default=None,
                   help=f"model to evaluate: alias, local directory (an export or a healed export too), .gguf "
                        f"file or hub id; repeat to compare several (default: {DEFAULT_MODEL})")
    p.add_argument("--tokenizer", default=None, metavar="PATH",
                   help="tokenizer directory or hub id to use instead of the model's own")
    p.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if available)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="allow the model's own Python code to run (off by default)")
    p.add_argument("--remove", action="append", default=[],
                   help="also evaluate the first model with these blocks removed, e.g. 3,11,20,27 (repeatable)")
    p.add_argument("--strategy", default=None,
                   help="also evaluate the first model pruned by these strategies (comma-separated; with --k)")
    p.add_argument("--k", type=int, default=None, help="blocks each --strategy removes")
    p.add_argument("--seed", type=int, default=0, help="seed of a seeded strategy (default: 0)")
    p.add_argument("--corpus", default="stdlib", help="corpus a --strategy plans on (calibration split; default: stdlib)")
    p.add_argument("--seq-len", type=int, default=256, help="calibration window length in tokens (default: 256)")
    p.add_argument("--calibration-tokens", type=int, default=None,
                   help="calibration tokens a strategy plans on; 0 = the whole split (default: the pruning chapter's)")
    p.add_argument("--tasks", default=OFFLINE_GROUP,
                   help=f"comma-separated lm-eval task names (default: {OFFLINE_GROUP}, zones' two offline tasks; "
                        f"the standard five: piqa,winogrande,hellaswag,arc_easy,arc_challenge)")
    p.add_argument("--limit", type=int, default=None, help="examples per task, the first ones (default: all)")
    p.add_argument("--metric", default="acc", choices=METRICS, help="metric of differences.csv (default: acc)")
    p.add_argument("--include-path", action="append", default=[], metavar="DIR",
                   help="another folder of lm-eval task YAML files (repeatable)")
    p.add_argument("--batch-size", type=int, default=8, help="requests per forward (default: 8)")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=DTYPES,
                   help=f"scoring precision of the forward passes (default: {DEFAULT_DTYPE})")
    p.add_argument("--refresh", action="store_true", help="evaluate again instead of reading the cache")
    p.add_argument("--out", default="results", help="output folder (default: results)")


def _removal_sets(args, loaded) -> list[tuple[list[int], str | None]]:
    """(blocks, strategy) of every on-the-fly variant of the first model."""
    sets = [(parse_removed(r), None) for r in args.remove]
    if args.strategy is not None or args.k is not None:
        if args.strategy is None or args.k is None:
            raise ExportError("--strategy and --k go together: pass both, e.g. --strategy zone_aware --k 8")
        names = check_strategy_names([s for s in args.strategy.split(",") if s.strip()])
        budget = DEFAULT_CALIBRATION_TOKENS if args.calibration_tokens is None else args.calibration_tokens or None
        calibration = corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "calibration", budget)
        for name in names:
            sets.append((choose_removed(loaded.model, name, args.k, calibration=calibration, seed=args.seed,
                                        batch_size=args.batch_size), name))
    return sets


def _provenance_removed(name: str) -> str:
    path = Path(name).expanduser()
    record = read_provenance(path) if path.is_dir() else {}
    return ",".join(str(b) for b in record.get("removed", []))


def run(args) -> None:
    """Evaluate every variant on the tasks and write the tables (module docstring)."""
    require_lm_eval()  # before loading anything
    tasks = check_tasks(args.tasks)
    limit = check_limit(args.limit)
    models = args.model or [DEFAULT_MODEL]
    common = dict(limit=limit, batch_size=args.batch_size, dtype=args.dtype, include_path=args.include_path,
                  refresh=args.refresh)
    tables, examples = [], []

    def record(result) -> None:
        tables.append(result.table)
        examples.append(result.examples)
        for r in result.table[result.table["metric"] == args.metric].to_dict("records"):
            print(f"{variant_label(r['model'], r['removed'])}: {r['task']} {args.metric} = {r['value']:.3f} "
                  f"± {r['stderr']:.3f} (n = {r['n']})")

    for i, name in enumerate(models):
        loaded = load_model(name, device=args.device, trust_remote_code=args.trust_remote_code,
                            tokenizer=args.tokenizer)
        sets = _removal_sets(args, loaded) if i == 0 else []
        record(evaluate_tasks(loaded.model, loaded.tokenizer, tasks, model_name=name,
                              removed=_provenance_removed(name), fingerprint=loaded.fingerprint, **common))
        for removed, strategy in sets:
            pruned = pruned_copy(loaded.model, removed)
            label = ",".join(str(b) for b in sorted(removed))
            record(evaluate_tasks(pruned, loaded.tokenizer, tasks, model_name=name, removed=label, **common))
            del pruned
        del loaded
    out = Path(args.out)
    table, per_example = pd.concat(tables, ignore_index=True), pd.concat(examples, ignore_index=True)
    for df, file in ((table, "tasks.csv"), (per_example, "examples.csv")):
        print(f"wrote {write_table(df, out / file)} ({len(df)} rows)")
    if len(table.drop_duplicates(["model", "removed"])) > 1:
        differences = paired_differences(per_example, args.metric)
        for r in differences.to_dict("records"):
            print(f"{r['variant']} − {r['reference']}: {r['task']} Δ{args.metric} = {r['difference']:+.3f} "
                  f"[{r['difference_low']:+.3f}, {r['difference_high']:+.3f}] (n = {r['n']})")
        print(f"wrote {write_table(differences, out / 'differences.csv')} ({len(differences)} rows)")
