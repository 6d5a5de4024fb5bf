"""Block-wise masked-diffusion sampler: the transfer schedule, greedy AR order, confidence
remasking, step maps and token probabilities against a replay of the denoising states.

(Named test_diffusion_sampler.py: tests/rollout/test_sampler.py already holds the basename and
pytest's default import mode rejects two test modules of one name.)
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.diffusion.policy import create_diffusion_model, diffusion_config, masked_logits
from rljax.diffusion.sampler import diffusion_generate, num_transfer_tokens

CONFIG = diffusion_config(
    11, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, rope_theta=10.0
)
MASK = CONFIG.mask_id
V = CONFIG.model.vocab_size
# Rows 0 and 1 are the same prompt with different pad values; row 2 has no padding.
PROMPTS = jnp.array([[0, 0, 3, 4], [9, 9, 3, 4], [5, 6, 7, 8]], jnp.int32)
PROMPT_MASK = jnp.array([[False, False, True, True]] * 2 + [[True] * 4])
P = PROMPTS.shape[1]
G, BLOCK, STEPS = 8, 4, 3  # two blocks of 4 tokens, 3 steps each: 2, 1, 1 tokens per step
LOGITS = jax.jit(masked_logits, static_argnums=0, static_argnames=("mask_id",))


def _scale(path, x):
    """Sharper, position-dependent predictions than the 0.02-std init gives (fewer ties)."""
    name = "/".join(str(k) for k in path)
    for part, factor in (("lm_head", 20.0), ("q_proj", 30.0), ("k_proj", 30.0), ("embed", 10.0)):
        if part in name:
            return x * factor
    return x * (10.0 if ("v_proj" in name or "o_proj" in name) else 1.0)


@pytest.fixture(scope="module")
def model():
    graphdef, params = create_diffusion_model(CONFIG, seed=0)
    return graphdef, jax.tree_util.tree_map_with_path(_scale, params)


def generate(model, rng=0, **kwargs):
    graphdef, params = model
    kwargs = dict(gen_length=G, block_size=BLOCK, steps_per_block=STEPS, mask_id=MASK) | kwargs
    return diffusion_generate(graphdef, params, PROMPTS, PROMPT_MASK, jax.random.key(rng), **kwargs)


@pytest.fixture(scope="module")
def rollouts(model):
    """One rollout per sampler configuration, compiled once for the whole module."""
    return {
        "greedy": generate(model),
        "sampled": generate(model, temperature=0.7, eos_id=7),
        "random": generate(model, remasking="random"),
    }


def replay_probs(model, rollout):
    """softmax(masked_logits) [S, B, G, V] of every denoising state x_s, rebuilt from the
    step map alone: MASK where step_map >= s, the final token elsewhere."""
    graphdef, params = model
    steps = np.asarray(rollout.step_map)
    tokens = np.asarray(rollout.completion_tokens)
    n_steps = G // BLOCK * STEPS
    states = np.stack([np.where(steps < s, tokens, MASK) for s in range(n_steps)])
    seqs = np.concatenate([np.broadcast_to(PROMPTS, (n_steps, *PROMPTS.shape)), states], -1)
    valid = np.concatenate([PROMPT_MASK, np.ones((3, G), bool)], -1)
    flat, flat_valid = seqs.reshape(-1, P + G), np.tile(valid, (n_steps, 1))
    logits = LOGITS(graphdef, params, flat, flat_valid, mask_id=MASK)
    logits = np.asarray(logits, np.float64).reshape(n_steps, 3, P + G, V)[:, :, P:]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    return probs / probs.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "n, steps, expected",
    [(7, 3, [3, 2, 2]), (4, 4, [1, 1, 1, 1]), (2, 4, [1, 1, 0, 0]), (8, 2, [4, 4]), (5, 1, [5])],
)
def test_num_transfer_tokens_spreads_the_count_front_loaded(n, steps, expected):
    np.testing.assert_array_equal(num_transfer_tokens(n, steps), expected)


def test_num_transfer_tokens_per_row_and_rejects_zero_steps():
    np.testing.assert_array_equal(num_transfer_tokens(jnp.array([7, 3]), 3), [[3, 2, 2], [1, 1, 1]])
    with pytest.raises(ValueError, match="steps=0"):
        num_transfer_tokens(4, 0)


def test_one_token_per_step_reproduces_greedy_ar_order(model):
    graphdef, params = model
    out = generate(model, gen_length=6, block_size=1, steps_per_block=1)
    np.testing.assert_array_equal(out.step_map, np.broadcast_to(np.arange(6), (3, 6)))
    # Reference: a plain loop filling position j with the argmax given positions < j filled.
    seq = np.concatenate([np.asarray(PROMPTS), np.full((3, 6), MASK)], -1)
    valid = np.concatenate([PROMPT_MASK, np.ones((3, 6), bool)], -1)
    for j in range(6):
        logits = np.asarray(LOGITS(graphdef, params, seq, valid, mask_id=MASK))
        seq[:, P + j] = logits[:, P + j].argmax(-1)
    np.testing.assert_array_equal(out.completion_tokens, seq[:, P:])
    assert len(np.unique(seq[:, P:])) > 1  # not a degenerate constant completion


def test_every_position_unmasks_once_inside_its_block_on_schedule(rollouts):
    schedule = [2, 1, 1]
    for name, out in rollouts.items():
        steps, blocks = np.asarray(out.step_map), np.asarray(out.block_ids)
        np.testing.assert_array_equal(blocks, np.broadcast_to(np.arange(G) // BLOCK, (3, G)))
        assert steps.min() >= 0 and steps.max() < G // BLOCK * STEPS, name
        np.testing.assert_array_equal(steps // STEPS, blocks, err_msg=name)
        counts = np.stack([(steps == s).sum(1) for s in range(G // BLOCK * STEPS)], 1)
        np.testing.assert_array_equal(counts, np.tile(schedule * (G // BLOCK), (3, 1)))
        assert not np.any(np.asarray(out.completion_tokens) == MASK), name


def test_token_probs_and_greedy_tokens_match_a_replay_of_the_states(model, rollouts):
    for name, out in rollouts.items():
        probs = replay_probs(model, out)
        steps, tokens = np.asarray(out.step_map), np.asarray(out.completion_tokens)
        b, g = np.indices(steps.shape)
        at_step = probs[steps, b, g]  # [B, G, V]: the distribution when the token was unmasked
        np.testing.assert_allclose(
            out.token_probs, at_step[b, g, tokens], rtol=2e-4, atol=1e-6, err_msg=name
        )
        if name != "sampled":
            np.testing.assert_array_equal(tokens, at_step.argmax(-1), err_msg=name)


def test_low_confidence_unmasks_the_most_confident_masked_positions_of_the_block(model, rollouts):
    out = rollouts["greedy"]
    probs = replay_probs(model, out)
    steps = np.asarray(out.step_map)
    for s in range(G // BLOCK * STEPS):
        block = np.arange(G) // BLOCK == s // STEPS
        for row in range(3):
            masked = block & (steps[row] >= s)
            confidence = probs[s, row].max(-1)  # p of the argmax prediction
            chosen = steps[row] == s
            # numpy top-k of one step: every chosen position is at least as confident as every
            # masked position of the block left for later.
            left = masked & ~chosen
            if left.any():
                assert confidence[chosen].min() >= confidence[left].max() - 1e-6, (s, row)


def test_random_remasking_ignores_confidence(rollouts):
    # Same greedy predictions, different unmasking order: the step maps differ.
    assert not np.array_equal(rollouts["random"].step_map, rollouts["greedy"].step_map)


def test_left_padding_values_do_not_change_greedy_completions(rollouts):
    out = rollouts["greedy"]
    for field in ("completion_tokens", "step_map", "token_probs"):
        np.testing.assert_array_equal(getattr(out, field)[0], getattr(out, field)[1])


def test_completion_mask_ends_at_the_first_eos(rollouts):
    out = rollouts["sampled"]
    tokens = np.asarray(out.completion_tokens)
    expected = np.ones(tokens.shape, bool)
    for row in range(3):
        hits = np.flatnonzero(tokens[row] == 7)
        if hits.size:
            expected[row, hits[0] + 1 :] = False
    assert not expected.all() and expected.sum(1).max() > 1  # EOS occurs, not only at 0
    np.testing.assert_array_equal(out.completion_mask, expected)
    assert np.asarray(rollouts["greedy"].completion_mask).all()


def test_same_key_same_rollout_and_sampling_varies_with_the_key(model, rollouts):
    again = generate(model, temperature=0.7, eos_id=7)
    for field in ("completion_tokens", "step_map", "token_probs"):
        np.testing.assert_array_equal(getattr(again, field), getattr(rollouts["sampled"], field))
    others = [generate(model, rng=k, temperature=0.7, eos_id=7) for k in (1, 2)]
    assert any(
        not np.array_equal(o.completion_tokens, rollouts["sampled"].completion_tokens)
        for o in others
    )


def test_temperature_sampling_follows_the_tempered_softmax(model):
    graphdef, params = model
    rows, temperature = 2000, 0.7
    prompt = jnp.broadcast_to(PROMPTS[2], (rows, P))
    out = diffusion_generate(
        graphdef,
        params,
        prompt,
        jnp.ones((rows, P), bool),
        jax.random.key(5),
        gen_length=1,
        block_size=1,
        steps_per_block=1,
        mask_id=MASK,
        temperature=temperature,
    )
    seq = np.concatenate([np.asarray(PROMPTS[2:]), [[MASK]]], -1)
    logits = np.asarray(LOGITS(graphdef, params, seq, np.ones((1, P + 1), bool), mask_id=MASK))
    z = np.asarray(logits[0, P], np.float64) / temperature
    expected = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    counts = np.bincount(np.asarray(out.completion_tokens)[:, 0], minlength=V) / rows
    np.testing.assert_allclose(counts, expected, atol=0.04)
    assert expected.max() < 0.9  # a spread distribution, so the check has teeth


def test_invalid_arguments_are_rejected(model):
    with pytest.raises(ValueError, match="multiple of block_size"):
        generate(model, gen_length=6, block_size=4)
    with pytest.raises(ValueError, match="remasking"):
        generate(model, remasking="entropy")
    with pytest.raises(ValueError, match="temperature"):
        generate(model, temperature=-1.0)
