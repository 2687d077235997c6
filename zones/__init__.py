"""zones: spectral shape of transformer weights, layer importance and zone-aware depth pruning.

The Python API, one function per subcommand, each returning the table the command writes
(``zones.api``)::

    from zones import load_model, alpha_table, ablate, prune, heal, export, evaluate, study

Each is imported on first use (module ``__getattr__``), so ``import zones`` stays cheap. The
subcommands' own modules have names of their own (``zones.evaluation``, ``zones.studies``), so
``zones.evaluate`` and ``zones.study`` are the functions, whatever was imported before.
"""
import importlib

from zones.core.version import __version__

API = ("load_model", "alpha_table", "ablate", "prune", "heal", "export", "evaluate", "study")
__all__ = ["__version__", *API]


def __getattr__(name: str):
    """``zones.ablate`` and the rest of the API, imported on first use."""
    if name in API:
        value = getattr(importlib.import_module(f"{__name__}.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(API))
