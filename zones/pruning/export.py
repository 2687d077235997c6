"""Pruning for real: a pruned model as a plain Hugging Face directory.

``pruned_copy(model, removed)`` returns a new model without the removed blocks: the blocks
that remain are the same modules' weights, the config says the new depth
(``num_hidden_layers`` / ``n_layer``) and every per-block list of the config (``layer_types``
and the like) keeps only the remaining blocks' entries, and every block's ``layer_idx`` is
renumbered 0..n-1, so that the KV cache of ``generate`` gives each remaining block its own slot
(cached generation equals uncached generation).

``export_model(model, removed, out_dir, tokenizer=...)`` writes that model to ``out_dir`` atomically
(``zones.core.atomic.atomic_directory``): ``config.json`` (``use_cache`` on again),
``model.safetensors``, the generation config, the tokenizer, and ``zones-provenance.json``
(:data:`PROVENANCE`): the source model's name and fingerprint, the removed blocks (source
numbering), the strategy that chose them, any healing, the zones and transformers versions,
and the files written. ``transformers.AutoModelForCausalLM.from_pretrained(out_dir)`` loads it
without zones.

Nothing is lost: an ``out_dir`` that exists is replaced only when it holds a previous export (its
provenance lists every file in it); a folder with anything else in it, the current folder or
one above it is refused before any work (:func:`check_out_folder`). A killed export's hidden
temporary folder (``.NAME.*.tmp``, with zones' marker ``.NAME.*.tmp.zones`` beside it) is removed
by the next export to the same ``out_dir``; a folder of that shape without the marker is the user's,
and kept.

``choose_removed(model, strategy, k, ...)`` asks a pruning strategy (``zones.pruning``) for
its k blocks, as ``zones prune`` would.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Iterable, Sequence

import transformers
from torch import nn

from zones.core.adapters import get_adapter
from zones.core.atomic import atomic_directory, atomic_write_text
from zones.core.checks import check_int
from zones.core.data import Windows
from zones.core.models import model_fingerprint
from zones.core.version import __version__
from zones.measure.blocks import check_layers
from zones.pruning import PruningContext, get_strategy

PROVENANCE = "zones-provenance.json"
DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")


class ExportError(ValueError):
    """The model cannot be exported as asked (one line: the cause and the remedy)."""


def _spans(removed: Sequence[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive blocks: ``[3, 4, 9]`` -> ``[(3, 4), (9, 9)]``."""
    spans: list[tuple[int, int]] = []
    for block in sorted(removed):
        if spans and block == spans[-1][1] + 1:
            spans[-1] = (spans[-1][0], block)
        else:
            spans.append((block, block))
    return spans


def per_block_keys(config, n_blocks: int) -> list[str]:
    """Config entries that hold one value per block: lists of length ``n_blocks`` whose name
    mentions layers or blocks (``layer_types``, ...)."""
    keys = []
    for key, value in config.to_dict().items():
        if isinstance(value, (list, tuple)) and len(value) == n_blocks and ("layer" in key or "block" in key):
            keys.append(key)
    return keys


def parse_remove_flag(value, flag: str = "--remove") -> list[int]:
    """``--remove 3,11,20`` (the text, or the list the command line parsed it into) as block
    indices, before any model loads: one line naming the flag when it names no block, something
    that is not a block index, or a block twice."""
    shown = value if isinstance(value, str) else ",".join(map(str, value))
    parts = [part.strip() for part in value.split(",")] if isinstance(value, str) else list(value)
    if not any(str(part).strip() for part in parts):
        raise ExportError(f"{flag} {shown!r} names no block; pass the blocks to remove, e.g. {flag} 3,11,20")
    blocks = []
    for part in parts:
        text = str(part).strip()
        if isinstance(part, bool) or not text.isdigit():  # refuses "", "-1", "1.5", "a": block indices count from 0
            raise ExportError(f"{flag} needs comma-separated block indices (integers from 0) such as 3,11,20; "
                              f"{text!r} in {shown!r} is not one")
        blocks.append(int(text))
    twice = sorted({b for b in blocks if blocks.count(b) > 1})
    if twice:
        raise ExportError(f"{flag} {shown} names block{'s' if len(twice) > 1 else ''} "
                          f"{', '.join(map(str, twice))} twice; name each block once")
    return blocks


