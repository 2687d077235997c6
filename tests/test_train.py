"""Training a micro depth series: loss falls, snapshots land on their steps, runs resume and
load like any other model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from zones import series as train
from zones.series import TrainingInterrupted, profile_config, train_model

ROLES = {"q", "k", "v", "o", "mlp_in", "mlp_out"}


pytestmark = pytest.mark.usefixtures("one_thread")


def micro_config(corpus: str, depth: int = 2, **overrides) -> train.TrainConfig:
    settings = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, steps=40, lr=3e-3,
                    eval_every=10, snapshot_every=10, early_snapshot_every=0, checkpoint_every=15, eval_windows=8,
                    corpus=corpus)
    settings.update(overrides)
    return profile_config("cpu", depth, **settings)


@pytest.fixture(scope="session")
def micro_runs(micro_corpus):
    return [train_model(micro_config(micro_corpus, depth), progress=False) for depth in (2, 3)]


def test_micro_series_lowers_heldout_loss_and_snapshots_every_n_steps(micro_runs):
    for run in micro_runs:
        depth = run.config.depth
        history, snaps = run.history, run.snapshots
        assert history["step"].tolist() == [0, 10, 20, 30, 40]
        assert history["heldout_loss"].iloc[-1] < history["heldout_loss"].iloc[0] - 0.5
        assert list(snaps.columns) == ["step", "layer", "role", "stable_rank", "alpha_shape", "alpha_esd"]
        assert sorted(snaps["step"].unique()) == [0, 10, 20, 30, 40]
        per_step = snaps.groupby("step").size()
        assert (per_step == depth * len(ROLES)).all()
        assert set(snaps["role"]) == ROLES and set(snaps["layer"]) == set(range(depth))
        assert snaps[["stable_rank", "alpha_shape"]].notna().all().all()
        assert (snaps["stable_rank"] >= 1).all()
        assert run.summary["final_heldout_loss"] == pytest.approx(history["heldout_loss"].iloc[-1])
        assert 0 <= run.summary["snapshot_fraction"] < 1


def test_snapshot_steps_include_the_last_step_when_it_is_off_the_grid(micro_corpus):
    run = train_model(micro_config(micro_corpus, steps=23, seed=5), progress=False)
    assert sorted(run.snapshots["step"].unique()) == [0, 10, 20, 23]
    assert run.history["step"].tolist() == [0, 10, 20, 23]


def test_a_second_call_loads_the_cached_run_without_training(micro_runs, micro_corpus):
    steps = []
    again = train_model(micro_config(micro_corpus, 2), progress=False, on_step=lambda s, loss: steps.append(s))
    assert steps == []
    assert again.path == micro_runs[0].path
    pd.testing.assert_frame_equal(again.snapshots, micro_runs[0].snapshots)


def test_interrupted_run_resumes_from_its_checkpoint_and_matches_an_uninterrupted_one(
        micro_corpus, tmp_path, monkeypatch):
    config = micro_config(micro_corpus, 2, seed=1)
    with pytest.raises(TrainingInterrupted):
        train_model(config, progress=False, stop_after=25)
    assert not (train.run_path(config) / "run.json").exists()  # nothing half-finished is trusted
    assert (train.run_path(config).with_name(train.run_path(config).name + ".partial") / train.CHECKPOINT_FILE).exists()

    steps = []
    resumed = train_model(config, progress=False, on_step=lambda s, loss: steps.append(s))
    assert steps == list(range(26, 41))
    assert not train.run_path(config).with_name(train.run_path(config).name + ".partial").exists()

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "other-cache"))
    straight = train_model(config, progress=False)
    pd.testing.assert_frame_equal(resumed.history.drop(columns="seconds"), straight.history.drop(columns="seconds"),
                                  check_exact=False, atol=1e-5)
    pd.testing.assert_frame_equal(resumed.snapshots, straight.snapshots, check_exact=False, atol=1e-5)


def test_saved_model_loads_through_zones_models_and_runs_the_analyses(micro_runs, micro_corpus):
    from zones.core.data import corpus_windows
    from zones.core.models import load_model
    from zones.measure.ablation import ablation_table
    from zones.spectra import alpha_table

    run = micro_runs[1]
    loaded = load_model(str(run.path), device="cpu")
    assert loaded.model.config.model_type == "gpt_neox"
    assert loaded.model.config.num_hidden_layers == run.config.depth
    alpha = alpha_table(loaded.model, cache=False)
    assert len(alpha) == run.config.depth * len(ROLES)
    # The saved weights are the trained ones: α of the saved model equals the last snapshot.
    last = run.snapshots[run.snapshots["step"] == run.config.steps].sort_values(["layer", "role"])
    np.testing.assert_allclose(alpha.sort_values(["layer", "role"])["alpha_shape"], last["alpha_shape"], atol=1e-6)
    windows = corpus_windows(micro_corpus, loaded.tokenizer, seq_len=32, split="eval", max_tokens=31 * 8)
    table = ablation_table(loaded.model, windows, cache=False, progress=False)
    assert table["layer"].tolist() == list(range(run.config.depth))
    assert np.isfinite(table["delta_loss"]).all()
    assert table["base_loss"].iloc[0] < run.summary["initial_heldout_loss"] - 0.3  # trained, not random


def test_batches_are_a_fresh_permutation_each_epoch_and_depend_only_on_step_and_seed():
    n, size = 10, 3
    epoch0 = np.concatenate([train.batch_indices(n, size, s, seed=0) for s in range(3)])
    assert len(set(epoch0.tolist())) == 9  # no window twice within an epoch
    np.testing.assert_array_equal(train.batch_indices(n, size, 4, 0), train.batch_indices(n, size, 4, 0))
    assert not np.array_equal(train.batch_indices(n, size, 0, 0), train.batch_indices(n, size, 3, 0))
    with pytest.raises(ValueError, match="cannot fill one batch"):
        train.batch_indices(2, 3, 0, 0)


def test_learning_rate_warms_up_then_decays_to_its_floor():
    config = profile_config("cpu", 4, steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [train.learning_rate(config, s) for s in range(100)]
    assert lrs[0] < lrs[5] < lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert train.learning_rate(config, 100) == pytest.approx(1e-4)


def test_profiles_and_parameter_counts():
    cpu = train.series_configs("cpu")
    assert [(c.depth, c.seed) for c in cpu] == [(d, s) for d in (8, 12, 16) for s in (0, 1, 2)]   # 3 + 3 + 3 runs
    assert [c.hidden_size for c in cpu[::3]] == [64, 96, 128]
    assert train.profile_seeds("cpu", 8) == (0, 1, 2) and train.profile_seeds("paper", 16) == (0,)
    paper = train.series_configs("paper")
    assert [(c.depth, c.hidden_size, c.n_heads) for c in paper] == [(8, 512, 8), (12, 768, 12), (16, 1024, 16)]
    for config in cpu[::3][:2]:
        model = train.build_model(config)
        assert train.parameter_count(config) == sum(p.numel() for p in model.parameters())
        assert model.config.num_hidden_layers == config.depth
    assert train.series_configs("cpu", [3], width=48)[0].hidden_size == 48


@pytest.mark.parametrize("bad, match", [
    (dict(width=30), "multiple of head_dim"),
    (dict(seed=np.int64(-1)), "seed must be an integer >= 0"),
    (dict(steps=True), "steps must be an integer"),
    (dict(eval_every=2.0), "eval_every must be an integer"),
    (dict(betas=0.9), "betas must be two numbers in \\[0, 1\\)"),
    (dict(betas=[0.9, 1.5]), "betas \\(two numbers in \\[0, 1\\)\\) must be"),
    (dict(weight_decay=-1), "weight_decay must be a finite number >= 0"),
    (dict(lr="fast"), "lr must be a finite number"),
    (dict(grad_clip=float("nan")), "grad_clip .* must be a finite number"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(steps=0), "steps must be an integer >= 1"),
    (dict(vocab_size=100), "vocab_size"),
    (dict(precision="fp8"), "precision"),
    (dict(depthh=3), "unknown training parameter"),
])
def test_bad_parameters_fail_before_any_work(bad, match):
    with pytest.raises(ValueError, match=match):
        profile_config("cpu", 4, **bad)


def test_unknown_profile_and_bad_stop_after_are_refused(micro_corpus):
    with pytest.raises(ValueError, match="unknown profile"):
        profile_config("gpu", 4)
    with pytest.raises(ValueError, match="stop_after"):
        train_model(micro_config(micro_corpus), stop_after=41)


def test_cli_train_writes_the_series_tables(micro_runs, micro_corpus, tmp_path):
    from zones.cli import main

    out = tmp_path / "out"
    code = main(["train", "--depths", "2,3", "--seeds", "1", "--width", "32", "--set", "head_dim=16", "--vocab-size", "300",
                 "--seq-len", "32", "--batch-size", "8", "--steps", "40", "--lr", "0.003", "--snapshot-every", "10",
                 "--set", "eval_every=10", "--set", "early_snapshot_every=0", "--set", "checkpoint_every=15", "--set", "eval_windows=8",
                 "--corpus", micro_corpus, "--out", str(out)])
    assert code == 0
    series = pd.read_csv(out / "series.csv")
    assert series["depth"].tolist() == [2, 3]
    assert series["path"].tolist() == [str(r.path) for r in micro_runs]  # loaded, not retrained
    snaps = pd.read_csv(out / "snapshots.csv")
    assert set(snaps["depth"]) == {2, 3}


def micro_notebook_parameters(corpus: str, out_dir) -> dict:
    overrides = dict(width=32, head_dim=16, vocab_size=300, seq_len=32, batch_size=8, steps=40, lr=3e-3,
                     eval_every=10, snapshot_every=10, early_snapshot_every=0, checkpoint_every=15, eval_windows=8,
                     corpus=corpus, seed=0)
    return dict(depths=[2, 3], train_overrides=overrides, out_dir=str(out_dir))


def run_chapter(name: str, parameters: dict, tmp_path, monkeypatch):
    from zones.book import declared_parameters, run_notebook

    monkeypatch.setenv("ZONES_BOOK_BUILD", "1")
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    source = Path(__file__).resolve().parents[1] / "notebooks" / f"{name}.md"
    assert set(parameters) <= set(declared_parameters(source))  # every one is declared
    executed = tmp_path / f"{name}.ipynb"
    run_notebook(source, executed, parameters, cwd=tmp_path)
    return executed.read_text()


def test_depth_series_chapter_runs_on_the_cached_micro_series(micro_runs, micro_corpus, tmp_path, monkeypatch):
    out = tmp_path / "results"
    params = dict(micro_notebook_parameters(micro_corpus, out), eval_tokens=31 * 8)
    text = run_chapter("depth_series", params, tmp_path, monkeypatch)
    summary = json.loads((out / "summary.json").read_text())
    assert [r["depth"] for r in summary["runs"]] == [2, 3]
    # The chapter loaded the runs trained above: same losses, same recorded training time.
    for record, run in zip(summary["runs"], micro_runs):
        assert record["final_heldout_loss"] == pytest.approx(run.summary["final_heldout_loss"])
        assert record["total_seconds"] == pytest.approx(run.summary["total_seconds"])
    importance = pd.read_csv(out / "importance.csv")
    assert sorted(importance["model"].unique()) == ["depth 2, seed 0", "depth 3, seed 0"]
    rho_runs = pd.read_csv(out / "rho_runs.csv")
    assert rho_runs[["depth", "seed"]].values.tolist() == [[2, 0], [3, 0]]
    assert set(pd.read_csv(out / "rho_pooled.csv")["depth"].astype(str)) == {"2", "3", "all"}
    assert importance["n_tokens"].eq(31 * 8).all()
    assert "vegaEmbed" in text
    # every run measured again with its block matrices round-tripped through Q4_1, on the same windows
    quant = pd.read_csv(out / "quant_summary.csv")
    assert quant[["depth", "seed"]].values.tolist() == [[2, 0], [3, 0]] and (quant["n_tokens"] == 31 * 8).all()
    assert [r["model"] for r in summary["quantization"]] == ["depth 2, seed 0", "depth 3, seed 0"]
    assert "Round-tripping every block matrix of the 2 runs through Q4_1" in text and "tbl-series-quant" in text


def test_spectral_lifecycle_chapter_fits_delta_alpha_on_the_cached_micro_series(
        micro_runs, micro_corpus, tmp_path, monkeypatch):
    out = tmp_path / "results"
    text = run_chapter("spectral_lifecycle", micro_notebook_parameters(micro_corpus, out), tmp_path, monkeypatch)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["depths"] == [2, 3] and summary["paper_exponent"] == 0.26
    snapshots = pd.concat([r.snapshots.assign(depth=r.config.depth) for r in micro_runs])
    from zones.analysis import lifecycle

    expected = lifecycle.delta_alpha(snapshots).set_index(["group", "depth"]).loc["all", "delta_alpha"]
    assert summary["delta_alpha"] == {str(d): pytest.approx(v) for d, v in expected.items()}
    fit = lifecycle.fit_power_law(expected.index, expected.to_numpy())
    assert summary["exponent"] == pytest.approx(fit["exponent"])
    grid = pd.read_csv(out / "compression.csv")
    assert set(grid["step"]) == {0, 10, 20, 30, 40} and set(grid["group"]) == {"Q/K", "V/O", "MLP"}
    assert text.count("vegaEmbed") >= 5  # the heatmaps, wave lines, profiles and the fit
    # The claims' intervals: the wave per depth, Q/K against V/O per depth, the Δα exponent.
    wave = pd.read_csv(out / "wave_claim.csv")
    assert wave["depth"].tolist() == [2, 3] and set(wave["verdict"]) <= {"holds", "does not hold", "inconclusive"}
    assert (wave["peak_low"] <= wave["peak_high"]).all() | wave["peak_low"].isna().all()
    assert pd.read_csv(out / "asymmetry_claim.csv")["depth"].tolist() == [2, 3]
    exponent = pd.read_csv(out / "delta_alpha_claim.csv").iloc[0]
    assert exponent["depths"] == "2,3" and exponent["runs"] == "1,1" and exponent["df"] == 0
    assert summary["late_exponent"]["verdict"] == exponent["verdict"]
    # the seeds are read from the series' runs (one training seed here), not assumed
    assert summary["seeds_trained"] == {"2": 1, "3": 1} and exponent["seeds_trained"] == "2:1,3:1"
    assert "1 at depth 2 and 1 at depth 3" in text


def partial_dir(config) -> Path:
    final = train.run_path(config)
    return final.with_name(final.name + ".partial")


class _Planted:
    """A pickle that creates a file when it is unpickled: what a planted checkpoint could do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def test_a_planted_pickle_in_the_training_cache_is_never_loaded(micro_corpus, tmp_path):
    import torch

    config = micro_config(micro_corpus, 2, seed=11, steps=20)
    marker = tmp_path / "code-ran"
    partial_dir(config).mkdir(parents=True)
    torch.save({"key": _Planted(marker)}, partial_dir(config) / "checkpoint.pt")
    try:
        run = train_model(config, progress=False)
    except Exception:  # noqa: BLE001 - whatever happens, the pickle's code must not have run
        run = None
    assert not marker.exists()
    assert run is not None and run.history["step"].tolist() == [0, 10, 20]


