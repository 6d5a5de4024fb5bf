"""Tests for rljax.objectives.gspo against a loop-based numpy reference of the GSPO paper."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.objectives.gspo import gspo, gspo_token, sequence_log_ratio

# Four sequences, per-token log-ratios log(pi_new / pi_old) on the valid tokens; with eps 0.2:
#   row 0: [0.3, 0.1]        mean 0.2  -> s = e^0.2 = 1.2214, A = +1 -> clipped at 1.2, loss -1.2
#   row 1: [0.1, -0.1, 0.3]  mean 0.1  -> s = e^0.1 = 1.1052, A = +2 -> inside, loss -2.2103
#   row 2: [-0.6, 0.0]       mean -0.3 -> s = e^-0.3 = 0.7408, A = -1 -> clipped at 0.8, loss 0.8
#   row 3: [-0.9]            mean -0.9 -> s = e^-0.9 = 0.4066, A = +1 -> unclipped (below band
#                                         with A > 0), loss -0.4066
MASK = np.array([[1, 1, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0]], bool)
LOG_RATIO = np.array([[0.3, 0.1, 0.0], [0.1, -0.1, 0.3], [-0.6, 0.0, 0.0], [-0.9, 0.0, 0.0]])
SEQ_ADV = np.array([1.0, 2.0, -1.0, 1.0])
OLD = np.array(
    [[-1.0, -2.0, -0.5], [-3.0, -1.0, -2.0], [-0.7, -1.5, -2.5], [-1.2, -0.3, -4.0]], np.float32
)
NEW = (OLD + LOG_RATIO).astype(np.float32)
ENT = jnp.zeros((4, 3))


def make(adv, mask=MASK, loss_weights=None):
    return make_batch(
        prompt_tokens=np.zeros((4, 1)),
        prompt_mask=np.ones((4, 1)),
        completion_tokens=np.zeros((4, 3)),
        completion_mask=mask,
        group_id=np.array([0, 0, 1, 1]),
        rewards=np.zeros(4),
        old_logprobs=OLD,
        advantages=np.asarray(adv) * mask,
        loss_weights=loss_weights,
    )


def const_adv(seq_adv=SEQ_ADV):
    return np.repeat(np.asarray(seq_adv)[:, None], 3, axis=1)


def reference(new, old, adv, mask, eps_low, eps_high, weights=None):
    """GSPO per the paper, one sequence at a time: returns (loss, clip_frac, s)."""
    weights = mask if weights is None else weights
    losses, n_clipped, s_all = [], 0, []
    for i in range(mask.shape[0]):
        idx = [j for j in range(mask.shape[1]) if mask[i, j]]
        if not idx:
            continue
        s = np.exp(sum(float(new[i, j]) - float(old[i, j]) for j in idx) / len(idx))
        a = sum(float(adv[i, j]) for j in idx) / len(idx)
        un, cl = -s * a, -min(max(s, 1 - eps_low), 1 + eps_high) * a
        n_clipped += cl > un
        s_all.append(s)
        if any(weights[i, j] > 0 for j in range(mask.shape[1])):
            losses.append(max(un, cl))
    return sum(losses) / len(losses), n_clipped / len(s_all), np.array(s_all)


def test_sequence_log_ratio_is_masked_mean():
    out = jax.jit(sequence_log_ratio)(jnp.array(NEW), jnp.array(OLD), jnp.array(MASK))
    np.testing.assert_allclose(out, [0.2, 0.1, -0.3, -0.9], rtol=1e-5, atol=1e-6)
    empty = sequence_log_ratio(jnp.ones((1, 2)), jnp.zeros((1, 2)), jnp.zeros((1, 2), bool))
    np.testing.assert_array_equal(empty, [0.0])


def test_loss_and_clip_frac_match_hand_values_and_reference():
    obj = jax.jit(gspo(eps_low=0.2, eps_high=0.2))
    loss, metrics = obj(jnp.array(NEW), ENT, make(const_adv()))
    hand = (-1.2 - 2.0 * np.exp(0.1) + 0.8 - np.exp(-0.9)) / 4
    ref_loss, ref_clip, s = reference(NEW, OLD, const_adv(), MASK, 0.2, 0.2)
    np.testing.assert_allclose(ref_loss, hand, rtol=1e-6)
    np.testing.assert_allclose(loss, hand, rtol=1e-5)
    np.testing.assert_allclose(metrics["gspo/loss"], loss)
    np.testing.assert_allclose(metrics["gspo/clip_frac"], 0.5)  # rows 0 and 2
    np.testing.assert_allclose(ref_clip, 0.5)
    np.testing.assert_allclose(metrics["gspo/ratio_mean"], s.mean(), rtol=1e-5)
    np.testing.assert_allclose(metrics["gspo/ratio_max"], np.exp(0.2), rtol=1e-5)
    np.testing.assert_allclose(metrics["gspo/ratio_min"], np.exp(-0.9), rtol=1e-5)
    r = np.exp(LOG_RATIO[MASK])
    np.testing.assert_allclose(
        metrics["gspo/approx_kl"], np.mean(r - 1 - LOG_RATIO[MASK]), rtol=1e-5
    )


def test_gradient_zero_on_clipped_sequences_and_length_normalised():
    grad = jax.grad(lambda lp: gspo(0.2, 0.2)(lp, ENT, make(const_adv()))[0])(jnp.array(NEW))
    # d l_i / d logp_t = -A_i * s_i / |y_i| on an unclipped sequence, then / 4 sequences.
    expected = np.zeros((4, 3))
    expected[1] = -2.0 * np.exp(0.1) / 3 / 4
    expected[3, 0] = -1.0 * np.exp(-0.9) / 1 / 4
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


def test_paper_default_clip_range_is_tiny():
    # Mean log-ratio 1e-4 (s - 1 ~ 1e-4) is inside [1 - 3e-4, 1 + 4e-4]; 1e-3 is above it.
    lr = np.array([[1e-4, 1e-4, 1e-4], [1e-3, 1e-3, 1e-3], [0, 0, 0], [0, 0, 0]])
    new = (OLD + lr).astype(np.float32)
    mask = np.ones((4, 3), bool)
    adv = const_adv([1.0, 1.0, 0.0, 0.0])
    loss, metrics = gspo()(jnp.array(new), ENT, make(adv, mask))
    ref_loss, ref_clip, _ = reference(new, OLD, adv, mask, 3e-4, 4e-4)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(loss, (-np.exp(1e-4) - 1.0004) / 4, rtol=1e-5)
    # Rows 2 and 3 have A = 0: both terms are 0, nothing counts as clipped.
    np.testing.assert_allclose(metrics["gspo/clip_frac"], ref_clip)
    np.testing.assert_allclose(ref_clip, 0.25)


def test_token_variant_equals_sequence_variant_for_constant_advantages():
    # The paper's remark: same value, clipping and gradient when A is constant per row.
    batch = make(const_adv())
    seq_obj, tok_obj = gspo(0.2, 0.2), jax.jit(gspo_token(0.2, 0.2))
    (l_seq, m_seq), g_seq = jax.value_and_grad(seq_obj, has_aux=True)(jnp.array(NEW), ENT, batch)
    (l_tok, m_tok), g_tok = jax.value_and_grad(tok_obj, has_aux=True)(jnp.array(NEW), ENT, batch)
    np.testing.assert_allclose(l_tok, l_seq, rtol=1e-6)
    np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)
    # Token clip fraction: rows 0 and 2 are clipped on all their 4 of 8 valid tokens.
    np.testing.assert_allclose(m_tok["gspo_token/clip_frac"], 4 / 8)
    np.testing.assert_allclose(m_tok["gspo_token/ratio_mean"], m_seq["gspo/ratio_mean"])


def test_token_variant_same_value_different_gradient_for_token_advantages():
    # Token advantages with row means SEQ_ADV and one sign per row: values agree, gradients not.
    adv = np.array([[0.5, 1.5, 0.0], [1.0, 2.0, 3.0], [-0.5, -1.5, 0.0], [1.0, 0.0, 0.0]])
    batch = make(adv)
    l_seq, g_seq = jax.value_and_grad(lambda lp: gspo(0.2, 0.2)(lp, ENT, batch)[0])(jnp.array(NEW))
    l_tok, g_tok = jax.value_and_grad(lambda lp: gspo_token(0.2, 0.2)(lp, ENT, batch)[0])(
        jnp.array(NEW)
    )
    np.testing.assert_allclose(l_tok, l_seq, rtol=1e-6)
    # Sequence variant: every token of row 1 gets -mean(A) s / 3 / 4; token variant: -A_t s / 12.
    s1 = np.exp(0.1)
    np.testing.assert_allclose(g_seq[1], [-2.0 * s1 / 12] * 3, rtol=1e-5)
    np.testing.assert_allclose(g_tok[1], -np.array([1.0, 2.0, 3.0]) * s1 / 12, rtol=1e-5)
    # Clipped rows 0 and 2 get zero gradient in both.
    for g in (g_seq, g_tok):
        np.testing.assert_allclose(np.asarray(g)[[0, 2]], 0.0, atol=1e-8)
    np.testing.assert_allclose(g_tok[3], g_seq[3], rtol=1e-6)


def test_token_variant_matches_per_token_reference():
    adv = np.array([[0.5, -1.5, 0.0], [1.0, 2.0, -3.0], [-0.5, 1.5, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = gspo_token(0.1, 0.15)(jnp.array(NEW), ENT, make(adv))
    total = 0.0
    for i in range(4):
        idx = [j for j in range(3) if MASK[i, j]]
        s = np.exp(np.mean([LOG_RATIO[i, j] for j in idx]))
        row = [max(-s * adv[i, j], -min(max(s, 0.9), 1.15) * adv[i, j]) for j in idx]
        total += np.mean(row)
    np.testing.assert_allclose(loss, total / 4, rtol=1e-5)


def test_zero_weight_rows_drop_out_and_padding_garbage_stays_finite():
    mask = MASK.copy()
    mask[3] = False  # an empty row
    weights = mask.astype(np.float32)
    weights[2] = 0.0  # a row a filter removed
    new = NEW.copy()
    new[~mask] = 1e4  # garbage log-probs at padded positions
    for obj, name in ((gspo(0.2, 0.2), "gspo"), (gspo_token(0.2, 0.2), "gspo_token")):
        (loss, metrics), grad = jax.value_and_grad(obj, has_aux=True)(
            jnp.array(new), ENT, make(const_adv(), mask, weights)
        )
        ref_loss, _, _ = reference(new, OLD, const_adv(), mask, 0.2, 0.2, weights)
        np.testing.assert_allclose(ref_loss, (-1.2 - 2.0 * np.exp(0.1)) / 2, rtol=1e-6)
        np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
        assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)
        assert all(np.isfinite(v) for v in metrics.values())
        np.testing.assert_allclose(metrics[f"{name}/ratio_min"], np.exp(-0.3), rtol=1e-5)


def test_token_mean_aggregation_weighs_by_length():
    loss, _ = gspo(0.2, 0.2, aggregation="token-mean")(jnp.array(NEW), ENT, make(const_adv()))
    seq_losses = np.array([-1.2, -2.0 * np.exp(0.1), 0.8, -np.exp(-0.9)])
    lengths = MASK.sum(axis=1)
    np.testing.assert_allclose(loss, (seq_losses * lengths).sum() / lengths.sum(), rtol=1e-5)


def test_on_policy_loss_is_minus_mean_sequence_advantage():
    loss, metrics = gspo()(jnp.array(OLD), ENT, make(const_adv()))
    np.testing.assert_allclose(loss, -SEQ_ADV.mean(), rtol=1e-6)
    assert metrics["gspo/clip_frac"] == 0 and metrics["gspo/approx_kl"] == 0


def test_errors():
    for factory in (gspo, gspo_token):
        with pytest.raises(ValueError, match="eps_low=1.0"):
            factory(eps_low=1.0)
        with pytest.raises(ValueError, match="eps_high=-0.1"):
            factory(eps_high=-0.1)
        with pytest.raises(ValueError, match="valid modes"):
            factory(aggregation="sum")