def check_removed(model: nn.Module, removed: Iterable[int]) -> list[int]:
    """The removed blocks, checked against the model: integers (python or numpy; not bools, not
    floats such as 1.7), each named once, at least one, and at least one block remains.
    Returned sorted."""
    if isinstance(removed, (str, bytes)) or not isinstance(removed, Iterable):
        raise ExportError(f"removed must be a list of block indices; got {removed!r}")
    try:
        removed = [check_int(b, "removed block", min=0) for b in removed]
    except ValueError as err:
        raise ExportError(str(err)) from None
    if not removed:
        raise ExportError("removed names no block; pass at least one block to remove")
    if len(set(removed)) < len(removed):
        twice = sorted({b for b in removed if removed.count(b) > 1})
        raise ExportError(f"removed names block{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} "
                          f"twice; name each block once")
    n = get_adapter(model).n_blocks
    outside = [b for b in removed if b >= n]
    if outside:
        raise ExportError(f"--remove names block{'s' if len(outside) > 1 else ''} {', '.join(map(str, outside))}, "
                          f"but the model has blocks 0..{n - 1}")
    removed = check_layers(model, removed)
    if len(removed) >= n:
        raise ExportError(f"--remove names all {n} blocks; at least one block must remain")
    config = model.config
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) and removed:
        raise ExportError("this GPT-2 config scales attention by 1/(layer_idx + 1), which renumbering the "
                          "remaining blocks would change; export is not supported for it")
    return removed


def pruned_copy(model: nn.Module, removed: Iterable[int]) -> nn.Module:
    """A new model (deep copy) without the ``removed`` blocks: config depth and per-block lists
    updated, ``layer_idx`` of every remaining block renumbered; ``model`` is untouched."""
    removed = check_removed(model, removed)
    source = get_adapter(model)
    n = source.n_blocks
    # The removed blocks are never copied (deepcopy's memo maps each to None), only to be dropped:
    # a copy of the whole model takes ~1 s on 2 cores, and healing makes one per removal set.
    blocks = getattr(*source.block_container())
    out = copy.deepcopy(model, {id(blocks[i]): None for i in removed})
    adapter = get_adapter(out)
    parent, name = adapter.block_container()
    kept = [block for block in getattr(parent, name) if block is not None]
    setattr(parent, name, nn.ModuleList(kept))
    for new_index, block in enumerate(kept):
        for module in block.modules():
            if hasattr(module, "layer_idx"):
                module.layer_idx = new_index
    config = out.config
    for key in per_block_keys(config, n):
        value = getattr(config, key)
        setattr(config, key, type(value)(v for i, v in enumerate(value) if i not in set(removed)))
    depth_key = next((k for k in DEPTH_KEYS if k in config.to_dict()), "num_hidden_layers")
    setattr(config, depth_key, len(kept))
    return out


def choose_removed(model: nn.Module, strategy: str, k: int, *, calibration: Windows | None = None,
                   seed: int = 0, batch_size: int = 8, progress: bool = True) -> list[int]:
    """The k blocks ``strategy`` removes (its plan at k, for ``seed``), in the strategy's order."""
    chosen = get_strategy(strategy)
    n = get_adapter(model).n_blocks
    try:
        k = check_int(k, "--k", min=1, max=chosen.max_k(n))
    except ValueError as err:
        raise ExportError(f"{err} (strategy {strategy!r} on this {n}-block model)") from None
    if chosen.uses_calibration and calibration is None:
        raise ExportError(f"strategy {strategy!r} measures activations: pass calibration windows (--corpus)")
    ctx = PruningContext(model, calibration, batch_size=batch_size, progress=progress)
    plans = chosen.plan(ctx, k, seed)
    return [int(b) for b in plans[k - 1]]


def provenance(model: nn.Module, removed: Sequence[int], *, source: str, strategy: str | None = None,
               seed: int | None = None, healing: dict | None = None, fingerprint: str | None = None) -> dict:
    """The provenance record written beside an exported model."""
    n = get_adapter(model).n_blocks
    return dict(
        source_model=str(source), source_fingerprint=fingerprint or model_fingerprint(model),
        source_blocks=n, removed=sorted(int(b) for b in removed),
        kept=[i for i in range(n) if i not in set(removed)], strategy=strategy, seed=seed, healing=healing,
        zones_version=__version__, transformers_version=transformers.__version__,
    )


def _files(folder: Path) -> list[str]:
    """Every file under ``folder``, as sorted relative POSIX paths."""
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if not p.is_dir())


