"""Operating characteristics of the book's verdict rules: how often a rule says "holds" when an
effect is true, and "does not hold" when there is none, at the book's sizes.

A rule (``zones.report.verdicts``) turns an estimate, its 95% interval and sometimes a p-value into
a word. Whether that word can be trusted depends on how often the rule says it by chance. This
module draws data sets from a known truth, computes the same statistics the chapters compute
(Spearman ρ with a block-resampled percentile interval and a permutation p; the mean of paired
differences with a percentile interval), hands them to the rule and counts its words:

* :func:`rho_draws`: ``n_blocks`` (α, ΔLoss) pairs from a bivariate normal whose Spearman ρ is
  ``rho`` (Pearson r = 2·sin(π·ρ/6)), each with its ρ, interval and two-sided permutation p;
* :func:`mean_draws`: ``n_units`` paired differences ~ Normal(``effect``, ``sd``), each with its
  mean and percentile interval (the eval-window and example intervals' model);
* :func:`exponent_draws`: one log Δα per training run, ``b`` · log L plus Normal(0, ``sd``) run to
  run, each with the least-squares slope and its t interval over the runs (the Δα exponent's);
* :func:`operating`: the share of draws a rule calls ``holds``, ``does not hold``, ``inconclusive``.

Everything is vectorised over draws and resamples and seeded, so a table of a few hundred draws
per cell takes about a second, and the same call gives the same table.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import numpy as np
from scipy.stats import rankdata

from zones.analysis.unit_intervals import slope_interval
from zones.core.checks import check_float, check_int

N_DRAWS = 200          # simulated data sets per cell: a share's standard error is at most 0.035
SIMULATED_RESAMPLES = 400      # bootstrap resamples per simulated interval
SIMULATED_PERMUTATIONS = 400   # permutations per simulated p-value (p resolves to 1/401)
WORDS = ("holds", "does not hold", "inconclusive")


def _corr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson correlation along the last axis (NaN where one side is constant)."""
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 1e-12, (a * b).sum(-1) / den, np.nan)


def pearson_for_spearman(rho: float) -> float:
    """The bivariate normal's Pearson r whose Spearman ρ is ``rho``: r = 2·sin(π·ρ/6)."""
    return 2.0 * math.sin(math.pi * rho / 6.0)


def rho_draws(rho: float, n_blocks: int, *, n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES,
              n_permutations: int = SIMULATED_PERMUTATIONS, seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated models of ``n_blocks`` blocks whose true Spearman ρ(α, ΔLoss) is
    ``rho``: each draw's ``rho``, ``low``, ``high`` (95% percentile interval, blocks resampled,
    re-ranked) and ``p`` (two-sided permutation p), as the importance chapter computes them."""
    rho = check_float(rho, "rho", min=-1.0, max=1.0)
    n = check_int(n_blocks, "n_blocks", min=3)
    rng = np.random.default_rng(seed)
    r = pearson_for_spearman(rho)
    x = rng.standard_normal((n_draws, n))
    y = r * x + math.sqrt(max(1 - r * r, 0.0)) * rng.standard_normal((n_draws, n))
    rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
    estimate = _corr(rx, ry)
    lows, highs, ps = [], [], []
    for start in range(0, n_draws, 50):   # chunks keep the resampled arrays small
        sx, sy, est = rx[start:start + 50], ry[start:start + 50], estimate[start:start + 50]
        index = rng.integers(0, n, (len(sx), n_resamples, n))
        boot = _corr(rankdata(np.take_along_axis(sx[:, None, :].repeat(n_resamples, 1), index, -1), axis=-1),
                     rankdata(np.take_along_axis(sy[:, None, :].repeat(n_resamples, 1), index, -1), axis=-1))
        low, high = np.nanpercentile(boot, [2.5, 97.5], axis=-1)
        shuffled = rng.permuted(sy[:, None, :].repeat(n_permutations, 1), axis=-1)
        extreme = (np.abs(_corr(sx[:, None, :], shuffled)) >= np.abs(est)[:, None] - 1e-12).sum(-1)
        lows.append(low), highs.append(high), ps.append((1 + extreme) / (1 + n_permutations))
    return dict(rho=estimate, low=np.concatenate(lows), high=np.concatenate(highs), p=np.concatenate(ps),
                n=np.full(n_draws, n))


def mean_draws(effect: float, sd: float, n_units: int, *, n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES,
               seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated sets of ``n_units`` paired differences ~ Normal(``effect``, ``sd``):
    each draw's ``estimate`` (the mean), ``low`` and ``high`` (95% percentile bootstrap interval,
    units resampled), as the paired interval over eval windows or examples is computed."""
    n = check_int(n_units, "n_units", min=2)
    sd = check_float(sd, "sd", min=0.0)
    rng = np.random.default_rng(seed)
    data = effect + sd * rng.standard_normal((n_draws, n))
    index = rng.integers(0, n, (n_draws, n_resamples, n))
    boot = np.take_along_axis(data[:, None, :].repeat(n_resamples, 1), index, -1).mean(-1)
    low, high = np.percentile(boot, [2.5, 97.5], axis=-1)
    return dict(estimate=data.mean(-1), low=low, high=high, n=np.full(n_draws, n))


def exponent_draws(exponent: float, sd: float, runs: dict[int, int], *, n_draws: int = N_DRAWS,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated depth series with ``runs`` (depth → training runs): each run's log Δα
    = ``exponent`` · log depth + Normal(0, ``sd``); each draw's ``estimate`` (the slope through
    every run), ``low`` and ``high`` (its t interval, ``zones.analysis.bootstrap.slope_interval``)."""
    sd = check_float(sd, "sd", min=0.0)
    x = np.log(np.repeat([float(d) for d in runs], [check_int(n, "runs", min=1) for n in runs.values()]))
    rng = np.random.default_rng(seed)
    y = exponent * x + sd * rng.standard_normal((n_draws, x.size))
    b, low, high = slope_interval(np.broadcast_to(x, y.shape), y)
    return dict(estimate=b, low=low, high=high, n=np.full(n_draws, x.size))


def operating(rule: Callable[..., str], draws: dict[str, np.ndarray]) -> dict[str, float]:
    """The share of ``draws`` that ``rule(**draw)`` calls each of :data:`WORDS` (a draw is one
    row of the arrays, passed by the arrays' names)."""
    keys = list(draws)
    n = len(draws[keys[0]])
    counts = dict.fromkeys(WORDS, 0)
    for i in range(n):
        word = str(rule(**{k: draws[k][i].item() for k in keys}))
        counts[word if word in counts else "inconclusive"] += 1
    return {w: c / n for w, c in counts.items()}


@lru_cache(maxsize=64)
def rho_rule_power(rule: Callable[..., str], rho: float, n_blocks: int, n_draws: int = N_DRAWS,
                   seed: int = 0) -> dict[str, float]:
    """:func:`operating` of a ρ rule (called as ``rule(rho=, low=, high=, p=, n=)``) on
    :func:`rho_draws` (cached: the scorecard asks for the same cell once per model)."""
    return operating(rule, rho_draws(rho, n_blocks, n_draws=n_draws, seed=seed))


__all__ = ["N_DRAWS", "WORDS", "exponent_draws", "mean_draws", "operating", "pearson_for_spearman", "rho_draws", "rho_rule_power"]
