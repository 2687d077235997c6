"""The installed zones' version (``zones --version``, an exported model's provenance)."""
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("zones")  # the installed package's metadata (pyproject.toml's version)
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
