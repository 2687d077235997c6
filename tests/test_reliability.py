"""The reliability suite: what a hostile but fair user tries, on tiny models, one test per case.

A bad input ends in ONE clear line on stderr (``zones <command>: error: ...``, naming the file
or flag, the cause and the remedy), a non-zero exit, and no result file under ``--out``; a flag
that can be checked without the model is checked before it loads (the tests pass a model path
that does not exist, so a late check would name the model instead). Where the right answer is
not an error (an edited model, a rank-1 matrix, a weights-only directory for ``alpha``, a
planted pickle) the test asserts that answer instead. The cases, by promise:

- nothing lost: ``export``/``heal`` never replace a folder they did not write, nor the current
  folder; a chapter's previous result is replaced only by a finished one (a failure or
  ``kill -9`` leaves it); one ``zones book`` at a time per project; what a killed run left
  (hidden temporaries, ``*.running.ipynb``) is removed by the next run of the same command;
- nothing borrowed: a journal or checkpoint copied from another computation is refused;
  provenance records what was used, not what was asked;
- every bad value named before heavy work (blocks, budgets, ranks, learning rates, an empty
  ``.gguf``, a full disk).

Commands run in-process through ``zones.cli.main``; ``capfd`` captures the process's whole
stderr (transformers' own warnings included); progress bars are left out of the count.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from conftest import tiny_model

from zones.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = ["--seq-len", "32", "--batch-size", "4", "--device", "cpu"]


@pytest.fixture(autouse=True)
def _isolated_cache(monkeypatch, tmp_path):
    """A cache of this test's own."""
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory) -> str:
    """About 40 kB of UTF-8 English prose (standard-library docstrings)."""
    from zones.core.data import stdlib_docstrings, stdlib_files

    path = tmp_path_factory.mktemp("corpus") / "prose.txt"
    path.write_text(stdlib_docstrings(stdlib_files()[:60])[:40_000], encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer.save_pretrained(path)
    return path


def save_model(path: Path, model, tokenizer=None, edit=None) -> Path:
    """Save ``model`` (safetensors) and, if given, the tokenizer; ``edit(state)`` changes weights."""
    path.mkdir(parents=True, exist_ok=True)
    if edit is not None:
        with torch.no_grad():
            edit(dict(model.named_parameters()))
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


def fails_cleanly(capfd, argv: list[str], out: Path, *expected: str) -> str:
    """Run ``zones ARGV --out OUT``: one error line, a non-zero exit, nothing under OUT."""
    code = main([*argv, "--out", str(out)])
    err = capfd.readouterr().err
    lines = messages(err)
    assert code != 0, f"exit 0 for {argv}"
    assert len(lines) == 1 and lines[0].startswith(f"zones {argv[0]}: error: "), err
    for text in expected:
        assert text in lines[0], lines[0]
    written = [p for p in Path(out).rglob("*") if p.is_file()] if Path(out).is_dir() else []
    assert not written, f"result files written despite the error: {written}"
    return lines[0]


PROGRESS = re.compile(r"\d+/\d+ \[[\d:<?]+")  # a tqdm bar: "3/8 [00:01<00:02"


def messages(stderr: str) -> list[str]:
    """The lines of stderr that are messages, not (the redrawings of) a progress bar."""
    return [part for part in re.split(r"[\r\n]", stderr) if part.strip() and not PROGRESS.search(part)]


def ablate(model_dir, corpus, *extra) -> list[str]:
    return ["ablate", "--model", str(model_dir), "--corpus", corpus, "--eval-tokens", "124", *SEQ, *extra]


def prune(model_dir, corpus, *extra) -> list[str]:
    return ["prune", "--model", str(model_dir), "--corpus", corpus, "--strategies", "last_n,ablation_rank",
            "--k-max", "1", "--seeds", "1", "--eval-tokens", "124", "--calibration-tokens", "31", *SEQ, *extra]


def alpha(model_dir, *extra) -> list[str]:
    return ["alpha", "--model", str(model_dir), "--device", "cpu", *extra]


# --- wrong results -----------------------------------------------------------------------------------

@pytest.mark.parametrize("command, extra", [(ablate, ()), (ablate, ("--ablation-method", "naive")),
                                            (ablate, ("--parts",)),
                                            (prune, ())], ids=["ablate", "ablate-naive", "ablate-parts", "prune"])
def test_a_nan_weight_is_an_error_not_loss_zero(tmp_path, capfd, tiny_tokenizer, corpus_file, command, extra):
    def one_nan(params):
        params["model.layers.2.mlp.down_proj.weight"][3, 5] = math.nan

    model_dir = save_model(tmp_path / "nan-model", tiny_model("llama"), tiny_tokenizer, edit=one_nan)
    line = fails_cleanly(capfd, command(model_dir, corpus_file, *extra), tmp_path / "out")
    assert "finite" in line or "NaN" in line or "nan" in line


def test_editing_weights_in_place_gives_the_new_table_not_the_cached_one(tmp_path, capfd, tiny_tokenizer):
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    from zones.core.models import load_model
    from zones.spectra import alpha_table

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model_dir = save_model(tmp_path / "model", AutoModelForCausalLM.from_config(config).eval(), tiny_tokenizer)
    assert main(alpha(model_dir, "--out", str(tmp_path / "before"))) == 0
    weights = model_dir / "model.safetensors"
    state = load_file(weights)
    state["model.layers.1.mlp.down_proj.weight"][0, 1::2] *= 50.0  # elements a strided sample skips
    save_file(state, weights, metadata={"format": "pt"})
    assert main(alpha(model_dir, "--out", str(tmp_path / "after"))) == 0
    capfd.readouterr()
    before, after = (pd.read_csv(tmp_path / d / "alpha.csv") for d in ("before", "after"))
    fresh = alpha_table(load_model(str(model_dir), device="cpu").model, cache=False)
    row = (after["layer"] == 1) & (after["role"] == "mlp_down")
    assert after.loc[row, "alpha_shape"].item() == pytest.approx(fresh.loc[row, "alpha_shape"].item(), rel=1e-9)
    assert after.loc[row, "alpha_shape"].item() != pytest.approx(before.loc[row, "alpha_shape"].item(), rel=1e-6)


def test_a_rank_one_float32_matrix_is_noted_not_fitted_on_rounding_noise(tmp_path, capfd, tiny_tokenizer):
    def rank_one(params):
        q = params["model.layers.1.self_attn.q_proj.weight"]
        q.copy_(torch.outer(torch.randn(q.shape[0]), torch.randn(q.shape[1])))

    model_dir = save_model(tmp_path / "model", tiny_model("llama"), tiny_tokenizer, edit=rank_one)
    assert main(alpha(model_dir, "--out", str(tmp_path / "out"))) == 0
    assert "1 matrices have NaN estimates; see the note column" in capfd.readouterr().out
    table = pd.read_csv(tmp_path / "out" / "alpha.csv", keep_default_na=False, na_values=[""])
    row = table[(table["layer"] == 1) & (table["role"] == "q")].iloc[0]
    assert row["note"] == "rank 1"
    assert all(math.isnan(row[c]) for c in ("alpha_shape", "alpha_esd", "alpha_hill"))
    assert (table["note"].fillna("") == "").sum() == len(table) - 1


# --- security ---------------------------------------------------------------------------------------

class _Planted:
    """A pickle that creates a file when it is loaded."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_planted_checkpoint_pickle_in_the_training_cache_never_runs(tmp_path, capfd, corpus_file):
    from zones import series as train

    marker = tmp_path / "the-pickle-ran"
    sizes = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, steps=4, snapshot_every=2,
                 corpus=corpus_file)
    extra = dict(eval_every=2, eval_windows=4, checkpoint_every=2)
    config = train.series_configs("cpu", [2], **sizes, **extra)[0]
    partial = train.run_path(config)
    partial = partial.with_name(partial.name + ".partial")
    partial.mkdir(parents=True)
    torch.save({"step": 1, "payload": _Planted(marker)}, partial / "checkpoint.pt")
    argv = ["train", "--depths", "2", "--width", "32", "--head-dim", "16", "--vocab-size", "300",
            "--seq-len", "32", "--batch-size", "8", "--steps", "4", "--snapshot-every", "2",
            "--corpus", corpus_file, "--device", "cpu", "--out", str(tmp_path / "out"),
            *[f"--set={k}={v}" for k, v in extra.items()]]
    main(argv)
    capfd.readouterr()
    assert not marker.exists(), "zones train unpickled a planted checkpoint.pt (it can run any code)"


def test_a_pickle_only_model_directory_is_refused_without_unpickling(tmp_path, capfd):
    marker = tmp_path / "the-pickle-ran"
    model_dir = tmp_path / "pickled"
    model_dir.mkdir()
    tiny_model("llama").config.save_pretrained(model_dir)
    torch.save({"model.embed_tokens.weight": _Planted(marker)}, model_dir / "pytorch_model.bin")
    line = fails_cleanly(capfd, alpha(model_dir), tmp_path / "out", str(model_dir))
    assert not marker.exists(), "a pickle-only model directory was unpickled"
    assert "hub" not in line and ("pickle" in line or "safetensors" in line)


# --- models that disagree with themselves -------------------------------------------------------------

def _config_says_six_layers(model_dir: Path) -> None:
    config = json.loads((model_dir / "config.json").read_text())
    config["num_hidden_layers"] = 6
    (model_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("command", ["alpha", "ablate"])
def test_a_config_that_disagrees_with_its_weights_is_an_error(tmp_path, capfd, tiny_tokenizer, corpus_file,
                                                              command):
    model_dir = save_model(tmp_path / "model", tiny_model("llama", n_layers=4), tiny_tokenizer)
    _config_says_six_layers(model_dir)
    argv = alpha(model_dir) if command == "alpha" else ablate(model_dir, corpus_file)
    fails_cleanly(capfd, argv, tmp_path / "out", str(model_dir))


def test_bad_json_in_config_is_one_line_naming_the_file(tmp_path, capfd, tiny_tokenizer):
    model_dir = save_model(tmp_path / "model", tiny_model("llama"), tiny_tokenizer)
    (model_dir / "config.json").write_text('{"model_type": "llama", ')
    line = fails_cleanly(capfd, alpha(model_dir), tmp_path / "out", "config.json")
    assert "hub" not in line


def test_a_weights_only_directory_runs_alpha_and_asks_for_a_tokenizer_for_text(tmp_path, capfd, family,
                                                                              corpus_file, tokenizer_dir):
    model_dir = save_model(tmp_path / "weights-only", tiny_model(family))
    assert main(alpha(model_dir, "--out", str(tmp_path / "alpha"))) == 0
    assert len(pd.read_csv(tmp_path / "alpha" / "alpha.csv")) > 0
    capfd.readouterr()
    fails_cleanly(capfd, ablate(model_dir, corpus_file), tmp_path / "out", "no tokenizer", "--tokenizer")
    assert main(ablate(model_dir, corpus_file, "--tokenizer", str(tokenizer_dir), "--out",
                       str(tmp_path / "with-tokenizer"))) == 0
    assert (tmp_path / "with-tokenizer" / "ablation.csv").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_an_error(tmp_path, capfd, tiny_tokenizer, corpus_file):
    model_dir = save_model(tmp_path / "model", tiny_model("llama", vocab=64), tiny_tokenizer)
    fails_cleanly(capfd, ablate(model_dir, corpus_file), tmp_path / "out", "vocabulary")


@pytest.mark.parametrize("family", ["gpt2", "llama"])  # learned positions, and RoPE
def test_seq_len_beyond_the_model_positions_is_an_error(tmp_path, capfd, tiny_tokenizer, corpus_file, family):
    model_dir = save_model(tmp_path / "model", tiny_model(family), tiny_tokenizer)  # 256 positions
    argv = ["ablate", "--model", str(model_dir), "--corpus", corpus_file, "--seq-len", "300",
            "--eval-tokens", "299", "--batch-size", "1", "--device", "cpu"]
    fails_cleanly(capfd, argv, tmp_path / "out", "--seq-len 300", "256")


# --- damaged cache entries -----------------------------------------------------------------------------

def test_a_truncated_cached_table_is_named_not_used(tmp_path, capfd, tiny_model_dir):
    from zones.core.cache import cache_dir

    assert main(alpha(tiny_model_dir, "--out", str(tmp_path / "first"))) == 0
    capfd.readouterr()
    (cached,) = (cache_dir() / "alpha").glob("*.parquet")
    cached.write_bytes(cached.read_bytes()[:-100])
    fails_cleanly(capfd, alpha(tiny_model_dir), tmp_path / "out", str(cached), "damaged", "delete")


def test_a_truncated_cached_corpus_is_named_not_used(tmp_path, capfd, tiny_model_dir):
    from zones.core.cache import cache_dir
    from zones.core.data import load_corpus

    load_corpus("stdlib")
    (cached,) = (cache_dir() / "corpora").glob("stdlib-docstrings-*.txt")
    cached.write_bytes(cached.read_bytes()[: len(cached.read_bytes()) // 3])
    fails_cleanly(capfd, ablate(tiny_model_dir, "stdlib"), tmp_path / "out", str(cached), "delete")


def test_a_journal_row_missing_its_loss_is_named_not_used(tmp_path, capfd, tiny_model_dir, corpus_file):
    from zones.core.cache import cache_dir

    assert main(prune(tiny_model_dir, corpus_file, "--out", str(tmp_path / "first"))) == 0
    capfd.readouterr()
    journal = next((cache_dir() / "window-losses").glob("*.jsonl"))
    lines = journal.read_text().splitlines()
    row = json.loads(lines[0])
    row.pop("loss", None) or row.pop("nll", None)
    lines[0] = json.dumps(row)
    journal.write_text("\n".join(lines) + "\n")
    fails_cleanly(capfd, prune(tiny_model_dir, corpus_file), tmp_path / "out", str(journal), "line 1")


# --- corpora and the output folder ------------------------------------------------------------------------

@pytest.mark.parametrize("content, expected", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 50, "binary"),
    ("na\u00efve caf\u00e9 r\u00e9sum\u00e9 \u00e0 la carte. ".encode("latin-1") * 400, "convert it to UTF-8"),
], ids=["binary", "latin-1"])
def test_binary_and_latin1_corpora_are_errors(tmp_path, capfd, tiny_model_dir, content, expected):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    fails_cleanly(capfd, ablate(tiny_model_dir, str(corpus)), tmp_path / "out", str(corpus), expected)


@pytest.mark.parametrize("command", ["alpha", "ablate", "prune"])
def test_out_being_a_file_fails_before_any_work(tmp_path, capfd, tiny_model_dir, corpus_file, command):
    out = tmp_path / "results.csv"
    out.write_text("an earlier result\n")
    argv = {"alpha": alpha(tiny_model_dir), "ablate": ablate(tiny_model_dir, corpus_file),
            "prune": prune(tiny_model_dir, corpus_file)}[command]
    code = main([*argv, "--out", str(out)])
    lines = messages(capfd.readouterr().err)
    assert code == 1 and lines == [f"zones {command}: error: --out {out} is a file, not a folder; "
                                   f"pass a folder for the results"]
    assert out.read_text() == "an earlier result\n"


# --- nothing lost: output folders -------------------------------------------------------------------

NO_MODEL = "/nonexistent/model"  # a check that ran after loading would name this path instead


def export(model, out, *extra) -> list[str]:
    return ["export", "--model", str(model), "--device", "cpu", "--out", str(out), *extra]


def heal_cli(model, out, *extra) -> list[str]:
    return ["heal", "--model", str(model), "--device", "cpu", "--seq-len", "32", "--batch-size", "2",
            "--out", str(out), *extra]


def one_error(capfd, argv: list[str], *expected: str) -> str:
    """Run ``zones ARGV``: exit 1 (or 2, a flag's type refused by the parser) and one error line
    holding every ``expected`` text."""
    try:
        code = main(argv)
    except SystemExit as stop:  # argparse: a value that does not fit the flag's glossary type
        code = stop.code
    lines = messages(capfd.readouterr().err)
    assert code in (1, 2) and len(lines) == 1 and lines[0].startswith(f"zones {argv[0]}: error: "), lines
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("command", [export, heal_cli], ids=["export", "heal"])
def test_export_and_heal_refuse_an_out_folder_they_did_not_write(tmp_path, capfd, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "precious.txt").write_text("a user's file")
    one_error(capfd, command(NO_MODEL, out, "--remove", "1"), f"--out {out}", "zones-provenance.json")
    assert (out / "precious.txt").read_text() == "a user's file"


def test_export_replaces_its_own_previous_export_but_not_once_a_file_was_added(tmp_path, capfd, tiny_model_dir):
    out = tmp_path / "pruned"
    assert main(export(tiny_model_dir, out, "--remove", "1")) == 0
    assert main(export(tiny_model_dir, out, "--remove", "2")) == 0
    assert json.loads((out / "zones-provenance.json").read_text())["removed"] == [2]
    capfd.readouterr()
    (out / "notes.md").write_text("what I found")
    one_error(capfd, export(tiny_model_dir, out, "--remove", "3"), str(out / "notes.md"))
    assert (out / "notes.md").exists() and json.loads((out / "zones-provenance.json").read_text())["removed"] == [2]


@pytest.mark.parametrize("out", [".", ".."])
def test_export_to_the_current_folder_is_refused_before_any_work(tmp_path, capfd, monkeypatch, out):
    here = tmp_path / "a" / "b"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    one_error(capfd, export(NO_MODEL, out, "--remove", "1"), f"--out {out}", "current folder")
    assert list(here.iterdir()) == [] and sorted(p.name for p in here.parent.iterdir()) == ["b"]


def test_a_killed_exports_hidden_temporary_is_removed_by_the_next_export(tmp_path, capfd, tiny_model_dir):
    out = tmp_path / "pruned"
    from zones.core.atomic import mark_temporary

    stale = tmp_path / ".pruned.k1ll3d.tmp"  # what atomic_directory leaves when its writer is killed: marked
    stale.mkdir()
    mark_temporary(stale)
    (stale / "model.safetensors").write_bytes(b"\0" * 4096)
    assert main(export(tiny_model_dir, out, "--remove", "1")) == 0
    assert out.is_dir() and not stale.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".pruned")]


def test_a_rerun_export_keeps_a_users_folder_shaped_like_a_temporary(tmp_path, capfd, tiny_model_dir):
    """Issue 40: the clean-up removed every ``.NAME.*.tmp`` beside ``--out``, a user's backup
    ``.smolp.mybackup.tmp`` too. Only temporaries zones marked as its own are removed."""
    out = tmp_path / "smolp"
    backup = tmp_path / ".smolp.mybackup.tmp"
    backup.mkdir()
    (backup / "notes.txt").write_text("mine")
    mine = tmp_path / ".smolp.draft.tmp"
    mine.write_text("a file of mine")
    for _ in range(2):  # the first export and its rerun
        assert main(export(tiny_model_dir, out, "--remove", "1")) == 0
    assert (backup / "notes.txt").read_text() == "mine" and mine.read_text() == "a file of mine"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".smolp")) == [
        ".smolp.draft.tmp", ".smolp.mybackup.tmp"]


@pytest.fixture(scope="module")
def short_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny Llama with 16 positions (``max_position_embeddings``) and its tokenizer."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    return save_model(tmp_path_factory.mktemp("short") / "short", AutoModelForCausalLM.from_config(config).eval(),
                      tiny_tokenizer)


def test_evaluate_on_a_model_too_short_for_the_answers_is_one_line(tmp_path, capfd, short_model_dir):
    """Issue 40: ``zones evaluate`` on a model with 16 positions failed with a bare
    ``AssertionError`` (lm-eval keeps each answer whole in the window). One line names the model,
    its positions and the positions the longest answer needs."""
    pytest.importorskip("lm_eval")
    model_dir = short_model_dir
    argv = ["evaluate", "--model", str(model_dir), "--tasks", "zones_next_sentence", "--limit", "2", "--device", "cpu"]
    line = fails_cleanly(capfd, argv, tmp_path / "eval", str(model_dir), "16 positions", "at least")
    assert "AssertionError" not in line and re.search(r"longest takes (\d+) tokens", line)


def test_a_study_jobs_error_names_the_parameter_as_the_user_gave_it(tmp_path, capfd, short_model_dir):
    """Issue 40: a study job's error named ``--seq-len`` where the user passed ``--param seq_len``.
    A chapter parameter is named as the study takes it; the job's line says what to pass."""
    code = main(["study", "--models", str(short_model_dir), "--only", "layer_ablation", "--param", "seq_len=32",
                 "--param", "eval_tokens=62", "--out", str(tmp_path / "study")])
    lines = messages(capfd.readouterr().err)
    # issue 53: a seq_len beyond the model's positions is now fitted to it, said in the job's line in the
    # study's words (the parameter's name, never the flag --seq-len), and the job runs
    fitted = [line for line in lines if "fitted to its model" in line]
    assert code == 0 and fitted and "seq_len=32 → 16" in fitted[0], lines
    assert not any("--seq-len" in line for line in lines)


# --- nothing lost: the book's chapters and its one build at a time ----------------------------------

def micro_project(root: Path, body: str) -> Path:
    """A book project with one chapter ``slow`` (parameter ``seconds``, then ``body``)."""
    import jupytext
    import nbformat

    (root / "notebooks").mkdir(parents=True)
    (root / "book").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = nbformat.v4.new_code_cell("seconds = 0\nfail = False")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body)]
    jupytext.write(nb, root / "notebooks" / "slow.md", fmt="md:myst")
    (root / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n  - file: book/chapters/slow\n")
    return root


CHAPTER_BODY = """import os, pathlib, time
pathlib.Path('kernel.pid').write_text(str(os.getpid()))
pathlib.Path('started').write_text(str(seconds))
if fail:
    raise RuntimeError('the model does not exist')
time.sleep(seconds)
print('ran with', seconds)"""


def _outputs(path: Path) -> str:
    """Every output of an executed notebook, as one text."""
    return json.dumps([cell.get("outputs", []) for cell in json.loads(path.read_text())["cells"]])


def test_a_failed_chapter_keeps_the_previous_one(tmp_path):
    from zones.book import ChapterFailed, execute_chapters

    root = micro_project(tmp_path / "project", CHAPTER_BODY)
    chapter = root / "book" / "chapters" / "slow.ipynb"
    execute_chapters(root, ["slow"], {"seconds": 0}, progress=False)
    good = chapter.read_bytes()
    with pytest.raises(ChapterFailed, match="the previous slow.ipynb is kept"):
        execute_chapters(root, ["slow"], {"fail": True}, progress=False)
    assert chapter.read_bytes() == good
    assert (root / "book" / "chapters" / "slow.failed.ipynb").exists()
    assert not list((root / "book" / "chapters").glob("*.running.ipynb"))


def _wait_for(path: Path, process, what: str, limit: float = 300) -> None:
    """Wait until ``path`` exists (the process is slow to start on a busy machine, not hung)."""
    import time

    deadline = time.monotonic() + limit
    while not path.exists():
        assert process.poll() is None, f"the process ended before {what}: {process.communicate()}"
        assert time.monotonic() < deadline, f"no {what} after {limit} s"
        time.sleep(0.2)


def _kill(pid_file: Path) -> None:
    import os
    import signal

    if pid_file.exists():
        with contextlib_suppress():
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def contextlib_suppress():
    import contextlib

    return contextlib.suppress(ProcessLookupError, ValueError)


def test_kill_9_during_a_chapter_leaves_the_previous_one_and_the_next_build_cleans_up(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from zones.book import execute_chapters

    root = micro_project(tmp_path / "project", CHAPTER_BODY)
    chapters = root / "book" / "chapters"
    execute_chapters(root, ["slow"], {"seconds": 0}, progress=False)
    good = (chapters / "slow.ipynb").read_bytes()
    (chapters / "started").unlink()
    build = subprocess.Popen([sys.executable, "-m", "zones", "book", "--only", "slow", "--param", "seconds=600"],
                             cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _wait_for(chapters / "started", build, "chapter start")
        assert (chapters / "slow.running.ipynb").exists()
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
    finally:
        with contextlib_suppress():
            os.killpg(build.pid, signal.SIGKILL)
        build.wait()
        _kill(chapters / "kernel.pid")  # the kernel runs in a session of its own
    assert (chapters / "slow.ipynb").read_bytes() == good
    execute_chapters(root, ["slow"], {"seconds": 1}, progress=False)
    assert not list(chapters.glob("*.running.ipynb"))
    assert "ran with 1" in _outputs(chapters / "slow.ipynb")


def test_a_second_book_build_in_the_same_project_waits_for_the_first(tmp_path):
    import subprocess
    import sys

    body = "import pathlib\nprint('first build done:', pathlib.Path('../../released').exists())"
    root = micro_project(tmp_path / "project", body)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import pathlib, sys, time\nfrom zones.book.execute import project_lock\n"
        f"root = pathlib.Path({str(root)!r})\n"
        "with project_lock(root):\n"
        "    (root / 'locked').write_text('1')\n"
        "    while not (root / 'released').exists():\n"
        "        time.sleep(0.1)\n")], stderr=subprocess.PIPE)
    second = None
    try:
        _wait_for(root / "locked", holder, "the first build's lock")
        second = subprocess.Popen([sys.executable, "-c", (
            "import pathlib\nfrom zones.book import execute_chapters\n"
            f"execute_chapters(pathlib.Path({str(root)!r}), ['slow'], {{}}, progress=False)")],
            stderr=subprocess.PIPE, text=True)
        said = ""
        while "waiting" not in said and (line := second.stderr.readline()):
            said += line
        assert "another zones book is running" in said and "waiting for it" in said, said
        assert not (root / "book" / "chapters" / "slow.ipynb").exists()
        (root / "released").write_text("1")
        assert holder.wait() == 0
        _, err = second.communicate()
        assert second.returncode == 0, err
    finally:
        (root / "released").write_text("1")
        for process in (holder, second):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    assert "first build done: True" in _outputs(root / "book" / "chapters" / "slow.ipynb")


