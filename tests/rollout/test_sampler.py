"""Sampler tests: KV-cache consistency, greedy, log-probs, keys, EOS and padding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, init_cache, positions_from_mask
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams

CONFIG = TransformerConfig(
    vocab_size=50, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
EOS, PAD = 1, 0


@pytest.fixture(scope="module")
def model():
    return create_model(CONFIG, seed=3)


def left_padded_prompts():
    """Three prompts of lengths 5, 3 and 1, left-padded to 5."""
    lengths = [5, 3, 1]
    rng = np.random.default_rng(0)
    tokens = np.zeros((3, 5), np.int32)
    mask = np.zeros((3, 5), bool)
    for i, n in enumerate(lengths):
        tokens[i, 5 - n :] = rng.integers(2, CONFIG.vocab_size, n)
        mask[i, 5 - n :] = True
    return jnp.asarray(tokens), jnp.asarray(mask)


def full_logits(graphdef, params, tokens, mask):
    """Teacher-forced float32 logits [B, L, V] of the whole (unpadded-in-the-middle) sequence."""
    logits, _ = forward(graphdef, params, tokens, positions_from_mask(mask), mask)
    return logits


def test_kv_cache_decoding_matches_full_forward(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    extra = jax.random.randint(jax.random.key(1), (3, 4), 2, CONFIG.vocab_size)
    all_tokens = jnp.concatenate([tokens, extra], axis=1)
    all_mask = jnp.concatenate([mask, jnp.ones((3, 4), bool)], axis=1)
    positions = positions_from_mask(all_mask)
    reference = full_logits(graphdef, params, all_tokens, all_mask)

    cache = init_cache(CONFIG, 3, 12)
    pieces = []
    # Prefill with the prompt, then one token at a time, then a chunk of two.
    for lo, hi in [(0, 5), (5, 6), (6, 7), (7, 9)]:
        logits, cache = forward(
            graphdef, params, all_tokens[:, lo:hi], positions[:, lo:hi], all_mask[:, lo:hi], cache
        )
        pieces.append(logits)
    incremental = jnp.concatenate(pieces, axis=1)
    np.testing.assert_allclose(
        np.asarray(incremental)[all_mask], np.asarray(reference)[all_mask], atol=1e-5, rtol=1e-5
    )
    assert int(cache.index) == 9


def test_left_padding_does_not_change_logits(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    padded = full_logits(graphdef, params, tokens, mask)[1, -1]
    alone = full_logits(graphdef, params, tokens[1:2, 2:], mask[1:2, 2:])[0, -1]
    np.testing.assert_allclose(padded, alone, atol=1e-5, rtol=1e-5)


def test_greedy_equals_stepwise_argmax(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    out = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=6,
        eos_id=-1,
        pad_id=PAD,
        sampling=SamplingParams(greedy=True),
    )
    # Reference: full forward passes without a cache over a right-padded buffer (one shape,
    # one compilation), appending the argmax of the last real position each time.
    logits_fn = jax.jit(lambda ids, m: full_logits(graphdef, params, ids, m))
    for row in range(3):
        seq = [int(t) for t, m in zip(tokens[row], mask[row]) if m]
        for _ in range(6):
            ids = np.zeros((1, 11), np.int32)
            ids[0, : len(seq)] = seq
            logits = logits_fn(jnp.asarray(ids), jnp.asarray(np.arange(11) < len(seq))[None])
            seq.append(int(jnp.argmax(logits[0, len(seq) - 1])))
        assert out.completion_tokens[row].tolist() == seq[-6:]
    assert bool(out.completion_mask.all())
    np.testing.assert_array_equal(out.sampling_logprobs, 0.0)
    assert out.routes is None  # dense policy: no expert routes recorded


def teacher_forced_logprobs(graphdef, params, out):
    tokens = jnp.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    mask = jnp.concatenate([out.prompt_mask, out.completion_mask], axis=1)
    logprobs = jax.nn.log_softmax(full_logits(graphdef, params, tokens, mask), axis=-1)
    p = out.prompt_tokens.shape[1]
    # The logit at position i predicts token i + 1.
    picked = jnp.take_along_axis(logprobs[:, p - 1 : -1], out.completion_tokens[..., None], -1)[
        ..., 0
    ]
    return jnp.where(out.completion_mask, picked, 0.0)


def test_temperature_one_logprobs_equal_teacher_forcing(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    out = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(7),
        max_new_tokens=8,
        eos_id=EOS,
        pad_id=PAD,
        n_samples=2,
    )
    reference = teacher_forced_logprobs(graphdef, params, out)
    np.testing.assert_allclose(out.sampling_logprobs, reference, atol=1e-5)
    np.testing.assert_allclose(out.policy_logprobs, reference, atol=1e-5)


def test_sampling_logprobs_follow_the_processed_distribution(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    sampling = SamplingParams(temperature=0.7, top_k=5)
    out = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(2),
        max_new_tokens=5,
        eos_id=EOS,
        pad_id=PAD,
        sampling=sampling,
    )
    policy = teacher_forced_logprobs(graphdef, params, out)
    np.testing.assert_allclose(out.policy_logprobs, policy, atol=1e-5)
    # The temperature-0.7, top-5 distribution is sharper than the policy on sampled tokens.
    m = np.asarray(out.completion_mask)
    assert (np.asarray(out.sampling_logprobs)[m] >= np.asarray(policy)[m] - 1e-6).mean() > 0.5


def test_same_key_same_samples_different_key_different(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    run = lambda seed: generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(seed),  # noqa
        max_new_tokens=8,
        eos_id=-1,
        pad_id=PAD,
        n_samples=4,
    )
    a, b, c = run(5), run(5), run(6)
    np.testing.assert_array_equal(a.completion_tokens, b.completion_tokens)
    assert not np.array_equal(a.completion_tokens, c.completion_tokens)
    # Samples of one prompt differ from each other too.
    assert not np.array_equal(a.completion_tokens[0], a.completion_tokens[1])
    np.testing.assert_array_equal(a.group_id, np.repeat(np.arange(3), 4))
    np.testing.assert_array_equal(a.prompt_tokens, np.repeat(np.asarray(tokens), 4, axis=0))


def test_rows_stop_at_eos_and_then_pad(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    # Make EOS the greedy choice after exactly one token for row 0 by using its first token as EOS.
    first = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=6,
        eos_id=-1,
        pad_id=PAD,
        sampling=SamplingParams(greedy=True),
    )
    eos = int(first.completion_tokens[0, 2])
    out = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=6,
        eos_id=eos,
        pad_id=PAD,
        sampling=SamplingParams(greedy=True),
    )
    for row in range(3):
        ref = first.completion_tokens[row].tolist()
        stop = ref.index(eos) + 1 if eos in ref else 6
        assert out.completion_tokens[row].tolist()[:stop] == ref[:stop]
        assert out.completion_tokens[row].tolist()[stop:] == [PAD] * (6 - stop)
        assert out.completion_mask[row].tolist() == [True] * stop + [False] * (6 - stop)
        assert float(jnp.abs(out.policy_logprobs[row, stop:]).sum()) == 0.0
    assert out.completion_mask[0].sum() <= 3


def test_top_k_one_is_greedy(model):
    graphdef, params = model
    tokens, mask = left_padded_prompts()
    greedy = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(0),
        max_new_tokens=5,
        eos_id=-1,
        pad_id=PAD,
        sampling=SamplingParams(greedy=True),
    )
    top1 = generate(
        graphdef,
        params,
        tokens,
        mask,
        jax.random.key(9),
        max_new_tokens=5,
        eos_id=-1,
        pad_id=PAD,
        sampling=SamplingParams(top_k=1),
    )
    np.testing.assert_array_equal(greedy.completion_tokens, top1.completion_tokens)
    np.testing.assert_allclose(top1.sampling_logprobs, 0.0, atol=1e-6)
