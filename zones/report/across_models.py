"""The across-models chapter: the paper's argument model by model, side by side.

One row per model: SmolLM2-135M (``models``) and every trained run of the depth series
(``zones.series.train_series(depths, profile)``). Every number is read where the other chapters
left it, with their parameters, so a book that ran them computes almost nothing here:

* ρ(α, ΔLoss): the single-block ablation and α tables of ``zones.analysis.importance.measure_models``
  (the layer-ablation chapter's cache) and of ``zones.series.series_importance`` (the depth-series
  chapter's), Spearman ρ by ``zones.analysis.importance.spearman``, read by
  ``zones.report.verdicts.rho_verdict`` (against 0) and ``score_rho`` (the paper's band);
* zone-aware against ``last_n_keep_last`` at k = ⌈L/4⌉: ``zones.pruning.pair_at_k``, the sweep of the two
  strategies on the pruning chapter's eval windows (SmolLM2: every removal set is already in the loss
  store; a trained run: its own held-out windows, a few cheap forwards), Δloss with paired intervals,
  their difference (the same windows for both) and the strategies not separable from the best;
* the first blocks matter most (``zones.report.verdicts.first_blocks_matter_most``) and the shape of one
  role's α profile (``zones.analysis.profile.profile_shape``, blocks resampled).

What the models agree on and where they part is ``zones.report.verdicts.models_agreement``.
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd

from zones.analysis.importance import (
    ModelImportance,
    attribution,
    delta_loss_bounds,
    measure_models,
    model_labels,
    spearman,
    window_noise,
)
from zones.analysis.profile import profile_shape
from zones.analysis.unit_intervals import interval_side
from zones.core.checks import check_models
from zones.core.data import corpus_windows, load_corpus
from zones.core.glossary import default
from zones.core.models import load_model
from zones.core.progress import bars_shown
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.measure.ablation import CHAPTER_DTYPE
from zones.measure.subject import as_subject
from zones.pruning import get_strategy, pair_at_k
from zones.report.common import NAN, ChapterResult, save
from zones.report.format import fmt_interval, fmt_rho
from zones.report.verdicts import (
    LAST_N_KEEP_LAST,
    OURS,
    PAPER_RHO,
    first_blocks_matter_most,
    models_agreement,
    rho_verdict,
    score_rho,
)
from zones.series import heldout_windows, series_importance, train_series

STRATEGIES = (OURS, LAST_N_KEEP_LAST)   # the two strategies compared at k = ⌈L/4⌉
COLUMNS = ["model", "family", "blocks", "parameters", "corpus", "tokens", "rho", "rho_low", "rho_high", "rho_p",
           "rho_side", "rho_claim", "k", "pruning_tokens", "zone_aware", "zone_aware_low", "zone_aware_high",
           "keep_last", "keep_last_low", "keep_last_high", "diff", "diff_low", "diff_high", "best", "first_blocks",
           "shape", "rise", "rise_low", "rise_high", "peak_lift", "peak_lift_low", "peak_lift_high", "rank_trend", "rank_trend_low", "rank_trend_high",
           "rho_partial", "rho_partial_low", "rho_partial_high", "rho_partial_p", "rho_partial_undefined",
           "rho_inner", "rho_inner_low",
           "rho_inner_high", "rho_q", "rho_q_low", "rho_q_high", "rho_q_p"]
READINGS = {"rho_word": "ρ(α, ΔLoss) against 0", "rho_claim": f"the paper's ρ = {PAPER_RHO[0]}–{PAPER_RHO[1]}",
            "pruning_word": "zone-aware against Last-N keeping the last block at k = ⌈L/4⌉",
            "first_blocks": "the first blocks matter most", "shape": "the α profile's shape"}


def quarter_k(n_blocks: int) -> int:
    """The pruning depth every model is compared at: k = ⌈L/4⌉ blocks of L, or fewer where a
    strategy may not remove that many (at least two blocks remain, protected ones never go);
    0 when one of them can remove none."""
    return min([math.ceil(n_blocks / 4)] + [get_strategy(s).max_k(n_blocks) for s in STRATEGIES])


def rho_word(low: float, high: float) -> str:
    """ρ's interval against 0, in words: ``above 0``, ``below 0``, ``includes 0`` or ``undefined``."""
    return {"above": "above 0", "below": "below 0", "straddles": "includes 0",
            "undefined": "undefined"}[interval_side(low, high, 0.0)]


def pruning_word(diff_low: float, diff_high: float) -> str:
    """d = Δloss(zone-aware) − Δloss(Last-N keeping the last block), by its paired interval:
    ``zone-aware ahead`` (below 0), ``Last-N ahead`` (above 0), ``same blocks`` (zero width at 0),
    ``not separable`` (includes 0) or ``undefined``."""
    if diff_low == diff_high == 0:
        return "same blocks"
    return {"below": "zone-aware ahead", "above": "Last-N ahead", "straddles": "not separable",
            "undefined": "undefined"}[interval_side(diff_low, diff_high, 0.0)]


