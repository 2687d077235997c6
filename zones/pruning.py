"""Depth pruning: how much perplexity rises when k decoder blocks are removed, as chosen by
each strategy (``zones.strategies``), for k = 1..k_max.

Protocol. Every strategy plans its removals first (the baselines look only at the
calibration windows); then every distinct removal set is scored on the same eval windows
as the full model: ΔPPL = PPL(pruned) − PPL(full), PPL = exp(mean token cross-entropy)
(``zones.evaluate`` protocol). A removed block's output is its input.

Speed. Removal sets are scored along a prefix tree (``zones.evaluate.evaluate_removals``):
consecutive sets share the hidden states up to the first block where they differ, and the
nested sets of one strategy (k and k + 1 differ by one block) mostly share their path.

Caching. Each scored set is appended, complete, to a journal keyed by the model's and the
eval windows' fingerprints; a rerun scores only the sets it has not seen, so an interrupted
run resumes and a new strategy pays only for its new sets. Greedy search steps, the
calibration hidden-state statistics and the calibration ablation are cached likewise.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from torch import nn
from tqdm.auto import tqdm

from .adapters import get_adapter
from .cache import Journal, entry_path
from .data import Windows
from .evaluate import evaluate_removals, model_device, tree_order
from .strategies import STRATEGIES, PruningContext, Strategy, StrategyError, get_strategy

VERSION = "1"
COLUMNS = ["model", "strategy", "k", "seed", "removed", "ppl", "base_ppl", "delta_ppl", "n_tokens"]
DEFAULT_STRATEGIES = ("zone_aware", "last_n", "random", "alpha_lowest", "block_influence", "angular",
                      "ablation_rank", "greedy")
RECIPE_ABLATIONS = ("zone_aware_no_protection", "zone_aware_no_spreading", "zone_aware_one_zone")
# The chapter's CPU budgets (seq_len 256): 4 eval windows, 1 calibration window. A GPU run
# should use 64 eval windows and 32 calibration windows (book/methods/pruning.md).
DEFAULT_EVAL_TOKENS = 4 * 255
DEFAULT_CALIBRATION_TOKENS = 1 * 255
SETS_PER_PASS = 32  # removal sets scored per trace of the eval windows (and journaled together)


def format_removed(blocks: Iterable[int]) -> str:
    """``[27, 25, 23]`` -> ``"27,25,23"`` (the table's ``removed`` column)."""
    return ",".join(str(int(b)) for b in blocks)


def parse_removed(text: str) -> list[int]:
    """Inverse of :func:`format_removed` (``""`` is the empty set)."""
    text = "" if text is None or (isinstance(text, float) and np.isnan(text)) else str(text)
    return [int(part) for part in text.split(",") if part.strip()]


# --------------------------------------------------------------------------------------------
# Plans and the table
# --------------------------------------------------------------------------------------------

def check_strategy_names(strategies) -> list[str]:
    """Strategy names (a list, or one comma-separated string), de-duplicated and checked."""
    if isinstance(strategies, str):
        strategies = strategies.split(",")
    names = list(dict.fromkeys(str(s).strip() for s in strategies if str(s).strip()))
    if not names:
        raise StrategyError("no strategies given")
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise StrategyError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {unknown}; "
                            f"available: {', '.join(STRATEGIES)}")
    return names


def _check_k_max(k_max, chosen: list[Strategy], n_blocks: int) -> None:
    if isinstance(k_max, bool) or not isinstance(k_max, (int, np.integer)) or k_max < 1:
        raise ValueError(f"k_max must be a positive integer, not {k_max!r}")
    for strategy in chosen:
        cap = strategy.max_k(n_blocks)
        if k_max > cap:
            raise ValueError(f"k_max={k_max} is too large: strategy {strategy.name!r} may remove at most "
                             f"{cap} of this model's {n_blocks} blocks (at least 2 remain, and protected "
                             f"blocks are never removed)")


