"""Pruning sublayers instead of whole blocks, compared at equal parameters removed.

Strategies over the 2L sublayers, registered in the one strategy registry
(``zones.pruning.strategies``) with kind ``sublayer`` (each returns one removal order; its plan at a
budget is the shortest prefix that removes at least the budget's parameters,
``zones.pruning.strategies.plan_at_budget``):

======================  ============================================================================
``attn_drop``           He et al. (2024), Attention Drop: attention sublayers only, the one whose
                        output stream is most similar to its input first (cos(x, x + attn(x)) on the
                        calibration windows)
``sublayer_similarity`` the same similarity over all 2L sublayers (attention and MLP together;
                        the MLP's stream is compared with and without its branch)
``sublayer_greedy``     BlockPruner (Zhong et al., 2024): repeatedly remove the sublayer whose removal
                        (with those removed so far) gives the lowest calibration loss
``zone_aware_attn``     ours over sublayers: α zones of the attention sublayers' α profile
                        (``zones.pruning.zone_aware_order``: lowest zone first, ends protected,
                        removals spread), attention sublayers only
======================  ============================================================================

Block strategies (``zones.pruning`` registry: ``zone_aware``, ``block_influence``, ``greedy``, ...)
remove k whole blocks; the sublayer strategies are planned at the same budgets, k blocks'
parameters (``zones.measure.sublayer_removal.sublayer_params``: a block's two sublayers hold exactly its
parameters). Every plan is scored on the same eval windows with loss, KL from the full model
and top-1 agreement (``zones.measure.agreement``), so each comparison gets a paired interval.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.analysis.sublayer_importance import sublayer_alpha
from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.entries import cached_table
from zones.core.glossary import default
from zones.core.progress import add_flops, count_module, matmul_flops, module_weights
from zones.measure.agreement import agreement_window_losses, summarize_agreement
from zones.measure.blocks import BlockTrace
from zones.measure.bootstrap import LEVEL, N_RESAMPLES, SEED, paired_bootstrap
from zones.measure.scoring import head_nll_windows
from zones.measure.store import VERSION as LOSSES_VERSION  # the scored losses' arithmetic: part of every key
from zones.measure.subject import Subject, as_subject
from zones.measure.sublayer_removal import (
    PARTS,
    format_removal,
    normalize_removal,
    removal_params,
    removed_sublayers,
)
from zones.pruning.strategies import (
    BLOCK,
    SUBLAYER,
    TOLERANCE,
    PruningContext,
    get_strategy,
    register_strategy,
    zone_aware_order,
)

VERSION = "1"
DEFAULT_SUBLAYER_STRATEGIES = tuple(default("sublayer_strategies"))  # + sublayer_greedy: gpu budget
DEFAULT_BLOCK_STRATEGIES = tuple(default("block_strategies"))
PLAN_COLUMNS = ["strategy", "kind", "k", "removed", "n_sublayers", "n_params", "params_ratio"]


# --- calibration measurements ----------------------------------------------------------------------

def sublayer_similarity(model: nn.Module | Subject, windows: Windows, *, batch_size: int = 8,
                        dtype: str | None = None, cache: bool = True) -> pd.DataFrame:
    """How little each sublayer changes the residual stream, on ``windows`` (calibration).

    Columns: ``layer, part, cos``: the cosine between the stream without and with the
    sublayer's branch, averaged over every token: cos(x, x + attn) for attention (x the
    block's input) and cos(y − mlp, y) for the MLP (y the block's output). He et al.'s
    similarity: the higher, the more redundant the sublayer.
    """
    subject = as_subject(model, dtype)
    subject.check_fit(windows)
    adapter, model = subject.adapter, subject.model

    def compute() -> pd.DataFrame:
        n = adapter.n_blocks
        sums = np.zeros((n, 2))
        count = 0
        seen: dict = {}
        handles = []
        for i, block in enumerate(adapter.blocks()):
            first = lambda out: out[0] if isinstance(out, tuple) else out  # noqa: E731
            handles.append(block.register_forward_pre_hook(
                lambda _m, a, kw, i=i: seen.__setitem__((i, "x"), a[0] if a else kw["hidden_states"]),
                with_kwargs=True))
            handles.append(adapter.attention(block).register_forward_hook(
                lambda _m, _a, out, i=i: seen.__setitem__((i, "attn"), first(out))))
            handles.append(adapter.mlp(block).register_forward_hook(
                lambda _m, _a, out, i=i: seen.__setitem__((i, "mlp"), first(out))))
            handles.append(block.register_forward_hook(lambda _m, _a, out, i=i: seen.__setitem__((i, "y"), first(out))))
        cos = lambda a, b: torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).sum()  # noqa
        try:
            with torch.inference_mode(), subject.precision():
                for ids in windows.input_ids.split(batch_size):
                    model.base_model(input_ids=ids.to(subject.device), use_cache=False)
                    for block in adapter.blocks():
                        count_module(block, ids.numel())
                    for i in range(n):
                        x, a, m, y = seen[(i, "x")], seen[(i, "attn")], seen[(i, "mlp")], seen[(i, "y")]
                        sums[i, 0] += float(cos(x, x + a))
                        sums[i, 1] += float(cos(y - m, y))
                    count += ids.numel()
                    seen.clear()
        finally:
            for h in handles:
                h.remove()
        rows = [dict(layer=i, part=p, cos=sums[i, j] / count) for j, p in enumerate(PARTS) for i in range(n)]
        return pd.DataFrame(rows, columns=["layer", "part", "cos"])

    if not cache:
        return compute()
    key = dict(kind="sublayer-similarity", version=VERSION, model=subject.fingerprint,
               windows=windows.fingerprint, n_windows=windows.n_windows, batch_size=batch_size, dtype=subject.dtype)
    return cached_table("sublayer-similarity", key, compute)


def _traces(subject: Subject, windows: Windows, batch_size: int) -> list[BlockTrace]:
    with subject.precision():
        return [BlockTrace(subject.model, ids.to(subject.device), subject.adapter)
                for ids in windows.input_ids.split(batch_size)]


def _loss_with(subject: Subject, traces, removal, path_start: dict) -> float:
    """Calibration loss of ``removal``: each batch starts at the first affected block from the
    stream ``path_start[batch]`` = (block, input of that block under a subset of ``removal``
    that agrees with it before that block)."""
    total = 0.0
    tokens = 0
    skipped = {l for l in {l for l, _ in removal} if {(l, p) for p in PARTS} <= set(removal)}
    partial = [(l, p) for l, p in removal if l not in skipped]
    with torch.inference_mode(), subject.precision(), removed_sublayers(subject.model, partial, subject.adapter):
        for b, trace in enumerate(traces):
            start, hidden = path_start[b]
            for layer in range(start, trace.n_blocks):
                if layer not in skipped:
                    hidden = trace.run_block(layer, hidden)
            total += float(head_nll_windows(subject.adapter, hidden, trace.input_ids).sum())
            tokens += trace.input_ids[:, 1:].numel()
    return total / tokens


def _paths(subject: Subject, traces, removal) -> list[list[torch.Tensor]]:
    """For each batch, the input of every block (and the last hidden state) under ``removal``."""
    n = subject.n_blocks
    skipped = {l for l in {l for l, _ in removal} if {(l, p) for p in PARTS} <= set(removal)}
    partial = [(l, p) for l, p in removal if l not in skipped]
    out = []
    with torch.inference_mode(), subject.precision(), removed_sublayers(subject.model, partial, subject.adapter):
        for trace in traces:
            start = min((l for l, _ in removal), default=n)
            path = [trace.block_input(b) for b in range(min(start + 1, n))]
            hidden = path[-1] if start < n else trace.final_hidden
            for layer in range(start, n):
                if layer not in skipped:
                    hidden = trace.run_block(layer, hidden)
                path.append(hidden)
            out.append(path if start < n else path + [trace.final_hidden])
    return out


def sublayer_greedy_order(model: nn.Module | Subject, windows: Windows, params: pd.DataFrame,
                          target_params: float, *, batch_size: int = 8, dtype: str | None = None,
                          cache: bool = True, progress: bool = True) -> pd.DataFrame:
    """BlockPruner's greedy search over sublayers, until ``target_params`` are removed.

    Each step scores every remaining sublayer added to the removed set on the calibration
    ``windows`` (each batch traced once; a candidate re-runs only the blocks from its own,
    on the stream of the set removed so far) and removes the one with the lowest loss
    (ties: shallower, attention first). Columns: ``step, layer, part, loss, n_params``
    (cumulative). Cached under the model's and windows' fingerprints and the target.
    """
    subject = as_subject(model, dtype)
    subject.check_fit(windows)
    n = subject.n_blocks
    size = params.set_index(["layer", "part"])["n_params"]

    def compute() -> pd.DataFrame:
        traces = _traces(subject, windows, batch_size)
        removed: list[tuple[int, str]] = []
        rows, total = [], 0.0
        bar = tqdm(desc="sublayer greedy", unit="step", disable=not progress, leave=False)
        while total < (1 - TOLERANCE) * target_params and len(removed) < 2 * n - 2:
            paths = _paths(subject, traces, normalize_removal(removed, n))
            best = None
            for layer in range(n):
                for part in PARTS:
                    if (layer, part) in removed:
                        continue
                    candidate = normalize_removal(removed + [(layer, part)], n)
                    starts = {b: (layer, paths[b][layer]) for b in range(len(traces))}
                    loss = _loss_with(subject, traces, candidate, starts)
                    if best is None or loss < best[0] - 1e-12:
                        best = (loss, layer, part)
            loss, layer, part = best
            removed.append((layer, part))
            total += float(size[(layer, part)])
            rows.append(dict(step=len(removed), layer=layer, part=part, loss=loss, n_params=total))
            bar.update()
        bar.close()
        return pd.DataFrame(rows, columns=["step", "layer", "part", "loss", "n_params"])

    if not cache:
        return compute()
    key = dict(kind="sublayer-greedy", version=VERSION, losses=LOSSES_VERSION, model=subject.fingerprint,
               windows=windows.fingerprint,
               n_windows=windows.n_windows, target=float(target_params), batch_size=batch_size, dtype=subject.dtype)
    return cached_table("sublayer-greedy", key, compute)


# --- the sublayer strategies (registered beside the block strategies, kind "sublayer") ----------------

def _similarity(ctx: PruningContext) -> pd.DataFrame:
    """:func:`sublayer_similarity` on the context's calibration windows, once per context."""
    return ctx.memo("sublayer_similarity", lambda: sublayer_similarity(
        ctx.subject, ctx._need_calibration("sublayer similarity"), batch_size=ctx.batch_size,
        cache=ctx.cache))


