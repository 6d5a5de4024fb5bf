"""Tests for rljax.core.batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import (
    Batch,
    check_groups,
    check_sequence_rewards,
    equal_reward_fraction,
    make_batch,
)


def tiny_inputs(b=4, p=2, t=3):
    return dict(
        prompt_tokens=np.ones((b, p), np.int32),
        prompt_mask=np.ones((b, p), bool),
        completion_tokens=np.arange(b * t).reshape(b, t),
        completion_mask=np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], bool)[:b, :t],
        group_id=np.arange(b) // 2,
        rewards=np.arange(b, dtype=np.float32),
    )


def test_defaults_and_dtypes():
    inputs = tiny_inputs()
    batch = make_batch(**inputs)
    for name in ("rollout_logprobs", "old_logprobs", "ref_logprobs", "advantages"):
        np.testing.assert_array_equal(getattr(batch, name), np.zeros((4, 3)))
        assert getattr(batch, name).dtype == jnp.float32
    np.testing.assert_array_equal(batch.loss_weights, inputs["completion_mask"].astype(np.float32))
    assert batch.completion_tokens.dtype == jnp.int32
    assert batch.group_id.dtype == jnp.int32
    assert batch.completion_mask.dtype == jnp.bool_
    assert batch.extras == {}


def test_given_fields_are_kept():
    old = np.full((4, 3), -1.5, np.float32)
    batch = make_batch(**tiny_inputs(), old_logprobs=old, extras={"age": np.arange(4)})
    np.testing.assert_array_equal(batch.old_logprobs, old)
    np.testing.assert_array_equal(batch.extras["age"], np.arange(4))


def test_multi_dim_rewards():
    inputs = tiny_inputs()
    inputs["rewards"] = np.zeros((4, 2))
    assert make_batch(**inputs).rewards.shape == (4, 2)


@pytest.mark.parametrize(
    "field, bad, pattern",
    [
        (
            "completion_mask",
            np.ones((4, 2), bool),
            r"completion_mask has shape \(4, 2\), expected \[B, T\]",
        ),
        (
            "prompt_mask",
            np.ones((3, 2), bool),
            r"prompt_mask has shape \(3, 2\), expected \[B, P\]",
        ),
        ("group_id", np.zeros((4, 1)), r"group_id has shape \(4, 1\), expected \[B\]"),
        ("rewards", np.zeros((5,)), r"rewards has shape \(5,\), expected \[B\] or \[B, K\]"),
        ("completion_tokens", np.ones((3, 3)), "completion_tokens has batch 3"),
    ],
)
def test_shape_errors(field, bad, pattern):
    inputs = tiny_inputs()
    inputs[field] = bad
    with pytest.raises(ValueError, match=pattern):
        make_batch(**inputs)


def test_token_field_and_extras_errors():
    with pytest.raises(ValueError, match="old_logprobs has shape"):
        make_batch(**tiny_inputs(), old_logprobs=np.zeros((4, 4)))
    with pytest.raises(ValueError, match=r"extras\['age'\]"):
        make_batch(**tiny_inputs(), extras={"age": np.arange(3)})


def test_is_a_pytree_under_jit():
    batch = make_batch(**tiny_inputs(), extras={"age": np.arange(4)})

    @jax.jit
    def f(batch: Batch) -> Batch:
        return batch.replace(advantages=batch.loss_weights * 2.0)

    out = f(batch)
    assert isinstance(out, Batch)
    np.testing.assert_array_equal(out.advantages, 2.0 * np.asarray(batch.loss_weights))
    assert len(jax.tree_util.tree_leaves(batch)) == 12


def test_make_batch_under_jit():
    out = jax.jit(lambda kw: make_batch(**kw))(tiny_inputs())
    assert out.loss_weights.shape == (4, 3)


def test_check_groups():
    check_groups(jnp.array([0, 0, 1, 1, 0, 0]), 2)  # a prompt may recur, not in adjacent groups
    check_groups(jnp.array([7, 7, 7, 3, 3, 3]), 3)
    with pytest.raises(ValueError, match="group_size=4 does not divide batch 6"):
        check_groups(jnp.arange(6), 4)
    with pytest.raises(ValueError, match="must be a positive int"):
        check_groups(jnp.arange(6), 0)
    with pytest.raises(ValueError, match=r"group 1 \(samples 2..3\) mixes group ids \[1, 2\]"):
        check_groups(jnp.array([0, 0, 1, 2, 2, 2]), 2)
    with pytest.raises(ValueError, match="groups 0 and 1 share group id 0"):
        check_groups(jnp.array([0, 0, 0, 0, 1, 1]), 2)


def test_check_groups_under_jit_checks_shape_only():
    jax.jit(lambda g: check_groups(g, 2))(jnp.array([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="does not divide"):
        jax.jit(lambda g: check_groups(g, 3))(jnp.arange(4))


def test_check_sequence_rewards_names_the_transform():
    check_sequence_rewards(jnp.zeros(4), "x")
    with pytest.raises(ValueError, match=r"my_transform needs \[B\] rewards, got \(4, 2\)"):
        check_sequence_rewards(jnp.zeros((4, 2)), "my_transform")


def test_equal_reward_fraction_counts_constant_groups():
    rewards = jnp.asarray([1.0, 1.0, 0.0, 1.0, 0.5, 0.5])  # groups of 2: equal, mixed, equal
    np.testing.assert_allclose(equal_reward_fraction(rewards, 2), 2 / 3)
    np.testing.assert_allclose(equal_reward_fraction(rewards, 3), 0.0)
