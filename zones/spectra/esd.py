"""Power-law fits of an eigenvalue spectrum's tail: WeightWatcher's ESD fit, and Hill's estimator.

- ``fit_esd`` (columns ``alpha_esd``, ``xmin``, ``ks_distance``, ``n_tail``, ``alpha_esd_sigma``):
  the HT-SR power-law exponent of the eigenvalue density, fitted exactly as WeightWatcher
  0.7.7's default ``analyze()`` does: λ ≤ 1e-5 dropped, Clauset's MLE for every candidate
  x_min, the one with the smallest Kolmogorov–Smirnov distance kept; σ_α = (α − 1)/√n_tail.
  Fewer than 20 kept eigenvalues use WeightWatcher's small-sample variant.
- ``alpha_hill``: the same MLE with x_min the median eigenvalue (TempBalance, AlphaPruning).

``esd_fits`` and ``hill_alphas`` work on a batch: the rows of ``lam`` are ascending spectra of
equal length. The x_min scan is vectorised and pruned with exact lower bounds, so it selects the
same x_min as the full scan. The formulas are in ``book/methods/spectra.md``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

EVALS_THRESHOLD = 1e-5  # eigenvalues at or below this are dropped from the ESD fits (WeightWatcher's)
MIN_SINGULAR_VALUES = 10  # fewer than this: no α at all
SMALL_N = 20  # below this many eigenvalues, WeightWatcher 0.7.7 switches to its small-sample fit
SMALL_N_MIN_TAIL = 8  # ... whose candidate tails hold at least this many eigenvalues
_KS_STRIDE = 16  # x_min scan: lower bounds from every 16th tail point, exact D only where needed
_KS_PROBES = 8  # candidates evaluated exactly to set the bar the lower bounds must beat
_KS_CHUNK = {"cpu": 1 << 17, "gpu": 1 << 25}  # float64 elements per x_min-scan temporary (1 MB on a CPU: in cache)


@dataclass(frozen=True)
class EsdFit:
    """A power-law fit of an eigenvalue spectrum's tail (NaN fields when there is none)."""

    alpha: float
    xmin: float
    ks_distance: float
    n_tail: int
    sigma: float
    note: str = ""


def fit_esd(eigenvalues: Sequence[float], threshold: float = EVALS_THRESHOLD) -> EsdFit:
    """WeightWatcher's power-law fit of one spectrum (eigenvalues λ = σ², any order).

    λ ≤ ``threshold`` are dropped; for every candidate x_min (each kept λ but the largest),
    α = 1 + n / Σ ln(λ_i / x_min) over the n eigenvalues λ_i ≥ x_min, and the candidate with the
    smallest Kolmogorov–Smirnov distance wins. Fewer than 20 kept eigenvalues use
    WeightWatcher's small-sample variant (see the methods page); fewer than 10 give NaN.
    """
    lam = torch.as_tensor(np.sort(np.asarray(eigenvalues, dtype=np.float64)))[None, :]
    fits = esd_fits(lam, threshold)
    return fits[0]


def alpha_hill(eigenvalues: Sequence[float], threshold: float = EVALS_THRESHOLD) -> float:
    """Hill estimator with x_min the median kept eigenvalue: 1 + n / Σ ln(λ_i / x_min)."""
    lam = torch.as_tensor(np.sort(np.asarray(eigenvalues, dtype=np.float64)))[None, :]
    return float(hill_alphas(lam, threshold)[0])


# --- batched fits on spectra of equal length (rows of `lam`, ascending) --------------------------

def _kept_start(lam: torch.Tensor, threshold: float) -> torch.Tensor:
    """Index of the first kept eigenvalue per row (kept eigenvalues are a suffix)."""
    return lam.shape[1] - (lam > threshold).sum(1)