def _most_similar_first(table: pd.DataFrame) -> list[tuple[int, str]]:
    """Sublayers by similarity, the most similar (the most redundant) first; ties: shallower,
    attention first."""
    table = table.assign(rank=table["part"].map({p: i for i, p in enumerate(PARTS)}))
    ranked = table.sort_values(["cos", "layer", "rank"], ascending=[False, True, True])
    return list(zip(ranked["layer"].astype(int), ranked["part"]))


@register_strategy("attn_drop", kind=SUBLAYER, uses_calibration=True, cost=1,
                   description="He et al.: attention sublayers, most similar input and output first")
def attn_drop(ctx, target_params, seed):
    """Attention Drop (He et al., 2024): attention sublayers only, the one whose output stream
    is most similar to its input first."""
    similarity = _similarity(ctx)
    return _most_similar_first(similarity[similarity["part"] == "attn"])


@register_strategy("sublayer_similarity", kind=SUBLAYER, uses_calibration=True, cost=1,
                   description="all sublayers, most similar stream with and without the branch first")
def similar_sublayers(ctx, target_params, seed):
    """The same similarity over all 2L sublayers (attention and MLP together)."""
    return _most_similar_first(_similarity(ctx))


@register_strategy("sublayer_greedy", kind=SUBLAYER, uses_calibration=True, cost=3,
                   description="BlockPruner: greedy over sublayers on the calibration loss")
