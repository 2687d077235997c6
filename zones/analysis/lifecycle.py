"""Reading the spectral snapshots of a training run: the compression wave and the α gradient.

Input: a snapshot table (``step, layer, role, stable_rank, alpha_shape, alpha_esd``, and
``depth`` when several runs are stacked) from either source: recorded while training
(``zones.series``) or computed afterwards from a series of checkpoints (``zones.series.checkpoints.
lifecycle_snapshots``: Pythia's hub revisions, local checkpoint directories). A single
series without a ``depth`` column is one run whose depth is its number of layers; its steps
need not be evenly spaced. Any other column (e.g. ``model``) is ignored. Roles are pooled
into groups, because the paper's claim is about groups: the query/key projections (``Q/K``) carry the
depth dependence, the value/output projections (``V/O``) compress uniformly, and the MLP
matrices (``MLP``) are the third kind.

* **Compression** of a matrix at a step is ``1 - stable_rank / stable_rank at the first
  snapshot`` (step 0 of a training run; the earliest checkpoint of a series): the fraction of
  its initial stable rank it has lost (0 at initialisation, larger = more compressed). A
  compression *wave* reaches early layers before late ones.
* **Wave gradient** at a step: mean compression of the first half of the layers minus that of
  the second half. Positive while early layers lead; it *reverses* when it later takes the
  other sign (the late layers over-compress past the early ones, in the paper's account).
* **Δα** of a run: max − min over layers of the final α profile (α averaged over the group's
  matrices of each layer). The paper fits Δα ∝ L^0.26 across depths L.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from zones.analysis.unit_intervals import NAN, interval_side, slope_interval, unit_bootstrap
from zones.core.checks import check_float
from zones.measure.bootstrap import LEVEL, N_RESAMPLES
from zones.spectra import role_group  # Q/K, V/O or MLP

GROUPS = ("Q/K", "V/O", "MLP")
ALL = "all"
PAPER_DELTA_ALPHA_EXPONENT = 0.26


def _check_snapshots(snapshots: pd.DataFrame, value: str) -> pd.DataFrame:
    needed = {"step", "layer", "role", value}
    missing = sorted(needed - set(snapshots.columns))
    if missing:
        raise ValueError(f"snapshot table lacks column(s) {missing}; it has {list(snapshots.columns)}")
    if snapshots.empty:
        raise ValueError("snapshot table is empty")
    df = snapshots.copy()
    if "depth" not in df.columns:
        df["depth"] = int(df["layer"].max()) + 1  # one run: its depth is its number of layers
    twice = df.duplicated(["depth", "step", "layer", "role"])
    if twice.any():
        first = df[twice].iloc[0]
        raise ValueError(f"snapshot table has {int(twice.sum())} repeated (depth, step, layer, role) rows, e.g. "
                         f"depth {first['depth']} step {first['step']} layer {first['layer']} role {first['role']}; "
                         f"stack several runs with a depth column, one snapshot per step")
    return df


def with_compression(snapshots: pd.DataFrame) -> pd.DataFrame:
    """Add ``compression = 1 - stable_rank / (stable_rank at the first step)`` per matrix."""
    df = _check_snapshots(snapshots, "stable_rank")
    keys = ["depth", "layer", "role"]
    first = df.sort_values("step").groupby(keys)["stable_rank"].transform("first")
    df["compression"] = 1.0 - df["stable_rank"] / first
    return df


def group_grid(snapshots: pd.DataFrame, value: str, groups: tuple[str, ...] = GROUPS) -> pd.DataFrame:
    """Mean of ``value`` over each group's matrices per (depth, step, layer): the heatmap data.

    Columns: ``depth, group, step, layer, relative_depth, value`` (``relative_depth`` is
    layer / (depth − 1), 0 = first block, 1 = last). ``value="compression"`` is computed
    from the stable rank. ``groups`` may include ``"all"`` (every matrix of the layer).
    """
    df = with_compression(snapshots) if value == "compression" else _check_snapshots(snapshots, value)
    df["group"] = df["role"].map(role_group)
    parts = []
    for group in groups:
        if group != ALL and group not in GROUPS:
            raise ValueError(f"unknown group {group!r}; choose from {GROUPS + (ALL,)}")
        rows = df if group == ALL else df[df["group"] == group]
        mean = rows.groupby(["depth", "step", "layer"], as_index=False)[value].mean()
        parts.append(mean.assign(group=group))
    grid = pd.concat(parts, ignore_index=True).rename(columns={value: "value"})
    grid["relative_depth"] = grid["layer"] / (grid["depth"] - 1).clip(lower=1)
    return grid[["depth", "group", "step", "layer", "relative_depth", "value"]]


def wave_gradient(snapshots: pd.DataFrame, groups: tuple[str, ...] = GROUPS) -> pd.DataFrame:
    """Per (depth, group, step): ``early, late, gradient`` where early/late are the mean
    compression of the first/second half of the layers and ``gradient = early - late``."""
    grid = group_grid(snapshots, "compression", groups)
    half = grid["layer"] < grid["depth"] / 2
    grid["half"] = np.where(half, "early", "late")
    table = grid.pivot_table(index=["depth", "group", "step"], columns="half", values="value").reset_index()
    table.columns.name = None
    table["gradient"] = table["early"] - table["late"]
    return table[["depth", "group", "step", "early", "late", "gradient"]]


def wave_summary(gradient: pd.DataFrame, tolerance: float = 0.02) -> pd.DataFrame:
    """One row per (depth, group) of a ``wave_gradient`` table.

    ``peak_step, peak_gradient``: when early layers lead the most (largest gradient);
    ``trough_step, trough_gradient``: when late layers lead the most (smallest gradient);
    ``final_gradient``: at the last step; ``leader``: which half led first by more than
    ``tolerance`` (``early``, ``late`` or ``none``); ``reversed``: the other half later led by
    more than ``tolerance`` — the wave passed and the gradient turned over.
    """
    rows = []
    for (depth, group), part in gradient.groupby(["depth", "group"], sort=True):
        part = part.sort_values("step").reset_index(drop=True)
        peak, trough = part.loc[part["gradient"].idxmax()], part.loc[part["gradient"].idxmin()]
        clear = part[part["gradient"].abs() > tolerance]
        leader = "none" if clear.empty else ("early" if clear["gradient"].iloc[0] > 0 else "late")
        reversed_ = bool(len(clear) and (np.sign(clear["gradient"]) != np.sign(clear["gradient"].iloc[0])).any())
        rows.append(dict(depth=int(depth), group=group, peak_step=int(peak["step"]),
                         peak_gradient=float(peak["gradient"]), trough_step=int(trough["step"]),
                         trough_gradient=float(trough["gradient"]),
                         final_gradient=float(part["gradient"].iloc[-1]), leader=leader, reversed=reversed_))
    return pd.DataFrame(rows)


def compression_onset(snapshots: pd.DataFrame, group: str = "Q/K", fraction: float = 0.5) -> pd.DataFrame:
    """Per (depth, layer): ``onset_step``, the first step at which the layer's mean compression
    reaches ``fraction`` of its own maximum. A wave travelling from early to late layers shows
    as onset steps rising with the layer. Columns ``depth, layer, relative_depth, onset_step``."""
    fraction = check_float(fraction, "fraction", min=0, max=1, min_inclusive=False)
    grid = group_grid(snapshots, "compression", (group,))
    rows = []
    for (depth, layer), part in grid.groupby(["depth", "layer"]):
        part = part.sort_values("step")
        peak = part["value"].max()
        reached = part[part["value"] >= fraction * peak] if peak > 0 else part.iloc[:0]
        rows.append(dict(depth=int(depth), layer=int(layer), relative_depth=float(part["relative_depth"].iloc[0]),
                         onset_step=float(reached["step"].iloc[0]) if len(reached) else float("nan")))
    return pd.DataFrame(rows)


def final_profile(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape",
                  groups: tuple[str, ...] = GROUPS + (ALL,)) -> pd.DataFrame:
    """The α profile at each run's last snapshot: ``depth, group, layer, relative_depth, value``."""
    grid = group_grid(snapshots, alpha_estimator, groups)
    last = grid.groupby("depth")["step"].transform("max")
    return grid[grid["step"] == last].drop(columns="step").reset_index(drop=True)