def best_text(best_set: str) -> str:
    """The strategies not separable from the best (``zones.pruning.best_sets``), in words."""
    names = [s for s in str(best_set).split(",") if s]
    if len(names) == 1:
        return names[0]
    return "not separable (" + " and ".join(names) + ")" if names else "undefined"


def compare_at_quarter(subject, windows, alpha: pd.DataFrame, *, model_name: str, batch_size: int,
                       n_resamples: int, seed: int, progress: bool) -> dict:
    """Zone-aware against Last-N keeping the last block at k = ⌈L/4⌉ on ``windows`` (the same
    windows for both; ``zones.pruning.pair_at_k``): each Δloss with its interval, their paired
    difference, the best set in words."""
    k = quarter_k(subject.n_blocks)
    if k < 1:
        return dict(k=0, pruning_tokens=int(windows.n_scored_tokens), **dict.fromkeys(
            ["zone_aware", "zone_aware_low", "zone_aware_high", "keep_last", "keep_last_low", "keep_last_high",
             "diff", "diff_low", "diff_high"], NAN), best="undefined (too few blocks to remove one)")
    pair = pair_at_k(subject, windows, STRATEGIES, k, alpha=alpha, batch_size=batch_size, model_name=model_name,
                     n_resamples=n_resamples, seed=seed, progress=progress)
    return dict(k=k, pruning_tokens=pair["n_tokens"], zone_aware=pair["a"], zone_aware_low=pair["a_low"],
                zone_aware_high=pair["a_high"], keep_last=pair["b"], keep_last_low=pair["b_low"],
                keep_last_high=pair["b_high"], diff=pair["diff"], diff_low=pair["diff_low"],
                diff_high=pair["diff_high"], best=best_text(pair["best_set"]))