def plan_strategies(ctx: PruningContext, strategies: Sequence[str], k_max: int,
                    seeds: int = 5) -> pd.DataFrame:
    """Each strategy's plans: ``strategy, seed, k, removed`` (``removed`` as in the table).

    Strategies are planned cheapest first, so a misconfigured cheap one fails before the
    calibration work of an expensive one.
    """
    names = check_strategy_names(strategies)
    chosen = [get_strategy(s) for s in names]
    _check_k_max(k_max, chosen, ctx.n_blocks)
    rows = {}
    for strategy in sorted(chosen, key=lambda s: s.cost):
        for seed in (range(seeds) if strategy.seeded else [0]):
            for k, plan in enumerate(strategy.plan(ctx, k_max, seed), start=1):
                rows[(strategy.name, seed, k)] = format_removed(plan)
    return pd.DataFrame([dict(strategy=name, seed=seed, k=k, removed=rows[(name, seed, k)])
                         for name in names for (n, seed, k) in rows if n == name])


def _scored_sets(model: nn.Module, windows: Windows, sets: list[tuple[int, ...]], *, batch_size: int,
                 cache: bool, progress: bool) -> dict[tuple[int, ...], tuple[float, int]]:
    """(loss, n_tokens) of each removal set on ``windows``; journaled sets are not rescored."""
    from .models import model_fingerprint

    journal = None
    known: dict[tuple[int, ...], tuple[float, int]] = {}
    if cache:
        key = dict(kind="pruning-losses", version=VERSION, model=model_fingerprint(model),
                   windows=windows.fingerprint, n_windows=windows.n_windows, batch_size=batch_size,
                   dtype=str(next(model.parameters()).dtype), device=model_device(model).type)
        journal = Journal(entry_path("pruning-losses", key, ext="jsonl"))
        known = {tuple(row["removed"]): (row["loss"], row["n_tokens"]) for row in journal.rows()}
    todo = [s for s in dict.fromkeys(sets) if s not in known]
    # Chunks follow the prefix-tree order, so each chunk shares as much as it can.
    todo = [todo[j] for j in tree_order(todo, get_adapter(model).n_blocks)]
    bar = tqdm(total=len(todo), desc="pruned models", unit="set", disable=not progress or not todo)
    for start in range(0, len(todo), SETS_PER_PASS):
        chunk = todo[start:start + SETS_PER_PASS]
        results = evaluate_removals(model, windows, chunk, batch_size=batch_size, progress=progress)
        for removed, result in zip(chunk, results):
            known[removed] = (result.loss, result.n_tokens)
            if journal is not None:
                journal.append(dict(removed=list(removed), loss=result.loss, n_tokens=result.n_tokens))
        bar.update(len(chunk))
    bar.close()
    return {s: known[s] for s in sets}


