"""The package's floors: a module imports only from the floors below it (or its own).

Read from the source, not by importing: every ``import zones...`` and ``from zones... import``
(absolute, and relative ones resolved) in ``zones/``. The subpackages are floors, and so are the
top-level modules above them, up to the package itself (``zones/__init__.py``, whose names are the
API's): an import of ``zones`` from below it runs back up. The README's module table follows the
same order; a new subpackage or top-level module must be placed here first. And no two library
modules share a file name (a name says its job: ``measure/scoring.py`` scores windows,
``zones/evaluation.py`` is zones evaluate).
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "zones"
# Bottom to top, a floor's rooms side by side: the subpackages, then the book's kernel and pages
# extension, the book, the subcommands' modules, the API, the CLI, and the package itself.
FLOORS = [("core",), ("spectra",), ("measure",), ("analysis",), ("series",), ("pruning",), ("figures",), ("report",),
          ("kernel", "pages"), ("book",), ("evaluation", "studies"), ("api",), ("cli",), ("__main__",), ("zones",)]
LEVEL = {room: level for level, floor in enumerate(FLOORS) for room in floor}
# Imports that run back up: none (issue 52 removed the last three: the subcommands' modules made callable by
# the package, and the CLI reading them and ``__version__`` from it). A new one is a bug, not an entry here.
KNOWN_CLIMBS: set[tuple[str, str]] = set()


def floor_of(module: str) -> str:
    """``zones.measure.scoring`` → ``measure``; a top-level module (``zones.cli``) → ``cli``; the
    package itself (``zones``) → ``zones``."""
    parts = module.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every ``zones`` module ``path`` imports (relative imports resolved)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "zones"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "zones":
                found.add(target)
                for alias in node.names:  # `from zones.report import verdicts` imports a module too
                    sub = root.parent / f"{target}.{alias.name}".replace(".", "/")
                    if sub.is_dir() or sub.with_suffix(".py").exists():
                        found.add(f"{target}.{alias.name}")
    return found


SOURCES = sorted(ROOT.rglob("*.py"))


def test_every_subpackage_and_top_level_module_has_a_floor():
    rooms = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    rooms |= {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"} | {"zones"}
    missing = sorted(rooms - set(LEVEL))
    assert not missing, f"subpackages and top-level modules without a floor in FLOORS: {missing}"


def climbs(path: Path, root: Path = ROOT) -> list[str]:
    """The modules ``path`` imports from a floor above its own."""
    own = LEVEL[floor_of(module_name(path, root))]
    return sorted(m for m in imported_modules(path, root) if LEVEL[floor_of(m)] > own)


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT.parent)))
def test_no_import_climbs_a_floor(path):
    rel = path.relative_to(ROOT.parent).as_posix()
    upward = [m for m in climbs(path) if (rel, m) not in KNOWN_CLIMBS]
    assert not upward, f"{rel} ({floor_of(module_name(path))}) imports from above: {upward}"


def test_every_known_climb_is_still_there():
    """The list of climbs may only shrink: one that is gone is taken out of KNOWN_CLIMBS."""
    gone = sorted((rel, m) for rel, m in KNOWN_CLIMBS if m not in climbs(ROOT.parent / rel))
    assert not gone, f"no longer climbing, take them out of KNOWN_CLIMBS: {gone}"


def test_the_check_sees_an_upward_import(tmp_path):
    """Relative imports are resolved, so a climb written as ``from ..report import verdicts`` is caught."""
    root = tmp_path / "zones"
    for folder in ("measure", "report"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "report" / "verdicts.py").write_text("")
    source = root / "measure" / "x.py"
    source.write_text("from ..report import verdicts\nfrom zones.core import checks\n")
    assert imported_modules(source, root) == {"zones.report", "zones.report.verdicts", "zones.core"}
    assert floor_of("zones.report.verdicts") == "report" and floor_of(module_name(source, root)) == "measure"


def test_the_check_sees_a_top_level_module_import_the_one_above_it_or_the_package(tmp_path):
    """Before issue 52 the top-level modules shared one floor, and an import of the package itself
    (``from zones import __version__`` in ``pruning/export.py``) was not read as one."""
    root = tmp_path / "zones"
    (root / "pruning").mkdir(parents=True)
    for path in ("__init__.py", "api.py", "book.py", "pruning/__init__.py"):
        (root / path).write_text("")
    (root / "book.py").write_text("from zones.api import heal\n")
    (root / "pruning" / "export.py").write_text("from zones import __version__\nfrom zones.core import checks\n")
    assert climbs(root / "book.py", root) == ["zones.api"]
    assert climbs(root / "pruning" / "export.py", root) == ["zones"]


# --- the report floor: chapter modules share rules through zones.report.verdicts only --------------------

REPORT = ROOT / "report"


def chapter_imports(path: Path, chapters, root: Path = ROOT) -> list[str]:
    """The chapter modules (``zones.report.<chapter>``) that ``path`` imports, other than itself."""
    own = module_name(path, root)
    names = {f"zones.report.{c}" for c in chapters}
    return sorted(m for m in imported_modules(path, root) if m in names and m != own)


def _chapters():
    from zones.report import CHAPTERS

    return CHAPTERS


@pytest.mark.parametrize("chapter", _chapters())
def test_no_chapter_module_imports_another(chapter):
    path = REPORT / f"{chapter}.py"
    assert path.exists(), f"zones/report/{chapter}.py is listed in zones.report.CHAPTERS but missing"
    found = chapter_imports(path, _chapters())
    assert not found, (f"zones/report/{chapter}.py imports chapter module(s) {found}: share the rule through "
                       f"zones.report.verdicts (or the statistic through zones.analysis) instead")


def test_the_chapter_check_sees_a_chapter_import(tmp_path):
    root = tmp_path / "zones"
    (root / "report").mkdir(parents=True)
    for name in ("__init__", "verdicts", "healing", "claims"):
        (root / "report" / f"{name}.py").write_text("")
    source = root / "report" / "claims.py"
    source.write_text("from . import healing\nfrom zones.report.verdicts import HOLDS\n")
    assert chapter_imports(source, ("healing", "claims"), root) == ["zones.report.healing"]


# --- the report floor computes no statistics: it calls the library's and writes words ------------

# What only the library does: resampling and random draws, describing a spectrum, and a pruning
# sweep (the pruning chapter's own call excepted: the sweep is what that chapter reports).
COMPUTING = {"paired_bootstrap", "unit_bootstrap", "default_rng", "spectral_table", "marchenko_pastur_fit",
             "density_picture", "rank_picture", "pruning_sweep"}
OWN_CALL = {"pruning_sweep": {"pruning"}}


def computing_names(path: Path) -> set[str]:
    """The names of :data:`COMPUTING` that ``path`` imports or reads, and ``scipy`` if it imports it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found |= {a.name for a in node.names if a.name in COMPUTING}
            found |= {"scipy"} if (node.module or "").split(".")[0] == "scipy" else set()
        elif isinstance(node, ast.Import):
            found |= {"scipy"} if any(a.name.split(".")[0] == "scipy" for a in node.names) else set()
        elif isinstance(node, ast.Attribute) and node.attr in COMPUTING:
            found.add(node.attr)
    return found