# --- nothing borrowed ----------------------------------------------------------------------------------

def test_a_pruning_journal_copied_from_another_models_run_is_refused(tmp_path, capfd, tiny_tokenizer, tiny_model_dir,
                                                                    corpus_file):
    from zones.core.cache import cache_dir

    other = save_model(tmp_path / "other", tiny_model("llama", n_layers=6, seed=1, vocab=len(tiny_tokenizer)),
                       tiny_tokenizer)
    assert main(prune(tiny_model_dir, corpus_file, "--out", str(tmp_path / "a"))) == 0
    journals = set((cache_dir() / "window-losses").glob("*.jsonl"))
    assert main(prune(other, corpus_file, "--out", str(tmp_path / "b"))) == 0
    capfd.readouterr()
    (mine,) = set((cache_dir() / "window-losses").glob("*.jsonl")) - journals
    (borrowed,) = journals
    mine.write_bytes(borrowed.read_bytes())  # the other model's rows under this model's key
    fails_cleanly(capfd, prune(other, corpus_file), tmp_path / "out", str(mine), "another computation", "delete")


def test_an_ablation_journal_copied_from_another_models_run_is_refused(tmp_path, tiny_tokenizer, one_thread):
    import zones.measure.ablation as ablation
    from zones.core.cache import CacheError, cache_dir
    from zones.core.data import make_windows

    windows = make_windows(np.arange(16 * 32) % 250, 32, "eval", 8 * 31)
    first, second = tiny_model("llama", seed=0), tiny_model("llama", seed=1)
    ablation.ablation_table(first, windows, batch_size=4, progress=False)
    (borrowed,) = (cache_dir() / "window-losses").glob("*.jsonl")
    ablation.ablation_table(second, windows, batch_size=4, progress=False)
    (mine,) = set((cache_dir() / "window-losses").glob("*.jsonl")) - {borrowed}
    mine.write_bytes(borrowed.read_bytes())  # the first model's rows under the second's key
    shutil.rmtree(cache_dir() / "ablation", ignore_errors=True)  # the tables: the losses are read again
    with pytest.raises(CacheError, match="another computation") as err:
        ablation.ablation_table(second, windows, batch_size=4, progress=False)
    assert str(mine) in str(err.value)


