"""Healing a pruned model on calibration tokens, so that it can be exported as a plain model.

Two methods, each budgeted in calibration tokens (``heal_tokens``: scored tokens, ``seq_len − 1``
per window) and each reading only the ``calibration`` split (``zones.core.data``), which is
disjoint from the eval windows every chapter scores on:

* ``lora``: LoRA adapters (``peft``) on every attention and MLP projection of the remaining
  blocks, trained with AdamW on next-token loss, ``ceil(tokens / (heal_batch_size·(seq_len−1)))``
  steps over the calibration windows in order (cycling), then merged into the weights. The
  adapter and optimizer state are checkpointed in the cache every ``save_every`` steps, so an
  interrupted run resumes where it stopped. LoRA's capacity is matched across strategies
  already: the same rank on every projection of every kept block, and at the same k every
  strategy keeps L − k blocks, so every pruned model gets the same trainable parameters.
* ``bridge``: a closed-form linear map fitted by least squares on hidden states (the idea of
  LLM-Streamline, Chen et al. 2024, which replaces a pruned span by a light trained layer;
  ReplaceMe, Shopkhoev et al. 2025, fits it linearly and folds it in). Let h be the hidden
  state leaving a block of the pruned model and m that block's MLP output (so h = r + m, r the
  rest of the residual stream), and y a hidden state of the full model. The bridge T
  minimises ‖y − r − m·T‖² + λ‖T − I‖² over the calibration tokens (ridge towards "no
  bridge", λ = ``ridge``·tr(mᵀm)/d). Because m·T is linear in the MLP's last projection, T
  folds into that projection's weight and bias (Llama ``down_proj``, GPT-NeoX
  ``dense_4h_to_h``, GPT-2 ``mlp.c_proj``): the exported directory stays a plain model of the
  same architecture. λ is chosen per bridge from ``ridge`` × :data:`RIDGE_PATH` by squared
  error on held-out calibration tokens (:func:`choose_bridge`). Where the bridges go is
  ``bridges`` (:data:`BRIDGES`):

  - ``one`` (the default; *matched*): one bridge per pruned model, in the MLP of its last
    kept block, fitted so that the pruned model's last hidden state (the output of its last
    kept block) is pulled towards the full model's (the output of its last block). Every
    strategy then gets the same repair: one bridge of d × d parameters, fitted on the same
    calibration tokens, whether its removals are contiguous or scattered.
  - ``per_span`` (*unequal capacity*): one bridge per removed span a..b, in the MLP of block
    a−1, pulling the pruned model's hidden state after the span towards the full model's after
    block b (each span sees the bridges before it). A strategy that removes k scattered blocks
    gets up to k bridges (k·d² parameters), one that removes a contiguous run gets one, so
    their healed models are repaired with different capacity. A span that starts at block 0
    has no preceding block and gets no bridge (folding into the embedding would change the
    tied LM head too); ``HealResult.notes`` says so.

  If the bridges together raise the calibration loss they are all dropped (noted too), so the
  bridge never makes the calibration loss worse.

``HealResult.parameters`` counts the repair's trainable parameters (what was fitted: LoRA's
adapters, or d² per bridge), the capacity a comparison of strategies must hold equal.

Every healed model is cached by its exact key (:func:`heal_key`: model fingerprint, removed
blocks, method, budget, seed, hyper-parameters, calibration windows, version); a rerun
rebuilds it from the small cached state (LoRA adapters or bridge matrices) in seconds.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pandas as pd
import torch
from torch import nn
from tqdm.auto import tqdm

from zones.core.cache import entry_path, sidecar_path
from zones.core.checks import check_choice, check_float, check_int
from zones.core.data import Windows
from zones.core.entries import read_entry, write_entry
from zones.core.glossary import default
from zones.core.progress import count_module, count_training
from zones.measure.scoring import evaluate_loss, evaluate_removals
from zones.measure.store import VERSION as LOSSES_VERSION  # the scored losses' arithmetic: part of every key
from zones.measure.store import chunk_digest
from zones.measure.subject import Subject, as_subject
from zones.pruning.export import _spans, check_removed, provenance, pruned_copy, save_directory

VERSION = "2"   # 2: the matched bridge (one per pruned model) is the default; bridges joins the key
METHODS = ("lora", "bridge")
BRIDGES = ("one", "per_span")   # one bridge per pruned model (matched), or one per removed span (unequal capacity)
DEFAULT_BRIDGES = default("bridges")
LAST = "last"                   # the key of the one bridge, at the pruned model's last block
DEFAULT_HEAL_TOKENS = default("heal_tokens", context="heal")
DEFAULT_LR = default("lr")
DEFAULT_RANK = default("rank")
DEFAULT_HEAL_BATCH_SIZE = default("heal_batch_size")  # calibration windows per healing step
DEFAULT_RIDGE = 1e-2
RIDGE_PATH = (1.0, 10.0, 100.0)  # multiples of ridge tried per span, scored on held-out tokens
HISTORY_COLUMNS = ["step", "tokens", "loss"]

# LoRA targets: every projection of a block, per family; GPT-2's Conv1D stores (in, out).
LORA_TARGETS = {
    "llama": (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], False),
    "gpt_neox": (["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"], False),
    "gpt2": (["c_attn", "c_proj", "c_fc"], True),
}
# The MLP's last projection of each family, and whether its weight is (in, out) (Conv1D).
MLP_OUT = {"llama": ("down_proj", False), "gpt_neox": ("dense_4h_to_h", False), "gpt2": ("c_proj", True)}


class HealError(ValueError):
    """A healing request that cannot run (one line: the cause and the remedy)."""


@dataclass
class HealResult:
    """A healed pruned model and how it got there.

    ``history`` columns: ``step`` (0 = before healing), ``tokens`` (calibration tokens seen),
    ``loss`` (mean calibration loss, nats: the training batch's for LoRA steps; the whole
    calibration set for step 0 and the last row). ``parameters``: the repair's trainable
    parameters, its capacity (LoRA's adapter weights; d² per bridge fitted, kept or dropped).
    ``held_out_before``/``held_out_after``: the mean loss on calibration windows the healing never
    saw (``heal(held_out=...)``), before and after; NaN when none were given.
    """

    model: nn.Module
    removed: list[int]
    method: str
    tokens: int
    seed: int
    key: dict
    history: pd.DataFrame
    calibration_before: float
    calibration_after: float
    notes: list[str] = field(default_factory=list)
    from_cache: bool = False
    parameters: int = 0
    held_out_before: float = float("nan")
    held_out_after: float = float("nan")

    @property
    def held_out_rise(self) -> float:
        """The held-out calibration loss after healing minus before (nats; NaN without held-out
        windows): above 0, the repair fitted its own calibration tokens rather than the text."""
        return self.held_out_after - self.held_out_before

    def record(self) -> dict:
        """The ``healing`` entry of the exported provenance: what was used (``tokens``: the
        calibration tokens the healing saw), beside what was asked (``tokens_budget``)."""
        return dict(method=self.method, tokens=self.tokens, tokens_budget=self.key["tokens"], seed=self.seed,
                    calibration=self.key["windows"], calibration_windows=self.key["n_windows"],
                    calibration_loss_before=self.calibration_before, calibration_loss_after=self.calibration_after,
                    held_out_loss_before=self.held_out_before, held_out_loss_after=self.held_out_after,
                    notes=self.notes, parameters=self.parameters,
                    **{k: self.key[k] for k in ("lr", "rank", "ridge", "bridges") if k in self.key})


def heal_key(fingerprint: str, removed: Sequence[int], method: str, tokens: int, seed: int,
             calibration: Windows, **hyper) -> dict:
    """The exact cache key of one healing run."""
    return dict(kind="heal", version=VERSION, losses=LOSSES_VERSION, model=fingerprint, removed=sorted(int(b) for b in removed),
                method=method, tokens=int(tokens), seed=int(seed), windows=calibration.fingerprint,
                n_windows=calibration.n_windows, **hyper)


PARAMETERS = dict(method="method", heal_tokens="heal_tokens (the healing budget)", lr="lr", rank="rank", ridge="ridge",
                  seed="seed", heal_batch_size="heal_batch_size", bridges="bridges")


def check_options(*, method: str = "lora", heal_tokens=DEFAULT_HEAL_TOKENS, lr=DEFAULT_LR, rank=DEFAULT_RANK,
                  ridge=DEFAULT_RIDGE, seed=0, heal_batch_size=DEFAULT_HEAL_BATCH_SIZE, bridges=DEFAULT_BRIDGES,
                  names: dict[str, str] | None = None) -> None:
    """Check healing's options before any work (``HealError``, one line naming the option as
    ``names`` spells it: the command line passes its flags, the library its parameter names):
    ``method`` one of :data:`METHODS`, ``bridges`` one of :data:`BRIDGES`, ``heal_tokens``, ``rank``
    and ``heal_batch_size`` integers >= 1, ``seed`` >= 0, ``lr`` and ``ridge`` finite and > 0."""
    name = {**PARAMETERS, **(names or {})}
    try:
        check_choice(method, name["method"], METHODS)
        check_choice(bridges, name["bridges"], BRIDGES)
        check_int(heal_tokens, name["heal_tokens"], min=1)
        check_int(heal_batch_size, name["heal_batch_size"], min=1)
        check_int(seed, name["seed"], min=0)
        check_int(rank, name["rank"], min=1)
        check_float(lr, name["lr"], min=0.0, min_inclusive=False)
        check_float(ridge, name["ridge"], min=0.0, min_inclusive=False)
    except ValueError as err:
        raise HealError(str(err)) from None


def _check(method: str, heal_tokens, calibration: Windows, heal_batch_size, held_out: Windows | None = None,
           **options) -> None:
    check_options(method=method, heal_tokens=heal_tokens, heal_batch_size=heal_batch_size, **options)
    for name, windows in (("calibration", calibration), ("held_out", held_out)):
        if windows is None and name == "held_out":
            continue
        if not isinstance(windows, Windows):
            raise TypeError(f"{name} must be zones.core.data.Windows, not {type(windows).__name__}")
        if windows.split != "calibration":
            raise HealError(f"healing reads the calibration split only, not {windows.split!r} windows as {name} "
                            f"(the eval windows must stay unseen); pass corpus_windows(..., split='calibration')")
    if held_out is not None:
        seen = {tuple(row) for row in calibration.input_ids.tolist()}
        shared = sum(tuple(row) in seen for row in held_out.input_ids.tolist())
        if shared or held_out.seq_len != calibration.seq_len:
            raise HealError(f"held_out shares {shared} of its {held_out.n_windows} windows with the calibration "
                            f"windows healing fits on (or another seq_len); hold out other windows, e.g. "
                            f"windows.take(n_heal) beside windows.take(0, n_heal)")


def held_out_note(before: float, after: float, n_tokens: int) -> list[str]:
    """The note a healing run carries when it raised the loss on calibration tokens it never saw."""
    if not after > before:
        return []
    return [f"the repair raised the held-out calibration loss ({before:.4f} -> {after:.4f} nats on {n_tokens} "
            f"tokens it never saw): it fitted its own calibration tokens; heal on more tokens"]


def _to_bytes(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=True)


# --------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------

def _lora_model(pruned: Subject, rank: int, seed: int):
    # peft is imported here: only healing needs it, and it is slow to import.
    from peft import LoraConfig, get_peft_model

    targets, fan_in_fan_out = LORA_TARGETS[pruned.adapter.family]
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets,
                        fan_in_fan_out=fan_in_fan_out, bias="none")
    return get_peft_model(pruned.model, config)


def _lora_state(peft_model) -> dict:
    from peft import get_peft_model_state_dict  # optional heavy dependency (see _lora_model)

    return {k: v.detach().cpu().clone() for k, v in get_peft_model_state_dict(peft_model).items()}


def _set_lora_state(peft_model, state: dict) -> None:
    from peft import set_peft_model_state_dict  # optional heavy dependency (see _lora_model)

    set_peft_model_state_dict(peft_model, state)


def progress_path(key: dict) -> Path:
    """Where the LoRA checkpoint of the healing run ``key`` lives (its sidecar names the key)."""
    return entry_path("heal-progress", key, "pt")


def _discard_progress(key: dict) -> None:
    path = progress_path(key)
    path.unlink(missing_ok=True)
    sidecar_path(path).unlink(missing_ok=True)


def _train_lora(pruned: Subject, calibration: Windows, key: dict, *, steps: int, batch_size: int, lr: float,
                rank: int, seed: int, save_every: int, cache: bool, progress: bool, resume: bool = True):
    """Train, checkpointing to the cache (resuming from its checkpoint when ``resume``); returns
    (merged model, history rows)."""
    peft_model = _lora_model(pruned, rank, seed)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    progress_path_ = progress_path(key)
    start, rows = 0, []
    if cache and resume:
        found = read_entry(progress_path_, key)
        if found is not None:
            state = _from_bytes(found[0])
            _set_lora_state(peft_model, state["lora"])
            optimizer.load_state_dict(state["optimizer"])
            start, rows = int(state["step"]), list(state["rows"])
    device = pruned.device
    ids = calibration.input_ids
    per_batch = batch_size * (calibration.seq_len - 1)
    peft_model.eval()  # no dropout: the update is deterministic given the seed
    bar = tqdm(total=steps, initial=start, desc="healing (LoRA)", disable=not progress, leave=False)
    for step in range(start, steps):
        batch = ids[[(step * batch_size + j) % len(ids) for j in range(batch_size)]].to(device)
        logits = peft_model(input_ids=batch, use_cache=False).logits[:, :-1].float()
        loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        if not torch.isfinite(loss):
            raise HealError(f"LoRA healing diverged at step {step + 1} (loss {float(loss)}); lower --lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        count_training(peft_model, batch.numel(), params)  # the base's passes, the adapters' update
        rows.append((step + 1, (step + 1) * per_batch, float(loss.detach())))
        bar.update(1)
        bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        if cache and ((step + 1) % save_every == 0) and step + 1 < steps:
            write_entry(progress_path_, key, _to_bytes(dict(lora=_lora_state(peft_model), rows=rows,
                                                           optimizer=optimizer.state_dict(), step=step + 1)))
    bar.close()
    state = _lora_state(peft_model)
    return peft_model.merge_and_unload().eval(), state, rows


def _apply_lora(pruned: Subject, state: dict, rank: int, seed: int) -> nn.Module:
    peft_model = _lora_model(pruned, rank, seed)
    _set_lora_state(peft_model, state)
    return peft_model.merge_and_unload().eval()


# --------------------------------------------------------------------------------------------
# The linear bridge
# --------------------------------------------------------------------------------------------

def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def _capture(subject: Subject | nn.Module, windows: Windows, modules: dict, batch_size: int) -> dict:
    """Outputs (hidden size last, flattened over tokens, float64) of named modules on ``windows``."""
    subject = as_subject(subject)   # a Subject passes as it is
    store = {name: [] for name in modules}
    handles = [module.register_forward_hook(lambda _m, _a, out, name=name: store[name].append(
        _first(out).detach().reshape(-1, _first(out).shape[-1]).double().cpu()))
        for name, module in modules.items()]
    try:
        with torch.inference_mode():
            for batch in windows.input_ids.split(batch_size):
                subject.model.base_model(input_ids=batch.to(subject.device), use_cache=False)
                for block in subject.adapter.blocks():  # the body only: no LM head
                    count_module(block, batch.numel())
    finally:
        for handle in handles:
            handle.remove()
    return {name: torch.cat(parts) for name, parts in store.items()}


def _mlp_out(subject: Subject, block: nn.Module) -> tuple[nn.Module, bool]:
    name, conv1d = MLP_OUT[subject.adapter.family]
    return getattr(subject.adapter.mlp(block), name), conv1d


def fit_bridge(rest: torch.Tensor, mlp: torch.Tensor, target: torch.Tensor, ridge: float = DEFAULT_RIDGE):
    """T (d × d, float64) minimising ‖target − rest − mlp·T‖² + λ‖T − I‖²,
    λ = ridge·tr(mlpᵀmlp)/d."""
    d = mlp.shape[1]
    gram = mlp.T @ mlp
    lam = ridge * float(torch.trace(gram)) / d
    eye = torch.eye(d, dtype=gram.dtype)
    return torch.linalg.solve(gram + lam * eye, mlp.T @ (target - rest) + lam * eye)


def _fold(module: nn.Module, conv1d: bool, bridge: torch.Tensor) -> None:
    """Make ``module``'s output ``out·T``: Linear (y = xWᵀ + b) gets W' = TᵀW, b' = bT;
    Conv1D (y = xW + b) gets W' = WT, b' = bT."""
    with torch.no_grad():
        weight = module.weight.double()
        t = bridge.to(weight.device)
        module.weight.copy_((weight @ t) if conv1d else (t.T @ weight))
        if getattr(module, "bias", None) is not None:
            module.bias.copy_(module.bias.double() @ t)


def choose_bridge(rest: torch.Tensor, mlp: torch.Tensor, target: torch.Tensor, n_windows: int,
                  ridge: float = DEFAULT_RIDGE) -> tuple[torch.Tensor, float]:
    """The bridge and its ridge: each of ``ridge`` × :data:`RIDGE_PATH` is fitted on half the
    windows (even ones; the first half of the tokens when there is one window) and scored by
    squared error on the other half; the best is refitted on all tokens."""
    per = rest.shape[0] // max(n_windows, 1)
    window = torch.arange(rest.shape[0]) // max(per, 1)
    held = (window % 2 == 1) if n_windows > 1 else (torch.arange(rest.shape[0]) >= rest.shape[0] // 2)
    fit = ~held
    errors = []
    for strength in RIDGE_PATH:
        bridge = fit_bridge(rest[fit], mlp[fit], target[fit], ridge * strength)
        errors.append(float(((target[held] - rest[held] - mlp[held] @ bridge) ** 2).sum()))
    chosen = ridge * RIDGE_PATH[min(range(len(errors)), key=errors.__getitem__)]
    return fit_bridge(rest, mlp, target, chosen), chosen


def _fit_and_fold(pruned: Subject, block: nn.Module, target: torch.Tensor, windows: Windows, *,
                  batch_size: int, ridge: float) -> torch.Tensor:
    """Fit the bridge in ``block``'s MLP (of ``pruned``) that pulls the block's output towards
    ``target``, fold it in, and return it (float32, the stored precision)."""
    module, conv1d = _mlp_out(pruned, block)
    got = _capture(pruned, windows, dict(h=block, m=pruned.adapter.mlp(block)), batch_size)
    bridge, _ = choose_bridge(got["h"] - got["m"], got["m"], target, windows.n_windows, ridge)
    bridge = bridge.float()  # the stored precision: the cached model then equals this one bit for bit
    _fold(module, conv1d, bridge.double())
    return bridge


_LAST_OUTPUT: dict[tuple, torch.Tensor] = {}   # the one full model's last-block output this process holds


def _last_output(full: Subject, windows: Windows, batch_size: int) -> torch.Tensor:
    """The output of the full model's last block on ``windows`` (:func:`_capture`), computed once
    per (model bytes, token ids, batch size, precision, device) in this process: every pruned
    model of a sweep is bridged towards the same target, so the full model's forward is paid once
    per sweep, not once per removal set (the same computation: the same bits)."""
    weight = next(full.model.parameters())
    key = (full.fingerprint, chunk_digest(windows.input_ids), int(batch_size), str(weight.dtype), str(full.device))
    if key not in _LAST_OUTPUT:
        _LAST_OUTPUT.clear()   # one target at a time: a GPU budget's is hundreds of MB
        _LAST_OUTPUT[key] = _capture(full, windows, dict(y=full.adapter.blocks()[-1]), batch_size)["y"]
    return _LAST_OUTPUT[key]


def _bridge_last(pruned: Subject, full: Subject, windows: Windows, *, batch_size: int, ridge: float):
    """The matched bridge: one, in the MLP of the pruned model's last block, pulling its output
    towards the output of the full model's last block; returns ({:data:`LAST`: T}, notes)."""
    target = _last_output(full, windows, batch_size)
    block = pruned.adapter.blocks()[-1]
    return {LAST: _fit_and_fold(pruned, block, target, windows, batch_size=batch_size, ridge=ridge)}, []


