"""``zones evaluate``: zero-shot task accuracy through lm-evaluation-harness, of a model, of the
same model with blocks removed on the fly, or of an exported (healed) model directory.

    zones evaluate --model smollm2-135m --tasks zones_next_sentence --limit 50 --out results/eval
    zones evaluate --model smollm2-135m --remove 3,11,20,27 --tasks zones_offline --out results/eval
    zones evaluate --model smollm2-135m --strategy zone_aware --k 8 --out results/eval
    zones evaluate --models smollm2-135m,healed/k8 --tasks arc_easy --out results/eval

Every model is loaded by zones' rules (``zones.core.models``: no remote code unless
``--trust-remote-code``, no pickles); ``--remove`` and ``--strategy`` with ``--k`` add
variants of the first model with those blocks removed (``zones.pruning.export.pruned_copy``;
a strategy chooses its blocks as ``zones export`` does). A directory written by ``zones export``
or ``zones heal`` is labelled with the blocks its provenance says were removed.

Writes ``tasks.csv`` (model, removed, task, metric, value, stderr, n: lm-eval's numbers),
``examples.csv`` (each variant's answer to each example) and, with two variants or more,
``differences.csv``: each variant's accuracy minus the first variant's (the first model),
with 95% paired intervals over the same examples.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from zones.core.checks import check_models
from zones.core.data import corpus_windows
from zones.core.glossary import add_flag
from zones.core.models import DEFAULT_MODEL, load_model
from zones.core.refresh import refreshing
from zones.core.tables import write_table
from zones.measure.tasks import (
    check_tasks,
    evaluate_tasks,
    paired_differences,
    variant_label,
)
from zones.measure.tasks.harness import check_limit, require_lm_eval
from zones.pruning import check_strategy_names
from zones.pruning.export import ExportError, choose_removed, parse_remove_flag, pruned_copy, read_provenance


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``zones evaluate``, each a glossary term (they mean what they mean in every command)."""
    chosen = p.add_mutually_exclusive_group()
    add_flag(chosen, "model", "evaluate", help=f"the model to evaluate: alias, local directory (an export or a healed "
             f"export too), .gguf file or hub id (default: {DEFAULT_MODEL})")
    add_flag(chosen, "models", "evaluate", help="comma-separated models to compare (the first is the reference)")
    for name in ("tokenizer", "device", "trust_remote_code"):
        add_flag(p, name, "evaluate")
    add_flag(p, "remove", "evaluate", help="also evaluate the first model with these blocks removed, e.g. 3,11,20,27")
    add_flag(p, "strategy", "evaluate", help="also evaluate the first model pruned by this strategy (with --k)")
    for name in ("k", "seed", "corpus", "seq_len", "calibration_tokens", "tasks", "limit", "metric", "include_path",
                 "batch_size", "dtype", "refresh", "out_dir"):
        add_flag(p, name, "evaluate")


def _removal_sets(args, loaded) -> list[tuple[list[int], str | None]]:
    """(blocks, strategy) of every on-the-fly variant of the first model."""
    sets = [(parse_remove_flag(args.remove), None)] if args.remove is not None else []
    if args.strategy is not None or args.k is not None:
        if args.strategy is None or args.k is None:
            raise ExportError("--strategy and --k go together: pass both, e.g. --strategy zone_aware --k 8")
        (name,) = check_strategy_names([args.strategy])
        calibration = corpus_windows(args.corpus, loaded.tokenizer, args.seq_len, "calibration",
                                     args.calibration_tokens or None)
        sets.append((choose_removed(loaded.model, name, args.k, calibration=calibration, seed=args.seed,
                                    batch_size=args.batch_size), name))
    return sets


def _provenance_removed(name: str) -> str:
    path = Path(name).expanduser()
    record = read_provenance(path) if path.is_dir() else {}
    return ",".join(str(b) for b in record.get("removed", []))


def evaluation(args) -> dict[str, pd.DataFrame]:
    """Evaluate every variant on the tasks (module docstring), printing each one's accuracy:
    ``tasks``, ``examples`` and, with two variants or more, ``differences`` (the tables
    ``zones evaluate`` writes, by name; ``zones.evaluate(...)`` in Python returns ``tasks``)."""
    models = [args.model] if args.model else [DEFAULT_MODEL] if args.models is None else check_models(args.models)
    require_lm_eval()  # before loading anything
    tasks = check_tasks(args.tasks)
    limit = check_limit(args.limit)
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
        with refreshing(args.refresh):  # what a strategy plans on, computed again too
            sets = _removal_sets(args, loaded) if i == 0 else []
        record(evaluate_tasks(loaded.model, loaded.tokenizer, tasks, model_name=name,
                              removed=_provenance_removed(name), fingerprint=loaded.fingerprint, **common))
        for removed, strategy in sets:
            pruned = pruned_copy(loaded.model, removed)
            label = ",".join(str(b) for b in sorted(removed))
            record(evaluate_tasks(pruned, loaded.tokenizer, tasks, model_name=name, removed=label, **common))
            del pruned
        del loaded
    table, per_example = pd.concat(tables, ignore_index=True), pd.concat(examples, ignore_index=True)
    found = dict(tasks=table, examples=per_example)
    if len(table.drop_duplicates(["model", "removed"])) > 1:
        found["differences"] = differences = paired_differences(per_example, args.metric)
        for r in differences.to_dict("records"):
            print(f"{r['variant']} − {r['reference']}: {r['task']} Δ{args.metric} = {r['difference']:+.3f} "
                  f"[{r['difference_low']:+.3f}, {r['difference_high']:+.3f}] (n = {r['n']})")
    return found


def write(found: dict[str, pd.DataFrame], out_dir) -> None:
    """``OUT/tasks.csv``, ``OUT/examples.csv`` and ``OUT/differences.csv`` (when there is one)."""
    for name, df in found.items():
        print(f"wrote {write_table(df, Path(out_dir) / f'{name}.csv')} ({len(df)} rows)")


def run(args) -> None:
    """Evaluate every variant on the tasks and write the tables (module docstring)."""
    write(evaluation(args), args.out_dir)

