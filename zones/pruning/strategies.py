"""Depth-pruning strategies: which k decoder blocks to remove, for k = 1..k_max.

A strategy is a function ``f(ctx, k_max, seed, **params) -> plans`` where ``plans[k - 1]`` is
the list of the k blocks to remove, in the order the strategy chose them. ``ctx`` is a
:class:`PruningContext`: it hands out the model's α profile and the calibration
measurements the field's baselines need, each computed once and cached. Register a new
strategy with one decorator::

    @register_strategy("middle_out", description="the middle blocks first")
    def middle_out(ctx, k_max, seed):
        middle = ctx.n_blocks // 2
        order = sorted(range(1, ctx.n_blocks - 1), key=lambda i: abs(i - middle))
        return prefixes(order, k_max)

Built in (definitions in the book's methods page):

===========================  =========================================================
``zone_aware``               ours: α zones by least-squares segmentation, lowest zone
                             first, first/last block protected, removals spread out
``zone_aware_no_protection`` the same without protecting the first and last block
``zone_aware_no_spreading``  the same without avoiding adjacent removals
``zone_aware_one_zone``      the same with one zone (no segmentation)
``last_n``                   the last k blocks
``last_n_keep_last``         the k blocks just before the final block (Gromov et al.'s
                             practice: the deepest blocks except the last)
``random``                   k blocks uniformly at random (one plan per seed)
``random_protected``         the same among blocks 1..L−2 (first and last kept), the
                             like-for-like comparator of zone-aware's protected ends
``protect_spread``           first and last blocks kept, the k removals spread evenly over
                             the interior: zone-aware's protection and spreading, no α
``protect_spread_random``    the same with one random block per interior segment (seeded)
``alpha_lowest``             the k lowest-α blocks (no zones, no protection)
``block_influence``          ShortGPT: lowest BI = 1 − mean cos(block input, output)
``angular``                  Gromov et al.: the run of k blocks whose input and output
                             (last token) are closest in angular distance
``ablation_rank``            lowest single-block ΔLoss first
``greedy``                   SLEB: repeatedly remove the block whose removal hurts the
                             calibration loss least
===========================  =========================================================

The baselines that look at activations (``block_influence``, ``angular``,
``ablation_rank``, ``greedy``) use the calibration windows only, never the eval windows.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.core.cache import entry_path
from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.entries import cached_table
from zones.core.journal import Journal
from zones.measure.ablation import PARTS, ablation_table
from zones.measure.blocks import BlockTrace
from zones.measure.bootstrap import NonFiniteLossError
from zones.measure.scoring import evaluate_removals
from zones.measure.store import VERSION as LOSSES_VERSION  # the scored losses' arithmetic: part of every key
from zones.measure.subject import Subject, as_subject
from zones.measure.sublayer_removal import sublayer_params
from zones.spectra import alpha_table, layer_alpha

VERSION = "2"
MIN_REMAINING = 2  # a pruned model keeps at least this many blocks


class StrategyError(ValueError):
    """A strategy is unknown, misconfigured, or returned an invalid plan."""


# --------------------------------------------------------------------------------------------
# Exact 1-D least-squares segmentation
# --------------------------------------------------------------------------------------------

def segment_profile(values: Sequence[float], n_segments: int) -> np.ndarray:
    """Split ``values`` into ``n_segments`` contiguous segments minimising the within-segment
    sum of squared deviations from the segment mean; return a segment label per position.

    Exact dynamic programming, O(n_segments · n²). Ties go to the earliest breakpoints.
    """
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n == 0:
        raise ValueError("cannot segment an empty profile")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"profile has non-finite values at positions {np.flatnonzero(~np.isfinite(x)).tolist()}")
    if not 1 <= n_segments <= n:
        raise ValueError(f"n_segments must be between 1 and the profile length {n}, not {n_segments}")
    s1 = np.concatenate([[0.0], np.cumsum(x)])
    s2 = np.concatenate([[0.0], np.cumsum(x * x)])

    def sse(i: int, j: int) -> float:  # cost of one segment holding x[i:j]
        total = s1[j] - s1[i]
        return max(0.0, s2[j] - s2[i] - total * total / (j - i))

    # best[m][j]: least cost of x[:j] in m segments; cut[m][j]: where the last one starts
    best = np.full((n_segments + 1, n + 1), np.inf)
    cut = np.zeros((n_segments + 1, n + 1), dtype=int)
    best[0][0] = 0.0
    for m in range(1, n_segments + 1):
        for j in range(m, n + 1):
            for i in range(m - 1, j):
                cost = best[m - 1][i] + sse(i, j)
                if cost < best[m][j] - 1e-12:
                    best[m][j], cut[m][j] = cost, i
    labels = np.empty(n, dtype=int)
    j = n
    for m in range(n_segments, 0, -1):
        i = cut[m][j]
        labels[i:j] = m - 1
        j = i
    return labels


def segmentation_cost(values: Sequence[float], labels: Sequence[int]) -> float:
    """Within-segment sum of squared deviations from each segment's mean."""
    x = np.asarray(values, dtype=np.float64)
    labels = np.asarray(labels)
    return float(sum(((x[labels == z] - x[labels == z].mean()) ** 2).sum() for z in np.unique(labels)))


