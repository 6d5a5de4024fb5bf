"""CUTS (constrained uniform top-k sampling) and Mixed-CUTS against numpy references."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.config import TransformerConfig
from rljax.models.transformer import abstract_model, forward, positions_from_mask
from rljax.rollout.cuts import (
    cuts_logprobs,
    cuts_row_mask,
    num_cuts_samples,
    training_rollout_logprobs,
)
from rljax.rollout.sampler import generate
from rljax.rollout.sampling import SamplingParams, process_logits, sample_token

# One compilation per SamplingParams instead of op-by-op dispatch (keeps the tests fast).
draw = jax.jit(sample_token, static_argnums=2)

# Chi-square critical value for 3 degrees of freedom at significance 0.001.
CHI2_3DOF_999 = 16.266


def candidate_set(logits, top_k, ratio, temperature=1.0):
    """[..., V] bool: top-k ∩ {p >= p_max / ratio} of softmax(logits / T), in float64."""
    z = np.asarray(logits, np.float64) / temperature
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    keep = p >= p.max(-1, keepdims=True) / ratio
    if top_k < z.shape[-1]:
        kth = np.sort(z, axis=-1)[..., -top_k][..., None]
        keep &= z >= kth
    return keep


def original_process_logits(logits, params):
    """`process_logits` as it was before CUTS existed, kept verbatim as a regression reference."""
    logits = logits.astype(jnp.float32)
    if params.greedy:
        best = jnp.argmax(logits, axis=-1)
        return jnp.where(jnp.arange(logits.shape[-1]) == best[..., None], 0.0, -jnp.inf)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, params.top_k)[0][..., -1:]
        logits = jnp.where(logits >= kth, logits, -jnp.inf)
    if params.top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        sorted_probs = jax.nn.softmax(sorted_logits, axis=-1)
        mass_before = jnp.cumsum(sorted_probs, axis=-1) - sorted_probs
        keep_sorted = mass_before < params.top_p
        cutoff = jnp.min(jnp.where(keep_sorted, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
    return jax.nn.log_softmax(logits, axis=-1)


def random_logits(rows=64, vocab=12, seed=0, scale=2.0):
    return np.random.default_rng(seed).normal(size=(rows, vocab)).astype(np.float32) * scale


@pytest.mark.parametrize(
    "top_k,ratio,temperature",
    [(5, math.e, 1.0), (3, math.e, 0.5), (12, math.e, 1.0), (4, math.inf, 1.0), (6, 1.5, 1.7)],
)
def test_cuts_logprobs_are_uniform_over_the_numpy_candidate_set(top_k, ratio, temperature):
    logits = random_logits()
    got = np.asarray(cuts_logprobs(jnp.asarray(logits) / temperature, top_k, ratio))
    keep = candidate_set(logits, top_k, ratio, temperature)
    np.testing.assert_array_equal(np.isfinite(got), keep)
    size = keep.sum(-1, keepdims=True)
    np.testing.assert_allclose(got[keep], np.broadcast_to(-np.log(size), keep.shape)[keep])
    if ratio == math.inf:  # no floor: exactly the top-k
        np.testing.assert_array_equal(size, top_k)


def test_cuts_samples_always_fall_in_the_candidate_set():
    logits = random_logits(rows=3000, seed=1)
    params = SamplingParams(temperature=0.7, cuts_top_k=5)
    tokens, lp, policy_lp = draw(jax.random.key(0), jnp.asarray(logits), params)
    tokens = np.asarray(tokens)
    keep = candidate_set(logits, 5, math.e, 0.7)
    assert keep[np.arange(len(tokens)), tokens].all()
    sizes = keep.sum(-1)
    assert len(set(sizes.tolist())) >= 3  # the test covers several candidate-set sizes
    np.testing.assert_allclose(lp, -np.log(sizes), rtol=1e-6)
    z = logits.astype(np.float64)
    ref_policy = (z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(len(tokens)), tokens]
    np.testing.assert_allclose(policy_lp, ref_policy, atol=1e-5)


def test_cuts_frequencies_are_uniform_over_the_candidate_set():
    # p_max / e keeps logits >= 2.0 - 1: tokens 0, 2, 3, 5; token 4 is in the top-5 but too
    # unlikely, tokens 1 and 6 are outside both.
    row = np.array([2.0, -3.0, 1.5, 1.2, 0.5, 1.1, -1.0], np.float32)
    draws = 40000
    logits = jnp.asarray(np.tile(row, (draws, 1)))
    tokens, _, _ = draw(jax.random.key(3), logits, SamplingParams(cuts_top_k=5))
    counts = np.bincount(np.asarray(tokens), minlength=len(row))
    assert counts[[1, 4, 6]].sum() == 0
    observed = counts[[0, 2, 3, 5]]
    chi2 = ((observed - draws / 4) ** 2 / (draws / 4)).sum()
    assert chi2 < CHI2_3DOF_999, (observed, chi2)


def test_single_candidate_is_greedy_decoding():
    logits = jnp.asarray(random_logits(rows=500, seed=2))
    argmax = np.argmax(np.asarray(logits), axis=-1)
    # cuts_top_k = 1, or a top token more than one nat above the rest (|C| = 1 under p_max / e).
    gapped = logits.at[jnp.arange(500), argmax].add(20.0)
    for z, params in [
        (logits, SamplingParams(cuts_top_k=1)),
        (gapped, SamplingParams(cuts_top_k=8)),
    ]:
        tokens, lp, _ = draw(jax.random.key(4), z, params)
        np.testing.assert_array_equal(tokens, argmax)
        np.testing.assert_array_equal(lp, 0.0)


def test_mixed_rows_cuts_and_standard_logprobs():
    logits = jnp.asarray(random_logits(rows=200, seed=5))
    rows = np.random.default_rng(6).random(200) < 0.5
    params = SamplingParams(temperature=0.9, top_p=0.9, cuts_top_k=4)
    off = SamplingParams(temperature=0.9, top_p=0.9)
    key = jax.random.key(7)
    tokens, lp, policy_lp = map(np.asarray, draw(key, logits, params, jnp.asarray(rows)))
    std_tokens, std_lp, std_policy_lp = map(np.asarray, draw(key, logits, off))
    keep = candidate_set(np.asarray(logits), 4, math.e, 0.9)
    idx = np.arange(200)
    assert keep[idx[rows], tokens[rows]].all()
    np.testing.assert_allclose(lp[rows], -np.log(keep[rows].sum(-1)), rtol=1e-6)
    # Standard rows: same uniforms, same distribution, so the same draws bit for bit.
    np.testing.assert_array_equal(tokens[~rows], std_tokens[~rows])
    np.testing.assert_array_equal(lp[~rows], std_lp[~rows])
    np.testing.assert_array_equal(policy_lp[~rows], std_policy_lp[~rows])
    # No CUTS row (cuts_fraction 0 in generate): identical to CUTS off everywhere.
    none = draw(key, logits, params, jnp.zeros(200, bool))
    for a, b in zip(none, (std_tokens, std_lp, std_policy_lp)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(),
        dict(temperature=0.6, top_k=4),
        dict(top_p=0.7),
        dict(temperature=1.4, top_k=3, top_p=0.8),
    ],
)
def test_cuts_off_is_bit_identical_to_the_original_processing(kwargs):
    logits = jnp.asarray(random_logits(seed=8))
    rows = jnp.asarray(np.arange(64) % 2 == 0)
    want = np.asarray(original_process_logits(logits, SamplingParams(**kwargs)))
    np.testing.assert_array_equal(process_logits(logits, SamplingParams(**kwargs)), want)
    np.testing.assert_array_equal(process_logits(logits, SamplingParams(**kwargs), rows), want)


def test_row_rule():
    assert [
        num_cuts_samples(n, f) for n, f in [(8, 0.5), (3, 0.5), (1, 0.5), (4, 0.0), (4, 1.0)]
    ] == [4, 2, 1, 0, 4]
    np.testing.assert_array_equal(cuts_row_mask(2, 4, 0.5), [1, 1, 0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(cuts_row_mask(2, 3, 0.25), [1, 0, 0, 1, 0, 0])
    with pytest.raises(ValueError, match="fraction"):
        num_cuts_samples(4, 1.5)


def test_training_rollout_logprobs_take_pi_on_cuts_rows():
    sampling = np.array([[-1.386, -0.693], [-0.2, -0.3], [-1.099, 0.0]], np.float32)
    policy = np.array([[-2.5, -0.1], [-0.25, -0.35], [-3.0, -0.7]], np.float32)
    got = training_rollout_logprobs(sampling, policy, np.array([True, False, True]))
    want = np.array([[-2.5, -0.1], [-0.2, -0.3], [-3.0, -0.7]], np.float32)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(training_rollout_logprobs(sampling, policy, None), sampling)
    with pytest.raises(ValueError, match="cuts_rows"):
        training_rollout_logprobs(sampling, policy, np.array([True, False]))


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(cuts_top_k=-1), "cuts_top_k"),
        (dict(cuts_ratio=0.5), "cuts_ratio"),
        (dict(cuts_fraction=1.5), "cuts_fraction"),
        (dict(greedy=True, cuts_top_k=3), "greedy"),
    ],
)
def test_bad_cuts_params_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


CONFIG = TransformerConfig(vocab_size=40, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)


def toy_model():
    """A Transformer with N(0, 1) weights: cheaper than `create_model`, and far from flat."""
    graphdef, shapes = abstract_model(CONFIG)
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s.shape), s.dtype), shapes)
    return graphdef, params


def test_generate_mixed_cuts_rows():
    graphdef, params = toy_model()
    prompts = jnp.asarray(np.random.default_rng(9).integers(2, 40, (2, 4)), jnp.int32)
    mask = jnp.ones((2, 4), bool)
    sampling = SamplingParams(temperature=2.0, top_k=6, cuts_top_k=4)
    out = generate(
        graphdef,
        params,
        prompts,
        mask,
        jax.random.key(1),
        max_new_tokens=6,
        eos_id=-1,
        pad_id=0,
        n_samples=4,
        sampling=sampling,
    )
    rows = np.array([1, 1, 0, 0, 1, 1, 0, 0], bool)  # the first G/2 = 2 rows of each group
    np.testing.assert_array_equal(out.cuts_rows, rows)

    # Teacher-forced logits of the sampled sequences give the distributions independently.
    tokens = jnp.concatenate([out.prompt_tokens, out.completion_tokens], axis=1)
    full = jnp.ones(tokens.shape, bool)
    logits_fn = jax.jit(lambda t, m: forward(graphdef, params, t, positions_from_mask(m), m)[0])
    step_logits = np.asarray(logits_fn(tokens, full))[:, 3:-1]  # P - 1 + t predicts token t
    completion = np.asarray(out.completion_tokens)
    take = lambda x: np.take_along_axis(x, completion[..., None], -1)[..., 0]  # noqa: E731
    keep = candidate_set(step_logits, 4, math.e, 2.0)
    assert take(keep)[rows].all()
    sizes = keep.sum(-1)
    assert len(set(sizes[rows].ravel().tolist())) >= 2  # several candidate-set sizes occur
    np.testing.assert_allclose(out.sampling_logprobs[rows], -np.log(sizes[rows]), atol=1e-6)
    standard = take(np.asarray(original_process_logits(jnp.asarray(step_logits), sampling)))
    np.testing.assert_allclose(out.sampling_logprobs[~rows], standard[~rows], atol=1e-5)
    policy = take(np.asarray(jax.nn.log_softmax(jnp.asarray(step_logits), -1)))
    np.testing.assert_allclose(out.policy_logprobs, policy, atol=1e-5)
