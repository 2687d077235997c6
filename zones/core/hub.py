"""Is the model hub reachable? One quick answer before any hub look-up.

On a machine without a network, ``transformers`` and ``datasets`` retry for 26-28 s before
they fail. ``hub_lookup`` asks first (the offline variables, then a sub-second connection
probe of the hub's endpoint, memoised per process); when the hub is unreachable the look-up
runs on the local caches only, and a miss there becomes one ``HubUnreachableError`` line that
names what was looked up and what to use instead.
"""
from __future__ import annotations

import os
import socket
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator
from urllib.parse import urlparse

from huggingface_hub import constants

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
PROBE_SECONDS = 0.8


class HubUnreachableError(RuntimeError):
    """A hub look-up on a machine that cannot reach the hub, with nothing in the local cache."""


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _endpoint() -> tuple[str, int]:
    """(host, port) a hub request would connect to first: the HTTPS proxy if one is set."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    if proxy:
        url = urlparse(proxy if "://" in proxy else f"http://{proxy}")
        return url.hostname or "", url.port or 80
    endpoint = os.environ.get("HF_ENDPOINT")
    if not endpoint:
        endpoint = constants.ENDPOINT
    url = urlparse(endpoint)
    return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)


@lru_cache(maxsize=None)
def _probe(host: str, port: int) -> str | None:
    """None if a TCP connection to host:port opens within PROBE_SECONDS, else why not."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(f"cannot connect to {host}:{port}: {err.strerror or err}")

    # A thread bounds the name look-up too, which create_connection's timeout does not.
    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS + 0.2)
    return outcome[0] if outcome else f"no answer from {host}:{port} within {PROBE_SECONDS} s"


def offline_reason() -> str | None:
    """Why the hub cannot be reached now (an offline variable, a failed probe), or None."""
    for name in OFFLINE_VARIABLES:
        if _truthy(os.environ.get(name)):
            return f"{name} is set"
    return _probe(*_endpoint())


@contextmanager
def _local_caches_only() -> Iterator[None]:
    """Make huggingface_hub and datasets read only their local caches inside the ``with``."""
    patched = [(module, "HF_HUB_OFFLINE") for module in
               (sys.modules.get("huggingface_hub.constants"), sys.modules.get("datasets.config"))
               if module is not None and hasattr(module, "HF_HUB_OFFLINE")]
    saved = [getattr(module, attr) for module, attr in patched]
    saved_env = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    for module, attr in patched:
        setattr(module, attr, True)
    try:
        yield
    finally:
        for (module, attr), value in zip(patched, saved):
            setattr(module, attr, value)
        if saved_env is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved_env


@contextmanager
def hub_lookup(what: str, remedy: str) -> Iterator[bool]:
    """Run a hub look-up of ``what``; yields ``offline`` (pass it on as ``local_files_only``).

    Online, the body runs as usual. Offline, it runs on the local caches only, and an
    ``OSError`` from it (nothing cached) becomes one line: what, why, and ``remedy``.
    """
    reason = offline_reason()
    if reason is None:
        yield False
        return
    with _local_caches_only():
        try:
            yield True
        except OSError as err:
            raise HubUnreachableError(
                f"{what}: the hub is unreachable ({reason}) and it is not in the local cache; {remedy}"
            ) from err