def bic_segment_count(values: Sequence[float], max_segments: int = 6) -> int:
    """Number of segments (1..max_segments) with the lowest BIC under a Gaussian step model:
    BIC(m) = n · ln(RSS_m / n) + (2m − 1) · ln n  (m means and m − 1 breakpoints)."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    floor = 1e-12 * max(1.0, float(np.var(x)) * n)  # a perfect fit must not give −∞
    scores = []
    for m in range(1, min(max_segments, n) + 1):
        rss = segmentation_cost(x, segment_profile(x, m))
        scores.append(n * math.log(max(rss, floor) / n) + (2 * m - 1) * math.log(n))
    return int(np.argmin(scores)) + 1


def alpha_zones(profile: pd.Series, n_zones: int | str = 3, max_zones: int = 6) -> pd.DataFrame:
    """Zones of an α profile (a Series indexed by layer).

    Columns: ``layer, alpha, zone`` (0 = the shallowest zone), ``zone_mean`` (the zone's mean
    α) and ``zone_rank`` (0 = the lowest-mean zone, pruned first). ``n_zones="bic"`` chooses
    the count by :func:`bic_segment_count`.
    """
    profile = profile.sort_index()
    values = profile.to_numpy(dtype=np.float64)
    if n_zones == "bic":
        n_zones = bic_segment_count(values, max_zones)
    if isinstance(n_zones, bool) or not isinstance(n_zones, (int, np.integer)):
        raise StrategyError(f"n_zones must be a positive integer or 'bic', not {n_zones!r}")
    labels = segment_profile(values, int(n_zones))
    df = pd.DataFrame({"layer": profile.index.astype(int), "alpha": values, "zone": labels})
    df["zone_mean"] = df.groupby("zone")["alpha"].transform("mean")
    means = df.groupby("zone")["alpha"].mean()
    rank = {zone: r for r, zone in enumerate(sorted(means.index, key=lambda z: (means[z], z)))}
    df["zone_rank"] = df["zone"].map(rank)
    return df


# --------------------------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------------------------

BLOCK, SUBLAYER = "block", "sublayer"
KINDS = (BLOCK, SUBLAYER)
TOLERANCE = 0.01  # a sublayer plan reaches a budget when it removes at least (1 − TOLERANCE) of its parameters


@dataclass(frozen=True)
class Strategy:
    """A registered strategy. ``kind`` says what it removes and what its function returns:

    * ``block``: ``function(ctx, k_max, seed, **params)`` returns ``plans``, ``plans[k - 1]``
      the k whole blocks to remove;
    * ``sublayer``: ``function(ctx, target_params, seed, **params)`` returns one removal order
      of ``(layer, part)`` sublayers (``part``: ``attn`` or ``mlp``) that removes at least
      ``target_params`` parameters (or every sublayer it would ever remove); its plan at k is
      the shortest prefix removing k blocks' parameters (:func:`plan_at_budget`).

    :meth:`plan` applies the common check of the kind (:func:`check_plans`,
    :func:`check_sublayer_order`) to whatever the function returns.
    """

    name: str
    function: Callable[..., list]
    params: dict[str, Any] = field(default_factory=dict)
    seeded: bool = False            # one plan per seed (otherwise seed 0 only)
    uses_calibration: bool = False  # needs the calibration windows
    cost: int = 0                   # planning order: cheap strategies are planned (and fail) first
    description: str = ""
    kind: str = BLOCK

    def max_k(self, n_blocks: int) -> int:
        """How many blocks this strategy may remove from a model of ``n_blocks``."""
        protected = int(self.params.get("protect_first", 0)) + int(self.params.get("protect_last", 0))
        return n_blocks - max(MIN_REMAINING, protected)

    def plan(self, ctx: "PruningContext", k_max: int, seed: int = 0, **overrides) -> list:
        """The plans for k = 1..k_max, checked. ``overrides`` replace registered ``params`` of
        the same name (others are ignored). A block plan is a list of blocks; a sublayer plan a
        list of ``(layer, part)``, or ``None`` at a k whose parameters its order never reaches."""
        params = {**self.params, **{k: v for k, v in overrides.items() if k in self.params}}
        if self.kind == BLOCK:
            plans = self.function(ctx, k_max, seed, **params)
            check_plans(plans, k_max, ctx.n_blocks, self.name)
            return [[int(b) for b in p] for p in plans]
        sizes = ctx.sublayer_params()
        block = ctx.block_params()
        order = [(int(layer), str(part)) for layer, part in self.function(ctx, k_max * block, seed, **params)]
        check_sublayer_order(order, ctx.n_blocks, self.name)
        return [plan_at_budget(order, sizes, k * block) for k in range(1, k_max + 1)]


STRATEGIES: dict[str, Strategy] = {}


def register_strategy(name: str, *, seeded: bool = False, uses_calibration: bool = False,
                      cost: int = 0, description: str = "", replace: bool = False, kind: str = BLOCK, **params):
    """Decorator: register ``function`` as strategy ``name`` of ``kind`` (``block``:
    ``function(ctx, k_max, seed, **params)``; ``sublayer``: ``function(ctx, target_params,
    seed, **params)``, see :class:`Strategy`).

    Keyword ``params`` are passed to the function, so one function can be registered under
    several names with different settings (as the zone-aware recipe ablations are).
    """
    if not name or "," in name or name != name.strip():
        raise ValueError(f"strategy name {name!r} must be non-empty, without commas or outer spaces")
    if kind not in KINDS:
        raise ValueError(f"strategy kind must be one of {KINDS}; got {kind!r}")

    def decorator(function):
        if name in STRATEGIES and not replace:
            raise ValueError(f"strategy {name!r} is already registered (pass replace=True to override)")
        doc = description or (function.__doc__ or "").strip().split("\n")[0]
        STRATEGIES[name] = Strategy(name, function, dict(params), seeded, uses_calibration, cost, doc, kind)
        return function

    return decorator


def strategy_names(kind: str | None = None) -> list[str]:
    """The registered strategies' names, of ``kind`` (``block``, ``sublayer``) or all."""
    return [s.name for s in STRATEGIES.values() if kind is None or s.kind == kind]


