"""The book's pages: numbered tables from code cells, charts laid out for a phone, the
depth series in the paper's figure form, error bars inside their axes, and what a page loads."""
from __future__ import annotations

import json
import re
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import pytest
import yaml

from zones import figures
from zones.report.format import display_table, list_table, md_escape

ROOT = Path(__file__).resolve().parents[1]


def parse_myst(text: str):
    """``text`` parsed as the book parses a Markdown output (MyST, colon fences, dollar math)."""
    from docutils.core import publish_doctree
    from myst_parser.parsers.docutils_ import Parser

    return publish_doctree(text, parser=Parser(), settings_overrides={
        "myst_enable_extensions": ["colon_fence", "dollarmath"], "report_level": 2, "halt_level": 2})


def table_node(doctree):
    from docutils import nodes

    tables = list(doctree.findall(nodes.table))
    assert len(tables) == 1, doctree.pformat()
    return tables[0]


def rows_of(table) -> list[list[str]]:
    """The text a reader sees in each cell (raw HTML such as ``<wbr>`` left out)."""
    from docutils import nodes

    def text(entry):
        return "".join(t.astext() for t in entry.findall(nodes.Text) if not isinstance(t.parent, nodes.raw)).strip()
    return [[text(entry) for entry in row.findall(nodes.entry)] for row in table.findall(nodes.row)]


def test_a_display_table_is_a_real_table_with_its_caption_and_name():
    from docutils import nodes

    table = pd.DataFrame({"model": ["smollm2-135m", "*bold*"], "alpha_shape": [0.123456, 2.5e7],
                          "note": ["$x$ {role}`y` 1. [a](b) <b>", ""]})
    shown = display_table(table, caption="ρ of each $model$ with `code` and *stars*", name="tbl-example")
    text = shown._repr_markdown_()
    node = table_node(parse_myst(text))
    assert node["ids"] == ["tbl-example"] and "zones-table" in node["classes"]
    title = next(node.findall(nodes.title))
    assert title.astext() == "ρ of each $model$ with `code` and *stars*"   # every character as written
    assert rows_of(node) == [["model", "alpha_shape", "note"],
                             ["smollm2-135m", "0.123", "$x$ {role}`y` 1. [a](b) <b>"],
                             ["*bold*", "2.50 × 10⁷", ""]]
    assert "<table" in shown._repr_html_() and "0.123" in shown._repr_html_()   # JupyterLab gets HTML


def test_row_labels_are_stub_columns_and_a_captioned_table_always_gets_a_name():
    from docutils import nodes

    table = pd.DataFrame([["0.19 [0.12, 0.27]", "1.2 [0.9, 1.5]"], ["n/a", "3"]],
                         index=pd.Index(["zone_aware", "last_n"], name="strategy"), columns=["k = 1", "k = 2"])
    node = table_node(parse_myst(display_table(table, index=True, caption="Δloss").markdown()))
    assert rows_of(node) == [["strategy", "k = 1", "k = 2"], ["zone_aware", "0.19 [0.12, 0.27]", "1.2 [0.9, 1.5]"],
                             ["last_n", "n/a", "3"]]
    assert node["ids"] and node["ids"][0].startswith("table-")   # numbered even without a name
    group = next(node.findall(nodes.tgroup))
    assert [spec.get("stub", False) for spec in group.findall(nodes.colspec)] == [True, False, False]
    with pytest.raises(ValueError, match="table name"):
        display_table(table, caption="x", name="no spaces please").markdown()
    assert "zone\\_<wbr>aware" in md_escape("zone_aware")   # a long name may wrap at its underscores
    assert md_escape("0:attn,1:attn, 1,009 [1,350, 2,767]") == ("0\\:attn\\,<wbr>1\\:attn\\, 1\\,009 "
                                                              "\\[1\\,350\\, 2\\,767\\]")   # never inside a number


