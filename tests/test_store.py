"""Every forward pass computed once: the model at the door, one eval set read by prefix, the
per-window loss store shared by the ablation, the pruning sweep and the agreement scorer, and
the work each of them counts."""
import numpy as np
import pandas as pd
import pytest
from conftest import tiny_model

from zones.core import adapters, hardware, progress
from zones.core.data import make_windows, nested_order
from zones.measure.ablation import ablation_table, ablation_window_losses
from zones.measure.agreement import agreement_window_losses
from zones.measure.scoring import evaluate_loss, evaluate_removals, score_windows
from zones.measure.subject import as_subject, check_dtype
from zones.pruning import pruning_sweep
from zones.pruning.sublayer_pruning import plan_table, score_plans
from zones.spectra import alpha_table

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZONES_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def corpus_ids(seed=0, n=60 * 16):
    return np.random.default_rng(seed).integers(0, 256, size=n)


def count_traces(monkeypatch) -> list:
    """Every batch traced through the full model (the start of any scoring)."""
    from zones.measure import scoring

    traced = []
    real = scoring.BlockTrace

    def counting(model, ids, adapter=None):
        traced.append(ids.shape[0])
        return real(model, ids, adapter)

    monkeypatch.setattr(scoring, "BlockTrace", counting)
    return traced


def test_nested_order_makes_every_budget_a_prefix_of_a_larger_one():
    for n in (1, 2, 7, 16, 45):
        order = nested_order(n)
        assert sorted(order) == list(range(n))
    assert list(nested_order(8)) == [0, 4, 2, 6, 1, 5, 3, 7]  # the middle, the quarters, the eighths
    ids = corpus_ids()
    small, large = (make_windows(ids, 16, "eval", max_tokens=k * 15) for k in (4, 12))
    assert small.n_windows == 4 and large.n_windows == 12
    assert np.array_equal(small.input_ids, large.input_ids[:4])
    # the first windows are spread through the split, not its beginning
    first, last = make_windows(ids, 16, "eval").input_ids[[0, 1]]
    assert not np.array_equal(first, last)


def test_a_smaller_budget_reads_the_batches_a_larger_one_scored(own_cache, monkeypatch):
    model = tiny_model("llama", n_layers=4)
    ids = corpus_ids()
    small, large = (make_windows(ids, 16, "eval", max_tokens=k * 15) for k in (4, 8))
    big = ablation_window_losses(model, large, batch_size=4, progress=False)
    traced = count_traces(monkeypatch)
    part = ablation_window_losses(model, small, batch_size=4, progress=False)
    assert traced == []  # nothing was scored again
    expected = big[big["window"] < 4].reset_index(drop=True)
    pd.testing.assert_frame_equal(part, expected, check_exact=True)
    # ...and the numbers are those of a run that never saw the larger budget
    fresh = ablation_window_losses(model, small, batch_size=4, cache=False, progress=False)
    pd.testing.assert_frame_equal(part, fresh, check_exact=True)


def test_the_pruning_sweep_reads_the_single_blocks_of_the_ablation(own_cache, monkeypatch):
    model = tiny_model("gpt_neox", n_layers=5)
    windows = make_windows(corpus_ids(1), 16, "eval", max_tokens=6 * 15)
    ablation_table(model, windows, batch_size=3, progress=False)
    scored = []
    from zones.measure import scoring

    real = scoring._ChunkScorer.values
    monkeypatch.setattr(scoring._ChunkScorer, "values", lambda self, r: scored.append(r) or real(self, r))
    result = pruning_sweep(model, windows, strategies=["last_n", "random"], k_max=2, seeds=2, batch_size=3,
                           progress=False)
    singles = [r for r in scored if len(r) == 2]  # a whole block is two sublayers
    assert singles == []  # every single-block set came from the store
    assert scored  # the two-block sets were scored
    removed = set(result.window_losses["removed"])
    assert {"4", "3,4"} <= removed


def test_agreement_nll_is_the_loss_routine_s_to_the_bit(own_cache):
    model = tiny_model("llama", n_layers=4, seed=3)
    windows = make_windows(corpus_ids(2), 16, "eval", max_tokens=5 * 15)
    loss = score_windows(model, windows, ["", "1", "2:attn"], batch_size=2, cache=False, progress=False)["nll"]
    agree = agreement_window_losses(model, windows, ["1", "2:attn"], batch_size=2, cache=False, progress=False)
    assert np.array_equal(agree["nll"].to_numpy(), loss[1:].reshape(-1))
    assert np.array_equal(agree["base_nll"].to_numpy()[:5], loss[0])
    # the plain forward and the traced full model give the same bits too (float32)
    assert np.array_equal(evaluate_loss(model, windows, 2).window_nll, loss[0])
    assert np.array_equal(evaluate_loss(model, windows, 2, cache=True).window_nll, loss[0])


