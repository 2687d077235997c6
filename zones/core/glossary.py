"""The project's one vocabulary: every parameter name, defined once, with its default per budget.

Every name that a chapter's parameters cell, a ``zones.report.<chapter>.run`` signature or a
``zones`` subcommand's flag uses is a :class:`Term` here: its name, its type (for lists the
element type), its meaning in one line, and its default in each budget — ``class`` (a class's
laptops: the whole book in minutes), ``cpu`` (the default: two CPU cores) and ``gpu`` (a
researcher's run). Those per-budget defaults *are* the presets: ``zones book --budget class``
passes each chapter the ``class`` column (:func:`preset`). A default may differ by *context*
(a chapter's name, or a subcommand's: the pruning chapter scores 2,040 eval tokens, the
ablation chapter 3,060); :func:`default` resolves it. A flag ``--eval-tokens`` is the term
``eval_tokens``.

API: ``TERMS`` (name → Term), :func:`term`, :func:`default`, :func:`preset`,
:func:`check_value` (parse and validate a value by its type; a one-line error naming the
parameter), :func:`parse_text` (a command-line or ``--param`` string), ``BUDGETS``, and
:func:`problems` — the check ``tests/test_glossary.py`` runs over every notebook, ``run`` and
flag: a name outside the glossary, a name used with another meaning (type), a default that is
not the glossary's ``cpu`` default — and below the surface, over every public function of the
library (``library=True``: a glossary name keeps its meaning and one of its defaults, a
``RETIRED`` name is nowhere) and every ``summary.json`` key a chapter writes. The library's
constants named after a term (``DEFAULT_EVAL_TOKENS``, ``N_RESAMPLES``) are :func:`default`'s
values, so each default is written once, here.

Adding a parameter anywhere: add its Term here first (name, type, meaning, defaults).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
import yaml

from zones.core.checks import DuplicateModelError, check_float, check_int, check_models

BUDGETS = ("class", "cpu", "gpu")   # cpu is the default budget
DEFAULT_BUDGET = "cpu"
ANY = "*"                            # the context key of a default that holds wherever no other is given

# The book's chapters, by name (notebooks/NAME.md, zones.report.NAME), each after the chapters whose
# results it reads: the one list (zones.report and the scorecard read it; _toc.yml lists the same set,
# tests/test_glossary.py checks), and with the subcommands the contexts a default may depend on.
CHAPTERS = ("primer", "alpha_profile", "layer_ablation", "importance_vs_alpha", "pruning", "healing", "task_accuracy",
            "sublayers", "predictors", "depth_series", "spectral_lifecycle", "across_models", "claims", "teaching")
ABLATION_CHAPTERS = ("layer_ablation", "importance_vs_alpha", "predictors", "across_models")  # they share one ablation cache
# The chapters that score in bfloat16 where native: those whose tables the two-precision benchmark
# (benchmarks/bench_book_precision.py) found to conclude what float32 does, and the chapters that read
# their ablation. Pruning stays float32 (bf16 planning moved greedy's 8th block and a "best" set); sublayers
# and task_accuracy stay float32 until the benchmark has compared them.
SCORING_CHAPTERS = ABLATION_CHAPTERS + ("healing",)

TYPES = ("int", "float", "bool", "str", "dict", "list[int]", "list[float]", "list[str]", "models", "tokens",
         "str | list[str]")


class ByContext(dict):
    """A default that depends on the context (chapter or subcommand); ``ANY`` holds elsewhere.
    A ``str`` value may name its context as ``{context}`` (``results/{context}``)."""

    def resolve(self, context: str | None) -> Any:
        value = self[context] if context in self else self.get(ANY, _MISSING)
        if value is _MISSING:
            raise KeyError(f"no default for context {context!r}; the contexts: {', '.join(self)}")
        return value.format(context=context) if isinstance(value, str) and "{context}" in value else value


def by(default: Any = None, **contexts: Any) -> ByContext:
    """``by(6120, pruning=3060)``: 6120 wherever no context says otherwise, 3060 in ``pruning``."""
    return ByContext({ANY: default, **contexts})


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


_MISSING = _Missing()


# every matrix role of the supported families (zones.core.adapters: Llama's gated MLP, GPT-NeoX and GPT-2's)
MATRIX_ROLES = ("q", "k", "v", "o", "mlp_gate", "mlp_up", "mlp_down", "mlp_in", "mlp_out")


@dataclass(frozen=True)
class Term:
    """One parameter: ``type`` (see ``TYPES``; ``tokens`` is a token budget: an int, or None
    or 0 for the whole split unless it has a ``minimum``), ``meaning`` (one line), ``defaults`` (budget → value or
    :class:`ByContext`; a budget not listed has the ``cpu`` default), and for checking:
    ``choices`` (of the value, or of each element of a list), ``minimum``, ``length`` (of a
    list), ``optional`` (None is a value: what it means is in ``meaning``); ``spelling``: its flag
    where the README promises another than the name with dashes (``out_dir`` is ``--out``)."""

    name: str
    type: str
    meaning: str
    defaults: Mapping[str, Any]
    choices: tuple = ()
    minimum: float | None = None
    length: int | None = None
    optional: bool = False
    spelling: str = ""   # its flag, where the README promises another than the name with dashes (--out)

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"term {self.name}: unknown type {self.type!r}; types: {', '.join(TYPES)}")
        if DEFAULT_BUDGET not in self.defaults or set(self.defaults) - set(BUDGETS):
            raise ValueError(f"term {self.name}: defaults need a {DEFAULT_BUDGET!r} entry and only budgets "
                             f"{BUDGETS}; got {sorted(self.defaults)}")

    @property
    def flag(self) -> str:
        """Its command-line spelling: ``eval_tokens`` → ``--eval-tokens`` (``out_dir``: ``--out``)."""
        return self.spelling or "--" + self.name.replace("_", "-")

    @property
    def shown_type(self) -> str:
        """The type as the README's table writes it."""
        text = {"tokens": "int (tokens)", "models": "list[str] (models)"}.get(self.type, self.type)
        if self.choices:
            text += " of " + "|".join(map(str, self.choices))
        return text + (" or None" if self.optional or self.whole_split else "")

    @property
    def whole_split(self) -> bool:
        """A token budget that takes None (or 0) for the whole split: one without a minimum."""
        return self.type == "tokens" and self.minimum is None


