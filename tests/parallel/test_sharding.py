"""Sharded forward, gradient and sampler equal the single-device ones (8 fake CPU devices)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, positions_from_mask
from rljax.parallel.mesh import make_mesh, split_devices
from rljax.parallel.rules import (
    DEFAULT_RULES,
    batch_sharding,
    logical_to_spec,
    param_shardings,
    replicated,
)
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams

CONFIG = TransformerConfig(
    vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2)]

pytestmark = pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 (fake) devices")


@pytest.fixture(scope="module")
def model_and_batch():
    graphdef, params = create_model(CONFIG, seed=0)
    tokens = jax.random.randint(jax.random.key(1), (8, 12), 0, CONFIG.vocab_size)
    mask = jnp.ones((8, 12), bool).at[::2, :3].set(False)  # some left padding
    return graphdef, params, tokens, mask


def nll(params, graphdef, tokens, mask):
    """Mean next-token negative log-likelihood over real tokens."""
    logits, _ = forward(graphdef, params, tokens, positions_from_mask(mask), mask)
    logprobs = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logprobs, tokens[:, 1:, None], axis=-1)[..., 0]
    weights = (mask[:, 1:] & mask[:, :-1]).astype(jnp.float32)
    return -(picked * weights).sum() / weights.sum()


@pytest.mark.parametrize("shape", MESHES)
def test_sharded_forward_and_gradient_match_single_device(model_and_batch, shape):
    graphdef, params, tokens, mask = model_and_batch
    mesh = make_mesh(*shape)
    p_sh, b_sh = param_shardings(params, mesh), batch_sharding(mesh, 2)

    def logits_fn(p, t, m):
        return forward(graphdef, p, t, positions_from_mask(m), m)[0]

    sharded_logits = jax.jit(
        logits_fn, in_shardings=(p_sh, b_sh, b_sh), out_shardings=batch_sharding(mesh, 3)
    )(params, tokens, mask)
    np.testing.assert_allclose(
        sharded_logits, jax.jit(logits_fn)(params, tokens, mask), atol=1e-5, rtol=1e-5
    )

    grad_fn = jax.grad(nll)
    sharded = jax.jit(
        grad_fn, static_argnums=1, in_shardings=(p_sh, b_sh, b_sh), out_shardings=p_sh
    )(params, graphdef, tokens, mask)
    single = jax.jit(grad_fn, static_argnums=1)(params, graphdef, tokens, mask)
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(single)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    # The gradient really is split: each device holds embed / fsdp x heads / tensor of q_proj.
    (q_grad,) = jax.tree.leaves(sharded["layers"]["attn"]["q_proj"])  # [layers, d, h, hd]
    n, d, h, hd = q_grad.shape
    assert q_grad.addressable_shards[0].data.shape == (n, d // shape[1], h // shape[2], hd)


@pytest.mark.parametrize("shape", [(2, 2, 2)])
def test_sharded_sampler_matches_single_device(model_and_batch, shape):
    graphdef, params, tokens, mask = model_and_batch
    mesh = make_mesh(*shape)
    p_sh, b_sh = param_shardings(params, mesh), batch_sharding(mesh, 2)

    def sample(p, t, m, key):
        return generate(
            graphdef,
            p,
            t,
            m,
            key,
            max_new_tokens=6,
            eos_id=-1,
            pad_id=0,
            sampling=SamplingParams(greedy=True),
        )

    key = jax.random.key(0)
    sharded = jax.jit(sample, in_shardings=(p_sh, b_sh, b_sh, replicated(mesh)))(
        params, tokens, mask, key
    )
    single = sample(params, tokens, mask, key)
    np.testing.assert_array_equal(sharded.completion_tokens, single.completion_tokens)
    np.testing.assert_allclose(sharded.policy_logprobs, single.policy_logprobs, atol=1e-5)


def test_rules_map_logical_axes_and_replicate_indivisible_dims():
    mesh = make_mesh(1, 2, 4)
    assert logical_to_spec(("embed", "mlp"), (32, 64), mesh) == PartitionSpec("fsdp", "tensor")
    # 2 kv heads cannot be split 4 ways: replicated.
    assert logical_to_spec(("embed", "kv_heads", "head_dim"), (32, 2, 8), mesh) == PartitionSpec(
        "fsdp", None, None
    )
    assert DEFAULT_RULES["batch"] == ("data", "fsdp")
    with pytest.raises(ValueError, match="no sharding rule"):
        logical_to_spec(("nonsense",), (4,), mesh)


@pytest.mark.parametrize(
    "sizes,match",
    [
        ((3, 1, 1), "8 are available"),
        ((-1, -1, 1), "at most one"),
        ((0, 1, 1), "positive"),
        ((-1, 3, 1), "not divisible"),
    ],
)
def test_make_mesh_errors(sizes, match):
    with pytest.raises(ValueError, match=match):
        make_mesh(*sizes)


def test_make_mesh_fills_minus_one():
    assert dict(make_mesh(-1, 2, 2).shape) == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    assert dict(make_mesh(2, 1, 1, expert=-1).shape) == {
        "data": 2,
        "fsdp": 1,
        "tensor": 1,
        "expert": 4,
    }


def test_expert_axis_is_fastest_varying_and_shards_only_expert_weights():
    mesh = make_mesh(2, 1, 2, expert=2)
    devices = np.asarray(jax.devices()).reshape(2, 1, 2, 2)  # data, fsdp, tensor, expert
    np.testing.assert_array_equal(mesh.devices, devices)
    assert logical_to_spec(("expert", "embed", "mlp"), (4, 32, 64), mesh) == PartitionSpec(
        "expert", "fsdp", "tensor"
    )
    assert DEFAULT_RULES["batch"] == ("data", "fsdp")  # rows are not split over "expert"
    with pytest.raises(ValueError, match="expert=3"):
        make_mesh(1, 1, 1, expert=3)


def test_split_devices_gives_each_process_its_share(monkeypatch):
    devices = jax.devices()  # 8 CPU devices, one process
    sampler, trainer = split_devices(3)
    assert sampler == devices[:3] and trainer == devices[3:]
    assert split_devices(0) == ([], devices)
    # Two processes of 4 devices each (as jax.distributed numbers them): 1 sampler device of
    # each, in process order; the trainer gets the other 3 of each.
    fake = [type("D", (), {"process_index": i // 4, "id": i})() for i in range(8)]
    monkeypatch.setattr(jax, "devices", lambda: fake)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    sampler, trainer = split_devices(2)
    assert [d.id for d in sampler] == [0, 4] and [d.id for d in trainer] == [1, 2, 3, 5, 6, 7]
    with pytest.raises(ValueError, match="sampler_devices=3 does not split over 2 processes"):
        split_devices(3)
