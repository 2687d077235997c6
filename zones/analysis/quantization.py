"""What 4-bit weights change: a model against its own Q4_1 round trip (``zones.core.quantize``).

The default model is only available as Q4_1 weights, so every α, ΔLoss and ρ of it is a 4-bit
number. A float32 model (a trained run of the depth series) can be measured twice, as it is
("before") and with its block matrices round-tripped through Q4_1 exactly as a GGUF file stores
them ("after"), on the same eval windows:

* per matrix: α before and after (``alpha_table``), their change, and how much the weights
  moved (‖ΔW‖_F / ‖W‖_F); summarised by the largest |change| and Spearman ρ(α before, α after)
  over the matrices, with a bootstrap interval over matrices;
* per block: ΔLoss of removing it before and after (``zones.measure.ablation``, the one loss
  routine), and the change of ΔLoss (after − before) with its paired interval over windows
  (the same resample of windows for both models: ``zones.measure.bootstrap.delta_loss_interval``);
  the full model's loss before and after, and its change, likewise;
* ρ(α, ΔLoss) over blocks before and after (``zones.analysis.importance.spearman``: bootstrap
  interval over blocks, permutation p), and the change of ρ with its interval on the same
  resamples of blocks (both models' α and ΔLoss resampled together).

:func:`quantization_effect` returns the three tables, cached under the model's and the windows'
fingerprints, the quantiser (type and ``gguf`` version) and every parameter.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from scipy.stats import rankdata
from torch import nn

from zones.analysis.importance import _corr_rows, spearman
from zones.core.adapters import get_adapter
from zones.core.cache import entry_path
from zones.core.data import Windows
from zones.core.entries import read_cached_table, write_cached_table
from zones.core.quantize import DEFAULT_QUANT_TYPE, quantization_plan, quantize_model, quantizer_version
from zones.measure.ablation import ablation_window_losses, summarize
from zones.measure.bootstrap import N_PERMUTATIONS, N_RESAMPLES, delta_loss_interval, interval_columns, paired_bootstrap
from zones.measure.store import VERSION as LOSSES_VERSION  # the scored losses' arithmetic: part of every key
from zones.measure.subject import as_subject
from zones.spectra import alpha_table, layer_alpha

VERSION = "1"
MATRIX_COLUMNS = ["layer", "role", "rows", "cols", "alpha_before", "alpha_after", "alpha_change", "weight_change"]
BLOCK_COLUMNS = ["layer", "alpha_before", "alpha_after",
                 "delta_loss_before", "delta_loss_before_low", "delta_loss_before_high",
                 "delta_loss_after", "delta_loss_after_low", "delta_loss_after_high",
                 "delta_loss_change", "delta_loss_change_low", "delta_loss_change_high", "n_tokens"]
SUMMARY_COLUMNS = ["quant_type", "estimator", "role", "n_matrices", "n_quantized", "n_blocks", "n_tokens",
                   "weight_change_max", "alpha_max_change", "alpha_max_layer", "alpha_max_role",
                   "alpha_median_abs_change", "alpha_rho", "alpha_rho_low", "alpha_rho_high",
                   "base_loss_before", "base_loss_after", "base_loss_change", "base_loss_change_low",
                   "base_loss_change_high", "delta_loss_max_change", "delta_loss_max_change_low",
                   "delta_loss_max_change_high", "delta_loss_max_layer", "n_blocks_moved",
                   "rho_before", "rho_before_low", "rho_before_high", "p_before",
                   "rho_after", "rho_after_low", "rho_after_high", "p_after",
                   "rho_change", "rho_change_low", "rho_change_high"]
TABLES = {"matrices": MATRIX_COLUMNS, "blocks": BLOCK_COLUMNS, "summary": SUMMARY_COLUMNS}


def weight_changes(before: nn.Module, after: nn.Module) -> pd.Series:
    """‖W_after − W_before‖_F / ‖W_before‖_F of every block matrix, indexed by (layer, role)
    (the ``zones.core.adapters`` matrices, so a fused q/k/v counts as its three parts)."""
    values = {}
    with torch.no_grad():
        pairs = zip(get_adapter(before).iter_matrices(), get_adapter(after).iter_matrices())
        for (layer, role, w), (_, _, q) in pairs:
            w, q = w.double(), q.double()
            norm = float(w.norm())
            values[(layer, role)] = float((q - w).norm()) / norm if norm > 0 else float("nan")
    return pd.Series(values, name="weight_change")


def matrix_table(alpha_before: pd.DataFrame, alpha_after: pd.DataFrame, changes: pd.Series,
                 alpha_estimator: str = "alpha_shape") -> pd.DataFrame:
    """One row per block matrix (``MATRIX_COLUMNS``): its shape, ``estimator`` before and after,
    ``alpha_change`` (after − before) and ``weight_change`` (:func:`weight_changes`)."""
    table = alpha_before[["layer", "role", "rows", "cols"]].copy()
    after = alpha_after.set_index(["layer", "role"])[alpha_estimator]
    table["alpha_before"] = alpha_before[alpha_estimator].astype(float).to_numpy()
    table["alpha_after"] = after.reindex(pd.MultiIndex.from_frame(table[["layer", "role"]])).astype(float).to_numpy()
    table["alpha_change"] = table["alpha_after"] - table["alpha_before"]
    table["weight_change"] = changes.reindex(pd.MultiIndex.from_frame(table[["layer", "role"]])).to_numpy()
    return table[MATRIX_COLUMNS].reset_index(drop=True)


def block_table(long_before: pd.DataFrame, long_after: pd.DataFrame, alpha_before: pd.Series,
                alpha_after: pd.Series, *, n_resamples: int = N_RESAMPLES, seed: int = 0) -> pd.DataFrame:
    """One row per block (``BLOCK_COLUMNS``): block α before and after, ΔLoss before and after
    (``zones.measure.ablation.summarize`` of each long table) and ``delta_loss_change`` = ΔLoss
    after − ΔLoss before with its interval, the windows resampled once for both models. The two
    long tables (``ablation_window_losses``) must hold the same blocks and windows."""
    if not (long_before[["layer", "window"]].equals(long_after[["layer", "window"]])
            and np.array_equal(long_before["n_tokens"], long_after["n_tokens"])):
        raise ValueError("the two ablation tables differ in their blocks or windows: score both models on the "
                         "same windows")
    kwargs = dict(n_resamples=n_resamples, seed=seed)
    before, after = summarize(long_before, **kwargs), summarize(long_after, **kwargs)
    layers = before["layer"].to_numpy()
    wide = {name: {c: long.pivot(index="layer", columns="window", values=c).loc[layers].to_numpy()
                   for c in ("nll", "base_nll", "n_tokens")}
            for name, long in (("before", long_before), ("after", long_after))}
    change = (wide["after"]["nll"] - wide["after"]["base_nll"]) - (wide["before"]["nll"] - wide["before"]["base_nll"])
    tokens = wide["before"]["n_tokens"][0]
    table = pd.DataFrame({"layer": layers.astype(int),
                          "alpha_before": alpha_before.reindex(layers).to_numpy(float),
                          "alpha_after": alpha_after.reindex(layers).to_numpy(float)})
    for name, summary in (("before", before), ("after", after)):
        for suffix in ("", "_low", "_high"):
            table[f"delta_loss_{name}{suffix}"] = summary[f"delta_loss{suffix}"].to_numpy()
    interval = delta_loss_interval(change, np.zeros(change.shape[1]), tokens, **kwargs)
    for column, values in interval_columns(interval, "delta_loss_change").items():
        table[column] = values
    table["n_tokens"] = int(tokens.sum())
    return table[BLOCK_COLUMNS]


def _base_loss_change(long_before: pd.DataFrame, long_after: pd.DataFrame, *, n_resamples: int,
                      seed: int) -> tuple[float, float, dict]:
    """The full model's loss before and after, and the change with its paired interval."""
    first = long_before["layer"].iloc[0]
    base_b = long_before.loc[long_before["layer"] == first, "base_nll"].to_numpy(float)
    base_a = long_after.loc[long_after["layer"] == first, "base_nll"].to_numpy(float)
    tokens = long_before.loc[long_before["layer"] == first, "n_tokens"].to_numpy(float)
    interval = delta_loss_interval(base_a[None], base_b, tokens, n_resamples=n_resamples, seed=seed)
    values = {k: float(np.asarray(v)[0]) for k, v in interval_columns(interval, "base_loss_change").items()}
    return float(base_b.sum() / tokens.sum()), float(base_a.sum() / tokens.sum()), values


