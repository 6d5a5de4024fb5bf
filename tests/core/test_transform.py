"""Tests for rljax.core.transform: chain state threading, metrics merging, rng splitting."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context, Transform, chain, merge_metrics, stateless


def tiny_batch():
    return make_batch(
        prompt_tokens=np.zeros((2, 1)),
        prompt_mask=np.ones((2, 1)),
        completion_tokens=np.zeros((2, 2)),
        completion_mask=np.ones((2, 2)),
        group_id=np.zeros(2),
        rewards=np.array([1.0, 2.0]),
    )


def ctx(step=0):
    return Context(step=jnp.int32(step), rng=jax.random.PRNGKey(0))


def counter(name: str, scale: float) -> Transform:
    """Stateful toy: counts its calls and multiplies the rewards by `scale`."""

    def apply(batch, count, ctx):
        del ctx
        count = count + 1
        return batch.replace(rewards=batch.rewards * scale), count, {f"{name}/calls": count}

    return Transform(lambda: jnp.int32(0), apply)


def add_one():
    return stateless(
        lambda batch, ctx: (batch.replace(rewards=batch.rewards + 1.0), {"add/x": ctx.step})
    )


def test_stateless():
    t = add_one()
    assert t.init() == ()
    batch, state, metrics = t.apply(tiny_batch(), (), ctx(step=5))
    np.testing.assert_array_equal(batch.rewards, [2.0, 3.0])
    assert state == () and metrics == {"add/x": 5}


def test_chain_threads_state_and_order_under_jit():
    t = chain(counter("a", 2.0), add_one(), counter("b", 3.0))
    state = t.init()
    assert len(state) == 3
    apply = jax.jit(t.apply)
    batch = tiny_batch()
    for step in range(3):
        out, state, metrics = apply(batch, state, ctx(step))
    assert int(state[0]) == 3 and state[1] == () and int(state[2]) == 3
    assert int(metrics["a/calls"]) == 3 and int(metrics["b/calls"]) == 3
    assert set(metrics) == {"a/calls", "add/x", "b/calls"}
    np.testing.assert_allclose(out.rewards, (np.array([1.0, 2.0]) * 2 + 1) * 3)  # order a, add, b


def test_nested_chain_state_is_nested_tuple():
    t = chain(chain(counter("a", 1.0), counter("b", 1.0)), counter("c", 1.0))
    _, state, _ = t.apply(tiny_batch(), t.init(), ctx())
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(((0, 0), 0))


def test_chain_metric_clash_raises():
    t = chain(counter("a", 1.0), counter("a", 1.0))
    with pytest.raises(ValueError, match=r"metric keys \['a/calls'\] of member 1"):
        t.apply(tiny_batch(), t.init(), ctx())


def test_chain_wrong_state_raises():
    t = chain(counter("a", 1.0), counter("b", 1.0))
    with pytest.raises(ValueError, match="got a state of 1 members"):
        t.apply(tiny_batch(), (jnp.int32(0),), ctx())


def test_chain_gives_each_member_its_own_rng():
    def key_reporter(name):
        return stateless(lambda batch, ctx: (batch, {name: ctx.rng}))

    c = ctx()
    _, _, metrics = chain(key_reporter("k0"), key_reporter("k1")).apply(tiny_batch(), ((), ()), c)
    np.testing.assert_array_equal(metrics["k0"], jax.random.fold_in(c.rng, 0))
    np.testing.assert_array_equal(metrics["k1"], jax.random.fold_in(c.rng, 1))
    assert not np.array_equal(metrics["k0"], metrics["k1"])


def test_merge_metrics():
    assert merge_metrics({"a": 1}, {"b": 2}, {}) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match=r"\['b'\]"):
        merge_metrics({"a": 1, "b": 2}, {"b": 3})
