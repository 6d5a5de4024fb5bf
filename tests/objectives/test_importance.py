"""Every policy-gradient objective applies the rollout importance weight `extras["is_weight"]`.

Property: a per-token loss depends only on its own row, so a weight constant along each row
scales that row's gradient by the weight; for token-level objectives (each token's loss
depends on its own log-prob only) any per-token weight scales each token's gradient.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.cispo import cispo
from rljax.objectives.gpg import gpg
from rljax.objectives.gspo import gspo
from rljax.objectives.importance import apply_is_weight
from rljax.objectives.mu_grpo import mu_grpo
from rljax.objectives.power_distillation import weighted_sft
from rljax.objectives.segment_po import segment_po
from rljax.objectives.surrogate import ppo_clip

B, T = 4, 6
RNG = np.random.default_rng(0)
OLD = RNG.normal(-1.5, 0.5, (B, T)).astype(np.float32)
NEW = OLD + RNG.normal(0.0, 0.3, (B, T)).astype(np.float32)
ADV = RNG.normal(0.0, 1.0, (B, T)).astype(np.float32)
MASK = np.ones((B, T), bool)
MASK[1, 4:] = False
TOKENS = RNG.integers(0, 5, (B, T))

TOKEN_LEVEL = {
    "ppo_clip": ppo_clip(0.2, 0.2),
    "cispo": cispo(eps_high=0.2, eps_low=0.2),
    "gpg": gpg(),
    "mu_grpo": mu_grpo(),
    "weighted_sft": weighted_sft(),
}
ROW_LEVEL = {"gspo": gspo(eps_low=0.2, eps_high=0.2), "segment_po": segment_po(delimiter_ids=(3,))}


def batch(is_weight=None):
    extras = {} if is_weight is None else {"is_weight": jnp.asarray(is_weight, jnp.float32)}
    return make_batch(
        prompt_tokens=np.zeros((B, 1)),
        prompt_mask=np.ones((B, 1)),
        completion_tokens=TOKENS,
        completion_mask=MASK,
        group_id=np.array([0, 0, 1, 1]),
        rewards=np.zeros(B),
        old_logprobs=OLD,
        advantages=ADV * MASK,
        extras=extras,
    )


def grad(objective, b):
    loss = lambda new: objective(new, jnp.zeros((B, T)), b)[0]  # noqa: E731
    return np.asarray(jax.grad(loss)(jnp.asarray(NEW)))


@pytest.mark.parametrize("name", sorted({**TOKEN_LEVEL, **ROW_LEVEL}))
def test_row_weights_scale_each_rows_gradient(name):
    objective = {**TOKEN_LEVEL, **ROW_LEVEL}[name]
    rows = np.array([0.5, 2.0, 0.0, 1.3], np.float32)
    weighted = grad(objective, batch(np.repeat(rows[:, None], T, axis=1)))
    plain = grad(objective, batch())
    assert np.abs(plain).max() > 1e-3  # the property is not checked on a zero gradient
    np.testing.assert_allclose(weighted, rows[:, None] * plain, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", sorted(TOKEN_LEVEL))
def test_token_weights_scale_each_tokens_gradient(name):
    weights = RNG.uniform(0.0, 2.0, (B, T)).astype(np.float32)
    weighted = grad(TOKEN_LEVEL[name], batch(weights))
    plain = grad(TOKEN_LEVEL[name], batch())
    np.testing.assert_allclose(weighted, weights * plain, rtol=1e-5, atol=1e-7)


def test_weight_of_the_wrong_shape_is_named():
    with pytest.raises(ValueError, match=r'is_weight"\] has shape \(4, 5\)'):
        apply_is_weight(jnp.zeros((B, T)), batch(np.ones((B, T - 1))))
