"""GAE against a per-row numpy loop over the valid tokens, and the transform's plumbing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.advantages.gae import gae, gae_advantages, last_token_rewards
from rljax.core.batch import make_batch
from rljax.core.transform import Context

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))


def reference(rewards, values, mask, gamma, lam):
    """Textbook GAE on the subsequence of valid tokens of each row (value after the end = 0)."""
    adv = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        idx = np.flatnonzero(mask[b])
        next_v, running = 0.0, 0.0
        for t in idx[::-1]:
            delta = rewards[b, t] + gamma * next_v - values[b, t]
            running = delta + gamma * lam * running
            adv[b, t] = running
            next_v = values[b, t]
    return adv, (adv + values) * mask


GAE = jax.jit(gae, static_argnums=(3, 4))


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.0), (0.99, 0.5)])
def test_matches_reference_with_gaps_in_the_mask(gamma, lam):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 6)).astype(np.float32)
    values = rng.normal(size=(3, 6)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0, 0], [1, 0, 1, 1, 0, 1], [0, 0, 0, 0, 0, 0]], bool)
    adv, ret = GAE(rewards, values, mask, gamma, lam)
    want_adv, want_ret = reference(rewards, values, mask, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_hand_case_lambda_one_is_return_minus_value():
    # gamma = lam = 1, reward 1 on the last token: A_t = 1 - V_t, R_t = 1.
    rewards = np.array([[0.0, 0.0, 1.0]], np.float32)
    values = np.array([[0.2, 0.5, 0.9]], np.float32)
    adv, ret = gae(rewards, values, np.ones((1, 3), bool), 1.0, 1.0)
    np.testing.assert_allclose(adv, [[0.8, 0.5, 0.1]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)


def test_last_token_rewards():
    mask = np.array([[1, 1, 0], [1, 1, 1], [0, 0, 0]], bool)
    got = last_token_rewards(jnp.array([2.0, 3.0, 4.0]), jnp.asarray(mask))
    np.testing.assert_array_equal(got, [[0, 2, 0], [0, 0, 3], [0, 0, 0]])


def make(rewards, mask, values, ref_shift=0.0):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=rewards,
        old_logprobs=np.full((b, t), -1.0),
        ref_logprobs=np.full((b, t), -1.0 - ref_shift),
        extras={"old_values": values},
    )


def test_transform_whitens_and_writes_returns():
    rng = np.random.default_rng(1)
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], bool)
    values = (rng.normal(size=(3, 4)) * mask).astype(np.float32)
    rewards = np.array([1.0, 0.0, 0.5], np.float32)
    t = gae_advantages(gamma=1.0, lam=0.9)
    batch, _, metrics = jax.jit(t.apply)(make(rewards, mask, values), (), CTX)
    token_r = np.zeros((3, 4))
    for b in range(3):
        token_r[b, np.flatnonzero(mask[b])[-1]] = rewards[b]
    adv, ret = reference(token_r, values, mask, 1.0, 0.9)
    np.testing.assert_allclose(batch.extras["returns"], ret, rtol=1e-5, atol=1e-6)
    valid = adv[mask]
    whitened = (valid - valid.mean()) / np.sqrt(valid.var() + 1e-8)
    np.testing.assert_allclose(np.asarray(batch.advantages)[mask], whitened, rtol=1e-4, atol=1e-5)
    assert np.all(np.asarray(batch.advantages)[~mask] == 0)
    np.testing.assert_allclose(metrics["gae/advantages/mean"], valid.mean(), rtol=1e-5)
    err = (ret - values)[mask]
    want_ev = 1 - err.var() / ret[mask].var()
    np.testing.assert_allclose(metrics["gae/explained_variance"], want_ev, rtol=1e-4)


def test_host_token_rewards_replace_the_last_token_reward():
    rng = np.random.default_rng(2)
    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1]], bool)
    values = (rng.normal(size=(2, 4)) * mask).astype(np.float32)
    token_r = np.array([[0.0, -0.5, 1.0, 9.0], [0.2, 0.0, -0.25, 0.7]], np.float32)  # 9: masked
    batch = make(np.array([5.0, 5.0], np.float32), mask, values)  # sequence rewards unused
    batch = batch.replace(extras={**batch.extras, "token_rewards": token_r})
    out, _, _ = gae_advantages(gamma=0.9, lam=0.8, whiten=False).apply(batch, (), CTX)
    adv, ret = reference(token_r * mask, values, mask, 0.9, 0.8)
    np.testing.assert_allclose(out.advantages, adv, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.extras["returns"], ret, rtol=1e-5, atol=1e-6)


def test_kl_in_reward_lowers_every_token_reward():
    mask = np.ones((1, 3), bool)
    values = np.zeros((1, 3), np.float32)
    t = gae_advantages(gamma=1.0, lam=1.0, whiten=False, kl_coef=0.1, kl_estimator="k1")
    batch, _, _ = t.apply(make(np.array([1.0]), mask, values, ref_shift=0.5), (), CTX)
    # k1 = old - ref = 0.5 per token: rewards -0.05, -0.05, 1 - 0.05; A_t = sum of the rest.
    np.testing.assert_allclose(batch.advantages, [[0.85, 0.9, 0.95]], rtol=1e-5)


def test_errors():
    with pytest.raises(ValueError, match="gamma=1.5"):
        gae_advantages(gamma=1.5)
    with pytest.raises(ValueError, match="lam=-0.1"):
        gae(jnp.zeros((1, 2)), jnp.zeros((1, 2)), jnp.ones((1, 2), bool), 1.0, -0.1)
    batch = make(np.zeros(2), np.ones((2, 2), bool), np.zeros((2, 2))).replace(extras={})
    with pytest.raises(ValueError, match="needs the critic's values"):
        gae_advantages().apply(batch, (), CTX)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.booleans(), min_size=12, max_size=12),
    st.lists(st.floats(-1e3, 1e3), min_size=12, max_size=12),
)
def test_finite_and_zero_off_mask(mask, values):
    mask = np.array(mask).reshape(3, 4)
    values = np.array(values, np.float32).reshape(3, 4)
    adv, ret = GAE(np.ones((3, 4), np.float32), values, mask, 0.99, 0.95)
    assert np.all(np.isfinite(adv)) and np.all(np.isfinite(ret))
    assert np.all(np.asarray(adv)[~mask] == 0) and np.all(np.asarray(ret)[~mask] == 0)
