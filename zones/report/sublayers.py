"""The sublayers chapter: attention and MLP importance against their α, and sublayer pruning
compared with block pruning at equal parameters removed, with loss, KL and top-1 agreement.

Rules the page states, each applied by the function named:

* a sublayer ρ is "detectable" only where its bootstrap interval excludes 0
  (``zones.report.verdicts.rho_verdict``);
* a strategy is *cheaper* than the reference at a budget only where the paired interval of
  their Δloss difference lies below 0, *costlier* where it lies above, else *not separable*
  (:func:`standing`);
* the attention/MLP asymmetry is stated from the paired interval of the difference
  "mean attention ΔLoss − mean MLP ΔLoss" over blocks (:func:`asymmetry`, from
  ``zones.analysis.sublayer_importance.part_difference``);
* with ``block_agreement=True``, every single-block ablation also gets KL and top-1 with
  intervals, and the page says whether KL orders the blocks as ΔLoss does by Spearman ρ over
  blocks (``zones.analysis.importance.spearman``).
"""
from __future__ import annotations

import gc
from typing import Sequence

import pandas as pd

from zones.analysis.importance import model_labels, spearman
from zones.analysis.sublayer_importance import part_difference, sublayer_importance, sublayer_rho_table
from zones.analysis.unit_intervals import interval_side
from zones.core.data import corpus_windows, load_corpus
from zones.core.glossary import default
from zones.core.models import load_model
from zones.core.progress import bars_shown
from zones.measure.ablation import ablation_window_losses
from zones.measure.agreement import agreement_window_losses, summarize_agreement
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.measure.subject import as_subject
from zones.measure.sublayer_removal import sublayer_params
from zones.pruning.sublayer_pruning import (
    DEFAULT_BLOCK_STRATEGIES,
    DEFAULT_SUBLAYER_STRATEGIES,
    compare_at_budget,
    plan_table,
    score_plans,
    tokens_per_second,
)
from zones.report.common import ChapterResult, precision_text, save
from zones.report.format import fmt_interval, fmt_ratio
from zones.report.verdicts import rho_verdict
from zones.series import series_sublayer_rho
from zones.series.runs import SUBLAYER_RHO_COLUMNS
from zones.spectra import alpha_table

# CPU budgets of the chapter on SmolLM2-135M: the book's one eval set (windows of 256, as every
# chapter), its first batch of 8 windows (the attention-only and MLP-only ablation costs about
# two single-block sweeps more; the whole-block rows are the layer-ablation chapter's, read from
# the loss store), one calibration window for the similarity and the greedy searches; budgets of
# 1-2 blocks.
SEQ_LEN = default("seq_len", context="sublayers")
EVAL_TOKENS = default("eval_tokens", context="sublayers")
CALIBRATION_TOKENS = default("calibration_tokens", context="sublayers")
K_MAX = default("k_max", context="sublayers")
SERIES_EVAL_TOKENS = default("series_eval_tokens", context="sublayers")   # held-out tokens per trained model (its own tokenizer and text)
SPEED_WINDOWS = 2   # windows per timed forward: a ratio of speeds needs no more (each forward is uncached work)


def series_rho_table(profile: str | None = "cpu", depths=None, train_overrides: dict | None = None, *,
                     series_eval_tokens: int = SERIES_EVAL_TOKENS, alpha_estimator: str = "alpha_shape", batch_size: int = 16,
                     n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0,
                     progress: bool = False) -> pd.DataFrame:
    """``zones.series.series_sublayer_rho`` of the trained series ``profile`` (the same
    arguments as the depth-series chapter, so its runs are read from the cache), with each
    row's ``verdict`` (``zones.report.verdicts.rho_verdict``); empty for ``profile=None``."""
    if profile is None:
        return pd.DataFrame(columns=[*SUBLAYER_RHO_COLUMNS, "verdict"])
    table = series_sublayer_rho(profile, depths, train_overrides, eval_tokens=series_eval_tokens, alpha_estimator=alpha_estimator,
                                batch_size=batch_size, n_resamples=n_resamples, n_permutations=n_permutations,
                                seed=seed, progress=progress)
    names = {"attn": "attention", "mlp": "MLP"}
    return table.assign(verdict=[rho_verdict(dict(ci_low=r.ci_low, ci_high=r.ci_high, n=r.n_blocks), r.model,
                                             f"{names[r.part]} {alpha_estimator}") for r in table.itertuples()])