def _terms(*terms: Term) -> dict[str, Term]:
    found: dict[str, Term] = {}
    for t in terms:
        if t.name in found:
            raise ValueError(f"the glossary defines {t.name} twice")
        found[t.name] = t
    return found


ESTIMATOR_FLAGS = ("shape", "esd", "hill", "companions")
HEALING_METHODS = ("lora", "bridge")
HEALING_BRIDGES = ("one", "per_span")   # zones.pruning.heal.BRIDGES (tests/test_heal.py checks)
PROFILE_NAMES = ("class", "cpu", "paper")  # zones.series.config.PROFILES (tests/test_glossary.py checks)
QUANT_TYPE_NAMES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # zones.core.quantize.QUANT_TYPES (tests check)
PRUNING_STRATEGIES = ["zone_aware", "last_n", "last_n_keep_last", "random", "random_protected", "alpha_lowest",
                      "block_influence", "angular", "ablation_rank", "greedy", "protect_spread", "protect_spread_random",
                      "zone_aware_no_protection",
                      "zone_aware_no_spreading", "zone_aware_one_zone"]
MODEL = "smollm2-135m"

TERMS: dict[str, Term] = _terms(
    # --- what is measured ---------------------------------------------------------------------
    Term("models", "models", "the models a chapter measures (aliases, directories, .gguf files or hub ids); one "
         "string is one model; chapters that show one model in detail show the first",
         {"cpu": by([MODEL], book=None, sweep=None, study=None, evaluate=None)}),
    Term("pruning_eval_tokens", "tokens", "eval tokens per model of a pruning comparison read beside other "
         "measurements (the pruning chapter's eval_tokens, so its scored removals are reused); None (or 0): the "
         "whole split", {"cpu": 2040, "class": 504, "gpu": 16320}),
    Term("series_batch_size", "int", "windows per forward for the trained models of the depth series (the "
         "depth-series chapter's batch_size)", {"cpu": 16, "gpu": 32}, minimum=1),
    Term("model", "str", "one model: a built-in alias, local directory, .gguf file or hub id (zones lifecycle: "
         "the hub repository of --revisions)", {"cpu": by(MODEL, lifecycle=None, book=None, evaluate=None)}),
    Term("tokenizer", "str", "a tokenizer directory or hub id to use instead of the model's own",
         {"cpu": None}, optional=True),
    Term("trust_remote_code", "bool", "let a model's own Python code run", {"cpu": False}),
    Term("device", "str", "cpu, cuda, ... (None: cuda if available)", {"cpu": None}, optional=True),
    # The book's chapters that score SmolLM2 run "auto" (bench_book_precision: no conclusion changes); the
    # library and the commands stay float32 unless asked, so a call gives the same bits on every machine.
    Term("dtype", "str", "scoring precision of the forward passes; auto: bfloat16 where this machine runs it "
         "natively, else float32 (every page states the precision that produced it)",
         {"cpu": by("float32", **dict.fromkeys(SCORING_CHAPTERS, "auto"))},
         choices=("float32", "bfloat16", "auto")),
    # --- text and token budgets ---------------------------------------------------------------
    Term("corpus", "str", "text: stdlib, stdlib-code, wikitext2 or UTF-8 text file(s)/glob (zones train: "
         "None, the profile's)", {"cpu": by("stdlib", train=None)}),
    Term("seq_len", "int", "tokens per window (zones train: the training window; None, the profile's)",
         {"cpu": by(256, train=None),
          "class": by(64, train=None),
          "gpu": by(256, **dict.fromkeys(ABLATION_CHAPTERS, 1024), train=None)}, minimum=2),
    Term("batch_size", "int", "windows per forward (zones train: per step; None, the profile's)",
         {"cpu": by(8, depth_series=16, train=None),
          "gpu": by(16, depth_series=32, train=None)}, minimum=1),
    Term("eval_tokens", "tokens", "scored tokens of the eval split per model; None (or 0): the whole split",
         {"cpu": by(3060, pruning=2040, prune=2040, healing=2040, sublayers=1020, depth_series=8128),
          "class": by(504, healing=378, sublayers=252, depth_series=1016),
          "gpu": by(None, pruning=16320, healing=16320, sublayers=16320)}),
    Term("calibration_tokens", "tokens", "tokens of the calibration split (disjoint from eval) that the "
         "strategies plan on; zones ablate --split calibration scores them; None (or 0): the whole split",
         {"cpu": by(510, ablate=6120),
          "class": by(126, ablate=6120),
          "gpu": by(8160, predictors=8184, sublayers=2040, ablate=6120)}),
    Term("heal_tokens", "tokens", "healing budget: calibration tokens each pruned model is healed on",
         {"cpu": by(8160, heal=8192), "class": by(2016, heal=8192), "gpu": by(51000, heal=8192)},
         minimum=1),   # healing takes a budget, never "the whole split"
    Term("heal_holdout_tokens", "tokens", "calibration tokens healing never sees, scored before and after it: a "
         "repair that raises their loss fitted its own calibration tokens", {"cpu": 2040, "class": 504, "gpu": 8160},
         minimum=1),
    Term("heal_batch_size", "int", "calibration windows per healing step: LoRA's batch, the bridge's captured batch",
         {"cpu": 4}, minimum=1),
    Term("series_eval_tokens", "tokens", "held-out tokens scored per trained model of the depth series",
         {"cpu": by(2032, across_models=8128), "class": by(508, across_models=1016), "gpu": None}),
    Term("split", "str", "the windows zones ablate scores", {"cpu": "eval"}, choices=("eval", "calibration")),
    # --- pruning and healing ------------------------------------------------------------------
    Term("strategies", "list[str]", "pruning strategies compared (zones prune --list-strategies)",
         {"cpu": by(PRUNING_STRATEGIES, prune=PRUNING_STRATEGIES[:12],
                    healing=["zone_aware", "last_n_keep_last", "greedy", "random_protected"],
                    task_accuracy=["zone_aware", "last_n_keep_last", "greedy", "random_protected"])}),
    Term("block_strategies", "list[str]", "block pruning strategies set against the sublayer ones",
         {"cpu": ["zone_aware", "block_influence", "greedy"]}),
    Term("sublayer_strategies", "list[str]", "sublayer pruning strategies",
         # BlockPruner's greedy search (sublayer_greedy) costs about 30 reference forwards at k_max = 2 (153 s alone here):
         # a GPU budget's work
         {"cpu": ["attn_drop", "sublayer_similarity", "zone_aware_attn"],
          "gpu": ["attn_drop", "sublayer_similarity", "sublayer_greedy", "zone_aware_attn"]}),
    Term("reference", "str", "the strategy every other is compared with at the same budget", {"cpu": "zone_aware"}),
    Term("strategy", "str", "one pruning strategy that picks the blocks to remove", {"cpu": None}, optional=True),
    Term("k_max", "int", "largest number of blocks removed (sublayers: budgets of 1..k_max blocks' parameters)",
         {"cpu": by(8, sublayers=2), "class": by(3, sublayers=1), "gpu": by(8, sublayers=4)}, minimum=1),
    Term("k_values", "list[int]", "the numbers of blocks removed", {"cpu": [4, 8], "class": [2, 3]}, minimum=1),
    Term("k", "int", "the number of blocks the strategy removes", {"cpu": None}, minimum=1, optional=True),
    Term("remove", "list[int]", "the blocks to remove, by index (0 = first)", {"cpu": None}, minimum=0,
         optional=True),
    Term("seeds", "int", "a count: seeds 0..n-1 of every seeded strategy, or of every depth of the series "
         "(None: the training profile's own counts)",
         {"cpu": by(None, pruning=2, prune=2, healing=1, task_accuracy=1),
          "class": by(None, pruning=2, prune=8, healing=1, task_accuracy=1),
          "gpu": by(None, pruning=20, prune=8, healing=8, task_accuracy=8)}, minimum=1, optional=True),
    Term("seed", "int", "one random seed: of the resampling, of a seeded strategy and the healing, or the one "
         "training seed (zones train: None, the profile's seeds)", {"cpu": by(0, train=None)}, minimum=0,
         optional=True),
    Term("methods", "list[str]", "healing methods compared: bridge (closed form), lora (peft; a GPU's job)",
         {"cpu": ["bridge"], "gpu": ["bridge", "lora"]}, choices=HEALING_METHODS),
    Term("method", "str", "the healing method", {"cpu": by("lora", task_accuracy="bridge")}, choices=HEALING_METHODS),
    Term("bridges", "str", "where the bridge heal puts its linear maps: one (one d×d bridge per pruned model, at its "
         "last kept block: every strategy gets the same repair capacity) or per_span (one per removed span: "
         "unequal capacity)", {"cpu": "one"}, choices=HEALING_BRIDGES),
    # --- zero-shot tasks (lm-evaluation-harness) ------------------------------------------------
    Term("tasks", "list[str]", "lm-eval task names: zones' offline tasks (zones_next_sentence, zones_next_line; "
         "the group zones_offline) or any task lm-eval finds with its data",
         {"cpu": by(["zones_next_sentence", "zones_next_line"], evaluate=["zones_offline"])}),
    Term("limit", "int", "examples per task, the first ones (None: all)",
         {"cpu": by(100, evaluate=None), "class": by(6, evaluate=None), "gpu": by(200, evaluate=None)}, minimum=1,
         optional=True),
    Term("metric", "str", "the accuracy compared: acc (summed log-likelihood) or acc_norm (per byte)",
         {"cpu": by("acc_norm", evaluate="acc")}, choices=("acc", "acc_norm")),
    Term("agreement_examples", "int", "examples whose every choice both lm-eval and zones' own loss score",
         {"cpu": 2}, minimum=0),
    Term("include_path", "list[str]", "more folders of lm-eval task YAML files", {"cpu": []}),
    Term("lr", "float", "learning rate: of LoRA (healing), or the peak of training (zones train: None, the "
         "profile's)", {"cpu": by(2e-4, train=None)}, minimum=0, optional=True),
    Term("rank", "int", "LoRA rank", {"cpu": 8}, minimum=1),
    Term("ablation_method", "str", "how zones ablate sweeps: prefix reuses the shared prefix, naive runs one "
         "full forward per block (the same numbers)", {"cpu": "prefix"}, choices=("prefix", "naive")),
    Term("parts", "bool", "also remove only the attention / only the MLP of each block", {"cpu": False}),
    Term("list_strategies", "bool", "list the registered strategies and exit", {"cpu": False}),
    Term("speed_repeats", "int", "timed forwards per pruned variant (their median)",
         {"cpu": 2, "class": 1, "gpu": 5}, minimum=1),
    Term("block_agreement", "bool", "KL and top-1 agreement of every single-block ablation too",
         {"cpu": False, "gpu": True}),
    # --- spectra and statistics ---------------------------------------------------------------
    Term("alpha_estimator", "str", "the α column of zones.spectra.alpha_table a chapter reads (alpha_shape, "
         "alpha_esd, alpha_hill, ...)", {"cpu": "alpha_shape"}),
    # alpha_role is which α a block gets (a role's, or the weighted mean); role only ever names a matrix
    Term("alpha_role", "str", "the α a block gets: weighted (the parameter-weighted mean over its matrices) or "
         "one matrix's role (q, k, ...); the pruning strategies read q, the paper's", {"cpu": by("weighted", pruning="q",
                                                                                              prune="q")},
         choices=("weighted", *MATRIX_ROLES)),
    Term("role", "str", "one matrix of each block, by its role (q, k, v, o, mlp_*): the one drawn in detail "
         "(never weighted: that is an alpha_role)", {"cpu": "q"}, choices=MATRIX_ROLES),
    # --- the primer's random matrices and pictures ----------------------------------------------
    Term("position", "float", "where in depth a matrix is taken, from 0 (the first block) to 1 (the last)",
         {"cpu": 0.5}, minimum=0),
    Term("rows", "int", "rows of the random matrices (their aspect ratio q is rows / cols)", {"cpu": 500}, minimum=1),
    Term("cols", "int", "columns of the random matrices", {"cpu": 1000}, minimum=1),
    Term("tail_df", "float", "tail index ν of the heavy-tailed example (Student-t entries: the smaller, the heavier)",
         {"cpu": 1.5}, minimum=0),
    Term("tail_dfs", "list[float]", "the grid of tail indices ν the primer's slider runs over",
         {"cpu": [float(v) for v in np.arange(1.0, 8.01, 0.5).round(1)]}, minimum=0),
    Term("bins", "int", "bins of a density histogram", {"cpu": 40}, minimum=1),
    Term("estimators", "list[str]", "the estimators zones alpha computes (the others' columns stay empty)",
         {"cpu": list(ESTIMATOR_FLAGS)}, choices=ESTIMATOR_FLAGS),
    Term("window", "list[float]", "rank window of the spectral-shape fit, as fractions of n", {"cpu": [0.0, 0.5]},
         minimum=0, length=2),
    Term("delta_group", "str", "the matrices whose mean α per layer gives Δα", {"cpu": "all"},
         choices=("all", "Q/K", "V/O", "MLP")),
    Term("n_resamples", "int", "bootstrap resamples of every interval", {"cpu": 2000}, minimum=1),
    Term("n_permutations", "int", "permutations of every permutation p-value", {"cpu": 10000}, minimum=1),
    # --- the depth series and checkpoints -----------------------------------------------------
    Term("profile", "str", "the training profile of the depth series (None: no series)",
         {"cpu": "cpu", "class": by("class", train="cpu"), "gpu": by("paper", train="cpu")},
         choices=PROFILE_NAMES, optional=True),
    Term("depths", "list[int]", "depths of the series (None: the profile's)", {"cpu": None}, minimum=1,
         optional=True),
    Term("train_overrides", "dict", "any other training parameter of zones.series.TrainConfig, e.g. "
         "{steps: 800} (None: none)", {"cpu": None}, optional=True),
    Term("quant_type", "str", "the GGUF quantisation (zones.core.quantize) the trained runs' block matrices are "
         "round-tripped through, to measure what 4-bit weights change in α, ΔLoss and ρ (None: not measured)",
         {"cpu": "Q4_1"}, choices=QUANT_TYPE_NAMES, optional=True),
    Term("width", "int", "hidden size of every depth (None: width_per_layer × depth)", {"cpu": None}, minimum=1,
         optional=True),
    Term("width_per_layer", "int", "hidden size per block of depth (None: the profile's)", {"cpu": None},
         minimum=1, optional=True),
    Term("head_dim", "int", "attention head size (None: the profile's)", {"cpu": None}, minimum=1, optional=True),
    Term("vocab_size", "int", "BPE vocabulary size (None: the profile's)", {"cpu": None}, minimum=260,
         optional=True),
    Term("steps", "int", "optimizer steps (None: the profile's)", {"cpu": None}, minimum=1, optional=True),
    Term("snapshot_every", "int", "steps between spectral snapshots (None: the profile's)", {"cpu": None},
         minimum=1, optional=True),
    Term("set", "list[str]", "NAME=VALUE: any other training parameter of zones.series.TrainConfig", {"cpu": []}),
    Term("copy_models", "bool", "copy the trained models to OUT/models/depth-N-seed-S", {"cpu": False}),
    Term("keep_checkpoints", "bool", "keep the model of every snapshot step for zones lifecycle", {"cpu": False}),
    Term("checkpoints", "str | list[str]", "a checkpoint series: directories, a glob, or \"HUB_ID@rev,rev\" "
         "(None: the depth series)", {"cpu": None}, optional=True),
    Term("revisions", "list[str]", "hub revisions of --model, e.g. step0,step1000", {"cpu": None}, optional=True),
    Term("train_run", "str", "a zones train run (or its --out folder) kept with --keep-checkpoints",
         {"cpu": None}, optional=True),
    Term("memory_budget", "float", "MB of float64 matrices decomposed at once (0: no bound)", {"cpu": 256.0},
         minimum=0),
    # --- jobs -----------------------------------------------------------------------------------
    Term("executor", "str", "where independent jobs run: in this process, or one Ray task each",
         {"cpu": "local"}, choices=("local", "ray")),
    Term("ray_address", "str", "the Ray cluster to join (None: $RAY_ADDRESS, else a local instance)",
         {"cpu": None}, optional=True),
    Term("retries", "int", "retries of a job that failed for a transient reason", {"cpu": 2}, minimum=0),
    Term("cpus_per_job", "float", "CPUs each job asks for", {"cpu": 1.0}, minimum=0),
    Term("gpus_per_job", "float", "GPUs each job asks for (None: 1 where the cluster has GPUs, else 0)",
         {"cpu": None}, minimum=0, optional=True),
    Term("status", "str", "a study's --out folder: list its jobs (done, running, failed, waiting) from the state "
         "file the study keeps there, and exit (None: run the study)", {"cpu": None}, optional=True),
    Term("plan", "bool", "print the study's jobs, each one's cost in reference forwards and its estimated time, "
         "and exit before any work", {"cpu": False}),
    # --- where results go, and what is recomputed ---------------------------------------------
    Term("out_dir", "str", "the folder written to, checked before any work: a chapter's tables, a command's "
         "files (zones export and heal: the model directory)",
         {"cpu": by("results/{context}", alpha="results", ablate="results", prune="results", sweep="results",
                   evaluate="results", export=None, heal=None)}, spelling="--out"),
    Term("results_dir", "str", "the folder holding the chapters' results/<chapter>/ tables", {"cpu": "results"}),
    Term("summary_file", "str", "the front page's verdict list the scorecard writes (None: none)",
         {"cpu": "claims_summary.md"}, optional=True),
    Term("refresh", "bool", "recompute instead of reading the cache (and replace the entry)", {"cpu": False}),
    Term("progress", "bool", "progress bars (None: on, except in the book's pages)", {"cpu": None},
         optional=True),
    # --- the book -----------------------------------------------------------------------------
    Term("budget", "str", "the presets every chapter runs with: class (minutes, wider intervals), cpu (two "
         "cores), gpu (a GPU)", {"cpu": DEFAULT_BUDGET}, choices=BUDGETS),
    Term("only", "list[str]", "execute only these chapters", {"cpu": []}),
    Term("chapters", "list[str]", "the chapters a page lists (None: none)", {"cpu": None}, optional=True),
    Term("timed_budget", "str", "whose measured chapter times the teachers' page shows", {"cpu": "class"},
         choices=BUDGETS),
    Term("param", "list[str]", "NAME=VALUE: a chapter parameter (a YAML value), checked against the glossary "
         "(zones.core.glossary)",
         {"cpu": []}),
    Term("no_execute", "bool", "rebuild the HTML from chapters already executed", {"cpu": False}),
)


