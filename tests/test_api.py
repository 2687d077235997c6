"""The Python API: ``from zones import load_model, alpha_table, ablate, prune, heal, export, evaluate,
study``, each returning the table its subcommand writes, with the subcommand's defaults; ``import
zones`` stays cheap."""
from __future__ import annotations

import argparse
import inspect
import io
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import zones
from zones.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
API = ("load_model", "alpha_table", "ablate", "prune", "heal", "export", "evaluate", "study")
COMMAND = dict(alpha_table="alpha", ablate="ablate", prune="prune", export="export", heal="heal", evaluate="evaluate")


def csv_text(table: pd.DataFrame) -> str:
    return table.to_csv(index=False)


def test_the_api_is_importable_from_zones_and_import_zones_stays_cheap():
    """Before, ``zones`` exported only ``__version__``."""
    from zones import ablate, alpha_table, evaluate, export, heal, load_model, prune, study  # noqa: F401

    assert set(API) <= set(zones.__all__) and set(API) <= set(dir(zones))
    assert all(callable(getattr(zones, name)) for name in API)
    assert zones.load_model is __import__("zones.core.models", fromlist=["x"]).load_model
    # zones.study and zones.evaluate are the API's functions, whatever was imported first: the subcommands'
    # modules have names of their own, and no module swaps its class (issue 52)
    import zones.evaluation as evaluate_module
    import zones.studies as study_module
    from zones import api

    assert study is api.study and zones.study is api.study and evaluate is api.evaluate
    assert type(study_module) is type(zones) and study_module.plan and evaluate_module.evaluation
    probe = ("import sys, zones; heavy = [m for m in ('torch', 'pandas', 'transformers', 'zones.api') "
             "if m in sys.modules]; print(heavy)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def _subcommand(name: str) -> argparse.ArgumentParser:
    return next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


@pytest.mark.parametrize("function", sorted(COMMAND))
def test_every_argument_is_the_commands_flag_with_its_default(function):
    flags = {a.dest: a.default for a in _subcommand(COMMAND[function])._actions
             if a.option_strings and a.dest != "help"}
    parameters = inspect.signature(getattr(zones, function)).parameters
    shared = [name for name in parameters if name in flags and name not in ("model", "models", "out_dir")]
    assert len(shared) >= 3, function
    for name in shared:
        value = parameters[name].default
        assert (list(value) if isinstance(value, tuple) else value) == flags[name], f"{function}({name}=...)"
    missing = set(flags) - set(parameters) - {"model", "models", "list_strategies", "out_dir"}
    assert not missing, f"{function} lacks the flags {sorted(missing)}"


@pytest.fixture
def text(tmp_path) -> str:
    corpus = tmp_path / "prose.txt"
    corpus.write_text("The quick brown fox jumps over the lazy dog, and then it rests a while. " * 400)
    return str(corpus)


def test_alpha_ablate_and_prune_return_the_tables_the_commands_write(tiny_model_dir, text, tmp_path, one_thread):
    model = zones.load_model(str(tiny_model_dir), device="cpu")  # loaded once, for every call
    alpha = zones.alpha_table(model, progress=False)
    assert main(["alpha", "--model", str(tiny_model_dir), "--out", str(tmp_path / "cli")]) == 0
    assert csv_text(alpha) == (tmp_path / "cli" / "alpha.csv").read_text()

    options = dict(corpus=text, seq_len=32, eval_tokens=93, calibration_tokens=62, batch_size=4)
    flags = ["--corpus", text, "--seq-len", "32", "--eval-tokens", "93", "--calibration-tokens", "62",
             "--batch-size", "4"]
    ablation = zones.ablate(model, progress=False, out_dir=tmp_path / "api", **options)
    assert main(["ablate", "--model", str(tiny_model_dir), *flags[:6], *flags[8:], "--out", str(tmp_path / "cli")]) == 0
    assert csv_text(ablation) == (tmp_path / "cli" / "ablation.csv").read_text()
    assert (tmp_path / "api" / "ablation.csv").read_text() == (tmp_path / "cli" / "ablation.csv").read_text()
    assert list(ablation["layer"]) == list(range(model.model.config.num_hidden_layers))

    pruning = zones.prune(str(tiny_model_dir), strategies="last_n,random", k_max=2, seeds=2, **options)
    assert main(["prune", "--model", str(tiny_model_dir), "--strategies", "last_n,random", "--k-max", "2",
                 "--seeds", "2", *flags, "--out", str(tmp_path / "cli")]) == 0
    assert csv_text(pruning) == (tmp_path / "cli" / "pruning.csv").read_text()
    assert set(pruning["strategy"]) == {"last_n", "random"}
    with pytest.raises(ValueError, match="unknown strateg"):  # checked before the model loads
        zones.prune(str(tmp_path / "no-such-model"), strategies="nope")
    with pytest.raises(TypeError, match="what zones.load_model returned, or a model name or path"):
        zones.ablate(42)


def test_export_and_heal_write_the_commands_directory_and_return_its_provenance(tiny_model_dir, text, tmp_path,
                                                                               one_thread):
    exported = zones.export(str(tiny_model_dir), tmp_path / "api-k2", remove=[1, 2])
    assert main(["export", "--model", str(tiny_model_dir), "--remove", "1,2", "--out", str(tmp_path / "cli-k2")]) == 0
    cli = json.loads((tmp_path / "cli-k2" / "zones-provenance.json").read_text())
    row = exported.iloc[0]
    assert len(exported) == 1 and row["out_dir"] == str(tmp_path / "api-k2")
    assert row["removed"] == "1,2" == ",".join(map(str, cli["removed"])) and row["kept"] == "0,3,4,5"  # 6 blocks
    assert row["source_fingerprint"] == cli["source_fingerprint"] and row["source_model"] == cli["source_model"]
    assert zones.load_model(str(tmp_path / "api-k2")).model.config.num_hidden_layers == 4

    healed = zones.heal(str(tiny_model_dir), tmp_path / "healed", strategy="last_n", k=1, method="bridge",
                        heal_tokens=62, corpus=text, seq_len=32, calibration_tokens=62, batch_size=4)
    row = healed.iloc[0]
    assert row["strategy"] == "last_n" and row["removed"] == "5" and row["healing_method"] == "bridge"
    assert row["healing_calibration_loss_after"] <= row["healing_calibration_loss_before"]
    with pytest.raises(ValueError, match="heal_tokens"):  # named as the API spells it, before any work
        zones.heal(str(tiny_model_dir), tmp_path / "bad", remove=[1], heal_tokens=0)
    assert not (tmp_path / "bad").exists()


def test_evaluate_returns_the_tasks_table_the_command_writes(tiny_model_dir, tmp_path, one_thread, capsys):
    pytest.importorskip("lm_eval")
    tasks = zones.evaluate(str(tiny_model_dir), remove="1,2", tasks="zones_next_sentence", limit=3, device="cpu",
                           out_dir=tmp_path / "api")
    assert main(["evaluate", "--model", str(tiny_model_dir), "--remove", "1,2", "--tasks", "zones_next_sentence",
                 "--limit", "3", "--device", "cpu", "--out", str(tmp_path / "cli")]) == 0
    assert csv_text(tasks) == (tmp_path / "cli" / "tasks.csv").read_text()
    for name in ("tasks.csv", "examples.csv", "differences.csv"):
        assert (tmp_path / "api" / name).read_text() == (tmp_path / "cli" / name).read_text(), name
    assert list(tasks["removed"].unique()) == ["", "1,2"]


def test_study_returns_jobs_csv(tiny_model_dir, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    jobs = zones.study([str(tiny_model_dir)], n_resamples=50, only=["alpha_profile"], out_dir=tmp_path / "out",
                       root=ROOT, progress=False, log=lambda _: None)  # chapter parameters as keywords (issue 53)
    written = (tmp_path / "out" / "jobs.csv").read_text()
    assert csv_text(jobs) == written
    assert pd.read_csv(io.StringIO(written))["status"].tolist() == ["done"]
    assert jobs["job"].tolist() == [f"alpha_profile · {Path(tiny_model_dir).name}"]


def test_errors_of_a_python_call_name_keyword_arguments_not_flags(tiny_model_dir):
    """Issue 53: a Python call was told "--seq-len 512 exceeds the model's 256 positions; pass
    --seq-len 256", a flag it was never given. Now the error names the keyword argument."""
    from zones.api import keyword_wording

    with pytest.raises(ValueError) as err:
        zones.ablate(str(tiny_model_dir), seq_len=512, eval_tokens=1022, progress=False)
    assert "seq_len=512 exceeds the model's 256 positions" in str(err.value) and "pass seq_len=256 or less" in \
        str(err.value) and "--" not in str(err.value)
    assert keyword_wording("--param k_max=8 is too large; --out is taken") == "k_max=8 is too large; --out is taken"
    with pytest.raises(TypeError, match="takes 1 positional argument"):  # no positional parameter dict
        zones.study(["m"], dict(n_resamples=50))


def test_the_readmes_api_example_runs_on_a_tiny_model_as_written(tiny_model_dir, tmp_path, monkeypatch, capsys,
                                                                 one_thread):
    """Issue 53: the README's example failed on a model of 128 positions. It runs, as written, on a
    tiny model (its name the only change)."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## Python API"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    assert 'zones.load_model("smollm2-135m")' in code
    monkeypatch.chdir(tmp_path)
    exec(compile(code.replace('"smollm2-135m"', repr(str(tiny_model_dir))), "README.md", "exec"), {})
    printed = capsys.readouterr().out
    assert "delta_loss_low" in printed and "zone_aware" in printed


@pytest.mark.parametrize("command, argv", [
    ("alpha_table", ["alpha", "--model", "M", "--out", "OUT"]),
    ("ablate", ["ablate", "--model", "M", "--out", "OUT"]),
    ("prune", ["prune", "--model", "M", "--out", "OUT"]),
    ("export", ["export", "--model", "M", "--remove", "1", "--out", "OUT"]),
    ("heal", ["heal", "--model", "M", "--remove", "1", "--out", "OUT"]),
])
def test_every_subcommand_is_its_api_function_called_with_its_flags(command, argv, monkeypatch, tmp_path):
    """Issue 52: the CLI re-implemented alpha, ablate, prune, export and heal beside zones.api; now
    each subcommand parses its flags and calls the API's one body (unwrapped: its errors keep the
    flags' names), passing every argument the function takes at the flag's value."""
    import inspect

    from zones import api
    from zones.cli import main

    calls = []
    function = getattr(api, command)

    def body(*args, **kwargs):
        calls.append((args, kwargs))
        raise SystemExit(7)   # stop before any work or writing

    def wrapper(*args, **kwargs):
        raise AssertionError("the CLI called the Python wording's wrapper, whose errors name keywords")

    wrapper.__wrapped__ = body
    monkeypatch.setattr(api, command, wrapper)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    with pytest.raises(SystemExit):
        main(argv)
    (args, kwargs), = calls
    assert args[0] == "M"
    taken = set(inspect.signature(function).parameters) - {"model", "out_dir", "progress"}
    assert taken <= set(kwargs) | ({"out_dir"} if command in ("export", "heal") else set()), \
        sorted(taken - set(kwargs))


def test_the_same_bad_value_names_the_flag_on_the_command_line_and_the_keyword_in_python(tiny_model_dir, tmp_path,
                                                                                          capsys):
    from zones.cli import main

    with pytest.raises(SystemExit):
        main(["heal", "--model", str(tiny_model_dir), "--remove", "1", "--heal-tokens", "0", "--out", str(tmp_path / "a")])
    said = capsys.readouterr().err
    assert "--heal-tokens" in said, said
    with pytest.raises(ValueError) as caught:
        zones.heal(str(tiny_model_dir), tmp_path / "b", remove=[1], heal_tokens=0)
    assert "heal_tokens" in str(caught.value) and "--heal-tokens" not in str(caught.value)


def test_prune_returns_the_interval_columns_ablate_does(tiny_model_dir, one_thread):
    """Issue 53: ``prune`` returned ΔLoss without its interval while ``ablate`` gave one."""
    table = zones.prune(str(tiny_model_dir), strategies="last_n,random", k_max=2, seeds=1, seq_len=32,
                        eval_tokens=6 * 31, calibration_tokens=2 * 31)
    ablation = zones.ablate(str(tiny_model_dir), seq_len=32, eval_tokens=6 * 31)
    shared = {"delta_loss", "delta_loss_low", "delta_loss_high"}
    assert shared <= set(table.columns) and shared <= set(ablation.columns)
    assert (table["delta_loss_low"] <= table["delta_loss"]).all() and (table["delta_loss"] <= table["delta_loss_high"]).all()
    assert (table["delta_loss_high"] > table["delta_loss_low"]).all()