def pruning_table(model: nn.Module, eval_windows: Windows, calibration_windows: Windows | None = None, *,
                  strategies: Sequence[str] | str = DEFAULT_STRATEGIES, k_max: int = 8, seeds: int = 5,
                  alpha: pd.DataFrame | None = None, batch_size: int = 8, cache: bool = True,
                  progress: bool = True, model_name: str | None = None) -> pd.DataFrame:
    """ΔPPL of each strategy's removal of k = 1..k_max blocks, on ``eval_windows``.

    One row per (strategy, seed, k):

    =============  =====================================================================
    ``model``      ``model_name``, or the model's ``name_or_path``
    ``strategy``   strategy name (``zones.strategies.available_strategies()``)
    ``k``          number of blocks removed
    ``seed``       the seed of a seeded strategy (``random``: 0..seeds−1); 0 otherwise
    ``removed``    the removed blocks, comma-separated, in the order the strategy chose
                   them (``"27,25,23"``; ``parse_removed`` reads it back)
    ``ppl``        perplexity of the pruned model on the eval windows
    ``base_ppl``   perplexity of the full model on the same tokens
    ``delta_ppl``  ``ppl − base_ppl``
    ``n_tokens``   scored tokens
    =============  =====================================================================

    The baselines that measure activations use ``calibration_windows`` only. ``alpha`` is
    the α table of ``zones.spectra.alpha_table`` (computed when ``None``). Arguments are
    checked (strategy names, ``k_max`` against every strategy's removable blocks, windows)
    before any forward pass. With ``cache=True`` every scored removal set is journaled, so
    an interrupted run resumes and overlapping runs share work.
    """
    names = check_strategy_names(strategies)
    chosen = [get_strategy(s) for s in names]
    n_blocks = get_adapter(model).n_blocks
    _check_k_max(k_max, chosen, n_blocks)
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer, not {seeds!r}")
    for label, windows in (("eval_windows", eval_windows), ("calibration_windows", calibration_windows)):
        if windows is None and label == "calibration_windows":
            needing = [s.name for s in chosen if s.uses_calibration]
            if needing:
                raise ValueError(f"strategies {needing} need calibration_windows")
            continue
        if not isinstance(windows, Windows):
            raise TypeError(f"{label} must be zones.data.Windows (from corpus_windows), not {type(windows).__name__}")
        if windows.n_windows == 0 or windows.seq_len < 2:
            raise ValueError(f"{label} score no tokens")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    if alpha is not None and not isinstance(alpha, pd.DataFrame):
        raise TypeError(f"alpha must be an α table (pandas DataFrame) or None, not {type(alpha).__name__}")

    ctx = PruningContext(model, calibration_windows, alpha=alpha, batch_size=batch_size, cache=cache,
                         progress=progress)
    plans = plan_strategies(ctx, names, k_max, seeds)
    plans["set"] = [tuple(sorted(parse_removed(r))) for r in plans["removed"]]
    scored = _scored_sets(model, eval_windows, [()] + sorted(set(plans["set"])), batch_size=batch_size,
                          cache=cache, progress=progress)
    base_loss, _ = scored[()]
    out = plans.assign(
        model=model_name or str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__),
        ppl=[float(np.exp(scored[s][0])) for s in plans["set"]],
        base_ppl=float(np.exp(base_loss)),
        n_tokens=[int(scored[s][1]) for s in plans["set"]],
    )
    out["delta_ppl"] = out["ppl"] - out["base_ppl"]
    return out[COLUMNS].reset_index(drop=True)


# --------------------------------------------------------------------------------------------
# Reading the table
# --------------------------------------------------------------------------------------------