# Names once used for a term (keywords, summary.json keys): the check names the term to use instead.
RETIRED = {"estimator": "alpha_estimator", "out": "out_dir"}


def contexts(name: str, budget: str = DEFAULT_BUDGET) -> list:
    """Every default of ``name`` in ``budget``, one per context it names (and the one elsewhere):
    what a library function, which serves every chapter and command, may default to."""
    value = term(name).defaults.get(_check_budget(budget), term(name).defaults[DEFAULT_BUDGET])
    if not isinstance(value, ByContext):
        return [default(name, budget)]
    return [default(name, budget, None if c == ANY else c) for c in value if not (c == ANY and value[c] is None
                                                                                  and len(value) > 1)]


def term(name: str) -> Term:
    """The term ``name`` (a flag ``--eval-tokens`` or ``eval-tokens`` is ``eval_tokens``, ``--out`` is
    ``out_dir``); an unknown name is a one-line error listing the known ones."""
    key = name.lstrip("-").replace("-", "_")
    key = next((t.name for t in TERMS.values() if t.spelling == f"--{name.lstrip('-')}"), key)  # --out: out_dir
    if key not in TERMS:
        raise ValueError(f"unknown parameter {name}: not in the glossary (zones.core.glossary); the known "
                         f"parameters: {', '.join(sorted(TERMS))}")
    return TERMS[key]


