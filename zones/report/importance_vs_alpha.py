"""The importance-vs-α chapter: Spearman ρ per model, which α orders blocks best, and the
verdict on "α predicts importance" (the statistics: ``zones.analysis.importance``; the
verdict sentence: ``zones.report.verdicts.rho_verdict``), and the same ρ with depth controlled
(partialled on block index, without the end blocks: :func:`depth_text` says what they show).
"""
from __future__ import annotations


import pandas as pd

from zones.analysis.importance import (
    DEPTH_KINDS,
    depth_table,
    window_noise,
    importance_frame,
    measure_models,
    rho_table,
    spearman,
    strongest,
)
from zones.analysis.unit_intervals import interval_side
from zones.core.progress import bars_shown
from zones.measure.ablation import CHAPTER_DTYPE, DEFAULT_EVAL_TOKENS
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES
from zones.report.common import ChapterResult, precision_text, save
from zones.report.format import fmt_interval, fmt_p, fmt_rho
from zones.report.verdicts import FAILS, HOLDS, rho_verdict, score_partial_rho


def strongest_text(per_model: list[dict]) -> str:
    """Per model: the largest |ρ| of the table, flagged as picked after looking, with its
    Holm-adjusted p and how many pairs survive the adjustment, and how many are not separable
    from it."""
    parts = []
    for m in per_model:
        best = m["strongest"]
        if best is None:
            continue
        parts.append(f"{m['model']}: the largest |ρ| of the {best['n_tested']} estimator/role pairs is "
                     f"{best['estimator']} ({best['role']}), ρ = "
                     f"{fmt_interval(best['rho'], best['ci_low'], best['ci_high'])}; picked as the largest of "
                     f"{best['n_tested']}, its p-value adjusted for that choice (Holm): {fmt_p(best['p_holm'])}"
                     f", and {best['n_significant']} of the {best['n_tested']} pairs have an adjusted p below 0.05; "
                     f"{best['n_close']} other pair{'s' if best['n_close'] != 1 else ''} are not separable from it")
    return "; ".join(parts) or "none (no finite ρ)"


def depth_shown(depth: pd.DataFrame) -> pd.DataFrame:
    """The depth table for the page: one row per model, the raw, partial and without-ends ρ
    (and the pooled partial row) each as ``"0.45 [0.10, 0.72]"``."""
    shown = depth.assign(cell=[fmt_interval(r, lo, hi) for r, lo, hi in
                               zip(depth["rho"], depth["ci_low"], depth["ci_high"])])
    wide = shown.pivot(index="model", columns="kind", values="cell").reindex(list(dict.fromkeys(depth["model"])))
    wide = wide[[k for k in DEPTH_KINDS if k in wide.columns]].fillna("–")
    blocks = depth.groupby("model", sort=False)["n_blocks"].max()
    wide.insert(0, "blocks", [int(blocks[m]) for m in wide.index])
    return wide.rename(columns=DEPTH_KINDS)


def depth_text(depth: pd.DataFrame) -> str:
    """Per model, whether α's ρ survives depth: the raw ρ (the paper's figure), the ρ
    partialled on block index and the ρ without the end blocks. The raw and without-ends ρ are
    read by where their 95% interval lies against 0 (excludes it: α detectably orders the blocks
    beyond what is said; includes it: not detectably); the partial ρ by the scorecard's own rule
    (``zones.report.verdicts.score_partial_rho``: its interval, its permutation p and the share of
    undefined resamples), so the page and the scorecard never disagree."""
    def read(row, side: str | None = None) -> str:
        side = side or interval_side(row["ci_low"], row["ci_high"], 0.0)
        value = fmt_interval(row["rho"], row["ci_low"], row["ci_high"])
        word = {"above": "interval above 0", "below": "interval below 0", "straddles": "interval includes 0",
                "undefined": "no interval", "weak": f"interval clear of 0 but {fmt_p(row.get('p_value'))}",
                "not estimable": f"not estimable here: {row.get('undefined', float('nan')):.0%} of resamples "
                                 f"undefined"}[side]
        return f"{value} ({word})"

    def partial_side(row) -> str:
        verdict = score_partial_rho(row["ci_low"], row["ci_high"], p_value=row.get("p_value", float("nan")),
                                    undefined=row.get("undefined", float("nan")), n_blocks=row.get("n_blocks"))
        if verdict in (HOLDS, FAILS):
            return "above" if verdict == HOLDS else "below"
        if "not estimable" in verdict.why:
            return "not estimable"
        side = interval_side(row["ci_low"], row["ci_high"], 0.0)
        return "weak" if side in ("above", "below") else side

    parts = []
    for model, part in depth.groupby("model", sort=False):
        rows = {r["kind"]: r for r in part.to_dict("records")}
        if model == "pooled" and "partial_relative_depth" in rows:
            parts.append(f"All models pooled, ρ partialled on relative depth: {read(rows['partial_relative_depth'])}.")
            continue
        if not {"raw", "partial_depth", "without_ends"} <= set(rows):
            continue
        raw, partial, inner = rows["raw"], rows["partial_depth"], rows["without_ends"]
        sides = [interval_side(raw["ci_low"], raw["ci_high"], 0.0), partial_side(partial),
                 interval_side(inner["ci_low"], inner["ci_high"], 0.0)]
        definite = ("above", "below")
        if sides[0] in definite and sides[1] in ("straddles", "weak"):
            meaning = ("the raw ρ is detectable but the depth-controlled one is not: what α predicts here may be "
                       "the block's position")
        elif sides[0] in definite and sides[1] == sides[0]:
            meaning = "α orders the blocks beyond their position (the partial ρ's interval excludes 0, same sign)"
        elif sides[0] in definite and sides[1] in definite:
            meaning = "with depth controlled, ρ changes sign"
        elif sides[0] == "straddles" and sides[1] in definite:
            meaning = "only with depth controlled does α detectably order the blocks"
        elif sides[0] == "straddles" and sides[1] in ("straddles", "weak"):
            meaning = "neither the raw nor the depth-controlled ρ is detectable"
        elif sides[1] == "not estimable":
            meaning = ("α is too nearly monotone in depth here for a depth-controlled ρ: what α predicts cannot be "
                       "told from the block's position")
        else:
            meaning = "the two cannot be compared (an interval is undefined)"
        parts.append(f"{model}: raw ρ {read(raw)}, partialled on block index {read(partial, sides[1])}, without the first and "
                     f"last blocks {read(inner)}; {meaning}.")
    return " ".join(parts) or "No depth-controlled ρ could be computed."