def rho_change(alpha_before, delta_before, alpha_after, delta_after, *, n_resamples: int = N_RESAMPLES,
               seed: int = 0) -> dict:
    """ρ(α after, ΔLoss after) − ρ(α before, ΔLoss before) over the blocks, with its bootstrap
    interval: the blocks resampled together for both models, on the same resamples as
    ``zones.analysis.importance.spearman`` with the same ``seed``. Returns ``rho_change,
    rho_change_low, rho_change_high`` (NaN with fewer than 3 blocks or a NaN value)."""
    columns = [np.asarray(c, dtype=float) for c in (alpha_before, delta_before, alpha_after, delta_after)]
    nan = dict(rho_change=float("nan"), rho_change_low=float("nan"), rho_change_high=float("nan"))
    if columns[0].size < 3 or not all(np.isfinite(c).all() for c in columns):
        return nan

    def statistic(a1, d1, a2, d2):
        def rho(a, d):
            return _corr_rows(rankdata(a, axis=-1), rankdata(d, axis=-1))

        return rho(a2, d2) - rho(a1, d1)

    interval = paired_bootstrap(statistic, columns, n_resamples=n_resamples, seed=seed)
    return dict(rho_change=float(interval.estimate), rho_change_low=float(interval.low),
                rho_change_high=float(interval.high))