def sublayer_greedy(ctx, target_params, seed):
    """BlockPruner (Zhong et al., 2024): :func:`sublayer_greedy_order` until ``target_params``
    are removed."""
    steps = sublayer_greedy_order(ctx.subject, ctx._need_calibration("sublayer_greedy"), ctx.sublayer_params(),
                                  target_params, batch_size=ctx.batch_size, cache=ctx.cache,
                                  progress=ctx.progress)
    return list(zip(steps["layer"].astype(int), steps["part"]))


@register_strategy("zone_aware_attn", kind=SUBLAYER, alpha_estimator="alpha_shape",
                   description="α zones of the attention sublayers, lowest zone first, ends protected")
def zone_aware_attn(ctx, target_params, seed, *, alpha_estimator):
    """Ours over sublayers: the zone-aware order (``zones.pruning.zone_aware_order``) of the
    attention sublayers' weighted α profile, attention sublayers only."""
    alpha = sublayer_alpha(ctx.alpha, alpha_estimator, "weighted")
    profile = alpha[alpha["part"] == "attn"].set_index("layer")["alpha"].sort_index()
    return [(int(layer), "attn") for layer in zone_aware_order(profile)]


# --- plans -----------------------------------------------------------------------------------------

def plan_table(model: nn.Module | Subject, calibration: Windows, alphas: pd.DataFrame, *, k_max: int = 2,
               block_strategies: Sequence[str] = DEFAULT_BLOCK_STRATEGIES,
               sublayer_strategies: Sequence[str] = DEFAULT_SUBLAYER_STRATEGIES, batch_size: int = 8,
               dtype: str | None = None, cache: bool = True, progress: bool = True,
               alpha_estimator: str = "alpha_shape") -> pd.DataFrame:
    """Every strategy's plan at the budgets of k = 1..k_max blocks' parameters.

    Block strategies and sublayer strategies come from the one registry
    (``zones.pruning.strategies``, by kind); ``estimator`` is the α the sublayer strategies
    read. Columns: ``strategy, kind`` (``block`` or ``sublayer``), ``k``, ``removed``
    (``zones.measure.sublayer_removal.format_removal``), ``n_sublayers``, ``n_params`` (removed),
    ``params_ratio`` (``n_params`` over the parameters of the k blocks the block strategies
    remove: the mean block's, k times). A sublayer strategy whose order cannot reach a budget
    (attention-only, when the attention of all blocks holds fewer parameters) has no row there.
    """
    k_max = check_int(k_max, "k_max", min=1)
    chosen = [get_strategy(name, BLOCK) for name in block_strategies]
    chosen += [get_strategy(name, SUBLAYER) for name in sublayer_strategies]
    ctx = PruningContext(model, calibration, alpha=alphas, batch_size=batch_size, cache=cache, progress=progress,
                         dtype=dtype)
    params = ctx.sublayer_params()
    n = ctx.n_blocks
    rows = []
    for strategy in chosen:
        overrides = dict(alpha_estimator=alpha_estimator) if strategy.kind == SUBLAYER else {}
        for k, plan in enumerate(strategy.plan(ctx, k_max, **overrides), start=1):
            if plan is None:
                continue
            removal = normalize_removal(plan, n)
            rows.append(dict(strategy=strategy.name, kind=strategy.kind, k=k, removed=format_removal(removal),
                             n_sublayers=len(removal), n_params=removal_params(params, removal)))
    table = pd.DataFrame(rows, columns=PLAN_COLUMNS[:-1])
    table["params_ratio"] = table["n_params"] / (table["k"] * ctx.block_params())
    return table


