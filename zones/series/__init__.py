"""The depth series and checkpoint series: training small GPT-NeoX (Pythia-architecture) models from scratch,
and reading spectral snapshots from any checkpoint series.

Training a depth series of small GPT-NeoX (Pythia-architecture) language models from scratch.

One call trains one model and watches its spectra form::

    run = train_model(profile_config("cpu", depth=8))
    run.path        # a model directory: load it with zones.core.models.load_model(run.path)
    run.history     # step, lr, train_loss, heldout_loss, tokens_seen, seconds
    run.snapshots   # step, layer, role, stable_rank, alpha_shape, alpha_esd

One module per job:

* ``config``: ``TrainConfig`` (every field checked with ``zones.core.checks``), the profiles
  ``cpu`` (the default: depths 8, 12, 16 at 8·depth wide, three seeds at every depth, trained with the
  chapter's ablation in about ten minutes on two CPU cores) and ``paper`` (depths 8, 12, 16 at
  64·depth, bf16, for a GPU) and ``class`` (depths 4, 6, 8: a class build), ``series_configs``,
  ``parameter_count``, ``flops_per_token``.
* ``tokenizer``: a byte-level BPE tokenizer trained on the corpus and the corpus's ids, both
  cached through ``zones.core.cache`` (a replaced or truncated file is an error naming it), and the
  (train, held-out) windows.
* ``loop``: ``train_model``: fused AdamW with linear warm-up and cosine decay, fixed seeds for the
  weights and the batch order, the held-out loss through ``zones.measure.scoring.evaluate_loss`` every
  ``eval_every`` steps, stable rank and α of every matrix every ``snapshot_every`` steps, and a
  resumable checkpoint every ``checkpoint_every`` steps.
* ``io``: the checkpoint (safetensors with a JSON header: no pickle is ever loaded; its run
  identity is checked before any tensor is read) and the finished run's directory
  ``cache_dir()/train/<key>``, keyed by every training parameter, the corpus and ``VERSION``,
  written atomically with a manifest that every read verifies (an edited ``history.csv`` is a
  ``CacheError``, never a silent wrong curve). ``keep_checkpoints=True`` keeps the model of
  every snapshot step as a loadable directory, for ``zones.series.checkpoints``.
* ``pool``: ``train_runs``: several runs at once, on a CPU each in a process of its own on its
  config's ``threads`` (one by default: a CPU run's bits depend on its thread count), the
  longest first, as many at a time as the cores allow.
* ``runs``: ``train_series`` (through ``train_runs``) and the series' tables, with the flattening rule (the last 20 %
  of the steps improve held-out loss by < 2 %), and ``series_importance`` (single-block ablation
  and α of every run on its own held-out windows).
"""
from zones.series.config import (
                     PROFILES,
                     VERSION,
                     TrainConfig,
                     flops_per_token,
                     parameter_count,
                     profile_config,
                     profile_depths,
                     profile_seeds,
                     series_configs,
)
from zones.series.io import (
                     CHECKPOINT_FILE,
                     HISTORY_COLUMNS,
                     SNAPSHOT_COLUMNS,
                     TrainedRun,
                     load_checkpoint,
                     load_run,
                     run_key,
                     run_path,
                     save_model_directory,
                     write_checkpoint,
)
from zones.series.loop import (
                     TrainingInterrupted,
                     batch_indices,
                     build_model,
                     learning_rate,
                     make_optimizer,
                     spectral_snapshot,
                     train_model,
)
from zones.series.pool import train_runs
from zones.series.runs import (
                     FLAT_IMPROVEMENT,
                     LATE_FRACTION,
                     late_improvement,
                     run_label,
                     series_history,
                     series_importance,
                     series_quantization,
                     series_snapshots,
                     series_sublayer_rho,
                     series_summary,
                     train_series,
)
from zones.series.tokenizer import (
                     EOS_TOKEN,
                     corpus_tokens,
                     heldout_split,
                     heldout_windows,
                     split_windows,
                     tokenizer_and_tokens,
                     train_tokenizer,
)

__all__ = [
    "CHECKPOINT_FILE", "EOS_TOKEN", "FLAT_IMPROVEMENT", "HISTORY_COLUMNS", "LATE_FRACTION", "PROFILES",
    "SNAPSHOT_COLUMNS", "VERSION", "TrainConfig", "TrainedRun", "TrainingInterrupted", "batch_indices",
    "build_model", "corpus_tokens", "flops_per_token", "heldout_split", "heldout_windows", "late_improvement",
    "learning_rate", "load_checkpoint", "load_run", "make_optimizer", "parameter_count", "profile_config",
    "profile_depths", "profile_seeds", "run_key", "run_label", "run_path", "save_model_directory",
    "series_configs", "series_history", "series_importance", "series_quantization", "series_snapshots", "series_sublayer_rho",
    "series_summary",
    "spectral_snapshot", "split_windows", "tokenizer_and_tokens", "train_model", "train_runs", "train_series",
    "train_tokenizer", "write_checkpoint",
]
