"""Tests for rljax.algorithms.grpo: the chain and objective compose as documented."""

import jax
import jax.numpy as jnp
import numpy as np

from rljax.advantages.group import grpo_advantages
from rljax.algorithms import PPOSettings, grpo
from rljax.core.batch import make_batch
from rljax.core.transform import Context

MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
REWARDS = np.array([1.0, 0.0, 0.0, 0.0], np.float32)
OLD = np.full((4, 3), -1.0, np.float32)
REF = np.full((4, 3), -1.2, np.float32)
NEW = OLD + np.array(
    [[0.5, -0.1, 0.0], [0.3, 0.0, 0.0], [-0.5, 0.1, 0.2], [0.0, 0.05, 0.0]], np.float32
)
ENT = np.array([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.5, 0.5, 0.0]], np.float32)


def run(algo):
    batch = make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 3)),
        completion_mask=MASK,
        group_id=np.arange(4) // 2,
        rewards=REWARDS,
        old_logprobs=OLD,
        ref_logprobs=REF,
    )
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))

    @jax.jit
    def step(batch, state):
        batch, state, metrics = algo.transform.apply(batch, state, ctx)
        loss, loss_metrics = algo.objective(jnp.array(NEW), jnp.array(ENT), batch)
        return batch, loss, {**metrics, **loss_metrics}

    return step(batch, algo.transform.init())


def test_plain_grpo_has_only_the_surrogate():
    _, loss, metrics = run(grpo(group_size=2))
    np.testing.assert_allclose(loss, metrics["pg/loss"])
    assert not any(k.startswith(("kl/", "entropy/")) for k in metrics)
    assert "advantages/mean" in metrics


def test_grpo_with_kl_and_entropy_adds_terms():
    batch, loss, metrics = run(
        grpo(group_size=2, ppo=PPOSettings(kl_coef=0.1, entropy_coef=0.01, clip_eps_high=0.3))
    )
    seq_adv = np.asarray(grpo_advantages(jnp.array(REWARDS), 2))
    np.testing.assert_allclose(batch.advantages, seq_adv[:, None] * MASK, rtol=1e-6)
    x = NEW - REF
    kl = np.exp(-x) - 1 + x
    np.testing.assert_allclose(metrics["kl/loss"], 0.1 * kl[MASK].mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy/loss"], -0.01 * ENT[MASK].mean(), rtol=1e-5)
    np.testing.assert_allclose(
        loss, metrics["pg/loss"] + metrics["kl/loss"] + metrics["entropy/loss"], rtol=1e-6
    )


def test_dr_grpo_configuration():
    batch, loss, _ = run(
        grpo(
            group_size=2,
            normalize_std=False,
            ppo=PPOSettings(aggregation="seq-mean-token-sum-norm", max_len=8),
        )
    )
    np.testing.assert_allclose(batch.advantages[:2, 0], [0.5, -0.5])
    r = np.exp(NEW - OLD)
    adv = np.asarray(batch.advantages)
    per_token = np.maximum(-adv * r, -adv * np.clip(r, 0.8, 1.2))
    np.testing.assert_allclose(loss, (per_token * MASK).sum() / (4 * 8), rtol=1e-5)
