"""Rollout / prepare / update steps on a tiny model."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from rljax.algorithms import PPOSettings, grpo
from rljax.core.batch import make_batch
from rljax.core.keys import extra
from rljax.core.state import init_train_state
from rljax.core.transform import chain, stateless
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, positions_from_mask
from rljax.quant.rollout import RolloutWeights
from rljax.rollout.rescore import ROLLOUT_KEYS, rescore
from rljax.rollout.sampling import SamplingParams
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
ROLLOUT = RolloutConfig(max_new_tokens=5, n_samples=4, eos_id=1, pad_id=0)
# The prepare step's own forward pass of the old policy (on-policy "auto" runs none:
# tests/train/test_old_policy.py).
RECOMPUTE = UpdateConfig(old_logprobs="recompute")


@pytest.fixture(scope="module")
def setup():
    graphdef, params = create_model(CONFIG, seed=0)
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    return graphdef, params, prompts, prompts > 0


def completion_logits(graphdef, params, batch):
    """[B, T, V] logits that predict each completion token, from a plain full-vocabulary
    forward pass over prompt + completion (prompts of P = 3 tokens)."""
    tokens = jnp.concatenate([batch.prompt_tokens, batch.completion_tokens], 1)
    m = jnp.concatenate([batch.prompt_mask, batch.completion_mask], 1)
    return forward(graphdef, params, tokens, positions_from_mask(m), m)[0][:, 2:-1]


def picked(logp, tokens):
    """logp[b, t, tokens[b, t]]."""
    return jnp.take_along_axis(logp, tokens[..., None], -1)[..., 0]


def rollout_batch(steps, state, prompts, mask):
    rollout = steps.rollout(state, prompts, mask)
    rewards = (rollout.completion_tokens[:, 0] % 2).astype(jnp.float32)  # any fixed reward
    return make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        rewards,
        rollout_logprobs=rollout.sampling_logprobs,
    )


def build(graphdef, params, update=RECOMPUTE, lr=1.0, ppo=PPOSettings()):
    algorithm = grpo(group_size=ROLLOUT.n_samples, ppo=ppo)
    optimizer = optax.sgd(lr)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    return make_steps(graphdef, optimizer, algorithm, ROLLOUT, update), state


def test_prepare_scores_the_rollout_and_computes_group_advantages(setup):
    graphdef, params, prompts, mask = setup
    steps, state = build(graphdef, params)
    batch = rollout_batch(steps, state, prompts, mask)
    _, batch, metrics = steps.prepare(state, batch)
    # Sampler log-probs (temperature 1) equal the trainer's old log-probs.
    np.testing.assert_allclose(batch.old_logprobs, batch.rollout_logprobs, atol=1e-5)
    assert float(metrics["mismatch/abs_gap_mean"]) < 1e-5
    r = np.asarray(batch.rewards).reshape(2, 4)
    want = (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-6)
    want = np.where(r.std(1, keepdims=True) > 0, want, 0.0).reshape(-1)
    np.testing.assert_allclose(
        batch.advantages, want[:, None] * np.asarray(batch.completion_mask), atol=1e-5
    )


def test_the_trainer_trains_the_policy_at_the_sampling_temperature(setup):
    """At temperature 0.5 the sampler's log-probs, the trainer's old log-probs and one SGD
    step are those of softmax(logits / 0.5), from a plain full-vocabulary forward pass."""
    graphdef, params, prompts, mask = setup
    rollout = dataclasses.replace(ROLLOUT, sampling=SamplingParams(temperature=0.5))
    algorithm, optimizer = grpo(group_size=ROLLOUT.n_samples), optax.sgd(0.1)
    state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(graphdef, optimizer, algorithm, rollout, RECOMPUTE)
    batch = rollout_batch(steps, state, prompts, mask)
    state, batch, metrics = steps.prepare(state, batch)

    def logprobs(p):
        logp = jax.nn.log_softmax(completion_logits(graphdef, p, batch) / 0.5)
        return picked(logp, batch.completion_tokens)

    w = batch.completion_mask.astype(jnp.float32)
    np.testing.assert_allclose(batch.old_logprobs, logprobs(params) * w, atol=1e-5)
    np.testing.assert_allclose(batch.old_logprobs, batch.rollout_logprobs * w, atol=1e-5)
    assert float(metrics["mismatch/abs_gap_mean"]) < 1e-5  # sampler and trainer agree

    def pg_loss(p):
        return -(batch.advantages * logprobs(p) * w).sum() / w.sum()

    want = jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(pg_loss)(params))
    new_state, _ = steps.update(state, batch)
    for got, ref in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("mode", ["recompute", "auto"])
def test_one_on_policy_sgd_step_is_the_policy_gradient(setup, mode):
    graphdef, params, prompts, mask = setup
    steps, state = build(graphdef, params, UpdateConfig(old_logprobs=mode), lr=0.1)
    batch = rollout_batch(steps, state, prompts, mask)
    state, batch, _ = steps.prepare(state, batch)

    def pg_loss(p):  # -(1/N) sum_t A_t log pi(y_t), from a plain full-vocabulary forward pass
        logp = jax.nn.log_softmax(completion_logits(graphdef, p, batch))
        logp = picked(logp, batch.completion_tokens)
        w = batch.completion_mask.astype(jnp.float32)
        return -(batch.advantages * logp * w).sum() / w.sum()

    want = jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(pg_loss)(params))
    new_state, metrics = steps.update(state, batch)
    for got, ref in zip(jax.tree.leaves(new_state.params), jax.tree.leaves(want)):
        np.testing.assert_allclose(got, ref, atol=1e-6)
    assert int(new_state.step) == 1
    assert float(metrics["pg/clip_frac"]) == 0.0  # on-policy: ratio 1


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
def test_gradient_accumulation_equals_the_full_minibatch(setup, aggregation):
    graphdef, params, prompts, mask = setup
    results = []
    for micro in (1, 4):
        steps, state = build(
            graphdef,
            params,
            UpdateConfig(microbatches=micro, vocab_chunk=7),
            ppo=PPOSettings(aggregation=aggregation),
        )
        batch = rollout_batch(steps, state, prompts, mask)
        state, batch, _ = steps.prepare(state, batch)
        results.append(steps.update(state, batch))
    (a, ma), (b, mb) = results
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    np.testing.assert_allclose(ma["loss"], mb["loss"], atol=1e-6)


def test_several_epochs_and_minibatches_take_that_many_optimizer_steps(setup):
    graphdef, params, prompts, mask = setup
    algorithm = grpo(group_size=4)
    optimizer = optax.chain(optax.sgd(0.01), optax.scale(1.0))
    state = init_train_state(params, optax.adam(1e-3), algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(
        graphdef, optax.adam(1e-3), algorithm, ROLLOUT, UpdateConfig(epochs=3, minibatches=2)
    )
    del optimizer
    batch = rollout_batch(steps, state, prompts, mask)
    state, batch, _ = steps.prepare(state, batch)
    state, metrics = steps.update(state, batch)
    assert int(state.opt_state[0].count) == 6  # adam's step counter: 3 epochs x 2 minibatches
    assert np.isfinite(float(metrics["loss"]))
    # Later minibatches are off-policy, so the ratio moved away from 1.
    assert float(metrics["pg/ratio_max"]) > 1.0


def test_indivisible_minibatches_raise(setup):
    graphdef, params, prompts, mask = setup
    steps, state = build(graphdef, params, UpdateConfig(minibatches=3))
    batch = rollout_batch(steps, state, prompts, mask)
    state, batch, _ = steps.prepare(state, batch)
    with pytest.raises(ValueError, match="not divisible by minibatches x microbatches"):
        steps.update(state, batch)


def test_rollout_randomness_comes_from_state_and_step(setup):
    graphdef, params, prompts, mask = setup
    steps, state = build(graphdef, params)
    a = steps.rollout(state, prompts, mask).completion_tokens
    b = steps.rollout(state, prompts, mask).completion_tokens
    c = steps.rollout(state.replace(step=state.step + 1), prompts, mask).completion_tokens
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def reading(algorithm, *names):
    """`algorithm` with one more transform that reads the extras `names` (and changes nothing):
    the prepare step computes the statistics among them."""
    reader = stateless(lambda batch, ctx: (batch, {}), reads={extra(n) for n in names}, writes=())
    return algorithm._replace(transform=chain(algorithm.transform, reader))


def test_prepare_computes_the_requested_batch_stats(setup):
    graphdef, params, prompts, mask = setup
    base = grpo(group_size=ROLLOUT.n_samples)
    algorithm = reading(base, "old_sum_sq_prob", "old_ref_hellinger", "prompt_embedding")
    assert algorithm.batch_stats == ("old_ref_hellinger", "old_sum_sq_prob", "prompt_embedding")
    assert algorithm.needs_reference and not base.needs_reference
    optimizer = optax.sgd(1.0)
    state = init_train_state(
        params, optimizer, algorithm.transform, jax.random.PRNGKey(0), keep_reference=True
    )
    # A reference that differs from the policy: its output layer is scaled.
    state = state.replace(ref_params=jax.tree.map(lambda x: x * 1.5, state.ref_params))
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT)
    batch = rollout_batch(steps, state, prompts, mask)
    _, out, _ = steps.prepare(state, batch)

    def dist(p):
        return np.asarray(jax.nn.softmax(completion_logits(graphdef, p, out), -1), np.float64)

    cm = np.asarray(out.completion_mask)
    p, q = dist(state.params), dist(state.ref_params)
    np.testing.assert_allclose(
        out.extras["old_sum_sq_prob"], np.where(cm, (p**2).sum(-1), 0), rtol=1e-4, atol=1e-6
    )
    want_h = np.where(cm, 1 - np.sqrt(p * q).sum(-1), 0)
    np.testing.assert_allclose(out.extras["old_ref_hellinger"], want_h, rtol=1e-3, atol=1e-6)
    assert want_h[cm].min() > 1e-4  # the reference really differs
    model_hidden = nnx.merge(graphdef, state.params).hidden_states
    tokens = jnp.concatenate([out.prompt_tokens, out.completion_tokens], 1)
    m = jnp.concatenate([out.prompt_mask, out.completion_mask], 1)
    hidden = np.asarray(model_hidden(tokens, positions_from_mask(m), m)[0])[:, :3]
    pm = np.asarray(out.prompt_mask)[..., None]
    np.testing.assert_allclose(
        out.extras["prompt_embedding"], (hidden * pm).sum(1) / pm.sum(1), rtol=1e-5, atol=1e-6
    )


def test_unknown_batch_stat_and_missing_reference_raise(setup):
    graphdef, params, prompts, mask = setup
    algorithm = grpo(group_size=ROLLOUT.n_samples)
    with pytest.raises(ValueError, match="extras.x"):
        make_steps(graphdef, optax.sgd(1.0), reading(algorithm, "x"), ROLLOUT)
    algorithm = reading(algorithm, "old_ref_hellinger")
    state = init_train_state(params, optax.sgd(1.0), algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(graphdef, optax.sgd(1.0), algorithm, ROLLOUT)
    with pytest.raises(ValueError, match="no reference"):
        steps.prepare(state, rollout_batch(steps, state, prompts, mask))


def test_quantized_rollout_weights_open_a_measured_mismatch(setup):
    """f32 rollouts: the mismatch metrics are zero up to float error; MXFP4 rollouts: not, and
    the quantization error of the sampler's kernels is logged; AQN logs its noise level."""
    graphdef, params, prompts, mask = setup
    gaps = {}
    for name, weights in (
        ("none", RolloutWeights()),
        ("mxfp4", RolloutWeights("mxfp4")),
        ("mxfp4+aqn", RolloutWeights("mxfp4", aqn_sigma_start=0.05, aqn_stages=2, total_steps=2)),
    ):
        algorithm = grpo(group_size=ROLLOUT.n_samples)
        optimizer = optax.sgd(1.0)
        state = init_train_state(params, optimizer, algorithm.transform, jax.random.PRNGKey(0))
        state = state.replace(step=state.step + 1)  # AQN's first stage (step 0) has no noise
        rollout = dataclasses.replace(ROLLOUT, weights=weights)
        steps = make_steps(graphdef, optimizer, algorithm, rollout, RECOMPUTE)
        _, _, metrics = steps.prepare(state, rollout_batch(steps, state, prompts, mask))
        gaps[name] = metrics
    assert float(gaps["none"]["mismatch/abs_gap_mean"]) < 1e-5
    assert abs(float(gaps["none"]["mismatch/token_kl"])) < 1e-6
    assert abs(float(gaps["none"]["mismatch/ess"]) - 1.0) < 1e-5
    assert not any(k.startswith("quant/") for k in gaps["none"])
    assert float(gaps["mxfp4"]["mismatch/abs_gap_mean"]) > 1e-3
    assert float(gaps["mxfp4"]["mismatch/ess"]) < 1.0
    assert 0 < float(gaps["mxfp4"]["quant/down_proj/grid_noise"]) < 1
    assert "quant/aqn_sigma" not in gaps["mxfp4"]
    # Step 1 of a 2-step run is in the last of 2 stages: sigma_start.
    np.testing.assert_allclose(gaps["mxfp4+aqn"]["quant/aqn_sigma"], 0.05, rtol=1e-6)
    noisy_gap = float(gaps["mxfp4+aqn"]["mismatch/abs_gap_mean"])
    assert noisy_gap > float(gaps["mxfp4"]["mismatch/abs_gap_mean"])


