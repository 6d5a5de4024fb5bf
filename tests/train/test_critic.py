"""The critic: values from a head on the policy or on its own trunk, and PPO updates with it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.algorithms import ppo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train.critic import critic_values, init_critic
from rljax.train.logprobs import policy_states
from rljax.train.steps import RolloutConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
ROLLOUT = RolloutConfig(max_new_tokens=4, n_samples=2, eos_id=1, pad_id=0)
PROMPTS = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)


def inputs():
    completion = jnp.asarray([[3, 4, 1, 0], [5, 6, 7, 8]], jnp.int32)
    return PROMPTS, PROMPTS > 0, completion, completion > 0


def test_head_on_policy_reads_the_policy_states():
    graphdef, params = create_model(CONFIG, seed=0)
    pt, pm, ct, cm = inputs()
    states = policy_states(graphdef, params, pt, pm, ct, cm)
    critic = init_critic(16)
    critic["head"]["kernel"] = jnp.arange(16, dtype=jnp.float32) / 16
    critic["head"]["bias"] = jnp.float32(0.5)
    got = critic_values(critic, None, states, pt, pm, ct, cm)
    want = np.asarray(states.completion_hidden) @ np.asarray(critic["head"]["kernel"]) + 0.5
    np.testing.assert_allclose(got, np.where(np.asarray(cm), want, 0.0), rtol=1e-5, atol=1e-6)


def test_separate_trunk_ignores_the_policy():
    graphdef, params = create_model(CONFIG, seed=0)
    _, trunk = create_model(CONFIG, seed=1)
    pt, pm, ct, cm = inputs()
    critic = init_critic(16, trunk)
    critic["head"]["kernel"] = jnp.ones(16)
    own = policy_states(graphdef, trunk, pt, pm, ct, cm)
    policy = policy_states(graphdef, params, pt, pm, ct, cm)
    got = critic_values(critic, graphdef, policy, pt, pm, ct, cm)
    want = np.asarray(own.completion_hidden).sum(-1)
    np.testing.assert_allclose(got, np.where(np.asarray(cm), want, 0.0), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="disagree"):
        critic_values(critic, None, policy, pt, pm, ct, cm)
    with pytest.raises(ValueError, match="d_model=0"):
        init_critic(0)


@pytest.mark.parametrize("separate", [False, True])
def test_ppo_updates_fit_the_critic_to_the_returns(separate):
    graphdef, params = create_model(CONFIG, seed=0)
    trunk_graphdef, trunk = (
        (graphdef, create_model(CONFIG, seed=0)[1]) if separate else (None, None)
    )
    algorithm = ppo(gamma=1.0, lam=1.0)
    optimizer = optax.adam(3e-2)
    state = init_train_state(
        params, optimizer, algorithm.transform, jax.random.PRNGKey(0), critic=init_critic(16, trunk)
    )
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, critic_graphdef=trunk_graphdef)
    rollout = steps.rollout(state, PROMPTS, PROMPTS > 0)
    batch = make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        jnp.asarray([1.0, 0.0, 0.5, 0.25]),
        rollout_logprobs=rollout.sampling_logprobs,
    )
    policy_before = jax.tree.map(np.asarray, state.params)
    errors = []
    for _ in range(15):  # the same batch again and again: the critic's error must fall
        state, prepared, prepare_metrics = steps.prepare(state, batch)
        state, metrics = steps.update(state, prepared)
        errors.append(float(metrics["value/error"]))
        assert np.isfinite(float(metrics["loss"]))
    # Returns with gamma = lam = 1 are the sequence reward on every valid token.
    want = np.asarray(batch.rewards)[:, None] * np.asarray(batch.completion_mask)
    np.testing.assert_allclose(prepared.extras["returns"], want, rtol=1e-5, atol=1e-6)
    assert errors[-1] < 0.5 * errors[0], errors
    assert "gae/explained_variance" in prepare_metrics
    moved = [
        not np.allclose(a, b)
        for a, b in zip(jax.tree.leaves(policy_before), jax.tree.leaves(state.params))
    ]
    assert any(moved)


def test_prepare_without_a_critic_says_how_to_add_one():
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm = ppo()
    optimizer = optax.sgd(1.0)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT)
    rollout = steps.rollout(state, PROMPTS, PROMPTS > 0)
    batch = make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        jnp.zeros(4),
    )
    with pytest.raises(ValueError, match="no critic"):
        steps.prepare(state, batch)
