"""zones.core.hardware: bf16 is refused on a CPU without native bf16, allowed where it is native."""
import pytest
import torch

from zones.core import hardware


def _cpu(monkeypatch, capability, flags):
    monkeypatch.setattr(hardware, "cpu_capability", lambda: capability)
    monkeypatch.setattr(hardware, "cpu_flags", lambda: set(flags))


def test_avx2_cpu_has_no_native_bf16_and_refuses_it(monkeypatch):
    _cpu(monkeypatch, "AVX2", {"avx2", "fma"})
    assert not hardware.native_bf16("cpu")
    with pytest.raises(ValueError, match=r"training precision 'bf16'.*AVX2, no native bf16.*float32"):
        hardware.check_precision("bf16", "cpu", what="training precision")
    with pytest.raises(ValueError, match="bfloat16"):
        hardware.check_precision("bfloat16", "cpu", what="--dtype")
    assert hardware.check_precision("fp32", "cpu", what="x") == "fp32"
    assert hardware.check_precision("float32", "cpu", what="x") == "float32"


def test_avx512_without_bf16_flags_is_not_native(monkeypatch):
    _cpu(monkeypatch, "AVX512", {"avx512f"})
    assert not hardware.native_bf16("cpu")
    with pytest.raises(ValueError, match="AVX512, no native bf16"):
        hardware.check_precision("bf16", "cpu", what="training precision")


def test_avx512_bf16_or_amx_is_native(monkeypatch):
    for flag in ("avx512_bf16", "amx_bf16"):
        _cpu(monkeypatch, "AVX512", {"avx512f", flag})
        assert hardware.native_bf16("cpu")
        assert hardware.check_precision("bf16", "cpu", what="x") == "bf16"


def test_emulated_avx2_capability_with_bf16_flags_is_not_native(monkeypatch):
    # ATEN_CPU_CAPABILITY=avx2 on an AVX-512 machine: the kernels are AVX2, so bf16 is slow
    _cpu(monkeypatch, "AVX2", {"avx512f", "avx512_bf16"})
    assert not hardware.native_bf16(torch.device("cpu"))


def test_cpu_capability_is_a_name():
    assert isinstance(hardware.cpu_capability(), str) and hardware.cpu_capability()
