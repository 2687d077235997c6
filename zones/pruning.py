"""Depth pruning: how much perplexity rises when k decoder blocks are removed, as chosen by
each strategy (``zones.strategies``), for k = 1..k_max.

Protocol. Every strategy plans its removals first (the baselines look only at the
calibration windows); then every distinct removal set is scored on the same eval windows
as the full model: ΔPPL = PPL(pruned) − PPL(full), PPL = exp(mean token cross-entropy)
(``zones.evaluate`` protocol). A removed block's output is its input.

Speed. Removal sets are scored along a prefix tree (``zones.evaluate.evaluate_removals``):
consecutive sets share the hidden states up to the first block where they differ, and the
nested sets of one strategy (k and k + 1 differ by one block) mostly share their path.

Evidence. Every scored set keeps its NLL on every eval window (``PruningResult.window_losses``),
so each (strategy, k) gets paired bootstrap intervals over windows (``zones.stats``): Δloss =
ln(PPL_pruned / PPL_base) in nats and ΔPPL; every pair of strategies gets an interval on the
difference of their Δloss, from the same resamples; "best at k" is the set of strategies not
separable from the best. Seeded strategies (``random``, ``random_protected``) run 20 seeds by
default and are summarised by their median (inside every resample too) and interquartile range.
A base or pruned loss that is not finite is an error naming the removal set and the window.

Caching. Each scored set is appended, complete, to a journal keyed by the model's and the
eval windows' fingerprints; a rerun scores only the sets it has not seen, so an interrupted
run resumes and a new strategy pays only for its new sets. Greedy search steps, the
calibration hidden-state statistics and the calibration ablation are cached likewise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
from torch import nn
from tqdm.auto import tqdm

from .adapters import get_adapter
from .cache import Journal, entry_path
from .data import Windows
from .evaluate import DEFAULT_DTYPE, check_dtype, check_fit, evaluate_removals, model_device, tree_order
from .stats import LEVEL, N_RESAMPLES, SEED, paired_bootstrap
from .strategies import STRATEGIES, PruningContext, Strategy, StrategyError, get_strategy

VERSION = "2"
COLUMNS = ["model", "strategy", "k", "seed", "removed", "ppl", "base_ppl", "delta_ppl", "delta_loss", "n_tokens"]
WINDOW_COLUMNS = ["removed", "window", "nll", "n_tokens"]
DEFAULT_STRATEGIES = ("zone_aware", "last_n", "last_n_keep_last", "random", "random_protected", "alpha_lowest",
                      "block_influence", "angular", "ablation_rank", "greedy")
RECIPE_ABLATIONS = ("zone_aware_no_protection", "zone_aware_no_spreading", "zone_aware_one_zone")
# The chapter's CPU budgets (seq_len 256): 12 eval windows, 2 calibration windows. A GPU run
# should use 64 eval windows and 32 calibration windows (book/methods/pruning.md).
DEFAULT_EVAL_TOKENS = 12 * 255
DEFAULT_CALIBRATION_TOKENS = 2 * 255
DEFAULT_SEEDS = 20  # seeds of a seeded strategy (random, random_protected)
SETS_PER_PASS = 32  # removal sets scored per trace of the eval windows (and journaled together)
COLLAPSE_RATIO = 1e3  # a ΔPPL ratio above this says one arm collapsed, not how much better the other is


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


def canonical_removed(text: str) -> str:
    """A ``removed`` entry as a set: its blocks sorted (``"27,25,23"`` -> ``"23,25,27"``)."""
    return format_removed(sorted(parse_removed(text)))


def _scored_sets(model: nn.Module, windows: Windows, sets: list[tuple[int, ...]], *, batch_size: int,
                 cache: bool, progress: bool, dtype: str) -> dict[tuple[int, ...], np.ndarray]:
    """Per-window NLL sums of each removal set on ``windows``; journaled sets are not rescored."""
    from .models import model_fingerprint

    journal = None
    known: dict[tuple[int, ...], np.ndarray] = {}
    if cache:
        key = dict(kind="pruning-losses", version=VERSION, model=model_fingerprint(model),
                   windows=windows.fingerprint, n_windows=windows.n_windows, batch_size=batch_size, dtype=dtype,
                   weights_dtype=str(next(model.parameters()).dtype), device=model_device(model).type)
        journal = Journal(entry_path("pruning-losses", key, ext="jsonl"), required=("removed", "window_nll"))
        known = {tuple(row["removed"]): np.asarray(row["window_nll"], dtype=np.float64) for row in journal.rows()}
    todo = [s for s in dict.fromkeys(sets) if s not in known]
    # Chunks follow the prefix-tree order, so each chunk shares as much as it can.
    todo = [todo[j] for j in tree_order(todo, get_adapter(model).n_blocks)]
    bar = tqdm(total=len(todo), desc=f"pruned models ({dtype})", unit="set", disable=not progress or not todo)
    for start in range(0, len(todo), SETS_PER_PASS):
        chunk = todo[start:start + SETS_PER_PASS]
        results = evaluate_removals(model, windows, chunk, batch_size=batch_size, progress=progress, dtype=dtype)
        for removed, result in zip(chunk, results):
            known[removed] = result.window_nll
            if journal is not None:
                journal.append(dict(removed=list(removed), loss=result.loss, n_tokens=result.n_tokens,
                                    window_nll=result.window_nll.tolist()))
        bar.update(len(chunk))
    bar.close()
    return {s: known[s] for s in sets}


@dataclass
class PruningResult:
    """A pruning sweep: the table (one row per strategy, seed and k) and the long table of
    per-window NLL that every interval is resampled from."""

    table: pd.DataFrame          # COLUMNS
    window_losses: pd.DataFrame  # WINDOW_COLUMNS: one row per distinct removal set and window


def pruning_sweep(model: nn.Module, eval_windows: Windows, calibration_windows: Windows | None = None, *,
                  strategies: Sequence[str] | str = DEFAULT_STRATEGIES, k_max: int = 8, seeds: int = DEFAULT_SEEDS,
                  alpha: pd.DataFrame | None = None, batch_size: int = 8, cache: bool = True,
                  progress: bool = True, model_name: str | None = None,
                  dtype: str = DEFAULT_DTYPE) -> PruningResult:
    """ΔPPL of each strategy's removal of k = 1..k_max blocks, on ``eval_windows``.

    ``table``, one row per (strategy, seed, k):

    ==============  =====================================================================
    ``model``       ``model_name``, or the model's ``name_or_path``
    ``strategy``    strategy name (``zones.strategies.available_strategies()``)
    ``k``           number of blocks removed
    ``seed``        the seed of a seeded strategy (``random``: 0..seeds−1); 0 otherwise
    ``removed``     the removed blocks, comma-separated, in the order the strategy chose
                    them (``"27,25,23"``; ``parse_removed`` reads it back)
    ``ppl``         perplexity of the pruned model on the eval windows
    ``base_ppl``    perplexity of the full model on the same tokens
    ``delta_ppl``   ``ppl − base_ppl``
    ``delta_loss``  ``ln(ppl / base_ppl)``: the rise in mean token loss, nats
    ``n_tokens``    scored tokens
    ==============  =====================================================================

    ``window_losses``, one row per distinct removal set and eval window: ``removed`` (the set,
    blocks sorted; ``""`` is the full model), ``window`` (index in ``eval_windows``), ``nll``
    (summed next-token NLL, nats), ``n_tokens``.

    The baselines that measure activations use ``calibration_windows`` only. ``alpha`` is
    the α table of ``zones.spectra.alpha_table`` (computed when ``None``). ``dtype`` is the
    scoring precision (``zones.evaluate``). Arguments are checked (strategy names, ``k_max``
    against every strategy's removable blocks, windows against the model) before any
    forward pass. With ``cache=True`` every scored removal set is journaled, so an
    interrupted run resumes and overlapping runs share work. A non-finite loss is an error.
    """
    names = check_strategy_names(strategies)
    chosen = [get_strategy(s) for s in names]
    n_blocks = get_adapter(model).n_blocks
    _check_k_max(k_max, chosen, n_blocks)
    if isinstance(seeds, bool) or not isinstance(seeds, (int, np.integer)) or seeds < 1:
        raise ValueError(f"seeds must be a positive integer, not {seeds!r}")
    dtype = check_dtype(dtype)
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
        check_fit(model, windows)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, not {batch_size!r}")
    if alpha is not None and not isinstance(alpha, pd.DataFrame):
        raise TypeError(f"alpha must be an α table (pandas DataFrame) or None, not {type(alpha).__name__}")

    ctx = PruningContext(model, calibration_windows, alpha=alpha, batch_size=batch_size, cache=cache,
                         progress=progress, dtype=dtype)
    plans = plan_strategies(ctx, names, k_max, seeds)
    plans["set"] = [tuple(sorted(parse_removed(r))) for r in plans["removed"]]
    sets = [()] + sorted(set(plans["set"]))
    scored = _scored_sets(model, eval_windows, sets, batch_size=batch_size, cache=cache, progress=progress,
                          dtype=dtype)
    n_window_tokens = eval_windows.seq_len - 1
    n_tokens = n_window_tokens * eval_windows.n_windows
    loss = {s: float(scored[s].sum() / n_tokens) for s in sets}
    out = plans.assign(
        model=model_name or str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__),
        ppl=[float(np.exp(loss[s])) for s in plans["set"]],
        base_ppl=float(np.exp(loss[()])),
        delta_loss=[loss[s] - loss[()] for s in plans["set"]],
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


# --------------------------------------------------------------------------------------------
# Reading the table: intervals from the same resamples of eval windows
# --------------------------------------------------------------------------------------------

class _Windows:
    """The long table as matrices: per-window NLL of each removal set, the base, the tokens."""

    def __init__(self, window_losses: pd.DataFrame):
        missing = set(WINDOW_COLUMNS) - set(window_losses.columns)
        if missing:
            raise ValueError(f"window_losses lacks column(s) {sorted(missing)}: pass PruningResult.window_losses")
        removed = window_losses["removed"].fillna("").astype(str)
        self.nll = window_losses.assign(removed=removed).pivot(index="removed", columns="window", values="nll")
        if "" not in self.nll.index:
            raise ValueError("window_losses has no rows for the full model (removed == '')")
        tokens = window_losses[removed == ""].sort_values("window")["n_tokens"].to_numpy(dtype=np.float64)
        self.base, self.tokens = self.nll.loc[""].to_numpy(), tokens

    def arrays(self, table: pd.DataFrame, k: int, names: Sequence[str]) -> np.ndarray:
        """(strategies + 2, seeds, windows): each strategy's seeds (NaN-padded), then the base
        (row ``S``) and the tokens (row ``S + 1``) in their first seed slot."""
        at_k = table[table["k"] == k]
        groups = [at_k[at_k["strategy"] == name].sort_values("seed")["removed"].map(canonical_removed).tolist()
                  for name in names]
        out = np.full((len(names) + 2, max(len(g) for g in groups), len(self.base)), np.nan)
        for i, group in enumerate(groups):
            missing = [g for g in group if g not in self.nll.index]
            if missing:
                raise ValueError(f"window_losses has no rows for removal sets {missing}: is it from another run?")
            out[i, :len(group)] = self.nll.loc[group].to_numpy()
        out[len(names), 0], out[len(names) + 1, 0] = self.base, self.tokens
        return out


def _deltas(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Δloss and ΔPPL of each strategy (median over seeds) from :meth:`_Windows.arrays`
    (with any resample axes between the seeds and the windows)."""
    s = x.shape[0] - 2
    sums = x.sum(-1)
    loss = sums[:s] / sums[s + 1, 0]
    base = sums[s, 0] / sums[s + 1, 0]
    with np.errstate(over="ignore"):
        delta, ppl = loss - base, np.exp(loss) - np.exp(base)
    out = delta[:, 0].copy(), ppl[:, 0].copy()
    if x.shape[1] > 1:  # the median over seeds, for the strategies that have more than one
        seeded = np.isfinite(x[:s, 1].reshape(s, -1)[:, 0])
        out[0][seeded] = np.nanmedian(delta[seeded], axis=1)
        out[1][seeded] = np.nanmedian(ppl[seeded], axis=1)
    return out


def _ks_and_names(table: pd.DataFrame, strategies: Sequence[str] | None) -> tuple[list[int], list[str]]:
    names = list(dict.fromkeys(table["strategy"])) if strategies is None else list(strategies)
    missing = [s for s in names if s not in set(table["strategy"])]
    if missing:
        raise ValueError(f"strategies {missing} are not in the table; it has {list(dict.fromkeys(table['strategy']))}")
    return sorted(int(k) for k in table["k"].unique()), names


def summarize_pruning(table: pd.DataFrame, window_losses: pd.DataFrame | None = None, *,
                      n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """One row per (strategy, k), seeds pooled. Strategy order is the table's.

    ``delta_loss`` (nats, ln PPL ratio) and ``delta_ppl``: the median over seeds (the value
    itself for an unseeded strategy), each with its ``level`` paired bootstrap interval over
    eval windows (``_low``, ``_high``; the median over seeds inside every resample; NaN
    without ``window_losses`` or with one window); ``delta_ppl_mean``, ``delta_ppl_q25``,
    ``delta_ppl_q75``, ``delta_ppl_min``, ``delta_ppl_max`` over seeds; ``ppl`` (median),
    ``base_ppl``, ``n_seeds``.
    """
    order = list(dict.fromkeys(table["strategy"]))
    if "delta_loss" not in table.columns:  # a table written before the column existed
        table = table.assign(delta_loss=np.log(table["ppl"] / table["base_ppl"]))
    q = lambda p: (lambda x: float(np.quantile(x, p)))
    out = (table.groupby(["strategy", "k"], sort=False)
           .agg(delta_loss=("delta_loss", "median"), delta_ppl=("delta_ppl", "median"),
                delta_ppl_mean=("delta_ppl", "mean"), delta_ppl_q25=("delta_ppl", q(0.25)),
                delta_ppl_q75=("delta_ppl", q(0.75)), delta_ppl_min=("delta_ppl", "min"),
                delta_ppl_max=("delta_ppl", "max"), ppl=("ppl", "median"), base_ppl=("base_ppl", "first"),
                n_seeds=("seed", "nunique"))
           .reset_index())
    out["strategy"] = pd.Categorical(out["strategy"], categories=order, ordered=True)
    out = out.sort_values(["strategy", "k"]).reset_index(drop=True)
    out["strategy"] = out["strategy"].astype(str)
    for column in ("delta_loss_low", "delta_loss_high", "delta_ppl_low", "delta_ppl_high"):
        out[column] = np.nan
    if window_losses is not None:
        data = _Windows(window_losses)
        for k in sorted(out["k"].unique()):
            rows = out.index[out["k"] == k]
            names = out.loc[rows, "strategy"].tolist()
            interval = paired_bootstrap(lambda x: np.concatenate(_deltas(x)), (data.arrays(table, k, names),),
                                        n_resamples=n_resamples, level=level, seed=seed)
            s = len(names)
            out.loc[rows, "delta_loss_low"], out.loc[rows, "delta_loss_high"] = interval.low[:s], interval.high[:s]
            out.loc[rows, "delta_ppl_low"], out.loc[rows, "delta_ppl_high"] = interval.low[s:], interval.high[s:]
    return out[["strategy", "k", "delta_loss", "delta_loss_low", "delta_loss_high", "delta_ppl", "delta_ppl_low",
                "delta_ppl_high", "delta_ppl_mean", "delta_ppl_q25", "delta_ppl_q75", "delta_ppl_min",
                "delta_ppl_max", "ppl", "base_ppl", "n_seeds"]]


def pairwise_differences(table: pd.DataFrame, window_losses: pd.DataFrame, *,
                         strategies: Sequence[str] | None = None, n_resamples: int = N_RESAMPLES,
                         level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """For every pair of strategies at each k, the difference of their Δloss with its paired
    interval (the same resamples of eval windows for both, and for every pair).

    Columns: ``k, strategy_a, strategy_b, diff`` (Δloss_a − Δloss_b, nats; seeded strategies
    by their median over seeds), ``diff_low, diff_high``, ``separable`` (the interval excludes
    0: a is better when ``diff_high < 0``, worse when ``diff_low > 0``).
    """
    ks, names = _ks_and_names(table, strategies)
    data = _Windows(window_losses)
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    rows = []
    for k in ks:
        present = [s for s in names if ((table["k"] == k) & (table["strategy"] == s)).any()]
        index = {s: i for i, s in enumerate(present)}
        here = [(a, b) for a, b in pairs if a in index and b in index]
        if not here:
            continue
        ia, ib = [index[a] for a, _ in here], [index[b] for _, b in here]
        def statistic(x):
            delta = _deltas(x)[0]
            return delta[ia] - delta[ib]

        interval = paired_bootstrap(statistic,
                                    (data.arrays(table, k, present),), n_resamples=n_resamples, level=level, seed=seed)
        for j, (a, b) in enumerate(here):
            rows.append(dict(k=k, strategy_a=a, strategy_b=b, diff=float(interval.estimate[j]),
                             diff_low=float(interval.low[j]), diff_high=float(interval.high[j])))
    out = pd.DataFrame(rows, columns=["k", "strategy_a", "strategy_b", "diff", "diff_low", "diff_high"])
    out["separable"] = (out["diff_low"] > 0) | (out["diff_high"] < 0)
    return out


def best_sets(table: pd.DataFrame, window_losses: pd.DataFrame, *, strategies: Sequence[str] | None = None,
              n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """Per k, the strategies not separable from the best, and from the worst.

    Columns: ``k``; ``best`` (lowest Δloss, seeded strategies by their median),
    ``best_delta_loss``; ``best_set`` (comma-separated, by Δloss: every strategy whose
    difference from the best has a ``level`` interval including 0, the best first);
    ``n_best``; ``worst, worst_delta_loss, worst_set, n_worst`` likewise. Without a
    resolvable interval (one window) a set holds only strategies tied with it exactly.
    """
    ks, names = _ks_and_names(table, strategies)
    data = _Windows(window_losses)
    rows = []
    for k in ks:
        present = [s for s in names if ((table["k"] == k) & (table["strategy"] == s)).any()]
        x = data.arrays(table, k, present)
        delta = _deltas(x)[0]
        order = sorted(range(len(present)), key=lambda i: (delta[i], present[i]))
        best, worst = order[0], order[-1]
        def statistic(y):
            d = _deltas(y)[0]
            return np.concatenate([d - d[best], d - d[worst]])

        interval = paired_bootstrap(statistic, (x,), n_resamples=n_resamples, level=level, seed=seed)
        s = len(present)

        def close(offset):
            low, high = interval.low[offset:offset + s], interval.high[offset:offset + s]
            est = interval.estimate[offset:offset + s]
            return [present[i] for i in order
                    if (low[i] <= 0 <= high[i]) or (np.isnan(low[i]) and est[i] == 0)]

        best_set, worst_set = close(0), close(s)[::-1]
        rows.append(dict(k=k, best=present[best], best_delta_loss=float(delta[best]), best_set=",".join(best_set),
                         n_best=len(best_set), worst=present[worst], worst_delta_loss=float(delta[worst]),
                         worst_set=",".join(worst_set), n_worst=len(worst_set)))
    return pd.DataFrame(rows)


def compare_strategies(table: pd.DataFrame, numerator: str = "last_n", denominator: str = "zone_aware",
                       window_losses: pd.DataFrame | None = None, *, n_resamples: int = N_RESAMPLES,
                       level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """ΔPPL(numerator) / ΔPPL(denominator) by k, with its paired interval.

    ``table`` is the pruning table (with ``window_losses``, for intervals) or its
    :func:`summarize_pruning` summary (point values only). Columns: ``k, numerator,
    denominator``, ``<numerator>, <denominator>`` (their ΔPPL, medians over seeds),
    ``ratio, ratio_low, ratio_high``; ``status``: ``"ratio"``, ``"collapsed"`` (the
    denominator's ΔPPL interval reaches 0, or the ratio exceeds ``COLLAPSE_RATIO``: the
    ratio then only says that one arm collapsed) or ``"n/a"`` (a ΔPPL is not positive);
    ``winner``: the denominator when the numerator's Δloss is separably higher (its paired
    difference interval lies above 0), the numerator when separably lower, else ``"tie"``
    (without intervals: the lower point ΔPPL). A ratio above 1 means the denominator
    (zone-aware) removed blocks more cheaply.
    """
    raw = "removed" in table.columns
    summary = summarize_pruning(table) if raw else table
    wide = summary.pivot(index="k", columns="strategy", values="delta_ppl")
    missing = [s for s in (numerator, denominator) if s not in wide.columns]
    if missing:
        raise ValueError(f"strategies {missing} are not in the table; it has {list(wide.columns)}")
    a, b = wide[numerator].to_numpy(), wide[denominator].to_numpy()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where((a > 0) & (b > 0), a / b, np.nan)
    nan = np.full(len(wide), np.nan)
    low, high, den_low, diff_low, diff_high = nan.copy(), nan.copy(), nan.copy(), nan.copy(), nan.copy()
    if raw and window_losses is not None:
        data = _Windows(window_losses)
        for i, k in enumerate(wide.index):
            def statistic(x):
                loss, ppl = _deltas(x)
                with np.errstate(divide="ignore", invalid="ignore"):
                    return np.stack([ppl[0] / ppl[1], ppl[1], loss[0] - loss[1]])
            interval = paired_bootstrap(statistic, (data.arrays(table, k, [numerator, denominator]),),
                                        n_resamples=n_resamples, level=level, seed=seed)
            low[i], high[i], den_low[i], diff_low[i], diff_high[i] = (
                interval.low[0], interval.high[0], interval.low[1], interval.low[2], interval.high[2])
    status = np.where(np.isnan(ratio), "n/a",
                      np.where((den_low <= 0) | (ratio > COLLAPSE_RATIO), "collapsed", "ratio"))
    low, high = np.where(status == "n/a", np.nan, low), np.where(status == "n/a", np.nan, high)
    if raw and window_losses is not None:
        winner = np.where(diff_low > 0, denominator, np.where(diff_high < 0, numerator, "tie"))
    else:
        winner = np.where(a > b, denominator, np.where(b > a, numerator, "tie"))
    return pd.DataFrame({"k": wide.index.astype(int), "numerator": numerator, "denominator": denominator,
                         numerator: a, denominator: b, "ratio": ratio, "ratio_low": low, "ratio_high": high,
                         "status": status, "winner": winner}).reset_index(drop=True)


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
