"""Altair figures for the book's chapters, and a renderer that works without a network.

Altair's default HTML output loads Vega from a CDN. ``setup()`` switches to a renderer that
calls ``vegaEmbed`` from a copy of Vega bundled locally (by ``vl-convert``): in the built book
the bundle is a static file every page loads; in JupyterLab ``setup()`` displays it once.

Every chart fits the book's article column: a single or layered chart takes the column's
width (``fit``, Altair's ``width="container"``); panels of a faceted or concatenated chart
wrap into rows (``wrap``, ``panel_width``) instead of running off the right edge. A chart with
panels has two layouts in the page: the one it was built with, for a laptop, and its phone
layout (``narrow_spec``: panels one under the other, each as wide as a phone's column, legends
underneath), which the page draws when the chart's box is narrower than ``NARROW_BELOW``.
Both share one copy of the data.
"""
from __future__ import annotations

import json
import os
import textwrap
import uuid
from functools import lru_cache
from pathlib import Path

import altair as alt
import vl_convert
from IPython.display import HTML, display

from zones.core.atomic import atomic_write_text
from zones.core.progress import BOOK_MODE_ENV  # noqa: F401  (set by `zones book`: the page loads the bundle itself)

COLUMN_WIDTH = 660  # px: the book's article column at a desktop width, less the y axis and legend
BUNDLE_NAME = "vega-bundle.js"
# Large numbers on a quantitative axis in SI form ("1k", "10M", "10G"), never "10,000,000,000";
# below 1000 as plain numbers ("0.1", "20"), never "100m". Pass as ``axis=SI_AXIS`` (a log axis of
# ΔPPL can span ten decades), or ``alt.Axis(labelExpr=SI_LABELS, ...)``.
SI_LABELS = "abs(datum.value) >= 1000 ? format(datum.value, '~s') : format(datum.value, '~g')"
SI_AXIS = alt.Axis(labelExpr=SI_LABELS)


# The legend of a dash channel: each entry a short line in its dash (the channel on a line mark
# without points, so Vega-Lite draws the symbol as a stroke, not as one black dot for every dash).
DASH_LEGEND = alt.Legend(symbolType="stroke", symbolStrokeWidth=2, symbolSize=400, symbolStrokeColor="#424242")


def vega_lite_version() -> str:
    """Major.minor of the Vega-Lite schema this Altair writes, e.g. ``6.4``."""
    return alt.SCHEMA_VERSION.lstrip("v").rsplit(".", 1)[0]


@lru_cache(maxsize=1)
def vega_bundle() -> str:
    """Vega, Vega-Lite and Vega-Embed in one script that defines ``window.vegaEmbed``.

    Wrapped in a function so its top-level names do not collide with the page's own
    (Sphinx defines ``const _``).
    """
    return "(function(){\n" + vl_convert.javascript_bundle(vl_version=vega_lite_version()) + "\n})();\n"


def write_vega_bundle(static_dir: Path) -> Path:
    path = Path(static_dir) / BUNDLE_NAME
    text = vega_bundle()
    if not path.exists() or path.read_text() != text:
        atomic_write_text(path, text)
    return path


def fit(chart, height: int | None = None):
    """A single or layered chart that takes the width of the column it is drawn in."""
    return chart.properties(width="container", **({"height": height} if height else {}))


