"""zones: spectral shape of transformer weights, layer importance and zone-aware depth pruning.

The Python API, one function per subcommand, each returning the table the command writes
(``zones.api``)::

    from zones import load_model, alpha_table, ablate, prune, heal, export, evaluate, study

Each is imported on first use (module ``__getattr__``), so ``import zones`` stays cheap.
``zones.evaluate`` and ``zones.study`` are also the modules of those subcommands: calling either
module calls the function (:func:`callable_module`), so the name means one thing however it was
imported.
"""
import importlib
import sys
import types

from zones.core.version import __version__

API = ("load_model", "alpha_table", "ablate", "prune", "heal", "export", "evaluate", "study")
MODULES = ("evaluate", "study")  # subcommands whose module is the name: the module is callable
__all__ = ["__version__", *API]


class _CallableModule(types.ModuleType):
    """A subcommand's module that, called, calls the Python API's function of the same name."""

    def _function(self):
        return getattr(importlib.import_module("zones.api"), self.__name__.rpartition(".")[2])

    def __call__(self, *args, **kwargs):
        return self._function()(*args, **kwargs)

    @property
    def __signature__(self):  # inspect.signature(zones.study) is the function's
        import inspect

        return inspect.signature(self._function())


def callable_module(name: str) -> None:
    """Make module ``name`` (``zones.study``, ``zones.evaluate``) callable: ``zones.study(...)`` is
    ``zones.api.study(...)``, and ``zones.study.plan`` is still the module's."""
    sys.modules[name].__class__ = _CallableModule


def __getattr__(name: str):
    """``zones.ablate`` and the rest of the API, imported on first use."""
    if name in MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in API:
        value = getattr(importlib.import_module(f"{__name__}.api"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(API))
