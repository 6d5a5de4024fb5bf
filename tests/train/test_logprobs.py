"""Chunked log-probs/entropy against a direct numpy computation, values and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, positions_from_mask
from rljax.train.logprobs import (
    completion_logprobs,
    token_hellinger,
    token_logprobs_and_entropy,
    token_logprobs_of,
    token_stats,
    token_top_k,
)


def numpy_reference(hidden, head, targets):
    logits = np.einsum("btd,dv->btv", hidden.astype(np.float64), head.astype(np.float64))
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, targets[..., None], -1)[..., 0]
    entropy = -(np.exp(logp) * logp).sum(-1)
    return picked, entropy


@pytest.mark.parametrize("chunk", [1, 7, 16, 50, 64])
def test_chunked_matches_full_softmax(chunk):
    rng = np.random.default_rng(0)
    hidden = rng.normal(size=(2, 5, 8)).astype(np.float32)
    head = rng.normal(size=(8, 50)).astype(np.float32) * 3  # peaked: tests the online max
    targets = rng.integers(0, 50, (2, 5))
    lp, ent = token_logprobs_and_entropy(
        jnp.asarray(hidden), jnp.asarray(head), jnp.asarray(targets), chunk_size=chunk
    )
    want_lp, want_ent = numpy_reference(hidden, head, targets)
    np.testing.assert_allclose(lp, want_lp, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(ent, want_ent, atol=2e-5, rtol=1e-5)


def test_gradients_match_unchunked():
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(2, 3, 8)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(8, 30)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 30, (2, 3)))

    def direct(h, w):
        logp = jax.nn.log_softmax(h @ w, axis=-1)
        picked = jnp.take_along_axis(logp, targets[..., None], -1)[..., 0]
        return picked.sum() + 0.3 * (-(jnp.exp(logp) * logp).sum(-1)).sum()

    def chunked(h, w):
        lp, ent = token_logprobs_and_entropy(h, w, targets, chunk_size=7)
        return lp.sum() + 0.3 * ent.sum()

    for got, want in zip(
        jax.grad(chunked, (0, 1))(hidden, head), jax.grad(direct, (0, 1))(hidden, head)
    ):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_completion_logprobs_match_teacher_forcing():
    config = TransformerConfig(
        vocab_size=37, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
    )
    graphdef, params = create_model(config, seed=1)
    prompt = jnp.asarray([[0, 0, 5, 6], [7, 8, 9, 10]])
    prompt_mask = prompt > 0
    completion = jnp.asarray([[11, 12, 13], [14, 15, 0]])
    completion_mask = jnp.asarray([[True, True, True], [True, True, False]])
    lp, ent = completion_logprobs(
        graphdef, params, prompt, prompt_mask, completion, completion_mask, chunk_size=10
    )
    tokens = jnp.concatenate([prompt, completion], 1)
    mask = jnp.concatenate([prompt_mask, completion_mask], 1)
    logits = np.asarray(
        forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0], np.float64
    )
    for b in range(2):
        for t in range(3):
            if not completion_mask[b, t]:
                assert lp[b, t] == 0 and ent[b, t] == 0
                continue
            z = logits[b, 3 + t]  # the state before completion token t
            logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            np.testing.assert_allclose(lp[b, t], logp[completion[b, t]], atol=1e-5)
            np.testing.assert_allclose(ent[b, t], -(np.exp(logp) * logp).sum(), atol=1e-5)


@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_sum_sq_prob_matches_explicit_sum(chunk):
    rng = np.random.default_rng(3)
    hidden = rng.normal(size=(2, 4, 8)).astype(np.float32)
    head = rng.normal(size=(8, 50)).astype(np.float32) * 3
    stats = token_stats(jnp.asarray(hidden), jnp.asarray(head), jnp.zeros((2, 4), int), chunk)
    logits = np.einsum("btd,dv->btv", hidden.astype(np.float64), head.astype(np.float64))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(stats.sum_sq_prob, (p**2).sum(-1), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_hellinger_matches_explicit_sum(chunk):
    rng = np.random.default_rng(4)
    hp, hq = rng.normal(size=(2, 2, 3, 8)).astype(np.float32)
    wp = rng.normal(size=(8, 50)).astype(np.float32) * 3
    wq = rng.normal(size=(8, 50)).astype(np.float32)
    got = token_hellinger(*map(jnp.asarray, (hp, wp, hq, wq)), chunk_size=chunk)

    def probs(h, w):
        z = np.einsum("btd,dv->btv", h.astype(np.float64), w.astype(np.float64))
        e = np.exp(z - z.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    want = 1.0 - np.sqrt(probs(hp, wp) * probs(hq, wq)).sum(-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    same = token_hellinger(*map(jnp.asarray, (hp, wp, hp, wp)), chunk_size=chunk)
    np.testing.assert_allclose(same, 0.0, atol=1e-6)


@pytest.mark.parametrize("chunk", [4, 7, 23, 100])
def test_top_k_and_logprobs_of_several_ids_match_a_full_softmax(chunk):
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(size=(2, 3, 5)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(5, 23)), jnp.float32)
    logits = np.einsum("btd,dv->btv", np.asarray(hidden, np.float64), np.asarray(head))
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    values, ids = token_top_k(hidden, head, 6, chunk)
    want = np.argsort(-logp, -1)[..., :6]
    np.testing.assert_array_equal(ids, want)
    np.testing.assert_allclose(values, np.take_along_axis(logp, want, -1), atol=1e-5)
    some = rng.integers(0, 23, size=(2, 3, 4))
    got = token_logprobs_of(hidden, head, jnp.asarray(some), chunk)
    np.testing.assert_allclose(got, np.take_along_axis(logp, some, -1), atol=1e-5)
    with pytest.raises(ValueError, match="must be in"):
        token_top_k(hidden, head, 24, chunk)
