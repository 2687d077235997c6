"""The layer-ablation chapter: which blocks the model cannot do without, with intervals.

ΔLoss intervals are the paired eval-window bootstrap of ``zones.measure.ablation`` (columns
``delta_loss_low, delta_loss_high``). Where a table has no interval columns, the interval
is NaN and no verdict is drawn from it. The rule "the first blocks matter most" is
``zones.report.verdicts.first_blocks_matter_most`` (the scorecard applies the same one).
"""
from __future__ import annotations

import math

import pandas as pd

import numpy as np

from zones.analysis.importance import (
    RESOLVED_SHARE,
    delta_loss_bounds,
    importance_frame,
    measure_models,
    ranking_resolution,
)
from zones.core.progress import bars_shown
from zones.measure.ablation import CHAPTER_DTYPE, DEFAULT_EVAL_TOKENS
from zones.report.common import NAN, ChapterResult, precision_text, save
from zones.report.format import fmt_int, fmt_interval
from zones.report.verdicts import first_blocks_matter_most


def ablation_numbers(table: pd.DataFrame, n_top: int = 3) -> dict:
    """What the chapter cites about one model's ablation table (plain values).

    ``n_blocks, n_tokens, base_loss, base_ppl``; ``top`` (the ``n_top`` blocks with the largest
    ΔLoss, largest first), ``top_delta, top_low, top_high``; ``median_delta``; ``top_share``
    (their share of the summed positive ΔLoss); ``n_lowering`` (ΔLoss ≤ 0) and
    ``n_not_raising`` (blocks whose interval includes or lies below 0: removing them alone has
    no detectable cost; NaN without intervals).
    """
    df = table.reset_index(drop=True)
    low, high = delta_loss_bounds(df)
    delta = df["delta_loss"].astype(float)
    order = delta.sort_values(ascending=False).index[:n_top]
    positive = float(delta.clip(lower=0).sum())
    base_loss = float(df["base_loss"].iloc[0])
    has_intervals = bool(low.notna().any())
    return dict(n_blocks=int(len(df)), n_tokens=int(df["n_tokens"].iloc[0]), base_loss=base_loss,
                base_ppl=float(math.exp(base_loss)),
                top=[int(df.loc[i, "layer"]) for i in order], top_delta=[float(delta[i]) for i in order],
                top_low=[float(low[i]) for i in order], top_high=[float(high[i]) for i in order],
                median_delta=float(delta.median()),
                top_share=float(delta[order].clip(lower=0).sum() / positive) if positive > 0 else NAN,
                n_lowering=int((delta <= 0).sum()),
                n_not_raising=int((low <= 0).sum()) if has_intervals else NAN)


CONCENTRATED_SHARE = 0.5   # "importance is concentrated" when the top three blocks carry over half of ΔLoss


def concentration_text(numbers: dict) -> str:
    """Whether importance is concentrated in a few blocks, from :func:`ablation_numbers`: the
    top three blocks' share of the summed positive ΔLoss against :data:`CONCENTRATED_SHARE`, and
    how many blocks have no detectable cost alone."""
    share = numbers["top_share"]
    if not share == share:
        return "No block raises the loss, so importance has no concentration to speak of."
    quiet = numbers["n_not_raising"]
    quiet_text = (f"; {quiet} of the {numbers['n_blocks']} blocks have no detectable cost alone"
                  if quiet == quiet else "")
    if share > CONCENTRATED_SHARE:
        return (f"Importance is concentrated: the top three blocks carry {100 * share:.0f}% of the summed ΔLoss"
                f"{quiet_text}.")
    return (f"Importance is spread out: the top three blocks carry only {100 * share:.0f}% of the summed ΔLoss"
            f"{quiet_text}.")


def top_blocks_text(numbers: dict, model: str) -> str:
    """``"block 0 (2.1 [1.9, 2.3] nats), block 29 (…) and block 3 (…) in M"``."""
    named = [f"block {i} ({fmt_interval(d, lo, hi, unit='nats')})" for i, d, lo, hi in
             zip(numbers["top"], numbers["top_delta"], numbers["top_low"], numbers["top_high"])]
    listed = named[0] if len(named) == 1 else ", ".join(named[:-1]) + f" and {named[-1]}"
    return f"{listed} in {model}"


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _block(result: dict, which: str) -> str:
    """``"block 3 (0.41 [0.37, 0.46] nats)"``: the block ``result[which]`` with its ΔLoss interval."""
    delta = fmt_interval(result[f"{which}_delta"], result[f"{which}_low"], result[f"{which}_high"], unit="nats")
    return f"block {result[which]} ({delta})"


def _overlap(result: dict) -> str:
    """Which later interval keeps the first blocks from being separated (the one reaching highest)."""
    if not all(v == v for v in (result["top_first_low"], result.get("reach_later_high", NAN))):
        return "there are no intervals to separate them"
    if result.get("reach_later", result["top_later"]) == result["top_later"]:
        return "their intervals overlap"
    return (f"the interval of {_block(result, 'reach_later')} reaches above the lower end of block "
            f"{result['top_first']}'s")


