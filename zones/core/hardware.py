"""What this machine can do fast: the CPU's vector capability and whether bfloat16 is native.

A CPU without native bfloat16 (AVX2 only, or AVX-512 without ``avx512_bf16``/``amx_bf16``)
emulates bf16 arithmetic and runs it about 100x slower than float32, so a bf16 request there
is refused with one clear line instead of a silent slowdown::

    cpu_capability()                       # "AVX512", "AVX2", "DEFAULT", ...
    native_bf16("cpu")                     # False on an AVX2-only CPU
    check_precision("bf16", "cpu", what="training precision")   # ValueError there
    auto_precision("cpu")                  # "bfloat16" where it is native, else "float32"

``auto_precision`` is what a scoring precision of ``"auto"`` resolves to. A chapter defaults to
``"auto"`` only where ``benchmarks/bench_dtype.py`` measured bf16 to agree with float32 on its
tables, and its page states the precision that ran, so no result depends silently on the CPU.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

BF16_NAMES = ("bf16", "bfloat16")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
CPUINFO = Path("/proc/cpuinfo")


def cpu_capability() -> str:
    """The CPU kernels PyTorch dispatches to (``torch.backends.cpu.get_cpu_capability()``):
    ``"AVX512"``, ``"AVX2"``, ``"DEFAULT"``, ... (``ATEN_CPU_CAPABILITY`` lowers it)."""
    return str(torch.backends.cpu.get_cpu_capability())


def cpu_flags() -> set[str]:
    """The CPU feature flags in ``/proc/cpuinfo`` (empty where there is no such file)."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def native_bf16(device: str | torch.device = "cpu") -> bool:
    """True when bfloat16 arithmetic on ``device`` runs natively: a CUDA device with bf16
    support, or a CPU whose capability is an AVX-512/AMX level and whose flags include
    ``avx512_bf16`` or ``amx_bf16``."""
    device = torch.device(device)
    if device.type == "cuda":
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    capability = cpu_capability().upper()
    if not (capability.startswith("AVX512") or capability.startswith("AMX")):
        return False
    return bool(cpu_flags() & set(CPU_BF16_FLAGS))


def auto_precision(device: str | torch.device = "cpu") -> str:
    """The scoring precision ``"auto"`` stands for on ``device``: ``"bfloat16"`` where bf16 is
    native (:func:`native_bf16`), else ``"float32"``."""
    return "bfloat16" if native_bf16(device) else "float32"


def check_precision(precision: str, device: str | torch.device = "cpu", *, what: str = "precision") -> str:
    """``precision`` unchanged when it runs at full speed on ``device``; bfloat16 on a CPU
    without native bf16 raises ValueError with one line naming ``what`` and the remedy."""
    if str(precision).lower() not in BF16_NAMES or native_bf16(device):
        return precision
    device = torch.device(device)
    where = (f"this CPU ({cpu_capability()}, no native bf16)" if device.type == "cpu"
             else f"device {device} (no native bf16)")
    raise ValueError(f"{what} {precision!r}: bfloat16 on {where} runs ~100x slower than float32; "
                     f"use float32 (fp32) here, or bf16 on a GPU or a CPU with avx512_bf16/amx_bf16")


@contextlib.contextmanager
def torch_threads(n: int):
    """Run torch's CPU ops on ``n`` threads inside the block (the setting is process-wide)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity mask, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks here (macOS, Windows)
        return os.cpu_count() or 1
