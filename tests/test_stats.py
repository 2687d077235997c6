"""The paired bootstrap on synthetic per-window losses with a known answer."""
import numpy as np
import pytest
import scipy.stats

from zones.measure.bootstrap import (
    NonFiniteLossError,
    check_finite,
    delta_loss_interval,
    paired_bootstrap,
    seeded,
    token_loss,
)

TOKENS = 255


def synthetic(rng, n_windows=40, true_delta=0.05, shared_sd=0.5, own_sd=0.03, n_variants=1):
    """Per-window NLL sums of a base model and variants that raise the loss by ``true_delta``
    nats on average; every window has its own difficulty, shared by all models."""
    difficulty = rng.normal(0, shared_sd, size=n_windows)           # the shared window effect
    base = TOKENS * (3.0 + difficulty)
    noise = rng.normal(0, own_sd, size=(n_variants, n_windows))
    variants = base + TOKENS * (true_delta + noise)
    return variants, base, np.full(n_windows, TOKENS)


def test_interval_covers_the_true_difference_in_about_95_percent():
    rng = np.random.default_rng(0)
    reps, covered = 200, 0
    for rep in range(reps):
        variants, base, n = synthetic(rng)
        interval = delta_loss_interval(variants, base, n, n_resamples=1000, seed=rep)
        covered += bool(interval.low[0] <= 0.05 <= interval.high[0])
        assert interval.low[0] <= interval.estimate[0] <= interval.high[0]
    assert 0.90 <= covered / reps <= 0.99


def test_identical_variants_give_a_zero_width_interval_at_zero():
    rng = np.random.default_rng(1)
    _, base, n = synthetic(rng)
    interval = delta_loss_interval(np.stack([base, base]), base, n)
    assert np.all(interval.estimate == 0) and np.all(interval.low == 0) and np.all(interval.high == 0)


def test_pairing_cancels_a_shared_window_effect():
    rng = np.random.default_rng(2)
    variants, base, n = synthetic(rng, shared_sd=0.5, own_sd=0.01)
    paired = delta_loss_interval(variants, base, n)
    assert paired.low[0] <= 0.05 <= paired.high[0]
    # Unpaired, the two losses would each carry the window effect: their own intervals are
    # far wider than the paired interval of the difference.
    alone = paired_bootstrap(token_loss, (base, n), seed=5)
    assert paired.half_width[0] < alone.half_width / 10


def test_one_index_matrix_for_every_variant_and_every_call():
    rng = np.random.default_rng(3)
    variants, base, n = synthetic(rng, n_variants=3)
    joint = delta_loss_interval(variants, base, n, seed=7)
    for v in range(3):  # a separate call with the same seed draws the same windows
        alone = delta_loss_interval(variants[v:v + 1], base, n, seed=7)
        assert (alone.low[0], alone.high[0]) == (joint.low[v], joint.high[v])
    other = delta_loss_interval(variants, base, n, seed=8)
    assert not np.array_equal(other.low, joint.low)


def test_too_few_windows_and_bad_arguments():
    one = delta_loss_interval(np.array([[300.0]]), np.array([290.0]), np.array([TOKENS]))
    assert one.estimate[0] == pytest.approx(10 / TOKENS) and np.isnan(one.low[0]) and np.isnan(one.high[0])
    rng = np.random.default_rng(4)
    variants, base, n = synthetic(rng)
    for kwargs in (dict(n_resamples=0), dict(level=1.5), dict(interval_method="normal"), dict(n_resamples=True),
                   dict(n_resamples=99.9), dict(level=0), dict(level=float("nan"))):
        with pytest.raises(ValueError, match=r"^(n_resamples|level|interval_method) must be .*; got "):
            delta_loss_interval(variants, base, n, **kwargs)
    numpy_count = delta_loss_interval(variants, base, n, n_resamples=np.int64(300), level=np.float32(0.9))
    python_count = delta_loss_interval(variants, base, n, n_resamples=300, level=float(np.float32(0.9)))
    np.testing.assert_array_equal(numpy_count.low, python_count.low)
    bca = delta_loss_interval(variants, base, n, interval_method="BCa")
    assert bca.low[0] < 0.05 < bca.high[0]


def test_non_finite_losses_are_named():
    nll = np.array([[1.0, 2.0], [3.0, np.nan]])
    with pytest.raises(NonFiniteLossError, match="with block 7 removed is not finite.*window 1 of 2"):
        check_finite(nll, lambda v: f"with block {[4, 7][v]} removed")
    check_finite(nll[:1], str)


def test_seeded_passes_one_generator_under_the_name_scipy_knows():
    calls = []

    def new_style(data, *, rng=None):
        calls.append(("rng", rng.random()))

    def old_style(data, *, random_state=None):
        calls.append(("random_state", random_state.random()))

    seeded(new_style, [1], seed=5)
    seeded(old_style, [1], seed=5)
    assert calls[0][0] == "rng" and calls[1][0] == "random_state" and calls[0][1] == calls[1][1]
    data = (np.arange(10.0),)
    first = seeded(scipy.stats.bootstrap, data, np.mean, n_resamples=50, seed=1).bootstrap_distribution
    again = seeded(scipy.stats.bootstrap, data, np.mean, n_resamples=50, seed=1).bootstrap_distribution
    np.testing.assert_array_equal(first, again)
