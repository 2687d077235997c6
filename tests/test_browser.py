"""The whole book as a reader sees it: every page, offline, at a desktop and a phone width.

Builds the complete book (every chapter of ``_toc.yml``) on a tiny model with tiny budgets,
then opens every page in Debian's chromium with every non-``file:`` request blocked, at 1280
and 390 px, and checks: no request failed or left the machine, every chart drew its marks,
every formula is typeset, and nothing is wider than the article column except inside a box
made to scroll (a table box, a code block, a long display formula). Prints, per page and
width, the request count and the widest element; screenshots go to ``/tmp/zones-shots/``.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from zones.book import build_book, copy_project

ROOT = Path(__file__).resolve().parents[1]
SHOTS = Path("/tmp/zones-shots")
WIDTHS = (1280, 390)
# Boxes a reader scrolls on purpose: wide content inside one of these does not overflow the page.
SCROLL_BOXES = ("div.zones-table, div.pst-scrollable-table-container, div.highlight, pre, "
                "div.math, mjx-container, div.cell_output div.output.text_html:has(table)")

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
    return dict(models=[str(model_dir)], seq_len=32, eval_tokens=31 * 8,
                calibration_tokens=31 * 2, heal_tokens=31 * 4, k_values=[1, 2], batch_size=8, k_max=3, n_resamples=200,
                n_permutations=500, speed_repeats=1, depths=[2, 3], train_overrides=train)


@pytest.fixture(scope="module")
def built_book(request, tmp_path_factory) -> Path:
    """The HTML folder of the whole book built on the tiny model; ``ZONES_BOOK_HTML=DIR`` checks
    an existing build instead (e.g. ``book/_build/html`` after ``make book``)."""
    import os

    if os.environ.get("ZONES_BOOK_HTML"):
        return Path(os.environ["ZONES_BOOK_HTML"]).resolve()
    micro_corpus = request.getfixturevalue("micro_corpus")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the kernels inherit it
    model = micro_model(micro_corpus)
    root = copy_project(tmp_path_factory.mktemp("book") / "project", root=ROOT)
    index = build_book(tiny_book_parameters(model, micro_corpus), root=root)
    return index.parent


def pages(html_root: Path) -> list[Path]:
    """Every HTML page of the build (the toc's pages, the index redirect, search, genindex)."""
    return sorted(p for p in html_root.rglob("*.html")
                  if not any(part.startswith("_") for part in p.relative_to(html_root).parts))


MEASURE = """(boxes) => {
  // The column is the article's content box; content may not cross its edges unless it sits
  // inside a box made to scroll sideways.
  const article = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const style = getComputedStyle(article), edge = article.getBoundingClientRect();
  const left = edge.left + parseFloat(style.paddingLeft), right = edge.right - parseFloat(style.paddingRight);
  const inBox = (el) => { for (let a = el.parentElement; a && a !== article; a = a.parentElement) {
      if (a.matches(boxes) && ['auto', 'scroll'].includes(getComputedStyle(a).overflowX)) return true; } return false; };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.classList.length ? '.' + [...el.classList].slice(0, 2).join('.') : '');
  // Drawn content (not the block boxes that span the column by construction), and apart from
  // it the widest content that scrolls inside its own box. Collapsed (hidden) code is skipped.
  const content = 'svg.marks, table, img, mjx-container, code, figure';
  let widest = {name: '-', width: 0}, scrolled = {name: '-', width: 0}, overflow = [];
  for (const el of article.querySelectorAll('*')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0 || inBox(el) || el.closest('details:not([open]) > :not(summary)')) continue;
    if (el.matches(boxes) && el.scrollWidth > scrolled.width) scrolled = {name: name(el), width: el.scrollWidth};
    else if (el.matches(content) && r.width > widest.width) widest = {name: name(el), width: Math.round(r.width)};
    if (r.right > right + 1 || r.left < left - 1)
      overflow.push(name(el) + ' ' + Math.round(r.left) + '..' + Math.round(r.right));
  }
  return {column: Math.round(right - left), widest, scrolled, overflow: overflow.slice(0, 8),
          page_scroll: document.documentElement.scrollWidth - window.innerWidth};
}"""

CHARTS = """() => [...document.querySelectorAll('.zones-chart')].map(c => ({
  id: c.id, marks: c.querySelectorAll('svg g[class*="role-mark"] > *').length,
  width: Math.round((c.querySelector('svg') || c).getBoundingClientRect().width),
  box: Math.round(c.getBoundingClientRect().width),
  error: c.innerText.includes('chart error') ? c.innerText.slice(0, 200) : ''}))"""

MATH = """() => ({
  total: document.querySelectorAll('.math').length,
  typeset: document.querySelectorAll('.math mjx-container').length,
  errors: document.querySelectorAll('mjx-merror').length,
  // TeX left as text: \\( \\[ or a $ outside code and typeset formulas (a $$ block the parser missed)
  raw: [...document.querySelectorAll('article p, article li, article td')].some(e => {
    const copy = e.cloneNode(true);
    copy.querySelectorAll('code, mjx-container, .math').forEach(x => x.remove());
    return /\\\\\\(|\\\\\\[|\\$/.test(copy.textContent);
  })})"""


TABLES = """() => ({
  // the scorecard: its rows are cards (display: block) at a phone's width, a table at a desktop's
  claims_rows: [...document.querySelectorAll('table.zones-claims tbody tr')].map(r => getComputedStyle(r).display),
  // tables whose columns the prose discusses (the scorecard; per-k tables of the pruning chapter):
  // every column visible without scrolling their box
  cut: [...document.querySelectorAll('div.zones-table')].filter(box =>
      box.querySelector('table.zones-claims') ||
      [...box.querySelectorAll('th')].some(th => /^k = \\d+$/.test(th.textContent.trim())))
    .filter(box => box.scrollWidth > box.clientWidth + 1)
    .map(box => (box.querySelector('caption') || box).textContent.slice(0, 60) + ` (${box.scrollWidth}px in ${box.clientWidth}px)`),
  badges: document.querySelectorAll('.zones-badge').length})"""


def test_every_page_is_offline_typeset_drawn_and_fits_both_widths(built_book, capsys):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    all_pages = pages(built_book)
    names = [p.relative_to(built_book).as_posix() for p in all_pages]
    for expected in ("book/intro.html", "book/methods.html", "book/bibliography.html",
                     *[f"book/chapters/{n}.html" for n in _chapter_names()]):
        assert expected in names, f"{expected} was not built"
    report, problems = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        for width in WIDTHS:
            context = browser.new_context(viewport={"width": width, "height": 900}, offline=True)
            blocked: list[str] = []
            context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "data:"))
                          else (blocked.append(route.request.url), route.abort()))
            for path, name in zip(all_pages, names):
                page = context.new_page()
                requests, failed = [], []
                page.on("request", lambda r: requests.append(r.url))
                page.on("requestfailed", lambda r: failed.append(f"{r.url} ({r.failure})"))
                blocked.clear()
                page.goto(path.as_uri(), wait_until="load")
                page.wait_for_function("() => [...document.querySelectorAll('.zones-chart')].every("
                                       "c => c.querySelector('svg') || c.innerText.includes('chart error'))",
                                       timeout=30_000)
                if page.locator(".math").count():
                    page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise"
                                           " && document.querySelectorAll('.math mjx-container').length > 0",
                                           timeout=30_000)
                    page.evaluate("() => MathJax.startup.promise")
                page.wait_for_timeout(300)  # container-width charts resize once laid out
                charts, math, fit = page.evaluate(CHARTS), page.evaluate(MATH), page.evaluate(MEASURE, SCROLL_BOXES)
                tables = page.evaluate(TABLES)
                page.screenshot(path=str(SHOTS / f"{name.replace('/', '_').removesuffix('.html')}-{width}.png"),
                                full_page=True)
                page.close()
                report.append(f"{name:42s} {width:5d}px  requests {len(requests):3d}  charts {len(charts):2d}  "
                              f"formulas {math['typeset']:3d}/{math['total']:<3d}  column {fit['column']:4d}px  "
                              f"widest {fit['widest']['width']:4d}px {fit['widest']['name']:30s}  "
                              f"widest scrolling {fit['scrolled']['width']:4d}px {fit['scrolled']['name']}")
                where = f"{name} at {width}px"
                problems += [f"{where}: blocked {u}" for u in blocked]
                problems += [f"{where}: failed {u}" for u in failed]
                problems += [f"{where}: chart {c['id']} drew no marks {c['error']}" for c in charts if not c["marks"]]
                # a chart never scrolls: it is as wide as the column at most (the outputs' own
                # scroll box would hide an overflow from the check below)
                problems += [f"{where}: chart {c['id']} is {c['width']}px wide, the column {fit['column']}px"
                             for c in charts if c["width"] > fit["column"] + 1]
                if math["typeset"] < math["total"] or math["errors"] or math["raw"]:
                    problems.append(f"{where}: formulas typeset {math['typeset']}/{math['total']}, "
                                    f"{math['errors']} TeX errors, raw TeX left: {math['raw']}")
                problems += [f"{where}: wider than the column ({fit['column']}px): {o}" for o in fit["overflow"]]
                if width >= 1280:
                    problems += [f"{where}: a discussed table is cut: {t}" for t in tables["cut"]]
                card = "block" if width < 600 else "table-row"
                if tables["claims_rows"] and set(tables["claims_rows"]) != {card}:
                    problems.append(f"{where}: scorecard rows are {set(tables['claims_rows'])}, not {card}")
                if name == "book/intro.html" and tables["badges"] < 5:
                    problems.append(f"{where}: the verdict list has {tables['badges']} badges")
                if name == "book/chapters/claims.html" and not tables["claims_rows"]:
                    problems.append(f"{where}: no scorecard table")
                if fit["page_scroll"] > 0:
                    problems.append(f"{where}: the page scrolls sideways by {fit['page_scroll']}px")
            context.close()
        browser.close()
    (SHOTS / "report.txt").write_text("\n".join(report) + "\n")
    with capsys.disabled():
        print("\n" + "\n".join(report))
    assert not problems, "\n".join(problems)
    methods = [line for line in report if line.startswith("book/methods.html")]
    assert methods and all(" 0/" not in line for line in methods)  # Methods has formulas, all typeset


def _chapter_names() -> list[str]:
    from zones.book import chapters

    return chapters(ROOT)