# --- scoring and comparing -------------------------------------------------------------------------

def score_plans(model: nn.Module | Subject, windows: Windows, plans: pd.DataFrame, *, batch_size: int = 8,
                dtype: str | None = None, cache: bool = True, progress: bool = True,
                n_resamples: int = N_RESAMPLES, level: float = LEVEL,
                seed: int = SEED) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Score every plan on the eval ``windows``: (the plans with ``zones.measure.agreement``'s
    summary columns merged in — ``loss, delta_loss, kl, top1`` with ``_low``/``_high`` —, the
    long per-window table)."""
    removals = list(dict.fromkeys(plans["removed"]))
    long = agreement_window_losses(model, windows, removals, batch_size=batch_size, dtype=dtype, cache=cache,
                                   progress=progress)
    summary = summarize_agreement(long, n_resamples=n_resamples, level=level, seed=seed)
    return plans.merge(summary, on="removed", how="left"), long


def compare_at_budget(scored: pd.DataFrame, long: pd.DataFrame, reference: str, *, quantity: str = "delta_loss",
                      n_resamples: int = N_RESAMPLES, level: float = LEVEL, seed: int = SEED) -> pd.DataFrame:
    """Each strategy's ``quantity`` minus ``reference``'s at the same k, with a paired 95%
    interval on the same eval windows (the same resample for every pair).

    Columns: ``k, strategy, reference, difference, low, high``. ``quantity``: ``delta_loss``
    (nats), ``kl`` (nats per token) or ``top1`` (share of tokens).
    """
    column = {"delta_loss": "nll", "kl": "kl", "top1": "top1"}[quantity]
    wide = long.pivot(index="removed", columns="window", values=column)
    tokens = long.pivot(index="removed", columns="window", values="n_tokens").iloc[0].to_numpy(dtype=float)
    rows = []
    for k, part in scored.groupby("k"):
        ref = part[part["strategy"] == reference]
        if ref.empty:
            continue
        base = wide.loc[ref["removed"].iloc[0]].to_numpy(dtype=float)
        for _, row in part.iterrows():
            if row["strategy"] == reference:
                continue
            other = wide.loc[row["removed"]].to_numpy(dtype=float)
            iv = paired_bootstrap(lambda a, b, t: (a.sum(-1) - b.sum(-1)) / t.sum(-1), (other, base, tokens),
                                  n_resamples=n_resamples, level=level, seed=seed)
            rows.append(dict(k=int(k), strategy=row["strategy"], reference=reference, difference=float(iv.estimate),
                             low=float(iv.low), high=float(iv.high)))
    return pd.DataFrame(rows, columns=["k", "strategy", "reference", "difference", "low", "high"])


def running_weights(subject: Subject, removal) -> int:
    """The matrix weights a forward runs with ``removal`` (normalized ``(layer, part)`` pairs)
    removed: the model's (``zones.core.progress.module_weights``) less the removed sublayers'
    (a removed sublayer computes nothing)."""
    blocks, adapter = subject.adapter.blocks(), subject.adapter
    removed = sum(p.numel() for layer, part in removal
                  for p in (adapter.attention if part == "attn" else adapter.mlp)(blocks[layer]).parameters()
                  if p.dim() >= 2)
    return module_weights(subject.model) - int(removed)


def tokens_per_second(model: nn.Module | Subject, windows: Windows, removals: Sequence[str], *,
                      batch_size: int = 8, repeats: int = 3) -> pd.DataFrame:
    """Measured forward speed of each removal against the full model, side by side.

    For each repeat, the full model and every removal (``zones.measure.sublayer_removal.removed_sublayers``:
    removed sublayers compute nothing) run one forward (with its LM head) over the same first
    batch of windows,
    in turn, so load on the machine affects all alike. Columns: ``removed, seconds`` (median),
    ``tokens_per_s``, ``speedup`` (full model's median seconds over this one's), ``speedup_min,
    speedup_max`` (the range of the speed-up over the repeats, each repeat's full-model time
    over its own: the spread a reader can put beside the ratio; equal with one repeat) and
    ``repeats``. Not a test (timing).
    """
    repeats = check_int(repeats, "repeats", min=1)
    subject = as_subject(model)
    model = subject.model
    ids = windows.input_ids[:batch_size].to(subject.device)
    variants = [""] + [r for r in dict.fromkeys(removals) if r]
    n = subject.n_blocks
    times = {v: [] for v in variants}
    running = {v: running_weights(subject, normalize_removal(v, n)) for v in variants}
    with torch.inference_mode():
        for _ in range(repeats):
            for v in variants:
                with removed_sublayers(model, normalize_removal(v, n), subject.adapter):
                    start = time.perf_counter()
                    model(input_ids=ids, use_cache=False)  # end to end: blocks, final norm and LM head
                    times[v].append(time.perf_counter() - start)
                    add_flops(matmul_flops(running[v], ids.numel()))   # a timed forward is work too
    full = float(np.median(times[""]))
    rows = []
    for v, t in times.items():
        paired = np.asarray(times[""]) / np.asarray(t)   # repeat by repeat: the same load on both
        rows.append(dict(removed=v, seconds=float(np.median(t)), tokens_per_s=ids.numel() / float(np.median(t)),
                         speedup=full / float(np.median(t)), speedup_min=float(paired.min()),
                         speedup_max=float(paired.max()), repeats=int(repeats)))
    return pd.DataFrame(rows, columns=["removed", "seconds", "tokens_per_s", "speedup", "speedup_min", "speedup_max",
                                       "repeats"])
