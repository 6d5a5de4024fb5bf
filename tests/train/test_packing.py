"""Sequence packing: the packed forward pass gives the unpacked states, gradients and all."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, positions_from_mask
from rljax.train.logprobs import completion_logprobs
from rljax.train.packing import pack_plan, packed_hidden_states

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
# Four rows of prompt length 4 + completion length 6 (S = 10) with 3, 9, 2 and 5 real tokens.
PROMPT_LEN = np.array([2, 4, 1, 3])
COMPLETION_LEN = np.array([1, 5, 1, 2])


def batch():
    rng = np.random.default_rng(0)
    prompt_mask = np.arange(4)[None, :] >= 4 - PROMPT_LEN[:, None]
    completion_mask = np.arange(6)[None, :] < COMPLETION_LEN[:, None]
    prompt = np.where(prompt_mask, rng.integers(2, 30, (4, 4)), 0)
    completion = np.where(completion_mask, rng.integers(2, 30, (4, 6)), 0)
    return [jnp.asarray(x) for x in (prompt, prompt_mask, completion, completion_mask)]


def test_first_fit_plan_by_hand():
    mask = jnp.concatenate(batch()[1::2], axis=1)
    plan = pack_plan(mask, rows=2)
    # Lengths 3, 9, 2, 5 in rows of 10: 3 -> row 0, 9 -> row 1, 2 -> row 0 (after the 3),
    # 5 -> row 0 (3 + 2 + 5 = 10): two rows are enough.
    np.testing.assert_array_equal(plan.row, [0, 1, 0, 0])
    starts = 4 - PROMPT_LEN
    np.testing.assert_array_equal(plan.offset + starts, [0, 0, 3, 5])
    assert bool(plan.fits)
    assert not bool(pack_plan(mask, rows=1).fits)


@pytest.mark.parametrize("rows", [2, 1])  # 2: packed; 1: does not fit, the unpacked pass
def test_packed_states_logprobs_and_gradients_equal_the_unpacked_ones(rows):
    graphdef, params = create_model(CONFIG, seed=0)
    prompt, prompt_mask, completion, completion_mask = batch()
    tokens = jnp.concatenate([prompt, completion], 1)
    mask = jnp.concatenate([prompt_mask, completion_mask], 1)
    model = nnx.merge(graphdef, params)
    want, _ = model.hidden_states(tokens, positions_from_mask(mask), mask)
    got = jax.jit(lambda t, p, m: packed_hidden_states(model, t, p, m, rows))(
        tokens, positions_from_mask(mask), mask
    )
    valid = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid], atol=1e-5)

    if rows == 1:  # the unpacked pass: nothing more to compare
        return

    def loss(p, pack):
        lp = completion_logprobs(graphdef, p, *batch(), pack_rows=pack)[0]
        return lp.sum(), lp

    (value, lp), grads = jax.value_and_grad(loss, has_aux=True)(params, 0)
    (value_p, lp_p), grads_p = jax.value_and_grad(loss, has_aux=True)(params, rows)
    np.testing.assert_allclose(lp_p, lp, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads_p, grads)
