"""The whole book as a reader sees it: every page, offline, at a desktop and a phone width.

Builds the complete book (every chapter of ``_toc.yml``) on a tiny model with tiny budgets
(or checks an existing build: ``ZONES_BOOK_HTML=book/_build/html``), then opens every page in
Debian's chromium with every non-``file:`` request blocked, at 1280 and 390 px, and audits it:

- nothing is requested from the network, no request fails, and the console shows no error
  (an uncaught exception, a script error such as a ``const`` declared twice);
- every chart draws its marks, fits the column and is drawn at a legible scale;
- every formula is typeset, and no TeX source (``\\(``, ``$…$``, ``\\frac``) or formula
  written as plain text (``k^(−a)``, ``σ_k``) is left in the text;
- nothing is wider than the article column or the viewport, and nothing but code is cut
  (a box that scrolls sideways: a table, its caption, a display equation);
- no table's cells overlap, and no two neighbouring cells' texts touch ("smollm2-135malpha");
- every table caption carries the number Sphinx gave it (none typed by hand);
- no library log line (``zones: converting …``) is printed in a page.

Every check is shown to fail on a small static page with that defect
(``test_the_audit_finds_each_kind_of_defect``). Prints, per page and width, the request
count and the widest element; screenshots go to ``/tmp/zones-shots/``.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path("/tmp/zones-shots")
WIDTHS = (1280, 390)
SMALLEST_CHART_SCALE = 0.8  # a chart drawn at less than this share of its own size is hard to read

pytestmark = pytest.mark.slow


MICRO_TRAINING = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, lr=3e-3, eval_every=10,
                      snapshot_every=10, checkpoint_every=15, eval_windows=8)


def micro_model(corpus: str, depth: int = 6, steps: int = 80) -> Path:
    """A 6-block GPT-NeoX trained for a few seconds: unlike a random model, removing its
    blocks raises the loss, so every chart of the chapters has something to draw."""
    from zones.series import profile_config, train_model

    run = train_model(profile_config("cpu", depth, corpus=corpus, steps=steps, **MICRO_TRAINING), progress=False)
    return Path(run.path)


def tiny_book_parameters(model_dir: Path, corpus: str) -> dict:
    """Every chapter's budget cut to seconds: 8 windows of 32 tokens, k ≤ 3, a 40-step series."""
    train = dict(MICRO_TRAINING, steps=40, corpus=corpus)
    # ``seeds`` is left out: the pruning and healing chapters take a count, the depth series a list.
    return dict(models=[str(model_dir)], seq_len=32, eval_tokens=31 * 8, series_eval_tokens=31 * 8, pruning_eval_tokens=31 * 8,
                calibration_tokens=31 * 2, heal_tokens=31 * 4, k_values=[1, 2], batch_size=8, k_max=3, n_resamples=200,
                n_permutations=500, speed_repeats=1, depths=[2, 3], train_overrides=train)


@pytest.fixture(scope="module")
def built_book(request, tmp_path_factory) -> Path:
    """The HTML folder of the whole book built on the tiny model; ``ZONES_BOOK_HTML=DIR`` checks
    an existing build instead (e.g. ``book/_build/html`` after ``make book``)."""
    if os.environ.get("ZONES_BOOK_HTML"):
        return Path(os.environ["ZONES_BOOK_HTML"]).resolve()
    return request.getfixturevalue("micro_book_root") / "book" / "_build" / "html"


@pytest.fixture(scope="module")
def browser():
    """Debian's chromium (never a downloaded browser), headless, network off."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                     args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        yield chromium
        chromium.close()


def pages(html_root: Path) -> list[Path]:
    """Every HTML page of the build (the toc's pages, the index redirect, search, genindex)."""
    return sorted(p for p in html_root.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(html_root).parts))


