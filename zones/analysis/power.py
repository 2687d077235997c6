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
* :func:`ratio_draws`: per-window ΔPPL of two arms, lognormal and correlated, whose means differ by
  ``ratio``: the ratio of the arms' means and its paired percentile interval (windows resampled;
  the Last-N ratio's and the worst/best gap's);
* :func:`crossover_draws`: a paired difference per k (``mean_draws``' model, one true mean per k),
  each k's separable winner read from its interval (``compare_strategies``' winner);
* :func:`asymmetry_draws`: Q/K and V/O values per layer whose spreads differ by ``ratio``: std(Q/K)
  / std(V/O) and its interval (layers resampled, ``zones.analysis.profile.std_ratio``);
* :func:`first_block_draws`: per-window ΔLoss of every block, block 0 costlier by ``excess``: each
  block's ΔLoss and its interval (windows resampled, the same windows for every block, as the
  ablation chapter's);
* :func:`wave_draws`: a (layer, snapshot) compression grid (:func:`wave_grids`) whose early-minus-late gradient follows
  a known curve: ``zones.analysis.lifecycle.wave_reversal``'s leader and the simultaneous interval of
  g's minimum from its peak on (each half's layers resampled on their own);
* :func:`shape_draws`: an α profile over blocks, a rise plus block noise (:func:`shape_profiles`): the shape
  ``zones.analysis.profile.profile_shape`` would name (its rank trend and curvature intervals,
  blocks resampled);
* :func:`depth_draws`: blocks whose α and ΔLoss share a depth trend (α nearly monotone in depth, as
  the trained runs' is), ΔLoss measured on eval windows with noise, and α's own deviation from
  its trend tied to ΔLoss's by ``partial`` (0: the structured null, nothing shared beyond depth):
  the importance chapter's raw and partial ρ on each, through its own functions (both sources of
  noise resampled, undefined resamples counted);
* :func:`operating`: the share of draws a rule calls ``holds``, ``does not hold``, ``inconclusive``.

Everything is vectorised over draws and resamples and seeded, so a table of a few hundred draws
per cell takes well under a second, and the same call gives the same table. Where a chapter's
function runs one data set at a time (``first_blocks_matter_most``, ``wave_reversal``,
``profile_shape``), the simulator computes the same statistics over all draws at once, and
``tests/test_operating.py`` checks that it reads the same data sets as the chapter's function.
"""
from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

import numpy as np
from scipy.stats import rankdata

from zones.analysis.profile import quadratic, std_ratio
from zones.analysis.unit_intervals import slope_interval
from zones.core.checks import check_float, check_int
from zones.measure.bootstrap import LEVEL, percentile_tails

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
        low, high = _percentiles(boot, n)
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
    low, high = _percentiles(boot, n)
    return dict(estimate=data.mean(-1), low=low, high=high, n=np.full(n_draws, n))


def exponent_draws(exponent: float, sd: float, runs: dict[int, int], *, n_draws: int = N_DRAWS,
                   seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated depth series with ``runs`` (depth → training runs): each run's log Δα
    = ``exponent`` · log depth + Normal(0, ``sd``); each draw's ``estimate`` (the slope through
    every run), ``low`` and ``high`` (its t interval, ``zones.analysis.unit_intervals.slope_interval``)."""
    sd = check_float(sd, "sd", min=0.0)
    x = np.log(np.repeat([float(d) for d in runs], [check_int(n, "runs", min=1) for n in runs.values()]))
    rng = np.random.default_rng(seed)
    y = exponent * x + sd * rng.standard_normal((n_draws, x.size))
    b, low, high = slope_interval(np.broadcast_to(x, y.shape), y)
    return dict(estimate=b, low=low, high=high, n=np.full(n_draws, x.size))