def spread_over_time(snapshots: pd.DataFrame, value: str = "alpha_shape",
                     groups: tuple[str, ...] = GROUPS) -> pd.DataFrame:
    """Per (depth, group, step): ``spread`` = max − min over layers of the group mean of
    ``value``. For α this is Δα as it forms; a persistent gradient stays up after it forms."""
    grid = group_grid(snapshots, value, groups)
    spread = grid.groupby(["depth", "group", "step"])["value"].agg(lambda v: v.max() - v.min())
    return spread.rename("spread").reset_index()


def delta_alpha(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape",
                groups: tuple[str, ...] = GROUPS + (ALL,)) -> pd.DataFrame:
    """Per (depth, group) at the last step: ``delta_alpha`` (max − min over layers),
    ``alpha_min, alpha_max``, the layer of the maximum ``peak_layer`` and its
    ``peak_position`` (relative depth; inside (0, 1) for an inverted U)."""
    profile = final_profile(snapshots, alpha_estimator, groups)
    rows = []
    for (depth, group), part in profile.groupby(["depth", "group"], sort=True):
        top = part.loc[part["value"].idxmax()]
        rows.append(dict(depth=int(depth), group=group, delta_alpha=float(part["value"].max() - part["value"].min()),
                         alpha_min=float(part["value"].min()), alpha_max=float(part["value"].max()),
                         peak_layer=int(top["layer"]), peak_position=float(top["relative_depth"])))
    return pd.DataFrame(rows)


