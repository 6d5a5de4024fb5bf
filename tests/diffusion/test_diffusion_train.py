"""The diffusion-LM RL driver: SFT learns, RL steps run and are wired to the objectives."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.data import AdditionTask, prompt_batches, prompt_dataset
from rljax.diffusion import diffu_grpo_loss, masked_logits, rldf_loss
from rljax.diffusion.train import (
    DiffusionRLConfig,
    RLFunctions,
    decode_texts,
    evaluate,
    make_sft_step,
    rl_batch,
    rl_loss,
    rl_optimizer,
    rl_step,
    score,
    setup,
    sft_completions,
    sft_optimizer,
)
from rljax.models.tokenizer import ByteTokenizer

TINY = DiffusionRLConfig(
    d_model=32,
    n_layers=1,
    n_heads=2,
    n_kv_heads=1,
    d_ff=64,
    gen_length=4,
    block_size=4,
    steps_per_block=2,
    eval_size=4,
    prompts_per_step=2,
    group_size=2,
    learning_rate=1e-2,
    inner_steps=2,
)


@pytest.fixture(scope="module")
def run():
    s, params = setup(TINY)
    data = prompt_dataset(s.task, "train", s.tokenizer, TINY.max_prompt_len, seed=0)
    prompts = next(prompt_batches(data, TINY.prompts_per_step))
    return s, params, prompts


def _changed(a, b) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_sft_completions_pad_with_eos():
    tokens = np.array([[49, 57, 258, 256], [55, 258, 256, 256]])
    mask = tokens != 256
    np.testing.assert_array_equal(
        sft_completions(tokens, mask, 258), [[49, 57, 258, 258], [55, 258, 258, 258]]
    )


def test_sft_optimizer_warms_up_then_cosine_decays():
    # A constant gradient makes every Adam step -lr_i (m_hat = g, v_hat = g^2), so the updates
    # trace the schedule: lr * i / W for i < W, then lr (1 + cos(pi (i - W) / (N - W))) / 2.
    lr, warmup, n = 0.01, 4, 12
    config = dataclasses.replace(
        TINY, sft_learning_rate=lr, sft_warmup_steps=warmup, sft_steps=n, sft_weight_decay=0.0
    )
    opt = sft_optimizer(config)
    params, grads = jnp.zeros(()), jnp.ones(())
    state, steps = opt.init(params), []
    for _ in range(n):
        update, state = opt.update(grads, state, params)
        steps.append(-float(update))
    i = np.arange(n)
    want = np.where(
        i < warmup, lr * i / warmup, lr * 0.5 * (1 + np.cos(np.pi * (i - warmup) / (n - warmup)))
    )
    np.testing.assert_allclose(steps, want, rtol=1e-4, atol=1e-9)
    # Decoupled weight decay pulls non-zero params towards 0 even with a zero gradient.
    opt = sft_optimizer(dataclasses.replace(config, sft_weight_decay=0.5))
    state = opt.init(jnp.ones(()))
    for _ in range(warmup + 1):
        update, state = opt.update(jnp.zeros(()), state, jnp.ones(()))
    np.testing.assert_allclose(float(update), -0.5 * lr, rtol=1e-4)


def test_sft_loss_decreases(run):
    s, params, prompts = run
    batch = {
        "prompt_tokens": prompts["prompt_tokens"],
        "prompt_mask": prompts["prompt_mask"],
        "completion_tokens": np.array([[49, 57, 258, 258], [55, 258, 258, 258]], np.int32),
    }
    optimizer = optax.adam(1e-2)
    step = make_sft_step(s.graphdef, optimizer, s.mask_id, 1e-3)
    rng = jax.random.PRNGKey(3)
    p, opt_state = params, optimizer.init(params)
    losses = []  # each step returns the loss of the params it starts from, on the same masks
    for _ in range(6):
        p, opt_state, loss = step(p, opt_state, batch, rng)
        losses.append(float(loss))
    assert np.isfinite(losses[0]) and losses[-1] < losses[0] - 0.5


def test_decode_texts_stops_at_eos_and_shows_specials():
    tok = ByteTokenizer()
    tokens = np.array([[49, 57, 258, 50], [55, 256, 258, 258], [51, 51, 51, 51]])
    assert decode_texts(tok, tokens) == ["19", "7<pad>", "3333"]


def test_score_rewards_and_group_advantages():
    rewards, adv = score(AdditionTask(), ["19", " 7", "3", "3"], ["19", "8", "3", "3"], 2)
    np.testing.assert_array_equal(rewards, [1.0, 0.0, 1.0, 1.0])
    # Group [1, 0]: centred +-0.5 over the ddof=1 std sqrt(0.5); group [1, 1]: all 0.
    np.testing.assert_allclose(adv, [0.5 / np.sqrt(0.5), -0.5 / np.sqrt(0.5), 0, 0], atol=1e-5)


def _hand_batch(s, prompts):
    completion = jnp.array([[49, 57, 258, 50], [55, 258, 49, 49]], jnp.int32)
    return {
        "prompt_tokens": jnp.asarray(prompts["prompt_tokens"]),
        "prompt_mask": jnp.asarray(prompts["prompt_mask"]),
        "completion_tokens": completion,
        "completion_mask": jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool),
        "advantages": jnp.array([0.7, -1.3]),
    }


def _direct_logp(s, params, prompt, prompt_mask, noisy_completion, completion):
    """log p(clean completion | noisy input), straight from `masked_logits`."""
    tokens = jnp.concatenate([prompt, noisy_completion], axis=1)
    valid = jnp.concatenate([prompt_mask, jnp.ones(completion.shape, bool)], axis=1)
    logits = masked_logits(s.graphdef, params, tokens, valid, mask_id=s.mask_id)
    logp = jax.nn.log_softmax(logits[:, prompt.shape[1] :], axis=-1)
    return jnp.take_along_axis(logp, completion[..., None], axis=-1)[..., 0]


def test_diffu_grpo_loss_wiring(run):
    s, params, prompts = run
    batch = _hand_batch(s, prompts)
    rng = jax.random.PRNGKey(7)
    config = dataclasses.replace(TINY, algorithm="diffu_grpo", p_mask_prompt=0.5)
    # d1's estimate by hand: prompt tokens masked with prob p from `rng`, completion all MASK.
    hide = jax.random.uniform(rng, batch["prompt_tokens"].shape) < 0.5
    prompt = jnp.where(hide, s.mask_id, batch["prompt_tokens"])
    all_mask = jnp.full(batch["completion_tokens"].shape, s.mask_id)
    logp = _direct_logp(
        s, params, prompt, batch["prompt_mask"], all_mask, batch["completion_tokens"]
    )
    logp = jnp.where(batch["completion_mask"], logp, 0.0)
    old, ref = logp - 0.1, logp + 0.3
    want, _ = diffu_grpo_loss(
        logp, old, batch["advantages"], batch["completion_mask"], ref, 0.2, config.beta
    )
    got, _ = rl_loss(s.graphdef, params, batch, rng, old, ref, config, s.mask_id)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # On-policy without KL the surrogate is minus the token mean of the advantages.
    got, _ = rl_loss(s.graphdef, params, batch, rng, logp, None, config, s.mask_id)
    np.testing.assert_allclose(got, -(0.7 * 3 - 1.3 * 2) / 5, rtol=1e-5)


def test_rldf_loss_wiring(run):
    s, params, prompts = run
    batch = _hand_batch(s, prompts)
    step_map = jnp.array([[0, 1, 2, 3], [3, 2, 1, 0]], jnp.int32)
    steps = jnp.array([[1, 3], [0, 2]], jnp.int32)
    # Replayed state x_s: MASK where step_map >= s; scored: masked and through the first EOS.
    masked = step_map[:, None, :] >= steps[:, :, None]
    scored = masked & batch["completion_mask"][:, None, :]
    batch.update(rldf_masked=masked, rldf_scored=scored)
    config = dataclasses.replace(TINY, algorithm="rldf")
    logp = jnp.stack(
        [
            _direct_logp(
                s,
                params,
                batch["prompt_tokens"],
                batch["prompt_mask"],
                jnp.where(masked[:, j], s.mask_id, batch["completion_tokens"]),
                batch["completion_tokens"],
            )
            for j in range(2)
        ],
        axis=1,
    )
    logp = jnp.where(scored, logp, 0.0)
    old = logp + 0.05
    want, _ = rldf_loss(logp, old, None, batch["advantages"], scored, 0.2, config.beta)
    got, _ = rl_loss(s.graphdef, params, batch, jax.random.PRNGKey(0), old, None, config, s.mask_id)
    np.testing.assert_allclose(got, want, rtol=1e-5)


class _AlternatingTask(AdditionTask):
    """Rewards 1, 0, 1, 0, ... per call, so every group of 2 has non-zero advantages (an
    untrained model is never right)."""

    def __init__(self):
        super().__init__(max_digits=2)
        object.__setattr__(self, "_calls", [0])

    def reward(self, completion: str, answer: str) -> float:
        self._calls[0] += 1
        return float(self._calls[0] % 2)


@pytest.mark.parametrize("algorithm", ["diffu_grpo", "rldf"])
def test_rl_step_runs_moves_params_and_is_deterministic(run, algorithm):
    s, params, prompts = run
    config = dataclasses.replace(TINY, algorithm=algorithm)
    s = dataclasses.replace(s, config=config, task=_AlternatingTask())
    optimizer = rl_optimizer(config)
    fns = RLFunctions(s.graphdef, optimizer, config, s.mask_id)
    outs = [
        rl_step(s, fns, params, params, optimizer.init(params), prompts, jax.random.PRNGKey(1))
        for _ in range(2)
    ]
    (p1, _, m1), (p2, _, m2) = outs
    assert np.isfinite(m1["loss"]) and np.isfinite(m1["grad_norm"]) and m1["grad_norm"] > 0
    assert 0.0 <= m1["reward/mean"] <= 1.0
    assert _changed(params, p1)
    assert m1 == m2 and not _changed(p1, p2)


def test_rl_batch_rldf_states(run):
    s, params, prompts = run
    from rljax.diffusion import diffusion_generate

    rollout = diffusion_generate(
        s.graphdef,
        params,
        jnp.asarray(prompts["prompt_tokens"]),
        jnp.asarray(prompts["prompt_mask"]),
        jax.random.PRNGKey(0),
        gen_length=4,
        block_size=4,
        steps_per_block=2,
        mask_id=s.mask_id,
        temperature=1.0,
        eos_id=258,
    )
    config = dataclasses.replace(TINY, algorithm="rldf", rldf_k=2)
    batch = rl_batch(rollout, np.zeros(2), jax.random.PRNGKey(4), config)
    masked, scored = np.asarray(batch["rldf_masked"]), np.asarray(batch["rldf_scored"])
    assert masked.shape == scored.shape == (2, 2, 4)
    # Each state masks the tokens decoded at or after some step: a superset of the last step's.
    last = np.asarray(rollout.step_map) == 1
    assert np.all(masked | ~last[:, None, :])
    assert not np.any(scored & ~masked) and not np.any(scored & ~rollout.completion_mask[:, None])


def test_evaluate_is_an_accuracy(run):
    s, params, _ = run
    acc = evaluate(s, params)
    assert 0.0 <= acc <= 1.0 and acc * TINY.eval_size == int(acc * TINY.eval_size)
