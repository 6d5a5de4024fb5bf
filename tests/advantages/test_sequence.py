"""sequence_advantages: one body for the per-sequence estimators."""

import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages import group_advantages, grpo_advantages, sequence_advantages
from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jnp.zeros(2, jnp.uint32))


def batch(rewards, mask):
    b, t = np.shape(mask)
    return make_batch(
        jnp.ones((b, 2)),
        jnp.ones((b, 2)),
        jnp.ones((b, t)),
        mask,
        np.repeat(np.arange(b // 2), 2),
        rewards,
    )


def test_broadcasts_over_the_mask_and_reports_the_statistics():
    mask = np.asarray([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)
    b = batch([1.0, 0.0, 2.0, 2.0], mask)
    t = sequence_advantages("centred", lambda r, _: r - 1.0, group_size=2, prefix="c")
    out, _, metrics = t.apply(b, t.init(), CTX)
    want = np.asarray([0.0, -1.0, 1.0, 1.0])[:, None] * mask
    np.testing.assert_allclose(out.advantages, want)
    valid = want[mask]
    np.testing.assert_allclose(metrics["c/advantages/mean"], valid.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["c/advantages/std"], valid.std(), rtol=1e-6)
    assert float(metrics["c/advantages/min"]) == valid.min()
    assert float(metrics["c/advantages/max"]) == valid.max()
    assert float(metrics["c/zero_std_frac"]) == 0.5  # the second group's rewards are equal
    assert t.reads == {keys.REWARDS, keys.GROUP_ID, keys.COMPLETION_MASK}
    assert t.writes == {keys.ADVANTAGES}


def test_extra_metrics_and_the_unprefixed_names_match_group_advantages():
    mask = np.ones((4, 3), bool)
    b = batch([1.0, 0.0, 0.5, 0.25], mask)

    def fn(rewards, batch):
        return grpo_advantages(rewards, 2), {"extra/one": jnp.float32(1.0)}

    t = sequence_advantages("mine", fn, group_size=2)
    _, _, metrics = t.apply(b, t.init(), CTX)
    ref = group_advantages(2)
    _, _, want = ref.apply(b, ref.init(), CTX)
    assert metrics.pop("extra/one") == 1.0
    assert metrics.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(metrics[k], want[k])


def test_errors_name_the_transform():
    t = sequence_advantages("my_estimator", lambda r, _: r, group_size=2)
    with pytest.raises(ValueError, match="my_estimator needs \\[B\\] rewards"):
        t.apply(batch(np.ones((4, 2)), np.ones((4, 3), bool)), (), CTX)
    with pytest.raises(ValueError, match="zero_std=True needs a group_size"):
        sequence_advantages("x", lambda r, _: r)
