"""One vocabulary: every parameter of a chapter's parameters cell, of a ``zones.report.<chapter>.run``
signature and of a subcommand's flags is a term of ``zones.core.glossary``, with one meaning (type)
and the glossary's ``cpu`` default; the presets (class, cpu, gpu) are the glossary's table, and the
README's budget table is that table. Below the surface (issue 40): the library's keywords, the
``summary.json`` keys the chapters write, one ``CHAPTERS``, and every default written once."""
from __future__ import annotations

import argparse
import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from zones.core import glossary
from zones.core.glossary import BUDGETS, TERMS, check_value, default, flag_uses, parse_text, preset, problems

ROOT = Path(__file__).resolve().parents[1]


def chapter_names() -> list[str]:
    from zones.book import chapters

    return chapters(ROOT)


def cell_uses(source: str) -> dict[str, dict]:
    """The parameters cell's assignments: name -> {default}; a value that is not a literal
    (an expression) is a use without a default to compare."""
    uses = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    try:
                        uses[target.id] = dict(default=ast.literal_eval(node.value))
                    except ValueError:
                        uses[target.id] = {}
    return uses


def parameters_cell(path: Path) -> str:
    import jupytext

    cells = [c for c in jupytext.read(path).cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path}: needs exactly one parameters cell"
    return cells[0].source


def signature_uses(func) -> dict[str, dict]:
    """A function's parameters: name -> {default, annotation} (``inspect``; annotations as text)."""
    uses = {}
    for p in inspect.signature(func).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        use = {}
        if p.default is not p.empty:
            use["default"] = p.default
        if p.annotation is not p.empty:
            use["annotation"] = p.annotation if isinstance(p.annotation, str) else getattr(
                p.annotation, "__name__", str(p.annotation))
        uses[p.name] = use
    return uses


def subcommands() -> dict[str, argparse.ArgumentParser]:
    from zones.cli import build_parser

    parser = build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


# --- the project is held to the glossary -------------------------------------------------------

@pytest.mark.parametrize("name", chapter_names())
def test_every_notebook_parameter_is_a_glossary_term_with_its_cpu_default(name):
    path = ROOT / "notebooks" / f"{name}.md"
    found = problems(f"notebooks/{name}.md", name, cell_uses(parameters_cell(path)))
    assert not found, "\n".join(found)


@pytest.mark.parametrize("name", chapter_names())
def test_every_run_signature_is_held_to_the_glossary(name):
    module = importlib.import_module(f"zones.report.{name}")
    found = problems(f"zones.report.{name}.run", name, signature_uses(module.run))
    assert not found, "\n".join(found)


def test_every_chapter_parameter_reaches_its_run_under_the_same_name():
    """What a reader changes in the parameters cell reaches ``run`` under the same name."""
    for name in chapter_names():
        cell = cell_uses(parameters_cell(ROOT / "notebooks" / f"{name}.md"))
        run = signature_uses(importlib.import_module(f"zones.report.{name}").run)
        assert set(cell) <= set(run), f"notebooks/{name}.md: {sorted(set(cell) - set(run))} are not run()'s"


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_subcommand_flag_is_held_to_the_glossary(command):
    found = problems(f"zones {command}", command, flag_uses(subcommands()[command]))
    assert not found, "\n".join(found)


def test_the_glossary_is_consistent():
    from zones.series.config import PROFILES

    assert set(glossary.PROFILE_NAMES) == set(PROFILES)
    for name, t in TERMS.items():
        assert t.meaning and "\n" not in t.meaning, name
        for budget in BUDGETS:  # every budget's default is a value of the term's type
            value = default(name, budget, "pruning")
            assert value is None or check_value(name, value) == (value or None if t.type == "tokens" else value), \
                (name, budget, value)
    assert default("eval_tokens", "cpu", "pruning") == 2040 and default("eval_tokens", "cpu", "layer_ablation") == 3060
    assert default("out_dir", "cpu", "healing") == "results/healing"
    assert default("seq_len", "gpu", "layer_ablation") == 1024 and default("seq_len", "gpu", "pruning") == 256


# --- the check catches each kind of slip ------------------------------------------------------