def test_a_heal_checkpoint_copied_from_another_run_is_refused(monkeypatch, one_thread):
    from test_heal import calibration

    import zones.pruning.heal as heal_module
    from zones.core.cache import CacheError, sidecar_path
    from zones.core.models import model_fingerprint

    win = calibration()
    model = tiny_model("llama", n_layers=4)
    kw = dict(method="lora", lr=1e-2, heal_tokens=6 * 2 * 23, heal_batch_size=2, save_every=2, progress=False)
    _interrupted_heal(monkeypatch, model, [1], win, kw)
    (theirs,) = sorted((heal_module.entry_path("heal-progress", {}, "pt").parent).glob("*.pt"))
    mine = heal_module.progress_path(heal_module.heal_key(
        model_fingerprint(model), [2], "lora", kw["heal_tokens"], 0, win, lr=kw["lr"], rank=8, batch_size=2))
    mine.write_bytes(theirs.read_bytes())
    sidecar_path(mine).write_bytes(sidecar_path(theirs).read_bytes())
    with pytest.raises(CacheError, match="another computation") as err:
        heal_module.heal(model, [2], win, **kw)
    assert str(sidecar_path(mine)) in str(err.value)


def _interrupted_heal(monkeypatch, model, removed, win, kw, after_steps: int = 3):
    """Run LoRA healing and kill it after ``after_steps`` optimizer steps (a checkpoint is left)."""
    real_step = torch.optim.AdamW.step
    calls = {"n": 0}

    def dying_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > after_steps:
            raise KeyboardInterrupt
        return real_step(self, *args, **kwargs)

    from zones.pruning.heal import heal

    monkeypatch.setattr(torch.optim.AdamW, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        heal(model, removed, win, **kw)
    monkeypatch.setattr(torch.optim.AdamW, "step", real_step)


def test_a_bridge_heal_records_the_tokens_it_used_not_the_budget_it_was_given(tmp_path, capfd, tiny_model_dir,
                                                                                 corpus_file):
    out = tmp_path / "healed"
    assert main(heal_cli(tiny_model_dir, out, "--remove", "2", "--method", "bridge", "--heal-tokens", "100000000",
                         "--corpus", corpus_file)) == 0
    healing = json.loads((out / "zones-provenance.json").read_text())["healing"]
    assert healing["tokens_budget"] == 100_000_000
    assert 0 < healing["tokens"] < 100_000_000 and healing["tokens"] == healing["calibration_windows"] * 31
    assert any(f"hold {healing['tokens']} of the 100000000 tokens" in note for note in healing["notes"])


def test_check_removed_refuses_bools_and_non_integers():
    from zones.pruning.export import ExportError, check_removed

    model = tiny_model("llama")
    for bad in ([True], [1.7], [1.0], ["1"], [1, 1], [], "1"):
        with pytest.raises(ExportError):
            check_removed(model, bad)
    assert check_removed(model, [np.int64(2), 0]) == [0, 2]


def _random_windows(n_windows: int = 4, seq_len: int = 16):
    from zones.core.data import make_windows

    ids = np.random.default_rng(0).integers(0, 256, size=n_windows * seq_len * 4)
    return make_windows(ids, seq_len, "eval", max_tokens=n_windows * (seq_len - 1))


def test_block_lists_below_the_public_doors_go_through_the_one_validator():
    """Issue 55: ``check_layers(model, [1.7])`` and ``[True]`` returned ``[1]``, ``[1, 1]`` was
    taken as ``[1]``, and so did ``evaluate_removals`` and ``skip_blocks``: a wrong number
    silently became another block. Now each is refused in one line naming it."""
    from zones.measure.blocks import check_layers, skip_blocks
    from zones.measure.scoring import evaluate_removals

    model = tiny_model("llama")
    for bad, expected in (([1.7], "1.7"), ([True], "True"), ([1, 1], "twice"), (["1"], "'1'"), ([9], "out of range")):
        with pytest.raises((ValueError, IndexError), match=re.escape(expected)) as err:
            check_layers(model, bad)
        assert "\n" not in str(err.value)
        with pytest.raises((ValueError, IndexError), match=re.escape(expected)):
            with skip_blocks(model, bad):
                pass
        with pytest.raises((ValueError, IndexError), match=re.escape(expected)):
            evaluate_removals(model, _random_windows(), [[0], bad], batch_size=2, progress=False)
    assert check_layers(model, [np.int64(2), 0]) == [0, 2] and check_layers(model, []) == []
    assert len(evaluate_removals(model, _random_windows(), [[], [np.int64(1)]], batch_size=2, progress=False)) == 2


def test_evaluate_refuses_an_empty_list_of_models_instead_of_scoring_the_default_model(monkeypatch):
    """Issue 55: ``zones.evaluate([], ...)`` evaluated smollm2-135m, a model nobody named."""
    import zones
    import zones.evaluation as command

    monkeypatch.setattr(command, "load_model", lambda *a, **k: pytest.fail("no model is loaded"))
    for models in ([], ()):
        with pytest.raises(ValueError, match="models must be a model or a non-empty list"):
            zones.evaluate(models, tasks="arc_easy")


def test_a_predictor_of_the_wrong_shape_or_a_taken_name_is_refused():
    """Issue 55: a predictor returning a 3×2 array for six blocks was flattened into six values;
    a name already registered is refused unless ``replace=True``."""
    from zones.analysis.predictors import PREDICTORS, predictor_table, register_predictor

    ablation = pd.DataFrame(dict(layer=range(6), delta_loss=np.linspace(0.1, 0.6, 6)))
    alphas = pd.DataFrame(columns=["layer", "role", "alpha_shape"])
    try:
        register_predictor("grid_55")(lambda inputs: np.arange(6.0).reshape(3, 2))
        with pytest.raises(ValueError, match="predictor grid_55 gave an array of shape \\(3, 2\\)"):
            predictor_table(ablation, alphas)
        with pytest.raises(ValueError, match="already registered"):
            register_predictor("grid_55")(lambda inputs: np.arange(6.0))
        register_predictor("grid_55", replace=True)(lambda inputs: np.arange(6.0))
        assert predictor_table(ablation, alphas)["grid_55"].tolist() == list(np.arange(6.0))
    finally:
        PREDICTORS.pop("grid_55", None)


# --- every bad value named before any work ------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["study", "--models", "m,m/", "--out", "study-out"], ("'m' and 'm/'", "list each model once")),
    (["study", "--models", "m,./m", "--out", "study-out"], ("'m' and './m'",)),
    (["book", "--models", "m,m"], ("'m' twice",)),
    (["book", "--models", "gpt2,smollm2-135m,gpt2"], ("'gpt2' twice",)),
], ids=["study-two-spellings", "study-dot-slash", "book-same-name", "book-hub-id"])
def test_one_model_listed_twice_is_refused_naming_both_spellings(tmp_path, capfd, monkeypatch, argv, expected):
    """Issue 40: ``zones study --models m,m/`` took one model under two spellings for two models,
    and ``zones book --models m,m`` the exact duplicate. A local model is its resolved path, any
    other its exact name; a model listed twice is one line naming both spellings."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    line = one_error(capfd, argv, "--models", *expected)
    assert "twice" in line
    assert not (tmp_path / "study-out").exists()
    from zones.studies import StudyError, parse_models

    with pytest.raises(StudyError, match="'m' and 'm/'"):
        parse_models("m,m/")


@pytest.mark.parametrize("command", [export, heal_cli], ids=["export", "heal"])
@pytest.mark.parametrize("remove, expected", [
    ("", "names no block"), (",", "names no block"), ("1,1", "block 1 twice"), ("a", "'a'"),
    ("-1", "-1"), ("1.5", "1.5"),
], ids=["empty", "commas", "twice", "letter", "negative", "fraction"])
def test_a_bad_remove_flag_is_named_before_the_model_loads(tmp_path, capfd, command, remove, expected):
    one_error(capfd, command(NO_MODEL, tmp_path / "out", "--remove", remove), "--remove", expected)


@pytest.mark.parametrize("flag, value", [("--heal-tokens", "0"), ("--heal-tokens", "-5"), ("--rank", "0"), ("--rank", "-1"),
                                         ("--lr", "inf"), ("--lr", "nan"), ("--lr", "0"), ("--lr", "-0.001"),
                                         ("--seed", "-1")])
def test_a_bad_healing_option_is_named_before_the_model_loads(tmp_path, capfd, flag, value):
    line = one_error(capfd, heal_cli(NO_MODEL, tmp_path / "out", "--remove", "1", flag, value), flag)
    assert "max_tokens" not in line and "weights" not in line


@pytest.mark.parametrize("flag, value, expected", [
    ("--heal-tokens", "0", "got 0"), ("--lr", "inf", "finite"), ("--lr", "nan", "finite"), ("--lr", "0", "got 0")])
def test_a_bad_healing_option_names_the_value_given(tmp_path, capfd, flag, value, expected):
    """Issue 40: ``--heal-tokens 0`` said "got None" (0 read as the whole split, then refused), and
    ``--lr inf`` "must be a number >= 0" (inf is one). The line names the value given, and says
    finite where a value must be."""
    line = one_error(capfd, heal_cli(NO_MODEL, tmp_path / "out", "--remove", "1", flag, value), flag, expected)
    assert "None" not in line.split("got")[-1]


def test_heal_refresh_heals_again_past_a_damaged_checkpoint(monkeypatch, one_thread):
    from test_heal import calibration

    import zones.pruning.heal as heal_module
    from zones.core.cache import CacheError

    win = calibration()
    model = tiny_model("gpt2", n_layers=4)
    kw = dict(method="lora", lr=1e-2, heal_tokens=6 * 2 * 23, heal_batch_size=2, save_every=2, progress=False)
    whole = heal_module.heal(model, [1], win, cache=False, **kw)
    _interrupted_heal(monkeypatch, model, [1], win, kw)
    (progress,) = heal_module.progress_path(whole.key).parent.glob("*.pt")
    progress.write_bytes(progress.read_bytes()[:-50])
    with pytest.raises(CacheError, match="damaged"):
        heal_module.heal(model, [1], win, **kw)
    again = heal_module.heal(model, [1], win, refresh=True, **kw)
    assert not again.from_cache and len(again.history) == len(whole.history)
    for a, b in zip(whole.model.state_dict().values(), again.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_alpha_refresh_replaces_a_damaged_cached_table(tmp_path, capfd, tiny_model_dir):
    from zones.core.cache import cache_dir

    assert main(alpha(tiny_model_dir, "--out", str(tmp_path / "first"))) == 0
    (cached,) = (cache_dir() / "alpha").glob("*.parquet")
    cached.write_bytes(cached.read_bytes()[:-100])
    assert main(alpha(tiny_model_dir, "--refresh", "--out", str(tmp_path / "refreshed"))) == 0
    assert main(alpha(tiny_model_dir, "--out", str(tmp_path / "again"))) == 0
    capfd.readouterr()
    first, again = (pd.read_csv(tmp_path / d / "alpha.csv") for d in ("first", "again"))
    pd.testing.assert_frame_equal(first, again)


def _damage_first_row(journal: Path) -> None:
    """Drop the loss of a journal's first row (its checksum no longer matches)."""
    lines = journal.read_text().splitlines()
    row = json.loads(lines[0])
    row.pop("nll")
    lines[0] = json.dumps(row)
    journal.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("command, table", [(ablate, "ablation.csv"), (prune, "pruning.csv")],
                         ids=["ablate", "prune"])