@pytest.mark.parametrize("path", sorted(REPORT.glob("*.py")), ids=lambda p: p.name)
def test_report_modules_call_the_librarys_statistics(path):
    found = {n for n in computing_names(path) if path.stem not in OWN_CALL.get(n, ())}
    assert not found, (f"zones/report/{path.name} computes {sorted(found)} itself: move it to zones.analysis, "
                       f"zones.spectra or zones.pruning and call that")


def test_the_statistics_check_sees_a_chapters_own_bootstrap(tmp_path):
    """task_accuracy before issue 40 bootstrapped its examples itself; across_models swept pruning."""
    source = tmp_path / "task_accuracy.py"
    source.write_text("import scipy.stats\nfrom zones.measure.bootstrap import N_RESAMPLES, paired_bootstrap\n"
                      "from zones.pruning import pruning_sweep\n")
    assert computing_names(source) == {"scipy", "paired_bootstrap", "pruning_sweep"}


# --- one name, one module: a library module's name says its job ----------------------------------

# The floors whose modules are the library; figures and report have one module per chapter, named
# after its chapter (zones.report.sublayers beside zones.figures.sublayers is that convention).
LIBRARY_FLOORS = ("core", "spectra", "measure", "analysis", "series", "pruning")


def library_module_names(root: Path = ROOT) -> dict[str, list[str]]:
    """File name → the library modules (and subpackages) of that name: the top-level modules and
    everything under :data:`LIBRARY_FLOORS` (``__init__`` and ``__main__`` aside)."""
    paths = list(root.glob("*.py"))
    paths += [p for floor in LIBRARY_FLOORS for p in (root / floor).rglob("*.py")]
    paths += [p.parent for floor in LIBRARY_FLOORS for p in (root / floor).rglob("*/__init__.py")]
    found: dict[str, list[str]] = {}
    for path in paths:
        if path.stem in ("__init__", "__main__"):
            continue
        found.setdefault(path.stem, []).append(str(path.relative_to(root.parent)))
    return found


