"""The book pipeline: a chapter executes under papermill, and its chart renders offline."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from zones.book import build_book, chapters, copy_project, execution_order

ROOT = Path(__file__).resolve().parents[1]


def test_every_toc_chapter_has_a_clean_parameterized_notebook():
    import jupytext

    names = chapters(ROOT)
    assert names[0] == "primer" and names.index("claims") == 1  # the primer first, the scorecard near the front...
    order = execution_order(names)
    assert order[0] == "primer" and order[-2:] == ["claims", "teaching"]  # ...but executed after the chapters it reads (the teachers' page, which reads their times, last)
    assert sorted(order) == sorted(names)
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
    """A copy of the project holding only the book's own pages and the α chapter."""
    return copy_project(tmp_path / "project", ["alpha_profile"], root=ROOT)


@pytest.mark.slow
def test_built_page_draws_its_chart_with_the_network_off(tmp_path, tiny_model_dir):
    from playwright.sync_api import sync_playwright

    root = _mini_project(tmp_path)
    index = build_book({"models": [str(tiny_model_dir)]}, root=root)
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
    with pytest.raises(ValueError, match="unknown chapter parameter models: the chapter broken declare x"):
        build_book({"x": 7, "models": ["unused"]}, root=root)
    assert not (root / "book/chapters").exists()  # refused before any chapter ran
    with pytest.raises(ChapterFailed, match="boom 7"):
        build_book({"x": 7}, root=root, models=["given only to chapters that declare models"])
    assert not (root / "book/chapters/broken.ipynb").exists()
    assert (root / "book/chapters/broken.failed.ipynb").exists()


def _notebook_with_widget(text: str):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {"m1": {}}, "version_major": 2}}
    cell = nbformat.v4.new_code_cell("run()")
    cell.outputs = [nbformat.v4.new_output("display_data", data={
        "application/vnd.jupyter.widget-view+json": {"model_id": "m1", "version_major": 2, "version_minor": 0},
        "text/plain": text}), nbformat.v4.new_output("display_data", data={"text/html": "<b>chart</b>"})]
    nb.cells = [cell]
    return nb


def test_progress_bars_and_their_widget_state_leave_the_executed_chapter(tmp_path):
    import nbformat

    from zones.book.notebooks import drop_progress_widgets

    path = tmp_path / "chapter.ipynb"
    nbformat.write(_notebook_with_widget("pruned models (float32):   0%|          | 0/18 [00:00<?, ?set/s]"), path)
    assert drop_progress_widgets(path) == 1
    nb = nbformat.read(path, as_version=4)
    assert "widgets" not in nb.metadata  # so the page loads no require.js / widget manager from a CDN
    assert [list(o["data"]) for o in nb.cells[0].outputs] == [["text/html"]]
    # A real widget (not a progress bar) keeps its output and its state.
    nbformat.write(_notebook_with_widget("IntSlider(value=3)"), path)
    assert drop_progress_widgets(path) == 0
    assert "widgets" in nbformat.read(path, as_version=4).metadata


def test_static_assets_ship_mathjax_and_vega_with_the_build(tmp_path):
    from zones.book.build import write_static_assets

    vega, mathjax = write_static_assets(tmp_path / "_static")
    assert vega.name == "vega-bundle.js" and "vegaEmbed" in vega.read_text()
    assert mathjax == tmp_path / "_static" / "mathjax" / "tex-svg-full.js"
    head = mathjax.read_text()[:20000]
    assert "MathJax" in head and mathjax.stat().st_size > 1_000_000
    config = (ROOT / "_config.yml").read_text()
    assert 'mathjax_path: "mathjax/tex-svg-full.js"' in config  # the pages load this copy, not a CDN


