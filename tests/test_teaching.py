"""The teachers' page: chapter times read back from the book's own timing record, never typed."""
from __future__ import annotations

import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_class_times_come_from_the_last_class_build_record(tmp_path, capsys):
    from zones.book.timing import _store_timing, _timings_entry
    from zones.report import teaching

    class_build = {"budget": "class", "models": ["tiny-for-teaching"]}
    _store_timing({"models": ["tiny-for-teaching"]}, "primer", 99.0)          # a default (cpu) build
    _store_timing(class_build, "primer", 12.0)
    _store_timing(class_build, "alpha_profile", 30.0)
    record = teaching.budget_record("class")
    assert record["parameters"]["budget"] == "class"
    assert record["timings"] == {"primer": 12.0, "alpha_profile": 30.0}
    assert teaching.budget_record("cpu")["timings"]["primer"] == 99.0
    assert teaching.budget_record("gpu") is None

    result = teaching.run(timed_budget="class", chapters=["primer", "alpha_profile", "pruning"],
                          out_dir=str(tmp_path / "out"))
    assert result.numbers["times_text"] == ("The 2 measured chapters took 0.700 minutes together; the longest was "
                                            "alpha_profile. Chapters the record does not hold: pruning.")
    times = teaching.chapter_times(record["timings"], ["primer", "alpha_profile", "pruning"])
    assert times["chapter"].tolist() == ["primer", "alpha_profile", "pruning"]
    assert times["seconds"].iloc[:2].tolist() == [12.0, 30.0] and math.isnan(times["seconds"].iloc[2])
    assert times["share"].iloc[:2].sum() == 1.0

    # a damaged record is reported and left out, never read
    path, _ = _timings_entry(class_build)
    path.write_text('{"primer": 1.0}')
    assert all(r["path"] != str(path) for r in teaching.timing_records())
    assert f"{path}" in capsys.readouterr().err


def test_teaching_page_says_when_a_budget_was_never_measured(tmp_path, monkeypatch):
    from zones.report import teaching

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "empty-cache"))   # no build of any budget recorded

    result = teaching.run(timed_budget="gpu", chapters=["primer", "pruning"], out_dir=str(tmp_path / "out"))
    assert result.numbers["measured"] is False and "not measured on this machine" in result.numbers["status"]
    assert result.numbers["not_measured"] == "primer, pruning" and "Build the book once" in result.numbers["times_text"]
    assert result["times"]["seconds"].isna().all()
    assert (tmp_path / "out" / "times.csv").exists()


def test_teaching_chapter_executes_where_the_book_runs_it(tmp_path, monkeypatch):
    import pandas as pd

    from zones.book import chapter_source, copy_project, run_notebook

    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    root = copy_project(tmp_path / "project", ["primer", "teaching"], root=ROOT)
    folder = root / "book" / "chapters"
    folder.mkdir(parents=True)
    run_notebook(chapter_source(root, "teaching"), folder / "teaching.ipynb", {}, cwd=folder)
    times = pd.read_csv(folder / "results" / "teaching" / "times.csv")
    assert times["chapter"].tolist()[:2] == ["primer", "teaching"]  # the book's chapters, in its order


def test_without_a_class_build_the_page_shows_the_last_builds_measured_times(tmp_path, monkeypatch):
    # a default book builds no class budget: the page showed "n/a" in every cell; it now shows the
    # measured times of the build it belongs to, and says which budget they are
    from zones.book.timing import _store_timing
    from zones.report import teaching

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))   # only this test's build is recorded

    _store_timing({"models": ["tiny-for-teaching"]}, "primer", 60.0)
    result = teaching.run(timed_budget="class", chapters=["primer"], out_dir=str(tmp_path / "out"))
    assert result.numbers["measured"] is True and result["times"]["seconds"].tolist() == [60.0]
    assert "no class build is recorded here" in result.numbers["status"] and result.numbers["budget"] == "cpu"


def test_a_chapter_without_a_time_says_why_and_the_columns_name_the_budget(tmp_path, monkeypatch):
    from zones.book import chapters, execution_order
    from zones.book.timing import _store_timing
    from zones.report import teaching

    assert execution_order(chapters(ROOT))[-1] == teaching.PAGE   # every other chapter is timed when it runs
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    _store_timing({"models": ["tiny-for-teaching"]}, "primer", 60.0)
    result = teaching.run(timed_budget="class", chapters=["primer", "claims", "across_models", "teaching", "pruning"],
                          out_dir=str(tmp_path / "out"))
    notes = dict(zip(result["times"]["chapter"], result["times"]["note"]))
    assert notes["primer"] == "" and notes["teaching"].startswith("this page")
    assert notes["claims"].startswith("not measured") and notes["across_models"] == notes["claims"]
    assert notes["pruning"].startswith("not measured")
    _store_timing({"models": ["tiny-for-teaching"]}, "teaching", 2.0)   # an earlier build timed this page
    again = teaching.run(timed_budget="class", chapters=["primer", "teaching"], out_dir=str(tmp_path / "out"))
    assert again["times"]["seconds"].tolist() == [60.0, 2.0] and set(again["times"]["note"]) == {""}
    shown = result["times_shown"]   # a cpu build's times under a page that asked for class: labelled cpu
    assert "seconds (cpu budget)" in shown.columns and "seconds" not in shown.columns


def test_the_teaching_table_names_every_chapter():
    import re

    from zones.book import chapters

    page = (ROOT / "notebooks" / "teaching.md").read_text()
    rows = [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ") and "---" not in line][1:]
    titles = []
    for name in chapters(ROOT):
        source = ROOT / "notebooks" / f"{name}.md"
        if name == "teaching" or not source.exists():
            continue
        titles.append(re.search(r"^# (.+)$", source.read_text(), re.M).group(1).strip())
    missing = [t for t in titles if t not in rows]
    assert missing == [], f"chapters the teachers' table leaves out: {missing}"