def test_a_damaged_or_foreign_checkpoint_is_one_line_naming_the_file(micro_corpus, capfd):
    """A truncated checkpoint is one line naming it, and the run trains from step 0 (issue 55:
    never resumed, nor a dead end); another run's checkpoint is refused, naming what to delete."""
    config = micro_config(micro_corpus, 2, seed=12, steps=30)
    with pytest.raises(TrainingInterrupted):
        train_model(config, progress=False, stop_after=15)
    saved = partial_dir(config) / train.CHECKPOINT_FILE
    intact = saved.read_bytes()
    saved.write_bytes(intact[: len(intact) // 2])
    capfd.readouterr()
    run = train_model(config, progress=False)
    said = [line for line in capfd.readouterr().err.splitlines() if str(saved) in line]
    assert len(said) == 1 and "damaged" in said[0] and "from step 0" in said[0], said
    assert run.history["step"].tolist() == [0, 10, 20, 30]

    other = micro_config(micro_corpus, 2, seed=13, steps=30)
    partial_dir(other).mkdir(parents=True)
    (partial_dir(other) / saved.name).write_bytes(intact)  # another run's checkpoint
    with pytest.raises(RuntimeError, match="belongs to another run; delete"):
        train_model(other, progress=False)


def test_a_checkpoint_with_one_flipped_byte_is_named_and_the_run_trains_from_step_0(micro_corpus, tmp_path,
                                                                                    monkeypatch, capfd):
    """Issue 55: a flipped bit inside a checkpoint's tensors passed every check (safetensors reads
    any bytes as numbers) and the run resumed from the damaged weights, silently. Now the
    checkpoint carries the sha256 of its bytes: the damage is one line naming the file and the
    run trains from step 0, to the same bits as a run never interrupted."""
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    config = micro_config(micro_corpus, 2, seed=16, steps=20, eval_every=5, snapshot_every=10, checkpoint_every=20)
    with pytest.raises(TrainingInterrupted):
        train_model(config, progress=False, stop_after=10)
    saved = partial_dir(config) / train.CHECKPOINT_FILE
    data = bytearray(saved.read_bytes())
    data[len(data) - 1000] ^= 0x01  # one low mantissa bit of a tensor: still a plausible number
    saved.write_bytes(bytes(data))
    capfd.readouterr()
    run = train_model(config, progress=False)
    said = [line for line in capfd.readouterr().err.splitlines() if str(saved) in line]
    assert len(said) == 1 and "damaged" in said[0] and "step 0" in said[0], said
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "never-interrupted"))
    assert _weights(run) == _weights(train_model(config, progress=False))