def fit_power_law(x, y) -> dict[str, float]:
    """Least-squares fit of log y = log c + b log x: ``exponent`` b, ``prefactor`` c, ``r2``
    (of the log-log fit) and ``n`` points. Needs at least two points with x, y > 0."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape:
        raise ValueError(f"x and y differ in length: {x.shape} vs {y.shape}")
    if len(x) < 2 or len(np.unique(x)) < 2:
        raise ValueError(f"a power law needs at least two distinct x values, got {x.tolist()}")
    if np.any(x <= 0) or np.any(y <= 0):
        raise ValueError(f"a power law needs positive values: x={x.tolist()}, y={y.tolist()}")
    lx, ly = np.log(x), np.log(y)
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (intercept + slope * lx)
    total = ((ly - ly.mean()) ** 2).sum()
    r2 = 1.0 - (residual ** 2).sum() / total if total > 0 else float("nan")
    return dict(exponent=float(slope), prefactor=float(np.exp(intercept)), r2=float(r2), n=int(len(x)))


def delta_alpha_fits(table: pd.DataFrame) -> pd.DataFrame:
    """Power-law fit of ``delta_alpha`` against ``depth`` for each group of a ``delta_alpha``
    table: ``group, exponent, prefactor, r2, n, paper_exponent``."""
    rows = []
    for group, part in table.groupby("group", sort=False):
        try:
            fit = fit_power_law(part["depth"], part["delta_alpha"])
        except ValueError:
            fit = dict(exponent=float("nan"), prefactor=float("nan"), r2=float("nan"), n=int(len(part)))
        rows.append(dict(group=group, **fit, paper_exponent=PAPER_DELTA_ALPHA_EXPONENT))
    return pd.DataFrame(rows)


def asymmetry(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape") -> pd.DataFrame:
    """How much each group varies with depth, at the last step and at the wave's height:
    ``depth, group, compression_spread_final, compression_spread_max, alpha_spread_final``
    (spreads are max − min over layers). Q/K carrying the depth dependence and V/O
    compressing uniformly shows as larger spreads for Q/K than for V/O."""
    comp = spread_over_time(snapshots, "compression")
    alpha = spread_over_time(snapshots, alpha_estimator)
    last = comp.groupby("depth")["step"].transform("max")
    final_comp = comp[comp["step"] == last].set_index(["depth", "group"])["spread"]
    max_comp = comp.groupby(["depth", "group"])["spread"].max()
    last_a = alpha.groupby("depth")["step"].transform("max")
    final_alpha = alpha[alpha["step"] == last_a].set_index(["depth", "group"])["spread"]
    out = pd.DataFrame(dict(compression_spread_final=final_comp, compression_spread_max=max_comp,
                            alpha_spread_final=final_alpha)).reset_index()
    return out


# --- the claims' statistics, with intervals over layers or snapshots ---------------------------------

LATE_FRACTION = 0.75  # the late snapshots: steps ≥ 0.75 · the run's last step


def zero_crossings(gradient: pd.DataFrame, depth: int, group: str = "Q/K") -> list[int]:
    """The steps (after initialisation) at which the wave gradient of (depth, group) changes
    sign: the first step of each new sign (steps where it is exactly 0 are skipped)."""
    part = gradient[(gradient["depth"] == depth) & (gradient["group"] == group)].sort_values("step")
    part = part[part["step"] > part["step"].min()]
    signs = np.sign(part["gradient"].to_numpy(float))
    steps = part["step"].to_numpy()
    kept = signs != 0
    signs, steps = signs[kept], steps[kept]
    return [int(steps[i]) for i in range(1, len(signs)) if signs[i] != signs[i - 1]]


def _wave_stats(grid: np.ndarray):
    """Statistics of a (layer, step) compression grid given resampled early/late layer indices:
    the largest gradient and the smallest."""
    def gradient(early, late):
        return grid[early.astype(int)].mean(axis=-2) - grid[late.astype(int)].mean(axis=-2)  # (..., steps)

    def peak(early, late, axis=-1):
        return gradient(early, late).max(axis=-1)

    def trough(early, late, axis=-1):
        return gradient(early, late).min(axis=-1)

    return peak, trough


def simultaneous_min(point: np.ndarray, boot: np.ndarray, level: float = LEVEL) -> tuple[float, float, float]:
    """``(min, low, high)``: the minimum of ``point`` (g at each of some snapshots) and an interval
    for it from a simultaneous band. ``boot`` (resamples, snapshots): g of each resample. Each
    snapshot's band is g ± c · sd (sd: its resamples' standard deviation), c the ``level``
    quantile over resamples of the largest |g* − g| / sd over the snapshots, so the band covers
    every snapshot's g at once; the interval is the minimum of the lower bounds to the minimum of
    the upper ones. A percentile interval of the resampled minimum would not do: the minimum
    picks whichever snapshot's noise dips lowest, and resampling layers keeps that pick."""
    point, boot = np.asarray(point, float), np.asarray(boot, float)
    sd = boot.std(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sd > 0, np.abs(boot - point) / sd, 0.0)
    c = float(np.quantile(z.max(axis=1), level))
    return float(point.min()), float((point - c * sd).min()), float((point + c * sd).min())