def _check_budget(budget: str) -> str:
    if budget not in BUDGETS:
        raise ValueError(f"budget must be one of {', '.join(BUDGETS)}; got {budget!r}")
    return budget


def default(name: str, budget: str = DEFAULT_BUDGET, context: str | None = None) -> Any:
    """The default of ``name`` in ``budget`` (the ``cpu`` one where the budget gives none), in
    ``context`` (a chapter or subcommand name) when it depends on it. Lists come as new lists."""
    t = term(name)
    value = t.defaults.get(_check_budget(budget), t.defaults[DEFAULT_BUDGET])
    if isinstance(value, ByContext):
        value = value.resolve(context)
    return list(value) if isinstance(value, (list, tuple)) else value


def preset(budget: str, context: str, names) -> dict[str, Any]:
    """The values of ``names`` (a chapter's parameters) in ``budget`` that differ from the
    ``cpu`` defaults: what ``zones book --budget`` passes chapter ``context``."""
    _check_budget(budget)
    chosen = {}
    for name in names:
        if name in TERMS:
            value = default(name, budget, context)
            if value != default(name, DEFAULT_BUDGET, context):
                chosen[name] = value
    return chosen


def _what(t: Term) -> str:
    """How an error says what a term takes."""
    if t.type == "tokens":
        return "a number of tokens (an integer >= " + (f"{t.minimum:g})" if t.minimum is not None else
                                                       "1), or None or 0 for the whole split")
    text = {"int": "an integer", "float": "a finite number", "bool": "true or false", "str": "a string",
            "dict": "a mapping such as {steps: 800}", "models": "a model or a list of models",
            "str | list[str]": "a string or a list of strings"}.get(t.type, f"a list of {t.type[5:-1]}s")
    if t.minimum is not None and t.type in ("int", "float", "list[int]", "list[float]"):
        text += f" >= {t.minimum:g}"
    if t.length:
        text += f" of length {t.length}"
    if t.choices:
        text += f" from {', '.join(map(str, t.choices))}"
    return text + (" or None" if t.optional else "")


