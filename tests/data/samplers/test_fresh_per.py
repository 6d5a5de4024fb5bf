"""FreshPER: freshness half-life, sampling frequencies, IS weights, beta schedule, resume."""

import numpy as np
import pytest

from rljax.data.samplers.fresh_per import (
    FreshPERBuffer,
    FreshPERSettings,
    beta_schedule,
    fresh_priority,
    is_weights,
    sampling_probs,
)


def test_half_life_is_tau_ln2():
    tau = 500.0
    half = tau * np.log(2)
    p0 = fresh_priority([1.0], [0.0], tau)[0]
    np.testing.assert_allclose(fresh_priority([1.0], [half], tau)[0], p0 / 2, rtol=1e-12)
    np.testing.assert_allclose(fresh_priority([1.0], [2 * half], tau)[0], p0 / 4, rtol=1e-12)
    # (|r| + eps) and negative ages (stored in the future) count as age 0.
    np.testing.assert_allclose(fresh_priority([-2.0, 0.0], [-3, 0], tau), [2.000001, 1e-6])


def test_probabilities_and_sampling_frequencies():
    settings = FreshPERSettings(capacity=10, tau=10.0, alpha=0.6, beta_steps=100)
    buf = FreshPERBuffer(settings, seed=0)
    buf.add(0, [100, 101], [1.0, -0.5])
    buf.add(5, [102, 103], [0.0, 2.0])
    step = 8
    p = np.array(
        [
            (1.0 + 1e-6) * np.exp(-8 / 10),
            (0.5 + 1e-6) * np.exp(-8 / 10),
            1e-6 * np.exp(-3 / 10),
            (2.0 + 1e-6) * np.exp(-3 / 10),
        ]
    )
    ref = p**0.6 / (p**0.6).sum()
    np.testing.assert_allclose(buf.probabilities(step), ref, rtol=1e-12)
    np.testing.assert_allclose(sampling_probs(p, 0.6), ref, rtol=1e-12)
    slots, items, _ = buf.sample(step, 20000)
    np.testing.assert_array_equal(items, np.array([100, 101, 102, 103])[slots])
    freq = np.bincount(slots, minlength=4) / 20000
    np.testing.assert_allclose(freq, ref, atol=0.012)


def test_weights_match_formula():
    probs = np.array([0.1, 0.4, 0.25])
    n, beta = 8, 0.7
    raw = (n * probs) ** -beta
    np.testing.assert_allclose(is_weights(probs, n, beta), raw / raw.max(), rtol=1e-12)
    buf = FreshPERBuffer(FreshPERSettings(tau=50.0, beta_steps=10), seed=1)
    buf.add(0, np.arange(6), np.linspace(-1, 1, 6))
    slots, _, w = buf.sample(4, 7)
    pr = buf.probabilities(4)[slots]
    raw = (6 * pr) ** -beta_schedule(4, 0.4, 1.0, 10)
    np.testing.assert_allclose(w, raw / raw.max(), rtol=1e-12)
    assert w.max() == 1.0


def test_beta_schedule_endpoints():
    assert beta_schedule(0, 0.4, 1.0, 100) == 0.4
    np.testing.assert_allclose(beta_schedule(50, 0.4, 1.0, 100), 0.7)
    assert beta_schedule(100, 0.4, 1.0, 100) == 1.0
    assert beta_schedule(10**6, 0.4, 1.0, 100) == 1.0


def test_fifo_update_and_errors():
    buf = FreshPERBuffer(FreshPERSettings(capacity=3), seed=0)
    with pytest.raises(ValueError, match="empty"):
        buf.sample(0, 1)
    buf.add(0, [1, 2], [0.0, 0.0])
    buf.add(1, [3, 4], [0.0, 0.0])
    np.testing.assert_array_equal(buf.item_ids, [2, 3, 4])
    np.testing.assert_array_equal(buf.stored_steps, [0, 1, 1])
    buf.update([0], [1.0])
    assert buf.rewards.tolist() == [1.0, 0.0, 0.0] and buf.stored_steps[0] == 0


def test_resume_is_exact():
    def run(buf, steps):
        out = []
        for step in steps:
            buf.add(step, [step * 10, step * 10 + 1], [np.sin(step), np.cos(step)])
            slots, items, w = buf.sample(step, 5)
            buf.update(slots, np.sin(items * 0.3))
            out.append((items, w))
        return out

    settings = FreshPERSettings(capacity=12, tau=5.0, beta_steps=10)
    straight = FreshPERBuffer(settings, seed=4)
    run(straight, range(7))
    saved = straight.state()
    a = run(straight, range(7, 15))
    resumed = FreshPERBuffer(settings, seed=4)
    resumed.load(saved)
    b = run(resumed, range(7, 15))
    for (i1, w1), (i2, w2) in zip(a, b):
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_array_equal(w1, w2)
    assert FreshPERBuffer(settings, 0).state() == {}
