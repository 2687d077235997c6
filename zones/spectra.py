"""Spectral estimators of weight matrices, and the per-matrix α table of a model.

Every estimator reads the spectrum of one matrix W (rows × cols, n = min(rows, cols)):
the eigenvalues λ_1 ≤ … ≤ λ_n of the smaller Gram matrix (W Wᵀ or Wᵀ W), i.e. the squared
singular values σ_k². The formulas are in ``book/methods/spectra.md``; in short:

- ``alpha_shape``, ``alpha_shape_r2``: spectral-shape α (the paper's): the negative slope of
  log σ_k against log k over a window of ranks (default the top half), and the fit's R².
- ``alpha_esd``, ``xmin``, ``ks_distance``, ``n_tail``, ``alpha_esd_sigma``: the HT-SR power-law
  exponent of the eigenvalue density, fitted exactly as WeightWatcher 0.7.7's default
  ``analyze()`` does: λ ≤ 1e-5 dropped, Clauset's MLE for every candidate x_min, the one with
  the smallest Kolmogorov–Smirnov distance kept; σ_α = (α − 1)/√n_tail.
- ``alpha_hill``: the same MLE with x_min the median eigenvalue (TempBalance, AlphaPruning).
- ``stable_rank`` Σλ/λ_max, ``log_lambda_max`` log10 λ_max, ``alpha_weighted`` α_esd · log10 λ_max,
  ``entropy`` (spectral entropy normalised by the log of the numerical rank).

Speed: the spectra of all matrices are computed in float64 on the weights' device, by
``eigvalsh`` of the smaller Gram matrix (several times faster than ``svdvals`` on a CPU, and
exact to ~n·ε·λ_max; a matrix too ill-conditioned for that is redone with ``svdvals``). On a
CPU each matrix is one single-threaded job on a pool of threads, which keeps every core busy
without the slowdown of nested BLAS threads; on a GPU same-shape matrices are stacked and
decomposed in batches. The x_min scan is vectorised and pruned with exact lower bounds, so it
selects the same x_min as the full scan.

Degenerate matrices (non-finite entries, all zeros, rank ≤ 1, fewer than 10 singular values,
too few eigenvalues above the threshold) give NaN in the affected columns and a ``note`` that
says why; they never raise in the middle of a sweep. The numerical rank is judged in the
matrix's own precision (float32, bfloat16, ...: a singular value below what rounding W to its
dtype can produce counts as zero), although the spectra themselves are computed in float64.
"""
from __future__ import annotations

import contextlib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import torch
from torch import nn

from .adapters import get_adapter

VERSION = "spectra-3"  # bump when any estimator's arithmetic changes (invalidates cached tables)
EVALS_THRESHOLD = 1e-5  # eigenvalues at or below this are dropped from the ESD fits (WeightWatcher's)
MIN_SINGULAR_VALUES = 10  # fewer than this: no α at all
SMALL_N = 20  # below this many eigenvalues, WeightWatcher 0.7.7 switches to its small-sample fit
SMALL_N_MIN_TAIL = 8  # ... whose candidate tails hold at least this many eigenvalues
DEFAULT_WINDOW = (0.0, 0.5)
ESTIMATORS = ("shape", "esd", "hill", "companions")
ESTIMATOR_COLUMNS = {
    "shape": ["alpha_shape", "alpha_shape_r2"],
    "esd": ["alpha_esd", "xmin", "ks_distance", "n_tail", "alpha_esd_sigma", "alpha_weighted"],
    "hill": ["alpha_hill"],
    "companions": ["stable_rank", "log_lambda_max", "entropy"],
}
VALUE_COLUMNS = ["alpha_shape", "alpha_shape_r2", "alpha_esd", "xmin", "ks_distance", "n_tail",
                 "alpha_esd_sigma", "alpha_hill", "stable_rank", "log_lambda_max", "alpha_weighted",
                 "entropy"]
ALPHA_COLUMNS = ["alpha_shape", "alpha_esd", "alpha_hill"]
COLUMNS = ["layer", "role", "rows", "cols", *VALUE_COLUMNS, "note"]
ROLE_GROUPS = {"q": "Q/K", "k": "Q/K", "v": "V/O", "o": "V/O"}  # every other role: "MLP"

