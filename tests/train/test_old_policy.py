"""`train.old_logprobs`: "recompute", "sampler" and "auto" (no redundant pass on-policy)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax.algorithms import PPOSettings, dgpo, entrocraft, grpo, ppo
from rljax.core.batch import make_batch
from rljax.core.state import init_train_state
from rljax.core.transform import Transform, chain
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model
from rljax.quant.mismatch import truncated_is
from rljax.train.critic import init_critic
from rljax.train.old_policy import PREPARE, SAMPLER, UPDATE, old_policy_plan
from rljax.train.steps import RolloutConfig, UpdateConfig, make_steps

CONFIG = TransformerConfig(vocab_size=30, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
ROLLOUT = RolloutConfig(max_new_tokens=5, n_samples=4, eos_id=1, pad_id=0)
G = ROLLOUT.n_samples
# The pre-update metrics that move into the update when prepare runs no pass.
MOVED = (
    "entropy",
    "kl_to_ref",
    "entropy/cov_logp_adv",
    "mismatch/abs_gap_mean",
    "mismatch/abs_gap_max",
    "mismatch/gap_frac",
    "mismatch/token_kl",
    "mismatch/seq_kl",
    "mismatch/ess",
)


@pytest.fixture(scope="module")
def model():
    return create_model(CONFIG, seed=0)


def sampled_batch(graphdef, params, shift=0.0):
    """A rollout of the policy (temperature 1); `shift` moves the sampler's log-probs away
    from the policy's, as a quantized or stale sampler would."""
    algorithm = grpo(group_size=G)
    state = init_train_state(params, optax.sgd(1.0), algorithm.transform, jax.random.PRNGKey(0))
    steps = make_steps(graphdef, optax.sgd(1.0), algorithm, ROLLOUT)
    prompts = jnp.asarray([[0, 5, 6], [7, 8, 9]], jnp.int32)
    rollout = steps.rollout(state, prompts, prompts > 0)
    rewards = (rollout.completion_tokens[:, 0] % 2).astype(jnp.float32)
    rewards = rewards.at[0].set(1.0).at[1].set(0.0).at[4].set(1.0).at[5].set(0.0)
    logprobs = rollout.sampling_logprobs - shift * rollout.completion_mask
    return make_batch(
        rollout.prompt_tokens,
        rollout.prompt_mask,
        rollout.completion_tokens,
        rollout.completion_mask,
        rollout.group_id,
        rewards,
        rollout_logprobs=logprobs,
    )


def run(model, algorithm, mode, batch, minibatches=1, microbatches=1, reference=False, critic=None):
    """(prepared batch, prepare metrics, update metrics, params after the update, steps, state)."""
    graphdef, params = model
    optimizer = optax.sgd(0.5)
    state = init_train_state(
        params,
        optimizer,
        algorithm.transform,
        jax.random.PRNGKey(0),
        keep_reference=reference,
        critic=critic,
    )
    if reference:  # a reference that differs from the policy
        state = state.replace(ref_params=jax.tree.map(lambda x: x * 1.3, state.ref_params))
    update = UpdateConfig(minibatches=minibatches, microbatches=microbatches, old_logprobs=mode)
    steps = make_steps(graphdef, optimizer, algorithm, ROLLOUT, update)
    state0 = jax.tree.map(jnp.copy, state)  # the update donates the state's buffers
    state, prepared, prepare_metrics = steps.prepare(state, batch)
    state, update_metrics = steps.update(state, prepared)
    return prepared, prepare_metrics, update_metrics, state.params, steps, state0