def test_a_colon_run_in_a_cell_cannot_close_the_table():
    text = list_table([["a"]], [[md_escape("::: b ::::")]], caption="c ::: d", name="t")
    assert text.startswith(":::{list-table}") and text.count("\n:::\n") == 1
    assert rows_of(table_node(parse_myst(text))) == [["a"], ["::: b ::::"]]
    assert list_table([["a"]], [[":::: raw"]]).startswith(":::::{list-table}")   # a longer fence than any run


def test_the_scorecard_is_a_numbered_table_whose_rows_become_cards():
    from docutils import nodes

    from zones.report.claims import SCORECARD_NAME, scorecard_html

    scores = pd.DataFrame([dict(claim="ρ(α, ΔLoss) > 0", paper="0.69–0.84", verdict="holds", reason="",
                                ours="0.81", interval="[0.72, 0.90]", model="smollm2-135m", corpus="stdlib"),
                           dict(claim="first blocks matter most", paper="–", verdict="inconclusive",
                                reason="blocks: 6 are too few", ours="0.2", interval="–", model="a/b_c", corpus="–")])
    card = scorecard_html(scores)
    node = table_node(parse_myst(card._repr_markdown_()))
    assert node["ids"] == [SCORECARD_NAME] and {"zones-cards", "zones-claims"} <= set(node["classes"])
    rows = rows_of(node)
    assert rows[0] == ["claim", "verdict", "ours", "model"] and len(rows) == 3
    assert rows[1][0] == "ρ(α, ΔLoss) > 0" and rows[2][3] == "a/b_c"   # one line a row ...
    assert rows[1][2].startswith("0.81; 95%: [0.72, 0.90]") and rows[2][2].startswith("0.2")
    assert "details" in rows[1][2] and "paper: 0.69–0.84" in rows[1][2]   # ... the rest collapsed beneath it
    assert "blocks: 6 are too few" in rows[2][2]
    badges = [raw.astext() for raw in node.findall(nodes.raw) if "zones-badge" in raw.astext()]
    assert badges == ['<span class="zones-badge zones-badge-holds">', '<span class="zones-badge zones-badge-open">']
    assert not next(node.findall(nodes.title)).astext().startswith("Table")
    assert 'data-label="verdict"' in card._repr_html_()


def test_book_tables_are_numbered_by_sphinx_and_cited_by_name():
    """No caption types its own number; every table a chapter cites is named by one of them."""
    text = "\n".join(p.read_text() for p in (ROOT / "notebooks").glob("*.md"))
    assert not re.findall(r"caption=f?\"Table \d", text)
    config = (ROOT / "_config.yml").read_text()
    assert '["*", "text/markdown", 25]' in config   # the book takes a table's Markdown, not its HTML
    cited = set(re.findall(r"\{numref\}`(?:[^`<]*<)?(tbl-[\w-]+)>?`", text))
    named = set(re.findall(r"name=\"(tbl-[\w-]+)\"", text)) | {"tbl-claims-scorecard"}
    assert cited and cited <= named, f"cited but never named: {sorted(cited - named)}"


def test_the_book_shows_its_table_markdown_not_its_html():
    from myst_nb.core.render import get_mime_priority

    overrides = [("*", "text/markdown", 25)]
    order = get_mime_priority("html", overrides)
    assert order.index("text/markdown") < order.index("text/html")


# --- charts on a phone ---------------------------------------------------------------------


def _panels(columns=3):
    df = pd.DataFrame({"x": [1, 2, 3], "y": [2, 3, 4], "g": ["a", "b", "c"]})
    return df, alt.Chart(df).mark_point().encode(x="x:Q", y="y:Q")