def test_evaluate_removals_is_cached_only_when_asked(own_cache, monkeypatch):
    model = tiny_model("gpt2", n_layers=3)
    windows = make_windows(corpus_ids(3), 16, "eval", max_tokens=4 * 15)
    evaluate_removals(model, windows, [[1]], batch_size=2, progress=False)
    assert not list(own_cache.glob("window-losses/*.jsonl"))
    first = evaluate_removals(model, windows, [[1]], batch_size=2, progress=False, cache=True)
    traced = count_traces(monkeypatch)
    again = evaluate_removals(model, windows, [[1]], batch_size=2, progress=False, cache=True)
    assert traced == [] and np.array_equal(first[0].window_nll, again[0].window_nll)


def test_auto_precision_is_bfloat16_only_where_it_is_native(monkeypatch):
    model = tiny_model("llama", n_layers=2)
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": False)
    assert check_dtype("auto", model) == "float32" and as_subject(model, "auto").dtype == "float32"
    monkeypatch.setattr(hardware, "native_bf16", lambda device="cpu": True)
    assert check_dtype("auto", model) == "bfloat16" and as_subject(model, "auto").dtype == "bfloat16"
    assert check_dtype("auto") == "auto"  # without a model it stays a request
    with pytest.raises(ValueError, match="dtype must be one of"):
        check_dtype("fp16", model)


def test_a_model_enters_the_measuring_code_once(own_cache, monkeypatch):
    """The sublayer comparison runs the model through the similarity, both greedy searches, the
    prefix-tree scorer and KL: one adapter, one fingerprint, one fit check per set of windows."""
    from zones.measure import subject as subject_module

    model = tiny_model("llama", n_layers=4)
    windows = make_windows(corpus_ids(4), 16, "eval", max_tokens=4 * 15)
    calibration = make_windows(corpus_ids(4), 16, "calibration", max_tokens=2 * 15)
    alphas = alpha_table(model)
    made, fingerprints, fits = [], [], []
    real_init = adapters.Adapter.__init__
    monkeypatch.setattr(adapters.Adapter, "__init__", lambda self, m: made.append(1) or real_init(self, m))
    real_fp, real_fit = subject_module.model_fingerprint, subject_module.check_windows_fit
    monkeypatch.setattr(subject_module, "model_fingerprint", lambda m: fingerprints.append(1) or real_fp(m))
    monkeypatch.setattr(subject_module, "check_windows_fit", lambda m, w: fits.append(w.split) or real_fit(m, w))
    subject = as_subject(model)
    plans = plan_table(subject, calibration, alphas, k_max=1, batch_size=2, progress=False)
    score_plans(subject, windows, plans, batch_size=2, progress=False)
    assert len(made) == 1 and len(fingerprints) == 1
    assert sorted(fits) == ["calibration", "eval"]


def test_work_is_counted_in_reference_forwards(own_cache):
    model = tiny_model("llama", n_layers=4)
    windows = make_windows(corpus_ids(5), 16, "eval", max_tokens=4 * 15)
    start = progress.work_done()
    ablation_table(model, windows, batch_size=2, progress=False)
    counted = progress.work_done() - start
    weights = sum(p.numel() for b in model.model.layers for p in b.parameters() if p.dim() == 2)
    head = model.lm_head.weight.numel()
    tokens, scored = windows.n_windows * 16, windows.n_windows * 15
    # the trace (every block), each removal from its block on, and one head per variant
    block = weights / 4
    expected = 2 * (tokens * (4 * block + sum(3 - i for i in range(4)) * block) + 5 * head * scored)
    assert counted == pytest.approx(expected / progress.REFERENCE_FLOPS)
    again = progress.work_done()
    ablation_table(model, windows, batch_size=2, progress=False)  # read from the store: no work
    assert progress.work_done() == again


def test_the_depth_series_chapters_ask_for_the_same_trained_runs(monkeypatch):
    """The depth-series, lifecycle and sublayer chapters, with their defaults, train their runs
    through one cache key per (depth, seed): whichever runs first trains, the others read."""
    from zones.report import depth_series, spectral_lifecycle
    from zones.series import runs as series_runs
    from zones.series.io import run_key

    asked: dict[str, set] = {}
    for name, call in (("depth_series", depth_series.run), ("lifecycle", spectral_lifecycle.run),
                       ("sublayers", lambda: series_runs.series_sublayer_rho("cpu", eval_tokens=2032))):
        def train_runs(configs, _name=name, **_):
            for config in configs:
                asked.setdefault(_name, set()).add(str(sorted(run_key(config, "corpus").items())))
            raise RuntimeError("not trained here")

        monkeypatch.setattr(series_runs, "train_runs", train_runs)
        with pytest.raises(Exception):  # the chapter stops at its first use of an untrained run
            call()
    assert asked["lifecycle"] <= asked["depth_series"] == asked["sublayers"]
    assert len(asked["depth_series"]) == 9  # three seeds at each of D8, D12 and D16