def test_refresh_replaces_a_damaged_loss_store_for_ablate_and_prune(tmp_path, capfd, tiny_model_dir, corpus_file,
                                                                   command, table):
    """Issue 40: ``zones ablate`` and ``zones prune`` had no ``--refresh``, so a damaged loss store
    could only be deleted by hand. ``--refresh`` scores again what the cache held and replaces it,
    and the next plain run reads the new rows."""
    from zones.core.cache import cache_dir

    assert main(command(tiny_model_dir, corpus_file, "--out", str(tmp_path / "first"))) == 0
    (journal,) = (cache_dir() / "window-losses").glob("*.jsonl")
    _damage_first_row(journal)
    capfd.readouterr()
    fails_cleanly(capfd, command(tiny_model_dir, corpus_file), tmp_path / "damaged", str(journal), "line 1")
    assert main(command(tiny_model_dir, corpus_file, "--refresh", "--out", str(tmp_path / "refreshed"))) == 0
    assert main(command(tiny_model_dir, corpus_file, "--out", str(tmp_path / "again"))) == 0
    capfd.readouterr()
    first, refreshed, again = (pd.read_csv(tmp_path / d / table) for d in ("first", "refreshed", "again"))
    pd.testing.assert_frame_equal(first, refreshed)
    pd.testing.assert_frame_equal(first, again)


