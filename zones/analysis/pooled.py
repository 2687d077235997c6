"""ρ(α, ΔLoss) over the runs of a trained series: per run, pooled over the seeds of a depth and
over every run, and how alike the seeds of one depth are.

Input: an importance table of several runs (``model, depth, seed, layer, delta_loss, alpha``,
as the depth-series chapter stacks ``zones.analysis.importance.importance_frame``). Every
interval resamples blocks (``zones.analysis.importance.spearman``).
"""
from __future__ import annotations

import itertools
from typing import Mapping

import numpy as np
import pandas as pd
from scipy.stats import rankdata

from zones.analysis.importance import Correlation, _corr_rows, spearman, spearman_rho, window_noise
from zones.measure.bootstrap import LEVEL, N_PERMUTATIONS, N_RESAMPLES, percentile_tails

RHO_RUN_COLUMNS = ["depth", "seed", "model", "n_blocks", "rho", "ci_low", "ci_high", "half_width", "p_value"]
POOLED_COLUMNS = ["depth", "n_runs", "n_blocks", "rho", "ci_low", "ci_high", "half_width", "p_value"]


def rho_by_run(importance: pd.DataFrame, *, windows: Mapping[str, pd.DataFrame | None] | None = None,
               n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ(α, ΔLoss) of each run, the tidy table the claims page scores.

    Columns ``RHO_RUN_COLUMNS``: ``depth, seed, model, n_blocks, rho, ci_low, ci_high``
    (bootstrap 95 % over blocks and, with ``windows`` (model label → its per-window ablation table),
    the eval windows behind ΔLoss), ``half_width`` ((high − low) / 2), ``p_value`` (two-sided
    permutation)."""
    rows = []
    for (depth, run_seed, model), part in importance.groupby(["depth", "seed", "model"], sort=True):
        noise = window_noise((windows or {}).get(str(model)), part["layer"])
        c = spearman(part["alpha"], part["delta_loss"], noise=noise, n_resamples=n_resamples,
                     n_permutations=n_permutations, seed=seed)
        rows.append(dict(depth=int(depth), seed=int(run_seed), model=model, n_blocks=c.n, rho=c.rho,
                         ci_low=c.ci_low, ci_high=c.ci_high, half_width=(c.ci_high - c.ci_low) / 2,
                         p_value=c.p_value))
    return pd.DataFrame(rows, columns=RHO_RUN_COLUMNS)


def within_model_ranks(importance: pd.DataFrame) -> pd.DataFrame:
    """``importance`` with ``alpha_rank`` and ``delta_rank``: each block's rank within its own
    model, scaled to (0, 1) as (rank − ½) / n so models of different depths pool."""
    out = importance.copy()
    for column, name in (("alpha", "alpha_rank"), ("delta_loss", "delta_rank")):
        out[name] = out.groupby("model")[column].transform(lambda v: (rankdata(v) - 0.5) / len(v))
    return out


def clustered_spearman(part: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS,
                       seed: int = 0) -> Correlation:
    """Spearman ρ of ``alpha_rank`` and ``delta_rank`` over the pooled blocks of several runs,
    without treating them as independent: two seeds of one depth have a block 3 each, and those
    two blocks share their position. The interval resamples *positions* (a position's blocks in
    every run of that depth go together: cluster bootstrap), and the p permutes *positions*
    (one permutation of a depth's positions moves α in each of its runs alike), so the pooled
    blocks count as what they are: two identical seeds give the interval and p of one."""
    a, d = rankdata(part["alpha_rank"].to_numpy(float)), rankdata(part["delta_rank"].to_numpy(float))
    n = int(len(part))
    rho = spearman_rho(a, d)
    nan = float("nan")
    if not np.isfinite(rho):
        return Correlation(nan, nan, nan, nan, n)
    rng = np.random.default_rng(seed)
    codes = pd.factorize(part["depth"].astype(str) + ":" + part["layer"].astype(str))[0]
    members = [np.flatnonzero(codes == c) for c in range(codes.max() + 1)]
    draws = [np.concatenate([members[i] for i in rng.integers(0, len(members), len(members))])
             for _ in range(n_resamples)]
    boots = _resampled_rho(a, d, draws)
    tails = percentile_tails(LEVEL, len(members))   # few positions: read wider, as everywhere
    low, high = (np.nanpercentile(boots, tails) if np.isfinite(boots).sum() >= n_resamples // 2
                 else (nan, nan))
    perm = np.tile(np.arange(n), (n_permutations, 1))
    depth, layer, model = (part[c].to_numpy() for c in ("depth", "layer", "model"))
    for value in pd.unique(depth):   # one permutation of a depth's positions, applied to each of its runs
        layers = np.sort(pd.unique(layer[depth == value]))
        shuffle = rng.permuted(np.tile(np.arange(layers.size), (n_permutations, 1)), axis=1)
        for run in pd.unique(model[depth == value]):
            rows = np.array([np.flatnonzero((model == run) & (layer == lay))[0] for lay in layers])
            perm[:, rows] = rows[shuffle]
    shuffled = a[perm]
    shuffled = shuffled - shuffled.mean(1, keepdims=True)
    dc = d - d.mean()
    null = (shuffled @ dc) / np.sqrt((shuffled ** 2).sum(1) * (dc ** 2).sum())
    p_value = (1 + int((np.abs(null) >= abs(rho) - 1e-12).sum())) / (1 + n_permutations)
    return Correlation(rho, float(low), float(high), float(p_value), n)


def _resampled_rho(a: np.ndarray, d: np.ndarray, draws: list[np.ndarray]) -> np.ndarray:
    """Spearman ρ of ``(a[idx], d[idx])`` for each index array in ``draws``: the resamples of one
    length ranked and correlated as the rows of one array (clusters of unequal size give
    resamples of a few lengths), the same numbers as one ``spearman_rho`` call per resample."""
    rho = np.full(len(draws), np.nan)
    lengths = np.array([idx.size for idx in draws])
    for length in np.unique(lengths[lengths >= 3]):   # shorter resamples stay NaN, as spearman_rho gives
        rows = np.flatnonzero(lengths == length)
        idx = np.stack([draws[r] for r in rows])                  # (resamples, length)
        rho[rows] = _corr_rows(rankdata(a[idx], axis=-1), rankdata(d[idx], axis=-1))
    return rho


def rho_pooled(importance: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS,
               seed: int = 0) -> pd.DataFrame:
    """ρ pooled over runs: per depth (its seeds) and over every run (``depth = "all"``).

    Ranks are taken within each model first (:func:`within_model_ranks`), so pooling compares
    blocks only with blocks of their own model; ρ is then Spearman's over the pooled blocks, with
    the interval and p of :func:`clustered_spearman` (positions resampled and permuted
    together). Columns ``POOLED_COLUMNS``."""
    ranked = within_model_ranks(importance)
    groups = [(str(int(d)), part) for d, part in ranked.groupby("depth", sort=True)] + [("all", ranked)]
    rows = []
    for depth, part in groups:
        c = clustered_spearman(part, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
        rows.append(dict(depth=depth, n_runs=int(part["model"].nunique()), n_blocks=c.n, rho=c.rho, ci_low=c.ci_low,
                         ci_high=c.ci_high, half_width=(c.ci_high - c.ci_low) / 2, p_value=c.p_value))
    return pd.DataFrame(rows, columns=POOLED_COLUMNS)


def seed_agreement(importance: pd.DataFrame, rho_runs: pd.DataFrame) -> pd.DataFrame:
    """Per depth: Spearman ρ between the seeds' ΔLoss profiles (block by block; the mean over
    seed pairs), whether every seed's costliest block is the same, and the spread of ρ(α, ΔLoss)
    between seeds (:func:`rho_by_run`); all three NaN with one seed. Columns ``depth, n_seeds,
    profile_rho, costliest_blocks, same_costliest, rho_min, rho_max, rho_spread``."""
    rows = []
    for depth, part in importance.groupby("depth", sort=True):
        profiles = part.pivot_table(index="layer", columns="seed", values="delta_loss")
        seeds = list(profiles.columns)
        pairs = [spearman(profiles[a], profiles[b], n_resamples=1, n_permutations=1).rho
                 for a, b in itertools.combinations(seeds, 2)]
        costliest = [int(profiles[s].idxmax()) for s in seeds]
        rhos = rho_runs.loc[rho_runs["depth"] == depth, "rho"]
        several = len(seeds) > 1   # one seed agrees with nothing: its agreement is not a number
        rows.append(dict(depth=int(depth), n_seeds=len(seeds), profile_rho=float(np.mean(pairs)) if pairs else np.nan,
                         costliest_blocks=", ".join(map(str, costliest)),
                         same_costliest=len(set(costliest)) == 1 if several else np.nan,
                         rho_min=float(rhos.min()), rho_max=float(rhos.max()),
                         rho_spread=float(rhos.max() - rhos.min()) if several else np.nan))
    return pd.DataFrame(rows)