def check_value(name: str, value: Any) -> Any:
    """``value`` checked against the type of ``name`` and returned in its plain form (tuples as
    lists, a token budget of 0 as None, one model as a list); a bad value is one ValueError line
    naming the parameter, what it takes and what it got."""
    t = term(name)

    def fail() -> ValueError:
        return ValueError(f"parameter {t.name} must be {_what(t)}; got {value!r}")

    if value is None:
        if t.optional or t.whole_split:
            return None
        raise fail()
    try:
        if t.type == "tokens":
            if not t.whole_split:  # 0 stays 0, so the error names the value given
                return check_int(value, t.name, min=int(t.minimum))
            return check_int(value, t.name, min=0) or None
        if t.type == "int":
            checked = check_int(value, t.name, min=None if t.minimum is None else int(t.minimum))
        elif t.type == "float":
            checked = check_float(value, t.name, min=t.minimum)
        elif t.type == "bool":
            if not isinstance(value, bool):
                raise fail()
            checked = value
        elif t.type == "str":
            if not isinstance(value, str) or not value:
                raise fail()
            checked = value
        elif t.type == "dict":
            if not isinstance(value, Mapping):
                raise fail()
            checked = dict(value)
        elif t.type == "models":
            try:
                return check_models(value, t.name)
            except DuplicateModelError as err:  # its own words: both spellings of the one model
                raise ValueError(f"parameter {err}") from None
        elif t.type == "str | list[str]":
            if isinstance(value, str) and value:
                return value
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
                raise fail()
            return list(value)
        else:  # list[int], list[float], list[str]
            if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
                raise fail()
            element = t.type[5:-1]
            checked = [_element(t, element, v, fail) for v in value]
            if t.length is not None and len(checked) != t.length:
                raise fail()
            return checked
    except ValueError as err:
        if str(err).startswith(f"parameter {t.name} "):
            raise
        raise fail() from None
    if t.choices and checked not in t.choices:
        raise fail()
    return checked