def test_a_chart_with_panels_stacks_them_on_a_phone():
    df, chart = _panels()
    side_by_side = alt.hconcat(chart.properties(width=300), chart.properties(width=300)).to_dict()
    narrow = figures.narrow_spec(side_by_side)
    assert "hconcat" not in narrow and len(narrow["vconcat"]) == 2
    assert all(panel["width"] <= figures.NARROW_WIDTH - figures.NARROW_AXIS for panel in narrow["vconcat"])
    assert narrow["config"]["legend"]["orient"] == "bottom" and "datasets" not in narrow
    faceted = chart.properties(width=200).facet(facet="g:N", columns=3).to_dict()
    assert figures.narrow_spec(faceted)["columns"] == 1
    heatmaps = figures.phone_layout(chart.properties(width=150).facet(facet="g:N", columns=3), 2).to_dict()
    assert figures.narrow_spec(heatmaps)["columns"] == 2
    assert figures.narrow_spec(figures.fit(chart).to_dict()) is None   # a single chart already fits
    legend = figures.narrow_spec(figures.fit(chart.encode(color="g:N")).to_dict())   # ... but not its legend
    assert legend["config"]["legend"]["orient"] == "bottom" and legend["width"] == "container"
    thin_bars = alt.hconcat(alt.Chart(df).mark_bar(width=4).encode(x="x:Q", y="y:Q").properties(width=300))
    assert figures.narrow_spec(thin_bars.to_dict())["vconcat"][0]["mark"]["width"] == 4   # a mark keeps its size


def test_the_page_draws_the_layout_that_fits_its_box_with_one_copy_of_the_data():
    df, chart = _panels()
    spec = alt.hconcat(chart.properties(width=300), chart.properties(width=300)).to_dict()
    html = figures._offline_renderer(spec)["text/html"]
    assert html.count('"x": 3') == 1   # the data once, for both layouts
    assert f"< {figures.NARROW_BELOW} ? narrow : wide" in html and "addEventListener('resize'" in html
    single = figures._offline_renderer(figures.fit(chart).to_dict())["text/html"]
    assert "narrow" not in single and "vegaEmbed(" in single
    sneaky = figures._offline_renderer(alt.Chart(pd.DataFrame({"t": ["</script><b>"]})).mark_text().encode(
        text="t:N").to_dict())["text/html"]
    assert sneaky.count("</script>") == 1   # data cannot end the script early


def test_panels_to_a_row_leave_no_empty_place_when_they_can():
    assert [figures.balanced_columns(n) for n in (1, 2, 3, 4, 6, 9)] == [1, 2, 3, 2, 3, 3]
    from zones.figures.spectral_lifecycle import final_profiles, lifecycle_heatmap, wave_gradient_lines

    gradient = pd.DataFrame([dict(depth=d, group=g, step=s, gradient=0.1 * s)
                             for d in (8, 12) for g in ("Q/K", "V/O", "MLP") for s in (0, 10)])
    assert wave_gradient_lines(gradient).to_dict()["columns"] == 3   # three groups: one row, no empty fourth
    profile = gradient.rename(columns={"step": "layer", "gradient": "value"}).assign(relative_depth=0.5)
    assert final_profiles(profile).to_dict()["columns"] == 3
    grid = pd.DataFrame([dict(depth=d, group=g, step=s, layer=l, value=1.0)
                         for d in (8, 12) for g in ("Q/K", "V/O", "MLP") for s in (0, 10) for l in range(2)])
    heat = lifecycle_heatmap(grid, "t", "v").to_dict()
    assert heat["columns"] == 3 and figures.narrow_spec(heat)["columns"] == 1


# --- the depth series in the paper's form -------------------------------------------------


def _importance(seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for depth, seeds in ((8, (0, 1)), (12, (0,))):
        for s in seeds:
            for layer in range(depth):
                d = float(np.exp(rng.normal(-3, 1))) * (10 if layer == 0 else 1) * (-1 if layer == 3 else 1)
                rows.append(dict(model=f"D{depth}", depth=depth, seed=s, layer=layer, delta_loss=d,
                                 delta_loss_low=d - 0.5 * abs(d) - 0.001, delta_loss_high=d + abs(d) + 0.002,
                                 alpha=float(rng.normal(4, 1))))
    return pd.DataFrame(rows)


def _layers(spec: dict) -> list[dict]:
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("mark"), dict):
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
    walk(spec)
    return found


