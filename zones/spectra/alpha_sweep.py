"""The α tables of several models, one job per model (``zones sweep``), locally or on Ray."""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from zones.core.checks import duplicate_models, duplicate_text
from zones.core.executors import Job, run_jobs
from zones.core.models import load_model
from zones.spectra.table import alpha_table


def model_alpha(name: str, *, device: str | None = None, trust_remote_code: bool = False,
                refresh: bool = False) -> pd.DataFrame:
    """One model's α table (``zones.spectra.alpha_table``, cached as ``zones alpha`` caches it;
    ``refresh``: computed again and replaced) with a ``model`` column first: the job of
    ``alpha_sweep``."""
    loaded = load_model(name, device=device, trust_remote_code=trust_remote_code, load_tokenizer=False)
    table = alpha_table(loaded.model, refresh=refresh)
    table.insert(0, "model", name)
    return table


def alpha_sweep(models: Sequence[str], executor: str = "local", *, ray_address: str | None = None,
                retries: int = 2, cpus_per_job: float = 1, device: str | None = None,
                trust_remote_code: bool = False, refresh: bool = False, progress: bool = True) -> pd.DataFrame:
    """The α tables of several models stacked: ``model`` then ``zones.spectra.COLUMNS``; one
    job per model through ``run_jobs`` (``refresh``: each computed again, on whichever machine
    runs its job). A model listed twice, under one spelling or two, is refused."""
    models = [m.strip() for m in models if m and m.strip()]
    if not models:
        raise ValueError("no models given; pass e.g. --models smollm2-135m,EleutherAI/pythia-160m")
    found = duplicate_models(models)
    if found:
        raise ValueError(duplicate_text("--models", found))
    options = dict(device=device, trust_remote_code=trust_remote_code, refresh=refresh)
    jobs = [Job(name, model_alpha, (name,), options, cpus=cpus_per_job) for name in models]
    tables = run_jobs(jobs, executor, ray_address=ray_address, retries=retries, progress=progress,
                      desc="alpha tables")
    return pd.concat(tables, ignore_index=True)