def summary_row(matrices: pd.DataFrame, blocks: pd.DataFrame, base: tuple, *, quant_type: str, alpha_estimator: str,
                alpha_role: str, n_quantized: int, n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS,
                seed: int = 0) -> dict:
    """The ``SUMMARY_COLUMNS`` of one model from its matrix and block tables: the largest |α
    change| (signed, with its matrix), the median |α change|, ρ(α before, α after) over the
    matrices, the full model's loss change, the largest |ΔLoss change| (with its interval and
    block), how many blocks' ΔLoss change has an interval excluding 0, and ρ(α, ΔLoss) before,
    after and their change (:func:`rho_change`)."""
    finite = matrices.dropna(subset=["alpha_change"])
    largest = finite.loc[finite["alpha_change"].abs().idxmax()] if len(finite) else None
    alpha_rho = spearman(matrices["alpha_before"], matrices["alpha_after"], n_resamples=n_resamples,
                         n_permutations=n_permutations, seed=seed)
    moved = blocks.loc[blocks["delta_loss_change"].abs().idxmax()]
    kwargs = dict(n_resamples=n_resamples, n_permutations=n_permutations, seed=seed)
    rho_b = spearman(blocks["alpha_before"], blocks["delta_loss_before"], **kwargs)
    rho_a = spearman(blocks["alpha_after"], blocks["delta_loss_after"], **kwargs)
    change = rho_change(blocks["alpha_before"], blocks["delta_loss_before"], blocks["alpha_after"],
                        blocks["delta_loss_after"], n_resamples=n_resamples, seed=seed)
    base_before, base_after, base_change = base
    excludes = (blocks["delta_loss_change_low"] > 0) | (blocks["delta_loss_change_high"] < 0)
    nan = float("nan")
    return dict(quant_type=quant_type, estimator=alpha_estimator, role=alpha_role, n_matrices=int(len(matrices)),
                n_quantized=int(n_quantized), n_blocks=int(len(blocks)), n_tokens=int(blocks["n_tokens"].iloc[0]),
                weight_change_max=float(matrices["weight_change"].max()),
                alpha_max_change=float(largest["alpha_change"]) if largest is not None else nan,
                alpha_max_layer=int(largest["layer"]) if largest is not None else -1,
                alpha_max_role=str(largest["role"]) if largest is not None else "",
                alpha_median_abs_change=float(finite["alpha_change"].abs().median()) if len(finite) else nan,
                alpha_rho=alpha_rho.rho, alpha_rho_low=alpha_rho.ci_low, alpha_rho_high=alpha_rho.ci_high,
                base_loss_before=base_before, base_loss_after=base_after, **base_change,
                delta_loss_max_change=float(moved["delta_loss_change"]),
                delta_loss_max_change_low=float(moved["delta_loss_change_low"]),
                delta_loss_max_change_high=float(moved["delta_loss_change_high"]),
                delta_loss_max_layer=int(moved["layer"]), n_blocks_moved=int(excludes.sum()),
                rho_before=rho_b.rho, rho_before_low=rho_b.ci_low, rho_before_high=rho_b.ci_high,
                p_before=rho_b.p_value, rho_after=rho_a.rho, rho_after_low=rho_a.ci_low,
                rho_after_high=rho_a.ci_high, p_after=rho_a.p_value, **change)