def test_cli_train_refuses_bad_betas_in_one_line(capsys, micro_corpus, tmp_path):
    from zones.cli import main

    code = main(["train", "--depths", "2", "--corpus", micro_corpus, "--set", "betas=0.9", "--out", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert code == 1 and "betas must be two numbers" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "series.csv").exists()


def test_snapshots_from_kept_checkpoints_equal_those_recorded_during_training(micro_runs, micro_corpus):
    """The cached depth-2 run kept no checkpoints: asking for them trains it again, bit for bit,
    and the snapshots computed afterwards from those directories equal the recorded ones."""
    from zones.core.models import load_model
    from zones.series.checkpoints import lifecycle_snapshots

    run = train_model(micro_config(micro_corpus, 2), progress=False, keep_checkpoints=True)
    assert run.path == micro_runs[0].path
    pd.testing.assert_frame_equal(run.snapshots, micro_runs[0].snapshots)  # the same training
    kept = sorted(p.name for p in (run.path / "checkpoints").iterdir())
    assert kept == [f"step-{s:06d}" for s in (0, 10, 20, 30, 40)]
    posthoc = lifecycle_snapshots(train_run=run.path, progress=False)
    pd.testing.assert_frame_equal(posthoc, run.snapshots, check_exact=False, rtol=1e-12, atol=0)
    loaded = load_model(str(run.path / "checkpoints" / "step-000020"), device="cpu")
    assert loaded.model.config.num_hidden_layers == 2


def test_cli_lifecycle_on_a_kept_series_writes_the_table_the_chapter_draws(micro_corpus, tmp_path):
    from zones.analysis import lifecycle
    from zones.cli import main

    out = tmp_path / "train"
    args = ["train", "--depths", "2,3", "--width", "32", "--set", "head_dim=16", "--vocab-size", "300",
            "--seq-len", "32", "--batch-size", "8", "--steps", "20", "--snapshot-every", "10", "--seed", "21",
            "--set", "eval_every=10", "--set", "eval_windows=8", "--corpus", micro_corpus, "--keep-checkpoints",
            "--out", str(out)]
    assert main(args) == 0
    assert main(["lifecycle", "--train-run", str(out), "--out", str(tmp_path / "life")]) == 0
    posthoc = pd.read_csv(tmp_path / "life" / "snapshots.csv")
    recorded = pd.read_csv(out / "snapshots.csv")
    assert set(recorded["seed"]) == {21}  # one seed: the post-hoc table (no seed column) is the same run
    pd.testing.assert_frame_equal(posthoc, recorded.drop(columns="seed"), check_exact=False, rtol=1e-12, atol=0)
    waves = lifecycle.wave_summary(lifecycle.wave_gradient(posthoc))
    assert sorted(set(waves["depth"])) == [2, 3] and set(waves["group"]) == {"Q/K", "V/O", "MLP"}
    assert set(lifecycle.delta_alpha(posthoc)["depth"]) == {2, 3}


def test_spectral_lifecycle_chapter_reads_a_checkpoint_series(micro_corpus, tmp_path, monkeypatch):
    """The chapter's checkpoints parameter: the same tables, from kept checkpoint directories."""
    run = train_model(micro_config(micro_corpus, 2), progress=False, keep_checkpoints=True)
    out = tmp_path / "results"
    glob = str(run.path / "checkpoints" / "step-*")
    run_chapter("spectral_lifecycle", dict(checkpoints=glob, out_dir=str(out)), tmp_path, monkeypatch)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["source"] == "checkpoints" and summary["depths"] == [2] and summary["steps"] == 40
    drawn = pd.read_csv(out / "snapshots.csv")
    pd.testing.assert_frame_equal(drawn.drop(columns="depth"), run.snapshots.reset_index(drop=True),
                                  check_exact=False, rtol=1e-12, atol=0, check_dtype=False)



# --- every training cache is verified ---------------------------------------------------------------------

def _tokens_entry(config):
    from zones.core.data import load_corpus
    from zones.series.tokenizer import TOKENIZER_FILE, tokenizer_folder

    corpus = load_corpus(config.corpus)
    folder = tokenizer_folder(corpus, config.vocab_size)
    from zones.core.atomic import file_sha256

    parts = dict(kind="tokens", version=train.VERSION, corpus=corpus.fingerprint,
                 tokenizer=file_sha256(folder / TOKENIZER_FILE))
    from zones.core.cache import entry_path

    return entry_path("tokens", parts, ext="npy"), folder / TOKENIZER_FILE


@pytest.fixture
def own_cache(tmp_path, monkeypatch, micro_corpus):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    config = micro_config(micro_corpus, 2, steps=4, eval_every=2, snapshot_every=4, checkpoint_every=4)
    run = train_model(config, progress=False)
    return config, run


def _train_again(config):
    """Train ``config`` again from the cached tokenizer and tokens (its finished run deleted)."""
    import shutil

    from zones.series import run_path

    shutil.rmtree(run_path(config), ignore_errors=True)
    return train_model(config, progress=False)


def test_a_token_cache_replaced_by_a_valid_all_zeros_array_is_refused(own_cache):
    from zones.core.cache import CacheError

    config, _ = own_cache
    tokens, _ = _tokens_entry(config)
    ids = np.load(tokens)
    np.save(tokens.with_suffix(".tmp.npy"), np.zeros_like(ids))
    tokens.with_suffix(".tmp.npy").replace(tokens)
    with pytest.raises(CacheError, match=f"{tokens}.*delete"):
        _train_again(config)


def test_a_truncated_token_cache_names_the_file(own_cache):
    from zones.core.cache import CacheError

    config, _ = own_cache
    tokens, _ = _tokens_entry(config)
    tokens.write_bytes(tokens.read_bytes()[:200])
    with pytest.raises(CacheError, match=f"{tokens}"):
        _train_again(config)
    train_model(config, progress=False, refresh=True)  # refresh computes the tokens again and replaces them
    assert _train_again(config).summary["final_heldout_loss"] == own_cache[1].summary["final_heldout_loss"]


def test_a_different_or_broken_tokenizer_in_the_cache_is_refused(own_cache):
    from zones.core.cache import CacheError

    config, _ = own_cache
    _, tokenizer_file = _tokens_entry(config)
    spec = json.loads(tokenizer_file.read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab)[200:202]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # a valid BPE tokenizer that encodes differently
    tokenizer_file.write_text(json.dumps(spec))
    with pytest.raises(CacheError, match=f"{tokenizer_file}.*delete the folder"):
        _train_again(config)
    tokenizer_file.write_text("{not json")
    with pytest.raises(CacheError, match=f"{tokenizer_file}"):
        _train_again(config)


def test_an_edited_history_of_a_finished_run_is_an_error_not_a_result(own_cache):
    from zones.core.cache import CacheError

    config, run = own_cache
    history = run.path / "history.csv"
    table = pd.read_csv(history)
    table.loc[len(table) - 1, "heldout_loss"] = 0.123
    table.to_csv(history, index=False)
    with pytest.raises(CacheError, match=f"{history}.*delete the folder {run.path}"):
        train_model(config, progress=False)
    with pytest.raises(CacheError, match="history.csv"):
        train.load_run(run.path)


def test_held_out_loss_is_the_one_loss_routine_of_zones_evaluate(micro_runs):
    from zones.measure.scoring import evaluate_loss

    run = micro_runs[0]
    loaded = run.load()
    windows = train.heldout_split(run.config, run.config.eval_windows)
    assert evaluate_loss(loaded.model, windows).loss == pytest.approx(run.summary["final_heldout_loss"], rel=1e-5)


def test_bf16_training_on_a_cpu_without_native_bf16_is_refused_in_one_line(micro_corpus, monkeypatch):
    from zones.core import hardware

    monkeypatch.setattr(hardware, "cpu_capability", lambda: "AVX2")
    with pytest.raises(ValueError, match=r"training precision 'bf16'.*AVX2, no native bf16.*fp32"):
        train_model(micro_config(micro_corpus, precision="bf16"), progress=False, device="cpu")


def test_series_summary_applies_the_flattening_rule(micro_runs):
    summary = train.series_summary(micro_runs)
    assert {"seed", "late_improvement", "flattened"} <= set(summary.columns)
    history = micro_runs[0].history  # steps 0..40 every 10: the last 20 % runs from step 32 to 40
    before = np.interp(32, history["step"], history["heldout_loss"])
    expected = (before - history["heldout_loss"].iloc[-1]) / before
    assert summary["late_improvement"].iloc[0] == pytest.approx(expected)
    assert summary["flattened"].iloc[0] == (expected < 0.02)


def test_cpu_profile_seeds_and_flops_per_token():
    configs = train.series_configs("cpu", [8], seed=3)  # one training seed
    assert [(c.depth, c.seed) for c in configs] == [(8, 3)]
    assert [(c.depth, c.seed) for c in train.series_configs("cpu", [8, 12], seed=3)] == [(8, 3), (12, 3)]
    # seeds is a count, as in every chapter: seeds 0..n-1 at every depth
    assert [(c.depth, c.seed) for c in train.series_configs("cpu", [8, 16], seeds=2)] == [(8, 0), (8, 1), (16, 0), (16, 1)]
    with pytest.raises(ValueError, match="not both"):
        train.series_configs("cpu", [8], seeds=1, seed=3)
    with pytest.raises(ValueError, match="seeds .a count: seeds 0..n-1. must be an integer"):
        train.series_configs("cpu", [8], seeds=[0, 1])
    config = configs[0]
    assert train.flops_per_token(config) == 6 * train.parameter_count(config) + 12 * 8 * 64 * config.seq_len


def test_snapshots_are_denser_early_where_a_wave_would_run():
    # the cpu profile's first snapshot after initialisation was step 48 of 240: a wave in the first
    # 48 steps could not be seen; the schedule now snapshots every 8 steps up to step 64
    from zones.series.config import PROFILES, TrainConfig

    fields = {k: v for k, v in PROFILES["cpu"].items() if k not in ("depths", "seeds")}
    config = TrainConfig(depth=8, **fields)
    steps = [s for s in range(1, config.steps + 1) if config.is_snapshot(s)]
    assert steps[:8] == [8, 16, 24, 32, 40, 48, 56, 64] and steps[-1] == config.steps and 96 in steps
    assert config.snapshot_text() == "every 48 steps (every 8 up to step 64)"
    assert not TrainConfig(depth=2, steps=10, snapshot_every=5).is_snapshot(3)


def test_one_training_step_counts_three_forwards_and_the_optimizers_update(micro_corpus, monkeypatch):
    """Before: the loop counted 6·N per token from the config, without the optimizer. Now from the
    model's shapes: forward + backward (2 forwards) + AdamW's update of every trained parameter."""
    from zones.core import progress
    from zones.series import loop

    config = micro_config(micro_corpus, steps=3, seed=7, eval_every=100, snapshot_every=100, checkpoint_every=100)
    model = loop.build_model(config)
    tokens = config.batch_size * config.seq_len
    forward = progress.matmul_flops(progress.module_weights(model), tokens)
    trained = sum(p.numel() for p in model.parameters())
    before = progress.work_done()
    progress.count_training(model, tokens)
    counted = (progress.work_done() - before) * progress.REFERENCE_FLOPS
    assert counted == pytest.approx(3 * forward + progress.OPTIMIZER_FLOPS * trained)
    # the loop counts each step so, on its batch's tokens
    calls = []
    monkeypatch.setattr(loop, "count_training", lambda m, n: calls.append((type(m).__name__, n)))
    train_model(config, progress=False, refresh=True)
    assert calls == [("GPTNeoXForCausalLM", tokens)] * 3


# --- runs side by side (zones.series.pool) ---------------------------------------------------------

def _weights(run) -> bytes:
    return (Path(run.path) / "model.safetensors").read_bytes()


def test_runs_trained_side_by_side_equal_runs_trained_one_by_one_to_the_bit(micro_corpus, tmp_path, monkeypatch):
    """Three runs in two worker processes (one trains two) give the runs train_model gives one after
    the other, and the work the workers counted is added to this process's count."""
    from zones.core import progress
    from zones.series import train_runs

    configs = [micro_config(micro_corpus, depth, steps=6, seed=seed, eval_every=3, snapshot_every=3,
                            checkpoint_every=6) for depth, seed in ((2, 11), (3, 11), (2, 15))]
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "side-by-side"))
    before = progress.work_done()
    pooled = train_runs(configs, progress=False, workers=2)
    pooled_work = progress.work_done() - before
    assert [r.config for r in pooled] == configs

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "one-by-one"))
    before = progress.work_done()
    alone = [train_model(c, progress=False) for c in configs]
    alone_work = progress.work_done() - before
    for a, b in zip(pooled, alone):
        assert _weights(a) == _weights(b)
        pd.testing.assert_frame_equal(a.history.drop(columns="seconds"), b.history.drop(columns="seconds"))
        pd.testing.assert_frame_equal(a.snapshots, b.snapshots)
    assert pooled_work == pytest.approx(alone_work, rel=1e-9) and alone_work > 0