_EPS = float(np.finfo(np.float64).eps)
_GRAM_TRUST = 100.0  # λ_min below this · n·ε·λ_max: the Gram spectrum is too coarse, use svdvals
_KS_STRIDE = 16  # x_min scan: lower bounds from every 16th tail point, exact D only where needed
_KS_PROBES = 8  # candidates evaluated exactly to set the bar the lower bounds must beat
_KS_CHUNK = {"cpu": 1 << 17, "gpu": 1 << 25}  # float64 elements per x_min-scan temporary (1 MB on a CPU: in cache)


# --- one spectrum at a time ----------------------------------------------------------------------

def singular_values(matrix: torch.Tensor) -> np.ndarray:
    """Singular values in descending order, computed in float64 with ``svdvals``."""
    return torch.linalg.svdvals(matrix.detach().to(torch.float64)).cpu().numpy()


def fit_alpha_shape(sv: np.ndarray, window: tuple[float, float] = DEFAULT_WINDOW) -> tuple[float, float]:
    """(α, R²) of the least-squares line log σ_k ≈ c − α log k over the rank window.

    The window is a pair of fractions of n = len(sv): ranks k = ⌊lo·n⌋+1 … ⌊hi·n⌋. NaN when the
    window holds fewer than two ranks or a zero singular value.
    """
    sv = np.sort(np.asarray(sv, dtype=np.float64))[::-1]
    n = len(sv)
    lo, hi = _window_bounds(window, n)
    values = sv[lo:hi]
    if hi - lo < 2 or not np.all(np.isfinite(values)) or np.any(values <= 0):
        return float("nan"), float("nan")
    x = np.log(np.arange(lo + 1, hi + 1, dtype=np.float64))
    y = np.log(values)
    xc, yc = x - x.mean(), y - y.mean()
    sxy, sxx, syy = float(xc @ yc), float(xc @ xc), float(yc @ yc)
    r2 = sxy * sxy / (sxx * syy) if syy > 0 else float("nan")
    return -sxy / sxx, r2


def alpha_shape(sv: np.ndarray, window: tuple[float, float] = DEFAULT_WINDOW) -> float:
    """Spectral-shape α: negative slope of log σ_k vs log k over the rank window (fractions of n)."""
    return fit_alpha_shape(sv, window)[0]


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
    fits = _esd_fits(lam, threshold)
    return fits[0]


def alpha_hill(eigenvalues: Sequence[float], threshold: float = EVALS_THRESHOLD) -> float:
    """Hill estimator with x_min the median kept eigenvalue: 1 + n / Σ ln(λ_i / x_min)."""
    lam = torch.as_tensor(np.sort(np.asarray(eigenvalues, dtype=np.float64)))[None, :]
    return float(_hill(lam, threshold)[0])


# --- spectra of many matrices ----------------------------------------------------------------------

def _window_bounds(window: tuple[float, float], n: int) -> tuple[int, int]:
    return int(math.floor(window[0] * n)), int(math.floor(window[1] * n))


def _gram_spectrum(matrix: torch.Tensor) -> torch.Tensor | None:
    """Ascending eigenvalues of the smaller Gram matrix, float64, on the matrix's device.

    Matrices whose smallest eigenvalue is within the Gram matrix's rounding (≈ n·ε·λ_max) are
    redone with ``svdvals``: their small eigenvalues (and numerical rank) need it.
    """
    w = matrix.detach().to(torch.float64)
    if w.dim() == 2 and not bool(torch.isfinite(w).all()):
        return None
    if w.numel() == 0:
        return torch.zeros(*w.shape[:-2], min(w.shape[-2:]), dtype=torch.float64, device=w.device)
    gram = w @ w.mT if w.shape[-2] <= w.shape[-1] else w.mT @ w
    lam = torch.linalg.eigvalsh(gram)
    n = lam.shape[-1]
    coarse = lam[..., 0] < _GRAM_TRUST * n * _EPS * lam[..., -1].abs()
    if bool(coarse.any()):
        exact = torch.linalg.svdvals(w[coarse]).flip(-1).square()
        lam = lam.clone()
        lam[coarse] = exact
    return lam.clamp_min(0.0)