def panel_width(columns: int, legend: bool = True) -> int:
    """Width of one of ``columns`` panels side by side, so that the row fits the column."""
    spare = 150 if legend else 40  # the legend, the shared y axis and the gaps
    return max(120, (COLUMN_WIDTH - spare) // max(1, columns) - 20)


def balanced_columns(panels: int, most: int = 3) -> int:
    """Panels to a row (2 … ``most``) that leave the fewest empty places in the grid's last row,
    the widest such: 3 panels in one row of 3, 4 in two rows of 2."""
    if panels <= most:
        return max(1, panels)
    return min(range(2, most + 1), key=lambda c: (-panels % c, -c))


def stack(charts, **kwargs) -> alt.VConcatChart:
    """Charts one above the other as ONE figure; a chart sized to the container gets the
    column's width (a concatenated view cannot take the container's)."""
    def sized(chart):
        return chart.properties(width=COLUMN_WIDTH - 120) if chart.to_dict().get("width") == "container" else chart
    return alt.vconcat(*[sized(c) for c in charts], **kwargs)


def wrap(panels, columns: int = 2, **kwargs) -> alt.ConcatChart:
    """Panels in rows of at most ``columns`` (one row when there are fewer)."""
    panels = list(panels)
    return alt.concat(*panels, columns=min(columns, len(panels)), **kwargs)


TITLE_CHARS = 40  # a title line at most this long fits a chart at a phone's width
NARROW_BELOW = 560  # px: a chart whose box is narrower than this draws its phone layout
NARROW_WIDTH = 310  # px: a phone's article column (a 390 px screen), less the chart's own padding
NARROW_AXIS = 70    # px: the y axis and its title beside a panel
NARROW_TITLE_CHARS = 32


def wrap_titles(spec, chars: int = TITLE_CHARS):
    """The spec with every title longer than ``chars`` characters split into lines (Vega
    draws a title on one line, past the chart's edge when the chart is narrow)."""
    def lines(text):
        return textwrap.wrap(text, chars) if isinstance(text, str) and len(text) > chars else text

    if isinstance(spec, list):
        return [wrap_titles(item, chars) for item in spec]
    if not isinstance(spec, dict):
        return spec
    out = {}
    for key, value in spec.items():
        if key == "title" and isinstance(value, str):
            out[key] = lines(value)
        elif key == "title" and isinstance(value, dict) and "text" in value:
            out[key] = dict(value, text=lines(value["text"]))
        elif key in ("datasets", "data"):
            out[key] = value
        else:
            out[key] = wrap_titles(value, chars)
    return out


def phone_layout(chart, columns: int = 1, panel_width: int | None = None):
    """``chart`` with ``columns`` panels to a row in its phone layout (default 1: small panels
    such as heatmaps may stay two abreast) and each panel ``panel_width`` px wide (default: as
    wide as a phone's column allows; less when long axis labels need room)."""
    meta = {"phone_columns": int(columns)}
    if panel_width:
        meta["phone_panel"] = int(panel_width)
    return chart.properties(usermeta={"zones": meta})


WIDE_ONLY = "zones_wide_only"


def wide_only(chart, name: str):
    """``chart`` (a layer of a layered chart) drawn in the laptop layout only: its phone layout
    leaves it out (labels that would pile on each other at a phone's width; the tooltip, on a
    tap, still gives their values). ``name``: unique within the figure."""
    return chart.properties(name=f"{WIDE_ONLY}_{name}")


def _is_wide_only(node) -> bool:
    return isinstance(node, dict) and str(node.get("name", "")).startswith(WIDE_ONLY)


def narrow_spec(spec: dict) -> dict | None:
    """The phone layout of a Vega-Lite ``spec``, or None when the chart needs none (a single
    view that takes the container's width and has no legend).

    Panels side by side (``hconcat``) go one under the other, wrapped panels (``concat`` or
    ``facet`` with ``columns``) to ``phone_columns`` a row (``usermeta``, see
    :func:`phone_layout`; default 1), every panel as wide as a phone's column allows (or
    ``phone_panel``), legends under the chart (beside it they squeeze a phone's plot), the layers
    :func:`wide_only` marks left out and titles wrapped shorter. The data are not
    copied (``datasets`` is left out).
    """
    meta = (spec.get("usermeta") or {}).get("zones") or {}
    columns = int(meta.get("phone_columns", 1))
    panel = int(meta.get("phone_panel") or max(80, (NARROW_WIDTH - NARROW_AXIS) // columns - (10 if columns > 1 else 0)))
    changed = False

    def walk(node):
        nonlocal changed
        if isinstance(node, list):
            return [walk(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key in ("datasets", "data", "encoding", "transform", "params", "usermeta", "mark", "config"):
                out[key] = value  # what is drawn and how marks look, never how panels are laid out
            elif key == "layer" and any(_is_wide_only(item) for item in value):
                out[key], changed = walk([item for item in value if not _is_wide_only(item)]), True
            elif key == "hconcat":
                out["vconcat"], changed = walk(value), True
            elif key == "columns" and ("concat" in node or "facet" in node) and value != columns:
                out[key], changed = columns, True
            elif key == "width" and isinstance(value, (int, float)) and value != panel:
                out[key], changed = panel, True   # one panel to a row: as wide as the column
            else:
                out[key] = walk(value)
        return out

    narrow = walk({k: v for k, v in spec.items() if k != "datasets"})
    if not changed and not _has_legend(spec):
        return None
    config = dict(narrow.get("config") or {})
    # legends under the chart, one under the other (side by side, the second runs past a phone's
    # edge and its labels are cut: "sublayer" read "sub")
    config["legend"] = {**(config.get("legend") or {}), "orient": "bottom", "columns": 2, "labelLimit": 130,
                        "layout": {"bottom": {"anchor": "start", "direction": "vertical", "margin": 6}}}
    narrow["config"] = config
    return wrap_titles(narrow, NARROW_TITLE_CHARS)


LEGEND_CHANNELS = ("color", "fill", "stroke", "shape", "size", "opacity", "fillOpacity", "strokeDash")


def _has_legend(spec) -> bool:
    """Whether ``spec`` draws a legend (a field on a legend channel whose legend is not off):
    beside a chart on a phone it would squeeze the plot, so the phone layout puts it below."""
    if isinstance(spec, list):
        return any(_has_legend(item) for item in spec)
    if not isinstance(spec, dict):
        return False
    encoding = spec.get("encoding") or {}
    for channel in LEGEND_CHANNELS:
        definition = encoding.get(channel)
        if isinstance(definition, dict) and "field" in definition and definition.get("legend", {}) is not None:
            return True
    return any(_has_legend(value) for key, value in spec.items() if key not in ("datasets", "data", "encoding"))


def _js(value) -> str:
    """``value`` as a JavaScript literal that is safe inside ``<script>`` (no ``</`` in it)."""
    return json.dumps(value).replace("</", "<\\/")


def _offline_renderer(spec: dict, **_options) -> dict:
    div = f"zones-chart-{uuid.uuid4().hex[:12]}"
    narrow = narrow_spec(spec)
    wide = wrap_titles(spec)
    fail = f"function (e) {{ document.getElementById('{div}').innerText = 'chart error: ' + e; }}"
    if narrow is None:
        script = f"vegaEmbed('#{div}', {_js(wide)}, {{actions: false}}).catch({fail});"
    else:
        # one copy of the data for both layouts; the layout follows the box's width
        datasets = wide.pop("datasets", {})
        script = ("(function () {\n"
                  f"  var box = document.getElementById('{div}'), data = {_js(datasets)};\n"
                  f"  var wide = {_js(wide)};\n"
                  f"  var narrow = {_js(narrow)};\n"
                  "  wide.datasets = data; narrow.datasets = data;\n"
                  "  var shown = null, timer = null;\n"
                  "  function draw() {\n"
                  f"    var spec = box.getBoundingClientRect().width < {NARROW_BELOW} ? narrow : wide;\n"
                  "    if (spec === shown) return;\n"
                  "    shown = spec;\n"
                  f"    vegaEmbed('#{div}', spec, {{actions: false}}).catch({fail});\n"
                  "  }\n"
                  "  draw();\n"
                  "  window.addEventListener('resize', function () { clearTimeout(timer); timer = setTimeout(draw, 150); });\n"
                  "})();")
    html = f'<div id="{div}" class="zones-chart"></div>\n<script>{script}</script>'
    return {"text/html": html}


def setup() -> None:
    """Render Altair charts offline; call once at the top of a notebook."""
    alt.renderers.register("zones", _offline_renderer)
    alt.renderers.enable("zones")
    alt.data_transformers.disable_max_rows()
    if os.environ.get(BOOK_MODE_ENV) != "1":
        display(HTML(f"<script>{vega_bundle()}</script>"))


# --- what a reader would see wrong: Vega-Lite's warnings and legends that tell series apart by nothing

MIN_FONT = 10  # px: no text of a chart smaller (a phone shows 7–8 px as a smudge)


def sized(spec: dict, px: int = COLUMN_WIDTH - 120) -> dict:
    """``spec`` with a container's width replaced by ``px`` pixels (drawn outside a page)."""
    return json.loads(json.dumps(spec).replace('"width": "container"', f'"width": {int(px)}'))


def _compiled(spec: dict, px: int = COLUMN_WIDTH - 120) -> tuple[dict, list[str]]:
    """``spec`` compiled to Vega by the bundled Vega-Lite (a container ``px`` pixels wide), and the
    warnings it printed (vl-convert writes them to the process' standard error: caught there)."""
    import tempfile

    spec = sized(spec, px)
    with tempfile.TemporaryFile(mode="w+b") as caught:
        saved = os.dup(2)
        os.dup2(caught.fileno(), 2)
        try:
            vega = vl_convert.vegalite_to_vega(spec, vl_version=vega_lite_version(), show_warnings=True)
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        caught.seek(0)
        text = caught.read().decode("utf-8", "replace")
    return vega, [line.strip() for line in text.splitlines() if line.strip()]


def _walk(node):
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _legend_problems(vega: dict) -> list[str]:
    """A legend of a dash channel whose symbols cannot show the dash (a dot, or a stroke drawn
    transparent): its entries would look alike though the lines differ."""
    problems = []
    for node in _walk(vega):
        for legend in node.get("legends") or []:
            if "strokeDash" not in legend:
                continue
            symbols = ((legend.get("encode") or {}).get("symbols") or {}).get("update") or {}
            stroke = (symbols.get("stroke") or {}).get("value")
            if legend.get("symbolType") != "stroke" or stroke == "transparent":
                problems.append(f"legend {legend.get('title')!r} tells dash styles apart by "
                                f"{legend.get('symbolType', 'circle')} symbols that all look alike")
    return problems


def _font_problems(spec: dict) -> list[str]:
    """Text marks, axis and legend labels smaller than :data:`MIN_FONT` px."""
    problems = []
    for node in _walk(spec):
        for key in ("fontSize", "labelFontSize", "titleFontSize"):
            size = node.get(key)
            if isinstance(size, (int, float)) and size < MIN_FONT:
                problems.append(f"{key} {size} px (at least {MIN_FONT})")
    return problems


def spec_problems(spec: dict) -> list[str]:
    """What is wrong with a chart as a reader sees it, in both its layouts (wide and phone):
    every warning Vega-Lite prints when compiling it ("Conflicting scale range": one colour
    scale given two ranges, so series get another's colour), every legend whose symbols cannot
    show the dash styles they stand for, and text under :data:`MIN_FONT` px. Empty: nothing."""
    problems = []
    for layout, view, px in (("wide", wrap_titles(spec), COLUMN_WIDTH - 120),
                             ("phone", narrow_spec(spec), NARROW_WIDTH)):
        if view is None:
            continue
        view = dict(view, datasets=spec.get("datasets", {})) if "datasets" in spec else view
        vega, warnings = _compiled(view, px)
        problems += [f"{layout}: {w}" for w in warnings]
        problems += [f"{layout}: {p}" for p in _legend_problems(vega) + _font_problems(view)]
    return list(dict.fromkeys(problems))
