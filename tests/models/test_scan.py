"""Scanned layers: the stacked blocks run by one `lax.scan` equal the unrolled ones, the
per-layer checkpoint layouts convert exactly, the sampler and the trainer read each layer's own
weights, and the compiled program does not grow with depth."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hf_parity import hf_model, torch_or_skip

from rljax.models import TransformerConfig, create_model, forward, load_hf_checkpoint
from rljax.models.transformer import positions_from_mask, stack_layers, unstack_layers
from rljax.rollout.sampler import generate
from rljax.train.logprobs import completion_logprobs

BASE = TransformerConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_ff=48)
VARIANTS = {  # every variant's full-attention layers cover the plain dense model too
    "moe": BASE.replace(num_experts=4, experts_per_token=2),
    "windows": BASE.replace(
        sliding_window=3,
        layer_types=("sliding_attention", "full_attention", "sliding_attention"),
    ),
    "remat_chunks": BASE.replace(remat="block", attention_chunk=4),
}


def _batch():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 50, (2, 10)), jnp.int32)
    mask = jnp.ones((2, 10), bool).at[0, :3].set(False)
    return tokens, positions_from_mask(mask), mask


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_scanned_and_unrolled_blocks_agree(name):
    """Same parameters, scanned or unrolled: the same logits, MoE routes and gradients (up
    to float32 rounding of the two compiled programs), and the same cached decoding."""
    config = VARIANTS[name]
    tokens, positions, mask = _batch()
    outputs = []
    for scan in (True, False):
        graphdef, params = create_model(config.replace(scan_layers=scan), seed=0)

        def loss(p, graphdef=graphdef):
            logits = forward(graphdef, p, tokens, positions, mask)[0]
            return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0))

        logits, _, routes = jax.jit(forward, static_argnums=(0, 7))(
            graphdef, params, tokens, positions, mask, None, None, True
        )
        grads = jax.jit(jax.grad(loss))(params)
        outputs.append((logits, routes, grads))
    (a, routes_a, grads_a), (b, routes_b, grads_b) = outputs
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
    if config.num_experts:
        np.testing.assert_array_equal(routes_a, routes_b)
    for ga, gb in zip(jax.tree.leaves(grads_a), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-6)


def test_stack_and_unstack_keep_each_layer_in_its_place():
    per_layer = {
        "embed": np.ones((4, 2)),
        "layers": {i: {"attn": {"q": np.full((2, 3), float(i))}} for i in (2, 0, 1)},
    }
    stacked = stack_layers(per_layer)
    assert stacked["layers"]["attn"]["q"].shape == (3, 2, 3)
    for i in range(3):
        np.testing.assert_array_equal(stacked["layers"]["attn"]["q"][i], float(i))
    back = unstack_layers(stacked)
    assert sorted(back["layers"]) == [0, 1, 2]
    for i in range(3):
        np.testing.assert_array_equal(
            back["layers"][i]["attn"]["q"], per_layer["layers"][i]["attn"]["q"]
        )
    assert back["embed"] is per_layer["embed"]


def test_fresh_model_layers_are_distinct_and_labelled_layers():
    """Each slice of the stack is its own randomly initialised layer, and the stacked axis is
    named "layers" for the sharding rules."""
    _, params = create_model(BASE, seed=0)
    q = params["layers"]["attn"]["q_proj"]
    assert q.get_metadata()["out_sharding"] == ("layers", "embed", "q_heads", "head_dim")
    assert q[...].shape[0] == BASE.n_layers
    assert not np.array_equal(q[...][0], q[...][1])


@pytest.mark.hf
def test_the_sampler_and_the_trainer_read_each_layers_own_weights(tmp_path):
    """A 3-layer transformers checkpoint (every layer's weights different) loaded into the
    stacked layout: the sampler's log-probs of its own samples and the trainer's
    teacher-forced ones both equal transformers' log-probs of the same sequences; a weight
    mapped to the wrong layer, or a layer read twice, would break both."""
    torch = torch_or_skip()
    fields = dict(
        vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
    )  # fmt: skip
    model = hf_model("qwen2", fields)
    model.save_pretrained(tmp_path, safe_serialization=True)
    _, graphdef, params = load_hf_checkpoint(tmp_path)
    prompt = jnp.asarray(np.random.default_rng(1).integers(2, 64, (2, 4)), jnp.int32)
    prompt_mask = jnp.ones((2, 4), bool).at[1, 0].set(False)
    rollout = generate(
        graphdef, params, prompt, prompt_mask, jax.random.key(0),
        max_new_tokens=6, eos_id=1, pad_id=0, n_samples=2,
    )  # fmt: skip
    args = (rollout.prompt_tokens, rollout.prompt_mask)
    args += (rollout.completion_tokens, rollout.completion_mask)
    trainer, _ = jax.jit(completion_logprobs, static_argnums=0)(graphdef, params, *args)

    tokens = np.concatenate([rollout.prompt_tokens, rollout.completion_tokens], axis=1)
    mask = np.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1)
    positions = np.asarray(positions_from_mask(jnp.asarray(mask)))
    with torch.no_grad():
        logits = model(
            input_ids=torch.tensor(tokens, dtype=torch.long),
            attention_mask=torch.tensor(mask, dtype=torch.long),
            position_ids=torch.tensor(positions, dtype=torch.long),
        ).logits.double()
    logp = torch.log_softmax(logits, dim=-1).numpy()
    p = rollout.prompt_tokens.shape[1]
    completion = np.asarray(rollout.completion_tokens)
    reference = np.take_along_axis(logp[:, p - 1 : -1], completion[..., None], axis=-1)[..., 0]
    m = np.asarray(rollout.completion_mask)
    assert m.sum() >= 6
    np.testing.assert_allclose(np.asarray(rollout.policy_logprobs)[m], reference[m], atol=2e-5)
    np.testing.assert_allclose(np.asarray(trainer)[m], reference[m], atol=2e-5)


def _dots(config: TransformerConfig, n_layers: int) -> int:
    """The matmuls in the compiled program of the loss gradient for an `n_layers` model."""
    graphdef, params = jax.eval_shape(lambda: create_model(config.replace(n_layers=n_layers)))
    tokens, positions, mask = _batch()
    loss = lambda p: forward(graphdef, p, tokens, positions, mask)[0].sum()  # noqa: E731
    return jax.jit(jax.grad(loss)).lower(params).compile().as_text().count(" dot(")


def test_the_compiled_program_does_not_grow_with_depth():
    """Compile time follows program size: scanned, 6 layers compile to as many matmuls as 2;
    unrolled, the program holds one copy of the block per layer."""
    assert _dots(BASE, 6) == _dots(BASE, 2)
    unrolled = BASE.replace(scan_layers=False)
    assert _dots(unrolled, 6) >= 2.5 * _dots(unrolled, 2)