def test_the_check_catches_an_unknown_name_a_second_meaning_and_another_default():
    cell = cell_uses('models = ["smollm2-135m"]\neval_tokenz = 6120\nseeds = [0, 1]\neval_tokens = 6000\n'
                     'estimator = "alpha_shape"\n')
    found = problems("notebooks/fake.md", "layer_ablation", cell)
    assert len(found) == 4, found
    unknown, meaning, other_default, unknown_estimator = found
    assert unknown.startswith("notebooks/fake.md: eval_tokenz is not in the glossary")
    assert meaning.startswith("notebooks/fake.md: default parameter seeds must be an integer >= 1 or None")
    assert other_default == ("notebooks/fake.md: eval_tokens defaults to 6000, but the glossary's cpu default "
                             "for layer_ablation is 3060")
    assert "estimator is not in the glossary" in unknown_estimator  # one name: alpha_estimator


def test_the_check_reads_a_signature_and_its_annotations():
    def run(models=("smollm2-135m",), seeds: list[int] | None = None, k_max: int = 8, batch_size: str = "8",
            *, progress: bool | None = None):
        """A fake chapter: seeds as a list, batch_size as a string."""

    found = problems("zones.report.fake.run", "pruning", signature_uses(run))
    assert any(f.startswith("zones.report.fake.run: seeds is used as list") for f in found), found
    assert any(f.startswith("zones.report.fake.run: batch_size is used as str") for f in found), found
    assert not any(" models " in f or "k_max" in f or "progress" in f for f in found), found
    assert any("seeds defaults to None, but the glossary's cpu default for pruning is 8" in f for f in found) \
        is False  # a second meaning is reported once, not twice


def test_the_check_walks_a_subcommands_flags():
    parser = argparse.ArgumentParser(prog="zones fake")
    parser.add_argument("--eval-tokens", type=int, default=6000)       # another default
    parser.add_argument("--seeds", default="0,1")                       # a second meaning (a list as text)
    parser.add_argument("--no-cache", action="store_true")              # outside the glossary: --refresh
    parser.add_argument("--method", choices=["prefix", "naive"], default="prefix")  # heal's method: lora|bridge
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])  # fine
    found = problems("zones fake", "ablate", flag_uses(parser))
    assert len(found) == 4, found
    assert "zones fake: eval_tokens defaults to 6000, but the glossary's cpu default for ablate is 3060" in found
    assert any(f.startswith("zones fake: seeds is used as str") for f in found)
    assert any(f.startswith("zones fake: no_cache is not in the glossary") for f in found)
    assert any(f.startswith("zones fake: method takes prefix, naive, but the glossary's method takes lora, bridge")
               for f in found)


# --- values ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, expected", [
    ("eval_tokens", "6120", 6120), ("eval_tokens", "0", None), ("eval_tokens", "null", None),
    ("models", "[a, b]", ["a", "b"]), ("models", "smollm2-135m", ["smollm2-135m"]),
    ("k_values", "[2, 4]", [2, 4]), ("seeds", "3", 3), ("train_overrides", "{steps: 80}", {"steps": 80}),
    ("block_agreement", "true", True), ("lr", "2e-4", 2e-4), ("models", "a,b", ["a", "b"]),
    ("corpus", "2020", "2020"),  # a string parameter keeps its text
])
def test_values_are_parsed_by_their_type(name, text, expected):
    assert parse_text(name, text) == expected