# Everything the audit measures in one page, in one pass. Boxes that may scroll sideways: code
# (and a chart's own box never does). Text is read outside code, typeset formulas and charts.
AUDIT = r"""() => {
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const style = getComputedStyle(article), edge = article.getBoundingClientRect();
  const left = edge.left + parseFloat(style.paddingLeft), right = edge.right - parseFloat(style.paddingRight);
  const CODE = 'pre, div.highlight, code';
  const scrolls = (el) => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const inBox = (el) => { for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      if (scrolls(a)) return true; } return false; };
  const hidden = (el) => !!el.closest('details:not([open]) > :not(summary)');
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.classList.length ? '.' + [...el.classList].slice(0, 2).join('.') : '');
  const content = 'svg.marks, table, img, mjx-container, code, figure';
  let widest = {name: '-', width: 0}, overflow = [], cut = [];
  for (const el of article.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || hidden(el) || el.parentElement.closest('mjx-container')) continue;
    // a box that hides part of what it holds behind a scroll bar (code may scroll)
    if (scrolls(el) && el.scrollWidth > el.clientWidth + 1 && !el.matches(CODE) && !el.closest(CODE))
      cut.push(name(el) + ` holds ${el.scrollWidth}px in ${el.clientWidth}px: ` +
               ((el.querySelector('caption') || el).textContent || '').trim().slice(0, 50));
    if (inBox(el)) continue;
    if (el.matches(content) && r.width > widest.width) widest = {name: name(el), width: Math.round(r.width)};
    if (r.right > right + 1 || r.left < left - 1)
      overflow.push(name(el) + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
  }
  // wider than the viewport, anywhere on the page (the sidebars and header included)
  const wide = [...document.body.querySelectorAll('*')].filter(el => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.right > window.innerWidth + 1 && !inBox(el) && !hidden(el) &&
           !el.parentElement.closest('mjx-container') &&
           getComputedStyle(el).visibility !== 'hidden' && !el.closest('.bd-sidebar-primary:not(.show)');
  }).map(name).slice(0, 5);

  // text a reader sees, outside code, formulas and charts
  const skip = 'script, style, pre, code, .highlight, mjx-container, .math, svg, .zones-chart, noscript, template';
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT, {acceptNode: n =>
      n.parentElement && !n.parentElement.closest(skip) ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT});
  const chunks = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) chunks.push(n.textContent);
  const text = chunks.join(' ');
  const find = (re) => { const m = text.match(re); return m ? text.slice(Math.max(0, m.index - 25), m.index + m[0].length + 25).replace(/\s+/g, ' ') : ''; };
  const tex = find(/\\\(|\\\[|\$\$|\$[^$\s][^$]{0,80}\$|\\(frac|sum|alpha|sigma|lambda|mathrm|mathcal|text|left|right|begin|end|cdot|propto|times|ge|le|in|sqrt)(?![a-z])/);
  const plain = find(/(?<![\p{L}\p{N}_])\p{L}_[\p{L}\p{N}{(](?![\p{L}\p{N}])|[\p{L}\p{N})\]]\^[\p{L}\p{N}({−\-]/u);

  // tables: cells whose boxes overlap, or whose texts touch their neighbour's
  // the box of a cell's visible text: a closed <details>' body is laid out but not shown, and a range over the
  // whole cell would count it (the scorecard's collapsed details)
  const textBox = (cell) => { let top = Infinity, left = Infinity, bottom = -Infinity, right = -Infinity;
      const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
      for (let n = walker.nextNode(); n; n = walker.nextNode()) {
        const hidden = n.parentElement.closest('details:not([open])');
        if (hidden && !n.parentElement.closest('summary')) continue;
        const range = document.createRange(); range.selectNodeContents(n);
        for (const q of range.getClientRects()) { if (q.width <= 0 || q.height <= 0) continue;
          top = Math.min(top, q.top); left = Math.min(left, q.left); bottom = Math.max(bottom, q.bottom);
          right = Math.max(right, q.right); } }
      return bottom > top ? {top, left, bottom, right} : null; };
  const tables = [];
  for (const table of article.querySelectorAll('table')) {
    if (hidden(table)) continue;
    for (const row of table.rows) {
      const cells = [...row.cells].filter(c => c.getBoundingClientRect().width > 0);
      const boxes = cells.map(c => c.getBoundingClientRect()), texts = cells.map(textBox);
      for (let i = 0; i < cells.length; i++) for (let j = i + 1; j < cells.length; j++) {
        const a = boxes[i], b = boxes[j];
        const across = Math.min(a.right, b.right) - Math.max(a.left, b.left), down = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        const say = `"${cells[i].textContent.trim().slice(0, 20)}" | "${cells[j].textContent.trim().slice(0, 20)}"`;
        if (across > 1 && down > 1) { tables.push('cells overlap: ' + say); continue; }
        const s = texts[i], t = texts[j];
        if (!s || !t) continue;
        const level = Math.min(s.bottom, t.bottom) - Math.max(s.top, t.top);
        const gap = Math.max(t.left - s.right, s.left - t.right);
        const stacked = Math.max(t.top - s.bottom, s.top - t.bottom);
        if ((level > 1 && gap < 3) || (level <= 1 && gap < 0 && stacked < 0)) tables.push('texts touch: ' + say);
      }
    }
  }

  // a table's caption carries the number Sphinx gave it, never one typed by hand
  const captions = [...article.querySelectorAll('table > caption')].filter(c => !hidden(c)).map(c => {
      const text = (c.querySelector('.caption-text') || c).textContent.trim();
      return !c.querySelector('.caption-number') ? 'a table caption without its number: ' + text.slice(0, 50)
           : /^Table \d/.test(text) ? 'a caption that types its own number: ' + text.slice(0, 50) : ''; })
    .filter(Boolean).slice(0, 4);

  // charts: marks drawn, no error, width, and the scale they are drawn at
  const charts = [...document.querySelectorAll('.zones-chart')].map(c => {
    const svg = c.querySelector('svg');
    const own = svg ? parseFloat(svg.getAttribute('width') || '0') : 0;
    const shown = svg ? svg.getBoundingClientRect().width : c.getBoundingClientRect().width;
    return {id: c.id, marks: c.querySelectorAll('svg g[class*="role-mark"] > *').length, width: Math.round(shown),
            scale: own ? shown / own : 1, error: c.innerText.includes('chart error') ? c.innerText.slice(0, 200) : ''};
  });

  const logs = [...article.querySelectorAll('div.cell_output, div.output')].map(o => o.innerText)
      .join('\n').split('\n').filter(l => /^zones( [a-z]+)?: /.test(l.trim())).slice(0, 3);

  return {column: Math.round(right - left), widest, overflow: overflow.slice(0, 8), cut: cut.slice(0, 8),
          wide, page_scroll: document.documentElement.scrollWidth - window.innerWidth,
          formulas: document.querySelectorAll('.math').length,
          typeset: document.querySelectorAll('.math mjx-container').length,
          tex_errors: document.querySelectorAll('mjx-merror').length, tex, plain, tables: tables.slice(0, 8),
          captions, charts, logs,
          claims_rows: [...document.querySelectorAll('table.zones-claims tbody tr')].map(r => getComputedStyle(r).display),
          badges: document.querySelectorAll('.zones-badge').length};
}"""


