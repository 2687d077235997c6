"""The command line: one clear error line, one flag vocabulary, and the same tables as the library."""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest

import zones
import zones.core.hardware
from zones.cli import build_parser, lab_command, main, parse_args
from zones.core.glossary import term

ROOT = Path(__file__).resolve().parents[1]


def test_unknown_model_is_one_clear_line(capsys, tmp_path):
    assert main(["alpha", "--model", str(tmp_path / "missing.gguf"), "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("zones alpha: error:") and "does not exist" in err
    assert not (tmp_path / "alpha.csv").exists()


def test_alpha_writes_the_library_table(tiny_model_dir, tmp_path):
    from zones.core.models import load_model
    from zones.spectra import alpha_table

    assert main(["alpha", "--model", str(tiny_model_dir), "--device", "cpu", "--out", str(tmp_path)]) == 0
    written = pd.read_csv(tmp_path / "alpha.csv")
    expected = alpha_table(load_model(str(tiny_model_dir), device="cpu").model)
    assert list(written["role"]) == list(expected["role"])
    assert written["alpha_shape"].round(6).equals(expected["alpha_shape"].round(6))


def test_book_rejects_unknown_chapters(capsys):
    assert main(["book", "--only", "no_such_chapter", "--no-execute"]) == 1
    assert "unknown chapter" in capsys.readouterr().err


# --- conventions ------------------------------------------------------------------------------------

def test_python_dash_m_zones_and_version():
    done = subprocess.run([sys.executable, "-m", "zones", "--version"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"zones {zones.__version__}"
    assert zones.__version__ not in ("", "0+unknown")  # the installed package's own version


def _flags(command: str) -> dict[str, object]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {s: a for a in sub._actions for s in a.option_strings}


def test_one_flag_vocabulary_across_subcommands():
    shared = ["--model", "--device", "--out", "--corpus", "--seq-len", "--batch-size", "--eval-tokens",
              "--calibration-tokens", "--tokenizer"]
    for command in ("ablate", "prune"):
        assert set(shared) <= set(_flags(command)), command
    assert {"--model", "--device", "--out"} <= set(_flags("alpha")) and "--tokenizer" not in _flags("alpha")
    for command in ("alpha", "ablate", "prune", "train"):
        for flag in ("--out", "--device", "--corpus", "--seq-len", "--batch-size", "--model"):
            if flag in _flags(command):
                assert _flags(command)[flag].dest == term(flag).name   # --out is the term out_dir
    assert parse_args(["ablate", "--eval-tokens", "300"]).eval_tokens == 300


def test_no_hidden_aliases(capsys):
    """Every flag is in its command's help, and a removed spelling is refused, not accepted quietly."""
    parser = build_parser()
    for name, sub in next(a for a in parser._actions if a.dest == "command").choices.items():
        hidden = [s for a in sub._actions if a.help == "==SUPPRESS==" for s in a.option_strings]
        assert not hidden, f"zones {name} hides {hidden}"
        for action in sub._actions:
            assert len(action.option_strings) <= 1 or action.option_strings == ["-h", "--help"], \
                f"zones {name}: {action.option_strings} are two names for one flag"
    for old in (["ablate", "--tokens", "300"], ["alpha", "--no-cache"], ["heal", "--tokens", "300"],
                ["alpha", "--estimator", "shape"]):
        with pytest.raises(SystemExit):
            parse_args(old)


def test_the_help_lists_every_subcommand_and_they_register_one_way():
    from zones import cli

    for name, command in cli.COMMANDS.items():
        assert f"zones {name} " in cli.__doc__, f"the module docstring does not list zones {name}"
        assert isinstance(command, cli.Command) and callable(command.add_arguments) and callable(command.run)
    assert set(cli.COMMANDS) == set(next(a for a in build_parser()._actions if a.dest == "command").choices)


def test_a_subcommand_in_its_own_module_registers_in_one_line():
    import types

    from zones import cli

    module = types.ModuleType("zones.fake")
    module.__doc__ = "do a fake thing\n\nLonger description."
    module.add_arguments = lambda p: p.add_argument("--refresh", action="store_true")
    module.run = lambda args: 3 if args.refresh else 0
    command = cli.Command.of(module)
    assert command.help == "do a fake thing" and command.description.startswith("do a fake thing")
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args(["--refresh"])) == 3


@pytest.mark.parametrize("argv, expected", [
    (["prune", "--seeds", "abc"], "zones prune: error: argument --seeds: must be an integer >= 1 or None; got 'abc'"),
    (["prune", "--seeds", "0,1"], "zones prune: error: argument --seeds: must be an integer >= 1 or None; got '0,1'"),
    (["ablate", "--eval-tokens", "-5"], "zones ablate: error: argument --eval-tokens: must be a number of tokens"),
    (["train", "--depths", "8,x"], "zones train: error: argument --depths: must be a list of ints >= 1 or None"),
    (["export", "--remove", "3,a", "--out", "x"], "zones export: error: argument --remove: must be a list of ints"),
    (["book", "--budget", "laptop"], "zones book: error: argument --budget: invalid choice: 'laptop'"),
])
def test_a_bad_flag_value_is_one_line_naming_the_flag(capsys, argv, expected):
    with pytest.raises(SystemExit) as exit:
        parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and err.startswith(expected) and "\n" not in err, err


def test_flags_take_the_glossarys_values():
    args = parse_args(["prune", "--strategies", "zone_aware,last_n", "--eval-tokens", "0", "--seeds", "3"])
    assert args.strategies == ["zone_aware", "last_n"] and args.eval_tokens is None and args.seeds == 3
    defaults = parse_args(["prune"])
    assert (defaults.eval_tokens, defaults.calibration_tokens, defaults.seeds, defaults.k_max) == (2040, 510, 2, 8)
    assert parse_args(["ablate"]).eval_tokens == 3060 and parse_args(["heal", "--out", "x"]).heal_tokens == 8192
    assert parse_args(["train", "--depths", "4,6"]).depths == [4, 6] and parse_args(["train"]).seeds is None
    assert parse_args(["sweep", "--models", "a,b"]).models == ["a", "b"]
    lab = parse_args(["lab", "--budget", "class", "--no-browser"])
    assert lab.budget == "class" and lab.lab_args == ["--no-browser"]


@pytest.mark.parametrize("argv", [["alpha"], ["ablate"], ["prune"], ["export", "--out", "x"], ["heal", "--out", "x"],
                                  ["train"], ["lifecycle", "--revisions", "step0"], ["sweep", "--models", "a"], ["book"], ["evaluate"],
                                  ["study", "--models", "a"]], ids=lambda argv: argv[0])
def test_every_command_that_reads_the_cache_takes_refresh(argv):
    """Issue 40: the README promises --refresh on every command, but ablate, prune, sweep and
    study (and export, book) lacked it. Every command that reads the cache takes it, off by
    default (the glossary's term)."""
    assert parse_args(argv).refresh is False and parse_args([*argv, "--refresh"]).refresh is True


def test_unknown_options_are_refused_except_for_lab(capsys):
    with pytest.raises(SystemExit):
        main(["alpha", "--no-browser"])
    assert "unrecognized arguments: --no-browser" in capsys.readouterr().err
    assert parse_args(["lab", "--no-browser", "--port", "8899"]).lab_args == ["--no-browser", "--port", "8899"]
    assert parse_args(["lab", "--", "--no-browser"]).lab_args == ["--", "--no-browser"]


def test_lab_command_passes_jupyterlab_options_through(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    command = lab_command(["--", "--no-browser", "--port", "8899"])
    assert command[1:] == [str(ROOT / "notebooks"), "--no-browser", "--port", "8899", "--allow-root"]
    assert lab_command(["--allow-root"]).count("--allow-root") == 1
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "--allow-root" not in lab_command(["--no-browser"])


@pytest.mark.parametrize("make_bad, match", [
    (lambda tmp: tmp / "a-file", "is a file, not a folder"),
    (lambda tmp: tmp / "a-file" / "inside", "cannot be created"),
])
def test_out_is_checked_before_any_work(tmp_path, capsys, monkeypatch, make_bad, match):
    (tmp_path / "a-file").write_text("not a folder")
    import zones.core.models

    monkeypatch.setattr(zones.core.models, "load_model", lambda *a, **k: pytest.fail("loaded before --out was checked"))
    assert main(["alpha", "--out", str(make_bad(tmp_path))]) == 1
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_lab_starts_headless_and_lists_the_chapters(tmp_path):
    port, token, log = _free_port(), "zones-test-token", tmp_path / "lab.log"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    lab = subprocess.Popen([sys.executable, "-m", "zones", "lab", "--no-browser", "--port", str(port),
                            "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}"],
                           cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"),
                           start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/api/contents/?token={token}"
        deadline, listing = time.monotonic() + 120, None
        while listing is None and time.monotonic() < deadline and lab.poll() is None:
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    listing = json.load(response)
            except OSError:
                time.sleep(0.5)
        assert listing is not None, f"jupyter-lab did not answer: {log.read_text()[-2000:]}"
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "notebooks").glob("*.md")} <= names
    finally:  # stop the server and everything it started
        if lab.poll() is None:
            os.killpg(lab.pid, signal.SIGTERM)
            try:
                lab.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(lab.pid, signal.SIGKILL)
                lab.wait()


def test_ablate_passes_dtype_and_budget_to_the_library(tiny_model_dir, tmp_path, one_thread, monkeypatch):
    # bfloat16 is refused on a CPU without native bf16 (zones.core.hardware): pretend this one has it
    monkeypatch.setattr(zones.core.hardware, "native_bf16", lambda device="cpu": True)
    from zones.core.data import corpus_windows
    from zones.core.models import load_model
    from zones.measure.ablation import ablation_table

    corpus = tmp_path / "prose.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog, and then it rests. " * 300)
    assert main(["ablate", "--model", str(tiny_model_dir), "--corpus", str(corpus), "--seq-len", "32",
                 "--eval-tokens", "93", "--dtype", "bfloat16", "--device", "cpu", "--out", str(tmp_path)]) == 0
    written = pd.read_csv(tmp_path / "ablation.csv")
    loaded = load_model(str(tiny_model_dir), device="cpu")
    windows = corpus_windows(str(corpus), loaded.tokenizer, 32, "eval", 93)
    expected = ablation_table(loaded.model, windows, dtype="bfloat16", progress=False)
    assert written["n_tokens"].tolist() == [93] * len(expected)
    assert written["delta_loss"].round(6).tolist() == expected["delta_loss"].round(6).tolist()
    assert main(["ablate", "--split", "calibration", "--eval-tokens", "93", "--out", str(tmp_path)]) == 1


# --- zones study --status, zones evaluate --help ---------------------------------------------------------

def test_study_status_lists_done_running_failed_and_waiting(tmp_path, capsys):
    """``zones study --status OUT`` reads the state file a study keeps in OUT as it runs (before,
    there was no way to see a running or stopped study's jobs)."""
    from zones.core.tally import Tally
    from zones.studies import STATE_FILE, Ledger, Stage, StageResult

    out = tmp_path / "study"
    stages = [Stage("pruning", "m", "m", {}), Stage("healing", "m", "m", {}), Stage("alpha_profile", "m", "m", {}),
              Stage("predictors", "m", "m", {})]
    ledger = Ledger(stages, out, command="zones study --models m --out study", executor="local", cpus_per_job=1,
                    events=[], log=lambda _: None)
    for name in ("pruning · m", "healing · m", "alpha_profile · m"):
        ledger.start(name)
    ledger.finish(stages[0], StageResult("pruning · m", {"pruning.csv": b"k\n1\n"}, [], Tally(computed={"x"}), "node",
                                         422.0))
    ledger.fail("healing · m", "ValueError: no such strategy", 1)
    assert (out / "pruning" / "m" / "pruning.csv").read_bytes() == b"k\n1\n"

    assert main(["study", "--status", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"zones study in {out}: running (process {os.getpid()} on ")
    assert lines[0].endswith("4 jobs: 1 done, 1 running, 1 failed, 1 waiting")
    assert [line.split()[:2] for line in lines[1:5]] == [["done", "pruning"], ["running", "alpha_profile"],
                                                         ["failed", "healing"], ["waiting", "predictors"]]
    assert "7 m 02 s  computed" in lines[1] and lines[3].endswith("ValueError: no such strategy")
    assert lines[-1] == "resume (computes only what is missing): zones study --models m --out study"

    # the study's process is gone without a word (killed): its running job is said to be stopped
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    state = json.loads((out / STATE_FILE).read_text())
    (out / STATE_FILE).write_text(json.dumps(dict(state, pid=int(gone.stdout))))
    assert main(["study", "--status", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"stopped (its process {int(gone.stdout)} is gone)" in lines[0] and "0 running" in lines[0]
    assert lines[4].split()[:2] == ["stopped", "alpha_profile"]

    assert main(["study", "--status", str(tmp_path / "nothing")]) == 1
    assert "holds no study (study-state.json is missing)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a study is run or looked at, not both
        parse_args(["study", "--models", "m", "--status", str(out)])


def test_evaluate_help_says_the_default_model_once_and_models_is_not_overridden(capsys):
    """``zones evaluate --help`` printed "(default: smollm2-135m)" twice for --model (and once for
    --models, which has no default: --model's default used to win over it)."""
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("(default: smollm2-135m)") == 1
    args = parse_args(["evaluate", "--models", "a,b"])
    assert args.model is None and args.models == ["a", "b"]
    assert parse_args(["evaluate"]).model is None  # zones.evaluate uses smollm2-135m then
