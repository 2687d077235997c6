"""What every page of the book loads: a small Sphinx extension (``_config.yml`` lists it).

- Each script and stylesheet once. A script registered twice (Jupyter Book's ``sphinx_thebe``
  adds its inline configuration once per read of the sources) declares its ``const`` names
  twice, which is a JavaScript error on every page.
- No thebe. The book runs no kernel, and thebe's configuration names a CDN and a binder
  repository: its scripts and its per-page configuration are left out of the pages.

Everything else a page loads ships in ``book/_static`` (``zones.book.build.write_static_assets``).
"""
from __future__ import annotations

from typing import Any

from docutils import nodes

THEBE_MARKERS = ("THEBE_JS_URL", "text/x-thebe-config", "kernelName =")


def _asset_key(asset: Any) -> tuple:
    """What makes two entries of a page's ``script_files``/``css_files`` the same asset."""
    filename = getattr(asset, "filename", asset)
    attributes = getattr(asset, "attributes", {}) or {}
    return str(filename), tuple(sorted((str(k), str(v)) for k, v in attributes.items()))


def _is_thebe(asset: Any) -> bool:
    filename = str(getattr(asset, "filename", asset) or "")
    body = str((getattr(asset, "attributes", {}) or {}).get("body", ""))
    return "thebe" in filename or any(marker in body for marker in THEBE_MARKERS)


def unique_assets(assets: list) -> list:
    """``assets`` in order, each once, without thebe's."""
    seen, kept = set(), []
    for asset in assets:
        key = _asset_key(asset)
        if key in seen or _is_thebe(asset):
            continue
        seen.add(key)
        kept.append(asset)
    return kept


def clean_page_assets(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """``html-page-context``: every script and stylesheet of the page once, no thebe."""
    for key in ("script_files", "css_files"):
        if key in context:
            context[key] = unique_assets(list(context[key]))


def drop_thebe_config(app, doctree, docname: str) -> None:
    """``doctree-resolved`` (after sphinx_thebe's own handler): remove the thebe configuration
    it appends to every page."""
    for node in list(doctree.findall(nodes.raw)):
        if any(marker in node.astext() for marker in THEBE_MARKERS):
            node.parent.remove(node)


def setup(app) -> dict:
    app.connect("html-page-context", clean_page_assets, priority=900)
    app.connect("doctree-resolved", drop_thebe_config, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