def _element(t: Term, element: str, value: Any, fail) -> Any:
    if element == "int":
        value = check_int(value, t.name, min=None if t.minimum is None else int(t.minimum))
    elif element == "float":
        value = check_float(value, t.name, min=t.minimum)
    elif not isinstance(value, str) or not value:
        raise fail()
    if t.choices and value not in t.choices:
        raise fail()
    return value


def parse_text(name: str, text: str, *, commas: bool = False) -> Any:
    """A value of ``name`` written as text: YAML (``--param eval_tokens=6120``, ``models=[a, b]``,
    ``null``), or with ``commas=True`` (a command-line flag) a list written ``a,b,c`` (models are
    always split at commas; a string parameter keeps its text). A text that is not YAML is a
    one-line error naming the parameter."""
    t = term(name)
    listed = t.type.startswith("list[") and commas or t.type == "models"  # models=a,b is two models anywhere
    if listed and not text.lstrip().startswith("["):
        parts = [part.strip() for part in text.split(",") if part.strip()]
        value: Any = parts if t.type in ("list[str]", "models") else [_scalar(part) for part in parts]
    else:
        try:
            value = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(f"parameter {t.name}: {text!r} is not a value ({mark}); write e.g. "
                             f"{t.name}={_example(t)}") from None
        if t.type == "str" and not isinstance(value, str) and value is not None:
            value = text.strip()  # a name that YAML would read as a number or a date is still a name
    if t.type == "float" and isinstance(value, str):
        value = _float(value)  # YAML 1.1 reads 2e-4 as a string
    return check_value(t.name, value)


