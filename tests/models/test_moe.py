"""Mixture-of-experts MLP: numpy reference, tie-breaking, routing replay through sampler and
trainer pass, router gradients, dense models unchanged, expert load, expert-parallel mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from rljax.models.config import TransformerConfig
from rljax.models.moe import MoEMLP, expert_load, route
from rljax.models.transformer import (
    abstract_model,
    forward,
    positions_from_mask,
    stack_layers,
    unstack_layers,
)
from rljax.parallel.mesh import make_mesh
from rljax.parallel.rules import param_shardings
from rljax.rollout.sampler import generate
from rljax.train.logprobs import completion_logprobs

DENSE = TransformerConfig(vocab_size=30, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=24)
MOE = DENSE.replace(num_experts=4, experts_per_token=2, expert_d_ff=8)
K = MOE.experts_per_token
# One compilation per graphdef and input structure instead of op-by-op dispatch.
fwd = jax.jit(forward, static_argnums=0, static_argnames="return_routes")
logprobs_fn = jax.jit(completion_logprobs, static_argnums=0)
block_fn = nnx.jit(lambda block, x: block(x))


def random_values(tree, seed, std):
    """Normal(0, std) values (ones for norm scales) for a nested dict of shapes, from numpy:
    eager `jax.random` would compile a kernel per parameter shape."""
    rng = np.random.default_rng(seed)

    def fill(node, path=""):
        if isinstance(node, dict):
            return {key: fill(value, f"{path}/{key}") for key, value in node.items()}
        if "norm" in path:
            return jnp.ones(node.shape, node.dtype)
        return jnp.asarray(std * rng.normal(size=node.shape), node.dtype)

    return fill(tree)


def init_model(config, seed=0, std=0.3):
    """(graphdef, params) like `create_model`, with numpy-drawn values."""
    graphdef, params = abstract_model(config)
    pure = nnx.to_pure_dict(params)
    nnx.replace_by_pure_dict(params, random_values(pure, seed, std))
    return graphdef, params


def init_block(config, seed=0):
    """An MoEMLP with numpy-drawn weights."""
    block = nnx.eval_shape(lambda: MoEMLP(config, rngs=nnx.Rngs(params=0)))
    graphdef, state = nnx.split(block)
    nnx.replace_by_pure_dict(state, random_values(nnx.to_pure_dict(state), seed, 0.3))
    return nnx.merge(graphdef, state)


def silu(x):
    return x / (1 + np.exp(-x))


def numpy_moe(x, router, gate, up, down, k, norm):
    """Per token: softmax router probs, top-k (stable: lower index first), weighted SwiGLUs."""
    x = np.asarray(x, np.float64)
    logits = x @ np.asarray(router, np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    routes = np.zeros(x.shape[:-1] + (k,), np.int64)
    for idx in np.ndindex(*x.shape[:-1]):
        chosen = np.argsort(-probs[idx], kind="stable")[:k]
        weights = probs[idx][chosen]
        if norm:
            weights = weights / weights.sum()
        routes[idx] = chosen
        for w, e in zip(weights, chosen):
            h = silu(x[idx] @ gate[e]) * (x[idx] @ up[e])
            out[idx] += w * (h @ down[e])
    return out, routes


@pytest.mark.parametrize("norm", [True, False])
def test_moe_block_matches_numpy_reference(norm):
    config = MOE.replace(norm_topk_prob=norm)
    block = init_block(config)
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, config.d_model)), jnp.float32)
    out, routes = block_fn(block, x)
    want, want_routes = numpy_moe(
        x,
        block.router[...],
        block.gate_proj[...],
        block.up_proj[...],
        block.down_proj[...],
        K,
        norm,
    )
    np.testing.assert_array_equal(routes, want_routes)
    assert routes.dtype == jnp.int32
    np.testing.assert_allclose(out, want, atol=1e-6, rtol=1e-4)


def test_ties_go_to_the_lowest_expert_index():
    logits = jnp.array([[1.0, 3.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    weights, routes = route(logits, 2, norm_topk_prob=True)
    np.testing.assert_array_equal(routes, [[1, 2], [0, 1]])
    np.testing.assert_allclose(weights, 0.5)
    block = init_block(MOE)
    block.router[...] = jnp.zeros_like(block.router[...])  # every expert equally likely
    x = jnp.asarray(np.random.default_rng(2).normal(size=(2, 3, MOE.d_model)), jnp.float32)
    for _ in range(2):
        _, routes = block_fn(block, x)
        np.testing.assert_array_equal(routes, np.broadcast_to([0, 1], (2, 3, 2)))


def test_replayed_routes_take_the_current_probabilities():
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    weights, routes = route(logits, 2, norm_topk_prob=True, routes=jnp.array([0, 1]))
    np.testing.assert_array_equal(routes, [0, 1])
    np.testing.assert_allclose(weights, [1 / 3, 2 / 3], rtol=1e-6)
    weights, _ = route(logits, 2, norm_topk_prob=False, routes=jnp.array([0, 1]))
    np.testing.assert_allclose(weights, [0.1, 0.2], rtol=1e-6)
    weights, routes = route(logits, 2, norm_topk_prob=False)
    np.testing.assert_array_equal(routes, [3, 2])
    np.testing.assert_allclose(weights, [0.4, 0.3], rtol=1e-6)


def with_routers(params, fn):
    """A copy of `params` with every layer's router replaced by fn(layer index, router)."""
    pure = unstack_layers(nnx.to_pure_dict(params))
    for i, layer in pure["layers"].items():
        layer["mlp"]["router"] = fn(int(i), layer["mlp"]["router"])
    _, template = abstract_model(MOE)  # shapes only: no random initialisation
    nnx.replace_by_pure_dict(template, stack_layers(pure))
    return template