def test_importance_panels_label_each_block_and_mark_the_most_and_least_important():
    from zones.figures.depth_series import _marked, _plot_values, importance_by_depth

    importance = _importance()
    spec = importance_by_depth(importance, alpha_title="weighted α").to_dict()
    layers = _layers(spec)
    points = [l for l in layers if l["mark"]["type"] == "point"]
    texts = [l for l in layers if l["mark"]["type"] == "text"]
    assert len(points) == 2 and len(texts) == 4   # one panel per depth; the marked blocks' labels and the others'
    assert sum("zones_wide_only" in l.get("name", "") for l in texts) == 2   # the others' drop out on a phone
    shape = points[0]["encoding"]["shape"]["scale"]
    assert dict(zip(shape["domain"], shape["range"])) == {"most important": "diamond", "least important": "square",
                                                          "other": "circle"}
    color = points[0]["encoding"]["color"]["scale"]
    assert dict(zip(color["domain"], color["range"]))["most important"] == "#d62728"
    assert points[0]["encoding"]["opacity"]["field"] == "seed_label"   # seeds by another channel than colour
    assert texts[0]["encoding"]["text"]["field"] == "block"
    marked = _marked(_plot_values(importance))
    assert set(marked["block"]) >= {"L0", "L7", "L11"}
    per_run = marked.groupby(["depth", "seed"])["mark"].value_counts().unstack(fill_value=0)
    assert (per_run["most important"] == 1).all() and (per_run["least important"] == 1).all()
    most = marked[marked["mark"] == "most important"]
    assert set(most["layer"]) == {0}   # block 0 carries the largest ΔLoss in these runs


def test_per_block_bars_are_coloured_by_alpha_and_tell_seeds_apart_by_opacity():
    from zones.figures.depth_series import ablation_by_depth

    spec = ablation_by_depth(_importance(), alpha_title="weighted α").to_dict()
    bars = [l for l in _layers(spec) if l["mark"]["type"] == "bar" and "color" in l["encoding"]]
    assert bars and all(b["encoding"]["color"]["field"] == "alpha" and b["encoding"]["color"]["type"] == "quantitative"
                        for b in bars)
    assert all(b["encoding"]["opacity"]["field"] == "seed_label" for b in bars)
    assert all(b["encoding"]["xOffset"]["field"] == "seed_label" for b in bars)


def _y_domains_hold_their_rules(spec: dict) -> list[str]:
    """Every rule (error bar) of ``spec``: its ends inside the range its y scale states, and
    clipped (a range left to the data let a whisker run past the axis' top)."""
    data = spec.get("datasets", {})
    wrong = []
    for layer in _layers(spec):
        if layer["mark"]["type"] != "rule" or "y2" not in layer["encoding"]:
            continue
        y = layer["encoding"]["y"]
        scale = y.get("scale") or {}
        domain = scale.get("domain") or ([scale["domainMin"], scale["domainMax"]] if "domainMax" in scale else None)
        rows = data[layer["data"]["name"]] if "data" in layer else next(iter(data.values()))
        ends = [r[y["field"]] for r in rows] + [r[layer["encoding"]["y2"]["field"]] for r in rows]
        if not layer["mark"].get("clip"):
            wrong.append(f"rule on {y['field']} is not clipped")
        if not domain:
            wrong.append(f"rule on {y['field']}: its axis does not state its range")
            continue
        if domain and (min(ends) < domain[0] or max(ends) > domain[1]):
            wrong.append(f"rule on {y['field']} spans {min(ends):.3g}..{max(ends):.3g}, its axis {domain}")
    return wrong