@pytest.mark.parametrize("command", ["sweep", "study"])
def test_refresh_replaces_a_damaged_alpha_table_for_sweep_and_study(tmp_path, capfd, tiny_model_dir, command):
    """Issue 40: ``zones sweep`` and ``zones study`` had no ``--refresh``: a damaged cached α table
    stopped them until deleted by hand. With ``--refresh`` the jobs compute it again."""
    from zones.core.cache import cache_dir

    def argv(out: Path, *extra) -> list[str]:
        only = ["--only", "alpha_profile"] if command == "study" else []
        return [command, "--models", str(tiny_model_dir), *only, *extra, "--out", str(out)]

    assert main(argv(tmp_path / "first")) == 0
    (cached,) = (cache_dir() / "alpha").glob("*.parquet")
    cached.write_bytes(cached.read_bytes()[:-100])
    capfd.readouterr()
    assert main(argv(tmp_path / "damaged")) == 1
    assert str(cached) in messages(capfd.readouterr().err)[-1]
    assert main(argv(tmp_path / "refreshed", "--refresh")) == 0
    assert main(argv(tmp_path / "again")) == 0
    capfd.readouterr()
    found = {d: sorted(p.relative_to(tmp_path / d) for p in (tmp_path / d).rglob("*.csv")) for d in ("first", "again")}
    assert found["first"] == found["again"] and found["first"]
    for name in found["first"]:
        if name.name != "jobs.csv":  # where and how long each job ran
            pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "first" / name), pd.read_csv(tmp_path / "again" / name))


