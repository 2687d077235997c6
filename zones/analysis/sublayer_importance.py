"""Sublayer importance against α: each attention and MLP sublayer's ΔLoss beside its own matrices' α.

* ``sublayer_alpha``: one α per sublayer (the part's matrices, weighted by parameters, or one role);
* ``sublayer_importance``: the attention sublayer's ΔLoss (``zones.measure.ablation``,
  ``parts=True``) beside the α of the attention matrices (q, k, v, o), and the MLP's beside the MLP
  matrices';
* ``sublayer_rho_table``: Spearman ρ with bootstrap intervals and permutation p-values
  (``zones.analysis.importance.spearman``), per part, estimator and role;
* ``part_difference``: mean attention-only ΔLoss − mean MLP-only ΔLoss, with a paired interval.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from zones.analysis.importance import ESTIMATORS, spearman
from zones.core.adapters import ATTENTION_ROLES
from zones.measure.ablation import PARTS, summarize
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES, paired_bootstrap
from zones.measure.sublayer_removal import check_part
from zones.spectra import layer_alpha

IMPORTANCE_COLUMNS = ["layer", "part", "delta_loss", "delta_loss_low", "delta_loss_high", "alpha", "n_params"]
RHO_COLUMNS = ["part", "estimator", "role", "rho", "ci_low", "ci_high", "p_value", "n_layers"]


def part_roles(alphas: pd.DataFrame, part: str) -> list[str]:
    """The roles of the α table that belong to ``part``: q, k, v, o for attention; the rest."""
    roles = list(dict.fromkeys(alphas["role"]))
    return [r for r in roles if (r in ATTENTION_ROLES) == (check_part(part) == "attn")]


def sublayer_alpha(alphas: pd.DataFrame, alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted") -> pd.DataFrame:
    """One value per sublayer: ``layer, part, alpha``. ``alpha_role="weighted"``: the mean over the
    part's matrices weighted by parameter count (``zones.spectra.layer_alpha`` on those rows);
    a role name: that matrix only (for the part it belongs to)."""
    frames = []
    for part in PARTS:
        roles = part_roles(alphas, part)
        if alpha_role != "weighted" and alpha_role not in roles:
            continue
        rows = alphas[alphas["role"].isin(roles)]
        series = layer_alpha(rows, alpha_estimator=alpha_estimator, alpha_role=alpha_role)
        frames.append(pd.DataFrame({"layer": series.index.astype(int), "part": part, "alpha": series.to_numpy()}))
    return pd.concat(frames, ignore_index=True)


def sublayer_importance(long: pd.DataFrame, alphas: pd.DataFrame, params: pd.DataFrame | None = None, *,
                        alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted", **interval) -> pd.DataFrame:
    """Attention-only and MLP-only ΔLoss of every block with the sublayer's α beside it.

    ``long``: ``zones.measure.ablation.ablation_window_losses(..., parts=True)``. Columns:
    ``layer, part, delta_loss, delta_loss_low, delta_loss_high`` (paired 95% interval over
    windows), ``alpha`` (:func:`sublayer_alpha`), ``n_params`` (NaN without ``params``).
    """
    if not {f"nll_{p}" for p in PARTS} <= set(long.columns):
        raise ValueError("the ablation table has no attention/MLP columns: run ablation_window_losses(parts=True)")
    table = summarize(long, parts=True, **interval)
    rows = []
    for part in PARTS:
        rows.append(pd.DataFrame({"layer": table["layer"], "part": part, "delta_loss": table[f"delta_loss_{part}"],
                                  "delta_loss_low": table[f"delta_loss_{part}_low"],
                                  "delta_loss_high": table[f"delta_loss_{part}_high"]}))
    out = pd.concat(rows, ignore_index=True).merge(sublayer_alpha(alphas, alpha_estimator, alpha_role), on=["layer", "part"],
                                                   how="left")
    out["n_params"] = (out.merge(params, on=["layer", "part"], how="left")["n_params"].to_numpy()
                       if params is not None else np.nan)
    order = {p: i for i, p in enumerate(PARTS)}
    out = out.sort_values(["part", "layer"], key=lambda s: s.map(order) if s.name == "part" else s)
    return out.reset_index(drop=True)[IMPORTANCE_COLUMNS]


def sublayer_rho_table(long: pd.DataFrame, alphas: pd.DataFrame, *, estimators: Sequence[str] | None = None,
                       n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0) -> pd.DataFrame:
    """Spearman ρ between a sublayer's ΔLoss and its α, per part × estimator × role (the
    parameter-weighted ``"weighted"`` and each of the part's own matrices). Columns:
    ``part, estimator, role, rho, ci_low, ci_high, p_value, n_layers``."""
    table = summarize(long, parts=True, n_resamples=n_resamples, seed=seed)  # the budget's own resamples
    if estimators is None:
        estimators = [e for e in ESTIMATORS if e in alphas.columns and alphas[e].notna().any()]
    rows = []
    for part in PARTS:
        importance = table.set_index("layer")[f"delta_loss_{part}"]
        for alpha_estimator in estimators:
            for role in ["weighted", *part_roles(alphas, part)]:
                alpha = sublayer_alpha(alphas, alpha_estimator, role)
                alpha = alpha[alpha["part"] == part].set_index("layer")["alpha"].reindex(importance.index)
                c = spearman(alpha.to_numpy(), importance.to_numpy(), n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
                rows.append(dict(part=part, estimator=alpha_estimator, role=role, rho=c.rho, ci_low=c.ci_low,
                                 ci_high=c.ci_high, p_value=c.p_value, n_layers=c.n))
    return pd.DataFrame(rows, columns=RHO_COLUMNS)


def part_difference(long: pd.DataFrame, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> dict:
    """Mean attention-only ΔLoss minus mean MLP-only ΔLoss over blocks (nats), with a paired
    95% interval over eval windows (``zones.measure.bootstrap.paired_bootstrap``). ``long``: the
    per-window table of ``zones.measure.ablation.ablation_window_losses(parts=True)``.
    Returns ``difference, low, high``."""
    layers = sorted(long["layer"].unique())
    wide = {c: long.pivot(index="layer", columns="window", values=c).loc[layers].to_numpy(dtype=float)
            for c in ("nll_attn", "nll_mlp", "n_tokens")}
    tokens = wide["n_tokens"][0]
    iv = paired_bootstrap(lambda a, m, t: (a.mean(-2).sum(-1) - m.mean(-2).sum(-1)) / t.mean(-2).sum(-1),
                          (wide["nll_attn"], wide["nll_mlp"], np.broadcast_to(tokens, wide["nll_attn"].shape)),
                          n_resamples=n_resamples, seed=seed)
    return dict(difference=float(iv.estimate), low=float(iv.low), high=float(iv.high))
