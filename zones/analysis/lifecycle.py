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

from zones.core.checks import check_float
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


def final_profile(snapshots: pd.DataFrame, estimator: str = "alpha_shape",
                  groups: tuple[str, ...] = GROUPS + (ALL,)) -> pd.DataFrame:
    """The α profile at each run's last snapshot: ``depth, group, layer, relative_depth, value``."""
    grid = group_grid(snapshots, estimator, groups)
    last = grid.groupby("depth")["step"].transform("max")
    return grid[grid["step"] == last].drop(columns="step").reset_index(drop=True)


def spread_over_time(snapshots: pd.DataFrame, value: str = "alpha_shape",
                     groups: tuple[str, ...] = GROUPS) -> pd.DataFrame:
    """Per (depth, group, step): ``spread`` = max − min over layers of the group mean of
    ``value``. For α this is Δα as it forms; a persistent gradient stays up after it forms."""
    grid = group_grid(snapshots, value, groups)
    spread = grid.groupby(["depth", "group", "step"])["value"].agg(lambda v: v.max() - v.min())
    return spread.rename("spread").reset_index()


def delta_alpha(snapshots: pd.DataFrame, estimator: str = "alpha_shape",
                groups: tuple[str, ...] = GROUPS + (ALL,)) -> pd.DataFrame:
    """Per (depth, group) at the last step: ``delta_alpha`` (max − min over layers),
    ``alpha_min, alpha_max``, the layer of the maximum ``peak_layer`` and its
    ``peak_position`` (relative depth; inside (0, 1) for an inverted U)."""
    profile = final_profile(snapshots, estimator, groups)
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


def asymmetry(snapshots: pd.DataFrame, estimator: str = "alpha_shape") -> pd.DataFrame:
    """How much each group varies with depth, at the last step and at the wave's height:
    ``depth, group, compression_spread_final, compression_spread_max, alpha_spread_final``
    (spreads are max − min over layers). Q/K carrying the depth dependence and V/O
    compressing uniformly shows as larger spreads for Q/K than for V/O."""
    comp = spread_over_time(snapshots, "compression")
    alpha = spread_over_time(snapshots, estimator)
    last = comp.groupby("depth")["step"].transform("max")
    final_comp = comp[comp["step"] == last].set_index(["depth", "group"])["spread"]
    max_comp = comp.groupby(["depth", "group"])["spread"].max()
    last_a = alpha.groupby("depth")["step"].transform("max")
    final_alpha = alpha[alpha["step"] == last_a].set_index(["depth", "group"])["spread"]
    out = pd.DataFrame(dict(compression_spread_final=final_comp, compression_spread_max=max_comp,
                            alpha_spread_final=final_alpha)).reset_index()
    return out