def count_dot_generals(jaxpr) -> int:
    """The `dot_general` equations of a (closed) jaxpr and every jaxpr nested in it."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "dot_general"
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else (param,):
                if hasattr(sub, "eqns") or hasattr(getattr(sub, "jaxpr", None), "eqns"):
                    count += count_dot_generals(sub)
    return count


def prepare_dot_generals(steps, state, batch) -> int:
    return count_dot_generals(jax.make_jaxpr(steps.prepare)(state, batch))


def assert_same_update(a, b, atol=1e-6):
    (_, pa, ua, params_a, *_), (_, pb, ub, params_b, *_) = a, b
    merged_a, merged_b = {**pa, **ua}, {**pb, **ub}
    assert sorted(merged_a) == sorted(merged_b)  # every metric, whichever step measures it
    for key in merged_a:
        np.testing.assert_allclose(merged_a[key], merged_b[key], atol=atol, err_msg=key)
    for x, y in zip(jax.tree.leaves(params_a), jax.tree.leaves(params_b)):
        np.testing.assert_allclose(x, y, atol=atol)


def test_the_plan_follows_the_declarations():
    grpo_alg = grpo(group_size=G)
    assert old_policy_plan("auto", grpo_alg, 1, 1)[:2] == (UPDATE, False)
    assert old_policy_plan("auto", grpo_alg, 1, 2).source == PREPARE  # off-policy
    assert old_policy_plan("auto", grpo_alg, 2, 1).source == PREPARE
    assert old_policy_plan("recompute", grpo_alg, 1, 1)[:2] == (PREPARE, True)
    assert old_policy_plan("sampler", grpo_alg, 3, 2)[:2] == (SAMPLER, False)
    # A KL loss reads ref_logprobs in the update only: no old pass.
    with_kl = grpo(group_size=G, ppo=PPOSettings(kl_coef=0.1))
    assert old_policy_plan("auto", with_kl, 1, 1).source == UPDATE
    # Transforms that read the old policy before the update.
    entro = entrocraft(group_size=G, total_steps=10)
    plan = old_policy_plan("auto", entro, 1, 1)
    assert plan[:2] == (PREPARE, True) and "old_entropy" in plan.reason
    assert old_policy_plan("sampler", entro, 1, 1)[:2] == (SAMPLER, True)  # entropy: the pass
    plan = old_policy_plan("auto", dgpo(group_size=G, vocab_size=30), 1, 1)
    assert plan.source == PREPARE and "old_ref_hellinger" in plan.reason
    tis = grpo_alg._replace(transform=chain(grpo_alg.transform, truncated_is()))
    plan = old_policy_plan("auto", tis, 1, 1)
    assert plan.source == PREPARE and "truncated_is" in plan.reason
    assert old_policy_plan("sampler", tis, 1, 1)[:2] == (SAMPLER, False)
    # An undeclared transform may read anything: recompute (and, under "sampler", the pass).
    undeclared = grpo_alg._replace(
        transform=chain(grpo_alg.transform, Transform(lambda: (), lambda b, s, c: (b, s, {})))
    )
    assert old_policy_plan("auto", undeclared, 1, 1).source == PREPARE
    assert old_policy_plan("sampler", undeclared, 1, 1).prepare_pass
    # PPO: a value head on the policy needs the policy's states; a separate critic does not,
    # but GAE's KL-in-reward reads old_logprobs.
    assert old_policy_plan("auto", ppo(), 1, 1, critic_has_trunk=False).source == PREPARE
    assert old_policy_plan("auto", ppo(), 1, 1, critic_has_trunk=True).source == UPDATE
    assert old_policy_plan("auto", ppo(kl_coef=0.1), 1, 1, critic_has_trunk=True).source == PREPARE
    with pytest.raises(ValueError, match="old_logprobs='x'"):
        UpdateConfig(old_logprobs="x")


@pytest.mark.parametrize("microbatches", [1, 2])
def test_auto_equals_recompute_on_policy_for_grpo(model, microbatches):
    batch = sampled_batch(*model)
    algorithm = grpo(group_size=G)
    rec = run(model, algorithm, "recompute", batch, microbatches=microbatches)
    auto = run(model, algorithm, "auto", batch, microbatches=microbatches)
    assert_same_update(rec, auto)
    assert float(auto[2]["pg/clip_frac"]) == 0.0 and float(auto[2]["pg/ratio_max"]) == 1.0
    assert not set(MOVED) & set(auto[1]) and set(MOVED) <= set(auto[2])  # measured in update
    assert set(MOVED) <= set(rec[1]) and not set(MOVED) & set(rec[2])
    # On-policy "auto" prepare has no forward pass of the policy; "recompute" has one.
    _, _, _, _, steps, state = auto
    assert prepare_dot_generals(steps, state, batch) == 0
    _, _, _, _, steps, state = rec
    assert prepare_dot_generals(steps, state, batch) > 0


def test_auto_equals_recompute_with_a_kl_loss_and_a_reference(model):
    batch = sampled_batch(*model, shift=0.2)  # a sampler mismatch: the metrics are not 0
    algorithm = grpo(group_size=G, ppo=PPOSettings(kl_coef=0.5))
    rec = run(model, algorithm, "recompute", batch, reference=True)
    auto = run(model, algorithm, "auto", batch, reference=True)
    assert_same_update(rec, auto, atol=2e-6)
    assert float(rec[1]["kl_to_ref"]) > 1e-3 and float(rec[1]["mismatch/abs_gap_mean"]) > 0.1
    # Only the reference's pass is left in prepare.
    _, _, _, _, steps, state = auto
    _, _, _, _, rec_steps, _ = rec
    assert (
        0
        < prepare_dot_generals(steps, state, batch)
        < prepare_dot_generals(rec_steps, state, batch)
    )


def test_auto_falls_back_to_recompute_when_a_transform_reads_the_old_policy(model):
    batch = sampled_batch(*model)
    algorithm = entrocraft(group_size=G, total_steps=10)  # reads extras.old_entropy
    rec = run(model, algorithm, "recompute", batch)
    auto = run(model, algorithm, "auto", batch)
    assert_same_update(rec, auto, atol=0.0)  # the same computation
    np.testing.assert_array_equal(auto[0].extras["old_entropy"], rec[0].extras["old_entropy"])


def test_auto_recomputes_off_policy(model):
    batch = sampled_batch(*model, shift=0.3)
    algorithm = grpo(group_size=G)
    rec = run(model, algorithm, "recompute", batch, minibatches=2)
    auto = run(model, algorithm, "auto", batch, minibatches=2)
    assert_same_update(rec, auto, atol=0.0)
    # The prepare pass ran: the trainer's log-probs, not the (shifted) sampler's.
    mask = np.asarray(batch.completion_mask)
    gap = np.asarray(auto[0].old_logprobs - batch.rollout_logprobs)
    np.testing.assert_allclose(gap[mask], 0.3, atol=1e-4)
    _, _, _, _, steps, state = auto
    _, _, _, _, rec_steps, _ = rec
    assert prepare_dot_generals(steps, state, batch) == prepare_dot_generals(
        rec_steps, state, batch
    )
    assert float(auto[2]["pg/ratio_max"]) > 1.0  # the second minibatch is off-policy


@pytest.mark.parametrize("minibatches", [1, 2])
def test_sampler_takes_the_rollout_logprobs_as_the_old_policy(model, minibatches):
    batch = sampled_batch(*model, shift=0.3)
    algorithm = grpo(group_size=G)
    sampler = run(model, algorithm, "sampler", batch, minibatches=minibatches)
    prepared, prepare_metrics, update_metrics, params, steps, state = sampler
    np.testing.assert_array_equal(prepared.old_logprobs, batch.rollout_logprobs)
    assert prepare_dot_generals(steps, state, batch) == 0
    # The same update as "recompute" given the sampler's log-probs as the old ones.
    graphdef, _ = model
    rec_steps = make_steps(
        graphdef,
        optax.sgd(0.5),
        algorithm,
        ROLLOUT,
        UpdateConfig(minibatches=minibatches, old_logprobs="recompute"),
    )
    _, rec_prepared, rec_metrics = rec_steps.prepare(state, batch)
    rec_state, rec_update = rec_steps.update(
        state, rec_prepared.replace(old_logprobs=batch.rollout_logprobs)
    )
    for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(rec_state.params)):
        np.testing.assert_allclose(x, y, atol=1e-6)
    np.testing.assert_allclose(update_metrics["loss"], rec_update["loss"], atol=1e-6)
    # The ratio is to the sampler: exp(0.3) on the first minibatch.
    assert float(update_metrics["pg/ratio_max"]) > 1.3
    # The mismatch metrics still measure the trainer against the sampler.
    assert sorted({**prepare_metrics, **update_metrics}) == sorted({**rec_metrics, **rec_update})
    if minibatches == 1:  # the first epoch is the pre-update policy: prepare's values
        for key in MOVED:
            np.testing.assert_allclose(update_metrics[key], rec_metrics[key], atol=1e-5)
    np.testing.assert_allclose(update_metrics["mismatch/abs_gap_mean"], 0.3, atol=0.01)


def test_a_separate_critic_needs_no_policy_pass(model):
    graphdef, params = model
    batch = sampled_batch(graphdef, params)
    algorithm = ppo()
    plan_auto = old_policy_plan("auto", algorithm, 1, 1, critic_has_trunk=True)
    assert plan_auto.source == UPDATE
    critic = init_critic(CONFIG.d_model, trunk=jax.tree.map(lambda x: x, params))
    results = {}
    for mode in ("recompute", "auto"):
        optimizer = optax.sgd(0.5)
        state = init_train_state(
            params, optimizer, algorithm.transform, jax.random.PRNGKey(0), critic=critic
        )
        state = state.replace(
            critic={
                **state.critic,
                "head": {"kernel": jnp.full((CONFIG.d_model,), 0.1), "bias": jnp.asarray(0.2)},
            }
        )
        steps = make_steps(
            graphdef,
            optimizer,
            algorithm,
            ROLLOUT,
            UpdateConfig(old_logprobs=mode),
            critic_graphdef=graphdef,
        )
        s, prepared, pm = steps.prepare(state, batch)
        s, um = steps.update(s, prepared)
        results[mode] = (prepared, pm, um, s.params)
        results[mode + "/dots"] = prepare_dot_generals(steps, state, batch)
    assert_same_update(
        (*results["recompute"], None, None), (*results["auto"], None, None), atol=2e-6
    )
    np.testing.assert_allclose(
        results["auto"][0].extras["old_values"], results["recompute"][0].extras["old_values"]
    )
    assert 0 < results["auto/dots"] < results["recompute/dots"]  # the critic's pass only
