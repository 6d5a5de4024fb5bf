"""rljax.objectives.segment_po against a loop-based numpy reference and its GSPO/PPO limits."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rljax.core.batch import make_batch
from rljax.objectives.gspo import gspo
from rljax.objectives.segment_po import segment_ids, segment_po
from rljax.objectives.surrogate import ppo_clip

DELIM = 9
seg_ids = jax.jit(segment_ids, static_argnames="delimiter_ids")
OBJ = jax.jit(segment_po((DELIM,), 0.2, 0.2))

# Hand case, delimiter 9, eps 0.2, per-token log-ratios LR:
#   row 0 tokens [1, 9 | 2, 9]: seg 0 lr [0.3, 0.1] -> s = e^0.2 = 1.2214, A = mean[1, 1] = 1
#       -> clipped, l = -1.2; seg 1 lr [0.0, 0.1] -> s = e^0.05, A = mean[2, 0] = 1 -> -e^0.05
#   row 1 tokens [9 | 3, 3, pad]: seg 0 lr [-0.5] -> s = e^-0.5 = 0.6065, A = -1 -> clipped,
#       l = 0.8; seg 1 lr [-0.1, -0.3] -> s = e^-0.2 = 0.8187, A = -1 -> inside, l = e^-0.2
TOKENS = np.array([[1, 9, 2, 9], [9, 3, 3, 0]], np.int32)
MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
LR = np.array([[0.3, 0.1, 0.0, 0.1], [-0.5, -0.1, -0.3, 7.0]], np.float32)
ADV = np.array([[1.0, 1.0, 2.0, 0.0], [-1.0, -1.0, -1.0, 0.0]], np.float32)
OLD = np.array([[-1.0, -2.0, -0.5, -1.5], [-0.7, -1.5, -2.5, -1.0]], np.float32)
NEW = OLD + LR


def make(tokens=TOKENS, mask=MASK, old=OLD, adv=ADV, loss_weights=None):
    b, t = mask.shape
    return make_batch(
        prompt_tokens=np.zeros((b, 1)),
        prompt_mask=np.ones((b, 1)),
        completion_tokens=tokens,
        completion_mask=mask,
        group_id=np.arange(b),
        rewards=np.zeros(b),
        old_logprobs=old,
        advantages=np.asarray(adv) * mask,
        loss_weights=loss_weights,
    )


def segments_reference(tokens, mask, delims):
    """Lists of token positions, one list per segment, per row (valid tokens only)."""
    rows = []
    for i in range(mask.shape[0]):
        segs, cur = [], []
        for j in range(mask.shape[1]):
            if not mask[i, j]:
                continue
            cur.append(j)
            if int(tokens[i, j]) in delims:
                segs.append(cur)
                cur = []
        if cur:
            segs.append(cur)
        rows.append(segs)
    return rows


def reference(new, old, adv, tokens, mask, delims, eps_low, eps_high, weights=None):
    """segment_po one segment at a time: (token-mean loss, clip_frac, segs/row, ratio_mean)."""
    weights = mask.astype(float) if weights is None else weights
    per_token = np.zeros(mask.shape)
    ratios, n_clipped = [], 0
    rows = segments_reference(tokens, mask, delims)
    for i, segs in enumerate(rows):
        for seg in segs:
            lr = [min(max(float(new[i, j]) - float(old[i, j]), -20.0), 20.0) for j in seg]
            s = math.exp(sum(lr) / len(seg))
            a = sum(float(adv[i, j]) for j in seg) / len(seg)
            un, cl = -s * a, -min(max(s, 1 - eps_low), 1 + eps_high) * a
            n_clipped += cl > un
            ratios.append(s)
            for j in seg:
                per_token[i, j] = max(un, cl)
    n_rows = sum(1 for segs in rows if segs)
    loss = (per_token * weights).sum() / weights.sum()
    return loss, n_clipped / len(ratios), len(ratios) / n_rows, float(np.mean(ratios))


def test_segment_ids_hand_cases():
    tokens = np.array([[5, 9, 7, 9, 3, 0], [9, 1, 9, 9, 9, 9], [9, 9, 9, 9, 9, 9]], np.int32)
    mask = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
    out = seg_ids(jnp.array(tokens), jnp.array(mask), delimiter_ids=(9,))
    # A delimiter ends its segment; padded delimiters (row 1, t >= 2) close nothing.
    np.testing.assert_array_equal(out, [[0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1], [0, 1, 2, 3, 4, 5]])
    assert out.dtype == jnp.int32
    two = segment_ids(jnp.array(tokens[:1]), jnp.array(mask[:1]), (9, 7))
    np.testing.assert_array_equal(two, [[0, 0, 1, 2, 3, 3]])
    none = segment_ids(jnp.array(tokens), jnp.array(mask), ())
    np.testing.assert_array_equal(none, np.zeros((3, 6)))


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(0, 3), min_size=12, max_size=12),
    st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_segment_ids_match_reference(tokens, mask):
    tokens, mask = np.array(tokens, np.int32).reshape(2, 6), np.array(mask).reshape(2, 6)
    out = np.asarray(seg_ids(jnp.array(tokens), jnp.array(mask), delimiter_ids=(1, 2)))
    for i, segs in enumerate(segments_reference(tokens, mask, (1, 2))):
        for k, seg in enumerate(segs):
            np.testing.assert_array_equal(out[i, seg], k)
    assert np.all(np.diff(out, axis=1) >= 0) and out.min() >= 0 and out.max() <= 5


def test_loss_metrics_and_gradient_match_hand_values():
    (loss, metrics), grad = jax.value_and_grad(OBJ, has_aux=True)(
        jnp.array(NEW), jnp.zeros((2, 4)), make()
    )
    hand = (-1.2 * 2 - np.exp(0.05) * 2 + 0.8 + np.exp(-0.2) * 2) / 7
    ref = reference(NEW, OLD, ADV, TOKENS, MASK, (DELIM,), 0.2, 0.2)
    np.testing.assert_allclose(ref[0], hand, rtol=1e-6)
    np.testing.assert_allclose(loss, hand, rtol=1e-5)
    np.testing.assert_allclose(metrics["segment_po/loss"], loss)
    np.testing.assert_allclose(metrics["segment_po/clip_frac"], 0.5)
    np.testing.assert_allclose(metrics["segment_po/segments_per_row"], 2.0)
    ratios = np.exp([0.2, 0.05, -0.5, -0.2])
    np.testing.assert_allclose(metrics["segment_po/ratio_mean"], ratios.mean(), rtol=1e-5)
    np.testing.assert_allclose(ref[1:], [0.5, 2.0, ratios.mean()], rtol=1e-6)
    # d l_k / d logp_t = -A_k s_k / |S_k| on an unclipped segment, and l_k sits on |S_k| of the
    # 7 tokens of the token mean: the gradient is -A_k s_k / 7; 0 on a clipped segment.
    expected = np.zeros((2, 4))
    expected[0, 2:] = -1.0 * np.exp(0.05) / 7
    expected[1, 1:3] = 1.0 * np.exp(-0.2) / 7
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-7)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.integers(8, 9), min_size=15, max_size=15),
    st.lists(st.booleans(), min_size=15, max_size=15),
    st.lists(st.floats(-0.5, 0.5, width=32, allow_subnormal=False), min_size=15, max_size=15),
    st.lists(st.floats(-2.0, 2.0, width=32, allow_subnormal=False), min_size=15, max_size=15),
)
def test_loss_matches_reference_on_random_batches(tokens, mask, lr, adv):
    shape = (3, 5)
    tokens, mask = np.array(tokens, np.int32).reshape(shape), np.array(mask).reshape(shape)
    if not mask.any():
        mask[0, 0] = True
    lr, adv = np.array(lr, np.float32).reshape(shape), np.array(adv, np.float32).reshape(shape)
    # Tiny |A| (~1e-38) makes -A * ratio subnormal, which XLA on CPU flushes to zero: round it
    # away so "clipped" is decided the same way in numpy and XLA.
    adv = np.round(adv, 3)
    new = OLD[:1, :1] + np.zeros(shape, np.float32) + lr
    old = np.broadcast_to(OLD[:1, :1], shape)
    loss, metrics = OBJ(jnp.array(new), jnp.zeros(shape), make(tokens, mask, old, adv))
    ref = reference(new, old, adv * mask, tokens, mask, (DELIM,), 0.2, 0.2)
    np.testing.assert_allclose(loss, ref[0], rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["segment_po/clip_frac"], ref[1], atol=1e-6)
    np.testing.assert_allclose(metrics["segment_po/segments_per_row"], ref[2], rtol=1e-6)
    np.testing.assert_allclose(metrics["segment_po/ratio_mean"], ref[3], rtol=1e-5)


# A batch with token-varying advantages, a padded tail with garbage, and a zeroed loss weight.
WIDE_MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]], bool)
WIDE_TOKENS = np.array([[9, 1, 9, 2, 9], [3, 9, 4, 9, 9], [5, 6, 9, 7, 9]], np.int32)
WIDE_LR = np.array(
    [[0.05, -0.1, 0.3, 0.02, -0.4], [0.1, 0.15, -0.05, 5.0, 5.0], [-0.3, 0.0, 0.1, 0.2, 0.0]],
    np.float32,
)
WIDE_ADV = np.array(
    [[1.0, 0.5, 1.5, 1.0, 1.0], [-1.0, -2.0, 0.0, 0.0, 0.0], [0.5, -0.5, 1.0, 0.2, 0.0]],
    np.float32,
)
WIDE_OLD = np.linspace(-3.0, -0.1, 15, dtype=np.float32).reshape(3, 5)
WIDE_W = WIDE_MASK.astype(np.float32)
WIDE_W[2, 1] = 0.0


def _value_and_grad(obj, tokens):
    batch = make(tokens, WIDE_MASK, WIDE_OLD, WIDE_ADV, WIDE_W)
    fn = jax.value_and_grad(lambda lp: obj(lp, jnp.zeros((3, 5)), batch)[0])
    return fn(jnp.array(WIDE_OLD + WIDE_LR))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_no_delimiters_equals_gspo(aggregation):
    # One segment per row: s is GSPO's sequence ratio over completion_mask tokens and A the row
    # mean advantage, the loss is written on every token and aggregated the same way, so loss
    # and gradient equal gspo's with the same aggregation (gspo defaults to seq-mean-token-mean).
    l_segment_po, g_segment_po = _value_and_grad(
        segment_po((), 0.1, 0.15, aggregation), WIDE_TOKENS
    )
    l_gspo, g_gspo = _value_and_grad(gspo(0.1, 0.15, aggregation), WIDE_TOKENS)
    np.testing.assert_allclose(l_segment_po, l_gspo, rtol=1e-6)
    np.testing.assert_allclose(g_segment_po, g_gspo, rtol=1e-5, atol=1e-8)
    # A delimiter id that never occurs acts the same.
    l_unused, _ = _value_and_grad(segment_po((42,), 0.1, 0.15, aggregation), WIDE_TOKENS)
    np.testing.assert_allclose(l_unused, l_gspo, rtol=1e-6)
    assert np.any(np.asarray(g_gspo) != 0)


def test_every_token_a_delimiter_equals_ppo_clip():
    tokens = np.full((3, 5), DELIM, np.int32)
    l_segment_po, g_segment_po = _value_and_grad(segment_po((DELIM,), 0.1, 0.15), tokens)
    l_ppo, g_ppo = _value_and_grad(ppo_clip(0.1, 0.15), tokens)
    np.testing.assert_allclose(l_segment_po, l_ppo, rtol=1e-6)
    np.testing.assert_allclose(g_segment_po, g_ppo, rtol=1e-5, atol=1e-8)
    assert np.any(np.asarray(g_ppo) != 0)


def test_masked_rows_and_garbage_padding_stay_finite():
    mask = MASK.copy()
    mask[1] = False  # a fully masked row
    new = NEW.copy()
    new[~mask] = 1e4
    (loss, metrics), grad = jax.value_and_grad(OBJ, has_aux=True)(
        jnp.array(new), jnp.zeros((2, 4)), make(mask=mask)
    )
    np.testing.assert_allclose(loss, (-1.2 * 2 - np.exp(0.05) * 2) / 4, rtol=1e-5)
    assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[~mask] == 0)
    assert all(np.isfinite(v) for v in metrics.values())
    np.testing.assert_allclose(metrics["segment_po/segments_per_row"], 2.0)
    empty = make(mask=np.zeros((2, 4), bool))
    loss, metrics = OBJ(jnp.array(new), jnp.zeros((2, 4)), empty)
    assert loss == 0 and all(np.isfinite(v) for v in metrics.values())


def test_errors():
    with pytest.raises(ValueError, match="eps_low=1.0"):
        segment_po((DELIM,), eps_low=1.0)
    with pytest.raises(ValueError, match="eps_high=-0.1"):
        segment_po((DELIM,), eps_high=-0.1)
    with pytest.raises(ValueError, match="valid modes"):
        segment_po((DELIM,), aggregation="sum")
    with pytest.raises(ValueError, match=r"delimiter_ids=9 must be a tuple.*\(9,\)"):
        segment_po(9)
    with pytest.raises(ValueError, match="non-integers"):
        segment_po((9, 1.5))
    with pytest.raises(ValueError, match="non-integers"):
        segment_ids(jnp.zeros((1, 2), jnp.int32), jnp.ones((1, 2), bool), ("\n",))
