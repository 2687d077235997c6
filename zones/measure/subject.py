"""The model under measurement, wrapped once at the door of the measuring code.

Every public function of ``zones.measure`` (and of ``zones.pruning``) that runs a model starts
with ``subject = as_subject(model, dtype)``; everything below it takes the :class:`Subject`, so
that one place

* looks up the model's adapter (``zones.core.adapters.get_adapter``: blocks, final norm, LM head),
* resolves and checks the scoring precision (``"auto"`` → ``zones.core.hardware.auto_precision``;
  bfloat16 is refused where it is emulated, ``zones.core.hardware.check_precision``),
* checks windows against the model (``zones.core.models.check_windows_fit``: positions and
  vocabulary), once per set of windows,
* takes the model's fingerprint (``zones.core.models.model_fingerprint``), once, when a cache key
  first needs it.

A Subject passed where a model is expected is used as it is (with another ``dtype``, a copy
that shares its fingerprint). It holds the fingerprint of the model as it was when first asked:
a model edited in place, or run under hooks the fingerprint cannot see (``zero_sublayer``),
must be wrapped again, and its losses never cached (``cache=False``).

Precision: ``"float32"`` runs the model as it is; ``"bfloat16"`` runs the blocks under
``torch.autocast`` in bfloat16 (the weights are never changed); the final norm, the LM head and
the log-sum-exp always run in float32 (``zones.measure.scoring``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from zones.core.adapters import Adapter, get_adapter
from zones.core.glossary import default
from zones.core.hardware import auto_precision, check_precision
from zones.core.models import check_windows_fit, model_fingerprint

DTYPES = ("float32", "bfloat16")
AUTO = "auto"  # bfloat16 where native (zones.core.hardware.auto_precision), float32 elsewhere
DEFAULT_DTYPE = default("dtype")


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_dtype(dtype: str, model: nn.Module | None = None) -> str:
    """The scoring precision, checked: ``"float32"``, ``"bfloat16"`` or ``"auto"``. With
    ``model``, ``"auto"`` is resolved for its device and bfloat16 on a device without native
    bf16 is refused (``zones.core.hardware.check_precision``); without, ``"auto"`` stays."""
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES + (AUTO,):
        raise ValueError(f"dtype must be one of {DTYPES + (AUTO,)}, not {dtype!r}")
    if model is not None:
        device = model_device(model)
        name = auto_precision(device) if name == AUTO else name
        check_precision(name, device, what="scoring dtype")
    return name


@dataclass(eq=False)
class Subject:
    """A model with what the measuring code needs to know about it, resolved once."""

    model: nn.Module
    adapter: Adapter
    dtype: str                      # "float32" or "bfloat16", resolved and checked
    device: torch.device
    _fingerprint: str | None = field(default=None, repr=False)
    _fitted: set = field(default_factory=set, repr=False)   # fingerprints of windows already checked
    _weights: dict = field(default_factory=dict, repr=False)

    @property
    def fingerprint(self) -> str:
        """``zones.core.models.model_fingerprint`` of the model, taken on first use."""
        if self._fingerprint is None:
            self._fingerprint = model_fingerprint(self.model)
        return self._fingerprint

    @property
    def n_blocks(self) -> int:
        return self.adapter.n_blocks

    def precision(self):
        """A context in which the model's blocks run in the scoring precision."""
        if self.dtype == "float32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)

    def check_fit(self, windows) -> None:
        """Sequence length and token ids against the model, before any forward
        (``zones.core.models.check_windows_fit``); once per set of windows."""
        key = getattr(windows, "fingerprint", None)
        if key is not None and key in self._fitted:
            return
        check_windows_fit(self.model, windows)
        if key is not None:
            self._fitted.add(key)

    def key(self) -> dict:
        """What identifies the model and how it is scored, for a cache key."""
        return dict(model=self.fingerprint, dtype=self.dtype,
                    weights_dtype=str(next(self.model.parameters()).dtype), device=self.device.type)

    def block_weights(self, layer: int) -> int:
        """Weights of block ``layer``'s matrices (counted once), for ``zones.core.progress``."""
        if layer not in self._weights:
            block = self.adapter.blocks()[layer]
            self._weights[layer] = int(sum(p.numel() for p in block.parameters() if p.dim() == 2))
        return self._weights[layer]

    def head_weights(self) -> int:
        """Weights of the LM head, for ``zones.core.progress``."""
        if "head" not in self._weights:
            self._weights["head"] = int(next(self.adapter.lm_head().parameters()).numel())
        return self._weights["head"]

    def with_dtype(self, dtype: str) -> "Subject":
        """The same model scored in another precision (its fingerprint is shared)."""
        dtype = check_dtype(dtype, self.model)
        return self if dtype == self.dtype else replace(self, dtype=dtype, _fitted=set(self._fitted))


def as_subject(model: nn.Module | Subject, dtype: str | None = None, *, fingerprint: str | None = None) -> Subject:
    """``model`` at the door: a :class:`Subject` (one passed in is used as it is, or in
    ``dtype`` when given). ``dtype=None`` keeps a Subject's precision, or means float32.
    ``fingerprint``: the model's, when the caller has it already (``LoadedModel.fingerprint``)."""
    if isinstance(model, Subject):
        return model if dtype is None else model.with_dtype(dtype)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a transformers causal LM (torch.nn.Module), not {type(model).__name__}")
    adapter = get_adapter(model)
    return Subject(model, adapter, check_dtype(DEFAULT_DTYPE if dtype is None else dtype, model),
                   model_device(model), fingerprint)