def first_blocks_sentence(result: dict) -> str:
    """The chapter's sentence on the paper's "first blocks matter most", from
    :func:`first_blocks_matter_most`: the verdict, and where *each* first block ranks, so a
    verdict carried by one block is not read as one about all of them."""
    first, later = _block(result, "top_first"), _block(result, "top_later")
    head = {"holds": f"The costliest of the first blocks ({result['first_blocks']}), {first}, costs more than any "
                     f"later block, the costliest of which is {later}, and the intervals do not overlap.",
            "does not hold": f"The first blocks do not matter most here: {later} costs more than any of blocks "
                             f"{result['first_blocks']} (the costliest, {first}), beyond the intervals.",
            "inconclusive": f"Whether the first blocks matter most is not settled at this budget: the costliest "
                            f"of blocks {result['first_blocks']} is {first}, the costliest later one {later}, "
                            f"and {_overlap(result)}."}[result["verdict"]]
    ranks = result.get("first_ranks") or {}
    if len(ranks) > 1:
        listed = ", ".join(f"block {b} {_ordinal(r)}" for b, r in ranks.items())
        head += f" By ΔLoss, of the {result['n_blocks']} blocks the first ones rank: {listed}."
    return head


def ranking_text(resolution: pd.DataFrame, n_tokens: int) -> str:
    """How much of the ranking by ΔLoss window noise can move, from :func:`ranking_resolution`:
    the blocks whose place is resolved, and for the rest the token budget that would resolve the
    median one (a half-width shrinks as 1/√tokens)."""
    judged = resolution.dropna(subset=["resolved"])
    if judged.empty:
        return "The table has no intervals, so whether window noise orders the blocks is not measured."
    resolved = judged[judged["resolved"].astype(bool)]
    rest = judged[~judged["resolved"].astype(bool)]
    word = "block" if len(resolved) == 1 else "blocks"
    named = f": {word} {', '.join(map(str, resolved['layer'].tolist()))}" if len(resolved) else ""
    text = (f"On {fmt_int(n_tokens)} eval tokens, {len(resolved)} of the {len(judged)} blocks hold a place in the "
            f"ranking by ΔLoss that window noise cannot move (an interval half-width at most a third of the gap "
            f"to the nearest-ranked block){named}.")
    if len(rest):
        need = float(np.median((rest["half_width"] / (RESOLVED_SHARE * rest["gap"])) ** 2))
        text += (f" The other {len(rest)} are ordered by noise as much as by importance: the median one would need "
                 f"about {need:.0f}× the tokens to hold its place.")
    return text


def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256, eval_tokens: int | None = DEFAULT_EVAL_TOKENS,
        batch_size: int = 8, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted",
        out_dir: str = "results/layer_ablation", *, dtype: str = CHAPTER_DTYPE,
        progress: bool | None = None) -> ChapterResult:
    """The chapter: the ablation of every model (``zones.analysis.importance.measure_models``, cached)
    → ``ablation.csv`` (all models, with α), ``summary.json``; numbers and sentences. ``dtype``:
    the scoring precision (``"auto"``: bfloat16 where native; the page says which ran)."""
    progress = bars_shown(progress)
    results = measure_models(models, corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens,
                             batch_size=batch_size, progress=progress, dtype=dtype)
    frame = importance_frame(results, alpha_estimator, alpha_role)
    per_model = []
    for r in results:
        numbers = ablation_numbers(r.ablation)
        claim = first_blocks_matter_most(r.ablation)
        per_model.append(dict(model=r.label, name=r.name, fingerprint=r.fingerprint, **numbers,
                              first_blocks=claim, first_blocks_text=first_blocks_sentence(claim)))
    first = per_model[0]
    glue = dict(model_names=", ".join(m["model"] for m in per_model), first_model=first["model"],
                n_tokens=first["n_tokens"], seq_len=int(seq_len), base_loss=first["base_loss"],
                base_ppl=first["base_ppl"], top3_text="; ".join(top_blocks_text(m, m["model"]) for m in per_model),
                top_block=first["top"][0], top_delta=first["top_delta"][0],
                top_interval=fmt_interval(first["top_delta"][0], first["top_low"][0], first["top_high"][0], unit="nats"),
                top_over_median=first["top_delta"][0] / first["median_delta"] if first["median_delta"] > 0 else NAN,
                top3_share=100 * first["top_share"], concentration_text=concentration_text(first),
                n_lowering_text="; ".join(f"{m['model']}: {m['n_lowering']} of {m['n_blocks']}" for m in per_model),
                n_not_raising_text="; ".join(f"{m['model']}: {m['n_not_raising']} of {m['n_blocks']}"
                                             for m in per_model),
                first_blocks_text=" ".join(f"{m['model']}: {m['first_blocks_text']}" for m in per_model),
                ranking_text=ranking_text(ranking_resolution(results[0].ablation), first["n_tokens"]),
                precision=precision_text(dtype, results[0].dtype))
    summary = dict(corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens, alpha_estimator=alpha_estimator,
                   alpha_role=alpha_role, dtype=results[0].dtype, models=per_model)
    overview = pd.DataFrame([{
        "model": m["model"], "blocks": m["n_blocks"], "tokens": m["n_tokens"], "loss (nats)": m["base_loss"],
        "top 3 blocks": ", ".join(map(str, m["top"])), "top 3 share of ΔLoss": f"{100 * m['top_share']:.0f}%",
        "blocks with ΔLoss ≤ 0": m["n_lowering"], "blocks without a detectable cost": m["n_not_raising"],
        "first blocks matter most": m["first_blocks"]["verdict"]} for m in per_model])
    tables = dict(ablation=frame)
    out = save(out_dir, tables, summary)
    return ChapterResult(dict(tables, overview=overview), glue, summary, out)