def open_page(context, path: Path):
    """Open ``path``; wait for its charts and formulas; return the page and what went wrong
    loading it (requests, failures, console errors)."""
    page = context.new_page()
    seen = {"requests": [], "failed": [], "console": []}
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.on("requestfailed", lambda r: seen["failed"].append(f"{r.url} ({r.failure})"))
    page.on("console", lambda m: seen["console"].append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: seen["console"].append(str(e)))
    page.goto(path.as_uri(), wait_until="load")
    if page.locator('meta[http-equiv="Refresh" i]').count():  # the index redirects: audit where it lands
        page.wait_for_url(lambda url: url != path.as_uri(), wait_until="load")
    page.wait_for_function("() => [...document.querySelectorAll('.zones-chart')].every("
                           "c => c.querySelector('svg') || c.innerText.includes('chart error'))", timeout=30_000)
    if page.locator(".math").count():
        try:
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20_000)
            page.evaluate("() => MathJax.startup.promise")
        except Exception:  # no MathJax on the page: the audit reports the formulas left untypeset
            pass
    page.wait_for_timeout(300)  # charts and tables settle to the column's width
    return page, seen


def audit(page, seen: dict, width: int) -> tuple[dict, list[tuple[str, str]]]:
    """Measure the open ``page`` and list its problems as (kind, what)."""
    m = page.evaluate(AUDIT)
    problems = [("network", f"blocked or left the machine: {u}") for u in seen["requests"]
                if not u.startswith(("file:", "data:", "blob:"))]
    problems += [("network", f"failed {u}") for u in seen["failed"]]
    problems += [("console", f"console error: {e[:200]}") for e in seen["console"]]
    for c in m["charts"]:
        if not c["marks"]:
            problems.append(("chart", f"chart {c['id']} drew no marks {c['error']}"))
        if c["width"] > m["column"] + 1:
            problems.append(("chart", f"chart {c['id']} is {c['width']}px wide, the column {m['column']}px"))
        if c["scale"] < SMALLEST_CHART_SCALE:
            problems.append(("chart", f"chart {c['id']} is drawn at {c['scale']:.0%} of its size (lay it out for "
                                      f"this width)"))
    if m["typeset"] < m["formulas"] or m["tex_errors"]:
        problems.append(("tex", f"formulas typeset {m['typeset']}/{m['formulas']}, {m['tex_errors']} TeX errors"))
    if m["tex"]:
        problems.append(("tex", f"TeX source left as text: …{m['tex']}…"))
    if m["plain"]:
        problems.append(("tex", f"a formula written as plain text: …{m['plain']}…"))
    problems += [("wide", f"wider than the column ({m['column']}px): {o}") for o in m["overflow"]]
    problems += [("wide", f"wider than the viewport ({width}px): {w}") for w in m["wide"]]
    if m["page_scroll"] > 0:
        problems.append(("wide", f"the page scrolls sideways by {m['page_scroll']}px"))
    problems += [("cut", f"cut: {c}") for c in m["cut"]]
    problems += [("table", t) for t in m["tables"]]
    problems += [("caption", c) for c in m["captions"]]
    problems += [("log", f"a log line in the page: {line}") for line in m["logs"]]
    rows = set(m["claims_rows"])   # the scorecard: cards on a phone, a table on a laptop
    if rows and (("table-row" in rows) if width < 600 else (rows != {"table-row"})):
        problems.append(("table", f"scorecard rows are displayed as {rows} at {width}px"))
    return m, problems


