"""Depth pruning: how much perplexity rises when k decoder blocks are removed, as chosen by
each strategy (``zones.pruning.strategies``), for k = 1..k_max.

Protocol. Every strategy plans its removals first (the baselines look only at the
calibration windows); then every distinct removal set is scored on the same eval windows
as the full model: ΔPPL = PPL(pruned) − PPL(full), PPL = exp(mean token cross-entropy)
(``zones.measure.scoring`` protocol). A removed block's output is its input.

Speed. Removal sets are scored along a prefix tree (``zones.measure.scoring.score_windows``):
consecutive sets share the hidden states up to the first block where they differ, and the
nested sets of one strategy (k and k + 1 differ by one block) mostly share their path. Each
eval batch is traced through the full model once for the whole sweep, so every set starts
from the full model's hidden state at its first removed block.

Evidence. Every scored set keeps its NLL on every eval window (``PruningResult.window_losses``),
so each (strategy, k) gets paired bootstrap intervals over windows (``zones.measure.bootstrap``): Δloss =
ln(PPL_pruned / PPL_base) in nats and ΔPPL; every pair of strategies gets an interval on the
difference of their Δloss, from the same resamples; "best at k" is the set of strategies not
separable from the best. Seeded strategies (``random``, ``random_protected``, ``protect_spread_random``) run
``DEFAULT_SEEDS`` = 3 seeds by default and are summarised by their median (inside every
resample too) and interquartile range. Why 3: a random baseline is a reference point read
through its median (3 is the fewest with a median that is one of them), and the chapter's
intervals are over eval windows (the seeds held fixed); the spread over seeds is shown as the
IQR, not as an interval. The seeds are nested: seed s plans the same sets whatever the seed
count, so a run with more seeds only adds rows (and, cached, pays only for them). The random
baselines cost most of the sweep (each seed adds k_max removal sets that share little with the
others, and every set pays an LM head per eval batch): the seed count is the chapter's main
time knob (8 seeds: 183 distinct sets on SmolLM2-135M; 3 seeds: 105).
A base or pruned loss that is not finite is an error naming the removal set and the window.

Caching. Each scored set's per-window losses go to the per-window loss store
(``zones.measure.store``: one row per eval batch and set, keyed by the model's fingerprint, the
batch's tokens and the scoring dtype); a rerun scores only the sets it has not seen, so an
interrupted run resumes, a new strategy pays only for its new sets, and every other chapter
on the same batches (the ablation's single blocks, the healing chapter's sets) shares them.
Greedy search steps, the calibration hidden-state statistics and the calibration ablation are
cached likewise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from torch import nn

from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.glossary import default
from zones.measure.bootstrap import delta_loss_interval
from zones.measure.scoring import score_windows
from zones.measure.subject import Subject, as_subject
from zones.pruning.strategies import BLOCK, PruningContext, Strategy, StrategyError, get_strategy, strategy_names

COLUMNS = ["model", "strategy", "k", "seed", "removed", "ppl", "base_ppl", "delta_ppl", "delta_loss", "delta_loss_low",
           "delta_loss_high", "n_tokens"]
WINDOW_COLUMNS = ["removed", "window", "nll", "n_tokens"]
DEFAULT_STRATEGIES = tuple(default("strategies", context="prune"))
RECIPE_ABLATIONS = ("zone_aware_no_protection", "zone_aware_no_spreading", "zone_aware_one_zone")
# The chapter's CPU budgets (seq_len 256): the first batch of 8 windows of the book's eval set
# (the strategies' differences are many times their half-widths: tokens buy the least here), 2
# calibration windows. A GPU run should use 64 eval windows and 32 calibration windows
# (book/methods/pruning.md).
DEFAULT_EVAL_TOKENS = default("eval_tokens", context="pruning")  # 8 windows of 255 (the glossary's)
DEFAULT_CALIBRATION_TOKENS = default("calibration_tokens", context="pruning")
DEFAULT_SEEDS = default("seeds", context="pruning")  # seeds of a seeded strategy (random, random_protected, protect_spread_random); see the module note
DEFAULT_DTYPE = default("dtype", context="pruning")  # the chapter's scoring precision (bench_book_precision holds it)


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
    blocks = strategy_names(BLOCK)   # a block sweep takes block strategies only
    unknown = [s for s in names if s not in blocks]
    if unknown:
        raise StrategyError(f"unknown strateg{'y' if len(unknown) == 1 else 'ies'} {unknown}; "
                            f"available: {', '.join(blocks)}")
    return names


def _check_k_max(k_max, chosen: list[Strategy], n_blocks: int) -> None:
    check_int(k_max, "k_max", min=1)
    for strategy in chosen:
        cap = strategy.max_k(n_blocks)
        if k_max > cap:
            raise ValueError(f"k_max={k_max} is too large: strategy {strategy.name!r} may remove at most "
                             f"{cap} of this model's {n_blocks} blocks (at least 2 remain, and protected "
                             f"blocks are never removed)")


def plan_strategies(ctx: PruningContext, strategies: Sequence[str], k_max: int,
                    seeds: int = DEFAULT_SEEDS) -> pd.DataFrame:
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


def plan_arms(ctx: PruningContext, strategies: Sequence[str], k_values: Sequence[int], seeds: int) -> pd.DataFrame:
    """The removal sets of ``strategies`` at each of ``k_values`` (every seed of a seeded one):
    ``strategy, seed, k, removed`` (``removed``: blocks in the strategy's order)."""
    rows = []
    for name in strategies:
        strategy = get_strategy(name)
        for seed in range(seeds if strategy.seeded else 1):
            plans = strategy.plan(ctx, max(k_values), seed)
            rows += [dict(strategy=name, seed=seed, k=int(k), removed=format_removed(plans[k - 1])) for k in k_values]
    return pd.DataFrame(rows, columns=["strategy", "seed", "k", "removed"])


def canonical_removed(text: str) -> str:
    """A ``removed`` entry as a set: its blocks sorted (``"27,25,23"`` -> ``"23,25,27"``)."""
    return format_removed(sorted(parse_removed(text)))


def _scored_sets(subject: Subject, windows: Windows, sets: list[tuple[int, ...]], *, batch_size: int,
                 cache: bool, progress: bool) -> dict[tuple[int, ...], np.ndarray]:
    """Per-window NLL sums of each removal set on ``windows``; stored sets are not rescored."""
    distinct = list(dict.fromkeys(sets))
    nll = score_windows(subject, windows, distinct, batch_size=batch_size, cache=cache, progress=progress,
                        desc="pruned models")["nll"]
    return {s: nll[j] for j, s in enumerate(distinct)}


@dataclass
class PruningResult:
    """A pruning sweep: the table (one row per strategy, seed and k) and the long table of
    per-window NLL that every interval is resampled from."""

    table: pd.DataFrame          # COLUMNS
    window_losses: pd.DataFrame  # WINDOW_COLUMNS: one row per distinct removal set and window


def pruning_sweep(model: nn.Module | Subject, eval_windows: Windows, calibration_windows: Windows | None = None, *,
                  strategies: Sequence[str] | str = DEFAULT_STRATEGIES, k_max: int = 8, seeds: int = DEFAULT_SEEDS,
                  alpha: pd.DataFrame | None = None, batch_size: int = 8, cache: bool = True,
                  progress: bool = True, model_name: str | None = None,
                  dtype: str | None = None) -> PruningResult:
    """ΔPPL of each strategy's removal of k = 1..k_max blocks, on ``eval_windows``.

    ``table``, one row per (strategy, seed, k):

    ==============  =====================================================================
    ``model``       ``model_name``, or the model's ``name_or_path``
    ``strategy``    strategy name (``zones.pruning.available_strategies()``)
    ``k``           number of blocks removed
    ``seed``        the seed of a seeded strategy (``random``: 0..seeds−1); 0 otherwise
    ``removed``     the removed blocks, comma-separated, in the order the strategy chose
                    them (``"27,25,23"``; ``parse_removed`` reads it back)
    ``ppl``         perplexity of the pruned model on the eval windows
    ``base_ppl``    perplexity of the full model on the same tokens
    ``delta_ppl``   ``ppl − base_ppl``
    ``delta_loss``  ``ln(ppl / base_ppl)``: the rise in mean token loss, nats
    ``delta_loss_low``, ``delta_loss_high``: its paired 95% interval over eval windows (as
                    ``zones ablate``'s; ``zones.measure.bootstrap.delta_loss_interval``)
    ``n_tokens``    scored tokens
    ==============  =====================================================================

    ``window_losses``, one row per distinct removal set and eval window: ``removed`` (the set,
    blocks sorted; ``""`` is the full model), ``window`` (index in ``eval_windows``), ``nll``
    (summed next-token NLL, nats), ``n_tokens``.

    The baselines that measure activations use ``calibration_windows`` only. ``alpha`` is
    the α table of ``zones.spectra.alpha_table`` (computed when ``None``). ``dtype`` is the
    scoring precision (``zones.measure.subject``: float32 when None, bfloat16, or auto), for
    the eval windows and the calibration measurements alike. Arguments are checked (strategy names, ``k_max``
    against every strategy's removable blocks, windows against the model) before any
    forward pass. With ``cache=True`` every scored removal set is journaled, so an
    interrupted run resumes and overlapping runs share work. A non-finite loss is an error.
    """
    names = check_strategy_names(strategies)
    chosen = [get_strategy(s) for s in names]
    subject = as_subject(model, dtype)
    n_blocks = subject.n_blocks
    _check_k_max(k_max, chosen, n_blocks)
    check_int(seeds, "seeds", min=1)
    for label, windows in (("eval_windows", eval_windows), ("calibration_windows", calibration_windows)):
        if windows is None and label == "calibration_windows":
            needing = [s.name for s in chosen if s.uses_calibration]
            if needing:
                raise ValueError(f"strategies {needing} need calibration_windows")
            continue
        if not isinstance(windows, Windows):
            raise TypeError(f"{label} must be zones.core.data.Windows (from corpus_windows), not {type(windows).__name__}")
        if windows.n_windows == 0 or windows.seq_len < 2:
            raise ValueError(f"{label} score no tokens")
        subject.check_fit(windows)
    check_int(batch_size, "batch_size", min=1)
    if alpha is not None and not isinstance(alpha, pd.DataFrame):
        raise TypeError(f"alpha must be an α table (pandas DataFrame) or None, not {type(alpha).__name__}")

    ctx = PruningContext(subject, calibration_windows, alpha=alpha, batch_size=batch_size, cache=cache,
                         progress=progress)
    plans = plan_strategies(ctx, names, k_max, seeds)
    plans["set"] = [tuple(sorted(parse_removed(r))) for r in plans["removed"]]
    sets = [()] + sorted(set(plans["set"]))
    scored = _scored_sets(subject, eval_windows, sets, batch_size=batch_size, cache=cache, progress=progress)
    n_window_tokens = eval_windows.seq_len - 1
    n_tokens = n_window_tokens * eval_windows.n_windows
    loss = {s: float(scored[s].sum() / n_tokens) for s in sets}
    tokens = np.full(eval_windows.n_windows, n_window_tokens)
    interval = delta_loss_interval(np.stack([scored[s] for s in sets[1:]]), scored[()], tokens) if len(sets) > 1 \
        else None
    low = {s: float(interval.low[i]) for i, s in enumerate(sets[1:])} if interval is not None else {}
    high = {s: float(interval.high[i]) for i, s in enumerate(sets[1:])} if interval is not None else {}
    out = plans.assign(
        model=model_name or str(getattr(getattr(subject.model, "config", None), "name_or_path", "")
                                or type(subject.model).__name__),
        ppl=[float(np.exp(loss[s])) for s in plans["set"]],
        base_ppl=float(np.exp(loss[()])),
        delta_loss=[loss[s] - loss[()] for s in plans["set"]],
        delta_loss_low=[low.get(s, np.nan) for s in plans["set"]],
        delta_loss_high=[high.get(s, np.nan) for s in plans["set"]],
        n_tokens=n_tokens,
    )
    out["delta_ppl"] = out["ppl"] - out["base_ppl"]
    window_losses = pd.DataFrame([dict(removed=format_removed(s), window=w, nll=float(v), n_tokens=n_window_tokens)
                                  for s in sets for w, v in enumerate(scored[s])], columns=WINDOW_COLUMNS)
    return PruningResult(out[COLUMNS].reset_index(drop=True), window_losses)


def pruning_table(model: nn.Module, eval_windows: Windows, calibration_windows: Windows | None = None,
                  **kwargs) -> pd.DataFrame:
    """The ``table`` of :func:`pruning_sweep` (same arguments)."""
    return pruning_sweep(model, eval_windows, calibration_windows, **kwargs).table