def _cpu_spectrum(matrix: torch.Tensor) -> torch.Tensor | None:
    """`_gram_spectrum` on the CPU through NumPy/SciPy: the Gram matrix by ``syrk`` (NumPy uses
    it for ``a @ a.T``: half the flops of a general product) and LAPACK's ``dsyevr`` (values
    only); together about 1.5× faster than the same in torch."""
    from scipy.linalg import eigh

    a = matrix.detach().to("cpu", torch.float64)
    a = np.ascontiguousarray((a if a.shape[0] <= a.shape[1] else a.mT).numpy())
    if not np.isfinite(a).all():
        return None
    if a.size == 0:
        return torch.zeros(a.shape[0], dtype=torch.float64)
    lam = eigh(a @ a.T, eigvals_only=True, driver="evr", check_finite=False, overwrite_a=True)
    if lam[0] < _GRAM_TRUST * len(lam) * _EPS * abs(lam[-1]):
        lam = np.linalg.svd(a, compute_uv=False)[::-1] ** 2
    return torch.from_numpy(np.ascontiguousarray(np.maximum(lam, 0.0)))


@contextlib.contextmanager
def _torch_threads(n: int):
    """Run torch's CPU ops on ``n`` threads inside the block (the setting is process-wide)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _blas_single_threaded():
    """A context in which NumPy's and SciPy's BLAS run one thread per call (None if unavailable)."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return None
    return threadpool_limits(1, user_api="blas")