def _percentiles(boot: np.ndarray, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The 95% percentile interval of ``n`` resampled units along the last axis, read at the level
    the chapters read it (``zones.measure.bootstrap.expanded_level``; ``n=None``: at 95% itself, as
    the stratified intervals of the wave are), NaN resamples left out."""
    with np.errstate(invalid="ignore"):
        low, high = np.nanpercentile(boot, percentile_tails(LEVEL, n), axis=-1)
    return low, high


def _resample(data: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``data`` (draws, ..., units) at ``index`` (draws, resamples, units): (draws, resamples, ..., units),
    the same resample of units for every leading row of a draw (paired)."""
    extra = data.ndim - 2
    d = data[:, None]                                        # (draws, 1, ..., units)
    i = index.reshape(index.shape[:2] + (1,) * extra + index.shape[-1:])
    return np.take_along_axis(d, i, axis=-1)


def _weights(index: np.ndarray, n: int) -> np.ndarray:
    """A resample ``index`` (draws, resamples, n) as weights (draws, resamples, n): the share of the
    resample each unit fills (a mean over the resample is then a weighted sum over units)."""
    d, r = index.shape[:2]
    flat = (np.arange(d * r)[:, None] * n + index.reshape(d * r, -1)).ravel()
    return np.bincount(flat, minlength=d * r * n).reshape(d, r, n) / index.shape[-1]


def _weighted_ranks(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The average rank (1-based) in each resample of each unit, ``values`` (draws, n) distinct within
    a draw, ``weights`` (draws, resamples, n) from :func:`_weights`: a unit drawn c times holds the
    ranks after every smaller unit's copies, tied ((c + 1)/2 on average): ``rankdata`` of the
    resampled values, per unit."""
    n = weights.shape[-1]
    order = np.argsort(values, axis=-1)[:, None, :]
    counts = np.take_along_axis(weights * n, order, -1)
    ranks = np.cumsum(counts, -1) - counts + (counts + 1) / 2
    out = np.empty_like(ranks)
    np.put_along_axis(out, np.broadcast_to(order, ranks.shape), ranks, -1)
    return out


def _weighted_corr(a: np.ndarray, b: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Pearson correlation of ``a`` and ``b`` over units weighted by ``weights`` (last axis)."""
    a = a - (weights * a).sum(-1, keepdims=True)
    b = b - (weights * b).sum(-1, keepdims=True)
    den = np.sqrt((weights * a * a).sum(-1) * (weights * b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 1e-12, (weights * a * b).sum(-1) / den, np.nan)


def _weighted_parabola(x: np.ndarray, y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``zones.analysis.profile.quadratic`` of each resample given as ``weights`` (draws, resamples,
    n) over units at ``x`` (n,) with values ``y`` (draws, n): (a, b, c), NaN where singular."""
    powers = x[None, :] ** np.arange(5)[:, None]                                   # (5, n)
    moments = np.einsum("drn,kn->drk", weights, powers)
    gram = np.stack([moments[..., i:i + 3] for i in range(3)], axis=-2)
    rhs = np.einsum("drn,kn,dn->drk", weights, powers[:3], y)
    with np.errstate(all="ignore"):
        singular = np.abs(np.linalg.det(gram)) * weights.shape[-1] ** 3 < 1e-12   # quadratic()'s test, on sums
        gram = np.where(singular[..., None, None], np.eye(3), gram)
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]
    return np.where(singular[..., None], np.nan, coef)


def ratio_draws(ratio: float, n_windows: int, *, log_sd: float = 0.5, corr: float = 0.5, n_draws: int = N_DRAWS,
                n_resamples: int = SIMULATED_RESAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated pairs of arms scored on ``n_windows`` eval windows: each window's ΔPPL
    of the reference arm (Last-N, or the worst strategy) and of ours (zone-aware, or the best) is
    lognormal with log-sd ``log_sd`` (the cpu build's SmolLM2 windows: a window's ΔPPL varies by
    about half its mean), the two arms' logs correlated by ``corr`` on the same window, and their
    means in the true ratio ``ratio``. Each draw's ``estimate`` (the ratio of the arms' mean ΔPPL,
    as ``compare_strategies`` divides the arms' ΔPPL), ``low`` and ``high`` (its 95% percentile
    interval, the same windows resampled for both arms)."""
    ratio = check_float(ratio, "ratio", min=0.0, min_inclusive=False)
    n = check_int(n_windows, "n_windows", min=2)
    log_sd = check_float(log_sd, "log_sd", min=0.0)
    corr = check_float(corr, "corr", min=-1.0, max=1.0)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, n_draws, n))
    ours = log_sd * z[0]
    ref = log_sd * (corr * z[0] + math.sqrt(1 - corr * corr) * z[1])
    arms = np.exp(np.stack([ref + math.log(ratio), ours], axis=1) - log_sd ** 2 / 2)   # (draws, 2, windows)
    index = rng.integers(0, n, (n_draws, n_resamples, n))
    boot = _resample(arms, index).mean(-1)                                             # (draws, resamples, 2)
    low, high = _percentiles(boot[..., 0] / boot[..., 1], n)
    return dict(estimate=arms[:, 0].mean(-1) / arms[:, 1].mean(-1), low=low, high=high, n=np.full(n_draws, n))


def crossover_draws(effects, sd: float, n_windows: int, *, n_draws: int = N_DRAWS,
                    n_resamples: int = SIMULATED_RESAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated sweeps over k = 1, 2, …, ``len(effects)``: at each k, ``n_windows``
    paired differences d = Δloss(Last-N) − Δloss(zone-aware) ~ Normal(``effects[k − 1]``, ``sd``)
    (independent between k), resampled with the same windows at every k (one index per draw, as
    the chapter's resamples are seeded alike at every k). Each draw's ``sides`` (draws, k): +1 where
    d's 95% interval lies above 0 (zone-aware the separable winner), −1 below (Last-N), 0 a tie:
    ``compare_strategies``' ``winner``."""
    effects = np.array([check_float(e, "effects") for e in effects], dtype=float)
    if effects.size < 1:
        raise ValueError("effects must give at least one k; got none")
    n = check_int(n_windows, "n_windows", min=2)
    sd = check_float(sd, "sd", min=0.0)
    rng = np.random.default_rng(seed)
    data = effects[:, None] + sd * rng.standard_normal((n_draws, effects.size, n))   # (draws, k, windows)
    weights = _weights(rng.integers(0, n, (n_draws, n_resamples, n)), n)
    low, high = _percentiles(np.einsum("dkw,drw->dkr", data, weights), n)               # (draws, k)
    return dict(sides=np.where(low > 0, 1, np.where(high < 0, -1, 0)), n=np.full(n_draws, n))


def asymmetry_draws(ratio: float, n_layers: int, *, n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated models of ``n_layers`` layers: each layer's Q/K value ~ Normal(0,
    ``ratio``²) and V/O value ~ Normal(0, 1), so the true std(Q/K) / std(V/O) is ``ratio``. Each
    draw's ``estimate`` (``std_ratio``), ``low`` and ``high`` (its 95% percentile interval, the same
    layers resampled for both groups, as ``qk_vo_asymmetry``'s)."""
    ratio = check_float(ratio, "ratio", min=0.0, min_inclusive=False)
    n = check_int(n_layers, "n_layers", min=3)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n_draws, 2, n)) * np.array([ratio, 1.0])[:, None]
    index = rng.integers(0, n, (n_draws, n_resamples, n))
    boot = _resample(data, index)                                                  # (draws, resamples, 2, layers)
    low, high = _percentiles(std_ratio(boot[..., 0, :], boot[..., 1, :]), n)
    return dict(estimate=std_ratio(data[:, 0], data[:, 1]), low=low, high=high, n=np.full(n_draws, n))


def first_block_draws(excess: float, n_blocks: int, n_windows: int, *, n_draws: int = N_DRAWS,
                      n_resamples: int = SIMULATED_RESAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """``n_draws`` simulated ablations of ``n_blocks`` blocks on ``n_windows`` eval windows: each
    block's per-window ΔLoss ~ Normal(mean, 1) with mean ``excess`` for block 0 and 0 for every other
    block (in units of a window's sd). Each draw's ``delta``, ``low`` and ``high`` (draws, blocks):
    every block's mean ΔLoss and its 95% percentile interval, the same windows resampled for every
    block (``delta_loss_interval``'s pairing)."""
    excess = check_float(excess, "excess")
    b = check_int(n_blocks, "n_blocks", min=2)
    n = check_int(n_windows, "n_windows", min=2)
    rng = np.random.default_rng(seed)
    data = rng.standard_normal((n_draws, b, n))
    data[:, 0] += excess
    weights = _weights(rng.integers(0, n, (n_draws, n_resamples, n)), n)
    low, high = _percentiles(np.einsum("dbw,drw->dbr", data, weights), n_windows)
    return dict(delta=data.mean(-1), low=low, high=high, n=np.full(n_draws, b))


def first_blocks_words(delta: np.ndarray, low: np.ndarray, high: np.ndarray, n_first: int) -> np.ndarray:
    """``zones.report.verdicts.first_blocks_matter_most``' word for each row of (draws, blocks)
    arrays whose first ``n_first`` blocks are "the first blocks": holds if the costliest of them
    is at least the costliest later block and its low bound is above every later block's high;
    does not hold if a later block's low is above every first block's high; else inconclusive."""
    head = np.arange(delta.shape[-1]) < n_first
    first = np.argmax(np.where(head, delta, -np.inf), axis=-1)
    rows = np.arange(delta.shape[0])
    holds = (delta[rows, first] >= delta[:, ~head].max(-1)) & (low[rows, first] > high[:, ~head].max(-1))
    fails = (low[:, ~head] > high[:, head].max(-1, keepdims=True)).any(-1)
    undefined = np.isnan(low).any(-1) | np.isnan(high).any(-1)
    words = np.where(holds, WORDS[0], np.where(fails, WORDS[1], WORDS[2]))
    return np.where(undefined, WORDS[2], words)


def wave_curve(kind: str, lead: float, n_snapshots: int) -> np.ndarray:
    """The true wave gradient g (early half's mean compression − the late half's) at snapshots 1 …
    ``n_snapshots``: ``"reversal"``: ``lead`` · sin(2π t / n), the early half ahead for the first half of
    training, the late half after; ``"lead only"``: ``lead`` · sin(π t / n), early ahead, the gap
    closing to 0 at the last snapshot, never reversed; ``"none"``: 0."""
    t = np.arange(1, check_int(n_snapshots, "n_snapshots", min=2) + 1) / n_snapshots
    curves = {"reversal": np.sin(2 * np.pi * t), "lead only": np.sin(np.pi * t), "none": 0 * t}
    if kind not in curves:
        raise ValueError(f"kind must be one of {sorted(curves)}; got {kind!r}")
    return check_float(lead, "lead") * curves[kind]


def wave_grids(kind: str, lead: float, n_layers: int, *, n_snapshots: int = 12, persist: float = 0.5,
               n_draws: int = N_DRAWS, seed: int = 0) -> np.ndarray:
    """``n_draws`` simulated compression grids (draws, layers, snapshots after step 0) of
    ``n_layers`` layers: each layer's compression = ±½ the true gradient (:func:`wave_curve`; + for
    the first half of the layers, − for the second) plus unit noise, a share ``persist`` of its
    variance the layer's own offset at every snapshot, the rest fresh at each."""
    n = check_int(n_layers, "n_layers", min=4)
    persist = check_float(persist, "persist", min=0.0, max=1.0)
    g = wave_curve(kind, lead, n_snapshots)
    rng = np.random.default_rng(seed)
    return (math.sqrt(persist) * rng.standard_normal((n_draws, n, 1))
            + math.sqrt(1 - persist) * rng.standard_normal((n_draws, n, g.size))
            + np.where(np.arange(n) < n / 2, 0.5, -0.5)[:, None] * g)


def wave_draws(kind: str, lead: float, n_layers: int, *, n_snapshots: int = 12, persist: float = 0.5,
               n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES, seed: int = 0) -> dict[str, np.ndarray]:
    """The grids of :func:`wave_grids` read as ``wave_reversal`` reads one: each draw's ``leader``
    (``early``, ``late`` or ``neither``), ``after_low`` and ``after_high``, from g's maximum (peak)
    and minimum (trough), each with its 95% percentile interval, and its minimum from the peak's
    snapshot on (after) with its simultaneous 95% interval (``zones.analysis.lifecycle.simultaneous_min``),
    the early and the late layers each resampled on their own."""
    grid = wave_grids(kind, lead, n_layers, n_snapshots=n_snapshots, persist=persist, n_draws=n_draws, seed=seed)
    n, steps = grid.shape[1:]
    early = np.arange(n) < n / 2
    rng = np.random.default_rng([seed, 1])

    halves = []
    for part in (grid[:, early], grid[:, ~early]):
        index = rng.integers(0, part.shape[1], (n_draws, n_resamples, part.shape[1]))
        halves.append(_resample(np.moveaxis(part, 1, -1), index).mean(-1))            # (draws, resamples, snapshots)
    boot = halves[0] - halves[1]
    point = grid[:, early].mean(1) - grid[:, ~early].mean(1)                        # (draws, snapshots)
    p_low, t_high = _percentiles(boot.max(-1), None)[0], _percentiles(boot.min(-1), None)[1]          # peak's low, trough's high
    # after: g from the peak's snapshot on, its band simultaneous over those snapshots (simultaneous_min)
    window = np.arange(steps) >= point.argmax(-1)[:, None]                          # (draws, snapshots)
    sd = boot.std(-2)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd[:, None] > 0, np.abs(boot - point[:, None]) / sd[:, None], 0.0)
    c = np.quantile(np.where(window[:, None], z, -np.inf).max(-1), LEVEL, axis=-1)[:, None]
    a_low = np.where(window, point - c * sd, np.inf).min(-1)
    a_high = np.where(window, point + c * sd, np.inf).min(-1)
    early_led, late_led = p_low > 0, t_high < 0
    first = point.argmax(-1) <= point.argmin(-1)
    leader = np.where(early_led & late_led, np.where(first, "early", "late"),
                      np.where(early_led, "early", np.where(late_led, "late", "neither")))
    return dict(leader=leader, after_low=a_low, after_high=a_high, n=np.full(n_draws, n))


def shape_profiles(rise: float, n_blocks: int, *, n_draws: int = N_DRAWS, seed: int = 0) -> np.ndarray:
    """``n_draws`` simulated α profiles (draws, blocks): α = ``rise`` · x + Normal(0, 1) at relative
    depth x = block / (``n_blocks`` − 1)."""
    rise = check_float(rise, "rise")
    n = check_int(n_blocks, "n_blocks", min=3)
    return rise * np.arange(n) / (n - 1) + np.random.default_rng(seed).standard_normal((n_draws, n))


def shape_draws(rise: float, n_blocks: int, *, n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES,
                seed: int = 0) -> dict[str, np.ndarray]:
    """The profiles of :func:`shape_profiles` (``rise`` in units of the block-to-block sd). Each draw's
    ``shape``, named by ``profile_shape``'s rule from the same statistics: ``inverted U`` (the
    curvature's 95% interval below 0 and the fitted parabola's turn inside the depth), ``rises``
    (the rank trend's interval above 0), ``falls``, ``U-shaped``, else ``not separable``; blocks
    resampled (the same blocks for both intervals), the rank trend re-ranked in every resample."""
    y = shape_profiles(rise, n_blocks, n_draws=n_draws, seed=seed)
    n = y.shape[-1]
    rng = np.random.default_rng([seed, 1])
    x = np.arange(n) / (n - 1)
    weights = _weights(rng.integers(0, n, (n_draws, n_resamples, n)), n)
    with np.errstate(all="ignore"):
        c_low, c_high = _percentiles(_weighted_parabola(x, y, weights)[..., 2], n)
        ranks_x = _weighted_ranks(np.broadcast_to(x, y.shape), weights)
        t_low, t_high = _percentiles(_weighted_corr(ranks_x, _weighted_ranks(y, weights), weights), n)
        _, b, c = np.moveaxis(quadratic(np.broadcast_to(x, y.shape), y), -1, 0)
        vertex = np.where(c != 0, -b / (2 * c), np.nan)
    interior = (vertex > 0) & (vertex < 1)
    shape = np.where((c_high < 0) & interior, "inverted U",
                     np.where(t_low > 0, "rises", np.where(t_high < 0, "falls",
                              np.where((c_low > 0) & interior, "U-shaped", "not separable"))))
    undefined = np.isnan(c_low) | np.isnan(t_low)
    return dict(shape=np.where(undefined & (shape == "not separable"), "undefined", shape), n=np.full(n_draws, n))


DEPTH_ALPHA_NOISE = 0.6   # α's scatter about its depth trend, in steps between neighbours: ~1 pair out of order in 8
DEPTH_BLOCK_SD = 0.01     # ΔLoss's scatter about its depth trend, as a share of the first block's ΔLoss
DEPTH_NOISE = 1.0         # a block's measurement sd (its mean over the eval windows) / DEPTH_BLOCK_SD: the book's
                          # mid-depth blocks (0.002–0.01 nats, ±0.003) are as noisy as they are apart
DEPTH_SHARED = 0.5        # the share of a window's noise that every block shares (a hard window is hard for all)


def depth_draws(n_blocks: int, n_windows: int, *, partial: float = 0.0, alpha_noise: float = DEPTH_ALPHA_NOISE,
                block_sd: float = DEPTH_BLOCK_SD, noise: float = DEPTH_NOISE, shared: float = DEPTH_SHARED,
                n_draws: int = N_DRAWS, n_resamples: int = SIMULATED_RESAMPLES,
                n_permutations: int = SIMULATED_PERMUTATIONS, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """``n_draws`` simulated models of ``n_blocks`` blocks in which α and ΔLoss share a depth trend:
    α = −block index + Normal(0, ``alpha_noise``) (nearly monotone in depth, falling as ΔLoss falls); the true ΔLoss =
    exp(−6 · relative depth) + e, where e has sd ``block_sd`` and correlation ``partial`` with α's
    deviation from its trend (0: the structured null, α and ΔLoss share nothing but depth). Each
    block's ΔLoss is measured on ``n_windows`` eval windows whose noise (a share ``shared`` of it
    common to all blocks on a window) gives its mean an sd of ``noise`` · ``block_sd``.

    Returns ``{"raw": …, "partial": …}``, each with one entry per draw: ``rho, low, high, p, n`` and
    ``undefined``, computed by ``zones.analysis.importance.spearman`` and ``partial_spearman`` with
    the windows resampled as the chapter resamples them (the same functions, the same reading)."""
    from zones.analysis.importance import partial_spearman, spearman   # the chapter's own statistics
    from zones.analysis.unit_intervals import WindowNoise

    n = check_int(n_blocks, "n_blocks", min=4)
    w = check_int(n_windows, "n_windows", min=2)
    partial = check_float(partial, "partial", min=-1.0, max=1.0)
    rng = np.random.default_rng([seed, n, w])
    depth = np.arange(n, dtype=float)
    trend = np.exp(-6.0 * depth / (n - 1))   # block 0 costs most; past mid-depth the scatter decides the order
    window_sd = check_float(noise, "noise", min=0.0) * block_sd * math.sqrt(w)
    out = {kind: {k: np.empty(n_draws) for k in ("rho", "low", "high", "p", "n", "undefined")}
           for kind in ("raw", "partial")}
    options = dict(n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    for i in range(n_draws):
        u = rng.standard_normal(n)
        alpha = -depth + alpha_noise * u   # falling with depth, as ΔLoss does: the raw ρ is positive
        own = block_sd * (partial * u + math.sqrt(1 - partial * partial) * rng.standard_normal(n))
        per_window = (trend + own)[:, None] + window_sd * (
            math.sqrt(shared) * rng.standard_normal((1, w)) + math.sqrt(1 - shared) * rng.standard_normal((n, w)))
        measured = WindowNoise(per_window, np.ones(w))
        delta = measured.values()
        for kind, c in (("raw", spearman(alpha, delta, noise=measured, **options)),
                        ("partial", partial_spearman(alpha, delta, depth, noise=measured, **options))):
            for key, value in (("rho", c.rho), ("low", c.ci_low), ("high", c.ci_high), ("p", c.p_value),
                               ("n", c.n), ("undefined", c.undefined)):
                out[kind][key][i] = value
    for kind in out:
        out[kind]["n"] = out[kind]["n"].astype(int)
    return out


def operating(rule: Callable[..., str], draws: dict[str, np.ndarray]) -> dict[str, float]:
    """The share of ``draws`` that ``rule(**draw)`` calls each of :data:`WORDS` (a draw is one
    row of the arrays, passed by the arrays' names: a scalar as a python value, a longer row,
    such as :func:`crossover_draws`' ``sides``, as an array)."""
    keys = list(draws)
    n = len(draws[keys[0]])
    counts = dict.fromkeys(WORDS, 0)
    for i in range(n):
        word = str(rule(**{k: draws[k][i].item() if np.ndim(draws[k][i]) == 0 else draws[k][i] for k in keys}))
        counts[word if word in counts else "inconclusive"] += 1
    return {w: c / n for w, c in counts.items()}


@lru_cache(maxsize=64)
def rho_rule_power(rule: Callable[..., str], rho: float, n_blocks: int, n_draws: int = N_DRAWS,
                   seed: int = 0) -> dict[str, float]:
    """:func:`operating` of a ρ rule (called as ``rule(rho=, low=, high=, p=, n=)``) on
    :func:`rho_draws` (cached: the scorecard asks for the same cell once per model)."""
    return operating(rule, rho_draws(rho, n_blocks, n_draws=n_draws, seed=seed))


@lru_cache(maxsize=64)
def exponent_rule_power(rule: Callable[..., str], exponent: float, sd: float, runs: tuple[tuple[int, int], ...],
                        n_draws: int = N_DRAWS, seed: int = 0) -> dict[str, float]:
    """:func:`operating` of a Δα-exponent rule (called as ``rule(estimate=, low=, high=, n=)``) on
    :func:`exponent_draws` with ``runs`` given as ``((depth, runs), …)`` (cached, hashable)."""
    return operating(rule, exponent_draws(exponent, sd, dict(runs), n_draws=n_draws, seed=seed))


@lru_cache(maxsize=64)
def asymmetry_rule_power(rule: Callable[..., str], ratio: float, n_layers: int, n_draws: int = N_DRAWS,
                         seed: int = 0) -> dict[str, float]:
    """:func:`operating` of an asymmetry rule (called as ``rule(estimate=, low=, high=, n=)``) on
    :func:`asymmetry_draws` (cached: the scorecard asks for the same cell once per model)."""
    return operating(rule, asymmetry_draws(ratio, n_layers, n_draws=n_draws, seed=seed))


__all__ = ["DEPTH_ALPHA_NOISE", "DEPTH_BLOCK_SD", "DEPTH_NOISE", "DEPTH_SHARED", "depth_draws",
           "N_DRAWS", "WORDS", "asymmetry_draws", "asymmetry_rule_power", "crossover_draws", "exponent_draws",
           "exponent_rule_power",
           "first_block_draws", "first_blocks_words", "mean_draws", "operating", "pearson_for_spearman", "ratio_draws",
           "rho_draws", "rho_rule_power", "shape_draws", "shape_profiles", "wave_curve", "wave_draws",
           "wave_grids"]