def summarize_pruning(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (strategy, k), seeds pooled: ``strategy, k, delta_ppl`` (mean over seeds),
    ``delta_ppl_min, delta_ppl_max, ppl`` (mean), ``base_ppl, n_seeds``. Strategy order is
    the table's."""
    order = list(dict.fromkeys(table["strategy"]))
    out = (table.groupby(["strategy", "k"], sort=False)
           .agg(delta_ppl=("delta_ppl", "mean"), delta_ppl_min=("delta_ppl", "min"),
                delta_ppl_max=("delta_ppl", "max"), ppl=("ppl", "mean"), base_ppl=("base_ppl", "first"),
                n_seeds=("seed", "nunique"))
           .reset_index())
    out["strategy"] = pd.Categorical(out["strategy"], categories=order, ordered=True)
    out = out.sort_values(["strategy", "k"]).reset_index(drop=True)
    out["strategy"] = out["strategy"].astype(str)
    return out


def compare_strategies(summary: pd.DataFrame, numerator: str = "last_n",
                       denominator: str = "zone_aware") -> pd.DataFrame:
    """ΔPPL(numerator) / ΔPPL(denominator) by k: ``k, <numerator>, <denominator>, ratio,
    winner``. A ratio above 1 means the denominator (zone-aware) removed blocks more cheaply.
    The ratio is NaN where a ΔPPL is not positive."""
    wide = summary.pivot(index="k", columns="strategy", values="delta_ppl")
    missing = [s for s in (numerator, denominator) if s not in wide.columns]
    if missing:
        raise ValueError(f"strategies {missing} are not in the table; it has {list(wide.columns)}")
    a, b = wide[numerator], wide[denominator]
    ratio = (a / b).where((a > 0) & (b > 0))
    winner = np.where(a > b, denominator, np.where(b > a, numerator, "tie"))
    return pd.DataFrame({"k": wide.index.astype(int), numerator: a.to_numpy(), denominator: b.to_numpy(),
                         "ratio": ratio.to_numpy(), "winner": winner}).reset_index(drop=True)


def crossover_k(comparison: pd.DataFrame, winner: str = "zone_aware") -> int | None:
    """The smallest k from which ``winner`` wins at every larger k of the comparison, if it
    loses somewhere before it; ``None`` when there is no such switch (it always or never
    wins to the end)."""
    wins = (comparison.sort_values("k")["winner"] == winner).to_numpy()
    ks = comparison.sort_values("k")["k"].to_numpy()
    if not wins[-1] or wins.all():
        return None
    last_loss = np.flatnonzero(~wins)[-1]
    return int(ks[last_loss + 1])


def best_by_k(summary: pd.DataFrame, strategies: Sequence[str] | None = None) -> pd.DataFrame:
    """Per k, the strategy with the lowest and the highest ΔPPL (seed means): ``k, best,
    best_delta_ppl, worst, worst_delta_ppl, worst_best_ratio`` (NaN when the best ΔPPL is
    not positive)."""
    df = summary if strategies is None else summary[summary["strategy"].isin(strategies)]
    rows = []
    for k, group in df.groupby("k"):
        group = group.sort_values(["delta_ppl", "strategy"])
        best, worst = group.iloc[0], group.iloc[-1]
        ratio = worst["delta_ppl"] / best["delta_ppl"] if best["delta_ppl"] > 0 else float("nan")
        rows.append(dict(k=int(k), best=best["strategy"], best_delta_ppl=float(best["delta_ppl"]),
                         worst=worst["strategy"], worst_delta_ppl=float(worst["delta_ppl"]),
                         worst_best_ratio=float(ratio)))
    return pd.DataFrame(rows)


def _times(x: float) -> str:
    return f"{x:,.0f}×" if x >= 100 else f"{x:.2f}×"


def pruning_findings(table: pd.DataFrame, *, ours: str = "zone_aware", reference: str = "last_n",
                     recipe: Sequence[str] = RECIPE_ABLATIONS, paper_ratio: float = 2.0) -> dict:
    """The chapter's numbers and its plain-language verdicts, as plain Python values.

    Keys: ``k_max, base_ppl, n_tokens``; ``dppl_<strategy>_kmax`` and ``dppl_<strategy>_k1``
    for ``ours``, ``reference`` and (if present) ``random``; ``ratio_kmax`` (ΔPPL reference /
    ΔPPL ours at k_max, NaN when a ΔPPL ≤ 0); ``crossover_k`` (see :func:`crossover_k`;
    None if none); ``best_by_k`` (text); ``best_kmax, best_kmax_dppl, worst_kmax,
    worst_best_kmax``; ``ours_rank_kmax`` (1 = lowest ΔPPL) of ``n_compared``;
    ``ours_over_best_kmax``; ``dppl_<variant>_kmax`` for each recipe ablation present; and
    the sentences ``crossover_text, verdict, baseline_text, recipe_text``. Recipe ablations
    are left out of the best/worst comparison.
    """
    summary = summarize_pruning(table)
    present = list(dict.fromkeys(summary["strategy"]))
    compared = [s for s in present if s not in recipe]
    k_max = int(summary["k"].max())
    at = lambda name, k: float(summary.loc[(summary["strategy"] == name) & (summary["k"] == k), "delta_ppl"].iloc[0])
    comparison = compare_strategies(summary, reference, ours)
    ratio = float(comparison.set_index("k").loc[k_max, "ratio"])
    cross = crossover_k(comparison, ours)
    wins = [int(k) for k in comparison.loc[comparison["winner"] == ours, "k"]]
    best = best_by_k(summary, compared).set_index("k")
    ranking = summary[(summary["k"] == k_max) & summary["strategy"].isin(compared)].sort_values("delta_ppl")
    rank = list(ranking["strategy"]).index(ours) + 1
    best_dppl = float(best.loc[k_max, "best_delta_ppl"])
    ours_over_best = at(ours, k_max) / best_dppl if best_dppl > 0 else float("nan")
    out = dict(k_max=k_max, base_ppl=float(table["base_ppl"].iloc[0]), n_tokens=int(table["n_tokens"].iloc[0]),
               ratio_kmax=ratio, crossover_k=cross,
               best_by_k="; ".join(f"k = {k}: {row.best}" for k, row in best.iterrows()),
               best_kmax=str(best.loc[k_max, "best"]), best_kmax_dppl=best_dppl,
               worst_kmax=str(best.loc[k_max, "worst"]), worst_best_kmax=float(best.loc[k_max, "worst_best_ratio"]),
               ours_rank_kmax=int(rank), n_compared=len(compared), ours_over_best_kmax=float(ours_over_best))
    for name in (ours, reference, "random"):
        if name in present:
            out[f"dppl_{name}_kmax"], out[f"dppl_{name}_k1"] = at(name, k_max), at(name, 1)

    if cross is not None:
        out["crossover_text"] = f"{ours} overtakes {reference} at k = {cross} and stays ahead up to k = {k_max}"
    elif len(wins) == len(comparison):
        out["crossover_text"] = f"{ours} is ahead of {reference} at every k from 1 to {k_max}: there is no crossover"
    elif wins:
        out["crossover_text"] = (f"{ours} is ahead of {reference} only at k = {', '.join(map(str, wins))} and "
                                 f"behind at k = {k_max}: there is no lasting crossover")
    else:
        out["crossover_text"] = f"{ours} never overtakes {reference} for k = 1..{k_max}: there is no crossover"

    paper = f"the paper reports about {paper_ratio:g}× at k = 8 on Pythia-410M"
    if ratio != ratio:
        out["verdict"] = (f"At k = {k_max} the ratio is undefined (a ΔPPL is not positive: {ours} "
                          f"{at(ours, k_max):.2f}, {reference} {at(reference, k_max):.2f}), so the paper's "
                          f"claim cannot be tested as a ratio here.")
    elif ratio >= 1.1:
        out["verdict"] = (f"On this model the paper's claim that {ours} beats {reference} holds: at k = {k_max} "
                          f"{reference}'s ΔPPL is {_times(ratio)} {ours}'s ({paper}).")
    elif ratio > 1 / 1.1:
        out["verdict"] = (f"The paper's claim is not borne out here: at k = {k_max} {ours} and {reference} are "
                          f"within 10% (ratio {ratio:.2f}; {paper}).")
    else:
        out["verdict"] = (f"The paper's claim does not hold on this model: at k = {k_max} {ours}'s ΔPPL is "
                          f"{_times(1 / ratio)} {reference}'s, the opposite of the paper's finding ({paper}).")

    if rank == 1:
        out["baseline_text"] = f"Against every other strategy too, {ours} has the lowest ΔPPL at k = {k_max}."
    elif ours_over_best == ours_over_best:
        out["baseline_text"] = (f"Against the field's baselines the picture is different: at k = {k_max} {ours} "
                                f"ranks {rank} of {len(compared)}, and the best, {out['best_kmax']}, raises "
                                f"perplexity {_times(ours_over_best)} less ({best_dppl:.2f} against "
                                f"{at(ours, k_max):.2f}).")
    else:
        out["baseline_text"] = f"At k = {k_max} {ours} ranks {rank} of {len(compared)}."

    effects = []
    for variant in recipe:
        if variant in present:
            value = out[f"dppl_{variant}_kmax"] = at(variant, k_max)
            if abs(value - at(ours, k_max)) < 1e-9:
                effects.append(f"{variant} is unchanged")
            elif at(ours, k_max) > 0:
                effects.append(f"{variant} gives ΔPPL {value:,.2f} ({_times(value / at(ours, k_max))} {ours}'s)")
            else:
                effects.append(f"{variant} gives ΔPPL {value:,.2f}")
    out["recipe_text"] = f"At k = {k_max}: " + "; ".join(effects) + "." if effects else ""
    return out