def test_logprobs_and_chunked_rescoring_match_a_plain_forward_pass(setup):
    graphdef, params, prompts, mask = setup
    steps, state = build(graphdef, params)
    rollout = steps.rollout(state, prompts, mask)
    tokens = jnp.concatenate([rollout.prompt_tokens, rollout.completion_tokens], 1)
    m = jnp.concatenate([rollout.prompt_mask, rollout.completion_mask], 1)
    logp = jax.nn.log_softmax(forward(graphdef, state.params, tokens, positions_from_mask(m), m)[0])
    logp = jnp.take_along_axis(logp[:, 2:-1], rollout.completion_tokens[..., None], -1)[..., 0]
    want = np.where(rollout.completion_mask, logp, 0.0)
    rows = {k: np.asarray(getattr(rollout, k)) for k in ROLLOUT_KEYS}
    got = steps.logprobs(state, *(rows[k] for k in ROLLOUT_KEYS))
    np.testing.assert_allclose(got, want, atol=1e-5)
    # 8 rows in chunks of 3: the last chunk is padded, the padding's results dropped.
    np.testing.assert_allclose(
        rescore(functools.partial(steps.logprobs, state), rows, 3), want, atol=1e-5
    )


def test_moe_rollouts_are_replayed_in_prepare_and_report_expert_load():
    moe = dataclasses.replace(CONFIG, num_experts=4, experts_per_token=2)
    graphdef, params = create_model(moe, seed=0)
    steps, state = build(graphdef, params)
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    rollout = steps.rollout(state, prompts, prompts > 0)
    batch = rollout_batch(steps, state, prompts, prompts > 0)
    batch = batch.replace(extras={"routes": rollout.routes})
    _, batch, metrics = steps.prepare(state, batch)
    # The trainer scores every token through the sampler's experts: the same policy.
    np.testing.assert_allclose(batch.old_logprobs, rollout.policy_logprobs, atol=1e-5)
    valid = np.concatenate([rollout.prompt_mask, rollout.completion_mask], axis=1)
    counts = np.zeros((moe.n_layers, 4))
    for b, s in zip(*np.nonzero(valid)):
        for layer in range(moe.n_layers):
            np.add.at(counts[layer], np.asarray(rollout.routes)[b, s, layer], 1)
    load = counts / counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(metrics["moe/load_max"], 4 * load.max(), rtol=1e-5)
    state, update_metrics = steps.update(state, batch)
    assert np.isfinite(float(update_metrics["loss"]))


