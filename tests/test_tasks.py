"""Zero-shot tasks through lm-evaluation-harness: zones' offline tasks, the check against zones'
own loss, pruned and healed models, exported directories, the standard tasks offline, and the
task_accuracy chapter's statistics and verdict."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import tiny_model

from zones.analysis.accuracy import ACCURACY_COLUMNS, DIFFERENCE_COLUMNS
from zones.analysis.paired import mcnemar_exact
from zones.measure.tasks import (
    OFFLINE_DIR,
    OFFLINE_TASKS,
    TaskDataError,
    TaskError,
    check_tasks,
    evaluate_tasks,
    loglik_agreement,
    paired_differences,
    read_manifest,
    task_rows,
)
from zones.measure.tasks.build import HeldOut, make_examples

pytest.importorskip("lm_eval")
ROOT = Path(__file__).resolve().parents[1]
OFFLINE_ENV = dict(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1")


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    for name, value in OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)


# --- the shipped data ----------------------------------------------------------------------------

def test_shipped_tasks_hold_500_four_way_examples_with_one_true_answer():
    for task in OFFLINE_TASKS:
        rows = task_rows(task)
        assert len(rows) == 500
        assert [r["id"] for r in rows] == list(range(500))
        for r in rows:
            assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4 and 0 <= r["label"] < 4
            assert r["context"].strip()
        labels = np.bincount([r["label"] for r in rows], minlength=4)
        assert labels.min() > 80  # the answer's position is shuffled, not always first


def test_a_damaged_data_file_is_one_error_line_naming_it(tmp_path):
    folder = tmp_path / "offline"
    shutil.copytree(OFFLINE_DIR, folder)
    path = folder / "next_sentence.jsonl"
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(TaskDataError, match="next_sentence.jsonl is damaged or edited.*python -m zones"):
        task_rows("zones_next_sentence", folder)
    (folder / "next_line.jsonl").unlink()
    with pytest.raises(TaskDataError, match="next_line.jsonl is missing"):
        task_rows("zones_next_line", folder)
    with pytest.raises(TaskDataError, match="unknown offline task"):
        task_rows("zones_next_word", folder)


@pytest.mark.slow
def test_the_builder_reproduces_the_shipped_files_bit_for_bit():
    import platform

    from zones.core.models import DEFAULT_MODEL, load_model
    from zones.measure.tasks.build import build

    manifest = read_manifest()
    if manifest["python"] != platform.python_version():
        pytest.skip(f"the files were built from Python {manifest['python']}'s standard library; this is "
                    f"{platform.python_version()}, whose corpus differs")
    files = build(load_model(DEFAULT_MODEL, device="cpu").tokenizer, tokenizer_name=DEFAULT_MODEL)
    assert set(files) == {p.name for p in OFFLINE_DIR.iterdir() if p.suffix in (".jsonl", ".json")}
    for name, data in files.items():
        assert data == (OFFLINE_DIR / name).read_bytes(), f"{name} differs from the shipped file"


def test_held_out_text_never_touches_a_calibration_window(tiny_tokenizer):
    from zones.core.data import corpus_windows, load_corpus

    corpus = load_corpus("stdlib")
    text = corpus.text[:60_010]
    held = HeldOut(text, tiny_tokenizer, seq_len=32)
    enc = tiny_tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = enc["offset_mapping"]
    # window 3 is calibration (every fourth), windows 0-2 and 4-6 are eval
    cal_start, cal_end = offsets[3 * 32][0], offsets[4 * 32 - 1][1]
    assert held.inside(offsets[0][0], offsets[3 * 32 - 1][1])
    assert not held.inside(cal_start, cal_end)
    assert not held.inside(cal_start - 5, cal_start + 1)   # one character inside is enough to refuse
    assert held.inside(offsets[4 * 32][0] + 1, offsets[7 * 32 - 1][1])
    assert len(offsets) % 32  # a tail after the last whole window...
    assert not held.inside(offsets[-1][0], offsets[-1][1])  # ...which belongs to no split
    # the same split as zones.core.data's windows
    windows = corpus_windows(corpus, tiny_tokenizer, 32, "calibration")
    assert windows.input_ids[0].tolist() == enc["input_ids"][3 * 32:4 * 32]


def test_examples_are_deterministic_and_distractors_come_from_other_paragraphs():
    examples = [dict(context=f"c{i}", answer=f"answer {i}", group=i, size=10 + i % 3) for i in range(40)]
    pool = [dict(text=f"pool {i}", group=i % 40, size=10 + i % 5) for i in range(200)]
    first = make_examples(examples, pool, 20, seed=0, unit="words")
    assert first == make_examples(examples, pool, 20, seed=0, unit="words")
    assert first != make_examples(examples, pool, 20, seed=1, unit="words")
    by_text = {p["text"]: p for p in pool}
    source = {e["context"]: e for e in examples}
    for row in first:
        example = source[row["context"]]
        assert row["choices"][row["label"]] == example["answer"]
        for j, choice in enumerate(row["choices"]):
            if j != row["label"]:
                assert by_text[choice]["group"] != example["group"]
                assert abs(by_text[choice]["size"] - example["size"]) <= max(2, round(0.25 * example["size"]))


# --- lm-eval on zones' models --------------------------------------------------------------------

def test_task_names_expand_the_offline_group_and_unknown_tasks_are_refused():
    from zones.measure.tasks import task_manager

    assert check_tasks("zones_offline") == list(OFFLINE_TASKS)
    assert check_tasks(" zones_next_line, zones_offline ") == ["zones_next_line", "zones_next_sentence"]
    with pytest.raises(TaskError, match="names no task"):
        check_tasks(" , ")
    with pytest.raises(TaskError, match="unknown task.*zones_next_word"):
        task_manager(["zones_next_word"], include_defaults=False)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_lm_eval_log_likelihoods_equal_zones_loss_on_the_same_tokens(family, tiny_tokenizer, one_thread):
    model = tiny_model(family, vocab=len(tiny_tokenizer))
    for task in OFFLINE_TASKS:
        found = loglik_agreement(model, tiny_tokenizer, task, n_examples=2)
        assert len(found) == 8 and (found["n_tokens"] > 0).all()
        # sums of ~100 tokens of ~-5 nats each: float32 rounding is ~1e-4 nats at most
        assert np.abs(found["difference"]).max() < 2e-3, found
        assert found["lm_eval"].std() > 1  # the choices differ, so a constant offset would show


def test_evaluate_tasks_writes_lm_evals_table_and_every_answer(tiny_tokenizer, one_thread):
    model = tiny_model("llama", vocab=len(tiny_tokenizer))
    result = evaluate_tasks(model, tiny_tokenizer, "zones_offline", limit=6, model_name="tiny", cache=False)
    assert list(result.table.columns) == ["model", "removed", "task", "metric", "value", "stderr", "n"]
    assert set(result.table["task"]) == set(OFFLINE_TASKS) and (result.table["n"] == 6).all()
    for task, part in result.examples.groupby("task"):
        assert list(part["example"]) == list(range(6))
        rows = task_rows(task)[:6]
        assert list(part["label"]) == [r["label"] for r in rows]
        # acc is the argmax of lm-eval's log-likelihoods, and the table's value is the mean of acc
        lls = [list(map(float, s.split(";"))) for s in part["logliks"]]
        assert list(part["acc"]) == [float(np.argmax(ll) == label) for ll, label in zip(lls, part["label"])]
        table = result.table[(result.table["task"] == task) & (result.table["metric"] == "acc")]
        assert table["value"].iloc[0] == pytest.approx(part["acc"].mean())


def test_offline_results_are_cached_by_the_model_and_the_data(tiny_tokenizer, one_thread, tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    model = tiny_model("llama", vocab=len(tiny_tokenizer))
    first = evaluate_tasks(model, tiny_tokenizer, "zones_next_line", limit=3, model_name="a")
    assert len(list((tmp_path / "cache" / "lm-eval-task").glob("*.parquet"))) == 1
    again = evaluate_tasks(model, tiny_tokenizer, "zones_next_line", limit=3, model_name="b")
    pd.testing.assert_frame_equal(first.examples.drop(columns="model"), again.examples.drop(columns="model"))
    other = tiny_model("llama", vocab=len(tiny_tokenizer), seed=1)
    evaluate_tasks(other, tiny_tokenizer, "zones_next_line", limit=3)
    assert len(list((tmp_path / "cache" / "lm-eval-task").glob("*.parquet"))) == 2


def test_paired_differences_match_the_mean_difference_of_answers():
    rng = np.random.default_rng(0)
    rows = []
    for removed, p in (("", 0.8), ("1", 0.5), ("2", 0.78)):
        for i in range(200):
            rows.append(dict(model="m", removed=removed, task="t", example=i, acc=float(rng.random() < p)))
    examples = pd.DataFrame(rows)
    found = paired_differences(examples, "acc").set_index("variant")
    full = examples[examples["removed"] == ""]["acc"].to_numpy()
    for removed in ("1", "2"):
        r = found.loc[f"m without block{'s' if ',' in removed else ''} {removed}"]
        assert r["reference"] == "m" and r["n"] == 200
        assert r["difference"] == pytest.approx(examples[examples["removed"] == removed]["acc"].mean() - full.mean())
        assert r["difference_low"] < r["difference"] < r["difference_high"]
    assert found.loc["m without block 1", "difference_high"] < 0          # 0.5 vs 0.8 on 200 examples: separable
    # pairing: a variant identical to the reference has a zero-width interval at 0
    same = pd.concat([examples[examples["removed"] == ""], examples[examples["removed"] == ""].assign(removed="9")])
    r = paired_differences(same, "acc").iloc[0]
    assert r["difference"] == r["difference_low"] == r["difference_high"] == 0


def test_a_healed_export_evaluated_from_its_directory_answers_like_the_model_in_memory(tiny_model_dir, tmp_path,
                                                                                      one_thread):
    from zones.core.data import corpus_windows
    from zones.core.models import load_model
    from zones.pruning.heal import export_healed, heal

    loaded = load_model(str(tiny_model_dir), device="cpu")
    calibration = corpus_windows("stdlib", loaded.tokenizer, 32, "calibration", 31 * 8)
    healed = heal(loaded.model, [1, 3], calibration, method="bridge", heal_tokens=31 * 8, progress=False, cache=False)
    out = export_healed(healed, tmp_path / "healed", tokenizer=loaded.tokenizer, source=str(tiny_model_dir))
    in_memory = evaluate_tasks(healed.model, loaded.tokenizer, "zones_offline", limit=8, cache=False)
    reloaded = load_model(str(out), device="cpu")
    from_disk = evaluate_tasks(reloaded.model, reloaded.tokenizer, "zones_offline", limit=8, cache=False)
    assert list(from_disk.examples["acc"]) == list(in_memory.examples["acc"])
    assert list(from_disk.table["value"]) == list(in_memory.table["value"])
    lls = lambda r: np.array([float(v) for s in r.examples["logliks"] for v in s.split(";")])  # noqa: E731
    np.testing.assert_allclose(lls(from_disk), lls(in_memory), atol=1e-3)
    assert not np.allclose(lls(in_memory), lls(evaluate_tasks(loaded.model, loaded.tokenizer, "zones_offline",
                                                              limit=8, cache=False)))  # healing changed the model


# --- the command ---------------------------------------------------------------------------------

def test_zones_evaluate_scores_the_model_and_its_pruned_variants_on_the_same_examples(tiny_model_dir, tmp_path,
                                                                                    capsys, one_thread):
    from zones.cli import main

    out = tmp_path / "eval"
    code = main(["evaluate", "--model", str(tiny_model_dir), "--remove", "1,2", "--strategy", "last_n", "--k", "1",
                 "--tasks",
                 "zones_next_sentence", "--limit", "5", "--device", "cpu", "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    table = pd.read_csv(out / "tasks.csv", keep_default_na=False)
    removed = list(table["removed"].astype(str).unique())
    assert removed[:2] == ["", "1,2"] and len(removed) == 3 and "," not in removed[2]  # last_n at k = 1: one block
    examples = pd.read_csv(out / "examples.csv", keep_default_na=False)
    assert len(examples) == 15
    differences = pd.read_csv(out / "differences.csv")
    assert list(differences["reference"].unique()) == [str(tiny_model_dir)]
    assert len(differences) == 2 and (differences["n"] == 5).all()
    assert "Δacc" in capsys.readouterr().out


def test_zones_evaluate_refuses_a_bad_request_in_one_line(tiny_model_dir, tmp_path, capsys):
    from zones.cli import main

    code = main(["evaluate", "--model", str(tiny_model_dir), "--strategy", "zone_aware", "--out", str(tmp_path)])
    assert code == 1
    assert "--strategy and --k go together" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # the glossary's type, checked by the parser
        main(["evaluate", "--model", str(tiny_model_dir), "--limit", "0", "--out", str(tmp_path)])
    assert stop.value.code == 2 and "--limit" in capsys.readouterr().err


def _tiny_arc_easy_cache(folder: Path) -> int:
    """The tiny local copy of ARC-Easy that a first online ``load_dataset("allenai/ai2_arc",
    "ARC-Easy")`` leaves in the ``datasets`` cache: ARC's schema, three questions."""
    from datasets.packaged_modules.json.json import Json

    rows = [dict(id="q1", question="Which of these is hot?", choices=dict(text=["ice", "fire", "snow"], label=["A", "B", "C"]),
                 answerKey="B"),
            dict(id="q2", question="What do plants need to grow?", choices=dict(text=["light", "noise"], label=["A", "B"]),
                 answerKey="A"),
            dict(id="q3", question="Which animal can fly?", choices=dict(text=["cow", "fish", "bird", "dog"],
                                                                          label=["1", "2", "3", "4"]), answerKey="3")]
    source = folder / "arc.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    builder = Json(cache_dir=str(folder / "datasets"), dataset_name="ai2_arc", config_name="ARC-Easy",
                   hash="0" * 40, data_files={s: str(source) for s in ("train", "validation", "test")})
    builder.download_and_prepare()
    prepared = folder / "datasets" / "ai2_arc"
    (config,) = prepared.iterdir()   # the builder suffixes the config with its data files' hash
    target = folder / "datasets" / "allenai___ai2_arc"
    target.mkdir()
    config.rename(target / "ARC-Easy")
    return len(rows)


