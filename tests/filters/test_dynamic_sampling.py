"""Tests for rljax.filters.dynamic_sampling: DAPO's zero-signal group filter."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.group import group_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context, chain
from rljax.filters.dynamic_sampling import dynamic_sampling, select_informative_groups

# Four groups of three: all-correct, mixed, all-wrong, mixed.
REWARDS = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0], np.float32)
CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))


def make(rewards=REWARDS, extras=None):
    b = rewards.shape[0]
    mask = np.ones((b, 4), bool)
    mask[::2, 3] = False
    weights = mask * np.linspace(0.5, 1.5, b, dtype=np.float32)[:, None]
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, 4)),
        completion_mask=mask,
        group_id=np.repeat(np.arange(b // 3), 3),
        rewards=rewards,
        loss_weights=weights,
        extras=extras,
    )


def reference_keep(rewards, g):
    keep = []
    for start in range(0, len(rewards), g):
        group = [rewards[k] for k in range(start, start + g)]
        keep.append(any(np.any(np.asarray(x) != np.asarray(group[0])) for x in group))
    return np.array(keep)


def test_host_helper():
    keep = select_informative_groups(REWARDS, 3)
    np.testing.assert_array_equal(keep, [False, True, False, True])
    np.testing.assert_array_equal(keep, reference_keep(REWARDS, 3))
    assert keep.dtype == bool
    multi = np.array([[1, 0], [1, 1], [0, 0], [0, 0]], np.float32)  # [B, K]
    np.testing.assert_array_equal(select_informative_groups(multi, 2), [True, False])


def test_transform_zeroes_constant_groups_under_jit():
    t = dynamic_sampling(3)
    batch = make()
    out, state, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    keep_rows = np.repeat(reference_keep(REWARDS, 3), 3)
    np.testing.assert_array_equal(
        out.loss_weights, np.asarray(batch.loss_weights) * keep_rows[:, None]
    )
    np.testing.assert_allclose(metrics["dynamic_sampling/kept_frac"], 0.5)
    np.testing.assert_array_equal(out.rewards, REWARDS)  # rewards untouched
    assert state == ()


def test_reward_key_and_chain_with_advantages():
    # Shaped rewards would make group 0 look informative; the filter reads the raw accuracy.
    shaped = REWARDS - np.array([0.0, 0.3, 0.0] + [0.0] * 9, np.float32)
    batch = make(shaped, extras={"acc": jnp.array(REWARDS)})
    t = chain(dynamic_sampling(3, reward_key="acc"), group_advantages(3))
    out, _, metrics = t.apply(batch, t.init(), CTX)
    np.testing.assert_allclose(metrics["dynamic_sampling/kept_frac"], 0.5)
    assert np.all(np.asarray(out.loss_weights)[:3] == 0)
    # Without the key, group 0 (shaped rewards vary) is kept.
    _, _, m = dynamic_sampling(3).apply(batch, (), CTX)
    np.testing.assert_allclose(m["dynamic_sampling/kept_frac"], 0.75)


def test_all_groups_informative_is_identity():
    rewards = np.array([1, 0, 0, 0, 1, 0], np.float32)
    batch = make(rewards)
    out, _, metrics = dynamic_sampling(3).apply(batch, (), CTX)
    np.testing.assert_array_equal(out.loss_weights, batch.loss_weights)
    assert metrics["dynamic_sampling/kept_frac"] == 1.0


def test_errors():
    with pytest.raises(ValueError, match="group_size=1"):
        dynamic_sampling(1)
    with pytest.raises(ValueError, match="does not divide"):
        select_informative_groups(np.zeros(5), 2)
    with pytest.raises(ValueError, match="group_size=1"):
        select_informative_groups(np.zeros(4), 1)
    with pytest.raises(ValueError, match="reward_key='acc' is not in batch.extras"):
        dynamic_sampling(3, reward_key="acc").apply(make(), (), CTX)
    with pytest.raises(ValueError, match="mixes group ids"):
        dynamic_sampling(3).apply(make().replace(group_id=jnp.arange(12)), (), CTX)