@pytest.fixture(scope="module")
def rollout_and_model():
    graphdef, params = init_model(MOE)  # std 0.3: routing depends clearly on the input
    rng = np.random.default_rng(0)
    tokens = np.zeros((3, 5), np.int32)
    mask = np.zeros((3, 5), bool)
    for i, n in enumerate([5, 3, 2]):  # left-padded prompts
        tokens[i, 5 - n :] = rng.integers(2, MOE.vocab_size, n)
        mask[i, 5 - n :] = True
    rollout = generate(
        graphdef,
        params,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.key(0),
        max_new_tokens=6,
        eos_id=1,
        pad_id=0,
        n_samples=2,
    )
    return graphdef, params, rollout


def full_inputs(rollout):
    tokens = jnp.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1)
    mask = jnp.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1)
    return tokens, positions_from_mask(mask), mask


def test_replayed_trainer_logprobs_equal_the_samplers(rollout_and_model):
    graphdef, params, rollout = rollout_and_model
    n, p = rollout.prompt_tokens.shape
    t = rollout.completion_tokens.shape[1]
    assert rollout.routes.shape == (n, p + t, MOE.n_layers, K)
    assert rollout.routes.dtype == jnp.int32
    tokens, positions, mask = full_inputs(rollout)
    m = np.asarray(mask)
    assert (~m).any()  # the prompts are padded: padding holds experts 0 .. k-1
    pad = np.asarray(rollout.routes)[~m]
    np.testing.assert_array_equal(pad, np.broadcast_to([0, 1], pad.shape))
    lp, _ = logprobs_fn(
        graphdef,
        params,
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        routes=rollout.routes,
    )
    np.testing.assert_allclose(lp, rollout.policy_logprobs, atol=1e-5)
    # Unchanged weights: the free forward makes the rollout's choices, so logits are identical.
    free, _, free_routes = fwd(graphdef, params, tokens, positions, mask, return_routes=True)
    replay, _, used = fwd(
        graphdef, params, tokens, positions, mask, routes=rollout.routes, return_routes=True
    )
    np.testing.assert_array_equal(np.asarray(free_routes)[m], np.asarray(rollout.routes)[m])
    np.testing.assert_array_equal(used, rollout.routes)
    # Same experts and weights; only XLA's fusion of the two programs may differ (rounding).
    np.testing.assert_allclose(np.asarray(replay)[m], np.asarray(free)[m], atol=1e-6, rtol=0)