def test_charts_take_the_column_width_and_long_titles_wrap():
    import altair as alt
    import pandas as pd

    from zones import figures

    chart = figures.fit(alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_bar().encode(x="x:O"), height=100)
    assert chart.to_dict()["width"] == "container" and chart.to_dict()["height"] == 100
    assert figures.panel_width(3) * 3 < figures.COLUMN_WIDTH  # three panels and a legend fit one row
    spec = {"title": "ΔPPL last_n / ΔPPL zone_aware: above 1, zone_aware wins", "hconcat": [
        {"title": {"text": "short"}, "encoding": {"y": {"title": "a very long axis title that would not fit a phone"}}}],
        "datasets": {"d": [{"title": "data is never touched, however long it is"}]}}
    wrapped = figures.wrap_titles(spec)
    assert wrapped["title"] == ["ΔPPL last_n / ΔPPL zone_aware: above 1,", "zone_aware wins"]
    assert wrapped["hconcat"][0]["title"] == {"text": "short"}
    assert all(len(line) <= figures.TITLE_CHARS for line in wrapped["hconcat"][0]["encoding"]["y"]["title"])
    assert wrapped["datasets"] == spec["datasets"]
    html = figures._offline_renderer(spec)["text/html"]
    assert '"title": ["' in html and 'class="zones-chart"' in html


def _trivial_project(tmp_path: Path, names=("first", "second")) -> Path:
    import jupytext
    import nbformat

    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "book").mkdir()
    for name in names:
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        params = nbformat.v4.new_code_cell("n_resamples = 1\nmodels = None")
        params.metadata["tags"] = ["parameters"]
        work = nbformat.v4.new_code_cell("from zones.core.progress import REFERENCE_FLOPS, add_flops\n"
                                         "add_flops(3 * REFERENCE_FLOPS)  # three reference forwards of work")
        nb.cells = [params, work, nbformat.v4.new_code_cell("print(n_resamples, *models)")]
        jupytext.write(nb, root / "notebooks" / f"{name}.md", fmt="md:myst")
    toc = "".join(f"  - file: book/chapters/{n}\n" for n in names)
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n{toc}")
    return root


def test_a_misspelt_chapter_parameter_is_refused_with_the_known_ones(tmp_path, monkeypatch, capsys):
    """Before: --param n_resamplez=10 was dropped silently and the chapter ran on its defaults."""
    from zones.book import declared_parameters
    from zones.cli import main

    root = _mini_project(tmp_path)
    known = sorted(declared_parameters(root / "notebooks" / "alpha_profile.md"))
    assert "n_resamples" in known
    with pytest.raises(ValueError) as err:
        build_book({"n_resamplez": 10}, only=["alpha_profile"], root=root)
    assert str(err.value) == f"unknown chapter parameter n_resamplez: the chapter alpha_profile declare {', '.join(known)}"
    monkeypatch.chdir(root)
    assert main(["book", "--only", "alpha_profile", "--param", "n_resamplez=10"]) == 1
    assert "unknown chapter parameter n_resamplez" in capsys.readouterr().err
    assert not (root / "book/chapters").exists()


