"""Tests for rljax.objectives.gkd: GKD's generalized JSD against numpy transcriptions of the
formula, scipy's Jensen-Shannon distance, finite differences, and the key checks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.spatial.distance import jensenshannon

from rljax.algorithms import Algorithm
from rljax.core import keys
from rljax.core.batch import make_batch
from rljax.core.keys import check_algorithm
from rljax.core.transform import chain, stateless
from rljax.objectives.gkd import generalized_jsd, generalized_jsd_divergence


def log_softmax(z):
    z = np.asarray(z, np.float64)
    return (
        z
        - z.max(-1, keepdims=True)
        - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1))[..., None]
    )


def kl(p, q):
    """KL(p || q) of probability vectors, 0 log 0 = 0."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    keep = p > 0
    return float((p[keep] * np.log(p[keep] / q[keep])).sum())


def reference_jsd(p_student, p_teacher, beta):
    """The generalized JSD written out for two probability vectors (TRL's convention)."""
    if beta == 0:
        return kl(p_teacher, p_student)
    if beta == 1:
        return kl(p_student, p_teacher)
    m = beta * p_teacher + (1 - beta) * p_student
    return beta * kl(p_teacher, m) + (1 - beta) * kl(p_student, m)


RNG = np.random.default_rng(0)
STUDENT_LOGITS = RNG.normal(size=(2, 3, 11))
TEACHER_LOGITS = 2.0 * RNG.normal(size=(2, 3, 11))


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_over_the_whole_vocabulary_it_is_the_full_divergence(beta):
    s, t = log_softmax(STUDENT_LOGITS), log_softmax(TEACHER_LOGITS)
    got = generalized_jsd_divergence(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), beta)
    for b in range(2):
        for i in range(3):
            want = reference_jsd(np.exp(s[b, i]), np.exp(t[b, i]), beta)
            np.testing.assert_allclose(got[b, i], want, rtol=1e-4, atol=1e-6)


def test_at_one_half_it_is_scipys_jensen_shannon_divergence():
    s, t = log_softmax(STUDENT_LOGITS), log_softmax(TEACHER_LOGITS)
    got = generalized_jsd_divergence(jnp.asarray(s, jnp.float32), jnp.asarray(t, jnp.float32), 0.5)
    want = jensenshannon(np.exp(s), np.exp(t), axis=-1) ** 2  # the distance is its square root
    np.testing.assert_allclose(got, want, rtol=1e-4)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_top_k_adds_the_rest_as_one_bucket_and_bounds_the_full_divergence_below(beta):
    s, t = log_softmax(STUDENT_LOGITS), log_softmax(TEACHER_LOGITS)
    ids = np.argsort(-t, axis=-1)[..., :4]  # the teacher's top 4
    s_k, t_k = np.take_along_axis(s, ids, -1), np.take_along_axis(t, ids, -1)
    got = generalized_jsd_divergence(
        jnp.asarray(s_k, jnp.float32), jnp.asarray(t_k, jnp.float32), beta
    )
    for b in range(2):
        for i in range(3):
            ps, pt = np.exp(s_k[b, i]), np.exp(t_k[b, i])
            ps, pt = np.append(ps, 1 - ps.sum()), np.append(pt, 1 - pt.sum())
            np.testing.assert_allclose(got[b, i], reference_jsd(ps, pt, beta), rtol=1e-4, atol=1e-6)
            full = reference_jsd(np.exp(s[b, i]), np.exp(t[b, i]), beta)
            assert got[b, i] <= full + 1e-6


def test_zero_against_itself_and_its_gradient_matches_finite_differences():
    t = jnp.asarray(log_softmax(TEACHER_LOGITS)[..., :5], jnp.float32)  # 5 tokens of 11
    z = jnp.asarray(STUDENT_LOGITS, jnp.float32)

    @jax.jit
    def divergences(logits):
        student = jax.nn.log_softmax(logits)[..., :5]
        return jnp.stack([generalized_jsd_divergence(student, t, b).sum() for b in (0, 0.5, 1)])

    np.testing.assert_allclose(generalized_jsd_divergence(t, t, 0.5), 0.0, atol=1e-6)
    grads = jax.jit(jax.jacrev(divergences))(z)  # [3 betas, 2, 3, 11]
    eps = 1e-2
    for index in [(0, 0, 0), (0, 1, 4), (1, 2, 7), (1, 0, 10)]:
        step = np.zeros(z.shape, np.float32)
        step[index] = eps
        numeric = (divergences(z + step) - divergences(z - step)) / (2 * eps)
        np.testing.assert_allclose(grads[(slice(None), *index)], numeric, rtol=2e-2, atol=2e-4)


def make(mask, weights=None):
    t = log_softmax(TEACHER_LOGITS)[..., :4]
    s = log_softmax(STUDENT_LOGITS)[..., :4]
    mask = np.asarray(mask, bool)
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0]),
        rewards=np.zeros(2),
        loss_weights=mask if weights is None else weights,
        extras={
            "teacher_topk_ids": np.zeros((2, 3, 4), np.int32),
            "teacher_topk_logprobs": np.asarray(t, np.float32),
            "policy_topk_logprobs": np.asarray(s, np.float32),
        },
    )


def test_the_objective_aggregates_the_divergence_with_the_loss_weights():
    mask = np.array([[1, 1, 1], [1, 0, 0]])
    batch = make(mask)
    per_token = np.asarray(
        generalized_jsd_divergence(
            batch.extras["policy_topk_logprobs"], batch.extras["teacher_topk_logprobs"], 0.3
        )
    )
    zeros = jnp.zeros((2, 3))
    loss, metrics = generalized_jsd(0.3, coef=2.0)(zeros, zeros, batch)
    token_mean = per_token[mask > 0].mean()
    np.testing.assert_allclose(loss, 2.0 * token_mean, rtol=1e-5)
    np.testing.assert_allclose(metrics["gkd/jsd"], token_mean, rtol=1e-5)
    mass = np.exp(log_softmax(TEACHER_LOGITS)[..., :4]).sum(-1)[mask > 0].mean()
    np.testing.assert_allclose(metrics["gkd/teacher_mass"], mass, rtol=1e-5)
    loss, _ = generalized_jsd(0.3, aggregation="seq-mean-token-sum")(zeros, zeros, batch)
    sums = (per_token * mask).sum(1)
    np.testing.assert_allclose(loss, sums.mean(), rtol=1e-5)


def test_bad_settings_and_a_transform_reading_the_updates_key_are_refused():
    with pytest.raises(ValueError, match="beta=1.5 must be in"):
        generalized_jsd(1.5)
    with pytest.raises(ValueError, match="coef=0.0 must be > 0"):
        generalized_jsd(0.5, coef=0.0)
    reader = stateless(lambda b, c: (b, {}), {keys.POLICY_TOPK_LOGPROBS}, set())
    with pytest.raises(ValueError, match="only an objective term can read it"):
        check_algorithm(Algorithm(chain(reader), generalized_jsd()))
    check_algorithm(Algorithm(chain(), generalized_jsd()))  # an objective may