def _float(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _scalar(text: str) -> Any:
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return _float(value) if isinstance(value, str) else value


def _example(t: Term) -> str:
    value = default(t.name)
    if isinstance(value, ByContext) or value is None:
        return "null"
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


# --- the common check -------------------------------------------------------------------------

KINDS = {"int": {"int"}, "float": {"float", "int"}, "bool": {"bool"}, "str": {"str"}, "dict": {"dict"},
         "tokens": {"int"}, "models": {"list", "str"}, "list[int]": {"list"}, "list[float]": {"list"},
         "list[str]": {"list"}, "str | list[str]": {"str", "list"}}


PLAIN = {"int", "float", "bool", "str", "list", "dict"}


def annotation_kinds(annotation: str) -> set[str]:
    """The basic kinds an annotation (as a string) admits: ``"int | None"`` → {int, None};
    ``"Sequence[str]"`` → {list}."""
    kinds = set()
    for part in str(annotation).replace("typing.", "").split("|"):
        part = part.strip().strip("'\"")
        base = part.split("[")[0].strip().lower()
        kinds.add({"none": "None", "nonetype": "None", "sequence": "list", "list": "list", "tuple": "list",
                   "iterable": "list", "mapping": "dict", "dict": "dict", "path": "str"}.get(base, base))
    return kinds


def problems(where: str, context: str | None, used: Mapping[str, Mapping[str, Any]], *,
             library: bool = False) -> list[str]:
    """What is wrong with the parameters ``used`` at ``where`` (a file, a ``run`` or a subcommand),
    each a line naming ``where``: ``used`` maps a name to what is known of its use there —
    ``default`` (its default value), ``annotation`` (a type annotation, as text), ``kinds`` (the
    basic kinds a flag takes: int, float, bool, str, list), ``choices`` (a flag's). Returns a
    name outside the glossary, a use with another type (meaning), a default that is not the
    glossary's ``cpu`` default in ``context``. ``library``: ``where`` is a library function,
    whose arguments are mostly not parameters (a table, an axis): only glossary names and
    ``RETIRED`` ones are checked, and a default may be the glossary's in any context."""
    found = []
    for name, use in used.items():
        if name in RETIRED:
            found.append(f"{where}: {name} is not in the glossary (zones/core/glossary.py): the glossary's name is "
                         f"{RETIRED[name]}")
            continue
        if name not in TERMS:
            if not library:
                found.append(f"{where}: {name} is not in the glossary (zones/core/glossary.py); add its term there "
                             f"first, or use the glossary's name")
            continue
        t = TERMS[name]
        allowed = KINDS[t.type] | ({"None"} if t.optional or t.whole_split else set())
        kinds = set(use.get("kinds") or ())
        if "annotation" in use and use["annotation"] not in (None, ""):
            kinds |= annotation_kinds(use["annotation"]) - {"None"}
        if library:   # an object (a loaded model, a table, a path) is what the name names, loaded: not a value;
            kinds &= PLAIN   # and a list may come as the command line's text "a,b"
            allowed = allowed | ({"str"} if "list" in allowed else set())
        odd = {k for k in kinds if k not in allowed and k != "any"}
        if odd:
            found.append(f"{where}: {name} is used as {', '.join(sorted(odd))}, but the glossary's {name} is "
                         f"{t.shown_type} ({t.meaning}): one name, one meaning")
            continue
        choices = use.get("choices")
        if choices and t.choices and not set(choices) <= set(t.choices):
            found.append(f"{where}: {name} takes {', '.join(map(str, choices))}, but the glossary's {name} takes "
                         f"{', '.join(map(str, t.choices))}: one name, one meaning")
            continue
        if "default" in use:
            given = use["default"]
            if library:
                if given is not None:   # None: the caller's, or "none", as the term's meaning says
                    try:
                        given = check_value(name, given)
                    except ValueError as err:
                        found.append(f"{where}: default {err}: one name, one meaning")
                        continue
                anywhere = contexts(name)
                if given is not None and not any(_same(given, v) for v in anywhere):
                    found.append(f"{where}: {name} defaults to {given!r}, but the glossary's cpu defaults of {name} "
                                 f"are {', '.join(sorted({repr(v) for v in anywhere}))}: take it from "
                                 f"zones.core.glossary.default")
                continue
            try:
                expected = default(name, DEFAULT_BUDGET, context)
            except KeyError:
                found.append(f"{where}: the glossary gives {name} no default for {context}")
                continue
            if given is not None:
                try:
                    given = check_value(name, given)
                except ValueError as err:
                    found.append(f"{where}: default {err}: one name, one meaning")
                    continue
            if not _same(given, expected):
                found.append(f"{where}: {name} defaults to {given!r}, but the glossary's cpu default for "
                             f"{context} is {expected!r}")
    return found


def _same(a: Any, b: Any) -> bool:
    """Equal defaults: lists and tuples alike, a bool never equal to a number."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def flag_uses(parser) -> dict[str, dict[str, Any]]:
    """The flags of an argparse (sub)parser as :func:`problems` reads them: ``--eval-tokens``
    → ``eval_tokens`` with its default, kinds and choices (``--help``/``--version`` skipped)."""
    import argparse

    used = {}
    for action in parser._actions:
        if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        name = action.dest   # the term's name (--out is out_dir)
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            kinds = {"bool"}
        elif isinstance(action, argparse._AppendAction) or action.nargs in ("+", "*") or isinstance(action.nargs, int):
            kinds = {"list"}
        else:
            kinds = {getattr(action.type, "kind", None) or {int: "int", float: "float"}.get(action.type, "str")}
            kinds.discard("any")
        used[name] = dict(default=action.default, kinds=kinds,
                          choices=tuple(action.choices) if action.choices else None)
    return used


def cli_type(name: str):
    """An argparse ``type`` for the flag of ``name``: the text parsed by :func:`parse_text`
    (lists written ``a,b,c``), so a bad value is argparse's one line naming the flag."""
    import argparse

    t = term(name)

    def parse(text: str) -> Any:
        try:
            return parse_text(t.name, text, commas=True)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err).removeprefix(f"parameter {t.name} ")) from None

    parse.__name__ = t.type  # argparse names the type in its error
    parse.kind = flag_kind(t)   # what flag_uses reads
    return parse


