"""Environment tokens of multi-turn episodes: attended to as context, never learned from.

A completion holds policy turns (`completion_mask`) with environment observations between them
(`extras["env_mask"]`). The trainer's forward passes attend to both (`context_mask`); losses,
aggregation and statistics read the policy tokens only.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.algorithms import PPOSettings, grpo
from rljax.core.batch import context_mask, make_batch
from rljax.core.state import init_train_state
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.train.critic import critic_values, init_critic
from rljax.train.host_batch import HostBatch
from rljax.train.padding import trim_padding, used_widths
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
GROUP = 2
ROLLOUT = RolloutConfig(max_new_tokens=8, n_samples=GROUP, eos_id=1, pad_id=0)
P, T = 3, 8
# Each row: (policy, env, policy) turn lengths; the rest of the T columns is padding.
TURNS = [(2, 2, 2), (1, 3, 3), (3, 1, 1), (2, 4, 2)]


def turn_masks() -> tuple[np.ndarray, np.ndarray]:
    """[B, T] bool policy and environment masks of `TURNS`."""
    policy, env = np.zeros((len(TURNS), T), bool), np.zeros((len(TURNS), T), bool)
    for i, (a, e, b) in enumerate(TURNS):
        policy[i, :a] = True
        env[i, a : a + e] = True
        policy[i, a + e : a + e + b] = True
    return policy, env


def episode_batch(seed: int = 0):
    """A batch of four rows of policy, environment and policy tokens, with advantages, old,
    reference and sampler log-probs and loss weights on the policy tokens."""
    rng = np.random.default_rng(seed)
    policy, env = turn_masks()
    b = len(TURNS)
    prompts = rng.integers(2, 30, (b, P)).astype(np.int32)
    prompt_mask = np.ones((b, P), bool)
    prompt_mask[0, 0] = False  # one left-padded prompt
    prompts[0, 0] = 0
    real = policy | env
    tokens = np.where(real, rng.integers(2, 30, (b, T)), 0).astype(np.int32)
    on_policy = lambda x: np.where(policy, x, 0.0).astype(np.float32)
    return make_batch(
        prompts,
        prompt_mask,
        tokens,
        policy,
        np.repeat(np.arange(b // GROUP), GROUP),
        rng.integers(0, 2, b).astype(np.float32),
        rollout_logprobs=on_policy(-rng.random((b, T)) - 1.0),
        old_logprobs=on_policy(-rng.random((b, T)) - 1.0),
        ref_logprobs=on_policy(-rng.random((b, T)) - 1.0),
        advantages=on_policy(rng.normal(size=(b, T))),
        loss_weights=on_policy(rng.uniform(0.5, 1.5, (b, T))),
        extras={"env_mask": jnp.asarray(env)},
    )


def perturbed_at_env(batch, seed: int = 1):
    """`batch` with large random values at its environment positions in every per-token field
    a loss could read."""
    rng = np.random.default_rng(seed)
    env = np.asarray(batch.extras["env_mask"])

    def noisy(x, scale=50.0):
        return jnp.where(env, jnp.asarray(scale * rng.normal(size=env.shape), jnp.float32), x)

    return batch.replace(
        advantages=noisy(batch.advantages),
        rollout_logprobs=noisy(batch.rollout_logprobs),
        old_logprobs=noisy(batch.old_logprobs),
        ref_logprobs=noisy(batch.ref_logprobs),
        loss_weights=jnp.where(env, jnp.asarray(rng.uniform(10, 100, env.shape)), 0.0)
        + batch.loss_weights,
    )


@pytest.fixture(scope="module")
def trainer():
    """One tiny policy and its jitted steps (compiled once for the whole module): old log-probs
    recomputed in prepare, KL and entropy terms on, two microbatches."""
    graphdef, params = create_model(CONFIG, seed=0)
    algorithm = grpo(group_size=GROUP, ppo=PPOSettings(kl_coef=0.1, entropy_coef=0.01))
    optimizer = optax.sgd(1.0)
    state = init_train_state(
        params, optimizer, algorithm.transform, jax.random.PRNGKey(0), keep_reference=True
    )
    update = UpdateConfig(old_logprobs="recompute", microbatches=2, vocab_chunk=7)
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, update)
    return graphdef, params, steps, state


def test_context_mask_is_the_union_of_policy_and_environment_tokens():
    policy, env = turn_masks()
    batch = episode_batch()
    got = context_mask(batch)
    assert got.dtype == jnp.bool_
    np.testing.assert_array_equal(got, policy | env)
    # Float masks count where positive; no env_mask: the completion mask itself.
    as_float = batch.replace(extras={"env_mask": jnp.asarray(env, jnp.float32)})
    np.testing.assert_array_equal(jax.jit(context_mask)(as_float), policy | env)
    np.testing.assert_array_equal(context_mask(batch.replace(extras={})), policy)
    with pytest.raises(AssertionError):
        context_mask(batch.replace(extras={"env_mask": jnp.zeros((4, T + 1), bool)}))


def test_environment_tokens_add_nothing_to_the_loss_or_its_gradient(trainer):
    _, _, steps, state = trainer
    batch = episode_batch()
    # `update` donates its state: each call gets its own copy.
    runs = [
        steps.update(jax.tree.map(jnp.copy, state), b) for b in (batch, perturbed_at_env(batch))
    ]
    (a, metrics_a), (b, metrics_b) = runs
    assert np.isfinite(float(metrics_a["loss"])) and float(metrics_a["grad_norm"]) > 0
    assert float(metrics_a["guard/skipped"]) == 0.0
    for name in metrics_a:
        np.testing.assert_allclose(metrics_b[name], metrics_a[name], atol=1e-6, err_msg=name)
    # SGD with learning rate 1: the parameter step is the gradient.
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params), strict=True):
        np.testing.assert_allclose(y, x, atol=1e-6)


def test_prepare_measures_the_policy_tokens_only(trainer):
    _, _, steps, state = trainer
    batch = episode_batch()
    outs = [steps.prepare(state, b) for b in (batch, perturbed_at_env(batch))]
    (_, prepared, metrics_a), (_, _, metrics_b) = outs
    for name in metrics_a:
        np.testing.assert_allclose(metrics_b[name], metrics_a[name], atol=1e-6, err_msg=name)
    env = np.asarray(batch.extras["env_mask"])
    assert not np.asarray(prepared.old_logprobs)[env].any()
    assert not np.asarray(prepared.extras["old_entropy"])[env].any()
    assert prepared.extras["env_mask"].dtype == jnp.bool_


def test_environment_tokens_are_context_at_their_real_positions(trainer):
    _, _, steps, state = trainer
    policy, env = turn_masks()
    batch = episode_batch()
    _, prepared, _ = steps.prepare(state, batch)
    got = np.asarray(prepared.old_logprobs)
    # The same sequence with every token a completion token: environment tokens are ordinary
    # context there.
    plain = steps.logprobs(
        state, batch.prompt_tokens, batch.prompt_mask, batch.completion_tokens, policy | env
    )
    np.testing.assert_allclose(got[policy], np.asarray(plain)[policy], atol=1e-5)

    # Other observations change the log-probs of the policy tokens after them, not before.
    tokens = np.asarray(batch.completion_tokens)
    other = jnp.asarray(np.where(env, 2 + (tokens - 2 + 5) % 28, tokens), jnp.int32)
    _, changed, _ = steps.prepare(state, batch.replace(completion_tokens=other))
    changed = np.asarray(changed.old_logprobs)
    after = policy & (np.cumsum(env, axis=1) > 0)
    before = policy & ~after
    np.testing.assert_allclose(changed[before], got[before], atol=1e-6)
    assert (np.abs(changed[after] - got[after]) > 1e-4).all()


def test_a_separate_critic_attends_to_environment_tokens(trainer):
    graphdef, params, _, _ = trainer
    policy, env = turn_masks()
    batch = episode_batch()
    critic = init_critic(CONFIG.d_model, trunk=params)
    critic["head"]["kernel"] = jnp.linspace(-1.0, 1.0, CONFIG.d_model)
    inputs = (batch.prompt_tokens, batch.prompt_mask, batch.completion_tokens)
    got = critic_values(critic, graphdef, None, *inputs, batch.completion_mask, context_mask(batch))
    plain = critic_values(critic, graphdef, None, *inputs, jnp.asarray(policy | env))
    np.testing.assert_allclose(np.asarray(got)[policy], np.asarray(plain)[policy], atol=1e-5)
    assert not np.asarray(got)[env].any()  # values only on the policy's tokens


def host_rows(env_dtype=bool) -> HostBatch:
    """Rows whose last used completion column holds only an environment token."""
    b, p, t = 2, 4, 10
    policy = np.zeros((b, t), bool)
    env = np.zeros((b, t), bool)
    policy[0, :2], env[0, 2:4], policy[0, 4:5] = True, True, True
    policy[1, :1], env[1, 1:6] = True, True  # an episode cut inside an observation
    rng = np.random.default_rng(0)
    rows = dict(
        prompt_tokens=rng.integers(2, 30, (b, p)).astype(np.int32),
        prompt_mask=np.arange(p)[None] >= np.asarray([[1], [2]]),
        completion_tokens=np.where(policy | env, rng.integers(2, 30, (b, t)), 0).astype(np.int32),
        completion_mask=policy,
        rollout_logprobs=np.where(policy, -1.0, 0.0).astype(np.float32),
        rewards=np.asarray([1.0, 0.0], np.float32),
        prompt_id=np.asarray([0, 0]),
        env_mask=env.astype(env_dtype),
    )
    return HostBatch(rows, 2)


@pytest.mark.parametrize("env_dtype", [bool, np.float32])
def test_env_mask_survives_trimming_as_a_bool_extra(env_dtype):
    rows = host_rows(env_dtype)
    env = np.asarray(rows.rows["env_mask"]) > 0
    # Column 5 holds only an environment token; without env_mask it would be dropped.
    np.testing.assert_array_equal(used_widths(rows), [3, 6])
    without = HostBatch({k: v for k, v in rows.rows.items() if k != "env_mask"}, 2)
    np.testing.assert_array_equal(used_widths(without), [3, 5])
    trimmed = trim_padding(rows, 4)  # widths 3 -> 4 and 6 -> 8
    assert trimmed.rows["env_mask"].shape == (2, 8)
    batch = trimmed.to_batch()
    assert batch.extras["env_mask"].dtype == jnp.bool_
    np.testing.assert_array_equal(batch.extras["env_mask"], env[:, :8])
    np.testing.assert_array_equal(batch.completion_mask, rows.rows["completion_mask"][:, :8])
    np.testing.assert_array_equal(context_mask(batch), (env | rows.rows["completion_mask"])[:, :8])
    # Loss weights default to the policy tokens only.
    np.testing.assert_array_equal(batch.loss_weights, rows.rows["completion_mask"][:, :8])
