"""The diffusion steps: estimators wired to the objectives, prepare's RLDF states and
theta_old / ref estimates, and updates that move the policy deterministically."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import tiny_config

from rljax.core.batch import make_batch
from rljax.diffusion import diffu_grpo_loss, masked_logits, rldf_loss
from rljax.diffusion.collect import host_rows
from rljax.diffusion.engine import (
    build_diffusion_algorithm,
    build_diffusion_rollout_config,
    build_diffusion_train_state,
)
from rljax.diffusion.steps import (
    OLD_KEY,
    REF_KEY,
    RLDF_MASKED_KEY,
    RLDF_SCORED_KEY,
    diffusion_estimates,
    diffusion_objective,
    make_diffusion_steps,
)
from rljax.train.builders import build_optimizer, build_update_config


def _changed(a, b) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _hand_batch(run, **extras):
    completion = jnp.array([[49, 57, 258, 50], [55, 258, 49, 49]], jnp.int32)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    advantages = jnp.array([0.7, -1.3])
    return make_batch(
        run.prompts["prompt_tokens"],
        run.prompts["prompt_mask"],
        completion,
        mask,
        jnp.array([0, 0]),
        jnp.zeros(2),
        advantages=advantages[:, None] * mask,
        extras=extras,
    )


def _direct_logp(run, params, prompt, prompt_mask, noisy_completion, completion):
    """log p(clean completion | noisy input), straight from `masked_logits`."""
    tokens = jnp.concatenate([prompt, noisy_completion], axis=1)
    valid = jnp.concatenate([prompt_mask, jnp.ones(completion.shape, bool)], axis=1)
    logits = masked_logits(run.graphdef, params, tokens, valid, mask_id=run.mask_id)
    logp = jax.nn.log_softmax(logits[:, prompt.shape[1] :], axis=-1)
    return jnp.take_along_axis(logp, completion[..., None], axis=-1)[..., 0]


def _loss(run, algorithm, batch, rng, old, ref):
    logp = diffusion_estimates(algorithm, run.graphdef, run.params, batch, rng, run.mask_id)
    return diffusion_objective(algorithm, logp, old, ref, batch)


def test_diffu_grpo_loss_wiring(run):
    batch = _hand_batch(run)
    rng = jax.random.PRNGKey(7)
    algorithm = build_diffusion_algorithm(tiny_config(name="diffu_grpo", p_mask_prompt=0.5))
    # d1's estimate by hand: prompt tokens masked with prob p from `rng`, completion all MASK.
    hide = jax.random.uniform(rng, batch.prompt_tokens.shape) < 0.5
    prompt = jnp.where(hide, run.mask_id, batch.prompt_tokens)
    all_mask = jnp.full(batch.completion_tokens.shape, run.mask_id)
    logp = _direct_logp(
        run, run.params, prompt, batch.prompt_mask, all_mask, batch.completion_tokens
    )
    logp = jnp.where(batch.completion_mask, logp, 0.0)
    old, ref = logp - 0.1, logp + 0.3
    advantages = jnp.array([0.7, -1.3])
    want, _ = diffu_grpo_loss(logp, old, advantages, batch.completion_mask, ref, 0.2, 0.04)
    got, _ = _loss(run, algorithm, batch, rng, old, ref)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # On-policy without KL the surrogate is minus the token mean of the advantages.
    got, _ = _loss(run, algorithm, batch, rng, logp, None)
    np.testing.assert_allclose(got, -(0.7 * 3 - 1.3 * 2) / 5, rtol=1e-5)


def test_rldf_loss_wiring(run):
    step_map = jnp.array([[0, 1, 2, 3], [3, 2, 1, 0]], jnp.int32)
    steps = jnp.array([[1, 3], [0, 2]], jnp.int32)
    # Replayed state x_s: MASK where step_map >= s; scored: masked and through the first EOS.
    masked = step_map[:, None, :] >= steps[:, :, None]
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    scored = masked & mask[:, None, :]
    batch = _hand_batch(run, **{RLDF_MASKED_KEY: masked, RLDF_SCORED_KEY: scored})
    algorithm = build_diffusion_algorithm(tiny_config(name="rldf"))
    logp = jnp.stack(
        [
            _direct_logp(
                run,
                run.params,
                batch.prompt_tokens,
                batch.prompt_mask,
                jnp.where(masked[:, j], run.mask_id, batch.completion_tokens),
                batch.completion_tokens,
            )
            for j in range(2)
        ],
        axis=1,
    )
    logp = jnp.where(scored, logp, 0.0)
    old = logp + 0.05
    want, _ = rldf_loss(logp, old, None, jnp.array([0.7, -1.3]), scored, 0.2, 0.04)
    got, _ = _loss(run, algorithm, batch, jax.random.PRNGKey(0), old, None)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def _steps_and_state(run, name, train=None, **settings):
    config = tiny_config(name=name, **settings)
    config.train.update(train or {})
    algorithm = build_diffusion_algorithm(config)
    optimizer = build_optimizer(config.train)
    rollout_config = build_diffusion_rollout_config(config, run.tokenizer)
    steps = make_diffusion_steps(
        run.graphdef, optimizer, algorithm, rollout_config, build_update_config(config)
    )
    state, _ = build_diffusion_train_state(config, None, run.params, algorithm, optimizer)
    return steps, state, algorithm


def _scored_batch(run, steps, state):
    """A rollout of the run's 2 prompts x 2 samples with rewards 1, 0 in each group."""
    out = steps.rollout(state, run.prompts["prompt_tokens"], run.prompts["prompt_mask"])
    rows = host_rows(out, run.prompts["index"], np.array([1.0, 0.0, 0.0, 1.0]), 2)
    return out, rows.to_batch()