def get_strategy(name: str, kind: str | None = BLOCK) -> Strategy:
    """The registered strategy ``name``; with ``kind`` (``block`` by default, ``None``: any),
    one of that kind."""
    if name not in STRATEGIES:
        raise StrategyError(f"unknown strategy {name!r}; available: {', '.join(strategy_names(kind))}")
    strategy = STRATEGIES[name]
    if kind is not None and strategy.kind != kind:
        raise StrategyError(f"{name!r} is a {strategy.kind} strategy, not a {kind} one; {kind} strategies: "
                            f"{', '.join(strategy_names(kind))}")
    return strategy


def available_strategies() -> pd.DataFrame:
    """The registry as a table: ``strategy, kind, seeded, uses_calibration, params, description``."""
    return pd.DataFrame([dict(strategy=s.name, kind=s.kind, seeded=s.seeded, uses_calibration=s.uses_calibration,
                              params=json.dumps(s.params), description=s.description)
                         for s in STRATEGIES.values()])


def check_plans(plans, k_max: int, n_blocks: int, name: str = "strategy") -> None:
    """A plan list must hold, for k = 1..k_max, k distinct blocks in range."""
    if len(plans) != k_max:
        raise StrategyError(f"{name} returned {len(plans)} plans for k = 1..{k_max}")
    for k, plan in enumerate(plans, start=1):
        blocks = [int(b) for b in plan]
        if len(blocks) != k or len(set(blocks)) != k:
            raise StrategyError(f"{name} returned {blocks} for k = {k}: need {k} distinct blocks")
        bad = [b for b in blocks if not 0 <= b < n_blocks]
        if bad:
            raise StrategyError(f"{name} returned blocks {bad} for k = {k}: the model has blocks 0..{n_blocks - 1}")