def test_book_shows_chapter_progress_and_an_estimate_in_the_terminal_not_the_pages(tmp_path, capsys):
    import nbformat

    from zones.book import execute_chapters
    from zones.book.timing import last_record, last_timings

    root = _trivial_project(tmp_path)
    execute_chapters(root, ["first", "second"], {"n_resamples": 3}, models="tiny", time_reference=False)
    err = capsys.readouterr().err
    # 2 x DEFAULT_REFERENCE_FORWARDS, at REFERENCE_SECONDS_GUESS each
    assert "2 chapters at the cpu budget, about 2 min (20 reference forwards; the expected costs)" in err
    assert "chapter 2/2 second" in err and "elapsed, about" in err and "left" in err
    assert "first done in" in err and "(3 counted)" in err
    key = {"models": ["tiny"], "n_resamples": 3}
    assert set(last_timings(key)) == {"first", "second"}
    # the work each chapter's kernel counted came back through its progress file
    assert last_record(key)["chapters"]["first"]["work"] == pytest.approx(3.0)
    page = nbformat.read(root / "book/chapters/first.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in page.cells for o in c.get("outputs", []))
    assert printed.strip() == "3 tiny" and "elapsed" not in printed and "chapter 1/2" not in printed
    execute_chapters(root, ["first"], {"n_resamples": 3}, models="tiny", time_reference=False)
    assert "the last build)" in capsys.readouterr().err


def test_chapters_share_one_kernel_yet_each_starts_as_a_new_one_would(tmp_path, capsys):
    """One kernel pays the imports once; a chapter still sees no name, variable, count or random
    draw another chapter left (before: each chapter had its own kernel, so nothing leaked)."""
    import jupytext
    import nbformat

    from zones.book import execute_chapters
    from zones.book.timing import last_record

    root = _trivial_project(tmp_path)
    for name in ("first", "second"):
        nb = jupytext.read(root / "notebooks" / f"{name}.md")
        nb.cells.append(nbformat.v4.new_code_cell(
            "import os, torch\n"
            "print('pid', os.getpid())\n"
            "print('left', 'leftover' in globals(), os.environ.get('ZONES_LEFTOVER'))\n"
            "print('draw', float(torch.rand(1)))\n"
            "leftover = 1\nos.environ['ZONES_LEFTOVER'] = '1'"))
        jupytext.write(nb, root / "notebooks" / f"{name}.md", fmt="md:myst")
    execute_chapters(root, ["first", "second"], {"n_resamples": 3}, models="tiny", time_reference=False)
    pages = {}
    for name in ("first", "second"):
        page = nbformat.read(root / "book/chapters" / f"{name}.ipynb", as_version=4)
        printed = "".join(o.get("text", "") for c in page.cells for o in c.get("outputs", []))
        pages[name] = dict(line.split(" ", 1) for line in printed.splitlines() if line.split(" ")[0] in
                           ("pid", "left", "draw"))
        counts = [c.execution_count for c in page.cells if c.cell_type == "code"]
        assert counts == list(range(1, len(counts) + 1))   # numbered as a new kernel numbers them
    assert pages["first"]["pid"] == pages["second"]["pid"]           # one kernel
    assert pages["second"]["left"] == "False None"                   # no name, no variable left
    assert pages["second"]["draw"] == pages["first"]["draw"]         # torch's random state of a new process
    chapters = last_record({"models": ["tiny"], "n_resamples": 3})["chapters"]
    assert chapters["second"]["work"] == pytest.approx(3.0)          # its own work, not both chapters'


def test_a_kernel_restarted_after_a_failure_is_a_new_process():
    from zones.kernel import ChapterKernel

    with ChapterKernel() as kernel:
        first = kernel.manager.provisioner.pid
        kernel.restart()
        assert kernel.manager.has_kernel and kernel.manager.provisioner.pid != first
        manager = kernel.manager
    assert not manager.has_kernel   # shut down on leaving



def test_code_the_kernel_runs_between_chapters_raises_and_the_kernel_goes_on():
    """Between chapters the kernel runs its own lines on one kept shell client (a NotebookClient
    each time cost ~0.2 s, twice a chapter): an exception there is an error naming it, and the
    kernel, the same process, goes on."""
    from zones.kernel import ChapterKernel, KernelCodeError

    with ChapterKernel() as kernel:
        kernel._run("kept = 41")
        with pytest.raises(KernelCodeError, match="ZeroDivisionError"):
            kernel._run("1/0")
        kernel._run("assert kept == 41")
        with pytest.raises(KernelCodeError, match="AssertionError"):
            kernel._run("assert kept == 0")


def test_a_chapter_is_written_once_at_its_end_not_after_every_cell(tmp_path, monkeypatch):
    """papermill rewrote the whole notebook (outputs and all) at every cell's start and end, ~0.5 s
    a chapter; now the running copy is made at the start and the executed notebook written once."""
    import nbformat
    import papermill.engines
    import papermill.execute

    from zones.book import run_notebook

    writes = []
    for module in (papermill.engines, papermill.execute):
        monkeypatch.setattr(module, "write_ipynb",
                            lambda nb, path, _write=module.write_ipynb, **kw: (writes.append(path), _write(nb, path, **kw)))
    source = _trivial_project(tmp_path) / "notebooks" / "first.md"
    target = tmp_path / "first.ipynb"
    run_notebook(source, target, {"models": ["tiny"]})
    assert writes == [str(target)]
    printed = "".join(o.get("text", "") for c in nbformat.read(target, as_version=4).cells for o in c.get("outputs", []))
    assert "1 tiny" in printed


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_chapters_in_a_shared_kernel_leave_no_descriptors_open(tmp_path):
    """Each chapter's kernel clients are closed after it. Before: nbclient left the client of a kernel
    it did not own open, about 36 descriptors a chapter, and the CI run of 5 Dec ran past select()'s 1,024.
    A closed client's sockets are released by zmq's own thread a moment later (one CI run of 7 Dec
    counted 12 more once, [40, 41, 43, 41, 53]), so each count is the fewest seen over a second."""
    import os
    import time

    from zones.book import run_notebook
    from zones.kernel import ChapterKernel

    def descriptors() -> int:
        counts = []
        for _ in range(20):
            counts.append(len(os.listdir("/proc/self/fd")))
            time.sleep(0.05)
        return min(counts)

    source = _trivial_project(tmp_path) / "notebooks" / "first.md"
    opened = []
    with ChapterKernel() as kernel:
        for i in range(5):
            kernel.prepare({}, tmp_path)
            run_notebook(source, tmp_path / f"run{i}.ipynb", {"models": ["tiny"]}, kernel=kernel)
            kernel.finish()
            opened.append(descriptors())
    assert opened[-1] - opened[1] < 12, opened   # from the second chapter on (the first opens what stays)


def test_a_build_times_the_reference_forward_again_at_the_end_and_states_the_overhead_on_both(
        tmp_path, monkeypatch, capsys):
    """The unit moves with the machine (13% between two builds of 6 Dec): the build times it before
    and after the chapters, records both and gives the overhead on each. Before: only before."""
    import zones.book.execute as execute
    from zones.book import execute_chapters
    from zones.book.timing import last_record, overhead_line

    timings = iter([2.0, 3.0])
    monkeypatch.setattr(execute, "time_unit", lambda kernel, repeats=2: next(timings))
    root = _trivial_project(tmp_path)
    execute_chapters(root, ["first", "second"], {"n_resamples": 5}, models="tiny", progress=False)
    record = last_record({"models": ["tiny"], "n_resamples": 5})
    assert record["reference_seconds"] == 2.0 and record["reference_seconds_end"] == 3.0
    seconds = sum(record["chapters"][n]["seconds"] for n in ("first", "second"))
    line = overhead_line(seconds, 6.0, 2.0, 3.0, 6.0 * 2.0)   # short chapters: the unit timed before them
    assert line in capsys.readouterr().out
    assert f"{seconds / (6.0 * 2.5):.2f}× on the mean reference forward" in line
    assert f"{seconds / 12.0:.2f}× on the one before the chapters (2.00 s)" in line
    assert f"{seconds / 18.0:.2f}× on the one after them (3.00 s)" in line
    assert overhead_line(10.0, 0.0, 2.0, 3.0).endswith("counted 0.0 RF of work")
    assert overhead_line(12.0, 2.0, 2.0, None).endswith("overhead 3.00× (a reference forward: 2.00 s)")

def test_a_long_chapter_is_weighed_on_the_reference_forwards_timed_around_it(tmp_path, monkeypatch, capsys):
    """Issue 37: the reference forward took 4.16 s before one build's chapters and 3.12 s after
    them, so one unit for every chapter reads an overhead the chapters did not have. A chapter
    expected to be long is followed by one more timing, and its unit is the mean of the timings
    around it, the fastest of two (a first forward after a chapter took 5.62 s, against 2.58 s
    before it). Before: every chapter had the unit timed at the start, then one forward after it."""
    import zones.book.execute as execute
    from zones.book import execute_chapters
    from zones.book.timing import last_record, overhead_line

    timings = iter([2.0, 4.0, 3.0, 5.0])   # before the chapters, after each of the two, at the end
    calls = []

    def timed(kernel, repeats=2):
        calls.append(repeats)
        return next(timings)

    monkeypatch.setattr(execute, "time_unit", timed)
    monkeypatch.setattr(execute, "REFERENCE_AROUND_SECONDS", 0.0)   # every chapter counts as long
    root = _trivial_project(tmp_path)
    execute_chapters(root, ["first", "second"], {"n_resamples": 6}, models="tiny", progress=False)
    assert calls == [2, 2, 2, 2]
    record = last_record({"models": ["tiny"], "n_resamples": 6})
    chapters = record["chapters"]
    assert [chapters[n]["reference_seconds"] for n in ("first", "second")] == [3.0, 3.5]
    assert record["reference_seconds"] == 2.0 and record["reference_seconds_end"] == 5.0
    seconds = sum(chapters[n]["seconds"] for n in ("first", "second"))
    around = sum(chapters[n]["work"] * chapters[n]["reference_seconds"] for n in ("first", "second"))
    line = overhead_line(seconds, 6.0, 2.0, 5.0, around)
    assert line in capsys.readouterr().out
    assert f"overhead {seconds / around:.2f}× on the reference forwards timed around each chapter" in line


def test_the_unit_is_timed_in_the_kernel_the_chapters_run_in(tmp_path, monkeypatch):
    """The same forward runs a few per cent faster or slower from one process to another (five
    fresh processes: 2.28-2.51 s), and two builds of one commit read overheads of 1.26x and 1.41x
    on units timed in the build's own process while their chapters took the same seconds. The unit
    is now timed in the chapters' kernel: before every chapter and after the last, each time in
    the kernel that runs the chapters. Before: in the process of ``zones book``."""
    import zones.book.execute as execute
    from zones.book import execute_chapters

    seen = []

    def timed(kernel, repeats=2):
        kernel._run("import os\n"
                    f"open({str(tmp_path / 'unit.pid')!r}, 'a').write(str(os.getpid()) + '\\n')")
        seen.append(kernel)
        return 2.0

    monkeypatch.setattr(execute, "time_unit", timed)
    monkeypatch.setattr(execute, "REFERENCE_AROUND_SECONDS", 0.0)   # every chapter counts as long
    root = _trivial_project(tmp_path)
    execute_chapters(root, ["first", "second"], {"n_resamples": 7}, models="tiny", progress=False)
    units = (tmp_path / "unit.pid").read_text().split()
    assert len(units) == 4 and len(set(units)) == 1 and units[0] != str(os.getpid())
    assert all(kernel is seen[0] for kernel in seen)


def test_a_kernel_times_a_reference_forward_in_its_own_process():
    from zones.kernel import ChapterKernel

    with ChapterKernel() as kernel:
        seconds = kernel.reference_forward_seconds(repeats=1)
    assert isinstance(seconds, float) and 0 < seconds < 600


def test_a_damaged_timings_record_only_costs_the_estimate(capsys):
    from zones.book.estimate import DEFAULT_REFERENCE_FORWARDS, EXPECTED_REFERENCE_FORWARDS, chapter_costs
    from zones.book.timing import _store_timing, _timings_entry, last_record, last_timings

    params = {"case": "damaged timings"}
    _store_timing(params, "pruning", 12.0)
    assert last_timings(params) == {"pruning": 12.0}
    costs = chapter_costs(["pruning", "claims", "new"], params)
    # seconds without a reference forward are read at REFERENCE_SECONDS_GUESS; the others are guesses
    assert {k: v["reference_forwards"] for k, v in costs.items()} == {"pruning": 2.4, "claims": EXPECTED_REFERENCE_FORWARDS["cpu"]["claims"],
                                                                  "new": DEFAULT_REFERENCE_FORWARDS}
    _store_timing(params, "healing", 10.0, reference=2.0, work=4.0)
    assert last_record(params)["chapters"]["healing"] == dict(seconds=10.0, reference_forwards=5.0, work=4.0,
                                                          reference_seconds=2.0)
    assert last_record(params)["reference_seconds"] == 2.0 and "bf16" in last_record(params)["machine"]
    assert chapter_costs(["pruning"], params)["pruning"]["reference_forwards"] == pytest.approx(6.0)  # 12 s / 2 s
    path, _ = _timings_entry(params)
    path.write_text('{"pruning": 1200.0}')
    assert last_timings(params) == {}
    assert f"cache entry {path} is damaged" in capsys.readouterr().err


def test_the_estimate_moves_with_the_work_a_running_chapter_counts():
    from zones.book.estimate import Estimate
    from zones.core.progress import RUNNING_CAP

    costs = {"a": dict(reference_forwards=10.0, work=5.0), "b": dict(reference_forwards=30.0, work=30.0)}
    estimate = Estimate(costs, reference=2.0)
    assert estimate.total == 40 and estimate.seconds_left(0) == 80  # 40 reference forwards of 2 s
    assert estimate.position("a", work=2.5) == 5  # half its counted work: half its cost
    assert estimate.position("a", work=50) == RUNNING_CAP * 10  # never done before it ends
    estimate.finish("a", seconds=40.0)  # it took twice the reference's pace: so will the rest
    assert estimate.position() == 10 and estimate.seconds_per_forward() == 4.0
    assert estimate.seconds_left(estimate.position("b", work=15)) == 15 * 4.0


def test_the_estimate_knows_its_budget_and_the_chapters_run():
    """Before: `zones book --only pruning --budget class` quoted the cpu budget's 85 reference forwards."""
    from zones.book.estimate import EXPECTED_REFERENCE_FORWARDS, book_costs, opening_line

    root = Path(__file__).resolve().parents[1]
    cpu = book_costs(root, ["pruning"], budget="cpu")["pruning"]
    small = book_costs(root, ["pruning"], budget="class")["pruning"]
    assert cpu["reference_forwards"] == EXPECTED_REFERENCE_FORWARDS["cpu"]["pruning"]
    assert small["estimated"] and 0 < small["reference_forwards"] < cpu["reference_forwards"]
    line = opening_line(["pruning"], {"pruning": small}, "class", 5.0, "the expected costs")
    assert line.startswith("zones book: 1 chapter at the class budget, about ")
    assert f"({small['reference_forwards']:.0f} reference forwards" in line
    # a larger --param scales it the other way; a whole split (the gpu budget's ablation) has no estimate
    more = book_costs(root, ["pruning"], {"eval_tokens": 4080}, budget="cpu")["pruning"]
    assert more["reference_forwards"] > cpu["reference_forwards"]
    gpu = book_costs(root, ["layer_ablation", "pruning"], budget="gpu")
    assert not gpu["layer_ablation"]["estimated"] and gpu["pruning"]["estimated"]
    line = opening_line(["layer_ablation", "pruning"], gpu, "gpu", 5.0, "the expected costs")
    assert "at the gpu budget" in line and line.endswith("no estimate for layer_ablation (not measured at this budget)")
    assert f"({gpu['pruning']['reference_forwards']:.0f} reference forwards" in line


def test_budget_scale_weighs_the_token_parameters():
    from zones.book import budget_scale

    declared = dict.fromkeys(["eval_tokens", "calibration_tokens", "seeds"])  # pruning's: 2040 and 510 at cpu
    assert budget_scale("pruning", declared, {}) == 1.0
    assert budget_scale("pruning", declared, {"eval_tokens": 510, "calibration_tokens": 0}) is None  # whole split
    assert budget_scale("pruning", declared, {"eval_tokens": 504, "calibration_tokens": 126}) == \
        pytest.approx(630 / 2550)
    assert budget_scale("pruning", {"seeds": None}, {"seeds": 1}) == 1.0  # no token budget to scale by


def test_a_chapter_with_no_estimate_is_not_timed():
    from zones.book.estimate import Estimate

    costs = {"a": dict(reference_forwards=10.0, work=10.0), "b": dict(reference_forwards=30.0, work=30.0, estimated=False)}
    estimate = Estimate(costs, reference=2.0)
    assert estimate.total == 40 and estimate.seconds_left(0) == 20 and estimate.unknown == {"b"}
    estimate.finish("a", seconds=20.0)
    estimate.finish("b", seconds=60.0)
    assert estimate.unknown == set() and estimate.seconds_left(40) == 0


def test_bench_book_shows_each_chapters_overhead_over_its_counted_work():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_book.py"
    spec = importlib.util.spec_from_file_location("bench_book", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    timed = {"a": dict(seconds=30.0, work=5.0, cpu=29.0), "b": dict(seconds=4.0, work=0.0, cpu=4.0)}
    rows = bench.chapter_table(timed, reference=2.0, expected={"a": 12.0})
    assert rows[0] == dict(chapter="a", seconds=30.0, forwards=15.0, work=5.0, overhead=3.0, cpu=29.0, expected=12.0)
    assert rows[1]["overhead"] is None and rows[1]["expected"] is None  # nothing counted, no estimate


def test_bench_book_runs_a_chapter_that_reads_the_project(tmp_path, monkeypatch):
    """bench_book ran each chapter in a bare temporary folder, where the teaching chapter's
    ``project_root()`` found no ``_toc.yml`` and a whole-book benchmark stopped there."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_book.py"
    spec = importlib.util.spec_from_file_location("bench_book", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    root = Path(__file__).resolve().parents[1]
    timed = bench.time_chapters(["teaching"], root, budget="class")
    assert timed["teaching"]["seconds"] > 0


def test_every_assignment_in_a_parameters_cell_is_a_parameter_papermill_sees():
    """papermill skips a line it cannot parse (a ';' in its comment, say) with only a log line:
    the parameter would then be unknown to `zones book --param` and to papermill's injection."""
    import ast

    import jupytext

    from zones.book import chapter_source, declared_parameters

    root = Path(__file__).resolve().parents[1]
    for name in chapters(root):
        source = chapter_source(root, name)
        cells = [c for c in jupytext.read(source).cells if "parameters" in c.metadata.get("tags", [])]
        assigned = {t.id for node in ast.parse(cells[0].source).body if isinstance(node, ast.Assign)
                    for t in node.targets if isinstance(t, ast.Name)}
        assert assigned == set(declared_parameters(source)), f"{source}: papermill misses some parameters"


# --- parameters, models and budgets: checked before any chapter runs ---------------------------------

def _chapter_project(tmp_path: Path, params: str, body: str, name: str = "chapter") -> Path:
    """A one-chapter project: a title, a parameters cell ``params`` and a cell ``body``."""
    import jupytext
    import nbformat

    root = tmp_path / "project"
    (root / "notebooks").mkdir(parents=True)
    (root / "book").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cell = nbformat.v4.new_code_cell(params)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# A chapter"), cell, nbformat.v4.new_code_cell(body)]
    jupytext.write(nb, root / "notebooks" / f"{name}.md", fmt="md:myst")
    (root / "_toc.yml").write_text(f"format: jb-book\nroot: book/intro\nchapters:\n  - file: book/chapters/{name}\n")
    return root


@pytest.mark.parametrize("param, message", [
    ("eval_tokens=abc", "zones book: error: parameter eval_tokens must be a number of tokens (an integer >= 1), "
                        "or None or 0 for the whole split; got 'abc'"),
    ("models=[bad", "zones book: error: parameter models: '[bad' is not a value"),
    ("seeds=[0, 1]", "zones book: error: parameter seeds must be an integer >= 1 or None; got [0, 1]"),
    ("eval_tokenz=10", "zones book: error: unknown chapter parameter eval_tokenz: the chapter chapter declare "
                       "eval_tokens, models, seeds"),
])
def test_a_bad_param_fails_at_once_in_one_line_naming_it(tmp_path, monkeypatch, capsys, param, message):
    root = _chapter_project(tmp_path, "eval_tokens = 6120\nmodels = ['smollm2-135m']\nseeds = 8",
                            "raise RuntimeError('the chapter ran')")
    monkeypatch.chdir(root)
    assert main_book(["--param", param]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err, err
    assert not (root / "book/chapters").exists()  # nothing ran


def main_book(argv: list[str]) -> int:
    from zones.cli import main

    return main(["book", *argv])


def test_models_and_model_are_one_list_and_exclusive(capsys):
    from zones.cli import parse_args

    assert parse_args(["book", "--models", "a,b"]).models == ["a", "b"]
    assert parse_args(["book", "--model", "m"]).model == "m"
    with pytest.raises(SystemExit):
        parse_args(["book", "--models", "a,b", "--model", "m"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_failing_chapter_is_its_exceptions_one_line_with_the_book_parameter(tmp_path, monkeypatch, capsys):
    root = _chapter_project(tmp_path, "seq_len = 256", "raise ValueError(f'--seq-len {seq_len} exceeds the model\\'s "
                            "128 positions (max_position_embeddings); pass --seq-len 128 or less')")
    monkeypatch.chdir(root)
    assert main_book([]) == 1
    stderr = capsys.readouterr().err
    err = stderr.strip().splitlines()[-1]  # the lines above are the progress bar's
    assert "raise ValueError" not in stderr  # not the cell's source
    assert err.startswith("zones book: error: chapter chapter failed: ValueError: --param seq_len=256 exceeds the "
                          "model's 128 positions (max_position_embeddings); pass --param seq_len=128 or less "
                          "(the executed copy, with its traceback: "), err


def test_a_budget_gives_each_chapter_its_values_and_says_so_at_the_top_of_the_page(tmp_path):
    import nbformat

    from zones.book.parameters import BUDGET_NOTES, chapter_values

    root = _chapter_project(tmp_path, "eval_tokens = 2040\nseeds = 2\nk_max = 8",
                            "print(eval_tokens, seeds, k_max)", name="pruning")
    from zones.book import execute_chapters

    execute_chapters(root, ["pruning"], {"k_max": 3}, budget="class", progress=False)
    page = nbformat.read(root / "book/chapters/pruning.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in page.cells for o in c.get("outputs", []))
    assert printed.split() == ["504", "2", "3"]  # the class budget's values (its seeds are the cpu value); an explicit parameter wins
    assert page.cells[0].source == "# A chapter" and page.cells[1].source == BUDGET_NOTES["class"]
    assert "class build" in BUDGET_NOTES["class"] and "intervals are wider" in BUDGET_NOTES["class"]
    execute_chapters(root, ["pruning"], budget="cpu", progress=False)  # the default: the notebook's own values
    page = nbformat.read(root / "book/chapters/pruning.ipynb", as_version=4)
    assert "".join(o.get("text", "") for c in page.cells for o in c.get("outputs", [])).split() == ["2040", "2", "8"]
    assert not any("class build" in c.source for c in page.cells)
    assert chapter_values("pruning", {"eval_tokens": 6120}, "gpu", {"models": ["m"]}, {}) == {"eval_tokens": 16320}


def test_lab_copies_carry_the_budgets_values_and_keep_a_students_edits(tmp_path, capsys):
    import nbformat

    from zones.book import lab_folder

    root = _chapter_project(tmp_path, "eval_tokens = 3060\nseeds = 8", "print(eval_tokens)", name="pruning")
    folder = lab_folder(root, "class")
    nb = nbformat.read(folder / "pruning.ipynb", as_version=4)
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "eval_tokens = 504" in injected[0].source
    assert "class build" in nb.cells[1].source
    (folder / "pruning.ipynb").write_text((folder / "pruning.ipynb").read_text().replace("= 504", "= 2032"))
    lab_folder(root, "class")
    assert "2032" in (folder / "pruning.ipynb").read_text() and "kept" in capsys.readouterr().err
    with pytest.raises(ValueError, match="parameter budget must be a string from class, cpu, gpu; got 'laptop'"):
        lab_folder(root, "laptop")


@pytest.mark.slow
def test_only_on_a_fresh_project_builds_with_pages_for_the_chapters_not_run(tmp_path, tiny_model_dir):
    root = copy_project(tmp_path / "project", ["alpha_profile", "layer_ablation"], root=ROOT)
    index = build_book({"models": [str(tiny_model_dir)]}, only=["alpha_profile"], root=root)
    assert index.exists()
    page = re.sub(r"<[^>]+>", "", (root / "book/_build/html/book/chapters/layer_ablation.html").read_text())
    assert "has not been executed in this build" in page and "zones book --only layer_ablation" in page
    assert not (root / "book/chapters/results/layer_ablation").exists()  # nothing was computed for it


def test_the_opening_estimate_says_scaled_only_where_the_budget_was_not_measured(tmp_path, monkeypatch):
    """Before: a class build said its estimate was "scaled from the cpu budget by tokens" while it
    used the class budget's own measured costs."""
    from zones.book.estimate import estimate_source

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path))  # no last build
    key = {"budget": "class"}
    assert estimate_source(["pruning", "sublayers"], "class", key) == "the expected costs"
    assert estimate_source(["pruning"], "cpu", {}) == "the expected costs"
    assert estimate_source(["pruning"], "gpu", {"budget": "gpu"}) == \
        "the expected costs, scaled from the cpu budget by tokens"