def wave_reversal(compression: pd.DataFrame, depth: int, group: str = "Q/K", *, n_resamples: int = N_RESAMPLES,
                  seed: int = 0) -> dict:
    """Does the compression wave run from early to late layers, then reverse? The statistics,
    with intervals that resample layers.

    ``compression``: :func:`group_grid` ``(snapshots, "compression")``. The wave gradient g(t)
    is the mean compression of the first half of the layers minus that of the second half, at
    every snapshot *after initialisation* (at step 0 nothing has compressed and g = 0, which
    would pin the peak's lower bound at 0). ``peak`` = max of g (the early layers' largest
    lead), ``trough`` = min of g (the late layers' largest lead), ``after`` = the minimum of g
    from the peak's step on. Intervals: the early and the late layers are resampled, each half
    on its own (``n_early``, ``n_late`` layers); the peak's and the trough's are percentile
    intervals, ``after``'s is simultaneous over the snapshots from the peak's step on
    (:func:`simultaneous_min`), so that taking the lowest of several noisy snapshots does not
    by itself put it below 0.

    ``leader``: ``early`` if the peak's interval lies above 0 and, where the trough's also lies
    below 0, the peak came first; ``late`` likewise for the trough; ``neither`` otherwise. The
    verdict that reads them is ``zones.report.verdicts.score_wave``.
    """
    part = compression[(compression["depth"] == depth) & (compression["group"] == group)]
    grid = part.pivot_table(index="layer", columns="step", values="value").sort_index()
    grid = grid.loc[:, [c for c in grid.columns if c > min(grid.columns)]] if grid.shape[1] > 1 else grid
    layers = grid.index.to_numpy()
    early = np.flatnonzero(layers < depth / 2).astype(float)
    late = np.flatnonzero(layers >= depth / 2).astype(float)
    values = grid.to_numpy(float)
    peak, trough = _wave_stats(values)
    p, p_low, p_high = unit_bootstrap([early, late], peak, paired=False, n_resamples=n_resamples, seed=seed)
    t, t_low, t_high = unit_bootstrap([early, late], trough, paired=False, n_resamples=n_resamples, seed=seed)
    g = values[early.astype(int)].mean(axis=0) - values[late.astype(int)].mean(axis=0)
    steps = grid.columns.to_numpy()
    start = int(np.argmax(g))                                   # the peak's snapshot: g from here on
    if min(early.size, late.size) < 2:
        a, a_low, a_high = float(g[start:].min()), NAN, NAN
    else:
        rng = np.random.default_rng(seed)
        e_idx = early.astype(int)[rng.integers(0, early.size, (n_resamples, early.size))]
        l_idx = late.astype(int)[rng.integers(0, late.size, (n_resamples, late.size))]
        boot = values[e_idx][..., start:].mean(axis=1) - values[l_idx][..., start:].mean(axis=1)
        a, a_low, a_high = simultaneous_min(g[start:], boot)
    peak_step, trough_step = int(steps[int(np.argmax(g))]), int(steps[int(np.argmin(g))])
    early_led, late_led = interval_side(p_low, p_high, 0.0) == "above", interval_side(t_low, t_high, 0.0) == "below"
    if early_led and late_led:
        leader = "early" if peak_step <= trough_step else "late"
    else:
        leader = "early" if early_led else "late" if late_led else "neither"
    return dict(depth=int(depth), group=group, leader=leader, peak=p, peak_low=p_low, peak_high=p_high,
                peak_step=peak_step, trough=t, trough_low=t_low, trough_high=t_high, trough_step=trough_step,
                after=a, after_low=a_low, after_high=a_high, n_early=int(early.size), n_late=int(late.size))