def model_row(result: ModelImportance, model, *, corpus_name: str, comparison: dict, alpha_estimator: str,
              alpha_role: str, role: str, n_resamples: int, n_permutations: int, seed: int) -> dict:
    """One model's row (:data:`COLUMNS` and the words the pooled verdict reads)."""
    part = result.importance(alpha_estimator, alpha_role)
    c = spearman(part["alpha"], part["delta_loss"], noise=window_noise(result.windows, part["layer"]),
                 n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    claim = score_rho(c.rho, c.ci_low, c.ci_high, c.p_value, result.n_blocks)
    shape = profile_shape(result.alphas, role, alpha_estimator, n_resamples=n_resamples, seed=seed)
    first = first_blocks_matter_most(result.ablation)
    parts = attribution(result, alpha_estimator, (alpha_role, role), n_resamples=n_resamples,
                        n_permutations=n_permutations, seed=seed).set_index(["alpha_role", "kind"])
    pick = lambda r, kind, name: {name: parts.loc[(r, kind), "rho"], f"{name}_low": parts.loc[(r, kind), "ci_low"],  # noqa: E731
                                  f"{name}_high": parts.loc[(r, kind), "ci_high"]}
    attributed = dict(**pick(alpha_role, "partial_depth", "rho_partial"),
                      rho_partial_p=parts.loc[(alpha_role, "partial_depth"), "p_value"],
                      rho_partial_undefined=parts.loc[(alpha_role, "partial_depth"), "undefined"],
                      **pick(alpha_role, "without_ends", "rho_inner"),
                      **pick(role, "raw", "rho_q"), rho_q_p=parts.loc[(role, "raw"), "p_value"])
    return dict(model=result.label, family=str(getattr(model.config, "model_type", type(model).__name__)),
                blocks=int(result.n_blocks), parameters=int(sum(p.numel() for p in model.parameters())),
                corpus=corpus_name, tokens=int(result.ablation["n_tokens"].iloc[0]),
                rho=c.rho, rho_low=c.ci_low, rho_high=c.ci_high, rho_p=c.p_value,
                rho_side=rho_word(c.ci_low, c.ci_high), rho_claim=str(claim), **comparison,
                first_blocks=str(first["verdict"]), shape=shape["shape"], rise=shape["rise"],
                rise_low=shape["rise_low"], rise_high=shape["rise_high"], peak_lift=shape["peak_lift"],
                peak_lift_low=shape["peak_lift_low"], peak_lift_high=shape["peak_lift_high"],
                rank_trend=shape["rank_trend"],
                rank_trend_low=shape["rank_trend_low"], rank_trend_high=shape["rank_trend_high"], **attributed,
                rho_word=rho_word(c.ci_low, c.ci_high), pruning_word=pruning_word(comparison["diff_low"],
                                                                                  comparison["diff_high"]),
                rho_sentence=rho_verdict(c.as_dict(), result.label, f"{alpha_role} {alpha_estimator}"),
                rho_claim_why=claim.why)


def profiles(result: ModelImportance, alpha_estimator: str, role: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One model's α profile (``role``) and ΔLoss profile on relative depth (0 = first block, 1 = last)."""
    span = max(result.n_blocks - 1, 1)
    alphas = result.alphas[result.alphas["role"] == role][["layer", alpha_estimator]].rename(
        columns={alpha_estimator: "alpha"})
    alpha = alphas.assign(model=result.label, relative_depth=alphas["layer"] / span)
    low, high = delta_loss_bounds(result.ablation)
    delta = pd.DataFrame(dict(model=result.label, layer=result.ablation["layer"].astype(int),
                              relative_depth=result.ablation["layer"] / span,
                              delta_loss=result.ablation["delta_loss"].astype(float),
                              delta_loss_low=low.to_numpy(float), delta_loss_high=high.to_numpy(float)))
    return (alpha[["model", "layer", "relative_depth", "alpha"]].reset_index(drop=True), delta)


def overview(table: pd.DataFrame) -> pd.DataFrame:
    """The table as the page shows it: every estimate beside its interval."""
    iv = lambda r, name, **kw: fmt_interval(r[name], r[f"{name}_low"], r[f"{name}_high"], **kw)  # noqa: E731
    return pd.DataFrame([{
        "model": r["model"], "family": r["family"], "blocks": r["blocks"],
        "parameters (M)": round(r["parameters"] / 1e6, 3), "corpus": r["corpus"], "tokens": r["tokens"],
        "ρ(α, ΔLoss)": fmt_rho(r["rho"], r["rho_low"], r["rho_high"], r["rho_p"]), "paper's ρ claim": r["rho_claim"],
        "k": r["k"], "Δloss zone-aware": iv(r, "zone_aware"), "Δloss Last-N (keep last)": iv(r, "keep_last"),
        "difference": iv(r, "diff", signed=True), "better of these two at k": r["best"], "first blocks matter most": r["first_blocks"],
        "α profile": f"{r['shape']} (rank trend {iv(r, 'rank_trend', signed=True)}; rise {iv(r, 'rise', signed=True)})",
        "ρ partialled on block index": iv(r, "rho_partial", signed=True),
        "ρ without the end blocks": iv(r, "rho_inner", signed=True),
        "ρ with the Q-projection α": fmt_rho(r["rho_q"], r["rho_q_low"], r["rho_q_high"], r["rho_q_p"])}
        for _, r in table.iterrows()])


def run(models=("smollm2-135m",), profile: str | None = "cpu", depths: Sequence[int] | None = None,
        seeds: int | None = None, train_overrides: dict | None = None, corpus: str = "stdlib", seq_len: int = 256,
        eval_tokens: int | None = default("eval_tokens", context="across_models"),
        pruning_eval_tokens: int | None = default("pruning_eval_tokens"),
        series_eval_tokens: int | None = default("series_eval_tokens", context="across_models"), batch_size: int = 8, series_batch_size: int = 16,
        alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted", role: str = "q",
        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0,
        out_dir: str = "results/across_models", *, dtype: str = CHAPTER_DTYPE,
        progress: bool | None = None) -> ChapterResult:
    """The chapter → ``models.csv`` (one row per model, :data:`COLUMNS`), ``alpha_profiles.csv`` and
    ``delta_profiles.csv`` (on relative depth), ``summary.json``. ``models`` are measured with the
    layer-ablation chapter's parameters (``seq_len``, ``eval_tokens``, ``batch_size``) and compared
    on the pruning chapter's eval windows (``pruning_eval_tokens``); the depth series' runs
    (``profile``, ``depths``, ``seeds``, ``train_overrides``; ``profile=None``: none) on
    ``series_eval_tokens`` of their held-out text, ``series_batch_size`` windows a forward."""
    names = check_models(models)
    progress = bars_shown(progress)
    stats = dict(n_resamples=n_resamples, seed=seed)
    rows, alpha_parts, delta_parts = [], [], []
    text = load_corpus(corpus)
    for result in measure_models(names, corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens,
                                 batch_size=batch_size, progress=progress, dtype=dtype):
        loaded = load_model(result.name)
        subject = as_subject(loaded.model, dtype, fingerprint=loaded.fingerprint)
        windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", pruning_eval_tokens)
        comparison = compare_at_quarter(subject, windows, result.alphas, model_name=result.name,
                                        batch_size=batch_size, progress=progress, **stats)
        rows.append(model_row(result, loaded.model, corpus_name=str(corpus), comparison=comparison,
                              alpha_estimator=alpha_estimator, alpha_role=alpha_role, role=role,
                              n_permutations=n_permutations, **stats))
        for frames, frame in zip((alpha_parts, delta_parts), profiles(result, alpha_estimator, role)):
            frames.append(frame)
        del loaded, subject
    runs = [] if profile is None else train_series(depths, profile, seeds=seeds, progress=False,
                                                   **(train_overrides or {}))
    trained = series_importance(runs, eval_tokens=series_eval_tokens, batch_size=series_batch_size,
                                progress=False) if runs else []
    for result, trained_run in zip(trained, runs):
        loaded = trained_run.load()
        subject = as_subject(loaded.model, dtype, fingerprint=loaded.fingerprint)
        comparison = compare_at_quarter(subject, heldout_windows(trained_run, series_eval_tokens), result.alphas,
                                        model_name=result.label, batch_size=series_batch_size, progress=False,
                                        **stats)
        rows.append(model_row(result, loaded.model, corpus_name=f"{trained_run.config.corpus} (held out)",
                              comparison=comparison, alpha_estimator=alpha_estimator, alpha_role=alpha_role,
                              role=role, n_permutations=n_permutations, **stats))
        for frames, frame in zip((alpha_parts, delta_parts), profiles(result, alpha_estimator, role)):
            frames.append(frame)
    labels = model_labels([r["model"] for r in rows])   # unique, whatever the names
    for row, label in zip(rows, labels):
        row["model"] = label
    for frames in (alpha_parts, delta_parts):
        for i, frame in enumerate(frames):
            frames[i] = frame.assign(model=labels[i])
    table = pd.DataFrame(rows)
    pooled = models_agreement({title: dict(zip(table["model"], table[key])) for key, title in READINGS.items()})
    first = rows[0]
    numbers = dict(
        n_models=len(rows), model_names=", ".join(labels), first_model=first["model"], n_trained=len(runs),
        alpha_name=f"{alpha_role} {alpha_estimator}", role_name=role, paper_rho=f"{PAPER_RHO[0]}–{PAPER_RHO[1]}",
        rho_text="; ".join(f"{r['model']}: {fmt_rho(r['rho'], r['rho_low'], r['rho_high'], r['rho_p'])} "
                           f"({r['rho_claim']})" for r in rows),
        rho_sentences=" ".join(r["rho_sentence"] for r in rows),
        pruning_text="; ".join(f"{r['model']} (k = {r['k']} of {r['blocks']}): d = "
                               f"{fmt_interval(r['diff'], r['diff_low'], r['diff_high'], signed=True, unit='nats')}, "
                               f"{r['pruning_word']}" for r in rows),
        shape_text="; ".join(f"{r['model']}: {r['shape']}" for r in rows),
        first_blocks_text="; ".join(f"{r['model']}: {r['first_blocks']}" for r in rows),
        n_in_band=int(sum(r["rho_claim"] == "holds" for r in rows)),
        n_rho_above=int(sum(r["rho_word"] == "above 0" for r in rows)),
        n_zone_ahead=int(sum(r["pruning_word"] == "zone-aware ahead" for r in rows)),
        pooled_text=pooled["text"],
        attribution_text="; ".join(
            f"{r['model']}: raw {fmt_interval(r['rho'], r['rho_low'], r['rho_high'], signed=True)}, partialled on "
            f"block index {fmt_interval(r['rho_partial'], r['rho_partial_low'], r['rho_partial_high'], signed=True)}, "
            f"without the end blocks {fmt_interval(r['rho_inner'], r['rho_inner_low'], r['rho_inner_high'], signed=True)}, "
            f"{role}-projection α {fmt_interval(r['rho_q'], r['rho_q_low'], r['rho_q_high'], signed=True)}"
            for r in rows))
    record = dict(models=[{k: v for k, v in r.items()} for r in rows], corpus=corpus, seq_len=seq_len,
                  eval_tokens=eval_tokens, pruning_eval_tokens=pruning_eval_tokens,
                  series_eval_tokens=series_eval_tokens, profile=profile, alpha_estimator=alpha_estimator,
                  alpha_role=alpha_role, role=role, dtype=dtype, n_resamples=n_resamples,
                  n_permutations=n_permutations, seed=seed, agree=pooled["agree"], part=pooled["part"],
                  pooled_text=pooled["text"])
    tables = dict(models=table[COLUMNS], alpha_profiles=pd.concat(alpha_parts, ignore_index=True),
                  delta_profiles=pd.concat(delta_parts, ignore_index=True))
    out = save(out_dir, tables, record)
    return ChapterResult(dict(tables, overview=overview(table)), numbers, record, out,
                         extra=dict(alpha_title=f"{role} {alpha_estimator}", paper_rho=PAPER_RHO))


__all__ = ["COLUMNS", "READINGS", "STRATEGIES", "best_text", "compare_at_quarter", "model_row", "overview",
           "profiles", "pruning_word", "quarter_k", "rho_word", "run"]