def _bridge_spans(pruned: Subject, full: Subject, removed: list[int], windows: Windows, *,
                  batch_size: int, ridge: float, progress: bool):
    """Fit and fold a bridge per span (unequal capacity), in depth order (each span sees the
    bridges before it); returns ({span: T}, notes)."""
    full_blocks = full.adapter.blocks()
    kept = [i for i in range(len(full_blocks)) if i not in set(removed)]
    spans = _spans(removed)
    targets = _capture(full, windows, {f"{a}-{b}": full_blocks[b] for a, b in spans if a > 0}, batch_size)
    bridges, notes = {}, []
    for a, b in tqdm(spans, desc="healing (bridge)", disable=not progress, leave=False):
        if a == 0:
            notes.append(f"blocks {a}..{b}: no bridge (no block precedes the span)")
            continue
        block = pruned.adapter.blocks()[kept.index(a - 1)]
        bridges[f"{a}-{b}"] = _fit_and_fold(pruned, block, targets[f"{a}-{b}"], windows, batch_size=batch_size,
                                            ridge=ridge)
    return bridges, notes


def _apply_bridges(pruned: Subject, removed: list[int], bridges: dict) -> nn.Module:
    """Fold cached bridges back in: :data:`LAST` at the last block, a span ``"a-b"`` at block a−1."""
    n = len(removed) + pruned.n_blocks
    kept = [i for i in range(n) if i not in set(removed)]
    blocks = pruned.adapter.blocks()
    for span, bridge in bridges.items():
        block = blocks[-1] if span == LAST else blocks[kept.index(int(span.split("-")[0]) - 1)]
        module, conv1d = _mlp_out(pruned, block)
        _fold(module, conv1d, bridge.double())
    return pruned.model


