"""Tests for rljax.diffusion.likelihood on a tiny model whose every masked input can be listed.

The model sees a prompt of 1 token and a completion of 3 tokens over a vocabulary of 4 plus
MASK = 4, so there are 5^4 inputs; its logits are a lookup table over them. The exact value of
each estimator's expectation is computed in numpy by enumerating the 2^3 masks with their
probabilities, and the Monte Carlo means are checked within 5 standard errors.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

from rljax.diffusion import likelihood as lk

V, MASK, P, T = 4, 4, 1, 3
L_IN = P + T
CODES = (V + 1) ** L_IN


def _code(tokens):
    return sum(tokens[..., j] * (V + 1) ** j for j in range(L_IN))


def _with_table(estimator, static):
    """jit of estimator(logits_fn, ...) taking the lookup table as a traced first argument.

    One compile then serves every table of the same shape (compiles dominate the runtime).
    """

    def call(table, *args):
        return estimator(lambda tokens: table[_code(tokens)], *args)

    return jax.jit(call, static_argnums=static)


elbo_fixed_count = _with_table(lk.elbo_fixed_count, (5, 6))
elbo_random_t = _with_table(lk.elbo_random_t, (5, 6, 7))
masked_token_logprobs = _with_table(lk.masked_token_logprobs, (6,))
one_pass_estimate = _with_table(lk.one_pass_estimate, (5, 6))
rldf_logprobs = _with_table(lk.rldf_logprobs, (5,))
stratified_estimate = _with_table(lk.stratified_estimate, (5, 6))
rldf_states = jax.jit(lk.rldf_states, static_argnums=4)
rldf_step_weights = jax.jit(lk.rldf_step_weights, static_argnums=3)
rldf_timesteps = jax.jit(lk.rldf_timesteps, static_argnums=(4, 5, 6))
strata = jax.jit(lk.strata, static_argnums=1)


def _random_table(seed):
    return np.random.default_rng(seed).normal(size=(CODES, L_IN, V)).astype(np.float32) * 1.5


def _conditional_table(joint):
    """Logits = log p(x_i | visible tokens) of the joint [V]*L_IN at every masked position."""
    table = np.zeros((CODES, L_IN, V), np.float32)
    states = np.array(list(itertools.product(range(V), repeat=L_IN)))  # [V^L, L]
    probs = joint.reshape(-1)
    for tokens in itertools.product(range(V + 1), repeat=L_IN):
        tokens = np.array(tokens)
        visible = tokens != MASK
        consistent = (states[:, visible] == tokens[visible]).all(axis=1)
        for i in np.flatnonzero(~visible):
            marg = np.bincount(states[consistent, i], probs[consistent], minlength=V)
            table[_code(tokens), i] = np.log(marg / marg.sum())
    return table


def _np_logp(table, prompt, completion, masked):
    """numpy log p(clean completion token) at every completion position, one row."""
    tokens = np.concatenate([prompt, np.where(masked, MASK, completion)])
    logits = table[_code(tokens)][P:].astype(np.float64)
    logp = logits - special.logsumexp(logits, axis=-1, keepdims=True)
    return logp[np.arange(T), completion]


SUBSETS = [np.array(s, bool) for s in itertools.product([0, 1], repeat=T) if any(s)]


def _exact_elbo(table, prompt, completion, weight_of_size):
    """sum over nonempty masks S of weight(|S|) * sum_{i in S} log p(x_i | x with S masked)."""
    return sum(
        weight_of_size(s.sum()) * _np_logp(table, prompt, completion, s)[s].sum() for s in SUBSETS
    )


def _random_t_weight(eps, power):
    """m -> (1/(1-eps)) int_eps^1 t^(m-1+power) (1-t)^(T-m) dt (power 0: mean, -1: 2nd moment)."""

    def weight(m):
        f = lambda t: t ** (m - 1 + power) * (1 - t) ** (T - m)  # noqa: E731
        return integrate.quad(f, eps, 1.0, limit=200)[0] / (1.0 - eps)

    return weight


def _fixed_count_weight(m):
    """Probability of one mask of size m under l ~ U{1..T}, uniform subset, times T/m."""
    return (1.0 / T) / special.comb(T, m) * (T / m)


ROWS = [(np.array([1]), np.array([0, 3, 2])), (np.array([2]), np.array([1, 1, 0]))]


def _replicated(n):
    prompt = np.stack([ROWS[i % 2][0] for i in range(n)])
    completion = np.stack([ROWS[i % 2][1] for i in range(n)])
    return jnp.asarray(prompt), jnp.asarray(completion), jnp.ones((n, T), bool)


def _check_mc_mean(samples, exact):
    se = samples.std(ddof=1) / np.sqrt(len(samples))
    assert abs(samples.mean() - exact) < 5 * se, (samples.mean(), exact, se)
    assert se < 0.05 * max(1.0, abs(exact))  # the check is tight enough to mean something


def test_masked_token_logprobs_matches_lookup():
    table = _random_table(0)
    prompt, completion, valid = _replicated(2)
    valid = valid.at[1, 2].set(False)
    masked = jnp.array([[True, False, True], [False, True, False]])
    prompt_masked = jnp.array([[True], [False]])
    out = masked_token_logprobs(table, prompt, completion, valid, masked, prompt_masked, MASK)
    want0 = _np_logp(table, np.array([MASK]), np.array([0, 3, 2]), np.array([1, 0, 1], bool))
    # The invalid position 2 of row 1 is fed as MASK and scored 0.
    want1 = _np_logp(table, np.array([2]), np.array([1, 1, 0]), np.array([0, 1, 1], bool))
    want1[2] = 0.0
    np.testing.assert_allclose(out, np.stack([want0, want1]), rtol=1e-5, atol=1e-5)


def test_one_pass_masks_completion_and_prompt_at_rate_p():
    table, ref_table = _random_table(1), _random_table(2)
    n = 2000
    prompt, completion, valid = _replicated(n)
    rng = jax.random.PRNGKey(3)
    out = np.asarray(one_pass_estimate(table, prompt, completion, valid, rng, MASK, 0.3))
    ref = np.asarray(one_pass_estimate(ref_table, prompt, completion, valid, rng, MASK, 0.3))
    everything = np.ones(T, bool)
    hidden = [
        [_np_logp(t, np.array([MASK]), c, everything) for _, c in ROWS] for t in (table, ref_table)
    ]
    shown = [[_np_logp(t, p, c, everything) for p, c in ROWS] for t in (table, ref_table)]
    prompt_hidden = []
    for which, values in enumerate((out, ref)):
        flags = []
        for i in range(n):
            if np.allclose(values[i], hidden[which][i % 2], atol=1e-5):
                flags.append(True)
            else:
                np.testing.assert_allclose(values[i], shown[which][i % 2], atol=1e-5)
                flags.append(False)
        prompt_hidden.append(np.array(flags))
    # Same rng, same prompt mask for theta and ref; the rate is p (5 standard errors).
    np.testing.assert_array_equal(prompt_hidden[0], prompt_hidden[1])
    assert abs(prompt_hidden[0].mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / n)


def test_one_pass_with_no_prompt_masking_is_deterministic_lookup():
    table = _random_table(4)
    prompt, completion, valid = _replicated(2)
    out = one_pass_estimate(table, prompt, completion, valid, jax.random.PRNGKey(0), MASK, 0.0)
    want = [_np_logp(table, p, c, np.ones(T, bool)) for p, c in ROWS]
    np.testing.assert_allclose(out, np.stack(want), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="p_mask_prompt"):
        one_pass_estimate(table, prompt, completion, valid, jax.random.PRNGKey(0), 4, 2.0)


def test_exact_conditionals_make_the_elbo_tight():
    """With exact conditionals of a joint, the ELBO equals log p(completion | prompt).

    The ELBO is the average over orders of the any-order autoregressive log-likelihood, and
    every order gives log p exactly: this checks the enumeration weights 1 / (m C(T, m)).
    """
    joint = np.random.default_rng(5).dirichlet(np.full(V**L_IN, 0.5)).reshape([V] * L_IN)
    table = _conditional_table(joint)
    for prompt, completion in ROWS:
        log_lik = np.log(joint[(prompt[0], *completion)] / joint[prompt[0]].sum())
        np.testing.assert_allclose(
            _exact_elbo(table, prompt, completion, _fixed_count_weight), log_lik, rtol=1e-5
        )
        np.testing.assert_allclose(
            _exact_elbo(table, prompt, completion, _random_t_weight(0.0, 0)), log_lik, rtol=1e-5
        )
    # The estimator's Monte Carlo mean reaches the exact log-likelihood.
    n = 4000
    prompt, completion, valid = _replicated(n)
    est = elbo_fixed_count(table, prompt, completion, valid, jax.random.PRNGKey(6), MASK, 2)
    est = est.sum(axis=1)
    for r, (p, c) in enumerate(ROWS):
        log_lik = np.log(joint[(p[0], *c)] / joint[p[0]].sum())
        _check_mc_mean(np.asarray(est[r::2], np.float64), log_lik)


@pytest.mark.parametrize("estimator", ["random_t", "fixed_count"])
def test_elbo_estimators_are_unbiased_and_compare_variances(estimator):
    table = _random_table(7)
    n = 4000
    prompt, completion, valid = _replicated(n)
    fn = table
    eps = 1e-3
    if estimator == "random_t":
        est = elbo_random_t(fn, prompt, completion, valid, jax.random.PRNGKey(8), MASK, 2, eps)
        mean_w, second_w = _random_t_weight(eps, 0), _random_t_weight(eps, -1)
    else:
        est = elbo_fixed_count(fn, prompt, completion, valid, jax.random.PRNGKey(8), MASK, 2)
        mean_w = _fixed_count_weight
        second_w = lambda m: _fixed_count_weight(m) * T / m  # noqa: E731
    est = np.asarray(est.sum(axis=1), np.float64)
    for r, (p, c) in enumerate(ROWS):
        exact = _exact_elbo(table, p, c, mean_w)
        _check_mc_mean(est[r::2], exact)
        # Per-mask variance by enumeration; the sample (of the mean of 2 masks) agrees loosely.
        second = sum(second_w(s.sum()) * _np_logp(table, p, c, s)[s].sum() ** 2 for s in SUBSETS)
        var = second - exact**2
        if estimator == "fixed_count":  # random t: 1/t is heavy-tailed, its sample var unreliable
            assert 0.7 < est[r::2].var() / (var / 2) < 1.4
    # eps = 1e-3 moves the random-t target by O(eps) from the eps = 0 ELBO.
    p, c = ROWS[0]
    gap = _exact_elbo(table, p, c, _random_t_weight(eps, 0)) - _exact_elbo(
        table, p, c, _fixed_count_weight
    )
    assert abs(gap) < 20 * eps


def test_fixed_count_has_lower_variance_than_random_t_on_this_model():
    """Exact per-mask variances on the toy model (a property of this instance, not a theorem)."""
    table = _random_table(7)
    for p, c in ROWS:
        moments = []
        for mean_w, second_w in (
            (_random_t_weight(1e-3, 0), _random_t_weight(1e-3, -1)),
            (_fixed_count_weight, lambda m: _fixed_count_weight(m) * T / m),
        ):
            terms = [(s.sum(), _np_logp(table, p, c, s)[s].sum()) for s in SUBSETS]
            mean = sum(mean_w(m) * x for m, x in terms)
            moments.append(sum(second_w(m) * x**2 for m, x in terms) - mean**2)
        assert moments[1] < moments[0]


def test_fixed_count_with_one_valid_token_is_exact():
    table = _random_table(9)
    prompt, completion, _ = _replicated(2)
    valid = jnp.array([[False, True, False], [True, False, False]])
    out = elbo_fixed_count(table, prompt, completion, valid, jax.random.PRNGKey(0), MASK, 2)
    want = np.zeros((2, T))
    for r, (p, c) in enumerate(ROWS):
        only = np.asarray(valid[r])
        # Invalid positions are fed as MASK too, so everything is masked.
        want[r, only] = _np_logp(table, p, c, np.ones(T, bool))[only]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_strata_cover_each_valid_position_once():
    n = 3000
    valid = np.ones((n, 8), bool)
    valid[:, 1] = valid[:, 7] = False
    valid[-1] = False
    for rng in (None, jax.random.PRNGKey(0)):
        s = np.asarray(strata(jnp.asarray(valid), 3, rng))
        assert (s[~valid] == -1).all()
        assert (s[valid] >= 0).all()
        for row in s[:5]:
            assert sorted(np.bincount(row[valid[0]], minlength=3).tolist()) == [2, 2, 2]
        if rng is None:  # interleaved: rank among valid positions mod K
            np.testing.assert_array_equal(s[0], [0, -1, 1, 2, 0, 1, 2, -1])
        else:  # a uniform permutation: every valid position is in stratum j w.p. 1/3
            for j in range(3):
                freq = (s[:-1][:, valid[0]] == j).mean(axis=0)
                assert abs(freq - 1 / 3).max() < 5 * np.sqrt(2 / 9 / (n - 1))


def test_stratified_estimate_matches_reference_and_k1_is_one_pass():
    table = _random_table(10)
    prompt, completion, valid = _replicated(2)
    rng = jax.random.PRNGKey(11)
    out = np.asarray(stratified_estimate(table, prompt, completion, valid, rng, MASK, 2))
    s = np.asarray(lk.strata(valid, 2, rng))
    for r, (p, c) in enumerate(ROWS):
        want = np.zeros(T)
        for k in range(2):
            m = s[r] == k
            want[m] = _np_logp(table, p, c, m)[m]
        np.testing.assert_allclose(out[r], want, rtol=1e-5, atol=1e-5)
    k1 = stratified_estimate(table, prompt, completion, valid, rng, MASK, 1)
    one = one_pass_estimate(table, prompt, completion, valid, rng, MASK, 0.0)
    np.testing.assert_allclose(k1, one, rtol=1e-6)
    # K = T, interleaved: leave-one-out (each token masked alone).
    loo = np.asarray(stratified_estimate(table, prompt, completion, valid, None, MASK, T))
    for r, (p, c) in enumerate(ROWS):
        want = [_np_logp(table, p, c, np.eye(T, dtype=bool)[i])[i] for i in range(T)]
        np.testing.assert_allclose(loo[r], want, rtol=1e-5, atol=1e-5)


STEP_MAP = np.array([[0, 0, 1, 3, 3, 3], [2, 1, 0, 0, 2, 1]], np.int32)
PROBS = np.array([[0.9, 0.5, 0.2, 0.7, 0.1, 0.4], [0.3, 0.8, 0.6, 0.9, 0.5, 0.25]], np.float32)
VALID = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], bool)


def test_rldf_step_weights_hand_values():
    w, decoded = rldf_step_weights(jnp.array(STEP_MAP), jnp.array(PROBS), jnp.array(VALID), 4)
    lg = np.log
    want = [
        [-(lg(0.9) + lg(0.5)) / 2, -lg(0.2), 0.0, -(lg(0.7) + lg(0.1) + lg(0.4)) / 3],
        [-(lg(0.6) + lg(0.9)) / 2, -lg(0.8), -(lg(0.3) + lg(0.5)) / 2, 0.0],  # 0.25 invalid
    ]
    np.testing.assert_allclose(w, want, rtol=1e-5)
    np.testing.assert_array_equal(decoded, [[1, 1, 0, 1], [1, 1, 1, 0]])


def test_rldf_timestep_frequencies_follow_softmax():
    n = 6000
    step_map = jnp.tile(jnp.array(STEP_MAP[:1]), (n, 1))
    probs = jnp.tile(jnp.array(PROBS[:1]), (n, 1))
    valid = jnp.ones_like(step_map, bool)
    steps = np.asarray(rldf_timesteps(jax.random.PRNGKey(0), step_map, probs, valid, 4, 1))
    lg = np.log
    w = -np.array([(lg(0.9) + lg(0.5)) / 2, lg(0.2), (lg(0.7) + lg(0.1) + lg(0.4)) / 3])
    expected = np.exp(w) / np.exp(w).sum() * n
    counts = np.bincount(steps[:, 0], minlength=4)
    assert counts[2] == 0  # step 2 decoded nothing
    assert stats.chisquare(counts[[0, 1, 3]], expected).pvalue > 1e-3


def test_rldf_timesteps_without_replacement_when_enough_steps():
    sm, pr, va = jnp.array(STEP_MAP), jnp.array(PROBS), jnp.array(VALID)
    steps = np.asarray(rldf_timesteps(jax.random.PRNGKey(0), sm, pr, va, 4, 3))
    for row, allowed in zip(steps, ({0, 1, 3}, {0, 1, 2})):
        assert set(row.tolist()) == allowed  # 3 decoded steps, k = 3: each exactly once
    # k = 6 > 3 decoded steps: with replacement, still only decoded steps.
    steps = np.asarray(rldf_timesteps(jax.random.PRNGKey(2), sm, pr, va, 4, 6))
    assert steps.shape == (2, 6)
    assert set(steps[0].tolist()) <= {0, 1, 3} and set(steps[1].tolist()) <= {0, 1, 2}


def test_rldf_states_mask_exactly_later_steps_and_clip():
    steps = jnp.array([[1, 3], [0, 2]], jnp.int32)
    sm, va, pr = jnp.array(STEP_MAP), jnp.array(VALID), jnp.array(PROBS)
    masked, scored = rldf_states(sm, steps, va)
    want = STEP_MAP[:, None, :] >= np.asarray(steps)[:, :, None]
    np.testing.assert_array_equal(masked, want)
    np.testing.assert_array_equal(scored, want & VALID[:, None, :])
    _, clipped = rldf_states(sm, steps, va, pr, 0.6)
    # Row 0, s = 1: masked are positions 2..5; keep p >= 0.6 (pos 3) and step 1 (pos 2).
    np.testing.assert_array_equal(clipped[0, 0], [0, 0, 1, 1, 0, 0])
    # Row 0, s = 3: all decoded at s, all kept.
    np.testing.assert_array_equal(clipped[0, 1], [0, 0, 0, 1, 1, 1])
    # Row 1, s = 0: everything masked; keep step-0 tokens (2, 3) and p >= 0.6 (1, 2, 3).
    np.testing.assert_array_equal(clipped[1, 0], [0, 1, 1, 1, 0, 0])
    # Row 1, s = 2: positions 0, 4 (both decoded at 2; position 5 has step 1).
    np.testing.assert_array_equal(clipped[1, 1], [1, 0, 0, 0, 1, 0])
    with pytest.raises(ValueError, match="token_probs"):
        lk.rldf_states(sm, steps, va, None, 0.6)


STEP_MAP_SMALL = np.array([[0, 2, 1], [1, 0, 0]])


def test_rldf_logprobs_score_the_states():
    table = _random_table(12)
    prompt, completion, _ = _replicated(2)
    valid = jnp.array([[False, True, True], [True, True, True]])
    step_map = jnp.asarray(STEP_MAP_SMALL, jnp.int32)
    steps = jnp.array([[1, 2], [0, 1]], jnp.int32)
    masked, scored = rldf_states(step_map, steps, valid)
    out = np.asarray(rldf_logprobs(table, prompt, completion, masked, scored, MASK))
    for r, (p, c) in enumerate(ROWS):
        for j in range(2):
            # The input is x_s exactly: row 0's invalid position 0 (step 0) stays visible.
            m = STEP_MAP_SMALL[r] >= np.asarray(steps)[r, j]
            want = np.where(m & np.asarray(valid[r]), _np_logp(table, p, c, m), 0.0)
            np.testing.assert_allclose(out[r, j], want, rtol=1e-5, atol=1e-5)


def test_gradients_flow_through_the_estimate_to_the_model():
    """d/d table of sum_t log softmax(table[code])[t, x_t] is onehot - softmax at that code."""
    table = _random_table(13)
    prompt, completion, valid = _replicated(2)
    rng = jax.random.PRNGKey(0)
    grad = jax.grad(
        lambda tb: one_pass_estimate(tb, prompt, completion, valid, rng, MASK, 0.0).sum()
    )(jnp.asarray(table))
    want = np.zeros_like(table)
    for p, c in ROWS:
        code = _code(np.concatenate([p, np.full(T, MASK)]))
        logits = table[code, P:].astype(np.float64)
        soft = np.exp(logits - special.logsumexp(logits, axis=-1, keepdims=True))
        want[code, P:] += np.eye(V)[c] - soft
    np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-5)
