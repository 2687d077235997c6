"""The spectra of many matrices: eigenvalues of the smaller Gram matrix, and the numerical rank.

Every estimator reads the ascending eigenvalues λ_1 ≤ … ≤ λ_n of the smaller Gram matrix of a
matrix W (W Wᵀ or Wᵀ W), i.e. its squared singular values σ_k², computed in float64 on the
weights' device by ``eigvalsh`` (several times faster than ``svdvals`` on a CPU, and exact to
~n·ε·λ_max; a matrix too ill-conditioned for that is redone with ``svdvals``).

On a CPU each matrix is one single-threaded job on a pool of threads, which keeps every core
busy without the slowdown of nested BLAS threads; on a GPU same-shape matrices are stacked and
decomposed in batches. The numerical rank is judged in the matrix's own precision
(:func:`numerical_rank`).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np
import torch
from scipy.linalg import eigh
from threadpoolctl import threadpool_limits
from tqdm.auto import tqdm

from zones.core.hardware import torch_threads
from zones.core.progress import count_spectrum

EPS = float(np.finfo(np.float64).eps)
_GRAM_TRUST = 100.0  # λ_min below this · n·ε·λ_max: the Gram spectrum is too coarse, use svdvals


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
    coarse = lam[..., 0] < _GRAM_TRUST * n * EPS * lam[..., -1].abs()
    if bool(coarse.any()):
        exact = torch.linalg.svdvals(w[coarse]).flip(-1).square()
        lam = lam.clone()
        lam[coarse] = exact
    return lam.clamp_min(0.0)


def _cpu_spectrum(matrix: torch.Tensor) -> torch.Tensor | None:
    """`_gram_spectrum` on the CPU through NumPy/SciPy: the Gram matrix by ``syrk`` (NumPy uses
    it for ``a @ a.T``: half the flops of a general product) and LAPACK's ``dsyevr`` (values
    only); together about 1.5× faster than the same in torch."""
    a = matrix.detach().to("cpu", torch.float64)
    a = np.ascontiguousarray((a if a.shape[0] <= a.shape[1] else a.mT).numpy())
    if not np.isfinite(a).all():
        return None
    if a.size == 0:
        return torch.zeros(a.shape[0], dtype=torch.float64)
    lam = eigh(a @ a.T, eigvals_only=True, driver="evr", check_finite=False, overwrite_a=True)
    if lam[0] < _GRAM_TRUST * len(lam) * EPS * abs(lam[-1]):
        lam = np.linalg.svd(a, compute_uv=False)[::-1] ** 2
    return torch.from_numpy(np.ascontiguousarray(np.maximum(lam, 0.0)))


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
    out: list[torch.Tensor | None] = [None] * len(matrices)
    bar = tqdm(total=len(matrices), desc="spectra", unit="matrix", disable=not progress)
    on_cpu = [i for i, m in enumerate(matrices) if m.device.type == "cpu"]
    cpu_set = set(on_cpu)
    finite = {i: bool(torch.isfinite(m).all()) for i, m in enumerate(matrices) if i not in cpu_set}
    on_gpu = [i for i, ok in finite.items() if ok]
    bar.update(len(finite) - len(on_gpu))

    for i, lam in _batched_spectra(matrices, on_gpu):
        out[i] = lam
        count_spectrum(*matrices[i].shape[-2:])  # here, not in the workers: one thread adds
        bar.update(1)

    if on_cpu:
        workers = max(1, min(len(on_cpu), workers or torch.get_num_threads()))
        # NumPy's and SciPy's BLAS on one thread per call: one single-threaded job per matrix.
        with torch_threads(1), threadpool_limits(1, user_api="blas"):
            with ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(1,)) as pool:
                for i, lam in zip(on_cpu, pool.map(lambda i: _cpu_spectrum(matrices[i]), on_cpu)):
                    out[i] = lam
                    count_spectrum(*matrices[i].shape[-2:])
                    bar.update(1)
    bar.close()
    return out


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype (0 for exact integer and boolean dtypes)."""
    return 0.5 * torch.finfo(dtype).eps if dtype.is_floating_point or dtype.is_complex else 0.0


def numerical_rank(lam: torch.Tensor, big_dims: torch.Tensor, unit_roundoff: torch.Tensor) -> torch.Tensor:
    """#σ above what rounding can produce, judged in the input's own precision.

    Two floors, the larger wins: the float64 spectrum's own resolution σ_max · max(rows, cols)
    · ε₆₄ (``numpy.linalg.matrix_rank``'s tolerance, and WeightWatcher's), and the input's
    rounding: storing W in a dtype with unit roundoff u (ε/2: 6e-8 for float32, 0.004 for
    bfloat16) perturbs each entry by at most u·|w_ij|, so by Weyl's inequality no singular
    value moves by more than u·‖W‖_F. A singular value below that cannot be told from zero:
    a rank-1 float32 matrix is rank 1, not a spectrum of rounding noise.
    """
    sv = lam.sqrt()
    resolution = sv[:, -1] * big_dims.to(lam.dtype) * EPS
    rounding = unit_roundoff.to(lam.dtype) * lam.sum(1).sqrt()
    tol = torch.maximum(resolution, rounding)
    return (sv > tol[:, None]).sum(1)