def test_replay_keeps_the_rollout_experts_after_the_router_changes(rollout_and_model):
    graphdef, params, rollout = rollout_and_model
    tokens, positions, mask = full_inputs(rollout)
    m = np.asarray(mask)
    for scale in (0.02, 0.05, 0.1, 0.2, 0.5):  # the smallest perturbation that moves some top-k

        def noise(i, r, scale=scale):
            return r + scale * np.random.default_rng(10 + i).normal(size=r.shape)

        changed = with_routers(params, noise)
        _, _, free_routes = fwd(graphdef, changed, tokens, positions, mask, return_routes=True)
        moved = np.any(np.asarray(free_routes)[m] != np.asarray(rollout.routes)[m], axis=(-1, -2))
        if 0 < moved.sum() < m.sum():
            break
    assert 0 < moved.sum() < m.sum()  # some (not all) real tokens would pick other experts
    _, _, used = fwd(
        graphdef, changed, tokens, positions, mask, routes=rollout.routes, return_routes=True
    )
    np.testing.assert_array_equal(used, rollout.routes)

    # The router still gets a gradient under replay (the weights are its current probabilities):
    # nonzero, and equal to a central finite difference along a random router direction.
    def total_logprob(p):
        lp, _ = logprobs_fn(
            graphdef,
            p,
            rollout.prompt_tokens,
            rollout.prompt_mask,
            rollout.completion_tokens,
            rollout.completion_mask,
            routes=rollout.routes,
        )
        return lp.sum()

    grads = unstack_layers(nnx.to_pure_dict(jax.jit(jax.grad(total_logprob))(changed)))
    directions = [np.random.default_rng(20 + i).normal(size=(16, 4)) for i in range(2)]
    slope = 0.0
    for i, layer in grads["layers"].items():
        assert np.abs(layer["mlp"]["router"]).max() > 1e-3
        slope += float(np.sum(np.asarray(layer["mlp"]["router"]) * directions[int(i)]))
    eps = 1e-2
    up = with_routers(changed, lambda i, r: r + eps * directions[i])
    down = with_routers(changed, lambda i, r: r - eps * directions[i])
    finite = (float(total_logprob(up)) - float(total_logprob(down))) / (2 * eps)
    np.testing.assert_allclose(slope, finite, rtol=2e-2)


def test_one_expert_moe_equals_the_dense_model_and_dense_paths_are_unchanged():
    dense_config = DENSE.replace(n_layers=1)
    graphdef, params = init_model(dense_config)
    tokens = jnp.asarray(np.random.default_rng(3).integers(0, DENSE.vocab_size, (2, 7)))
    mask = jnp.ones((2, 7), bool).at[0, :2].set(False)
    positions = positions_from_mask(mask)
    dense, _ = fwd(graphdef, params, tokens, positions, mask)
    # A 1-expert top-1 MoE with the dense MLP's weights is the dense model (weight 1).
    one = dense_config.replace(num_experts=1, experts_per_token=1)
    pure = unstack_layers(nnx.to_pure_dict(params))
    for layer in pure["layers"].values():
        mlp = layer["mlp"]
        layer["mlp"] = {name: mlp[name][None] for name in ("gate_proj", "up_proj", "down_proj")}
        layer["mlp"]["router"] = jnp.zeros((DENSE.d_model, 1))
    graphdef_one, template = abstract_model(one)
    nnx.replace_by_pure_dict(template, stack_layers(pure))
    moe_logits, _ = fwd(graphdef_one, template, tokens, positions, mask)
    np.testing.assert_allclose(moe_logits, dense, atol=1e-6, rtol=1e-6)
    # The dense model has no router, reports no routes and refuses routes.
    assert "router" not in pure["layers"][0] and "router" not in nnx.to_pure_dict(params)
    shapes = jax.eval_shape(
        lambda p: forward(graphdef, p, tokens, positions, mask, return_routes=True), params
    )
    assert shapes[2] is None  # (dense rollouts: tests/rollout/test_sampler.py)
    with pytest.raises(ValueError, match="dense"):
        fwd(graphdef, params, tokens, positions, mask, routes=jnp.zeros((2, 7, 1, 2), int))