def _shifted_logs(lam: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """ln λ − ln λ_max on kept entries, 0 elsewhere (the shift keeps suffix sums accurate)."""
    idx = torch.arange(lam.shape[1], device=lam.device)
    kept = idx[None, :] >= start[:, None]
    logs = torch.log(torch.where(kept, lam, torch.ones_like(lam)))
    return torch.where(kept, logs - logs[:, -1:], torch.zeros_like(logs))


def _chunk(device: torch.device) -> int:
    return _KS_CHUNK["cpu" if device.type == "cpu" else "gpu"]


def _ks_rows(logs: torch.Tensor, rows: torch.Tensor, i: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Exact KS distance of candidate ``i[e]`` of spectrum ``rows[e]``, for each entry e:
    max_j≥i |1 − (λ_j/λ_i)^(1−α) − (j−i)/(n−i)|, with ``logs`` the shifted log-spectra.

    Computed in cache-sized chunks.
    """
    n = logs.shape[1]
    j = torch.arange(n, device=logs.device, dtype=logs.dtype)
    out = torch.empty(rows.shape[0], dtype=logs.dtype, device=logs.device)
    per = max(1, _chunk(logs.device) // n)
    for s in range(0, rows.shape[0], per):
        ii, aa = i[s:s + per, None], alpha[s:s + per, None]
        part = logs[rows[s:s + per]]
        term = part - part.gather(1, ii)
        term.mul_(1 - aa).exp_().neg_().add_(1)  # theoretical CDF 1 − (λ_j/λ_i)^(1−α)
        step = (j[None, :] - ii).div_(n - ii)  # empirical CDF (j − i)/(n − i) before the jump
        term.sub_(step).abs_().masked_fill_(step < 0, 0.0)
        out[s:s + per] = term.amax(1)
    return out


def _esd_standard(lam: torch.Tensor, start: torch.Tensor):
    """Clauset fit with the full KS scan, for rows with at least SMALL_N kept eigenvalues.

    Returns (alpha, i_star, D) per row. Equivalent to evaluating D at every candidate and
    taking the first minimum, as WeightWatcher does: a strided lower bound of D rules out most
    candidates, and D is evaluated exactly for the rest.
    """
    b, n = lam.shape
    dev, dt = lam.device, lam.dtype
    logs = _shifted_logs(lam, start)
    i = torch.arange(n - 1, device=dev)
    n_i = (n - i).to(dt)
    suffix = logs.flip(1).cumsum(1).flip(1)
    alpha = 1 + n_i / (suffix[:, :-1] - n_i * logs[:, :-1])
    cand = (i[None, :] >= start[:, None]) & torch.isfinite(alpha)
    above = cand & (alpha > 1)  # WeightWatcher leaves D = 1 where α ≤ 1

    # Lower bound of D from every _KS_STRIDE-th tail point (and the last).
    offsets = torch.cat([torch.arange(0, n, _KS_STRIDE, device=dev), torch.tensor([n - 1], device=dev)])
    j = (i[:, None] + offsets[None, :]).clamp_max(n - 1)  # (n-1, m)
    k = (j - i[:, None]).to(dt) / n_i[:, None]
    lower = torch.empty(b, n - 1, dtype=dt, device=dev)
    per = max(1, _chunk(dev) // offsets.numel())  # candidates per chunk, across rows
    flat_logs, flat_alpha = logs[:, :-1].reshape(-1), alpha.reshape(-1)
    rows_of = torch.arange(b, device=dev).repeat_interleave(n - 1)
    flat_lower = lower.view(-1)
    for s in range(0, b * (n - 1), per):
        r = rows_of[s:s + per]
        c = torch.arange(s, min(s + per, b * (n - 1)), device=dev) - r * (n - 1)
        term = logs[r[:, None], j[c]] - flat_logs[s:s + per, None]  # (chunk, m)
        term.mul_(1 - flat_alpha[s:s + per, None]).exp_().neg_().add_(1).sub_(k[c]).abs_()
        flat_lower[s:s + per] = term.amax(1)
    inf = torch.full_like(lower, math.inf)
    lower = torch.where(above, lower, torch.where(cand, torch.ones_like(lower), inf))

    # Exact D at each row's few most promising candidates sets the bar; only candidates whose
    # lower bound does not exceed it can hold the minimum.
    top = lower.topk(min(_KS_PROBES, n - 1), dim=1, largest=False).indices  # (b, probes)
    probe_rows = torch.arange(b, device=dev)[:, None].expand_as(top).reshape(-1)
    probe_i = top.reshape(-1)
    probe_d = _ks_rows(logs, probe_rows, probe_i, alpha[probe_rows, probe_i]).view_as(top)
    probe_d = torch.where(above.gather(1, top), probe_d, lower.gather(1, top))
    bar = probe_d.amin(1)
    survive = above & (lower <= bar[:, None])
    dist = torch.where(above, inf, lower)  # α ≤ 1: exactly 1; not a candidate: inf
    rr, cc = survive.nonzero(as_tuple=True)
    dist[rr, cc] = _ks_rows(logs, rr, cc, alpha[rr, cc])
    i_star = dist.argmin(1)  # the first minimum, as numpy's argmin
    ok = torch.isfinite(dist.gather(1, i_star[:, None])[:, 0])
    return alpha.gather(1, i_star[:, None])[:, 0], i_star, dist.gather(1, i_star[:, None])[:, 0], ok


def _esd_small(data: np.ndarray) -> tuple[float, int, float, float]:
    """WeightWatcher 0.7.7's fit of a short spectrum (fewer than 20 kept eigenvalues, ascending).

    Only tails of at least 8 eigenvalues are candidates, α is the bias-corrected
    1 + (n−1)/Σ ln(λ_i/x_min), and x_min again minimises D. (WeightWatcher also computes an
    objective D − 0.868/√n here, but its caller then re-selects by D alone; we match what it
    returns.) Returns (alpha, tail start, D, sigma); NaN when no tail has α > 1.
    """
    n_all = len(data)
    logs = np.log(data)
    alphas = np.zeros(n_all - 1)
    dists = np.ones(n_all - 1)
    admissible = False
    for i in range(n_all - 1):
        n = n_all - i
        if n < SMALL_N_MIN_TAIL:
            continue
        s = logs[i:].sum() - n * logs[i]
        if s <= 1e-12:
            continue
        alphas[i] = 1.0 + (n - 1.0) / s
        if alphas[i] <= 1.0:
            continue
        fitted = 1.0 - (data[i:] / data[i]) ** (1.0 - alphas[i])
        dists[i] = np.max(np.abs(np.arange(n) / n - fitted))
        admissible = True
    if not admissible:
        return float("nan"), 0, float("nan"), float("nan")
    best = int(np.argmin(dists))
    return float(alphas[best]), best, float(dists[best]), float((alphas[best] - 1.0) / np.sqrt(n_all - best))


def esd_fits(lam: torch.Tensor, threshold: float) -> list[EsdFit]:
    """The power-law fit of every row of ``lam`` (ascending spectra of equal length)."""
    b, n = lam.shape
    start = _kept_start(lam, threshold)
    kept = (n - start).tolist()
    fits: list[EsdFit | None] = [None] * b
    standard = [r for r in range(b) if kept[r] >= SMALL_N]
    if standard:
        sel = torch.tensor(standard, device=lam.device)
        alpha, i_star, dist, ok = (t.cpu().numpy() for t in _esd_standard(lam[sel], start[sel]))
        xmin = lam[sel].gather(1, torch.as_tensor(i_star, device=lam.device)[:, None])[:, 0].cpu().numpy()
        for r, a, i, d, x, good in zip(standard, alpha, i_star, dist, xmin, ok):
            if not good:
                fits[r] = _no_fit("ESD fit failed: no admissible x_min")
                continue
            tail = n - int(i)
            fits[r] = EsdFit(float(a), float(x), float(d), tail, float((a - 1) / math.sqrt(tail)))
    lam_np = None
    for r in range(b):
        if fits[r] is not None:
            continue
        if kept[r] < MIN_SINGULAR_VALUES:
            fits[r] = _no_fit(f"only {kept[r]} eigenvalues above {threshold:g} (need {MIN_SINGULAR_VALUES})")
            continue
        lam_np = lam.cpu().numpy() if lam_np is None else lam_np
        data = lam_np[r, n - kept[r]:]
        a, i, d, sigma = _esd_small(data)
        fits[r] = EsdFit(a, float(data[i]), d, kept[r] - i, sigma) if math.isfinite(a) else \
            _no_fit("ESD fit failed: degenerate tail")
    return fits  # type: ignore[return-value]


def _no_fit(note: str) -> EsdFit:
    return EsdFit(float("nan"), float("nan"), float("nan"), -1, float("nan"), note)


def hill_alphas(lam: torch.Tensor, threshold: float) -> np.ndarray:
    """Hill α with x_min the median kept eigenvalue, per row (NaN with fewer than 10 kept)."""
    n = lam.shape[1]
    if n < MIN_SINGULAR_VALUES:
        return np.full(lam.shape[0], np.nan)
    start = _kept_start(lam, threshold)
    kept = n - start
    h = (start + kept // 2).clamp_max(n - 2)
    logs = _shifted_logs(lam, start)
    tail = (n - h).to(lam.dtype)
    suffix = logs.flip(1).cumsum(1).flip(1)
    alpha = 1 + tail / (suffix.gather(1, h[:, None])[:, 0] - tail * logs.gather(1, h[:, None])[:, 0])
    alpha = torch.where(kept >= MIN_SINGULAR_VALUES, alpha, torch.full_like(alpha, math.nan))
    return alpha.cpu().numpy()
