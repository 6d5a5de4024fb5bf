"""`TransformerConfig.attention_impl`: jax.nn.dot_product_attention ("xla") against the einsum
reference in every attention path, the "auto"/"cudnn" choice per backend, and the errors.

Tolerance: "xla" and "einsum" compute the same float32 scores and softmax, but XLA contracts the
dot products in another order and multiplies by 1/sqrt(d) where the reference divides by
sqrt(d), so each attention differs by a few float32 ulps (~1e-7 relative); through two layers
and the vocabulary projection the largest gap measured is 1.5e-7 (logits ~0.3, gradients ~1.7),
so 1e-6 (relative and absolute) leaves ~7x headroom.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs.grpo_addition import get_config
from rljax.config import SCHEMA, validate_config
from rljax.diffusion.engine import build_diffusion_policy
from rljax.models.attention import ATTENTION_IMPLS, resolve_impl
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, init_cache, positions_from_mask
from rljax.train.builders import build_policy
from rljax.train.packing import packed_hidden_states

TOL = dict(rtol=1e-6, atol=1e-6)
# GQA (4 query heads share 2 kv heads), head_dim 8 (sqrt(8) is inexact: the scales round apart).
BASE = TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=48)
CASES = {
    "gqa": BASE,
    "multi_query": BASE.replace(n_kv_heads=1),
    "sliding_window": BASE.replace(
        sliding_window=3, layer_types=("sliding_attention", "full_attention")
    ),
    "query_chunks": BASE.replace(attention_chunk=4),  # 10 = 2 x 4 + a padded block of 2
    "bidirectional": BASE.replace(causal=False),
}


@pytest.fixture(name="kernel_calls")
def kernel_calls_fixture(monkeypatch):
    """The `implementation` of every jax.nn.dot_product_attention call traced from now on."""
    calls, original = [], jax.nn.dot_product_attention

    def spy(*args, implementation=None, **kwargs):
        calls.append(implementation)
        return original(*args, implementation=implementation, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", spy)
    return calls


def _left_padded(pads=(0, 4, 7), length=10, seed=0):
    """Tokens [3, 10] left-padded by `pads`, and their mask."""
    tokens = jax.random.randint(jax.random.key(seed), (len(pads), length), 2, 40)
    mask = jnp.arange(length)[None, :] >= jnp.asarray(pads)[:, None]
    return jnp.where(mask, tokens, 0), mask


def _loss_and_grads(config, params, tokens, mask):
    """Logits [B, T, V] and the gradient of the masked logsumexp of the logits."""
    graphdef, _ = create_model(config)

    def loss(p):
        logits, _ = forward(graphdef, p, tokens, positions_from_mask(mask), mask)
        return (jax.nn.logsumexp(logits, -1) * mask).sum(), logits

    (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return np.asarray(logits), grads


@pytest.mark.parametrize("case", sorted(CASES))
def test_xla_equals_einsum_logits_and_gradients(case, kernel_calls):
    config = CASES[case]
    _, params = create_model(config, seed=1)
    tokens, mask = _left_padded()
    logits, grads = _loss_and_grads(config, params, tokens, mask)
    assert not kernel_calls
    logits_x, grads_x = _loss_and_grads(config.replace(attention_impl="xla"), params, tokens, mask)
    assert kernel_calls and set(kernel_calls) == {"xla"}
    valid = np.asarray(mask)
    np.testing.assert_allclose(logits_x[valid], logits[valid], **TOL)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, **TOL), grads_x, grads)


def test_xla_equals_einsum_on_packed_segments(kernel_calls):
    """Three rows of 6, 3 and 3 real tokens packed into two rows (segment ids), both kernels."""
    _, params = create_model(CASES["sliding_window"], seed=2)
    tokens, mask = _left_padded()
    positions = positions_from_mask(mask)
    hidden = {}
    for impl in ("einsum", "xla"):
        graphdef, _ = create_model(CASES["sliding_window"].replace(attention_impl=impl))
        model = nnx.merge(graphdef, params)
        hidden[impl] = np.asarray(packed_hidden_states(model, tokens, positions, mask, rows=2))
    assert set(kernel_calls) == {"xla"}
    valid = np.asarray(mask)
    np.testing.assert_allclose(hidden["xla"][valid], hidden["einsum"][valid], **TOL)


def test_xla_cached_decoding_equals_the_einsum_full_pass(kernel_calls):
    """A prefill of 5 tokens then one-token steps with a KV cache, on the windowed GQA model."""
    config = CASES["sliding_window"]
    _, params = create_model(config, seed=3)
    tokens, mask = _left_padded()
    reference, _ = _loss_and_grads(config, params, tokens, mask)
    graphdef, _ = create_model(config.replace(attention_impl="xla"))
    positions = positions_from_mask(mask)
    cache, pieces = init_cache(config, 3, 12), []
    for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 8), (8, 9), (9, 10)]:
        logits, cache = forward(
            graphdef, params, tokens[:, lo:hi], positions[:, lo:hi], mask[:, lo:hi], cache
        )
        pieces.append(logits)
    assert set(kernel_calls) == {"xla"}
    valid = np.asarray(mask)
    np.testing.assert_allclose(np.concatenate(pieces, 1)[valid], reference[valid], **TOL)


def test_auto_on_cpu_is_the_einsum_reference_bit_for_bit(kernel_calls):
    _, params = create_model(BASE, seed=4)
    tokens, mask = _left_padded()
    logits, _ = _loss_and_grads(BASE, params, tokens, mask)
    logits_auto, _ = _loss_and_grads(BASE.replace(attention_impl="auto"), params, tokens, mask)
    assert not kernel_calls
    np.testing.assert_array_equal(logits_auto, logits)


@pytest.mark.parametrize(
    "backend, impl, dtype, head_dim, length, chosen",
    [
        ("gpu", "auto", jnp.bfloat16, 64, 8, "cudnn"),
        ("gpu", "auto", jnp.bfloat16, 64, 1, "xla"),  # a one-token decoding step
        ("gpu", "auto", jnp.float32, 64, 8, "xla"),
        ("gpu", "auto", jnp.float16, 12, 8, "xla"),  # head_dim not a multiple of 8
        ("gpu", "cudnn", jnp.float16, 128, 8, "cudnn"),
        ("gpu", "cudnn", jnp.float16, 128, 7, "xla"),
        ("tpu", "auto", jnp.bfloat16, 64, 8, "xla"),
        ("cpu", "auto", jnp.bfloat16, 64, 8, "einsum"),
        ("cpu", "xla", jnp.float32, 64, 8, "xla"),
    ],
)
def test_auto_and_cudnn_choose_by_backend_dtype_and_shape(
    monkeypatch, backend, impl, dtype, head_dim, length, chosen
):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    q = jax.ShapeDtypeStruct((2, length, 2, 2, head_dim), dtype)
    k = jax.ShapeDtypeStruct((2, 8, 2, head_dim), dtype)
    assert resolve_impl(impl, q, k) == chosen


@pytest.mark.parametrize(
    "backend, dtype, head_dim, why",
    [
        ("cpu", jnp.bfloat16, 64, "needs a CUDA GPU but jax's backend is cpu"),
        ("gpu", jnp.float32, 64, "needs dtype bfloat16 or float16, not float32"),
        ("gpu", jnp.bfloat16, 12, "needs head_dim a multiple of 8 up to 128, not 12"),
    ],
)
def test_cudnn_where_it_cannot_run_is_a_one_line_error(monkeypatch, backend, dtype, head_dim, why):
    monkeypatch.setattr(jax, "default_backend", lambda: backend)
    q = jax.ShapeDtypeStruct((2, 8, 2, 2, head_dim), dtype)
    k = jax.ShapeDtypeStruct((2, 8, 2, head_dim), dtype)
    with pytest.raises(ValueError, match=f"^TransformerConfig.attention_impl='cudnn' {why}; use"):
        resolve_impl("cudnn", q, k)


def test_cudnn_on_this_cpu_fails_in_the_model_and_in_validation():
    graphdef, params = create_model(BASE.replace(dtype="bfloat16", attention_impl="cudnn"))
    tokens, mask = _left_padded()
    with pytest.raises(ValueError, match="attention_impl='cudnn' needs a CUDA GPU") as err:
        forward(graphdef, params, tokens, positions_from_mask(mask), mask)
    assert "\n" not in str(err.value)
    config = get_config()
    config.model.attention_impl = "cudnn"
    with pytest.raises(ValueError, match="^model.attention_impl='cudnn' needs a CUDA GPU"):
        validate_config(config)


def test_an_unknown_impl_is_a_one_line_error_naming_the_key():
    with pytest.raises(ValueError, match="^TransformerConfig.attention_impl='flash' is unknown"):
        BASE.replace(attention_impl="flash")
    config = get_config()
    config.model.attention_impl = "flash"
    with pytest.raises(ValueError, match="model.attention_impl") as err:
        validate_config(config)
    assert "\n" not in str(err.value)
    assert SCHEMA["model"]["attention_impl"].choices == ATTENTION_IMPLS


def test_the_run_config_reaches_every_block_and_the_diffusion_policy(kernel_calls):
    config = get_config()
    config.model.update(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32)
    config.model.attention_impl = "xla"
    _, model_config, graphdef, params = build_policy(config)
    assert model_config.attention_impl == "xla"
    tokens, mask = _left_padded()
    forward(graphdef, params, tokens, positions_from_mask(mask), mask)
    assert kernel_calls == ["xla"]  # the one stacked block, traced once for every layer
    assert build_diffusion_policy(config)[1].attention_impl == "xla"