def test_a_run_trains_on_its_configs_threads_whatever_the_process_was_set_to(micro_corpus, tmp_path, monkeypatch):
    """Before: a run trained on torch's thread count of the moment (the machine's cores), which
    changes its bits, while its cache key did not name it. Now ``threads`` is part of the run."""
    import torch

    config = micro_config(micro_corpus, 2, steps=4, seed=12, eval_every=2, snapshot_every=4, checkpoint_every=4)
    assert config.threads == 1
    runs = []
    for n in (1, 2):
        monkeypatch.setenv("ZONES_CACHE", str(tmp_path / f"threads-{n}"))
        torch.set_num_threads(n)
        runs.append(train_model(config, progress=False))
        assert torch.get_num_threads() == n  # given back as it was
    torch.set_num_threads(1)
    assert _weights(runs[0]) == _weights(runs[1])
    two = micro_config(micro_corpus, 2, steps=4, seed=12, eval_every=2, snapshot_every=4, checkpoint_every=4, threads=2)
    assert train.run_path(two) != train.run_path(config)


def test_a_run_that_fails_in_its_worker_is_named_with_its_cause(micro_corpus, tmp_path, monkeypatch):
    from zones.series import train_runs

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    bad = [micro_config(micro_corpus, 2, steps=6, seed=seed, lr=1e9, warmup_steps=0, eval_every=3, snapshot_every=3,
                        checkpoint_every=6) for seed in (13, 14)]
    with pytest.raises(RuntimeError, match=r"training depth 2, seed 1[34] failed in its worker process .*"
                                           r"FloatingPointError: training loss became"):
        train_runs(bad, progress=False, workers=2)


