"""Altair figures for the book's chapters, and a renderer that works without a network.

Altair's default HTML output loads Vega from a CDN. ``setup()`` switches to a renderer that
calls ``vegaEmbed`` from a copy of Vega bundled locally (by ``vl-convert``): in the built book
the bundle is a static file every page loads; in JupyterLab ``setup()`` displays it once.
"""
from __future__ import annotations

import json
import os
import uuid
from functools import lru_cache
from pathlib import Path

import altair as alt

BOOK_MODE_ENV = "ZONES_BOOK_BUILD"  # set by `zones book`: the page loads the bundle itself
BUNDLE_NAME = "vega-bundle.js"


def vega_lite_version() -> str:
    """Major.minor of the Vega-Lite schema this Altair writes, e.g. ``6.4``."""
    return alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0]


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed in one script that defines ``window.vegaEmbed``.

    Wrapped in a function so its top-level names do not collide with the page's own
    (Sphinx defines ``const _``).
    """
    import vl_convert

    return "(function(){\n" + vl_convert.javascript_bundle(vl_version=vega_lite_version()) + "\n})();\n"


def write_vega_bundle(static_dir: Path) -> Path:
    path = Path(static_dir) / BUNDLE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    text = vega_bundle()
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    return path


def _offline_renderer(spec: dict, **_options) -> dict:
    div = f"zones-chart-{uuid.uuid4().hex[:12]}"
    html = (f'<div id="{div}" class="zones-chart"></div>\n'
            f"<script>vegaEmbed('#{div}', {json.dumps(spec)}, {{actions: false}})"
            f".catch(function(e) {{ document.getElementById('{div}').innerText = 'chart error: ' + e; }});</script>")
    return {"text/html": html}


def setup() -> None:
    """Render Altair charts offline; call once at the top of a notebook."""
    alt.renderers.register("zones", _offline_renderer)
    alt.renderers.enable("zones")
    alt.data_transformers.disable_max_rows()
    if os.environ.get(BOOK_MODE_ENV) != "1":
        from IPython.display import HTML, display

        display(HTML(f"<script>{vega_bundle()}</script>"))