# --------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------

def _frozen(model: nn.Module) -> nn.Module:
    """``model`` in eval mode with no parameter asking for a gradient (a healed model is served)."""
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def tokens_used(method: str, tokens: int, calibration: Windows, heal_batch_size: int) -> int:
    """The calibration tokens a healing run sees (scored tokens, ``seq_len − 1`` per window):
    LoRA's whole steps (cycling through the windows), or the bridge's fitted windows, which the
    calibration split may hold fewer of than ``tokens``."""
    per_window = calibration.seq_len - 1
    if method == "lora":
        return math.ceil(tokens / (heal_batch_size * per_window)) * heal_batch_size * per_window
    return min(calibration.n_windows, math.ceil(tokens / per_window)) * per_window


def budget_notes(method: str, tokens: int, calibration: Windows, heal_batch_size: int) -> list[str]:
    """What the provenance must say when the budget and the tokens used differ."""
    used, held = tokens_used(method, tokens, calibration, heal_batch_size), calibration.n_scored_tokens
    if method == "bridge" and used < tokens:
        return [f"the calibration windows hold {held} of the {tokens} tokens budgeted; the bridge was fitted on "
                f"all {used} of them"]
    if method == "lora" and used > held:
        return [f"the calibration windows hold {held} tokens; LoRA trained on {used} tokens "
                f"({used / held:.1f} passes over them) for the budget of {tokens}"]
    return []


