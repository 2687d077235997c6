"""Reading a pruning sweep (``zones.pruning.sweep``): every interval from the same resamples
of the eval windows.

``summarize_pruning`` gives each (strategy, k) its Δloss and ΔPPL with paired bootstrap
intervals (seeded strategies by their median over seeds, inside every resample too);
``pairwise_differences`` the difference of every pair of strategies; ``best_sets`` the
strategies not separable from the best and from the worst; ``compare_strategies`` the ratio
ΔPPL(a) / ΔPPL(b) with its interval and a winner; ``read_crossover`` (the one crossover rule),
``crossover_k`` and ``best_by_k`` read those; ``gain_share`` how much of zone-aware's advantage over a
reference a baseline without α achieves; ``pair_at_k`` two strategies at one k, from their sweep to
those numbers (the across-models chapter's comparison).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from zones.analysis.unit_intervals import interval_side
from zones.measure.bootstrap import LEVEL, N_RESAMPLES, SEED, paired_bootstrap
from zones.pruning.sweep import WINDOW_COLUMNS, canonical_removed, pruning_sweep

COLLAPSE_RATIO = 1e3  # a ΔPPL ratio above this says one arm collapsed, not how much better the other is
PRUNED = "pruned"     # the stage of a healing comparison before healing


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
    """Δloss and ΔPPL of each strategy from :meth:`_Windows.arrays` (with any resample axes
    between the seeds and the windows). A seeded strategy's Δloss is its median over seeds,
    and its ΔPPL the perplexity change at that median loss: one statistic decides, so ΔPPL
    orders the strategies as Δloss does (with an even number of seeds the median of the seeds'
    ΔPPL could name another winner; with an odd number both are the middle seed's)."""
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
        with np.errstate(over="ignore"):
            out[1][seeded] = np.exp(np.nanmedian(loss[seeded], axis=1)) - np.exp(base)
    return out


def _ppl_at_median(rows: pd.DataFrame) -> float:
    """ΔPPL of one (strategy, k) at its median Δloss over seeds (:func:`_deltas`' point value):
    the middle seed's ΔPPL for an odd count, the perplexity change at the mean of the two
    middle Δloss for an even one."""
    delta = rows["delta_loss"].to_numpy(dtype=float)
    if len(delta) % 2:
        return float(rows["delta_ppl"].to_numpy(dtype=float)[np.argsort(delta, kind="stable")[len(delta) // 2]])
    return float(rows["base_ppl"].iloc[0] * np.expm1(np.median(delta)))


def _ks_and_names(table: pd.DataFrame, strategies: Sequence[str] | None) -> tuple[list[int], list[str]]:
    names = list(dict.fromkeys(table["strategy"])) if strategies is None else list(strategies)
    missing = [s for s in names if s not in set(table["strategy"])]
    if missing:
        raise ValueError(f"strategies {missing} are not in the table; it has {list(dict.fromkeys(table['strategy']))}")
    return sorted(int(k) for k in table["k"].unique()), names


def summarize_pruning(table: pd.DataFrame, window_losses: pd.DataFrame | None = None, *,
                      n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """One row per (strategy, k), seeds pooled. Strategy order is the table's.

    ``delta_loss`` (nats, ln PPL ratio): the median over seeds (the value itself for an unseeded
    strategy), and ``delta_ppl``, the perplexity change at that median (so ΔPPL and Δloss name
    the same winner), each with its ``level`` paired bootstrap interval over eval windows
    (``_low``, ``_high``; the median over seeds inside every resample; NaN without
    ``window_losses`` or with one window); ``delta_ppl_mean``, ``delta_ppl_q25``,
    ``delta_ppl_q75``, ``delta_ppl_min``, ``delta_ppl_max`` over seeds; ``ppl`` (median),
    ``base_ppl``, ``n_seeds``.
    """
    order = list(dict.fromkeys(table["strategy"]))
    if "delta_loss" not in table.columns:  # a table written before the column existed
        table = table.assign(delta_loss=np.log(table["ppl"] / table["base_ppl"]))
    q = lambda p: (lambda x: float(np.quantile(x, p)))
    groups = table.groupby(["strategy", "k"], sort=False)
    out = (groups
           .agg(delta_loss=("delta_loss", "median"), delta_ppl=("delta_ppl", "median"),
                delta_ppl_mean=("delta_ppl", "mean"), delta_ppl_q25=("delta_ppl", q(0.25)),
                delta_ppl_q75=("delta_ppl", q(0.75)), delta_ppl_min=("delta_ppl", "min"),
                delta_ppl_max=("delta_ppl", "max"), ppl=("ppl", "median"), base_ppl=("base_ppl", "first"),
                n_seeds=("seed", "nunique"))
           .reset_index())
    at_median = groups[["delta_loss", "delta_ppl", "base_ppl"]].apply(_ppl_at_median)
    out["delta_ppl"] = [float(at_median.loc[(s, k)]) for s, k in zip(out["strategy"], out["k"])]
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


def reference_comparisons(table: pd.DataFrame, window_losses: pd.DataFrame, ours: str,
                          references: Sequence[str]) -> pd.DataFrame:
    """:func:`compare_strategies` ``(reference, ours)`` for each reference present, stacked:
    ``reference, ours, k, reference_delta_ppl, ours_delta_ppl, ratio, ratio_low, ratio_high,
    status, winner`` (ratio = ΔPPL(reference) / ΔPPL(ours): above 1, ours removed blocks more
    cheaply)."""
    present = set(table["strategy"])
    parts = []
    for reference in [r for r in references if r in present and r != ours]:
        c = compare_strategies(table, reference, ours, window_losses)
        parts.append(c.rename(columns={reference: "reference_delta_ppl", ours: "ours_delta_ppl"})
                     .assign(reference=reference, ours=ours)
                     [["reference", "ours", "k", "reference_delta_ppl", "ours_delta_ppl", "ratio", "ratio_low",
                       "ratio_high", "status", "winner"]])
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(
        columns=["reference", "ours", "k", "reference_delta_ppl", "ours_delta_ppl", "ratio", "ratio_low",
                 "ratio_high", "status", "winner"])


def worst_best_gaps(table: pd.DataFrame, window_losses: pd.DataFrame, best: pd.DataFrame) -> pd.DataFrame:
    """Per k, how many times the worst strategy's ΔPPL is the best's, with its paired interval:
    :func:`best_sets` columns plus ``worst_best_ratio, worst_best_ratio_low, worst_best_ratio_high,
    gap_status`` (``compare_strategies(worst, best)`` at that k; ``collapsed`` where the best's
    ΔPPL interval reaches 0 or the ratio exceeds the collapse limit)."""
    out = best.copy()
    cache: dict[tuple[str, str], pd.DataFrame] = {}
    ratio, low, high, status = [], [], [], []
    for row in best.itertuples():
        key = (row.worst, row.best)
        if row.worst == row.best:
            ratio.append(1.0), low.append(1.0), high.append(1.0), status.append("ratio")
            continue
        if key not in cache:
            cache[key] = compare_strategies(table, row.worst, row.best, window_losses).set_index("k")
        at = cache[key].loc[row.k]
        ratio.append(float(at["ratio"])), low.append(float(at["ratio_low"])), high.append(float(at["ratio_high"]))
        status.append(str(at["status"]))
    return out.assign(worst_best_ratio=ratio, worst_best_ratio_low=low, worst_best_ratio_high=high, gap_status=status)


CROSSES, NO_CROSSOVER, UNDECIDED = "crosses", "no crossover", "undecided"   # what read_crossover decides
TIES = ("tie", "neither")   # compare_strategies' and reference_comparisons' word for "no separable winner"


@dataclass(frozen=True)
class Crossover:
    """Where ``ours`` overtakes a reference over k (:func:`read_crossover`): ``status``
    (:data:`CROSSES`, :data:`NO_CROSSOVER` or :data:`UNDECIDED`), ``why`` (a few words: why not,
    or what hides it), ``ahead_from`` (the k from which ours is ahead when it crosses, else
    ``None``) and the k at which ours is ``ahead``, ``behind`` or ``tied`` (neither separable)."""

    status: str
    why: str
    ahead_from: int | None
    ahead: tuple[int, ...]
    behind: tuple[int, ...]
    tied: tuple[int, ...]


def read_crossover(winners: Mapping[int, str], ours: str = "zone_aware", comparator: str | None = None) -> Crossover:
    """The one rule for a crossover, read from ``winners`` (k → the separable winner at k:
    ``ours``, the comparator, or a tie, :data:`TIES`). ``comparator=None``: any other winner is
    the comparator. Ours *crosses* when the comparator wins at some k, ours wins at the largest k,
    and every win of ours comes after the comparator's last win; a tie there does not break it
    (an overtaking seen through intervals may pass through ties). No crossover when ours wins at
    the smallest k and is never behind, when the comparator wins at the largest k, or when a win
    of ours comes before a win of the comparator (they trade places). Undecided otherwise (ties
    hide whether, or where, they cross). The pruning page and the scorecard
    (``zones.report.verdicts.score_crossover``) both read it, so they say the same."""
    ks = sorted(int(k) for k in winners)
    word = {int(k): str(w) for k, w in winners.items()}
    ahead = tuple(k for k in ks if word[k] == ours)
    behind = tuple(k for k in ks if word[k] != ours and word[k] not in TIES
                   and (comparator is None or word[k] == comparator))
    tied = tuple(k for k in ks if k not in ahead and k not in behind)
    found = dict(ahead=ahead, behind=behind, tied=tied, ahead_from=None)
    if not ks:
        return Crossover(UNDECIDED, "no k was compared", **found)
    if behind and behind[-1] == ks[-1]:
        return Crossover(NO_CROSSOVER, "behind at the largest k", **found)
    if not behind and ahead and ahead[0] == ks[0]:
        return Crossover(NO_CROSSOVER, "ahead from the smallest k, never behind", **found)
    if behind and ahead and ahead[0] < behind[-1]:
        return Crossover(NO_CROSSOVER, "they trade places", **found)
    if behind and ahead and ahead[-1] == ks[-1]:
        return Crossover(CROSSES, "", **dict(found, ahead_from=ahead[0]))
    return Crossover(UNDECIDED, "ties hide whether, or where, they cross", **found)


def crossover_k(comparison: pd.DataFrame, winner: str = "zone_aware") -> int | None:
    """The k from which ``winner`` is ahead where it crosses over (:func:`read_crossover` of the
    comparison's ``k`` → ``winner`` column; a tie after the other's last win does not move it);
    ``None`` where it does not (always ahead, never ahead at the end, trading places) or where
    ties leave it undecided."""
    return read_crossover(dict(zip(comparison["k"], comparison["winner"])), winner).ahead_from


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


def healing_intervals(arms: pd.DataFrame, window_losses: pd.DataFrame, stages: Sequence[str], *, reference: str,
                      ours: str, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
                      seed: int = SEED) -> dict[str, pd.DataFrame]:
    """Every interval of a healing comparison from one paired bootstrap over the eval windows.

    ``arms``: ``strategy, seed, k, removed`` (each strategy's plan per seed and k).
    ``window_losses``: ``stage, removed, window, nll, n_tokens`` (``stage`` ``"full"`` for the
    full model, :data:`PRUNED` before healing, else the healing method). Returns

    * ``delta``: ``strategy, k, stage, delta_loss, delta_loss_low, delta_loss_high, delta_ppl,
      n_seeds`` (Δloss in nats against the full model; the median over seeds);
    * ``gain``: ``strategy, k, method, gain, gain_low, gain_high`` (Δloss after − before;
      negative: healing helped);
    * ``comparison``: ``k, stage, reference, ours, difference, difference_low,
      difference_high, winner`` (difference = Δloss(reference) − Δloss(ours); winner is the
      strategy whose interval side it is on, or ``"neither"``).
    """
    full = window_losses[window_losses["stage"] == "full"].sort_values("window")
    tokens = full["n_tokens"].to_numpy(dtype=np.float64)
    pivot = window_losses[window_losses["stage"] != "full"].pivot_table(
        index=["stage", "removed"], columns="window", values="nll")
    keys = list(pivot.index)
    data = np.vstack([full["nll"].to_numpy()[None], pivot.to_numpy()])
    row = {key: i + 1 for i, key in enumerate(keys)}
    groups, labels = [], []
    for (strategy, k), part in arms.groupby(["strategy", "k"], sort=False):
        for stage in stages:
            groups.append([row[(stage, canonical_removed(r))] for r in part["removed"]])
            labels.append(("delta", strategy, int(k), stage, len(part)))
    index = {label[1:4]: i for i, label in enumerate(labels)}
    pairs = []
    for (strategy, k, stage, _), i in ((label[1:], i) for i, label in enumerate(labels)):
        if stage != PRUNED:
            pairs.append((("gain", strategy, k, stage), i, index[(strategy, k, PRUNED)]))
    for k in sorted(arms["k"].unique()):
        for stage in stages:
            if (reference, int(k), stage) in index and (ours, int(k), stage) in index:
                pairs.append((("comparison", None, int(k), stage), index[(reference, int(k), stage)],
                              index[(ours, int(k), stage)]))

    def statistic(nll, n):
        # (variants, [resamples,] windows): the resamples sit between variants and windows
        loss = nll.sum(-1) / n.sum(-1)                       # (variants, [resamples])
        delta = loss[1:] - loss[:1]
        medians = np.stack([np.median(delta[[g - 1 for g in group]], axis=0) for group in groups])
        diffs = np.stack([medians[a] - medians[b] for _, a, b in pairs]) if pairs else medians[:0]
        return np.concatenate([medians, diffs])

    interval = paired_bootstrap(statistic, (data, np.broadcast_to(tokens, data.shape)), n_resamples=n_resamples,
                                level=level, seed=seed)
    est, low, high = interval.estimate, interval.low, interval.high
    base = float(full["nll"].sum() / tokens.sum())
    delta = pd.DataFrame([dict(strategy=s, k=k, stage=stage, delta_loss=est[i], delta_loss_low=low[i],
                               delta_loss_high=high[i], delta_ppl=float(np.exp(base + est[i]) - np.exp(base)),
                               n_seeds=n) for i, (_, s, k, stage, n) in enumerate(labels)])
    offset = len(labels)
    gain = pd.DataFrame([dict(strategy=s, k=k, method=stage, gain=est[offset + j], gain_low=low[offset + j],
                              gain_high=high[offset + j])
                         for j, ((kind, s, k, stage), _, _) in enumerate(pairs) if kind == "gain"],
                        columns=["strategy", "k", "method", "gain", "gain_low", "gain_high"])
    comparison = []
    for j, ((kind, _, k, stage), _, _) in enumerate(pairs):
        if kind != "comparison":
            continue
        side = interval_side(low[offset + j], high[offset + j], 0.0)
        comparison.append(dict(k=k, stage=stage, reference=reference, ours=ours, difference=est[offset + j],
                               difference_low=low[offset + j], difference_high=high[offset + j],
                               winner={"above": ours, "below": reference}.get(side, "neither")))
    comparison = pd.DataFrame(comparison, columns=["k", "stage", "reference", "ours", "difference",
                                                   "difference_low", "difference_high", "winner"])
    return dict(delta=delta, gain=gain, comparison=comparison)


NAN_SHARE = float("nan")
SHARE_KS = (4, 8)   # the k at which the share of zone-aware's gain is read (those a sweep reached)
SHARE_COLUMNS = ["k", "reference", "ours", "baseline", "gain", "gain_low", "gain_high", "baseline_gain",
                 "baseline_gain_low", "baseline_gain_high", "share", "share_low", "share_high", "status", "note"]


def gain_share(table: pd.DataFrame, window_losses: pd.DataFrame, *, comparator: str = "last_n_keep_last",
               ours: str = "zone_aware", baselines: Sequence[str] = ("protect_spread",),
               ks: Sequence[int] = SHARE_KS, n_resamples: int = N_RESAMPLES, level: float = LEVEL,
               seed: int = SEED) -> pd.DataFrame:
    """How much of ``ours``' advantage over ``comparator`` a ``baseline`` achieves alone:

        share = (Δloss(comparator) − Δloss(baseline)) / (Δloss(comparator) − Δloss(ours))

    at each k of ``ks`` the table has, with paired intervals from one bootstrap of the eval
    windows (the same windows for every arm; seeded strategies by their median over seeds).
    Share 1: the baseline does as well as ``ours``; 0: no better than ``comparator``.

    Columns ``k``, ``reference`` (the comparator), ``ours``, ``baseline``; ``gain`` (the denominator)
    and ``baseline_gain`` (the numerator), nats, each with ``_low``/``_high``; ``share, share_low,
    share_high``;
    ``status``: ``"share"``, or ``"no gain"`` where the gain's interval reaches 0 or below (a
    ratio to a gain that may be zero is no number: share and its interval are NaN and
    ``note`` says why), or ``"undefined"`` (an interval could not be computed).
    """
    present = set(table["strategy"])
    missing = [s for s in (comparator, ours, *baselines) if s not in present]
    if missing:
        raise ValueError(f"strategies {missing} are not in the pruning table; it has {sorted(present)}")
    data = _Windows(window_losses)
    rows = []
    for k in [int(k) for k in ks if (table["k"] == k).any()]:
        names = [comparator, ours, *baselines]

        def statistic(x):
            delta = _deltas(x)[0]
            gain = delta[0] - delta[1]
            made = delta[0] - delta[2:]
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.concatenate([gain[None], made, made / gain])

        interval = paired_bootstrap(statistic, (data.arrays(table, k, names),), n_resamples=n_resamples,
                                    level=level, seed=seed)
        est, low, high = interval.estimate, interval.low, interval.high
        nb = len(baselines)
        gain_side = interval_side(float(low[0]), float(high[0]), 0.0)
        for j, baseline in enumerate(baselines):
            row = dict(k=k, reference=comparator, ours=ours, baseline=baseline, gain=float(est[0]),
                       gain_low=float(low[0]), gain_high=float(high[0]), baseline_gain=float(est[1 + j]),
                       baseline_gain_low=float(low[1 + j]), baseline_gain_high=float(high[1 + j]))
            if gain_side == "above":
                share = (float(est[1 + nb + j]), float(low[1 + nb + j]), float(high[1 + nb + j]))
                status, note = "share", ""
            else:
                share = (NAN_SHARE, NAN_SHARE, NAN_SHARE)
                status = "undefined" if gain_side == "undefined" else "no gain"
                note = (f"{ours}'s advantage over {comparator} at k = {k} has no interval, so no share of it can be "
                        f"given" if status == "undefined" else
                        f"{ours}'s advantage over {comparator} at k = {k} is not separable from zero (its interval "
                        f"reaches {float(low[0]):.3g} nats), so a share of it is no number")
            rows.append(dict(row, share=share[0], share_low=share[1], share_high=share[2], status=status, note=note))
    return pd.DataFrame(rows, columns=SHARE_COLUMNS)



# --- two strategies at one k, from the sweep to the numbers ----------------------------------------

def pair_at_k(model, windows, strategies: Sequence[str], k: int, *, alpha: pd.DataFrame | None = None,
              batch_size: int = 8, model_name: str | None = None, n_resamples: int = N_RESAMPLES, seed: int = SEED,
              progress: bool = True) -> dict:
    """Two strategies ``(a, b)`` each removing ``k`` blocks, scored on the same ``windows``: the
    sweep of the two (``zones.pruning.pruning_sweep``: removal sets the loss store has are read,
    not scored again), each one's Δloss with its interval (:func:`summarize_pruning`), their paired
    difference Δloss(a) − Δloss(b) (:func:`pairwise_differences`) and the strategies not separable
    from the best (:func:`best_sets`), all from the same resamples of the windows.

    Returns ``k, n_tokens, a, a_low, a_high, b, b_low, b_high, diff, diff_low, diff_high`` and
    ``best_set`` (comma-separated, the best first)."""
    a, b = strategies
    swept = pruning_sweep(model, windows, None, strategies=[a, b], k_max=k, alpha=alpha, batch_size=batch_size,
                          model_name=model_name, progress=progress)
    table, losses = swept.table, swept.window_losses
    at = summarize_pruning(table, losses, n_resamples=n_resamples, seed=seed).set_index(["strategy", "k"])
    pair = pairwise_differences(table, losses, strategies=[a, b], n_resamples=n_resamples, seed=seed)
    pair = pair[pair["k"] == k].iloc[0]
    sign = 1.0 if pair["strategy_a"] == a else -1.0   # the difference is always a − b
    diff_low, diff_high = sorted((sign * float(pair["diff_low"]), sign * float(pair["diff_high"])))
    best = best_sets(table, losses, strategies=[a, b], n_resamples=n_resamples, seed=seed)
    first, second = at.loc[(a, k)], at.loc[(b, k)]
    return dict(k=k, n_tokens=int(table["n_tokens"].iloc[0]),
                a=float(first["delta_loss"]), a_low=float(first["delta_loss_low"]),
                a_high=float(first["delta_loss_high"]), b=float(second["delta_loss"]),
                b_low=float(second["delta_loss_low"]), b_high=float(second["delta_loss_high"]),
                diff=sign * float(pair["diff"]), diff_low=diff_low, diff_high=diff_high,
                best_set=str(best.loc[best["k"] == k, "best_set"].iloc[0]))
