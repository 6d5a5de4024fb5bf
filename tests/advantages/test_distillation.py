"""Tests for rljax.advantages.distillation: the on-policy distillation advantage against a
hand-computed case, its mixing with task advantages, and its gradient direction on a
categorical policy (a policy gradient on it lowers the reverse KL to the teacher)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.distillation import teacher_advantages
from rljax.advantages.group import group_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context, chain

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], bool)
OLD = np.log(np.array([[0.5, 0.2, 0.3], [0.1, 0.9, 0.4], [0.25, 0.6, 0.6], [0.7, 0.7, 0.1]]))
TEACHER = np.log(np.array([[0.9, 0.1, 0.3], [0.1, 0.3, 0.8], [0.5, 0.1, 0.9], [0.7, 0.35, 0.2]]))


def make(rewards=(1.0, 0.0, 1.0, 1.0)):
    return make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 3)),
        completion_mask=MASK,
        group_id=np.array([0, 0, 1, 1]),
        rewards=np.asarray(rewards, np.float32),
        old_logprobs=OLD.astype(np.float32),
        extras={"teacher_logprobs": TEACHER.astype(np.float32)},
    )


def apply(transform, batch):
    out, _, metrics = transform.apply(batch, transform.init(), CTX)
    return out, metrics


def test_advantage_is_the_teacher_minus_student_log_prob():
    out, metrics = apply(teacher_advantages(), make())
    # Hand: row 0 token 0: log 0.9 - log 0.5 = 0.588; token 1: log 0.1 - log 0.2 = -0.693.
    np.testing.assert_allclose(out.advantages[0, :2], [np.log(1.8), np.log(0.5)], rtol=1e-6)
    np.testing.assert_allclose(out.advantages, np.where(MASK, TEACHER - OLD, 0), rtol=1e-5)
    np.testing.assert_allclose(
        metrics["distill/reverse_kl"], (OLD - TEACHER)[MASK].mean(), rtol=1e-5
    )


def test_task_advantages_mix_in():
    task = group_advantages(2)
    out, _ = apply(chain(task, teacher_advantages(0.5, 2.0)), make())
    grpo = np.asarray(apply(task, make())[0].advantages)
    expected = np.where(MASK, 2.0 * grpo + 0.5 * (TEACHER - OLD), 0.0)
    np.testing.assert_allclose(out.advantages, expected, rtol=1e-5, atol=1e-6)


def test_the_policy_gradient_on_it_lowers_the_reverse_kl():
    # A categorical student over 5 tokens and a peaked teacher: the expected REINFORCE
    # direction E_y~pi[(log pi_T(y) - log pi(y)) grad log pi(y)] is minus the gradient of
    # KL(pi || pi_T) (the score function's mean is 0), so a step along it lowers the KL.
    logits = jnp.array([0.3, -0.2, 0.5, 0.0, 0.1])
    teacher = jax.nn.log_softmax(jnp.array([3.0, 0.0, -1.0, 0.5, 0.0]))

    def reverse_kl(z):
        logp = jax.nn.log_softmax(z)
        return jnp.sum(jnp.exp(logp) * (logp - teacher))

    def pg_direction(z):
        logp = jax.nn.log_softmax(z)
        adv = jax.lax.stop_gradient(teacher - logp)
        probs = jax.lax.stop_gradient(jnp.exp(logp))
        return jnp.sum(probs * adv * logp)  # E_y[A(y) log pi(y)], exact expectation

    direction = jax.grad(pg_direction)(logits)
    np.testing.assert_allclose(direction, -jax.grad(reverse_kl)(logits), rtol=1e-5, atol=1e-7)
    assert reverse_kl(logits + 0.1 * direction) < reverse_kl(logits)


def test_errors():
    with pytest.raises(ValueError, match="not both 0"):
        teacher_advantages(0.0, 0.0)
    with pytest.raises(ValueError, match="teacher_coef=-1"):
        teacher_advantages(-1.0)


def test_center_subtracts_the_batch_token_mean_of_the_teacher_term():
    out, metrics = apply(teacher_advantages(center=True), make())
    gap = (TEACHER - OLD)[MASK]
    np.testing.assert_allclose(np.asarray(out.advantages)[MASK], gap - gap.mean(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(out.advantages)[~MASK], 0.0)
    # The reverse-KL metric is of the raw gap, centred or not.
    np.testing.assert_allclose(metrics["distill/reverse_kl"], -gap.mean(), rtol=1e-5)