def heal(model: nn.Module, removed: Sequence[int], calibration: Windows, *, method: str = "lora",
         heal_tokens: int = DEFAULT_HEAL_TOKENS, seed: int = 0, lr: float = DEFAULT_LR, rank: int = DEFAULT_RANK,
         ridge: float = DEFAULT_RIDGE, bridges: str = DEFAULT_BRIDGES, heal_batch_size: int = DEFAULT_HEAL_BATCH_SIZE,
         save_every: int = 25, cache: bool = True, refresh: bool = False, progress: bool = True,
         fingerprint: str | None = None, held_out: Windows | None = None) -> HealResult:
    """Remove ``removed`` from a copy of ``model`` and heal it on ``calibration`` (module docstring).

    ``model`` itself is never changed. ``heal_tokens`` is the budget: LoRA trains on that many
    calibration tokens (cycling through the windows; whole steps, so a little more); the bridge
    fits on the first ``ceil(heal_tokens / (seq_len − 1))`` calibration windows, or all of them when
    the split holds fewer. ``bridges`` (the bridge only): ``"one"``, one bridge per pruned model
    at its last block (the same capacity for every removal set), or ``"per_span"``, one per
    removed span (unequal capacity; module docstring). ``HealResult.tokens`` is the number used
    (:func:`tokens_used`), and a note says when it differs from the budget. ``refresh=True`` heals again, ignoring (and
    replacing) the cached result and any LoRA checkpoint. ``held_out``: calibration windows that
    share none with ``calibration``, scored before and after healing (``HealResult.held_out_*``,
    each from the per-window loss store when ``cache``); a note says when healing raised that
    loss. Returns a :class:`HealResult` whose ``model`` is a plain transformers model (adapters
    merged, bridges folded).
    """
    _check(method, heal_tokens, calibration, heal_batch_size, held_out, lr=lr, rank=rank, ridge=ridge, seed=seed,
           bridges=bridges)
    result = _heal(model, removed, calibration, method=method, tokens=heal_tokens, seed=seed, lr=lr, rank=rank,
                   ridge=ridge, bridges=bridges, heal_batch_size=heal_batch_size, save_every=save_every, cache=cache,
                   refresh=refresh, progress=progress, fingerprint=fingerprint)
    if held_out is not None:
        full = as_subject(model, fingerprint=result.key["model"])
        before = evaluate_removals(full, held_out, [result.removed], batch_size=heal_batch_size, progress=False,
                                   cache=cache)[0].loss
        after = evaluate_loss(result.model, held_out, heal_batch_size, cache=cache).loss
        result.held_out_before, result.held_out_after = float(before), float(after)
        result.notes += held_out_note(before, after, held_out.n_scored_tokens)
    return result