def test_expert_load_matches_a_hand_count():
    # 1 row, 3 tokens (the last is padding), 2 layers, k = 2, 4 experts.
    routes = jnp.array([[[[0, 1], [3, 2]], [[0, 2], [3, 1]], [[1, 3], [0, 2]]]])
    mask = jnp.array([[True, True, False]])
    metrics = expert_load(routes, mask, 4)
    want = np.array([[2, 1, 1, 0], [0, 1, 1, 2]]) / 4  # counts over 2 tokens x 2 slots
    np.testing.assert_allclose(metrics["moe/load"], want)
    np.testing.assert_allclose(metrics["moe/load_max"], 2.0)
    np.testing.assert_allclose(metrics["moe/load_min"], 0.0)
    cv = np.std(want[0]) / 0.25  # both layers have the same spread
    np.testing.assert_allclose(metrics["moe/load_cv"], cv, rtol=1e-6)
    empty = expert_load(routes, jnp.zeros_like(mask), 4)
    assert float(empty["moe/load_max"]) == 0.0 and float(empty["moe/load_cv"]) == 0.0


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(num_experts=-1), "num_experts"),
        (dict(num_experts=4, experts_per_token=5), "experts_per_token"),
        (dict(num_experts=4, experts_per_token=0), "experts_per_token"),
        (dict(num_experts=4, expert_d_ff=0), "expert_d_ff"),
    ],
)
def test_config_errors_name_the_field(changes, match):
    with pytest.raises(ValueError, match=match):
        DENSE.replace(**changes)


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")
def test_expert_parallel_mesh_shards_experts_and_matches_single_device(rollout_and_model):
    graphdef, params, rollout = rollout_and_model
    mesh = make_mesh(1, 2, 2, expert=2)
    assert dict(mesh.shape) == {"data": 1, "fsdp": 2, "tensor": 2, "expert": 2}
    shardings = param_shardings(params, mesh)
    gate = shardings["layers"]["mlp"]["gate_proj"]  # [layers, experts, d_model, d_ff]
    assert gate.spec == PartitionSpec(None, "expert", "fsdp", "tensor")
    assert shardings["layers"]["mlp"]["router"].spec == PartitionSpec(None, "fsdp", None)
    sharded_params = jax.device_put(params, shardings)
    (gate_value,) = jax.tree.leaves(sharded_params["layers"]["mlp"]["gate_proj"])
    # 2 layers, 4 experts / expert 2, d_model 16 / fsdp 2, expert_d_ff 8 / tensor 2.
    assert gate_value.addressable_shards[0].data.shape == (MOE.n_layers, 2, 8, 4)
    tokens, positions, mask = full_inputs(rollout)
    rows = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    sharded_fwd = jax.jit(
        lambda p, t, pos, m: forward(graphdef, p, t, pos, m, return_routes=True)[::2],
        in_shardings=(shardings, rows, rows, rows),
    )
    logits, routes = sharded_fwd(params, tokens, positions, mask)
    want_logits, _, want_routes = fwd(graphdef, params, tokens, positions, mask, return_routes=True)
    np.testing.assert_array_equal(routes, want_routes)
    np.testing.assert_allclose(logits, want_logits, atol=1e-5, rtol=1e-5)