def test_a_standard_task_runs_by_name_offline_on_its_local_data(tiny_model_dir, tmp_path):
    n = _tiny_arc_easy_cache(tmp_path)
    out = tmp_path / "eval"
    env = dict(os.environ, **OFFLINE_ENV, HF_DATASETS_CACHE=str(tmp_path / "datasets"),
               HF_HOME=str(tmp_path / "hf"), PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "zones", "evaluate", "--model", str(tiny_model_dir), "--tasks",
                           "arc_easy", "--device", "cpu", "--out", str(out)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(out / "tasks.csv")
    assert set(table["task"]) == {"arc_easy"} and (table["n"] == n).all()
    examples = pd.read_csv(out / "examples.csv")
    assert list(examples["label"]) == [1, 0, 2]                       # ARC's answerKey, as lm-eval reads it
    assert [len(s.split(";")) for s in examples["logliks"]] == [3, 2, 4]


def test_a_standard_task_without_its_data_offline_is_one_error_line(tiny_model_dir, tmp_path, monkeypatch, capsys):
    import datasets

    from zones.cli import main

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "empty")
    code = main(["evaluate", "--model", str(tiny_model_dir), "--tasks", "arc_easy", "--device", "cpu",
                 "--out", str(tmp_path / "eval")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1].startswith("zones evaluate: error:") and "arc_easy" in err[-1]
    assert not (tmp_path / "eval" / "tasks.csv").exists()


@pytest.mark.slow
def test_zones_evaluate_runs_offline_on_the_default_model(tmp_path, user_cache):
    env = dict(os.environ, **OFFLINE_ENV, PYTHONPATH=str(ROOT), ZONES_CACHE=str(user_cache))
    done = subprocess.run([sys.executable, "-m", "zones", "evaluate", "--model", "smollm2-135m", "--tasks",
                           "zones_next_sentence", "--limit", "50", "--out", str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=3600)  # a safety net, not a speed test
    assert done.returncode == 0, done.stderr[-2000:]
    table = pd.read_csv(tmp_path / "tasks.csv")
    acc = table[table["metric"] == "acc"].iloc[0]
    assert acc["n"] == 50 and acc["value"] > 0.25 and acc["stderr"] > 0   # above chance (one in four): 0.40 here


# --- the chapter's statistics and verdict --------------------------------------------------------

def _chapter_examples(p: dict[str, float], n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    easy = rng.random(n)   # shared per-example difficulty: what pairing cancels
    rows = []
    for removed, prob in p.items():
        for i in range(n):
            task = OFFLINE_TASKS[i % 2]
            rows.append(dict(removed=removed, task=task, example=i // 2, acc=float(easy[i] < prob)))
    return pd.DataFrame(rows)


def test_chapter_intervals_take_the_median_over_seeds_and_pair_every_difference():
    from zones.analysis.accuracy import accuracy_intervals
    from zones.report import task_accuracy as ta

    arms = pd.DataFrame([dict(strategy="zone_aware", seed=0, k=2, removed="1,2"),
                         dict(strategy="last_n_keep_last", seed=0, k=2, removed="3,4"),
                         dict(strategy="random_protected", seed=0, k=2, removed="1,3"),
                         dict(strategy="random_protected", seed=1, k=2, removed="2,4")])
    examples = _chapter_examples({"": 0.8, "1,2": 0.7, "3,4": 0.4, "1,3": 0.5, "2,4": 0.6})
    found = accuracy_intervals(examples, arms, OFFLINE_TASKS, n_resamples=500)
    acc = found["accuracy"].set_index(["strategy", "task"])
    assert acc.loc[("full", "all"), "accuracy"] == pytest.approx(examples[examples["removed"] == ""]["acc"].mean())
    assert acc.loc[("random_protected", "all"), "n_seeds"] == 2
    seeds = [examples[examples["removed"] == s]["acc"].mean() for s in ("1,3", "2,4")]
    assert acc.loc[("random_protected", "all"), "accuracy"] == pytest.approx(np.median(seeds))
    one_task = examples[(examples["removed"] == "1,2") & (examples["task"] == OFFLINE_TASKS[1])]["acc"].mean()
    assert acc.loc[("zone_aware", OFFLINE_TASKS[1]), "accuracy"] == pytest.approx(one_task)
    between = found["between"].set_index(["strategy", "reference", "task"])
    d = between.loc[("zone_aware", "last_n_keep_last", "all")]
    assert d["difference"] == pytest.approx(0.3, abs=0.05) and d["difference_low"] > 0   # pairing: separable
    versus = found["versus_full"].set_index(["strategy", "task"])
    assert versus.loc[("last_n_keep_last", "all"), "difference_high"] < 0
    verdict = ta.verdict_table(found["between"], "m", 2, "bridge").iloc[0]
    assert verdict["verdict"] == "holds" and verdict["difference"] == pytest.approx(d["difference"])
    # beside every interval of two variants that ran once, the exact McNemar test of their answers
    wide = examples.pivot_table(index="removed", columns=["task", "example"], values="acc")
    only_ours, only_last = int(((wide.loc["1,2"] == 1) & (wide.loc["3,4"] == 0)).sum()), \
        int(((wide.loc["1,2"] == 0) & (wide.loc["3,4"] == 1)).sum())
    assert (d["b"], d["c"]) == (only_ours, only_last) and d["p_exact"] < 1e-6
    assert (verdict["b"], verdict["c"]) == (only_ours, only_last) and 0 < verdict["power"] <= 1
    seeded = between.loc[("zone_aware", "random_protected", "all")]
    assert np.isnan(seeded["b"]) and np.isnan(seeded["p_exact"])   # a median over seeds has no one answer vector
    shown = ta.shown_differences(found["between"], OFFLINE_TASKS).loc["zone_aware − last_n_keep_last", "all"]
    assert f"{only_ours} vs {only_last}, p < 0.001" in shown


def test_the_task_accuracy_rule_branch_by_branch():
    from zones.report import task_accuracy as ta
    from zones.report.verdicts import score_task_accuracy

    assert score_task_accuracy(9, 1, n_examples=40) == "holds"          # p = 22/1024 = 0.021
    assert score_task_accuracy(1, 9, n_examples=40) == "does not hold"
    # the issue's case: the bootstrap interval [+0.02, +0.28] excluded 0, the exact test does not
    open_ = score_task_accuracy(7, 1, n_examples=40)
    assert open_ == "inconclusive" and open_.reason == "examples"
    assert "7 examples only zone-aware answered right, 1 only Last-N (exact McNemar p = 0.070)" in open_.detail
    assert "at 40 examples this rule says holds with probability 0.17 when the true d is +0.10" in open_.detail
    assert "0.20 of the examples are discordant" in open_.detail
    assert score_task_accuracy(5, 5, n_examples=40) == "inconclusive"   # d = 0
    assert "0.10 of the examples" in score_task_accuracy(0, 0, n_examples=40).detail  # the effect needs that many
    assert score_task_accuracy(float("nan"), 1).reason == "undefined"
    assert "McNemar" in score_task_accuracy.rule and "p < 0.05" in score_task_accuracy.rule
    # Last-N listed first: d is still zone-aware − Last-N, and b, c swap with it
    between = pd.DataFrame([dict(strategy="last_n_keep_last", reference="zone_aware", task="all", difference=0.2,
                                 difference_low=0.05, difference_high=0.35, n=80, b=18, c=2,
                                 p_exact=mcnemar_exact([1] * 18 + [0] * 2, [0] * 18 + [1] * 2).p_exact)])
    row = ta.verdict_table(between, "m", 8, "bridge").iloc[0]
    assert row["difference"] == -0.2 and (row["difference_low"], row["difference_high"]) == (-0.35, -0.05)
    assert (row["b"], row["c"], row["discordance"]) == (2, 18, 0.25)
    assert row["verdict"] == "does not hold"
    assert ta.verdict_table(between.assign(strategy="greedy"), "m", 8, "bridge").empty
    # the bootstrap interval does not decide: an interval above 0 with 7 vs 1 is inconclusive
    issue = between.assign(strategy="zone_aware", reference="last_n_keep_last", difference=0.15, difference_low=0.02,
                           difference_high=0.28, n=40, b=7, c=1, p_exact=0.0703125)
    row = ta.verdict_table(issue, "m", 8, "bridge").iloc[0]
    assert row["verdict"] == "inconclusive" and row["power"] == pytest.approx(0.1724, abs=1e-3)
    said = ta.findings(pd.DataFrame(columns=ACCURACY_COLUMNS), pd.DataFrame(columns=DIFFERENCE_COLUMNS),
                       issue, ta.verdict_table(issue, "m", 8, "bridge"))
    said_text = said["verdict_text"]
    assert "bootstrap interval [+0.02, +0.28]; the exact McNemar test, which decides: 7 examples" in said_text
    assert said["verdict_text"].endswith("p = 0.070, so the claim is inconclusive at this budget")
    assert (said["exact_b"], said["exact_c"], said["p_exact"], said["power"]) == (7, 1, "0.070", "0.17")
    assert said["power_sizes_text"].startswith("100 examples: 0.54; 200 examples: 0.88; 400 examples: 0.99")


def test_the_power_table_is_the_rules_power_at_each_budget():
    from zones.analysis.accuracy import power_rate, power_table
    from zones.analysis.paired import mcnemar_power
    from zones.report.task_accuracy import POWER_EFFECT

    table = power_table(0.2, [400, 40, 100, 40], POWER_EFFECT)
    assert list(table["n_examples"]) == [40, 100, 400]
    assert list(table["power"]) == [mcnemar_power(0.10, 0.2, n) for n in (40, 100, 400)]
    assert power_rate(1, 1, 40, POWER_EFFECT) == 0.10 and power_rate(7, 1, 40, POWER_EFFECT) == pytest.approx(0.2)


def test_the_scorecard_row_reads_the_chapters_verdict_table():
    from zones.report import claims
    from zones.report.verdicts import TASK_CLAIM

    verdict = pd.DataFrame([dict(model="m", k=8, method="bridge", difference=0.1, difference_low=0.02,
                                 difference_high=0.18, n=80, b=12, c=4, p_exact=0.0768, power_effect=0.1,
                                 verdict="inconclusive", reason="examples")])
    scores = claims.score_claims({"task_accuracy": {"verdict": verdict}})
    row = scores[scores["claim"] == TASK_CLAIM].iloc[0]
    # the bootstrap interval lies above 0, but 12 vs 4 is p = 0.077 by the exact test, which decides
    assert row["verdict"] == "inconclusive" and row["chapter"] == "task_accuracy" and "80 examples" in row["ours"]
    assert "12 vs 4 discordant, exact McNemar p = 0.077" in row["ours"] and "at 80 examples" in row["reason"]
    held = claims.score_claims({"task_accuracy": {"verdict": verdict.assign(b=14, c=2)}})
    assert held[held["claim"] == TASK_CLAIM].iloc[0]["verdict"] == "holds"
    older = claims.score_claims({"task_accuracy": {"verdict": verdict.drop(columns=["b", "c", "p_exact"])}})
    assert older[older["claim"] == TASK_CLAIM].iloc[0]["verdict"] == "inconclusive"   # no counts: undefined
    missing = claims.score_claims({})
    assert missing[missing["claim"] == TASK_CLAIM].iloc[0]["verdict"] == "not measured"


def test_the_chapter_runs_on_a_tiny_model(tiny_model_dir, tmp_path, one_thread):
    from zones.report import task_accuracy as ta

    result = ta.run(models=[str(tiny_model_dir)], seq_len=32, calibration_tokens=31 * 2, heal_tokens=31 * 4,
                    k_values=[1, 2], seeds=1, strategies=["zone_aware", "last_n_keep_last"],
                    tasks=["zones_next_sentence"], limit=6, n_resamples=200, agreement_examples=1,
                    out_dir=str(tmp_path / "out"), progress=False)
    assert set(result["accuracy"]["strategy"]) == {"full", "zone_aware", "last_n_keep_last"}
    assert (result["arms"]["k"] == 2).all()
    assert len(result["examples"]) == 3 * 6
    assert len(result["verdict"]) == 1 and result.numbers["verdict"] in ("holds", "does not hold", "inconclusive")
    verdict = result["verdict"].iloc[0]
    assert verdict["b"] + verdict["c"] <= verdict["n"] and 0 <= verdict["p_exact"] <= 1
    assert verdict["n"] in set(result["power"]["n_examples"]) and "exact McNemar" in result.numbers["verdict_text"]
    assert float(result.summary["agreement_max_nats"]) < 2e-3
    for name in ("accuracy", "versus_full", "between", "verdict", "examples", "tasks", "agreement", "power"):
        assert (tmp_path / "out" / f"{name}.csv").exists()


def test_lm_evals_forwards_are_counted_token_by_token(tiny_tokenizer, one_thread):
    """Before: task_accuracy's lm-eval requests counted no work. One request at a time (no padding),
    every request's context and answer run through the model, less the last token (lm-eval's input)."""
    from lm_eval.api.instance import Instance

    from zones.core.progress import REFERENCE_FLOPS, matmul_flops, module_weights, work_done
    from zones.measure.tasks.harness import hflm

    model = tiny_model("llama", vocab=len(tiny_tokenizer))
    lm = hflm(model, tiny_tokenizer, batch_size=1)
    pairs = [("The cat sat on the", " mat"), ("A quick brown", " fox jumps"), ("One two", " three")]
    requests = [Instance("loglikelihood", {}, pair, idx=0) for pair in pairs]
    tokens = sum(len(a) + len(b) - 1 for a, b in (lm._encode_pair(*pair) for pair in pairs))
    before = work_done()
    lm.loglikelihood(requests, disable_tqdm=True)
    expected = matmul_flops(module_weights(model), tokens) / REFERENCE_FLOPS
    assert work_done() - before == pytest.approx(expected)


def test_a_variant_is_named_in_words_so_that_a_minus_sign_means_only_a_difference():
    """Issue 53: ``zones evaluate`` printed "m − [1,3] − m: ..." (− for "without" and for "minus")."""
    from zones.measure.tasks.harness import variant_label

    assert variant_label("m", "") == "m"
    assert variant_label("m", "1") == "m without block 1" and variant_label("m", "1,3") == "m without blocks 1,3"
    assert "−" not in variant_label("m", "1,3")