@pytest.mark.parametrize("content, expected", [(b"", "is empty"), (b"PK\x03\x04" + b"\0" * 60, "not a GGUF file")],
                         ids=["empty", "zip"])
def test_a_gguf_file_that_cannot_be_one_is_named(tmp_path, capfd, content, expected):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(content)
    fails_cleanly(capfd, alpha(gguf), tmp_path / "out", str(gguf), expected)


def test_a_full_disk_names_the_file_being_written(tmp_path, monkeypatch):
    import errno
    import os

    from zones.core.atomic import DiskFullError, atomic_write_bytes

    real_fdopen = os.fdopen

    class Full:  # a file on a full disk: the write fails
        def __init__(self, fd, *args, **kwargs):
            self.handle = real_fdopen(fd, *args, **kwargs)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", Full)
    target = tmp_path / "table.csv"
    with pytest.raises(DiskFullError) as err:
        atomic_write_bytes(target, b"x" * 100_000)
    assert str(target) in str(err.value) and "no space left" in str(err.value)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_during_an_export_names_the_out_folder(tmp_path, capfd, monkeypatch, tiny_model_dir):
    from safetensors import SafetensorError

    import zones.pruning.export as export_module

    def full(*args, **kwargs):  # what safetensors' Rust writer raises on a full disk
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(export_module.nn.Module, "save_pretrained", full, raising=False)
    monkeypatch.setattr("transformers.PreTrainedModel.save_pretrained", full)
    out = tmp_path / "pruned"
    one_error(capfd, export(tiny_model_dir, out, "--remove", "1"), str(out), "no space left")
    assert list(tmp_path.iterdir()) == []


