"""The one shared validator for scalar parameters, in the spirit of scikit-learn's ``check_scalar``.

Every public function that takes a count, a size, a level or a choice checks it here, so the rules and the
messages agree across the library:

- integers: python ``int`` and numpy integers are accepted, ``bool`` and floats (even ``99.0``) are refused;
- floats: python and numpy numbers are accepted (not ``bool``), non-finite values are refused unless asked;
- each check returns the plain python value (``int``, ``float``), so numpy scalars do not leak into tables
  and cache keys;
- a bad value raises ``ValueError`` with one line: ``"NAME must be ...; got VALUE"``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any

import numpy as np

__all__ = ["check_int", "check_float", "check_choice", "check_probability", "check_blocks", "check_models",
           "model_identity",
           "duplicate_models", "duplicate_text", "DuplicateModelError"]


def _shown(value: Any) -> str:
    """``repr`` of the value, with numpy scalars shown as their python value."""
    if isinstance(value, np.generic):
        value = value.item()
    return repr(value)


def _bounds(min: Any, max: Any, min_inclusive: bool = True, max_inclusive: bool = True) -> str:
    parts = []
    if min is not None:
        parts.append(f"{'>=' if min_inclusive else '>'} {min}")
    if max is not None:
        parts.append(f"{'<=' if max_inclusive else '<'} {max}")
    return " and ".join(parts)


def _fail(name: str, what: str, value: Any) -> ValueError:
    return ValueError(f"{name} must be {what}; got {_shown(value)}")


def check_int(value: Any, name: str, *, min: int | None = None, max: int | None = None) -> int:
    """Return ``value`` as a python ``int`` after checking it is an integer in ``[min, max]``.

    Python and numpy integers are accepted; ``bool``, floats (``99.9`` and ``99.0`` alike) and strings are not.
    """
    bounds = _bounds(min, max)
    what = "an integer" + (f" {bounds}" if bounds else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Integral, np.integer)):
        raise _fail(name, what, value)
    value = int(value)
    if (min is not None and value < min) or (max is not None and value > max):
        raise _fail(name, what, value)
    return value


def check_float(
    value: Any,
    name: str,
    *,
    min: float | None = None,
    max: float | None = None,
    finite: bool = True,
    min_inclusive: bool = True,
    max_inclusive: bool = True,
) -> float:
    """Return ``value`` as a python ``float`` after checking it is a real number within the bounds.

    Python and numpy ints and floats are accepted; ``bool`` and strings are not. With ``finite=True`` (the
    default) NaN and infinities are refused. The bounds are inclusive unless ``min_inclusive`` /
    ``max_inclusive`` is False.
    """
    bounds = _bounds(min, max, min_inclusive, max_inclusive)
    what = ("a finite number" if finite else "a number") + (f" {bounds}" if bounds else "")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.integer, np.floating)):
        raise _fail(name, what, value)
    result = float(value)
    if math.isnan(result):
        if finite:
            raise _fail(name, what, value)
        return result
    if finite and not math.isfinite(result):
        raise _fail(name, what, value)
    if min is not None and (result < min or (not min_inclusive and result == min)):
        raise _fail(name, what, value)
    if max is not None and (result > max or (not max_inclusive and result == max)):
        raise _fail(name, what, value)
    return result


def check_probability(value: Any, name: str) -> float:
    """Return ``value`` as a python ``float`` after checking it lies in ``[0, 1]``."""
    return check_float(value, name, min=0.0, max=1.0)


def check_choice(value: Any, name: str, choices: Iterable[Any]) -> Any:
    """Return ``value`` unchanged after checking it is one of ``choices``."""
    options = list(choices)
    try:
        known = value in options
    except (TypeError, ValueError):  # e.g. an array, whose comparison has no single truth value
        known = False
    if not known or isinstance(value, bool) and not any(option is value for option in options):
        listed = ", ".join(_shown(option) for option in options)
        raise _fail(name, f"one of {listed}", value)
    return value


def check_blocks(value: Any, name: str = "blocks", n_blocks: int | None = None) -> list[int]:
    """Return the block indices in ``value`` as a sorted list of python ``int``: a list, tuple,
    set or array (not a string) of integers (:func:`check_int`: no bools, no floats such as
    ``1.7``), each named once, each ``>= 0`` and, with ``n_blocks``, below it (``IndexError``
    otherwise, naming the model's blocks). An empty list is allowed (no block)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise _fail(name, "a list of block indices", value)
    blocks = [check_int(b, f"a block index of {name}") for b in value]
    twice = sorted({b for b in blocks if blocks.count(b) > 1})
    if twice:
        raise ValueError(f"{name} names block{'s' if len(twice) > 1 else ''} {', '.join(map(str, twice))} twice; "
                         f"name each block once")
    outside = sorted(b for b in blocks if b < 0 or n_blocks is not None and b >= n_blocks)
    if outside:
        have = f"the model has blocks 0..{n_blocks - 1}" if n_blocks is not None else "blocks are numbered from 0"
        raise IndexError(f"block index {outside} out of range: {have}")
    return sorted(blocks)


def model_identity(name: str) -> str:
    """What a model name refers to, so two spellings of one model compare equal: the resolved
    path (``realpath``: ``m``, ``m/``, ``./m`` and a link to it alike) of a local file or folder,
    else the exact name (an alias or a hub id)."""
    path = os.path.expanduser(name)
    return os.path.realpath(path) if os.path.exists(path) else name


def duplicate_models(names: Iterable[str]) -> tuple[str, str, str] | None:
    """The first two spellings in ``names`` that name one model (:func:`model_identity`), with
    what they resolve to; ``None`` when every model is listed once."""
    seen: dict[str, str] = {}
    for name in names:
        identity = model_identity(name)
        if identity in seen:
            return seen[identity], name, identity
        seen[identity] = name
    return None


def duplicate_text(name: str, found: tuple[str, str, str]) -> str:
    """The words of a duplicate (:func:`duplicate_models`): ``models lists one model twice: 'm'
    and 'm/' (both /data/m); list it once``."""
    first, second, identity = found
    if first == second:
        return f"{name} lists {first!r} twice; list each model once"
    resolved = f" (both {identity})" if identity not in (first, second) else ""
    return f"{name} lists one model twice: {first!r} and {second!r}{resolved}; list each model once"


class DuplicateModelError(ValueError):
    """A list of models names one model twice (the message names both spellings)."""


def check_models(value: Any, name: str = "models") -> list[str]:
    """Return ``value`` as a list of model names: one string is one model, a list or tuple of
    non-empty strings is kept in order; an empty list or anything else is refused, and so is a
    model listed twice, under one spelling or two (:func:`duplicate_models`:
    ``DuplicateModelError``)."""
    items = [value] if isinstance(value, str) else value
    if isinstance(items, (list, tuple)) and items and all(isinstance(m, str) and m.strip() for m in items):
        names = [str(m) for m in items]
        found = duplicate_models(names)
        if found:
            raise DuplicateModelError(duplicate_text(name, found))
        return names
    raise _fail(name, "a model or a non-empty list of models (aliases, directories, .gguf files or hub ids)",
                value)