def check_out_folder(out_dir: str | Path, flag: str = "--out") -> Path:
    """``out_dir`` of an export, before any work: a new (or empty) folder, or one that holds a
    previous export and nothing else (its provenance lists every file in it), which is replaced.

    Refused, with one line naming the folder: a file; the current folder or one above it (it
    cannot be replaced under the running command); a folder without :data:`PROVENANCE` (a
    user's folder: replacing it would delete what is in it); an export written before
    provenance listed its files; an export with a file added since.
    """
    out_dir = Path(out_dir).expanduser()
    if out_dir.exists() and not out_dir.is_dir():
        raise ExportError(f"{flag} {out_dir} is a file; pass a folder for the model")
    here = Path.cwd().resolve()
    if out_dir.resolve() == here or out_dir.resolve() in here.parents:
        raise ExportError(f"{flag} {out_dir} is the current folder"
                          f"{'' if out_dir.resolve() == here else ' or holds it'}: the export replaces its folder "
                          f"whole; pass a new folder, e.g. {flag} pruned-model")
    if not out_dir.is_dir() or not any(out_dir.iterdir()):
        return out_dir
    remedy = "pass a new folder, or move its contents away to reuse the name"
    record_path = out_dir / PROVENANCE
    if not record_path.is_file():
        raise ExportError(f"{flag} {out_dir} exists and holds no {PROVENANCE}, so it is not a previous export, and the "
                          f"export would replace it whole; {remedy}")
    try:
        listed = json.loads(record_path.read_text(encoding="utf-8")).get("files")
    except (ValueError, UnicodeDecodeError, AttributeError):
        listed = None
    if not isinstance(listed, list):
        raise ExportError(f"{flag} {out_dir}: its {PROVENANCE} lists no files (damaged, or written by an older zones), "
                          f"so zones cannot tell whether the folder holds anything else; {remedy}")
    extra = sorted(set(_files(out_dir)) - set(listed) - {PROVENANCE})
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise ExportError(f"{flag} {out_dir} holds {out_dir / extra[0]}{more}, which the previous export did not "
                          f"write, and the export would replace the folder whole; {remedy}")
    return out_dir


def save_directory(pruned: nn.Module, out_dir: str | Path, record: dict, tokenizer=None) -> Path:
    """Write an already pruned model, its tokenizer and ``record`` (plus the list of files
    written) to ``out_dir`` atomically; ``out_dir`` is checked first (:func:`check_out_folder`)."""
    out_dir = check_out_folder(out_dir)
    pruned.config.use_cache = True  # zones.core.models turns it off for scoring; generation wants it
    with atomic_directory(out_dir) as tmp:
        pruned.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        record = dict(record, files=_files(tmp))
        atomic_write_text(Path(tmp) / PROVENANCE, json.dumps(record, indent=2, sort_keys=True))
    return out_dir


def export_model(model: nn.Module, removed: Iterable[int], out_dir: str | Path, *, tokenizer=None,
                 source: str = "", strategy: str | None = None, seed: int | None = None,
                 fingerprint: str | None = None) -> Path:
    """Write ``model`` without the ``removed`` blocks as a plain Hugging Face directory ``out_dir``
    (config, safetensors, tokenizer, :data:`PROVENANCE`), atomically; return ``out_dir``."""
    removed = check_removed(model, removed)
    record = provenance(model, removed, source=source or str(getattr(model.config, "name_or_path", "")),
                        strategy=strategy, seed=seed, fingerprint=fingerprint)
    return save_directory(pruned_copy(model, removed), out_dir, record, tokenizer)


def check_request(out_dir: str | Path, remove: str | None = None, strategy: str | None = None, k=None,
                  seed=0) -> list[int] | None:
    """Every flag of ``zones export``/``heal`` that can be checked without the model, before it
    loads: ``--out`` (:func:`check_out_folder`), ``--remove`` (:func:`parse_remove_flag`), or
    ``--strategy`` (a registered name) with ``--k`` (>= 1) and ``--seed`` (>= 0). Returns the
    blocks of ``--remove``, or None when a strategy chooses them."""
    check_out_folder(out_dir)
    check_int(seed, "--seed", min=0)
    if remove is not None:
        if strategy is not None or k is not None:
            raise ExportError("pass either --remove or --strategy with --k, not both")
        return parse_remove_flag(remove)
    if strategy is None or k is None:
        raise ExportError("pass --remove 3,11,20 or --strategy NAME --k K")
    get_strategy(strategy)
    check_int(k, "--k", min=1)
    return None


def read_provenance(directory: str | Path) -> dict:
    """The provenance record of an exported directory (``{}`` when there is none)."""
    path = Path(directory) / PROVENANCE
    return json.loads(path.read_text()) if path.exists() else {}