# --- zones train and its caches --------------------------------------------------------------------

def train_argv(corpus: str, out: Path, *extra) -> list[str]:
    return ["train", "--depths", "2", "--seeds", "1", "--width", "32", "--head-dim", "16", "--vocab-size", "300", "--seq-len", "32",
            "--batch-size", "8", "--steps", "4", "--snapshot-every", "2", "--corpus", corpus, "--device", "cpu",
            "--set=eval_every=2", "--set=eval_windows=4", "--set=checkpoint_every=2", "--out", str(out), *extra]


def test_train_refresh_gets_past_damaged_tokenizer_and_token_caches(tmp_path, capfd, corpus_file):
    from zones.core.cache import cache_dir

    assert main(train_argv(corpus_file, tmp_path / "first")) == 0
    (tokens,) = (cache_dir() / "tokens").glob("*.npy")
    tokens.write_bytes(tokens.read_bytes()[:-100])
    (tokenizer,) = (cache_dir() / "tokenizers").glob("*/tokenizer.json")
    tokenizer.write_text(tokenizer.read_text().replace('"<|endoftext|>"', '"<|end|>"', 1))
    capfd.readouterr()
    assert main(train_argv(corpus_file, tmp_path / "again", "--refresh")) == 0
    capfd.readouterr()
    first, again = (pd.read_csv(tmp_path / d / "history.csv") for d in ("first", "again"))
    pd.testing.assert_series_equal(first["heldout_loss"], again["heldout_loss"])


def test_a_killed_training_writers_temporary_is_removed_by_the_next_run(tmp_path, capfd, corpus_file):
    import shutil

    from zones.core.atomic import mark_temporary
    from zones.core.cache import cache_dir

    assert main(train_argv(corpus_file, tmp_path / "first")) == 0
    (run,) = [p for p in (cache_dir() / "train").iterdir() if not p.name.startswith(".") and p.suffix != ".lock"]
    shutil.rmtree(run)
    stale = run.parent / f".{run.name}.k1ll3d.tmp"  # a writer killed while writing the finished run
    stale.mkdir()
    mark_temporary(stale)
    (stale / "model.safetensors").write_bytes(b"\0" * 4096)
    assert main(train_argv(corpus_file, tmp_path / "again")) == 0
    capfd.readouterr()
    assert not stale.exists() and (run / "run.json").exists()


def test_a_killed_cache_writers_temporary_file_is_removed_by_the_next_write():
    from zones.core.atomic import mark_temporary, temporary_marker
    from zones.core.cache import entry_path, sidecar_path
    from zones.core.entries import write_entry

    parts = {"kind": "unit", "case": "killed writer"}
    path = entry_path("unit", parts, ext="bin")
    path.parent.mkdir(parents=True, exist_ok=True)
    stale = [path.parent / f".{path.name}.k1ll3d.tmp", path.parent / f".{sidecar_path(path).name}.k1ll3d.tmp"]
    for file in stale:
        file.write_bytes(b"\0" * 4096)  # what a writer killed between its write and its rename leaves
        mark_temporary(file)
    write_entry(path, parts, b"payload")
    assert not any(file.exists() or temporary_marker(file).exists() for file in stale)
    assert path.read_bytes() == b"payload"


def test_a_killed_runs_cache_event_file_is_removed_by_the_next_count(tmp_path, monkeypatch):
    """Issue 40: every ``zones-cache-events-*.tsv`` a killed run left stayed in /tmp for good. The
    file is named with its process's id, and the next count removes those whose process is gone
    (a live count's file is kept)."""
    import os
    import subprocess
    import sys
    import tempfile

    from zones.core.tally import counting

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    killed = subprocess.run([sys.executable, "-c", "import os, signal\nfrom zones.core.tally import counting\n"
                             "with counting():\n    os.kill(os.getpid(), signal.SIGKILL)"],
                            env={**os.environ, "TMPDIR": str(tmp_path)})
    assert killed.returncode == -9 and len(list(tmp_path.glob("zones-cache-events-*"))) == 1  # what it left
    with counting():
        live = list(tmp_path.glob("zones-cache-events-*"))
        assert len(live) == 1  # this count's own file only
    assert not list(tmp_path.glob("zones-cache-events-*"))


def test_a_damaged_converted_model_is_named_once_on_stderr_before_it_is_converted_again(capfd, tiny_gguf):
    """Issue 40: a damaged converted copy of a GGUF model (the default model is one) was converted
    again with no line naming the file (a deleted manifest), or with its message twice on stdout
    telling the user to delete what zones was about to replace. One line on stderr names the
    damaged file and says that the model is converted again."""
    from zones.core.manifest import MANIFEST
    from zones.core.models import converted_gguf_dir, load_model

    fingerprint = load_model(str(tiny_gguf), device="cpu").fingerprint
    target = converted_gguf_dir(tiny_gguf)
    weights = target / "model.safetensors"
    for damage, named in ((lambda: weights.write_bytes(weights.read_bytes()[:1000]), weights),
                          (lambda: (target / MANIFEST).unlink(), target / MANIFEST)):
        damage()
        capfd.readouterr()
        assert load_model(str(tiny_gguf), device="cpu").fingerprint == fingerprint
        lines = [line for line in messages(capfd.readouterr().err) if "damaged" in line]
        assert len(lines) == 1 and str(named) in lines[0] and f"converting {tiny_gguf.name} again" in lines[0], lines


# --- issue 55: nothing silently wrong, nothing left running ---------------------------------------------

@pytest.fixture
def no_study_work(monkeypatch):
    """``zones study`` with its jobs replaced by a failure: a test that expects a refusal before
    any work fails loudly if the study gets that far."""
    import zones.studies as study_module

    def run_jobs(*args, **kwargs):
        raise AssertionError("the study started its jobs")

    monkeypatch.setattr(study_module, "run_jobs", run_jobs)


