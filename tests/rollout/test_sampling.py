"""Logit processing (temperature, top-k, top-p) against a numpy reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rollout.sampling import SamplingParams, process_logits, sample_token


def numpy_reference(logits, temperature, top_k, top_p):
    """Log-probs of the processed distribution, one row at a time with plain loops."""
    out = []
    for row in logits:
        z = row / temperature
        order = np.argsort(-z, kind="stable")
        keep = np.zeros_like(z, bool)
        keep[order[: top_k or len(z)]] = True
        probs = np.exp(z - z.max())
        probs /= probs.sum()
        mass = 0.0
        nucleus = np.zeros_like(keep)
        for idx in order:  # smallest prefix whose mass reaches top_p (computed before top-k)
            if mass >= top_p:
                break
            nucleus[idx] = True
            mass += probs[idx]
        keep &= nucleus
        zk = np.where(keep, z, -np.inf)
        out.append(zk - np.log(np.exp(zk - zk.max()).sum()) - zk.max())
    return np.stack(out)


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 1.0), (0.5, 0, 1.0), (1.0, 3, 1.0), (1.0, 0, 0.6), (1.3, 0, 0.9)],
)
def test_process_logits_matches_numpy(temperature, top_k, top_p):
    logits = np.random.default_rng(0).normal(size=(4, 11)).astype(np.float32) * 2
    got = process_logits(jnp.asarray(logits), SamplingParams(temperature, top_k, top_p))
    want = numpy_reference(logits.astype(np.float64), temperature, top_k, top_p)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(np.asarray(got)[finite], want[finite], atol=1e-5)


def test_greedy_is_a_point_mass():
    logits = jnp.asarray([[0.1, 2.0, -1.0], [3.0, 0.0, 0.5]])
    lp = process_logits(logits, SamplingParams(greedy=True))
    np.testing.assert_array_equal(np.exp(lp), [[0, 1, 0], [1, 0, 0]])
    tokens, sampling_lp, policy_lp = sample_token(
        jax.random.key(0), logits, SamplingParams(greedy=True)
    )
    np.testing.assert_array_equal(tokens, [1, 0])
    np.testing.assert_array_equal(sampling_lp, [0.0, 0.0])
    np.testing.assert_allclose(policy_lp, jax.nn.log_softmax(logits)[jnp.arange(2), tokens])


def test_samples_follow_the_distribution():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.2]]))
    keys = jax.random.split(jax.random.key(0), 20000)
    tokens = jax.vmap(lambda k: sample_token(k, logits, SamplingParams())[0][0])(keys)
    freq = np.bincount(np.asarray(tokens), minlength=3) / len(keys)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.2], atol=0.015)


@pytest.mark.parametrize(
    "kwargs,match",
    [(dict(temperature=0.0), "temperature"), (dict(top_k=-1), "top_k"), (dict(top_p=0.0), "top_p")],
)
def test_bad_params_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_filtered_tokens_are_never_sampled():
    logits = jnp.asarray([[0.0, 5.0, 0.0, 4.0, -1.0, 4.5]])
    keys = jax.random.split(jax.random.key(1), 5000)
    draw = jax.vmap(lambda k: sample_token(k, logits, SamplingParams(top_k=2))[0][0])
    tokens = np.asarray(draw(keys))
    assert set(tokens.tolist()) == {1, 5}
    p = np.exp([5.0, 4.5]) / np.exp([5.0, 4.5]).sum()
    np.testing.assert_allclose((tokens == 1).mean(), p[0], atol=0.02)