def flag_kind(t: Term) -> str:
    """The basic kind of a term's flag value: int, float, bool, str, list, dict or any."""
    if t.type.startswith("list[") or t.type == "models":
        return "list"
    kinds = KINDS[t.type]
    return next(iter(kinds)) if len(kinds) == 1 else ("float" if t.type == "float" else "any")


def add_flag(parser, name: str, context: str, help: str | None = None, **options) -> Any:
    """Add the flag of term ``name`` to a subcommand's ``parser``: its spelling, its type (lists
    written ``a,b,c``), its choices and its default in ``context`` all from the glossary, its
    help the term's meaning (or ``help``) and default. ``options`` go to ``add_argument``."""
    t = term(name)
    if t.type == "bool":
        options.setdefault("action", "store_true")
    else:
        options.setdefault("type", cli_type(name))
        if t.choices and not t.type.startswith("list["):
            options.setdefault("choices", t.choices)
            options["type"] = str
        options.setdefault("metavar", t.name.upper() if not t.choices else None)
    value = options.pop("default", default(name, DEFAULT_BUDGET, context))
    shown = "" if value in (None, False, []) or options.get("required") else \
        f" (default: {','.join(map(str, value)) if isinstance(value, list) else value})"
    return parser.add_argument(t.flag, dest=t.name, default=value, help=(help or t.meaning) + shown, **options)


# --- the presets as a table (the README's budget table) -------------------------------------------

def shown(value: Any) -> str:
    """A default as the budget table writes it: ``None``, ``[4, 8]``, ``alpha_shape``."""
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    return "None" if value is None else str(value)


def budget_table(declared: Mapping[str, Any]) -> list[dict[str, str]]:
    """The presets: one row per parameter and group of chapters whose values differ between the
    budgets — ``parameter, chapters, class, cpu, gpu`` (values as :func:`shown` writes them).
    ``declared`` maps each chapter (in the book's order) to the parameters it declares."""
    rows: dict[tuple, dict[str, str]] = {}
    for name in TERMS:
        for chapter, names in declared.items():
            if name not in names:
                continue
            values = tuple(shown(default(name, b, chapter)) for b in BUDGETS)
            if len(set(values)) == 1:
                continue
            row = rows.setdefault((name, values), dict(parameter=name, chapters="", **dict(zip(BUDGETS, values))))
            row["chapters"] = ", ".join(filter(None, [row["chapters"], chapter]))
    return list(rows.values())


def budget_markdown(budget_rows: list[dict[str, str]]) -> str:
    """:func:`budget_table`'s rows as the README's Markdown table."""
    lines = ["| parameter | chapters | class | cpu (default) | gpu |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| `{r['parameter']}` | {r['chapters']} | `{r['class']}` | `{r['cpu']}` | `{r['gpu']}` |"
              for r in budget_rows]
    return "\n".join(lines)