def quantization_effect(model: nn.Module, windows: Windows, *, quant_type: str = DEFAULT_QUANT_TYPE,
                        alpha_estimator: str = "alpha_shape", alpha_role: str = "weighted", batch_size: int = 16,
                        n_resamples: int = N_RESAMPLES, n_permutations: int = N_PERMUTATIONS, seed: int = 0,
                        progress: bool = False, refresh: bool = False) -> dict[str, pd.DataFrame]:
    """``model`` (float32) against its ``quant_type`` round trip (``zones.core.quantize.quantize_model``)
    on the same ``windows``: ``{"matrices", "blocks", "summary"}`` (``MATRIX_COLUMNS``,
    ``BLOCK_COLUMNS``, and one row of ``SUMMARY_COLUMNS``; the module note says what each holds).

    α is ``estimator`` of ``zones.spectra.alpha_table`` per matrix, and per block its ``role``
    (``"weighted"``: the parameter-weighted mean). Both ablations go through the loss store
    (scored in float32), so the unquantised model's is the one its chapter computed already.
    Every interval uses ``n_resamples`` and ``seed`` (windows for ΔLoss, blocks or matrices for ρ);
    p-values ``n_permutations``. The tables are cached under the model's and the windows'
    fingerprints, the quantiser (``quant_type`` and the ``gguf`` version), every parameter and
    ``VERSION``; ``refresh=True`` recomputes them."""
    subject = as_subject(model, "float32")
    parts = dict(kind="quantization_effect", version=VERSION, losses=LOSSES_VERSION, model=subject.fingerprint, windows=windows.fingerprint,
                 quant_type=quant_type, quantizer=quantizer_version(), estimator=alpha_estimator, role=alpha_role,
                 batch_size=batch_size, dtype=subject.dtype, n_resamples=n_resamples, n_permutations=n_permutations,
                 seed=seed)
    paths = {name: entry_path(f"quantization-{name}", parts) for name in TABLES}
    if not refresh:
        found = {name: read_cached_table(path, parts) for name, path in paths.items()}
        if all(table is not None for table in found.values()):
            return found
    plan = quantization_plan(model, quant_type)
    after_model = quantize_model(model, quant_type)
    after = as_subject(after_model, "float32")
    alphas_before, alphas_after = alpha_table(model), alpha_table(after_model)
    matrices = matrix_table(alphas_before, alphas_after, weight_changes(model, after_model), alpha_estimator)
    options = dict(batch_size=batch_size, progress=progress)
    long_before = ablation_window_losses(subject, windows, **options)
    long_after = ablation_window_losses(after, windows, **options)
    blocks = block_table(long_before, long_after, layer_alpha(alphas_before, alpha_estimator, alpha_role),
                         layer_alpha(alphas_after, alpha_estimator, alpha_role), n_resamples=n_resamples, seed=seed)
    base = _base_loss_change(long_before, long_after, n_resamples=n_resamples, seed=seed)
    summary = pd.DataFrame([summary_row(matrices, blocks, base, quant_type=quant_type, alpha_estimator=alpha_estimator, alpha_role=alpha_role,
                                        n_quantized=int(plan["quantized"].sum()), n_resamples=n_resamples,
                                        n_permutations=n_permutations, seed=seed)], columns=SUMMARY_COLUMNS)
    tables = dict(matrices=matrices, blocks=blocks, summary=summary)
    for name, path in paths.items():
        write_cached_table(tables[name], path, parts)
    return tables