def test_packed_prepare_and_update_equal_the_unpacked_ones(setup):
    graphdef, params, _, _ = setup
    rng = np.random.default_rng(0)
    prompt_mask = np.arange(4)[None, :] >= 4 - np.array([2, 3, 1, 4, 2, 1, 3, 2])[:, None]
    completion_mask = np.arange(6)[None, :] < np.array([1, 2, 3, 1, 2, 2, 1, 3])[:, None]
    batch = make_batch(
        np.where(prompt_mask, rng.integers(2, 30, (8, 4)), 0),
        prompt_mask,
        np.where(completion_mask, rng.integers(2, 30, (8, 6)), 0),
        completion_mask,
        np.repeat(np.arange(2), 4),
        np.array([1.0, 0, 0, 1, 0, 1, 1, 0]),
    )
    results = []
    for ratio in (0.0, 0.5):  # 8 sequences of <= 7 tokens fit in 4 rows of 10
        update = UpdateConfig(pack_ratio=ratio, old_logprobs="recompute")
        steps, state = build(graphdef, params, update, lr=0.1)
        state, prepared, prepare_metrics = steps.prepare(state, batch)
        state, update_metrics = steps.update(state, prepared)
        results.append((prepared, prepare_metrics, update_metrics, state.params))
    (a, ma, ua, pa), (b, mb, ub, pb) = results
    assert float(mb["pack/fits"]) == 1.0 and "pack/fits" not in ma
    np.testing.assert_allclose(b.old_logprobs, a.old_logprobs, atol=1e-5)
    np.testing.assert_allclose(ub["loss"], ua["loss"], rtol=1e-5, atol=1e-7)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), pb, pa)
    with pytest.raises(ValueError, match="pack_ratio=1.5"):
        UpdateConfig(pack_ratio=1.5)
