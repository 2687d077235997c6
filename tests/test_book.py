"""The book pipeline: a chapter executes under papermill, and its chart renders offline."""
import json
import shutil
from pathlib import Path

import pytest

from zones.book import build_book, chapters

ROOT = Path(__file__).resolve().parents[1]


def test_every_toc_chapter_has_a_clean_parameterized_notebook():
    import jupytext

    names = chapters(ROOT)
    assert names and names[0] == "alpha_profile"
    assert not list((ROOT / "notebooks").glob("*.ipynb")) or not _tracked_ipynb()
    for name in names:
        nb = jupytext.read(ROOT / "notebooks" / f"{name}.md")
        tagged = [c for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{name}: needs exactly one parameters cell"
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), f"{name}: outputs committed"


def _tracked_ipynb() -> list[str]:
    import subprocess

    out = subprocess.run(["git", "ls-files", "notebooks/*.ipynb"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.split()


def _mini_project(tmp_path: Path) -> Path:
    """A copy of the project holding only the intro, methods and α chapter."""
    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "alpha_profile.md", root / "notebooks")
    shutil.copytree(ROOT / "book", root / "book", ignore=shutil.ignore_patterns("_build", "chapters", "_static"))
    shutil.copy(ROOT / "_config.yml", root)
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n"
                                   "  - file: book/methods\n  - file: book/chapters/alpha_profile\n")
    return root


@pytest.mark.slow
def test_built_page_draws_its_chart_with_the_network_off(tmp_path, tiny_model_dir):
    from playwright.sync_api import sync_playwright

    root = _mini_project(tmp_path)
    index = build_book({"model": str(tiny_model_dir)}, root=root)
    assert index.exists()
    summary = json.loads((root / "book/chapters/results/alpha_profile/summary.json").read_text())
    assert summary["n_blocks"] == 6

    page_path = root / "book/_build/html/book/chapters/alpha_profile.html"
    external = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium",
                                    args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"])
        context = browser.new_context(offline=True)
        page = context.new_page()
        page.on("request", lambda r: external.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
        page.goto(page_path.as_uri())
        page.wait_for_selector(".zones-chart svg .mark-rect path, .zones-chart canvas", timeout=20_000)
        n_bars = page.locator(".zones-chart svg .mark-rect path").count()
        text = page.inner_text("body")
        browser.close()
    assert n_bars >= 6  # one bar per block
    assert "chart error" not in text
    assert not [u for u in external if "vega" in u or "cdn" in u]


def test_a_failing_chapter_fails_the_build_and_leaves_no_page(tmp_path):
    import nbformat

    from zones.book import ChapterFailed

    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "book").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("x = 1")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("raise RuntimeError('boom ' + str(x))")]
    import jupytext

    jupytext.write(nb, root / "notebooks" / "broken.md", fmt="md:myst")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/chapters/broken\n")
    with pytest.raises(ChapterFailed, match="boom 7"):
        build_book({"x": 7, "model": "unused"}, root=root)
    assert not (root / "book/chapters/broken.ipynb").exists()
    assert (root / "book/chapters/broken.failed.ipynb").exists()