def _heal(model: nn.Module, removed: Sequence[int], calibration: Windows, *, method: str, tokens: int, seed: int,
          lr: float, rank: int, ridge: float, bridges: str, heal_batch_size: int, save_every: int, cache: bool,
          refresh: bool, progress: bool, fingerprint: str | None) -> HealResult:
    """:func:`heal` on checked options, without the held-out scores."""
    removed = check_removed(model, removed)
    full = as_subject(model, fingerprint=fingerprint)   # the door: the source model, wrapped once
    full.check_fit(calibration)
    fingerprint = full.fingerprint
    hyper = (dict(lr=float(lr), rank=int(rank), batch_size=heal_batch_size) if method == "lora"  # the key's name
             else dict(ridge=float(ridge), bridges=bridges))
    key = heal_key(fingerprint, removed, method, tokens, seed, calibration, **hyper)
    path = entry_path("heal", key, "pt")
    pruned = as_subject(_frozen(pruned_copy(model, removed)))   # the pruned copy, wrapped once
    n_fit = min(calibration.n_windows, math.ceil(tokens / (calibration.seq_len - 1)))
    fit_windows = Windows(calibration.input_ids[:n_fit], calibration.corpus, calibration.split,
                          calibration.fingerprint)
    used = tokens_used(method, tokens, calibration, heal_batch_size)
    budget = budget_notes(method, tokens, calibration, heal_batch_size)
    if refresh:
        _discard_progress(key)  # heal again: a checkpoint of an earlier run (even a damaged one) is not resumed
    found = None if (refresh or not cache) else read_entry(path, key)
    if found is not None:
        state = _from_bytes(found[0])
        healed = (_apply_lora(pruned, state["lora"], rank, seed) if method == "lora"
                  else _apply_bridges(pruned, removed, state["bridges"]))
        history = pd.DataFrame(state["rows"], columns=HISTORY_COLUMNS)
        notes = budget + [n for n in state["notes"] if n not in budget and "tokens budgeted" not in n]
        return HealResult(healed, removed, method, used, seed, key, history, float(state["before"]),
                          float(state["after"]), notes, from_cache=True, parameters=int(state["parameters"]))
    score_windows = calibration if method == "lora" else fit_windows
    before = evaluate_loss(pruned, score_windows, heal_batch_size).loss   # a fresh copy: not cached
    notes: list[str] = []
    if method == "lora":
        steps = math.ceil(tokens / (heal_batch_size * (calibration.seq_len - 1)))
        healed, lora, rows = _train_lora(pruned, calibration, key, steps=steps, batch_size=heal_batch_size, lr=lr,
                                         rank=rank, seed=seed, save_every=save_every, cache=cache,
                                         progress=progress, resume=not refresh)
        payload, parameters = dict(lora=lora), sum(int(v.numel()) for v in lora.values())
    else:
        fitted, notes = (_bridge_last(pruned, full, fit_windows, batch_size=heal_batch_size, ridge=ridge)
                         if bridges == "one" else
                         _bridge_spans(pruned, full, removed, fit_windows, batch_size=heal_batch_size, ridge=ridge,
                                       progress=progress))
        healed, rows = pruned.model, []
        payload, parameters = dict(bridges=fitted), sum(int(t.numel()) for t in fitted.values())
    healed = _frozen(healed)
    after = evaluate_loss(healed, score_windows, heal_batch_size).loss
    if method == "bridge" and payload["bridges"] and not after < before:
        notes.append(f"bridges dropped: they raised the calibration loss ({before:.4f} -> {after:.4f} nats)")
        healed, payload, after = _frozen(pruned_copy(model, removed)), dict(bridges={}), before
    rows = [(0, 0, before)] + rows + [(len(rows) + 1 if method == "bridge" else len(rows), used, after)]
    rows = [(int(s), int(t), float(v)) for s, t, v in rows]
    if cache:
        write_entry(path, key, _to_bytes(dict(payload, rows=rows, before=before, after=after, notes=notes,
                                              parameters=parameters)))
    history = pd.DataFrame(rows, columns=HISTORY_COLUMNS)
    return HealResult(healed, removed, method, used, seed, key, history, before, after, budget + notes,
                      parameters=parameters)


def export_healed(result: HealResult, out_dir: str | Path, *, tokenizer=None, source: str = "",
                  strategy: str | None = None) -> Path:
    """Write a healed model as a plain Hugging Face directory (``zones.pruning.export.save_directory``),
    its provenance naming the source model, the removed blocks and the healing."""
    n_source = as_subject(result.model).n_blocks + len(result.removed)
    record = provenance(result.model, result.removed, source=source, strategy=strategy,
                        healing=result.record(), fingerprint=result.key["model"])
    record["source_blocks"] = n_source
    record["kept"] = [i for i in range(n_source) if i not in set(result.removed)]
    return save_directory(result.model, out_dir, record, tokenizer)