def test_error_bars_stay_inside_their_axes():
    from zones.figures.depth_series import ablation_by_depth
    from zones.figures.layer_ablation import ablation_bars

    importance = _importance()
    assert _y_domains_hold_their_rules(ablation_by_depth(importance).to_dict()) == []
    one = importance[importance["depth"] == 8].drop(columns=["depth", "seed"]).assign(model="m")
    one = one.groupby("layer", as_index=False).first()
    spec = ablation_bars(one).to_dict()
    assert _y_domains_hold_their_rules(spec) == []
    from zones.figures.pruning import delta_ppl_bars

    summary = pd.DataFrame([dict(strategy=s, k=k, delta_ppl=v * k, delta_ppl_low=-1.0 if s == "zone_aware" else v * k / 3,
                                 delta_ppl_high=v * k * 4, delta_ppl_min=v * k, delta_ppl_max=v * k, n_seeds=1)
                            for s, v in (("zone_aware", 0.5), ("last_n", 1e4), ("random", 3.0)) for k in (1, 2, 3, 4)])
    assert _y_domains_hold_their_rules(delta_ppl_bars(summary).to_dict()) == []


# --- what a page loads -----------------------------------------------------------------------


def test_every_page_loads_each_script_once_and_no_thebe():
    from docutils import nodes
    from docutils.utils import new_document
    from sphinx.builders.html._assets import _JavaScript

    from zones.pages import drop_thebe_config, unique_assets

    thebe = _JavaScript(None, body='const THEBE_JS_URL = "x"; const thebe_selector = ".cell"')
    toggle = _JavaScript(None, body="var togglebuttonSelector = '.toggle';")
    assets = [_JavaScript("vega-bundle.js"), thebe, _JavaScript("sphinx-thebe.js", **{"async": "async"}), toggle,
              thebe, toggle, _JavaScript("zones.js"), _JavaScript("vega-bundle.js")]
    kept = unique_assets(assets)
    assert [a.filename or a.attributes["body"] for a in kept] == ["vega-bundle.js", toggle.attributes["body"],
                                                                  "zones.js"]
    document = new_document("page")
    document += nodes.paragraph(text="text")
    document += nodes.raw(text='<script type="text/x-thebe-config">{}</script>', format="html")
    document += nodes.raw(text="<script>kernelName = 'python3'</script>", format="html")
    drop_thebe_config(None, document, "page")
    assert [n.astext() for n in document.children] == ["text"]
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["sphinx"]
    assert "zones.pages" in config["extra_extensions"] and "zones.js" in config["config"]["html_js_files"]


def test_log_lines_leave_the_page_for_the_terminal(tmp_path):
    import nbformat

    from zones.book.notebooks import drop_log_lines

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="zones: converting m.Q4_1.gguf to safetensors"
                                                                          " (once, ~30 s) ...\nρ = 0.81\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="zones: 3 checkpoints: 3 computed\n"),
                    nbformat.v4.new_output("display_data", data={"text/plain": "zones: a value, not a log"})]
    nb.cells = [cell]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    assert drop_log_lines(path) == ["zones: converting m.Q4_1.gguf to safetensors (once, ~30 s) ...",
                                    "zones: 3 checkpoints: 3 computed"]
    outputs = nbformat.read(path, as_version=4).cells[0].outputs
    assert [o.get("text") for o in outputs] == ["ρ = 0.81\n", None]   # the emptied stream is gone
    assert drop_log_lines(path) == []


def test_static_assets_ship_the_table_script():
    script = (ROOT / "book" / "_static" / "zones.js").read_text()
    css = (ROOT / "book" / "_static" / "zones.css").read_text()
    assert "data-label" in script and "zones-as-cards" in script and "zones-as-cards" in css
    assert "mjx-container[jax] > svg { max-width: 100%; height: auto; }" in css   # a formula shrinks to fit
    assert json.loads(json.dumps(figures.NARROW_BELOW)) < 600   # a phone's width draws the phone layout