def series_text(series: pd.DataFrame) -> str:
    """One sentence over a trained series' sublayer ρ: how many of its intervals exclude 0, per
    part (rule: ``interval_side`` of each interval against 0)."""
    if series.empty:
        return "No trained series was scored (profile=None)."
    parts = []
    for part, name in (("attn", "attention"), ("mlp", "MLP")):
        rows = series[series["part"] == part]
        sides = [interval_side(lo, hi, 0.0) for lo, hi in zip(rows["ci_low"], rows["ci_high"])]
        parts.append(f"for the {name} sublayers, {sides.count('above')} of {len(rows)} intervals lie above 0 and "
                     f"{sides.count('below')} below it")
    return f"Over the {series['model'].nunique()} trained models, " + "; ".join(parts) + "."


def standing(low: float, high: float) -> str:
    """A Δloss difference (strategy − reference) by its paired interval: ``"cheaper"`` (below
    0), ``"costlier"`` (above 0), ``"not separable"`` (straddles), ``"undefined"`` (NaN)."""
    return {"below": "cheaper", "above": "costlier", "straddles": "not separable",
            "undefined": "undefined"}[interval_side(low, high, 0.0)]


def asymmetry(long: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """``zones.analysis.sublayer_importance.part_difference`` (mean attention-only ΔLoss − mean MLP-only
    ΔLoss, paired interval over eval windows) with ``verdict``: ``"attention costs less"``
    (interval below 0), ``"attention costs more"`` (above), ``"not separable"``."""
    found = part_difference(long, n_resamples=n_resamples, seed=seed)
    side = interval_side(found["low"], found["high"], 0.0)
    verdict = {"below": "attention costs less", "above": "attention costs more"}.get(side, "not separable")
    return dict(found, verdict=verdict)


def speed_text(speed: pd.DataFrame) -> str:
    """The measured speed-ups (``zones.pruning.sublayer_pruning.tokens_per_second``), each with the range
    of its repeats, and what that range says: above 1 (faster in every repeat), below 1
    (slower in every repeat), or including 1 (not separable from the full model's speed). A
    timing on a shared machine, not a paired interval: the words say so."""
    rows = speed[speed["strategy"] != "full model"]
    if rows.empty:
        return "no speed measured."
    repeats = int(rows["repeats"].iloc[0])
    if repeats < 2:
        listed = "; ".join(f"{r.strategy} {fmt_ratio(r.speedup)}" for r in rows.itertuples())
        return f"{listed} (one repeat each: no spread was measured, so none of these is a finding)"
    parts = []
    for r in rows.itertuples():
        word = {"above": "faster in every repeat", "below": "slower in every repeat"}.get(
            interval_side(r.speedup_min, r.speedup_max, 1.0), "not separable from 1×")
        parts.append(f"{r.strategy} {fmt_ratio(r.speedup)} (range over {repeats} repeats "
                     f"{fmt_ratio(r.speedup_min)}–{fmt_ratio(r.speedup_max)}: {word})")
    return "; ".join(parts)


def budget_text(k: int) -> str:
    """``"1 block's parameters"``, ``"2 blocks' parameters"``."""
    return f"{int(k)} block's parameters" if int(k) == 1 else f"{int(k)} blocks' parameters"


def comparison_text(diffs: pd.DataFrame, reference: str) -> str:
    """``"at 2 blocks' parameters, attn_drop is cheaper than zone_aware (−0.12 [−0.2, −0.05] nats); …"``
    (the word from :func:`standing`)."""
    parts = []
    for _, r in diffs.iterrows():
        word = standing(r["low"], r["high"])
        parts.append(f"at {budget_text(r['k'])}, {r['strategy']} is {word} "
                     f"{'than' if word != 'not separable' else 'from'} {reference} "
                     f"({fmt_interval(r['difference'], r['low'], r['high'], signed=True)} nats)")
    return "; ".join(parts) + "." if parts else "no comparison."


def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = SEQ_LEN, eval_tokens: int = EVAL_TOKENS,
        calibration_tokens: int = CALIBRATION_TOKENS, batch_size: int = 8, k_max: int = K_MAX,
        block_strategies: Sequence[str] = DEFAULT_BLOCK_STRATEGIES,
        sublayer_strategies: Sequence[str] = DEFAULT_SUBLAYER_STRATEGIES, reference: str = "zone_aware",
        alpha_estimator: str = "alpha_shape", n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, speed_repeats: int = 2,
        block_agreement: bool = False, seed: int = 0, profile: str | None = "cpu", depths=None,
        train_overrides: dict | None = None, series_eval_tokens: int = SERIES_EVAL_TOKENS, out_dir: str = "results/sublayers", *,
        dtype: str = default("dtype", context="sublayers"), progress: bool | None = None) -> ChapterResult:
    """The chapter. For every model: the attention-only and MLP-only ablation (``parts=True``,
    cached) against the sublayers' α → ``importance.csv``, ``rho.csv``. For the first model:
    every strategy's plan at 1..k_max blocks' parameters, scored on the eval windows with loss,
    KL and top-1 (``plans.csv``), differences from ``reference`` (``differences.csv``) and the
    measured forward speed at k_max (``speed.csv``). ``block_agreement``: also KL and top-1 of
    every single-block ablation of the first model (``block_agreement.csv``; about L/2 forwards
    and L LM heads per window: off in the CPU budget). ``series_profile``: the same sublayer ρ on
    every model of the trained depth series ``profile``, ``depths``, ``train_overrides`` (as in the depth-series chapter; None: none; :func:`series_rho_table` → ``series_rho.csv``)."""
    progress = bars_shown(progress)
    names = [models] if isinstance(models, str) else list(models)
    text = load_corpus(corpus)
    importance, rhos, per_model = [], [], []
    scored = diffs = speed = agreement = agreement_by_block = kl_rho = precision = None
    for index, (name, label) in enumerate(zip(names, model_labels(names))):
        loaded = load_model(name)
        model = loaded.model
        subject = as_subject(model, dtype, fingerprint=loaded.fingerprint)  # the model at the door
        windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
        long = ablation_window_losses(subject, windows, parts=True, batch_size=batch_size, progress=progress)
        alphas = alpha_table(model)
        params = sublayer_params(model)
        table = sublayer_importance(long, alphas, params, alpha_estimator=alpha_estimator, n_resamples=n_resamples,
                                    seed=seed).assign(model=label)
        rho = sublayer_rho_table(long, alphas, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed).assign(model=label)
        importance.append(table)
        rhos.append(rho)
        headline = {p: rho[(rho["part"] == p) & (rho["estimator"] == alpha_estimator) & (rho["role"] == "weighted")]
                    .iloc[0].to_dict() for p in ("attn", "mlp")}
        asym = asymmetry(long, n_resamples=n_resamples, seed=seed)
        per_model.append(dict(model=label, name=name, n_blocks=int(long["layer"].nunique()),
                              n_tokens=int(windows.n_windows * (windows.seq_len - 1)),
                              attn=headline["attn"], mlp=headline["mlp"], asymmetry=asym,
                              attn_verdict=rho_verdict(headline["attn"], label, f"attention {alpha_estimator}"),
                              mlp_verdict=rho_verdict(headline["mlp"], label, f"MLP {alpha_estimator}")))
        if index == 0:
            calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
            plans = plan_table(subject, calibration, alphas, k_max=k_max, block_strategies=block_strategies,
                               sublayer_strategies=sublayer_strategies, batch_size=batch_size, progress=progress,
                               alpha_estimator=alpha_estimator)
            scored, agreement = score_plans(subject, windows, plans, batch_size=batch_size, progress=progress,
                                            n_resamples=n_resamples, seed=seed)
            scored = scored.assign(model=label)
            diffs = compare_at_budget(scored, agreement, reference, n_resamples=n_resamples, seed=seed)
            at_max = scored[scored["k"] == scored["k"].max()]
            speed = tokens_per_second(subject, windows, list(at_max["removed"]), batch_size=SPEED_WINDOWS,
                                      repeats=speed_repeats)
            speed = speed.merge(at_max[["removed", "strategy", "kind", "k", "n_params"]], on="removed", how="left")
            speed["strategy"] = speed["strategy"].fillna("full model")
            if block_agreement:
                blocks = summarize_agreement(agreement_window_losses(
                    subject, windows, [[i] for i in range(int(long["layer"].nunique()))], batch_size=batch_size,
                    progress=progress), n_resamples=n_resamples, seed=seed)
                agreement_by_block = blocks.assign(layer=blocks["removed"].astype(int), model=label)
                kl_rho = spearman(agreement_by_block["kl"], agreement_by_block["delta_loss"], n_resamples=n_resamples,
                                  n_permutations=n_permutations, seed=seed)
        if index == 0:
            precision = precision_text(dtype, subject.dtype)
        del loaded, model, subject
        gc.collect()
    importance = pd.concat(importance, ignore_index=True)
    rhos = pd.concat(rhos, ignore_index=True)
    series = series_rho_table(profile, depths, train_overrides, series_eval_tokens=series_eval_tokens, alpha_estimator=alpha_estimator,
                              n_resamples=n_resamples, n_permutations=n_permutations, seed=seed, progress=progress)
    first = per_model[0]
    cheapest = scored.loc[scored.groupby("k")["delta_loss"].idxmin()]
    numbers = dict(
        first_model=first["model"], n_blocks=first["n_blocks"], n_tokens=first["n_tokens"], seq_len=int(seq_len),
        alpha_name=f"weighted {alpha_estimator}",
        attn_rho=fmt_interval(first["attn"]["rho"], first["attn"]["ci_low"], first["attn"]["ci_high"]),
        attn_p=first["attn"]["p_value"],
        mlp_rho=fmt_interval(first["mlp"]["rho"], first["mlp"]["ci_low"], first["mlp"]["ci_high"]),
        mlp_p=first["mlp"]["p_value"],
        rho_verdict=" ".join(f"{m['attn_verdict']} {m['mlp_verdict']}" for m in per_model),
        asymmetry=fmt_interval(first["asymmetry"]["difference"], first["asymmetry"]["low"],
                               first["asymmetry"]["high"], signed=True),
        asymmetry_verdict=first["asymmetry"]["verdict"],
        k_max=int(k_max), reference=reference, comparison_text=comparison_text(diffs, reference),
        cheapest_text="; ".join(f"{budget_text(r['k'])}: {r['strategy']} "
                                f"(Δloss {fmt_interval(r['delta_loss'], r['delta_loss_low'], r['delta_loss_high'])} "
                                f"nats, KL {fmt_interval(r['kl'], r['kl_low'], r['kl_high'])}, top-1 "
                                f"{fmt_interval(100 * r['top1'], 100 * r['top1_low'], 100 * r['top1_high'])}%)"
                                for _, r in cheapest.iterrows()),
        speed_text=speed_text(speed), precision=precision)
    summary = dict(corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens, calibration_tokens=calibration_tokens,
                   k_max=k_max, reference=reference, alpha_estimator=alpha_estimator, models=per_model)
    numbers["block_agreement_text"] = (
        f"Over the single-block ablations of {first['model']}, KL from the full model and ΔLoss rank the blocks with "
        f"Spearman ρ = {fmt_interval(kl_rho.rho, kl_rho.ci_low, kl_rho.ci_high)}." if kl_rho is not None else
        f"The KL and top-1 of every single-block ablation are not measured in this build (block_agreement="
        f"{block_agreement}; a build with block_agreement=True measures them).")
    numbers["series_text"] = series_text(series)
    tables = dict(importance=importance, rho=rhos, plans=scored, differences=diffs, speed=speed, series_rho=series)
    if agreement_by_block is not None:
        tables["block_agreement"] = agreement_by_block
    out = save(out_dir, tables, summary)
    shown = scored[["strategy", "kind", "k", "removed", "n_params", "delta_loss", "delta_loss_low", "delta_loss_high",
                    "kl", "top1"]]
    return ChapterResult(dict(tables, shown=shown), numbers, summary, out)
