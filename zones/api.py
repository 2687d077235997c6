"""The Python API: one function per ``zones`` subcommand, each returning the tidy table it writes.

    import zones

    model = zones.load_model("smollm2-135m")          # loaded once, used by every call below
    alpha = zones.alpha_table(model)                   # zones alpha     → alpha.csv
    ablation = zones.ablate(model, eval_tokens=1020)   # zones ablate    → ablation.csv
    pruning = zones.prune(model, strategies=["zone_aware", "last_n"], k_max=4)   # → pruning.csv
    exported = zones.export(model, "pruned/k4", strategy="zone_aware", k=4)      # → a model directory
    healed = zones.heal(model, "healed/k4", remove=[3, 11, 20, 27], method="bridge")
    tasks = zones.evaluate(["smollm2-135m", "pruned/k4"], limit=50)             # → tasks.csv
    jobs = zones.study(["smollm2-135m", "gpt2"], budget="class", n_resamples=500, out_dir="results/study")

``model`` is what ``zones.load_model`` returned, or a name it loads (a built-in alias, a local
directory, a ``.gguf`` file or a hub id). Every other argument is the subcommand's flag of the
same name, with the same default (the glossary's, ``zones.core.glossary``; ``tests/test_api.py``
checks), and is checked the same way before any work. ``out_dir``: also write the file the command
writes there (None, where it is optional: only return the table). ``export`` and ``heal`` write a
model directory (``out_dir``) and return its provenance (``zones-provenance.json``) as one row;
``evaluate`` returns ``tasks.csv`` (``zones.evaluation.evaluation`` gives all three tables);
``study`` returns ``jobs.csv`` (``zones.studies.study`` gives the whole ``StudyResult``); its chapter
parameters are keywords too. An error raised from these calls names keyword arguments
(``seq_len=128``), not the commands' flags (:func:`python_wording`).

``zones`` imports these lazily (``zones.__getattr__``), so ``import zones`` stays cheap; the
subcommands' own modules are ``zones.evaluation`` and ``zones.studies``.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from torch import nn

from zones.core.refresh import refreshing
from zones.core.tables import write_table
from zones.core.checks import check_choice
from zones.core.data import CorpusError, corpus_windows, load_corpus
from zones.core.glossary import default
from zones.core.models import LoadedModel, load_model
from zones.measure.ablation import ablation_table
from zones.pruning import check_strategy_names, pruning_table
from zones.pruning.export import PROVENANCE, check_request, choose_removed, export_model, read_provenance
from zones.pruning.heal import check_options, export_healed
from zones.pruning.heal import heal as heal_model
from zones.spectra import check_estimators, check_window
from zones.spectra import alpha_table as _alpha_table

__all__ = ["load_model", "alpha_table", "ablate", "prune", "export", "heal", "evaluate", "study"]

ModelLike = LoadedModel | str | os.PathLike


FLAG = re.compile(r"--(?:param )?([a-z][a-z0-9_-]*)(?:(?:[ =])(-?\d+(?:\.\d+)?)\b)?")  # a flag, the number after it


def keyword_wording(message: str) -> str:
    """An error's text as a Python call is given its arguments: a flag that is a glossary name
    (``--seq-len 128``, ``--param seq_len=128``) named as its keyword argument (``seq_len=128``);
    other text stays."""
    from zones.core.glossary import TERMS

    def keyword(match: re.Match) -> str:
        name = match.group(1).replace("-", "_")
        if name not in TERMS:
            return match.group(0)
        return f"{name}={match.group(2)}" if match.group(2) is not None else name

    return FLAG.sub(keyword, message)


def python_wording(function):
    """``function``'s errors in the words of a Python call (:func:`keyword_wording`): the library
    names flags, as the commands are given their arguments; the API is given keywords."""
    @functools.wraps(function)
    def called(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except Exception as err:
            if err.args and isinstance(err.args[0], str):
                err.args = (keyword_wording(err.args[0]), *err.args[1:])
            raise

    return called


def _loaded(model: ModelLike, *, text: bool = True, tokenizer: str | None = None, device: str | None = None,
            trust_remote_code: bool = False) -> LoadedModel:
    """``model`` as a ``LoadedModel``: itself, or loaded by name (with its tokenizer when ``text``)."""
    if isinstance(model, LoadedModel):
        if text and model.tokenizer is None:
            raise ValueError(f"model {model.name!r} was loaded without its tokenizer (load_tokenizer=False), and "
                             f"this reads text; load it with zones.load_model({model.name!r})")
        return model
    if isinstance(model, (str, os.PathLike)):
        kwargs = dict(tokenizer=tokenizer) if text else dict(load_tokenizer=False)
        return load_model(os.fspath(model), device=device, trust_remote_code=trust_remote_code, **kwargs)
    raise TypeError(f"model must be what zones.load_model returned, or a model name or path; got "
                    f"{type(model).__name__}")


def _written(table: pd.DataFrame, out: str | os.PathLike | None, name: str) -> pd.DataFrame:
    if out is not None:
        write_table(table, Path(out) / name)
    return table


def _d(name: str, context: str) -> Any:
    """The flag's default in that subcommand (the glossary's)."""
    return default(name, context=context)


# --- zones alpha, ablate, prune ---------------------------------------------------------------------------

@python_wording
def alpha_table(model: ModelLike | nn.Module, *, window: Sequence[float] = _d("window", "alpha"),
                estimators: Sequence[str] = _d("estimators", "alpha"), refresh: bool = False,
                device: str | None = None, trust_remote_code: bool = False, progress: bool = True,
                out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """``zones alpha``: every estimator for every weight matrix of every decoder block
    (``zones.spectra.alpha_table``; columns in the README's ``alpha.csv`` table); ``model`` may
    also be a module."""
    window, estimators = check_window(window), check_estimators(estimators)  # before loading
    module = model if isinstance(model, nn.Module) else _loaded(model, text=False, device=device,
                                                                trust_remote_code=trust_remote_code).model
    table = _alpha_table(module, window=window, estimators=estimators, refresh=refresh, progress=progress)
    return _written(table, out_dir, "alpha.csv")


@python_wording
def ablate(model: ModelLike, *, corpus: str = _d("corpus", "ablate"), seq_len: int = _d("seq_len", "ablate"),
           batch_size: int = _d("batch_size", "ablate"), eval_tokens: int | None = _d("eval_tokens", "ablate"),
           calibration_tokens: int | None = _d("calibration_tokens", "ablate"), dtype: str = _d("dtype", "ablate"),
           split: str = _d("split", "ablate"), ablation_method: str = _d("ablation_method", "ablate"),
           parts: bool = False, refresh: bool = False, tokenizer: str | None = None, device: str | None = None,
           trust_remote_code: bool = False, progress: bool = True,
           out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """``zones ablate``: ΔLoss of removing each decoder block on the ``split``'s windows (its
    budget: ``eval_tokens`` or ``calibration_tokens``; ``zones.measure.ablation.ablation_table``)."""
    check_choice(split, "split", ("eval", "calibration"))
    text = load_corpus(corpus)  # an unknown or empty corpus fails before the model loads
    loaded = _loaded(model, tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
    windows = corpus_windows(text, loaded.tokenizer, seq_len, split, eval_tokens if split == "eval" else
                             calibration_tokens)
    with refreshing(refresh):  # what the cache held is computed again
        table = ablation_table(loaded.model, windows, parts=parts, ablation_method=ablation_method, batch_size=batch_size,
                               dtype=dtype, progress=progress)
    return _written(table, out_dir, "ablation.csv")


@python_wording
def prune(model: ModelLike, *, strategies: str | Sequence[str] = _d("strategies", "prune"),
          k_max: int = _d("k_max", "prune"), seeds: int = _d("seeds", "prune"), corpus: str = _d("corpus", "prune"),
          seq_len: int = _d("seq_len", "prune"), batch_size: int = _d("batch_size", "prune"),
          eval_tokens: int | None = _d("eval_tokens", "prune"),
          calibration_tokens: int | None = _d("calibration_tokens", "prune"), dtype: str = _d("dtype", "prune"),
          refresh: bool = False, tokenizer: str | None = None, device: str | None = None,
          trust_remote_code: bool = False, out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """``zones prune``: the perplexity of every strategy's k = 1..``k_max`` removals on the eval
    windows (``zones.pruning.pruning_table``; ``zones.pruning.pruning_sweep`` gives the per-window
    losses too)."""
    names = check_strategy_names(strategies)  # before the model loads
    text = load_corpus(corpus)
    loaded = _loaded(model, tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
    eval_windows = corpus_windows(text, loaded.tokenizer, seq_len, "eval", eval_tokens)
    calibration = corpus_windows(text, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    with refreshing(refresh):
        table = pruning_table(loaded.model, eval_windows, calibration, strategies=names, k_max=k_max, seeds=seeds,
                              batch_size=batch_size, model_name=loaded.name, dtype=dtype)
    return _written(table, out_dir, "pruning.csv")


# --- zones export and heal ------------------------------------------------------------------------------

def provenance_row(directory: str | os.PathLike) -> pd.DataFrame:
    """An exported (or healed) model directory's ``zones-provenance.json`` as one row: ``out_dir`` (the
    directory), then its fields; block lists as ``"3,11,20"`` (as ``pruning.csv`` writes them), the
    healing record's fields as ``healing_<field>``."""
    record = read_provenance(directory)
    if not record:
        raise FileNotFoundError(f"{directory} holds no {PROVENANCE}")
    row: dict[str, Any] = dict(out_dir=str(directory))
    for key, value in record.items():
        if isinstance(value, dict):
            row.update({f"{key}_{k}": json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in value.items()})
        elif isinstance(value, list):
            row[key] = ",".join(map(str, value))
        else:
            row[key] = value
    return pd.DataFrame([row])