def screenshot(page, width: int, path: Path) -> None:
    """The whole page as a reader scrolls through it: the window made as tall as the page (a
    full-page capture widens the layout while it draws, which redraws the charts wider)."""
    height = page.evaluate("() => document.documentElement.scrollHeight")
    page.set_viewport_size({"width": width, "height": min(height, 32_000)})
    page.wait_for_timeout(300)
    page.screenshot(path=str(path))


def offline_context(browser, width: int):
    context = browser.new_context(viewport={"width": width, "height": 900}, offline=True)
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                  else route.abort())
    return context


def test_every_page_is_offline_typeset_drawn_and_fits_both_widths(built_book, browser, capsys):
    SHOTS.mkdir(parents=True, exist_ok=True)
    all_pages = pages(built_book)
    names = [p.relative_to(built_book).as_posix() for p in all_pages]
    for expected in ("book/intro.html", "book/methods.html", "book/bibliography.html",
                     *[f"book/chapters/{n}.html" for n in _chapter_names()]):
        assert expected in names, f"{expected} was not built"
    report, problems = [], []
    for width in WIDTHS:
        context = offline_context(browser, width)
        for path, name in zip(all_pages, names):
            page, seen = open_page(context, path)
            m, found = audit(page, seen, width)
            screenshot(page, width, SHOTS / f"{name.replace('/', '_').removesuffix('.html')}-{width}.png")
            page.close()
            report.append(f"{name:42s} {width:5d}px  requests {len(seen['requests']):3d}  charts {len(m['charts']):2d}  "
                          f"formulas {m['typeset']:3d}/{m['formulas']:<3d}  column {m['column']:4d}px  "
                          f"widest {m['widest']['width']:4d}px {m['widest']['name']}")
            problems += [f"{name} at {width}px: {what}" for _, what in found]
            if name == "book/intro.html" and m["badges"] < 5:
                problems.append(f"{name} at {width}px: the verdict list has {m['badges']} badges")
            if name == "book/chapters/claims.html" and not m["claims_rows"]:
                problems.append(f"{name} at {width}px: no scorecard table")
        context.close()
    (SHOTS / "report.txt").write_text("\n".join(report) + "\n" + "\n".join(problems) + "\n")
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert not problems, "\n".join(problems)
    methods = [line for line in report if line.startswith("book/methods.html")]
    assert methods and all(" 0/" not in line for line in methods)  # Methods has formulas, all typeset


def _chapter_names() -> list[str]:
    from zones.book import chapters

    return chapters(ROOT)


# Static pages with one defect each (and one without): the audit must name the defect.
FIXTURE_PAGE = """<!doctype html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1"><style>
body {{ margin: 0; font: 16px sans-serif; }} article.bd-article {{ padding: 0 16px; max-width: 700px; }}
td, th {{ padding: 0.3em 0.6em; }}
</style></head><body><article class="bd-article"><h1>A page</h1>
<p>Every block of the model is removed in turn and the loss is measured again.</p>
<table><caption><span class="caption-number">Table 1 </span><span class="caption-text">Models.</span></caption>
<thead><tr><th>model</th><th>estimator</th></tr></thead>
<tbody><tr><td>smollm2-135m</td><td>alpha_shape</td></tr></tbody></table>
{body}</article></body></html>"""

