"""The "is α special?" chapter: ρ(importance, predictor) for every spectral column and for
simple predictors, and the paired interval of |ρ_α| − |ρ_best simple|.

Rules (each a tested function): the verdict on α against the best simple predictor is
``zones.analysis.predictors.alpha_vs_best`` (the paired interval of the difference of |ρ| on the same
bootstrap resamples of blocks excludes 0, or not); a single predictor "detectably orders the
blocks" only where its own ρ interval excludes 0 (:func:`n_detectable`).
"""
from __future__ import annotations

import gc

import pandas as pd

from zones.analysis.importance import model_labels
from zones.analysis.predictors import alpha_vs_best, block_frobenius, predictor_rho, predictor_table
from zones.core.data import corpus_windows, load_corpus
from zones.core.models import load_model
from zones.core.progress import bars_shown
from zones.measure.ablation import CHAPTER_DTYPE, DEFAULT_EVAL_TOKENS, ablation_table
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.measure.subject import as_subject
from zones.pruning import DEFAULT_CALIBRATION_TOKENS, PruningContext
from zones.report.common import ChapterResult, precision_text, save
from zones.report.format import fmt_interval
from zones.spectra import alpha_table


def n_detectable(rhos: pd.DataFrame) -> int:
    """Predictors whose ρ interval excludes 0."""
    return int(((rhos["ci_low"] > 0) | (rhos["ci_high"] < 0)).sum())


def difference_sentence(result: dict, model: str) -> str:
    """The chapter's sentence on α against the best simple predictor (:func:`alpha_vs_best`)."""
    interval = fmt_interval(result["difference"], result["low"], result["high"], signed=True)
    return {"α orders blocks better": f"On {model}, {result['first']} orders the blocks better than the best simple "
                                       f"predictor, {result['second']}: |ρ| differs by {interval}, an interval "
                                       f"above zero.",
            "the simple predictor orders blocks better": f"On {model}, the simple predictor {result['second']} orders "
                                                         f"the blocks better than {result['first']}: |ρ| differs by "
                                                         f"{interval}, an interval below zero.",
            "not separable": f"On {model}, {result['first']} and the best simple predictor, {result['second']}, are "
                             f"not separable: |ρ| differs by {interval}, an interval that includes zero.",
            "undefined": f"On {model} the difference cannot be computed."}[result["verdict"]]


def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256,
        eval_tokens: int | None = DEFAULT_EVAL_TOKENS,
        calibration_tokens: int = DEFAULT_CALIBRATION_TOKENS, batch_size: int = 8, alpha_estimator: str = "alpha_shape",
        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0, out_dir: str = "results/predictors", *,
        dtype: str = CHAPTER_DTYPE, progress: bool | None = None) -> ChapterResult:
    """The chapter. Importance is the eval ablation (the layer-ablation chapter's cache entry
    with its defaults); the calibration measurements are the pruning chapter's (its
    ``PruningContext`` cache entries with its defaults). Every registered predictor
    (``zones.analysis.predictors.register_predictor``) is a column and a ρ. → ``predictors.csv`` (one row per
    block), ``rho.csv``, ``difference.csv``, ``summary.json``."""
    progress = bars_shown(progress)
    names = [models] if isinstance(models, str) else list(models)
    text = load_corpus(corpus)
    tables, rhos, diffs, per_model = [], [], [], []
    for name, label in zip(names, model_labels(names)):
        loaded = load_model(name)
        model = loaded.model
        subject = as_subject(model, dtype, fingerprint=loaded.fingerprint)  # the model at the door
        windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
        calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
        ablation = ablation_table(subject, windows, batch_size=batch_size, progress=progress)
        alphas = alpha_table(model)
        ctx = PruningContext(subject, calibration, alpha=alphas, batch_size=batch_size, progress=progress)
        table = predictor_table(ablation, alphas, frobenius=block_frobenius(model), hidden_stats=ctx.hidden_stats(),
                                calibration_ablation=ctx.ablation(), model=model, calibration=calibration)
        rho = predictor_rho(table, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
        versus = alpha_vs_best(table, rho, alpha_estimator, n_resamples=n_resamples, seed=seed)
        tables.append(table.assign(model=label))
        rhos.append(rho.assign(model=label))
        diffs.append(pd.DataFrame([dict(versus, model=label)]))
        headline = rho.set_index("predictor").loc[alpha_estimator] if alpha_estimator in set(rho["predictor"]) else None
        best = rho.set_index("predictor").loc[versus["second"]] if versus["second"] else None
        per_model.append(dict(model=label, name=name, n_blocks=int(len(table)),
                              n_tokens=int(ablation["n_tokens"].iloc[0]),
                              alpha=None if headline is None else headline.to_dict(),
                              best_simple=versus["second"], best=None if best is None else best.to_dict(),
                              versus=versus, sentence=difference_sentence(versus, label),
                              n_detectable=n_detectable(rho), n_predictors=int(len(rho)),
                              strongest=str(rho.loc[rho["abs_rho"].idxmax(), "predictor"])))
        del loaded, model
        gc.collect()
    first = per_model[0]
    fmt = lambda r: fmt_interval(r["rho"], r["ci_low"], r["ci_high"]) if r else "n/a"  # noqa: E731
    numbers = dict(first_model=first["model"], n_blocks=first["n_blocks"], n_tokens=first["n_tokens"],
                   alpha_name=alpha_estimator, alpha_rho=fmt(first["alpha"]), best_simple=first["best_simple"],
                   best_rho=fmt(first["best"]), strongest=first["strongest"],
                   difference=fmt_interval(first["versus"]["difference"], first["versus"]["low"],
                                           first["versus"]["high"], signed=True),
                   verdict=" ".join(m["sentence"] for m in per_model),
                   n_detectable=first["n_detectable"], n_predictors=first["n_predictors"],
                   calibration_tokens=int(calibration_tokens), precision=precision_text(dtype, subject.dtype))
    summary = dict(corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens, calibration_tokens=calibration_tokens,
                   alpha_estimator=alpha_estimator, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed, models=per_model)
    out_tables = dict(predictors=pd.concat(tables, ignore_index=True), rho=pd.concat(rhos, ignore_index=True),
                      difference=pd.concat(diffs, ignore_index=True))
    out = save(out_dir, out_tables, summary)
    shown = out_tables["rho"][["model", "predictor", "kind", "rho", "ci_low", "ci_high", "p_value"]]
    return ChapterResult(dict(out_tables, shown=shown), numbers, summary, out)