@pytest.mark.parametrize("name, text, message", [
    ("eval_tokens", "abc", "parameter eval_tokens must be a number of tokens (an integer >= 1), or None or 0 "
                           "for the whole split; got 'abc'"),
    ("models", "[bad", "parameter models: '[bad' is not a value"),
    ("seeds", "[0, 1]", "parameter seeds must be an integer >= 1 or None; got [0, 1]"),
    ("k_values", "4", "parameter k_values must be a list of ints >= 1; got 4"),
    ("methods", "[lora, qlora]", "parameter methods must be a list of strs from lora, bridge; got ['lora', 'qlora']"),
    ("block_agreement", "1", "parameter block_agreement must be true or false; got 1"),
])
def test_a_bad_value_is_one_line_naming_the_parameter(name, text, message):
    with pytest.raises(ValueError) as err:
        parse_text(name, text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown parameter n_resamplez: not in the glossary .*n_resamples"):
        glossary.term("n_resamplez")


def test_command_line_lists_are_comma_separated():
    assert parse_text("strategies", "zone_aware,last_n", commas=True) == ["zone_aware", "last_n"]
    assert parse_text("depths", "8,12", commas=True) == [8, 12]
    assert parse_text("models", "a,b", commas=True) == ["a", "b"]
    assert parse_text("ray_address", "10.0.0.1:6379", commas=True) == "10.0.0.1:6379"


# --- the presets ----------------------------------------------------------------------------

def test_presets_are_the_budget_columns_that_differ_from_cpu():
    names = ["models", "seq_len", "eval_tokens", "calibration_tokens", "k_max", "seeds", "strategies", "batch_size"]
    assert preset("cpu", "pruning", names) == {}
    assert preset("class", "pruning", names) == dict(seq_len=64, eval_tokens=504, calibration_tokens=126, k_max=3)
    gpu = preset("gpu", "pruning", names)
    assert gpu["eval_tokens"] == 16320 and gpu["calibration_tokens"] == 8160 and gpu["seeds"] == 20
    assert preset("gpu", "layer_ablation", ["eval_tokens", "seq_len"]) == dict(eval_tokens=None, seq_len=1024)
    assert preset("class", "depth_series", ["profile"]) == dict(profile="class")
    with pytest.raises(ValueError, match="budget must be one of class, cpu, gpu; got 'laptop'"):
        preset("laptop", "pruning", names)


def readme_budget_table() -> dict[tuple[str, str], dict[str, str]]:
    """The README's budget table: (parameter, chapter) -> {class, cpu, gpu} cells, as written."""
    text = (ROOT / "README.md").read_text()
    start = text.index("| parameter | chapters | class | cpu (default) | gpu |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        name, where, *cells = [c.strip().strip("`") for c in line.strip("|").split("|")]
        for chapter in where.split(", "):
            rows[(name, chapter)] = dict(zip(BUDGETS, cells))
    return rows


def test_the_readmes_budget_table_is_the_glossarys():
    from zones.book import budget_table

    rows = readme_budget_table()
    assert rows, "README.md has no budget table"
    expected = {(r["parameter"], c): dict(zip(BUDGETS, (r[b] for b in BUDGETS)))
                for r in budget_table(ROOT) for c in r["chapters"].split(", ")}
    assert rows == expected, "README.md's budget table differs from the glossary's presets; regenerate it: " \
        "python -c 'from zones.book import budget_table; from zones.core.glossary import budget_markdown; " \
        "print(budget_markdown(budget_table()))'"
    assert re.search(r"\| `?eval_tokens`? \| .*pruning.* \| `?504`? \| `?2040`? \| `?16320`? \|", "\n".join(
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| ")))


# --- below the surface: the library's keywords, summary.json keys, constants --------------------

def library_functions():
    """``(qualified name, function)`` of every public function and method of zones' modules."""
    import pkgutil

    import zones

    for info in pkgutil.walk_packages(zones.__path__, "zones."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isfunction(obj):
                yield f"{module.__name__}.{name}", obj
            elif inspect.isclass(obj):
                for attr, member in vars(obj).items():
                    if inspect.isfunction(member) and not attr.startswith("_"):
                        yield f"{module.__name__}.{name}.{attr}", member


# The library's uses of a glossary name with another meaning or default that are known and not yet
# renamed (issue 40): name -> (why, the functions). The list may only shrink: a new use fails, and
# so does an entry that no longer is one (take it out).
_PROGRESS = ("zones.analysis.importance.measure_models", "zones.analysis.quantization.quantization_effect",
             "zones.api.ablate", "zones.api.alpha_table", "zones.book.build.build_book", "zones.book.execute.execute_chapters",
             "zones.core.executors.run_jobs", "zones.measure.ablation.ablation_table",
             "zones.measure.ablation.ablation_window_losses", "zones.measure.agreement.agreement_window_losses",
             "zones.measure.scoring.evaluate_loss", "zones.measure.scoring.evaluate_removals",
             "zones.measure.scoring.score_windows", "zones.pruning.export.choose_removed", "zones.pruning.heal.heal",
             "zones.pruning.compare.pair_at_k", "zones.pruning.sublayer_pruning.plan_table",
             "zones.pruning.sublayer_pruning.score_plans",
             "zones.pruning.sublayer_pruning.sublayer_greedy_order", "zones.pruning.sweep.pruning_sweep",
             "zones.report.sublayers.series_rho_table", "zones.series.checkpoints.checkpoint_snapshot",
             "zones.series.checkpoints.lifecycle_snapshots", "zones.series.checkpoints.snapshot_rows",
             "zones.series.loop.train_model", "zones.series.runs.series_importance",
             "zones.series.runs.series_quantization", "zones.series.runs.series_sublayer_rho",
             "zones.series.runs.train_series", "zones.spectra.gram.gram_eigenvalues",
             "zones.spectra.alpha_sweep.alpha_sweep",
             "zones.spectra.table.alpha_table", "zones.spectra.table.spectral_table", "zones.studies.study")
KNOWN = {
    "progress": ("a library function's own True/False (bars in a terminal, none inside a job); the chapters and "
                 "commands pass the glossary's", _PROGRESS),
    "n_resamples": ("a power simulation's own count (400 per simulated interval)",
                    ("zones.analysis.power.asymmetry_draws", "zones.analysis.power.crossover_draws",
                     "zones.analysis.power.first_block_draws", "zones.analysis.power.mean_draws",
                     "zones.analysis.power.ratio_draws", "zones.analysis.power.rho_draws",
                     "zones.analysis.power.shape_draws", "zones.analysis.power.wave_draws",
                     "zones.analysis.power.depth_draws")),
    "n_permutations": ("a power simulation's own count (400 per simulated p-value)", ("zones.analysis.power.rho_draws",
                                                                                     "zones.analysis.power.depth_draws")),
    "device": ("a torch.device or its name", ("zones.core.hardware.auto_precision", "zones.core.hardware.check_precision",
                                              "zones.core.hardware.native_bf16")),
    "seeds": ("the primer's heavy-tail draws (5)", ("zones.spectra.described.tail_seeds",)),
    "strategies": ("the strategies a figure draws by default", ("zones.figures.pruning.delta_ppl_bars",)),
}


def library_problems() -> dict[str, dict[str, str]]:
    """name -> {function: problem} for every library signature (chapters' ``run``: checked above)."""
    found: dict[str, dict[str, str]] = {}
    chapters = {f"zones.report.{c}.run" for c in glossary.CHAPTERS}
    for where, function in library_functions():
        if where in chapters:
            continue
        for line in problems(where, None, signature_uses(function), library=True):
            name = line.removeprefix(f"{where}: ").removeprefix("default parameter ").split(" ")[0]
            found.setdefault(name, {})[where] = line
    return found


def test_the_librarys_keywords_are_the_glossarys():
    """A library keyword with a glossary name has the glossary's meaning and one of its defaults;
    a name the glossary retired (estimator: alpha_estimator) is nowhere."""
    found = library_problems()
    new = [line for name, lines in found.items() for where, line in lines.items()
           if where not in KNOWN.get(name, ("", ()))[1]]
    assert not new, "\n".join(new)
    gone = [f"{name}: {where}" for name, (_, functions) in KNOWN.items() for where in functions
            if where not in found.get(name, {})]
    assert not gone, "no longer a problem, take it out of KNOWN:\n" + "\n".join(gone)


def test_the_library_check_catches_the_old_keywords():
    """What the library wrote before issue 40: estimator=, an α role named role, eval tokens of another
    chapter, memory_budget in bytes."""
    def layer_alpha(table, estimator: str = "alpha_shape", role: str = "weighted"):
        """The old spectra.layer_alpha."""

    def ablation_table(model, windows, *, eval_tokens: int | None = 3061, memory_budget: float = 256 * 2**20):
        """Another chapter's budget, and bytes where the glossary says MB."""

    found = problems("old.layer_alpha", None, signature_uses(layer_alpha), library=True)
    assert any("estimator is not in the glossary (zones/core/glossary.py): the glossary's name is alpha_estimator"
               in f for f in found), found
    assert any("role defaults to 'weighted', but the glossary's cpu defaults of role are 'q'" in f
               or "parameter role must be a string from q, k" in f and "got 'weighted'" in f for f in found), found
    found = problems("old.ablation_table", None, signature_uses(ablation_table), library=True)
    assert any(f.startswith("old.ablation_table: eval_tokens defaults to 3061") for f in found), found
    assert any(f.startswith("old.ablation_table: memory_budget defaults to 268435456") for f in found), found


def summary_keys(path: Path) -> dict[str, ast.expr]:
    """The keys a chapter module writes to ``summary.json``: the keywords of ``summary = dict(...)``
    and the names of ``summary["name"] = ...``, with the value written."""
    keys = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "summary" for t in node.targets) \
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "dict":
            keys.update({k.arg: k.value for k in node.value.keywords if k.arg})
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Subscript) and getattr(t.value, "id", None) == "summary" \
                        and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                    keys[t.slice.value] = node.value
    return keys


def summary_problems(path: Path) -> list[str]:
    """A retired key, or a parameter of ``run`` written under another name (``estimator=estimator``
    where run takes alpha_estimator; ``role=alpha_role``)."""
    run = next(node for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and node.name == "run")
    parameters = {a.arg for a in run.args.args + run.args.kwonlyargs}
    found = []
    for key, value in summary_keys(path).items():
        if key in glossary.RETIRED:
            found.append(f"{path.name}: summary.json key {key} is retired: the glossary's name is "
                         f"{glossary.RETIRED[key]}")
        elif isinstance(value, ast.Name) and value.id in parameters and value.id != key and \
                (key in TERMS or value.id in TERMS):
            found.append(f"{path.name}: summary.json writes run's {value.id} as {key}: one name")
    return found


@pytest.mark.parametrize("name", sorted(glossary.CHAPTERS))
def test_summary_json_keys_are_the_glossarys(name):
    found = summary_problems(ROOT / "zones" / "report" / f"{name}.py")
    assert not found, "\n".join(found)


def test_the_summary_check_catches_the_old_keys(tmp_path):
    """alpha_profile's summary.json before issue 40 wrote the α estimator as estimator."""
    old = tmp_path / "alpha_profile.py"
    old.write_text("def run(models, role='q', alpha_estimator='alpha_shape'):\n    estimator = alpha_estimator\n"
                   "    summary = dict(model=models[0], role=role, estimator=estimator)\n"
                   "    summary['alpha_role'] = role\n")
    found = summary_problems(old)
    assert found == ["alpha_profile.py: summary.json key estimator is retired: the glossary's name is alpha_estimator",
                     "alpha_profile.py: summary.json writes run's role as alpha_role: one name"]


def test_a_summary_written_under_a_retired_key_is_stale_not_misread(tmp_path):
    import json

    from zones.report.common import StaleSummaryError, read_summary

    (tmp_path / "summary.json").write_text(json.dumps(dict(estimator="alpha_esd", role="q")))
    with pytest.raises(StaleSummaryError, match="estimator is now alpha_estimator.*run its chapter again"):
        read_summary(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps(dict(alpha_estimator="alpha_esd")))
    assert read_summary(tmp_path) == dict(alpha_estimator="alpha_esd")


def test_the_chapters_are_one_list():
    """``zones.core.glossary.CHAPTERS`` is the only ``CHAPTERS`` (zones.report's is it), and it
    names the book's chapters (_toc.yml)."""
    from zones import report

    assert report.CHAPTERS is glossary.CHAPTERS
    assert set(glossary.CHAPTERS) == set(chapter_names())
    defined = [str(path.relative_to(ROOT)) for path in (ROOT / "zones").rglob("*.py")
               for node in ast.parse(path.read_text()).body if isinstance(node, ast.Assign)
               for t in node.targets if isinstance(t, ast.Name) and t.id == "CHAPTERS"]
    assert defined == ["zones/core/glossary.py"], defined


def literal_constants() -> list[tuple[str, str, object]]:
    """Module-level constants of zones named after a glossary term — ``DEFAULT_<term>``, or a
    number named as its term (``N_RESAMPLES``, ``K_MAX``) — whose value is written out (a literal or
    arithmetic on literals)."""
    found = []
    for path in sorted((ROOT / "zones").rglob("*.py")):
        if path.name == "glossary.py":
            continue
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.Assign) or len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                continue
            name = node.targets[0].id
            term = name.removeprefix("DEFAULT_").lower()
            term = {"k": "k_values"}.get(term, term)
            numbers = term in TERMS and TERMS[term].type in ("int", "float", "tokens")  # not a tuple of choices
            if term not in TERMS or not (name.startswith("DEFAULT_") or numbers) or not all(isinstance(n, (ast.Constant, ast.BinOp, ast.Tuple, ast.List, ast.operator,
                                                           ast.expr_context, ast.UnaryOp, ast.unaryop))
                                            for n in ast.walk(node.value)):
                continue
            found.append((str(path.relative_to(ROOT)), name, eval(compile(ast.Expression(node.value), "", "eval"))))
    return found


def test_every_default_is_written_once_in_the_glossary():
    """A library constant named after a term takes its value from ``zones.core.glossary.default``:
    3060 written in measure/ablation.py and 2040 in pruning/sweep.py drifted apart from the glossary."""
    found = literal_constants()
    assert not found, "write these as zones.core.glossary.default(...):\n" + "\n".join(map(str, found))