def test_runs_are_given_to_workers_longest_first_to_the_least_loaded():
    """The cpu series (three seeds of D8, D12, D16) on two workers, longest first to the least
    loaded: two D16 runs and the three D8 on one, a D16 and the three D12 on the other (about equal
    work; each worker process starts once for all its runs)."""
    from zones.series import series_configs
    from zones.series.pool import assign

    queues = assign(series_configs("cpu"), 2)
    assert [[(c.depth, c.seed) for c in q] for q in queues] == [[(16, 0), (16, 2), (8, 0), (8, 1), (8, 2)],
                                                                [(16, 1), (12, 0), (12, 1), (12, 2)]]
    assert [[c.depth for c in q] for q in assign(series_configs("cpu"), 1)] == [[16, 16, 16, 12, 12, 12, 8, 8, 8]]
    assert len(assign(series_configs("cpu", depths=[8]), 8)) == 3  # never more workers than runs (3 seeds)


# --- nothing left running (issue 55) ----------------------------------------------------------------

def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _python_env(tmp_path) -> dict:
    import os

    root = str(Path(__file__).resolve().parents[1])
    return dict(os.environ, ZONES_CACHE=str(tmp_path / "cache"),
                PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_pool_workers_stop_when_their_parent_is_killed(micro_corpus, tmp_path):
    """Before: ``kill -9`` of a process training runs side by side left its worker processes
    training on, for as long as their runs took. Now each worker watches its parent and stops."""
    import os
    import signal
    import subprocess
    import sys
    import time

    configs = [micro_config(micro_corpus, 2, steps=20000, seed=seed, eval_every=20000, snapshot_every=20000,
                            checkpoint_every=20000).as_dict() for seed in (21, 22)]
    script = ("import json, sys\nfrom zones.series import TrainConfig, train_runs\n"
              "train_runs([TrainConfig(**c) for c in json.loads(sys.argv[1])], progress=False, workers=2)\n")
    parent = subprocess.Popen([sys.executable, "-c", script, json.dumps(configs)], env=_python_env(tmp_path),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while len(workers) < 2 and time.monotonic() < deadline and parent.poll() is None:
            time.sleep(0.2)
            workers = _children(parent.pid)
        assert len(workers) == 2, "the workers did not start"
        time.sleep(1.0)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [w for w in workers if _alive(w)], "workers kept running after their parent was killed"
    finally:
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if parent.poll() is None:
            parent.kill()


def test_a_second_trainer_of_a_run_waits_for_the_first_and_loads_its_run(micro_corpus, tmp_path, monkeypatch,
                                                                           capfd):
    """Before: two processes training the same run trained it side by side, each writing the same
    checkpoint. Now a run being trained holds its lock: a second trainer says so, waits, and loads
    the finished run without training a step."""
    import subprocess
    import sys
    import time

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    config = micro_config(micro_corpus, 2, seed=23, steps=40, eval_every=20, snapshot_every=20, checkpoint_every=20)
    marker = tmp_path / "training"
    script = ("import json, pathlib, sys, time\nfrom zones.series import TrainConfig, train_model\n"
              "marker = pathlib.Path(sys.argv[2])\n"
              "def on_step(step, loss):\n    marker.touch()\n    time.sleep(0.05)\n"
              "train_model(TrainConfig(**json.loads(sys.argv[1])), progress=False, on_step=on_step)\n")
    first = subprocess.Popen([sys.executable, "-c", script, json.dumps(config.as_dict()), str(marker)],
                             env=_python_env(tmp_path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and first.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), first.stderr.read().decode()[-2000:] if first.poll() is not None else "no step"
        capfd.readouterr()
        steps: list[int] = []
        run = train_model(config, progress=False, on_step=lambda step, loss: steps.append(step))
        assert first.wait(timeout=60) == 0
    finally:
        if first.poll() is None:
            first.kill()
    assert steps == [], "the run was trained twice at once"
    said = [line for line in capfd.readouterr().err.splitlines() if "another process" in line]
    assert len(said) == 1 and "waiting" in said[0], said
    assert run.history["step"].tolist() == [0, 20, 40]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_a_killed_worker_is_named_with_its_own_cause_not_a_warning_it_printed(micro_corpus, tmp_path, monkeypatch):
    """Before: a worker killed by a signal was reported with the last line of its output, which
    was Python's warning "RuntimeWarning: 'zones.series.pool' found in sys.modules ..." printed
    at its start. Now the workers start without that warning and a killed one is named by the
    signal that ended it."""
    import os
    import signal
    import threading
    import time

    from zones.series import train_runs

    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    configs = [micro_config(micro_corpus, 2, steps=20000, seed=seed, eval_every=20000, snapshot_every=20000,
                            checkpoint_every=20000) for seed in (24, 25)]

    def kill_the_workers() -> None:
        deadline, workers = time.monotonic() + 60, []
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = [pid for pid in _children(os.getpid()) if "pool" in Path(f"/proc/{pid}/cmdline").read_text()]
        time.sleep(4)  # past their imports: the warning, if any, is printed
        for pid in workers:
            os.kill(pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_the_workers)
    killer.start()
    try:
        with pytest.raises(RuntimeError) as err:
            train_runs(configs, progress=False, workers=2)
    finally:
        killer.join()
    message = str(err.value)
    assert "killed by SIGKILL" in message and "Warning" not in message, message
