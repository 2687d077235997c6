"""Bad input, through the command line, on tiny models: each class of bad input a user meets.

A bad input ends in ONE clear line on stderr (``zones <command>: error: ...``, naming the file
or flag, the cause and the remedy), a non-zero exit, and no result file under ``--out``. Where
the right answer is not an error (an edited model, a rank-1 matrix, a weights-only directory
for ``alpha``, a planted pickle) the test asserts that answer instead.

Commands run in-process through ``zones.cli.main``; ``capfd`` captures the process's whole
stderr (transformers' own warnings included); progress bars are left out of the count.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path

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