def rho_matrix(rhos: pd.DataFrame) -> pd.DataFrame:
    """ρ with (model, estimator) rows and role columns, in the table's role order (full
    precision: the page shows it to two significant figures)."""
    shown = rhos.pivot_table(index=["model", "estimator"], columns="role",
                                                              values="rho", sort=False)
    return shown[[c for c in dict.fromkeys(rhos["role"]) if c in shown.columns]]


def run(models=("smollm2-135m",), corpus: str = "stdlib", seq_len: int = 256, eval_tokens: int | None = DEFAULT_EVAL_TOKENS,
        batch_size: int = 8, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted",
        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0, out_dir: str = "results/importance_vs_alpha", *,
        dtype: str = CHAPTER_DTYPE, progress: bool | None = None) -> ChapterResult:
    """The chapter: ablation and α of every model (cached, as the layer-ablation chapter),
    → ``importance.csv``, ``rho.csv`` (every estimator × role), ``depth.csv`` (raw, partialled on
    block index, without the end blocks; pooled on relative depth with several models),
    ``summary.json``."""
    progress = bars_shown(progress)
    results = measure_models(models, corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens,
                             batch_size=batch_size, progress=progress, dtype=dtype)
    frame = importance_frame(results, alpha_estimator, alpha_role)
    windows = {r.label: r.windows for r in results}   # every interval resamples blocks and eval windows
    correlations = {label: spearman(part["alpha"], part["delta_loss"], noise=window_noise(windows[label], part["layer"]),
                                    n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
                    for label, part in frame.groupby("model", sort=False)}
    depth = depth_table(frame, windows=windows, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    rhos = pd.concat([rho_table(r.ablation, r.alphas, windows=r.windows, n_resamples=n_resamples,
                                n_permutations=n_permutations, seed=seed).assign(model=r.label)
                      for r in results], ignore_index=True)
    alpha_name = f"{alpha_role} {alpha_estimator}"
    per_model = []
    for r in results:
        c = correlations[r.label].as_dict()
        part = frame[frame["model"] == r.label]
        per_model.append(dict(model=r.label, name=r.name, fingerprint=r.fingerprint, n_blocks=r.n_blocks,
                              n_tokens=int(part["n_tokens"].iloc[0]), **c,
                              most_important=int(part.loc[part["delta_loss"].idxmax(), "layer"]),
                              least_important=int(part.loc[part["delta_loss"].idxmin(), "layer"]),
                              strongest=strongest(rhos[rhos["model"] == r.label]),
                              verdict=rho_verdict(c, r.label, alpha_name)))
    first = per_model[0]
    numbers = dict(first_model=first["model"], n_blocks=first["n_blocks"], n_tokens=first["n_tokens"],
                   rho=first["rho"], rho_low=first["ci_low"], rho_high=first["ci_high"], rho_p=first["p_value"],
                   rho_text="; ".join(f"{label}: {fmt_rho(c.rho, c.ci_low, c.ci_high, c.p_value)}"
                                      for label, c in correlations.items()),
                   most_important=first["most_important"], least_important=first["least_important"],
                   alpha_name=alpha_name, best_text=strongest_text(per_model), n_permutations=int(n_permutations),
                   verdict=" ".join(m["verdict"] for m in per_model), depth_text=depth_text(depth),
                   precision=precision_text(dtype, results[0].dtype))
    summary = dict(corpus=corpus, seq_len=seq_len, eval_tokens=eval_tokens, alpha_estimator=alpha_estimator,
                   alpha_role=alpha_role, n_resamples=n_resamples, n_permutations=n_permutations, seed=seed, models=per_model)
    tables = dict(importance=frame, rho=rhos, depth=depth)
    out = save(out_dir, tables, summary)
    titles = {label: f"{label}: {fmt_rho(c.rho, c.ci_low, c.ci_high, c.p_value)}" for label, c in correlations.items()}
    return ChapterResult(dict(tables, rho_matrix=rho_matrix(rhos), depth_shown=depth_shown(depth)), numbers, summary, out,
                         extra=dict(titles=titles))