def test_prepare_draws_rldf_states_and_old_ref_estimates(run):
    steps, state, algorithm = _steps_and_state(run, "rldf", rldf_k=2)
    out, batch = _scored_batch(run, steps, state)
    _, prepared, _ = steps.prepare(state, batch)
    extras = prepared.extras
    masked, scored = np.asarray(extras[RLDF_MASKED_KEY]), np.asarray(extras[RLDF_SCORED_KEY])
    assert masked.shape == scored.shape == (4, 2, 4)
    # Each state masks the tokens decoded at or after some step: a superset of the last step's.
    last = np.asarray(out.step_map) == 1
    assert np.all(masked | ~last[:, None, :])
    assert not np.any(scored & ~masked) and not np.any(scored & ~out.completion_mask[:, None])
    # theta_old and ref (both the initial policy here) per epoch: [B, epochs, k, T], 0 where
    # not scored, and equal since RLDF's states do not depend on the estimator key.
    old, ref = np.asarray(extras[OLD_KEY]), np.asarray(extras[REF_KEY])
    assert old.shape == ref.shape == (4, 2, 2, 4)
    np.testing.assert_array_equal(old, ref)
    np.testing.assert_array_equal(old[:, 0], old[:, 1])
    assert np.all(old[~np.broadcast_to(scored[:, None], old.shape)] == 0)
    # Group advantages: rewards (1, 0) and (0, 1) -> +-1/sqrt(0.5) on valid tokens.
    adv = np.asarray(prepared.advantages)[:, 0]
    np.testing.assert_allclose(adv, np.array([1, -1, -1, 1]) * 0.5 / np.sqrt(0.5), atol=1e-5)


# Every algorithm's step runs through the driver in test_engine.py; these two are checked here.
@pytest.mark.parametrize("name", ["diffu_grpo", "rldf"])
def test_update_moves_params_and_is_deterministic(run, name):
    steps, state, _ = _steps_and_state(run, name)
    _, batch = _scored_batch(run, steps, state)
    outs = []
    for _ in range(2):
        start = jax.tree.map(jnp.copy, state)  # update donates its state
        prepared_state, prepared, prepare_metrics = steps.prepare(start, batch)
        new, metrics = steps.update(prepared_state, prepared)
        outs.append((new, {k: float(v) for k, v in {**prepare_metrics, **metrics}.items()}))
    (s1, m1), (s2, m2) = outs
    assert np.isfinite(m1["loss"]) and m1["grad_norm"] > 0 and m1["guard/skipped"] == 0
    assert int(s1.step) == 1 and _changed(state.params, s1.params)
    assert m1 == m2 and not _changed(s1.params, s2.params)


def test_an_update_that_overflows_is_rolled_back(run):
    """The guard checks the step an update makes, not only its loss and gradients: learning
    rate x weight decay overflows float32, so params and optimizer state stay as they were."""
    overflow = {"learning_rate": 1e30, "weight_decay": 1e30, "warmup_steps": 0}
    steps, state, _ = _steps_and_state(run, "diffu_grpo", train=overflow)
    _, batch = _scored_batch(run, steps, state)
    before = jax.tree.map(np.asarray, (state.params, state.opt_state))
    prepared_state, prepared, _ = steps.prepare(jax.tree.map(jnp.copy, state), batch)
    new, metrics = steps.update(prepared_state, prepared)
    assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
    assert float(metrics["guard/skipped"]) == 1.0
    after = jax.tree.map(np.asarray, (new.params, new.opt_state))
    for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True):
        np.testing.assert_array_equal(a, b)


def test_logprobs_is_the_clean_prompt_one_pass_estimate(run):
    steps, state, _ = _steps_and_state(run, "diffu_grpo")
    batch = _hand_batch(run)
    got = steps.logprobs(
        state,
        batch.prompt_tokens,
        batch.prompt_mask,
        batch.completion_tokens,
        batch.completion_mask,
    )
    all_mask = jnp.full(batch.completion_tokens.shape, run.mask_id)
    want = _direct_logp(
        run, run.params, batch.prompt_tokens, batch.prompt_mask, all_mask, batch.completion_tokens
    )
    np.testing.assert_allclose(got, jnp.where(batch.completion_mask, want, 0.0), rtol=1e-5)