DEFECTS = {
    "tex": '<p>The loss is \\(\\frac{1}{N} \\sum_i \\ell_i\\) per token.</p>',
    "plain formula": "<p>Its singular values decay as σ_k ∝ k^(−a).</p>",
    "console": "<script>const THEBE_JS_URL = 1;</script><script>const THEBE_JS_URL = 2;</script>",
    "wide": '<div style="width: 1600px; height: 20px; background: #eee">a banner</div>',
    "cut": ('<div style="overflow-x: auto"><table><caption>Table 3. A long caption cut with its table</caption>'
            '<tr>' + "".join(f"<td>+0.{i}23&nbsp;[+0.05,&nbsp;+0.20]</td>" for i in range(12)) + '</tr></table></div>'),
    "touching cells": ('<table><tr><td style="padding: 0">smollm2-135m</td>'
                       '<td style="padding: 0">alpha_shape</td></tr></table>'),
    "overlapping cells": ('<table><tr><td>depth 12, seed 0</td>'
                          '<td style="position: relative; left: -40px">12</td></tr></table>'),
    "log": '<div class="cell_output"><pre>zones: converting model.Q4_1.gguf to safetensors (once, ~30 s) ...</pre></div>',
    "typed number": '<table><caption>Table 3. Δloss of each strategy</caption><tr><td>1</td></tr></table>',
}
KIND = {"tex": "tex", "plain formula": "tex", "console": "console", "wide": "wide", "cut": "cut",
        "touching cells": "table", "overlapping cells": "table", "log": "log", "typed number": "caption"}


@pytest.mark.parametrize("width", WIDTHS)
def test_the_audit_finds_each_kind_of_defect(browser, tmp_path, width):
    context = offline_context(browser, width)
    found = {}
    for defect, body in {"none": "", **DEFECTS}.items():
        path = tmp_path / f"{defect.replace(' ', '-')}.html"
        path.write_text(FIXTURE_PAGE.format(body=body))
        page, seen = open_page(context, path)
        found[defect] = audit(page, seen, width)[1]
        page.close()
    context.close()
    assert found["none"] == [], found["none"]
    for defect, kind in KIND.items():
        kinds = {k for k, _ in found[defect]}
        assert kind in kinds, f"{defect} at {width}px: the audit found {found[defect]}"
    assert any("Identifier 'THEBE_JS_URL' has already been declared" in what for _, what in found["console"])
    assert any("k^(" in what for _, what in found["plain formula"])
    assert any("smollm2-135m" in what for _, what in found["touching cells"])


# --- a solution's title opens it, wherever it is tapped --------------------------------------------

SOLUTION_PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<script>var togglebuttonSelector = '.toggle, .admonition.dropdown'; let toggleHintShow = 'Click to show';
let toggleHintHide = 'Click to hide'; let toggleOpenOnPrint = 'true';</script>
<script src="togglebutton.js"></script><script src="zones.js"></script></head>
<body><article>
<div class="exercise admonition" id="ex-4"><p class="admonition-title"><span class="caption-number">Exercise 4 </span></p>
<section><p>Predict, then run.</p></section></div>
<p style="height: 1400px">Text between the exercise and its solution.</p>
<div class="solution dropdown admonition" id="sol-4"><p class="admonition-title">Solution to<a class="reference internal"
 href="#ex-4"> Exercise 4 (Predict, then run)</a></p><section id="solution-content"><p>The answer.</p></section></div>
</article></body></html>"""


@pytest.mark.parametrize("width", WIDTHS)
def test_tapping_the_exercise_link_in_a_solution_title_opens_the_solution(browser, tmp_path, width):
    import sphinx_togglebutton

    shutil.copy(Path(sphinx_togglebutton.__file__).parent / "_static" / "togglebutton.js", tmp_path)
    shutil.copy(ROOT / "book" / "_static" / "zones.js", tmp_path)
    (tmp_path / "page.html").write_text(SOLUTION_PAGE)
    context = offline_context(browser, width)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto((tmp_path / "page.html").as_uri(), wait_until="load")
    solution = page.locator("#sol-4")
    assert "toggle-hidden" in solution.get_attribute("class")        # collapsed until the reader opens it
    link = page.locator("#sol-4 .admonition-title a")
    link.scroll_into_view_if_needed()
    link.click()
    assert "toggle-hidden" not in solution.get_attribute("class")    # the tap on the link opened it
    assert page.url.endswith("page.html")                            # ... and did not jump to the exercise
    page.locator("#sol-4 .admonition-title").click(position={"x": 5, "y": 5})
    assert "toggle-hidden" in solution.get_attribute("class")        # the rest of the title closes it
    link.click()
    assert "toggle-hidden" not in solution.get_attribute("class")
    SHOTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SHOTS / f"solution-title-{width}.png"))
    assert errors == []                                              # no "button is not defined"
    context.close()