def _blocks(loaded: LoadedModel, remove, strategy, k, seed, *, corpus, seq_len, calibration_tokens, batch_size):
    """``remove`` (checked before the model loaded), or the ``k`` blocks ``strategy`` removes."""
    if remove is not None:
        return remove, None
    calibration = corpus_windows(corpus, loaded.tokenizer, seq_len, "calibration", calibration_tokens)
    chosen = choose_removed(loaded.model, strategy, k, calibration=calibration, seed=seed, batch_size=batch_size)
    return chosen, strategy


@python_wording
def export(model: ModelLike, out_dir: str | os.PathLike, *, remove: str | Sequence[int] | None = None,
           strategy: str | None = None, k: int | None = None, seed: int = 0, corpus: str = _d("corpus", "export"),
           seq_len: int = _d("seq_len", "export"), batch_size: int = _d("batch_size", "export"),
           calibration_tokens: int | None = _d("calibration_tokens", "export"), refresh: bool = False,
           tokenizer: str | None = None, device: str | None = None, trust_remote_code: bool = False) -> pd.DataFrame:
    """``zones export``: the model without ``remove`` (or ``strategy``'s ``k`` blocks) as a plain
    Hugging Face directory ``out_dir`` (``zones.pruning.export``); returns :func:`provenance_row`."""
    removed = check_request(out_dir, remove, strategy, k, seed)  # before the model loads
    loaded = _loaded(model, tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
    with refreshing(refresh):  # what the strategy plans on
        removed, strategy = _blocks(loaded, removed, strategy, k, seed, corpus=corpus, seq_len=seq_len,
                                    calibration_tokens=calibration_tokens, batch_size=batch_size)
    path = export_model(loaded.model, removed, out_dir, tokenizer=loaded.tokenizer, source=loaded.name,
                        strategy=strategy, seed=seed if strategy else None, fingerprint=loaded.fingerprint)
    return provenance_row(path)


@python_wording
def heal(model: ModelLike, out_dir: str | os.PathLike, *, remove: str | Sequence[int] | None = None,
         strategy: str | None = None, k: int | None = None, seed: int = 0, method: str = _d("method", "heal"),
         bridges: str = _d("bridges", "heal"), heal_tokens: int = _d("heal_tokens", "heal"),
         lr: float = _d("lr", "heal"), rank: int = _d("rank", "heal"), corpus: str = _d("corpus", "heal"),
         seq_len: int = _d("seq_len", "heal"), batch_size: int = _d("batch_size", "heal"),
         heal_batch_size: int = _d("heal_batch_size", "heal"),
         calibration_tokens: int | None = _d("calibration_tokens", "heal"), refresh: bool = False,
         tokenizer: str | None = None, device: str | None = None, trust_remote_code: bool = False) -> pd.DataFrame:
    """``zones heal``: as :func:`export`, the pruned model healed first on ``heal_tokens``
    calibration tokens (``method``: ``lora`` or ``bridge``; ``zones.pruning.heal``); returns
    :func:`provenance_row` (its ``healing_*`` fields: the calibration loss before and after, ...)."""
    removed = check_request(out_dir, remove, strategy, k, seed)  # before the model loads
    # named as the command's flags, as every library error is; a Python call reads them as keywords
    check_options(method=method, heal_tokens=heal_tokens, lr=lr, rank=rank, seed=seed, heal_batch_size=heal_batch_size,
                  bridges=bridges, names={name: "--" + name.replace("_", "-") for name in
                                          ("heal_tokens", "lr", "rank", "seed", "heal_batch_size", "method", "bridges")})
    loaded = _loaded(model, tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
    with refreshing(refresh):  # what a strategy plans on, and the healing, computed again
        removed, strategy = _blocks(loaded, removed, strategy, k, seed, corpus=corpus, seq_len=seq_len,
                                    calibration_tokens=calibration_tokens, batch_size=batch_size)
        try:  # heal_tokens calibration tokens, or the whole split when it is smaller (LoRA cycles through it)
            windows = corpus_windows(corpus, loaded.tokenizer, seq_len, "calibration", heal_tokens)
        except CorpusError:
            windows = corpus_windows(corpus, loaded.tokenizer, seq_len, "calibration", None)
        healed = heal_model(loaded.model, removed, windows, method=method, heal_tokens=heal_tokens, seed=seed, lr=lr,
                            rank=rank, bridges=bridges, heal_batch_size=heal_batch_size, refresh=refresh,
                            fingerprint=loaded.fingerprint)
    path = export_healed(healed, out_dir, tokenizer=loaded.tokenizer, source=loaded.name, strategy=strategy)
    return provenance_row(path)


# --- zones evaluate and study ---------------------------------------------------------------------------

def _evaluate_arguments() -> argparse.Namespace:
    """The flags of ``zones evaluate`` at their defaults."""
    import zones.evaluation as command

    parser = argparse.ArgumentParser(add_help=False)
    command.add_arguments(parser)
    return parser.parse_args([])


@python_wording
def evaluate(models: ModelLike | Sequence[ModelLike] | None = None, *, remove: str | Sequence[int] | None = None,
             strategy: str | None = None, k: int | None = None, seed: int = 0,
             tasks: str | Sequence[str] = _d("tasks", "evaluate"), limit: int | None = _d("limit", "evaluate"),
             metric: str = _d("metric", "evaluate"), include_path: Sequence[str] = (),
             corpus: str = _d("corpus", "evaluate"), seq_len: int = _d("seq_len", "evaluate"),
             calibration_tokens: int | None = _d("calibration_tokens", "evaluate"),
             batch_size: int = _d("batch_size", "evaluate"), dtype: str = _d("dtype", "evaluate"),
             refresh: bool = False, tokenizer: str | None = None, device: str | None = None,
             trust_remote_code: bool = False, out_dir: str | os.PathLike | None = None) -> pd.DataFrame:
    """``zones evaluate``: zero-shot task accuracy (lm-evaluation-harness) of ``models`` (one name or
    several, the first the reference; None: smollm2-135m), and of the first with ``remove`` (or
    ``strategy``'s ``k`` blocks) removed on the fly; returns ``tasks.csv``. ``out_dir`` writes
    ``tasks.csv``, ``examples.csv`` and, with two variants or more, ``differences.csv``."""
    import zones.evaluation as command

    if isinstance(models, LoadedModel) or (models is not None and not isinstance(models, (str, os.PathLike))
                                           and any(isinstance(m, LoadedModel) for m in models)):
        raise TypeError("zones.evaluate takes model names or paths (lm-eval loads each by zones' rules); pass "
                        "the name you gave zones.load_model")
    names = None if models is None else [os.fspath(models)] if isinstance(models, (str, os.PathLike)) \
        else [os.fspath(m) for m in models]
    args = _evaluate_arguments()
    given = dict(models=names, remove=remove, strategy=strategy, k=k, seed=seed, tasks=tasks, limit=limit,
                 metric=metric, include_path=list(include_path), corpus=corpus, seq_len=seq_len,
                 calibration_tokens=calibration_tokens, batch_size=batch_size, dtype=dtype, refresh=refresh,
                 tokenizer=tokenizer, device=device, trust_remote_code=trust_remote_code)
    for name, value in given.items():
        setattr(args, name, value)
    found = command.evaluation(args)
    if out_dir is not None:
        command.write(found, out_dir)
    return found["tasks"]


@python_wording
def study(models: str | Sequence[str], *, budget: str = _d("budget", "study"), only: Sequence[str] | None = None,
          executor: str = _d("executor", "study"), ray_address: str | None = _d("ray_address", "study"),
          retries: int = _d("retries", "study"), cpus_per_job: float = _d("cpus_per_job", "study"),
          gpus_per_job: float | None = _d("gpus_per_job", "study"), refresh: bool = False, progress: bool | None = None,
          out_dir: str | os.PathLike | None = None, root: str | os.PathLike | None = None, log=print,
          **parameters: Any) -> pd.DataFrame:
    """``zones study``: every chapter's tables for every model, as jobs (``zones.studies.study``);
    every other keyword is a chapter parameter (``--param NAME=VALUE``: ``n_resamples=50``), each
    clipped to what a model allows where it cannot apply to it (``zones.studies.fit_to_model``).
    Returns ``jobs.csv`` (one row per job, with its status). ``out_dir`` (None: nothing written)
    receives each job's tables as it finishes, ``jobs.csv`` and the state file ``zones study
    --status`` reads."""
    import zones.studies as command

    return command.study(models, parameters, executor=executor, ray_address=ray_address, retries=retries,
                         cpus_per_job=cpus_per_job, gpus_per_job=gpus_per_job, out_dir=out_dir, only=only,
                         budget=budget, root=None if root is None else Path(root), progress=progress is not False,
                         refresh=refresh, log=log, python=True).jobs