def check_sublayer_order(order, n_blocks: int, name: str = "strategy") -> None:
    """A sublayer order must list distinct ``(layer, part)`` sublayers, layers in range and parts
    ``attn`` or ``mlp``, at least one of them."""
    if not order:
        raise StrategyError(f"{name} returned an empty sublayer order")
    bad = [(layer, part) for layer, part in order if not 0 <= layer < n_blocks or part not in PARTS]
    if bad:
        raise StrategyError(f"{name} returned sublayers {bad}: the model has blocks 0..{n_blocks - 1}, parts "
                            f"{', '.join(PARTS)}")
    if len(set(order)) != len(order):
        raise StrategyError(f"{name} returned a sublayer twice: {[s for s in order if order.count(s) > 1][:2]}")


def plan_at_budget(order: Sequence[tuple[int, str]], params: pd.DataFrame, target_params: float) -> list[tuple[int, str]]:
    """The shortest prefix of ``order`` that removes at least ``(1 − TOLERANCE) · target_params``
    parameters (``params``: ``zones.measure.sublayer_removal.sublayer_params``); ``None`` when the whole
    order does not reach it."""
    size = params.set_index(["layer", "part"])["n_params"]
    total = 0.0
    for i, item in enumerate(order):
        total += float(size[tuple(item)])
        if total >= (1 - TOLERANCE) * target_params:
            return list(order[:i + 1])
    return None


def prefixes(order: Sequence[int], k_max: int) -> list[list[int]]:
    """Plans from one removal order: for each k, its first k blocks."""
    order = [int(b) for b in order]
    if len(order) < k_max:
        raise StrategyError(f"a removal order of {len(order)} blocks cannot give k = {k_max}")
    return [order[:k] for k in range(1, k_max + 1)]


# --------------------------------------------------------------------------------------------
# What strategies may look at
# --------------------------------------------------------------------------------------------