def _batched_spectra(matrices: Sequence[torch.Tensor], idx: list[int], budget: int = 512 * 2**20):
    """Yield (i, spectrum) for the (finite) matrices ``idx``: same-shape matrices are stacked,
    about ``budget`` bytes of float64 at a time, and decomposed together (the GPU route)."""
    groups: dict[tuple, list[int]] = {}
    for i in idx:
        groups.setdefault((tuple(matrices[i].shape), matrices[i].device), []).append(i)
    for (shape, _), members in groups.items():
        step = max(1, budget // (8 * (shape[0] * shape[1] + min(shape) ** 2)))
        for s in range(0, len(members), step):
            chunk = members[s:s + step]
            yield from zip(chunk, _gram_spectrum(torch.stack([matrices[i].detach() for i in chunk])))


def gram_eigenvalues(matrices: Sequence[torch.Tensor], progress: bool = False,
            workers: int | None = None) -> list[torch.Tensor | None]:
    """The ascending float64 eigenvalues λ = σ² of each matrix (None where an entry is not finite).

    CPU: one single-threaded job per matrix on a pool of ``workers`` threads (default
    ``torch.get_num_threads()``): nested BLAS threads slow down badly on a busy machine, one
    thread per job does not.
    GPU: same-shape matrices stacked and decomposed in batches.
    """
    from tqdm.auto import tqdm

    out: list[torch.Tensor | None] = [None] * len(matrices)
    bar = tqdm(total=len(matrices), desc="spectra", unit="matrix", disable=not progress)
    on_cpu = [i for i, m in enumerate(matrices) if m.device.type == "cpu"]
    cpu_set = set(on_cpu)
    finite = {i: bool(torch.isfinite(m).all()) for i, m in enumerate(matrices) if i not in cpu_set}
    on_gpu = [i for i, ok in finite.items() if ok]
    bar.update(len(finite) - len(on_gpu))

    for i, lam in _batched_spectra(matrices, on_gpu):
        out[i] = lam
        bar.update(1)

    if on_cpu:
        limits = _blas_single_threaded()
        job = _cpu_spectrum if limits is not None else _gram_spectrum
        workers = max(1, min(len(on_cpu), workers or torch.get_num_threads()))
        with _torch_threads(1), limits if limits is not None else contextlib.nullcontext():
            with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
                for i, lam in zip(on_cpu, pool.map(lambda i: job(matrices[i]), on_cpu)):
                    out[i] = lam
                    bar.update(1)
    bar.close()
    return out


# --- batched estimators on spectra of equal length (rows of `lam`, ascending) --------------------

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


def _esd_fits(lam: torch.Tensor, threshold: float) -> list[EsdFit]:
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


def _hill(lam: torch.Tensor, threshold: float) -> np.ndarray:
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


def _shape(lam: torch.Tensor, window: tuple[float, float], rank: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Spectral-shape (α, R²) per row; NaN where the window reaches numerically zero σ."""
    n = lam.shape[1]
    lo, hi = _window_bounds(window, n)
    nan = np.full(lam.shape[0], np.nan)
    if hi - lo < 2:
        return nan, nan.copy()
    sv = lam.flip(1)[:, lo:hi].sqrt()
    x = torch.log(torch.arange(lo + 1, hi + 1, dtype=lam.dtype, device=lam.device))
    xc = x - x.mean()
    y = torch.log(sv.clamp_min(torch.finfo(lam.dtype).tiny))
    yc = y - y.mean(1, keepdim=True)
    sxy, sxx, syy = yc @ xc, xc @ xc, (yc * yc).sum(1)
    alpha = -sxy / sxx
    r2 = torch.where(syy > 0, sxy * sxy / (sxx * syy), torch.full_like(syy, math.nan))
    bad = rank < hi  # a numerically zero singular value inside the window
    alpha = torch.where(bad, torch.full_like(alpha, math.nan), alpha)
    r2 = torch.where(bad, torch.full_like(r2, math.nan), r2)
    return alpha.cpu().numpy(), r2.cpu().numpy()


def _companions(lam: torch.Tensor, rank: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable rank, log10 λ_max and entropy per row (NaN for an all-zero spectrum or rank ≤ 1)."""
    top = lam[:, -1]
    total = lam.sum(1)
    nan = torch.full_like(top, math.nan)
    stable = torch.where(top > 0, total / top, nan)
    log_top = torch.where(top > 0, torch.log10(top.clamp_min(torch.finfo(lam.dtype).tiny)), nan)
    p = lam / total.clamp_min(torch.finfo(lam.dtype).tiny)[:, None]
    plogp = torch.where(p > 0, p * torch.log(p.clamp_min(torch.finfo(lam.dtype).tiny)), torch.zeros_like(p))
    entropy = torch.where(rank > 1, -plogp.sum(1) / torch.log(rank.to(lam.dtype).clamp_min(2)), nan)
    return stable.cpu().numpy(), log_top.cpu().numpy(), entropy.cpu().numpy()


def _numerical_rank(lam: torch.Tensor, big_dims: torch.Tensor, unit_roundoff: torch.Tensor) -> torch.Tensor:
    """#σ above what rounding can produce, judged in the input's own precision.

    Two floors, the larger wins: the float64 spectrum's own resolution σ_max · max(rows, cols)
    · ε₆₄ (``numpy.linalg.matrix_rank``'s tolerance, and WeightWatcher's), and the input's
    rounding: storing W in a dtype with unit roundoff u (ε/2: 6e-8 for float32, 0.004 for
    bfloat16) perturbs each entry by at most u·|w_ij|, so by Weyl's inequality no singular
    value moves by more than u·‖W‖_F. A singular value below that cannot be told from zero:
    a rank-1 float32 matrix is rank 1, not a spectrum of rounding noise.
    """
    sv = lam.sqrt()
    resolution = sv[:, -1] * big_dims.to(lam.dtype) * _EPS
    rounding = unit_roundoff.to(lam.dtype) * lam.sum(1).sqrt()
    tol = torch.maximum(resolution, rounding)
    return (sv > tol[:, None]).sum(1)


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype (0 for exact integer and boolean dtypes)."""
    return 0.5 * torch.finfo(dtype).eps if dtype.is_floating_point or dtype.is_complex else 0.0


def check_estimators(estimators: Iterable[str] | None) -> tuple[str, ...]:
    if estimators is None:
        return ESTIMATORS
    if isinstance(estimators, str):
        estimators = [estimators]
    chosen = tuple(dict.fromkeys(estimators))
    unknown = [e for e in chosen if e not in ESTIMATORS]
    if unknown or not chosen:
        raise ValueError(f"unknown estimators {unknown or '(none)'}; choose from {', '.join(ESTIMATORS)}")
    return tuple(e for e in ESTIMATORS if e in chosen)


def check_window(window: tuple[float, float]) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in window)
    except (TypeError, ValueError):
        raise ValueError(f"window must be a pair of fractions (lo, hi), got {window!r}") from None
    if not 0.0 <= lo < hi <= 1.0:
        raise ValueError(f"window must satisfy 0 <= lo < hi <= 1, got {window!r}")
    return lo, hi


def spectral_table(matrices: Sequence[torch.Tensor | np.ndarray], *,
                   window: tuple[float, float] = DEFAULT_WINDOW,
                   estimators: Iterable[str] | None = None,
                   threshold: float = EVALS_THRESHOLD, progress: bool = False) -> pd.DataFrame:
    """Every estimator for each 2-D matrix, one row per matrix in order.

    Columns: ``rows, cols`` and ``VALUE_COLUMNS`` (see the module docstring; columns of
    estimators not asked for are NaN), and ``note`` (empty, or why a value is NaN).
    """
    window = check_window(window)
    chosen = check_estimators(estimators)
    mats = [torch.as_tensor(m) for m in matrices]
    for k, m in enumerate(mats):
        if m.dim() != 2:
            raise ValueError(f"matrix {k} has shape {tuple(m.shape)}; expected a 2-D matrix")

    # Many small CPU ops: one thread each is faster than a contended pool (the spectra are
    # computed on a pool of single-threaded jobs).
    on_cpu = all(m.device.type == "cpu" for m in mats)
    workers = torch.get_num_threads()
    with _torch_threads(1) if on_cpu else contextlib.nullcontext():
        return _spectral_table(mats, window, chosen, threshold, progress, workers)


def _spectral_table(mats, window, chosen, threshold, progress, workers) -> pd.DataFrame:
    spec = gram_eigenvalues(mats, progress=progress, workers=workers)
    n_rows = len(mats)
    values = {c: np.full(n_rows, np.nan) for c in VALUE_COLUMNS}
    values["n_tail"] = np.full(n_rows, -1, dtype=np.int64)
    notes: list[list[str]] = [[] for _ in range(n_rows)]

    usable: dict[tuple[int, object], list[int]] = {}
    for k, (m, lam) in enumerate(zip(mats, spec)):
        if lam is None:
            notes[k].append("non-finite entries")
        elif m.numel() == 0:
            notes[k].append("empty matrix")
        elif float(lam[-1]) == 0.0:
            notes[k].append("all-zero matrix")
        else:
            usable.setdefault((lam.shape[0], lam.device), []).append(k)

    for (n, _), idx in usable.items():
        lam = torch.stack([spec[k] for k in idx])
        big = torch.tensor([max(mats[k].shape) for k in idx], device=lam.device)
        roundoff = torch.tensor([unit_roundoff(mats[k].dtype) for k in idx], device=lam.device)
        rank = _numerical_rank(lam, big, roundoff)
        rank_np = rank.cpu().numpy()
        few = n < MIN_SINGULAR_VALUES
        for pos, k in enumerate(idx):
            if few:
                notes[k].append(f"fewer than {MIN_SINGULAR_VALUES} singular values ({n})")
            elif rank_np[pos] <= 1:
                notes[k].append(f"rank {int(rank_np[pos])}")
        no_alpha = few | (rank_np <= 1)
        kept = (lam > threshold).sum(1).cpu().numpy()
        if "esd" in chosen or "hill" in chosen:
            for pos, k in enumerate(idx):
                if not no_alpha[pos] and kept[pos] < MIN_SINGULAR_VALUES:
                    notes[k].append(f"only {kept[pos]} eigenvalues above {threshold:g} "
                                    f"(need {MIN_SINGULAR_VALUES})")

        if "companions" in chosen or "esd" in chosen:
            stable, log_top, entropy = _companions(lam, rank)
            values["log_lambda_max"][idx] = log_top
            if "companions" in chosen:
                values["stable_rank"][idx] = stable
                values["entropy"][idx] = entropy
        if few:  # no α for any of them; the companions above still hold
            continue
        if "shape" in chosen:
            a, r2 = _shape(lam, window, rank)
            for pos, k in enumerate(idx):
                if not no_alpha[pos] and not math.isfinite(a[pos]):
                    notes[k].append("shape: numerically zero singular values in the rank window"
                                    if rank_np[pos] < n else "shape: rank window too small")
            values["alpha_shape"][idx] = np.where(no_alpha, np.nan, a)
            values["alpha_shape_r2"][idx] = np.where(no_alpha, np.nan, r2)
        if "hill" in chosen:
            values["alpha_hill"][idx] = np.where(no_alpha, np.nan, _hill(lam, threshold))
        if "esd" in chosen:
            for pos, (k, fit) in enumerate(zip(idx, _esd_fits(lam, threshold))):
                if no_alpha[pos]:
                    continue
                if fit.note and kept[pos] >= MIN_SINGULAR_VALUES:
                    notes[k].append(fit.note)
                values["alpha_esd"][k], values["xmin"][k] = fit.alpha, fit.xmin
                values["ks_distance"][k], values["n_tail"][k] = fit.ks_distance, fit.n_tail
                values["alpha_esd_sigma"][k] = fit.sigma
            values["alpha_weighted"][idx] = values["alpha_esd"][idx] * values["log_lambda_max"][idx]

    if "companions" not in chosen:
        values["log_lambda_max"][:] = np.nan

    table = pd.DataFrame({"rows": [int(m.shape[0]) for m in mats], "cols": [int(m.shape[1]) for m in mats]})
    for c in VALUE_COLUMNS:
        table[c] = values[c]
    table["n_tail"] = pd.array([int(v) if v >= 0 else pd.NA for v in values["n_tail"]], dtype="Int64")
    table["note"] = ["; ".join(n) for n in notes]
    return table


# --- a model -----------------------------------------------------------------------------------

def alpha_table(model: nn.Module, *, window: tuple[float, float] = DEFAULT_WINDOW,
                estimators: Iterable[str] | None = None, cache: bool = True, refresh: bool = False,
                progress: bool = False) -> pd.DataFrame:
    """Every estimator for every weight matrix of every decoder block: one row per (layer, role).

    Columns (``COLUMNS``): ``layer, role, rows, cols`` (the matrix as (out, in) features);
    ``alpha_shape, alpha_shape_r2`` (spectral-shape α over the rank ``window`` and its R²);
    ``alpha_esd, xmin, ks_distance, n_tail, alpha_esd_sigma`` (WeightWatcher's power-law fit of
    the eigenvalue density: α, the x_min chosen, the KS distance D, the eigenvalues in the tail,
    (α−1)/√n_tail); ``alpha_hill`` (median-x_min Hill α); ``stable_rank``; ``log_lambda_max``;
    ``alpha_weighted`` (α_esd · log10 λ_max); ``entropy``; ``note`` (why a value is NaN).

    ``estimators`` picks a subset of ``ESTIMATORS`` ("shape", "esd", "hill", "companions");
    the others' columns are NaN. With ``cache=True`` the table is stored under the model's
    fingerprint, the window, the estimators and ``VERSION``. Runs where the weights are.
    """
    window = check_window(window)
    chosen = check_estimators(estimators)
    adapter = get_adapter(model)

    def compute() -> pd.DataFrame:
        with torch.no_grad():
            entries = list(adapter.iter_matrices())
            table = spectral_table([m for _, _, m in entries], window=window, estimators=chosen,
                                   progress=progress)
        table.insert(0, "role", [role for _, role, _ in entries])
        table.insert(0, "layer", [layer for layer, _, _ in entries])
        return table[COLUMNS]

    if not cache:
        return compute()
    from .cache import cached_table
    from .models import model_fingerprint

    parts = dict(kind="alpha_table", version=VERSION, model=model_fingerprint(model), window=list(window),
                 estimators=list(chosen), threshold=EVALS_THRESHOLD)
    table = cached_table("alpha", parts, compute, refresh=refresh)
    table["note"] = table["note"].fillna("")
    table["n_tail"] = table["n_tail"].astype("Int64")
    return table


def layer_alpha(table: pd.DataFrame, estimator: str = "alpha_shape", role: str = "weighted") -> pd.Series:
    """One value per block: a single role's value, or ``role="weighted"``: the mean over the
    block's matrices weighted by their parameter counts (rows · cols), NaNs skipped.

    Returns a Series indexed by ``layer`` and named ``estimator``.
    """
    if estimator not in table.columns or estimator in ("layer", "role", "rows", "cols", "note"):
        raise ValueError(f"unknown estimator {estimator!r}; choose from {', '.join(VALUE_COLUMNS)}")
    if role == "weighted":
        value = table[estimator].astype(float)
        weight = (table["rows"] * table["cols"]).astype(float).where(value.notna(), 0.0)
        frame = pd.DataFrame({"layer": table["layer"], "wv": (value * weight).fillna(0.0), "w": weight})
        sums = frame.groupby("layer")[["wv", "w"]].sum()
        series = (sums["wv"] / sums["w"].where(sums["w"] > 0)).astype(float)
    else:
        rows = table[table["role"] == role]
        if rows.empty:
            raise ValueError(f"no rows for role {role!r}; roles present: {sorted(table['role'].unique())} "
                             f"or 'weighted'")
        series = rows.set_index("layer")[estimator].astype(float)
    series = series.sort_index()
    series.index.name = "layer"
    series.name = estimator
    return series


def role_group(role: str) -> str:
    """Q/K, V/O or MLP."""
    return ROLE_GROUPS.get(role, "MLP")


def depth_spread(table: pd.DataFrame, estimator: str = "alpha_shape") -> pd.DataFrame:
    """How much each role's value moves with depth: one row per role.

    Columns: ``role, group`` (Q/K, V/O, MLP); ``first, last`` (the value at the first and last
    block); ``min, max, range`` (max − min over blocks); ``std`` (over blocks); ``depth_corr``
    (Spearman correlation of the value with the block index). NaN values are skipped.
    """
    if estimator not in VALUE_COLUMNS or estimator not in table.columns:
        raise ValueError(f"unknown estimator {estimator!r}; choose from {', '.join(VALUE_COLUMNS)}")
    rows = []
    for role, part in table.groupby("role", sort=False):
        part = part.sort_values("layer")
        value = part[estimator].astype(float)
        ok = value.notna()
        corr = part.loc[ok, "layer"].rank().corr(value[ok].rank()) if ok.sum() > 2 else float("nan")
        rows.append(dict(role=role, group=role_group(role), first=float(value.iloc[0]),
                         last=float(value.iloc[-1]), min=float(value.min()), max=float(value.max()),
                         range=float(value.max() - value.min()), std=float(value.std()),
                         depth_corr=float(corr)))
    return pd.DataFrame(rows, columns=["role", "group", "first", "last", "min", "max", "range", "std",
                                       "depth_corr"])


def matrix_module_names(model: nn.Module) -> pd.DataFrame:
    """For each (layer, role), the qualified name of the module whose whole weight the matrix is.

    Columns: ``layer, role, module`` (None where the matrix is a slice of a fused weight, as
    GPT-2's and GPT-NeoX's Q/K/V). Lets other tools' per-module results be matched to ours.
    """
    owners = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2:
            owners.setdefault((weight.untyped_storage().data_ptr(), weight.data_ptr()), []).append(
                (name, tuple(weight.shape)))
    rows = []
    for layer, role, matrix in get_adapter(model).iter_matrices():
        found = None
        key = (matrix.untyped_storage().data_ptr(), matrix.data_ptr())
        for name, shape in owners.get(key, []):
            if shape in (tuple(matrix.shape), tuple(matrix.shape)[::-1]):
                found = name
                break
        rows.append(dict(layer=layer, role=role, module=found))
    return pd.DataFrame(rows, columns=["layer", "role", "module"])


def estimator_correlation(table: pd.DataFrame, role: str = "q", first: str = "alpha_shape",
                          second: str = "alpha_esd") -> float:
    """Spearman correlation across depth between two estimators of one role (NaNs skipped)."""
    for name in (first, second):
        if name not in VALUE_COLUMNS:
            raise ValueError(f"unknown estimator {name!r}; choose from {', '.join(VALUE_COLUMNS)}")
    rows = table[table["role"] == role][[first, second]].astype(float).dropna()
    if len(rows) < 3:
        return float("nan")
    return float(rows[first].rank().corr(rows[second].rank()))
