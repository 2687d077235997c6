"""The depth-series chapter: train (or load) the series, ablate every depth, ρ per depth."""
from __future__ import annotations

import pandas as pd

from .common import ChapterResult, save
from .importance import rho_verdict

SERIES_ESTIMATORS = ("alpha_shape", "alpha_esd", "stable_rank")
SERIES_ROLES = ("weighted", "q", "k", "v", "o")


def run(profile: str = "cpu", depths=None, train_overrides: dict | None = None, eval_tokens: int | None = 8128,
        batch_size: int = 16, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted",
        out_dir: str = "results/depth_series", *, n_boot: int = 2000, n_perm: int = 10000,
        seed: int = 0) -> ChapterResult:
    """The chapter: ``series.csv``, ``history.csv``, ``importance.csv`` (every depth's
    ablation with α), ``rho.csv`` (ρ per depth for a few estimators and roles) and
    ``summary.json`` (one record per run, with its ρ and interval)."""
    from ..importance import importance_frame, rho_table, spearman
    from ..train import series_history, series_importance, series_summary, train_series

    runs = train_series(depths, profile, progress=False, **(train_overrides or {}))
    series = series_summary(runs)
    history = series_history(runs)
    results = series_importance(runs, eval_tokens=eval_tokens, batch_size=batch_size, progress=False)
    frame = importance_frame(results, alpha_estimator, alpha_role)
    rhos = {r.label: spearman(part["alpha"], part["delta_loss"], n_boot=n_boot, n_perm=n_perm, seed=seed)
            for r in results for part in [frame[frame["model"] == r.label]]}
    per_depth = pd.concat([rho_table(r.ablation, r.alphas, estimators=list(SERIES_ESTIMATORS),
                                     roles=list(SERIES_ROLES), n_boot=n_boot, n_perm=n_perm, seed=seed)
                           .assign(depth=r.n_blocks, model=r.label) for r in results], ignore_index=True)
    alpha_name = f"{alpha_role} {alpha_estimator}"
    config = runs[0].config
    top = frame.loc[frame.groupby("model", sort=False)["delta_loss"].idxmax()]
    numbers = dict(depths=", ".join(str(int(d)) for d in series["depth"]), profile=profile,
                   steps=int(config.steps), tokens_k=config.steps * config.tokens_per_step / 1000,
                   train_minutes=float(series["total_seconds"].sum() / 60), corpus=str(config.corpus),
                   loss_text="; ".join(f"depth {int(d)}: {loss:.3f}" for d, loss in
                                       zip(series["depth"], series["final_heldout_loss"])),
                   initial_loss=float(series["initial_heldout_loss"].mean()),
                   n_tokens=int(frame["n_tokens"].iloc[0]),
                   top_text="; ".join(f"{m}: block {int(l)}" for m, l in zip(top["model"], top["layer"])),
                   rho_text="; ".join(f"{label}: ρ = {c.rho:.2f} (95% interval {c.ci_low:.2f} to {c.ci_high:.2f}, "
                                      f"p = {c.p_value:.2g})" for label, c in rhos.items()),
                   n_positive=sum(c.rho > 0 for c in rhos.values()),
                   n_detected=sum(c.ci_low > 0 for c in rhos.values()), n_depths=len(rhos),
                   alpha_role_name=alpha_role, alpha_estimator_name=alpha_estimator,
                   verdict=" ".join(rho_verdict(c.as_dict(), label, alpha_name) for label, c in rhos.items()))
    record = dict(profile=profile, depths=[int(d) for d in series["depth"]], eval_tokens=eval_tokens,
                  alpha_estimator=alpha_estimator, alpha_role=alpha_role,
                  runs=[dict(depth=int(row.depth), parameters=int(row.parameters),
                             total_seconds=float(row.total_seconds), snapshot_fraction=float(row.snapshot_fraction),
                             final_heldout_loss=float(row.final_heldout_loss),
                             **rhos[f"depth {int(row.depth)}"].as_dict()) for row in series.itertuples()])
    tables = dict(series=series, history=history, importance=frame, rho=per_depth)
    out = save(out_dir, tables, record)
    titles = {label: f"{label}: ρ = {c.rho:.2f} [{c.ci_low:.2f}, {c.ci_high:.2f}]" for label, c in rhos.items()}
    wide = per_depth.pivot_table(index=["estimator", "role"], columns="depth", values="rho").round(2)
    wide.columns = [f"ρ, depth {d}" for d in wide.columns]
    shown = series.assign(minutes=series["total_seconds"] / 60, snapshot_percent=100 * series["snapshot_fraction"],
                          parameters_m=series["parameters"] / 1e6)[
        ["depth", "width", "heads", "parameters_m", "tokens_seen", "minutes", "snapshot_percent",
         "final_heldout_loss"]].rename(columns={"parameters_m": "parameters (M)", "tokens_seen": "tokens",
                                                "snapshot_percent": "snapshots (% of time)",
                                                "final_heldout_loss": "held-out loss"}).round(3)
    return ChapterResult(dict(tables, rho_wide=wide.reset_index(), runs_shown=shown), numbers, record, out,
                         extra=dict(titles=titles, alpha_title=alpha_name))