class PruningContext:
    """The model and data a strategy may use; expensive measurements are computed on first
    use and cached (by model and calibration fingerprints) when ``cache=True``."""

    def __init__(self, model: nn.Module | Subject, calibration: Windows | None = None, *,
                 alpha: pd.DataFrame | None = None, batch_size: int = 8, cache: bool = True,
                 progress: bool = True, dtype: str | None = None):
        self.subject = as_subject(model, dtype)  # the model at the door (zones.measure.subject)
        self.model = self.subject.model
        self.dtype = self.subject.dtype
        self.calibration = calibration
        self.batch_size = batch_size
        self.cache = cache
        self.progress = progress
        self.n_blocks = self.subject.n_blocks
        self._alpha = alpha
        self._hidden_stats: pd.DataFrame | None = None
        self._ablation: pd.DataFrame | None = None
        # The calibration windows' full-model traces, kept between greedy steps (evaluate_removals)
        self._traces: dict = {}
        self._memo: dict[str, Any] = {}

    # --- identity ------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return self.subject.fingerprint

    def _need_calibration(self, what: str) -> Windows:
        if self.calibration is None:
            raise StrategyError(f"{what} needs calibration windows; pass calibration_windows")
        return self.calibration

    def _key(self, kind: str, **extra) -> dict:
        windows = self._need_calibration(kind)
        device = self.subject.device.type
        return dict(kind=kind, version=VERSION, losses=LOSSES_VERSION, model=self.fingerprint, windows=windows.fingerprint,
                    n_windows=windows.n_windows, batch_size=self.batch_size, device=device, dtype=self.dtype,
                    **extra)

    # --- α ---------------------------------------------------------------------------------
    @property
    def alpha(self) -> pd.DataFrame:
        """The per-matrix α table (``zones.spectra.alpha_table``), computed on first use."""
        if self._alpha is None:
            self._alpha = alpha_table(self.model)
        return self._alpha

    def layer_alpha(self, alpha_estimator: str = "alpha_shape", alpha_role: str = "q") -> pd.Series:
        """α per block (a Series indexed by layer), from ``zones.spectra.layer_alpha``."""
        profile = layer_alpha(self.alpha, alpha_estimator=alpha_estimator, alpha_role=alpha_role).sort_index()
        if len(profile) != self.n_blocks or list(profile.index) != list(range(self.n_blocks)):
            raise StrategyError(f"the α table has layers {list(profile.index)} but the model has "
                                f"{self.n_blocks} blocks: is it the table of another model?")
        if profile.isna().any():
            raise StrategyError(
                f"{alpha_estimator} ({alpha_role}) is NaN for layers {profile.index[profile.isna()].tolist()} (the α table's "
                f"note column says why), so the α-based strategies cannot rank them: leave zone_aware*, "
                f"alpha_lowest out of --strategies, or register a variant on a finite estimator "
                f"(register_strategy('zone_aware_esd', alpha_estimator='alpha_esd', ...)(zone_aware))")
        return profile

    # --- calibration measurements ------------------------------------------------------------
    def hidden_stats(self) -> pd.DataFrame:
        """Similarity of the hidden states entering block ``start`` and leaving block
        ``start + span - 1``, on the calibration windows, for every run of blocks.

        Columns: ``start, span``; ``mean_cos`` (cosine averaged over every token position);
        ``angular_last`` (arccos(cos)/π of the last token of each window, averaged over
        windows). Hidden states are the residual stream before the final norm.
        """
        if self._hidden_stats is None:
            compute = lambda: _hidden_stats(self.subject, self._need_calibration("hidden_stats"),
                                            self.batch_size, self.progress)
            self._hidden_stats = (cached_table("pruning-hidden-stats", self._key("pruning-hidden-stats"), compute)
                                  if self.cache else compute())
        return self._hidden_stats

    def ablation(self) -> pd.DataFrame:
        """Single-block ablation on the calibration windows (``zones.measure.ablation.ablation_table``)."""
        if self._ablation is None:
            self._ablation = ablation_table(self.subject, self._need_calibration("ablation_rank"),
                                            batch_size=self.batch_size, cache=self.cache,
                                            progress=self.progress)
        return self._ablation

    def memo(self, name: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per context under ``name``: a measurement several strategies share."""
        if name not in self._memo:
            self._memo[name] = compute()
        return self._memo[name]

    def sublayer_params(self) -> pd.DataFrame:
        """Parameters of every sublayer (``zones.measure.sublayer_removal.sublayer_params``)."""
        return self.memo("sublayer_params", lambda: sublayer_params(self.model, self.subject.adapter))

    def block_params(self) -> float:
        """The mean block's parameters: the budget of one block for the sublayer strategies."""
        return float(self.sublayer_params().groupby("layer")["n_params"].sum().mean())

    def calibration_losses(self, removals: Sequence[Sequence[int]], desc: str = "calibration") -> list[float]:
        """Mean calibration loss with each removal set skipped (prefix-shared evaluation)."""
        results = evaluate_removals(self.subject, self._need_calibration(desc), removals,
                                    batch_size=self.batch_size, progress=self.progress, desc=desc,
                                    traces=self._traces, cache=self.cache)
        return [r.loss for r in results]


def _hidden_stats(subject: Subject, windows: Windows, batch_size: int, progress: bool) -> pd.DataFrame:
    subject.check_fit(windows)
    n = subject.n_blocks
    device = subject.device
    cos_sum = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    angle_sum = torch.zeros(n + 1, n + 1, dtype=torch.float64)
    n_tokens = n_windows = 0
    batches = list(windows.input_ids.split(batch_size))
    first = 0
    for ids in tqdm(batches, desc="hidden states", disable=not progress, leave=False):
        with subject.precision():
            trace = BlockTrace(subject.model, ids.to(device), subject.adapter)
        # states[j]: input of block j (j = n: the output of the last block)
        states = [trace.block_input(j) for j in range(n)] + [trace.final_hidden]
        for j, state in enumerate(states):
            finite = torch.isfinite(state).flatten(1).all(-1)
            if not bool(finite.all()):
                where = "the output of the last block" if j == n else f"the input of block {j}"
                raise NonFiniteLossError(
                    f"the hidden states on the calibration windows are not finite at {where} (window "
                    f"{first + int((~finite).nonzero()[0, 0])} of {windows.n_windows}): check the model's weights "
                    f"for NaN/inf")
        first += ids.shape[0]
        unit = torch.stack([nn.functional.normalize(s.double(), dim=-1) for s in states])  # (n+1, B, T, d)
        del trace, states
        # Σ over tokens of cos(state i, state j) is one dot product of the flattened unit states.
        flat = unit.reshape(n + 1, -1)
        cos_sum += (flat @ flat.T).cpu()
        last = unit[:, :, -1]  # (n+1, B, d)
        cos_last = torch.einsum("ibd,jbd->ijb", last, last).clamp(-1, 1)
        angle_sum += (torch.arccos(cos_last) / math.pi).sum(-1).cpu()
        n_tokens += unit.shape[1] * unit.shape[2]
        n_windows += ids.shape[0]
    rows = [dict(start=i, span=j - i, mean_cos=float(cos_sum[i, j] / n_tokens),
                 angular_last=float(angle_sum[i, j] / n_windows))
            for i in range(n) for j in range(i + 1, n + 1)]
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------------------------
# Built-in strategies
# --------------------------------------------------------------------------------------------

def zone_aware_order(profile: pd.Series, *, n_zones: int | str = 3, max_zones: int = 6,
                     protect_first: int = 1, protect_last: int = 1, spread: bool = True) -> list[int]:
    """The zone-aware removal order of every removable block of an α profile.

    Priority: zones by mean α ascending, then α ascending inside a zone (ties: shallower
    first). With ``spread``, each next block is the highest-priority one not adjacent to a
    block already removed; only when every remaining candidate is adjacent is adjacency
    allowed (then the highest-priority one is taken).
    """
    for knob, value in (("protect_first", protect_first), ("protect_last", protect_last)):
        try:
            check_int(value, knob, min=0)
        except ValueError as error:
            raise StrategyError(str(error)) from None
    zones = alpha_zones(profile, n_zones, max_zones)
    n = len(zones)
    protected = set(range(protect_first)) | set(range(n - protect_last, n))
    candidates = zones[~zones["layer"].isin(protected)]
    priority = candidates.sort_values(["zone_rank", "alpha", "layer"])["layer"].tolist()
    order: list[int] = []
    removed: set[int] = set()
    while len(order) < len(priority):
        remaining = [b for b in priority if b not in removed]
        if spread:
            apart = [b for b in remaining if b - 1 not in removed and b + 1 not in removed]
            choice = (apart or remaining)[0]
        else:
            choice = remaining[0]
        order.append(choice)
        removed.add(choice)
    return order


@register_strategy("zone_aware", alpha_estimator="alpha_shape", alpha_role="q", n_zones=3, max_zones=6,
                   protect_first=1, protect_last=1, spread=True,
                   description="α zones (least-squares), lowest zone first, ends protected, spread out")
def zone_aware(ctx, k_max, seed, *, alpha_estimator, alpha_role, n_zones, max_zones, protect_first, protect_last, spread):
    """Zone-aware pruning (ours): see :func:`zone_aware_order`."""
    order = zone_aware_order(ctx.layer_alpha(alpha_estimator, alpha_role), n_zones=n_zones, max_zones=max_zones,
                             protect_first=protect_first, protect_last=protect_last, spread=spread)
    return prefixes(order, k_max)


_ZONE_DEFAULTS = dict(alpha_estimator="alpha_shape", alpha_role="q", n_zones=3, max_zones=6,
                      protect_first=1, protect_last=1, spread=True)
register_strategy("zone_aware_no_protection", **dict(_ZONE_DEFAULTS, protect_first=0, protect_last=0),
                  description="zone-aware without protecting the first and last block")(zone_aware)
register_strategy("zone_aware_no_spreading", **dict(_ZONE_DEFAULTS, spread=False),
                  description="zone-aware without avoiding adjacent removals")(zone_aware)
register_strategy("zone_aware_one_zone", **dict(_ZONE_DEFAULTS, n_zones=1),
                  description="zone-aware with a single zone (no segmentation)")(zone_aware)


@register_strategy("last_n", description="the last k blocks")
def last_n(ctx, k_max, seed):
    """The last k blocks (the deepest removed first)."""
    return prefixes(range(ctx.n_blocks - 1, -1, -1), k_max)


@register_strategy("last_n_keep_last", protect_first=0, protect_last=1,
                   description="the k blocks just before the final block")
def last_n_keep_last(ctx, k_max, seed, *, protect_first, protect_last):
    """The deepest blocks except the last ``protect_last`` (deepest removed first): the
    practitioners' Last-N (Gromov et al., 2024), which keeps the final block."""
    return prefixes(range(ctx.n_blocks - 1 - protect_last, protect_first - 1, -1), k_max)


@register_strategy("random", seeded=True, protect_first=0, protect_last=0,
                   description="k blocks uniformly at random")
def random_blocks(ctx, k_max, seed, *, protect_first, protect_last):
    """The first k blocks of a uniformly random permutation (numpy Generator, ``seed``):
    for each k, a uniformly random k-subset, nested across k."""
    allowed = np.arange(protect_first, ctx.n_blocks - protect_last)
    return prefixes(np.random.default_rng(seed).permutation(allowed), k_max)


register_strategy("random_protected", seeded=True, protect_first=1, protect_last=1,
                  description="k blocks at random among all but the first and the last")(random_blocks)


def spread_positions(n_blocks: int, k: int, *, protect_first: int = 1, protect_last: int = 1,
                     rng: np.random.Generator | None = None) -> list[int]:
    """k blocks spread evenly over the interior ``protect_first .. n_blocks − protect_last − 1``:
    the interior (m blocks) is cut into k segments of equal length (up to one block), and each
    gives one block: the one at its centre, ``protect_first + ⌊(i + ½)·m/k⌋`` for segment i, or
    with ``rng`` a uniformly random block of the segment. The protected ends are never chosen;
    without ``rng`` the gaps between consecutive removals are ⌊m/k⌋ or ⌈m/k⌉."""
    interior = n_blocks - protect_first - protect_last
    if not 1 <= k <= interior:
        raise StrategyError(f"cannot spread {k} removals over the {max(interior, 0)} interior blocks")
    edges = [protect_first + (i * interior) // k for i in range(k + 1)]  # segment i: edges[i] .. edges[i+1] − 1
    if rng is None:
        return [protect_first + ((2 * i + 1) * interior) // (2 * k) for i in range(k)]
    return [int(rng.integers(edges[i], edges[i + 1])) for i in range(k)]


@register_strategy("protect_spread", protect_first=1, protect_last=1,
                   description="first and last blocks kept, k removals spread evenly over the rest (no α)")
def protect_spread(ctx, k_max, seed, *, protect_first, protect_last):
    """Zone-aware's two rules without α: the ends protected, the k removals spread evenly over
    the interior (:func:`spread_positions`). Deterministic; the plans of successive k are not
    nested (each k spreads its own k)."""
    return [spread_positions(ctx.n_blocks, k, protect_first=protect_first, protect_last=protect_last)
            for k in range(1, k_max + 1)]


@register_strategy("protect_spread_random", seeded=True, protect_first=1, protect_last=1,
                   description="first and last blocks kept, one random block in each of k equal interior segments")
def protect_spread_random(ctx, k_max, seed, *, protect_first, protect_last):
    """The seeded variant of :func:`protect_spread`: the interior cut into k equal segments, one
    uniformly random block of each (numpy Generator, ``seed``; the k plans drawn in turn)."""
    rng = np.random.default_rng(seed)
    return [spread_positions(ctx.n_blocks, k, protect_first=protect_first, protect_last=protect_last, rng=rng)
            for k in range(1, k_max + 1)]


@register_strategy("alpha_lowest", alpha_estimator="alpha_shape", alpha_role="q",
                   description="the k lowest-α blocks (no zones, no protection)")
def alpha_lowest(ctx, k_max, seed, *, alpha_estimator, alpha_role):
    """The plain spectral rule: blocks by α ascending (ties: shallower first)."""
    profile = ctx.layer_alpha(alpha_estimator, alpha_role)
    order = sorted(profile.index, key=lambda layer: (profile[layer], layer))
    return prefixes(order, k_max)


@register_strategy("block_influence", uses_calibration=True, cost=1,
                   description="ShortGPT: lowest block influence 1 − mean cos(input, output)")
def block_influence(ctx, k_max, seed):
    """ShortGPT (Men et al., 2024): BI_i = 1 − mean over tokens of cos(x_i, x_{i+1})."""
    stats = ctx.hidden_stats()
    one = stats[stats["span"] == 1].assign(bi=lambda d: 1.0 - d["mean_cos"])
    return prefixes(one.sort_values(["bi", "start"])["start"].tolist(), k_max)


@register_strategy("angular", uses_calibration=True, cost=1,
                   description="Gromov et al.: the k-block run with the least angular distance")
def angular(ctx, k_max, seed):
    """Gromov et al. (2024): for each k, the start ℓ minimising the mean angular distance
    arccos(cos(x_ℓ, x_{ℓ+k}))/π of the last token; remove blocks ℓ..ℓ+k−1."""
    stats = ctx.hidden_stats()
    plans = []
    for k in range(1, k_max + 1):
        runs = stats[stats["span"] == k].sort_values(["angular_last", "start"])
        start = int(runs["start"].iloc[0])
        plans.append(list(range(start, start + k)))
    return plans


@register_strategy("ablation_rank", uses_calibration=True, cost=2,
                   description="lowest single-block ΔLoss (calibration) first")
def ablation_rank(ctx, k_max, seed):
    """Blocks by single-block ablation ΔLoss on the calibration windows, ascending."""
    table = ctx.ablation()
    return prefixes(table.sort_values(["delta_loss", "layer"])["layer"].tolist(), k_max)


@register_strategy("greedy", uses_calibration=True, cost=3,
                   description="SLEB: repeatedly remove the block that hurts calibration loss least")
def greedy(ctx, k_max, seed):
    """SLEB-style greedy elimination (Song et al., 2024) on the calibration windows."""
    return prefixes(greedy_order(ctx, k_max), k_max)


def greedy_order(ctx: PruningContext, k_max: int) -> list[int]:
    """Greedy removal order: at each step, the remaining block whose removal (with the blocks
    removed so far) gives the lowest calibration loss (ties: shallower first).

    The first step's losses are the single-block ablation sweep on the same windows
    (``ctx.ablation()``). Each step is journaled, so an interrupted search resumes and a
    longer one extends a shorter one.
    """
    journal = None
    order: list[int] = []
    if ctx.cache:
        journal = Journal(entry_path("pruning-greedy", ctx._key("pruning-greedy"), ext="jsonl"),
                          required=("step", "removed", "block", "loss"))
        for row in journal.rows():
            if row["step"] != len(order) or row["removed"] != order:
                break  # a journal that does not extend the order step by step is ignored
            order.append(int(row["block"]))
    while len(order) < k_max:
        candidates = [b for b in range(ctx.n_blocks) if b not in order]
        if not order:  # the first step is the single-block ablation: share it with ablation_rank
            losses = ctx.ablation().set_index("layer").loc[candidates, "loss"].tolist()
        else:
            losses = ctx.calibration_losses([order + [b] for b in candidates],
                                            desc=f"greedy step {len(order) + 1}/{k_max}")
        best = int(np.argmin(losses))  # argmin takes the first: the shallowest on ties
        if journal is not None:
            journal.append(dict(step=len(order), removed=list(order), block=candidates[best],
                                loss=float(losses[best])))
        order.append(candidates[best])
    return order[:k_max]