def study_error(capfd, argv: list[str]) -> str:
    """Run ``zones study ARGV``: one error line, exit 1; return the line."""
    capfd.readouterr()
    assert main(["study", *argv]) == 1
    lines = messages(capfd.readouterr().err)
    assert len(lines) == 1 and lines[0].startswith("zones study: error: "), lines
    return lines[0]


def test_study_only_refuses_an_unknown_chapter_naming_the_known_ones(tmp_path, capfd, tiny_model_dir, no_study_work):
    """Before: ``zones study --only primr`` planned 0 jobs and said it had finished."""
    line = study_error(capfd, ["--models", str(tiny_model_dir), "--only", "primr", "--out", str(tmp_path / "out")])
    assert "unknown chapter primr" in line and "primer" in line and "alpha_profile" in line


def test_a_smaller_plan_never_replaces_an_out_folders_record_of_a_study(tmp_path, capfd, no_study_work):
    """Before: a study of one model written to the --out of a study of two replaced its
    study-state.json (and then jobs.csv) with a record of one job, silently."""
    from zones.studies import STATE_FILE, plan

    out = tmp_path / "out"
    out.mkdir()
    jobs = [dict(job=s.name, chapter=s.chapter, model=s.model, label=s.label, status="done")
            for s in plan(["m1", "m2"], only=["alpha_profile"])]
    record = dict(version=1, state="finished", command="zones study ...", jobs=jobs)
    (out / STATE_FILE).write_text(json.dumps(record))
    line = study_error(capfd, ["--models", "m1", "--only", "alpha_profile", "--out", str(out)])
    assert str(out) in line and "2 jobs" in line and "alpha_profile · m2" in line and "another --out" in line
    assert json.loads((out / STATE_FILE).read_text()) == record


def test_study_checks_every_local_model_path_before_any_work(tmp_path, capfd, tiny_model_dir, no_study_work):
    """Before: ``--models a,/missing/path`` ran a's jobs, then failed the missing one's."""
    missing = [str(tmp_path / "missing-1"), str(tmp_path / "missing-2")]
    line = study_error(capfd, ["--models", ",".join([str(tiny_model_dir), *missing]), "--only", "alpha_profile",
                               "--out", str(tmp_path / "out")])
    assert all(m in line for m in missing) and "do not exist" in line and str(tiny_model_dir) not in line


@pytest.mark.parametrize("chapter, param, expected", [
    ("layer_ablation", "alpha_role=zz", "parameter alpha_role must be a string from weighted, q, k"),
    ("alpha_profile", "role=zz", "parameter role must be a string from q, k, v"),
    ("alpha_profile", "no_such_thing=1", "unknown chapter parameter no_such_thing")])
def test_a_bad_study_param_is_named_before_any_work(tmp_path, capfd, tiny_model_dir, no_study_work, chapter, param,
                                                    expected):
    """Before: ``--param alpha_role=zz`` reached the jobs, which failed with "no rows for role 'zz'"
    (not naming the parameter). Unknown names were refused already, as in ``zones book``."""
    line = study_error(capfd, ["--models", str(tiny_model_dir), "--only", chapter, "--param", param,
                               "--out", str(tmp_path / "out")])
    assert expected in line, line


def test_a_token_budget_beyond_the_split_names_the_parameter_and_the_remedy():
    """Before: "CorpusError: token budget 100000000 needs ..." named neither --eval-tokens (nor, in
    the book and the study, --param eval_tokens) nor what to ask for instead."""
    from zones.book import book_wording
    from zones.core.data import CorpusError

    with pytest.raises(CorpusError) as err:
        _random_windows_budget(100_000_000)
    assert "--eval-tokens 100000000" in str(err.value) and "ask for at most" in str(err.value)
    worded = book_wording(str(err.value), {"eval_tokens": {}})
    assert "--param eval_tokens=100000000" in worded


def _random_windows_budget(max_tokens: int):
    from zones.core.data import make_windows

    return make_windows(np.random.default_rng(0).integers(0, 256, size=4000), 16, "eval", max_tokens=max_tokens)


@pytest.mark.parametrize("jobs, field", [([dict(job="a", chapter="c", label="l")],
                                          "field status of jobs[0] is missing"),
                                         (5, "field jobs is not a list"),
                                         ([dict(job="a", chapter="c", label="l", status="done", seconds="x")],
                                          "field seconds of jobs[0]")])
def test_study_status_on_a_bad_state_file_names_the_file_and_the_field(tmp_path, capfd, jobs, field):
    """Before: "zones study: error: 'status'" and "'int' object is not iterable"."""
    from zones.studies import STATE_FILE

    path = tmp_path / STATE_FILE
    path.write_text(json.dumps(dict(version=1, state="finished", jobs=jobs)))
    line = study_error(capfd, ["--status", str(tmp_path)])
    assert str(path) in line and field in line, line


def test_a_truncated_summary_names_its_path():
    """Before: "JSONDecodeError: Expecting ',' delimiter", without the file."""
    import tempfile

    from zones.report.common import read_summary

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "summary.json"
        path.write_text('{"a": 1, "b": 2}'[:10])
        with pytest.raises(ValueError) as err:
            read_summary(folder)
    assert str(path) in str(err.value) and "run its chapter again" in str(err.value)


def test_a_pickle_behind_an_index_file_is_refused_without_torchs_advice(tmp_path, capfd, tiny_tokenizer):
    """Before: a model.safetensors.index.json pointing to a pickle reached torch, whose refusal
    ("Weights only load failed. This file can still be loaded ...") advises turning weights_only
    off. Now one line of zones' own, and the pickle's code never runs."""
    model = tiny_model("llama")
    folder = save_model(tmp_path / "m", model, tiny_tokenizer)
    (folder / "model.safetensors").unlink()
    marker = tmp_path / "code-ran"

    class Planted:
        def __reduce__(self):
            return open, (str(marker), "w")

    torch.save({"planted": Planted(), **model.state_dict()}, folder / "weights-00001.bin")
    index = dict(metadata={}, weight_map={name: "weights-00001.bin" for name in model.state_dict()})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    for argv in (["alpha", "--model", str(folder)], ablate(folder, "stdlib")):
        err = fails_cleanly(capfd, argv, tmp_path / "out", "never unpickles", "safetensors")
        assert "can still be loaded" not in err and "weights_only" not in err
    assert not marker.exists()


def test_a_killed_studys_scratch_folders_are_removed_by_the_next_study(tmp_path, monkeypatch, tiny_model_dir):
    """Before: a study killed while a job ran left its empty ``zones-study-*`` folder in the
    temporary folder, for good. Now a job's scratch folder is named by the study's pid and the
    next study removes those of dead processes (and a stopped study its own)."""
    import subprocess
    import sys
    import tempfile

    import zones.studies as study_module
    from zones.core.executors import JobFailed

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"zones-study-{dead.pid}-abc123"
    live = tmp_path / f"zones-study-{os.getpid()}-def456"
    left.mkdir()
    live.mkdir()

    def run_jobs(*args, **kwargs):
        raise JobFailed("stopped here")

    monkeypatch.setattr(study_module, "run_jobs", run_jobs)
    with pytest.raises(JobFailed):
        study_module.study([str(tiny_model_dir)], only=["alpha_profile"], progress=False, log=lambda _: None)
    assert not left.exists() and live.exists()