def late_delta_alpha(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape", group: str = ALL,
                     fraction: float = LATE_FRACTION) -> pd.DataFrame:
    """Δα (max − min over layers of the group's mean α) at each snapshot of the late part of
    training (steps ≥ ``fraction`` · the run's last step): ``depth, step, delta_alpha``."""
    spread = spread_over_time(snapshots, alpha_estimator, (group,))
    last = spread.groupby("depth")["step"].transform("max")
    late = spread[spread["step"] >= fraction * last]
    return late.rename(columns={"spread": "delta_alpha"})[["depth", "step", "delta_alpha"]].reset_index(drop=True)


def run_delta_alpha(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape", group: str = ALL) -> pd.DataFrame:
    """Δα of every training run: the mean of its late snapshots' Δα (:func:`late_delta_alpha`).
    Runs are told apart by ``seed`` (one run per depth without it): ``depth, seed, delta_alpha,
    n_late``."""
    if "seed" not in snapshots.columns:
        snapshots = snapshots.assign(seed=0)
    rows = []
    for (depth, seed), part in snapshots.groupby(["depth", "seed"]):
        late = late_delta_alpha(part, alpha_estimator, group)["delta_alpha"]
        rows.append(dict(depth=int(depth), seed=int(seed), delta_alpha=float(late.mean()), n_late=int(late.size)))
    return pd.DataFrame(rows, columns=["depth", "seed", "delta_alpha", "n_late"])


def delta_alpha_exponent(snapshots: pd.DataFrame, alpha_estimator: str = "alpha_shape", group: str = ALL, *,
                         level: float = LEVEL) -> dict:
    """The exponent b of Δα ∝ L^b over training runs, with its exact 95% interval.

    Each run is one point (log L, log Δα of the run, :func:`run_delta_alpha`); b is the
    least-squares slope through every run and its interval the t interval with n_runs − 2
    degrees of freedom (:func:`slope_interval`): the runs scatter about the power law, so the
    interval covers run-to-run variation (and any departure from a power law), as a bootstrap of
    2–4 runs cannot. It is undefined with fewer than two depths or three runs. A run whose Δα is
    not positive has no logarithm and is left out (``dropped``). Returns ``exponent, low, high,
    depths, runs`` (runs per depth), ``n_runs, df, dropped, group``."""
    runs = run_delta_alpha(snapshots, alpha_estimator, group)
    usable = runs[runs["delta_alpha"] > 0]
    depths = sorted(int(d) for d in usable["depth"].unique())
    per_depth = [int((usable["depth"] == d).sum()) for d in depths]
    x, y = np.log(usable["depth"].to_numpy(float)), np.log(usable["delta_alpha"].to_numpy(float))
    if len(depths) < 2:
        b = low = high = NAN
    else:
        b, low, high = (float(v) for v in slope_interval(x, y, level))
    return dict(exponent=b, low=low, high=high, depths=depths, runs=per_depth, n_runs=int(len(usable)),
                df=max(0, int(len(usable)) - 2), dropped=int(len(runs) - len(usable)), group=group)


def gradient_persistence(gradient: pd.DataFrame, snapshots: pd.DataFrame, depth: int, alpha_estimator: str,
                         group: str = ALL) -> dict:
    """Is the rank gradient a transient and the α gradient lasting? For the run of ``depth``:
    ``wave_share`` (|final Q/K wave gradient| / its largest magnitude), ``alpha_share`` (Δα of
    ``group`` at the snapshot nearest half of the steps / at the end), ``halfway_step`` (that
    snapshot's step) and ``steps`` (the run's last step)."""
    wave = gradient[(gradient["depth"] == depth) & (gradient["group"] == "Q/K")].sort_values("step")
    wave_share = float(abs(wave["gradient"].iloc[-1]) / max(wave["gradient"].abs().max(), 1e-12))
    spread = spread_over_time(snapshots, alpha_estimator, (group,))
    spread = spread[spread["depth"] == depth].sort_values("step")
    steps = int(spread["step"].max())
    halfway = spread.iloc[int((spread["step"] - steps / 2).abs().argmin())]
    final = float(spread["spread"].iloc[-1])
    alpha_share = float(halfway["spread"] / final) if final > 0 else NAN
    return dict(wave_share=wave_share, alpha_share=alpha_share, halfway_step=int(halfway["step"]), steps=steps)