def test_no_two_library_modules_share_a_name():
    """``measure/evaluate.py`` (the loss) beside ``zones/evaluate.py`` (lm-eval tasks), three
    ``sublayers.py`` doing three jobs: a name is one module's, and says what it does."""
    shared = {name: sorted(paths) for name, paths in library_module_names().items() if len(paths) > 1}
    assert not shared, f"library modules sharing a name (rename one after its job): {shared}"


def test_the_name_check_sees_two_modules_of_one_name(tmp_path):
    root = tmp_path / "zones"
    for folder in ("measure", "pruning", "report", "measure/tasks"):
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    for path in ("evaluate.py", "measure/evaluate.py", "pruning/sweep.py", "report/sweep.py", "measure/tasks/data.py"):
        (root / path).write_text("")
    names = library_module_names(root)
    assert sorted(names["evaluate"]) == ["zones/evaluate.py", "zones/measure/evaluate.py"]
    assert names["sweep"] == ["zones/pruning/sweep.py"]  # a chapter module is named after its chapter
    assert names["tasks"] == ["zones/measure/tasks"] and names["data"] == ["zones/measure/tasks/data.py"]


# --- issue 52: zones.core.cache split by job: its moved names are imported from their homes only ---------

def names_imported_from(path: Path, module: str) -> set[str]:
    """The names ``path`` imports with ``from module import ...`` (inside functions too)."""
    return {alias.name for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == module
            for alias in node.names}


def test_every_name_imported_from_the_cache_module_lives_there():
    """After the split no module imports a name from ``zones.core.cache`` that moved to another
    module (the old map of moved names, and its ``__getattr__``, are gone)."""
    import zones.core.cache as cache

    project = ROOT.parent
    paths = [p for folder in ("zones", "tests", "benchmarks") for p in sorted((project / folder).rglob("*.py"))]
    missing = [f"{path.relative_to(project).as_posix()}: {name}" for path in paths
               for name in names_imported_from(path, "zones.core.cache") if not hasattr(cache, name)]
    assert not missing, f"names imported from zones.core.cache that it does not hold: {missing}"
    assert not hasattr(cache, "MOVED") and not hasattr(cache, "__getattr__")


# --- the README's module table: every module, floor by floor, in the order above -------------------------

def readme_floors(readme: Path = ROOT.parent / "README.md") -> list[tuple[set[str], set[str]]]:
    """The README's module table as ``(rooms, modules)`` per floor, bottom to top: the names in
    backticks of a row's floor cell (a row with an empty one is the floor above's) and of its
    module cells."""
    lines = readme.read_text().splitlines()
    start = lines.index("| floor | module | job |")
    floors: list[tuple[set[str], set[str]]] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        floor, module = re.split(r"(?<!\\)\|", line.strip().strip("|"))[:2]
        if floor.strip():
            floors.append((set(re.findall(r"`([^`]+)`", floor)), set()))
        floors[-1][1].update(re.findall(r"`([^`]+)`", module))
    return floors


def floor_modules(room: str, root: Path = ROOT) -> set[str]:
    """What the README names on ``room``'s floor: a subpackage's modules and subpackages (not those
    named after a chapter: one module per chapter, the table says), a top-level module itself, the
    package's ``__init__``."""
    if room == "zones":
        return {"__init__"}
    folder = root / room
    if not folder.is_dir():
        return {room}
    names = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    return names - {"__init__"} - set(_chapters())


def test_the_readmes_module_table_names_every_module_on_its_floor():
    floors = readme_floors()
    assert [rooms for rooms, _ in floors] == [set(floor) for floor in FLOORS], \
        "README.md's module table has other floors, or another order, than FLOORS"
    missing = {room: sorted(floor_modules(room) - modules) for rooms, modules in floors for room in rooms}
    missing = {room: names for room, names in missing.items() if names}
    assert not missing, f"modules missing from README.md's module table, by floor: {missing}"
