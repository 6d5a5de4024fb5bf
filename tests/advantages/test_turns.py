"""Multi-turn advantages against per-row, per-turn python loops, and the transforms' plumbing."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.group import group_advantages
from rljax.advantages.turns import (
    broadcast_turns,
    turn_gae,
    turn_gae_transform,
    turn_group_advantage_transform,
    turn_group_advantages,
    turn_ids,
    turn_returns,
    turn_start_values,
)
from rljax.algorithms import Algorithm
from rljax.core.batch import make_batch
from rljax.core.keys import check_algorithm
from rljax.core.transform import Context, chain
from rljax.objectives.surrogate import ppo_clip
from rljax.objectives.value import clipped_value_loss

CTX = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))


# ---------------------------------------------------------------- loop references


def layout_masks(rows, t):
    """Masks from per-row layouts: strings over 'P' (policy), 'E' (env); padded to t."""
    policy = np.zeros((len(rows), t), bool)
    env = np.zeros((len(rows), t), bool)
    for b, row in enumerate(rows):
        for i, c in enumerate(row):
            policy[b, i] = c == "P"
            env[b, i] = c == "E"
    return policy, env


def reference_turn_ids(policy, env):
    out = np.full(policy.shape, -1, np.int64)
    for b in range(policy.shape[0]):
        turn, inside = -1, False
        for t in range(policy.shape[1]):
            if policy[b, t]:
                if not inside:
                    turn += 1
                inside = True
                out[b, t] = turn
            else:
                inside = False
                if env[b, t]:
                    out[b, t] = turn
    return out


def reference_returns(rewards, num_turns, gamma):
    out = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        n = int(num_turns[b])
        for k in range(n):
            out[b, k] = sum(gamma ** (j - k) * float(rewards[b, j]) for j in range(k, n))
    return out


def reference_turn_group(rewards, num_turns, g, gamma, scale, ddof, eps=1e-6):
    returns = reference_returns(rewards, num_turns, gamma)
    out = np.zeros(rewards.shape)
    for start in range(0, rewards.shape[0], g):
        for k in range(rewards.shape[1]):
            members = [i for i in range(start, start + g) if num_turns[i] > k]
            vals = [returns[i, k] for i in members]
            if len(vals) < 2 or max(vals) == min(vals):
                continue  # one sample or no spread: no signal, 0
            mean = sum(vals) / len(vals)
            std = (sum((v - mean) ** 2 for v in vals) / (len(vals) - ddof)) ** 0.5
            for i in members:
                out[i, k] = (returns[i, k] - mean) / (std + eps) if scale else returns[i, k] - mean
    return out


def reference_turn_gae(rewards, values, num_turns, gamma, lam):
    adv = np.zeros(rewards.shape)
    ret = np.zeros(rewards.shape)
    for b in range(rewards.shape[0]):
        n = int(num_turns[b])
        running = 0.0
        for k in reversed(range(n)):
            next_v = values[b, k + 1] if k + 1 < n else 0.0
            delta = rewards[b, k] + gamma * next_v - values[b, k]
            running = delta + gamma * lam * running
            adv[b, k] = running
            ret[b, k] = running + values[b, k]
    return adv, ret


def reference_broadcast(per_turn, policy, env):
    ids = reference_turn_ids(policy, env)
    out = np.zeros(policy.shape)
    for b in range(policy.shape[0]):
        for t in range(policy.shape[1]):
            if policy[b, t] and ids[b, t] < per_turn.shape[1]:
                out[b, t] = per_turn[b, ids[b, t]]
    return out


def reference_start_values(values, policy, k):
    out = np.zeros((values.shape[0], k))
    for b in range(values.shape[0]):
        turn = -1
        for t in range(values.shape[1]):
            if policy[b, t] and (t == 0 or not policy[b, t - 1]):
                turn += 1
                if turn < k:
                    out[b, turn] = values[b, t]
    return out


# ---------------------------------------------------------------- turn_ids


def test_turn_ids_hand_cases():
    rows = [
        "PPP",  # one turn
        "PPEEPEPP",  # three turns
        "",  # all padding
        "PEEPP",  # two turns, then padding
    ]
    policy, env = layout_masks(rows, 8)
    want = [
        [0, 0, 0, -1, -1, -1, -1, -1],
        [0, 0, 0, 0, 1, 1, 2, 2],
        [-1] * 8,
        [0, 0, 0, 1, 1, -1, -1, -1],
    ]
    np.testing.assert_array_equal(turn_ids(jnp.asarray(policy), jnp.asarray(env)), want)
    # The Batch stores env_mask as float32 0/1: the same ids.
    got = turn_ids(jnp.asarray(policy), jnp.asarray(env, jnp.float32))
    np.testing.assert_array_equal(got, want)
    assert got.dtype == jnp.int32


def test_turn_ids_match_loop_on_random_layouts():
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(6):
        row = ""
        for k in range(rng.integers(1, 4)):
            row += ("E" * int(rng.integers(1, 3)) if k else "") + "P" * int(rng.integers(1, 4))
        rows.append(row)
    policy, env = layout_masks(rows, 20)
    got = jax.jit(turn_ids)(policy, env)
    np.testing.assert_array_equal(got, reference_turn_ids(policy, env))


# ---------------------------------------------------------------- turn_returns


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_turn_returns_match_loop_and_ignore_rewards_past_the_last_turn(gamma):
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(4, 4)).astype(np.float32)  # entries past num_turns: garbage
    num_turns = np.array([1, 4, 2, 0], np.float32)
    got = jax.jit(turn_returns, static_argnums=2)(rewards, num_turns, gamma)
    np.testing.assert_allclose(got, reference_returns(rewards, num_turns, gamma), atol=1e-5)
    assert np.all(np.asarray(got)[3] == 0) and np.all(np.asarray(got)[0, 1:] == 0)


def test_turn_returns_hand_case():
    # r = [1, 0, 2], gamma 0.5: R_2 = 2, R_1 = 0 + 0.5 * 2 = 1, R_0 = 1 + 0.5 * 1 = 1.5.
    got = turn_returns(jnp.array([[1.0, 0.0, 2.0]]), jnp.array([3]), 0.5)
    np.testing.assert_allclose(got, [[1.5, 1.0, 2.0]], rtol=1e-6)


# ---------------------------------------------------------------- turn_group_advantages

# Two groups of G = 3, K = 3 turns, gamma = 1; rewards past num_turns are garbage (9).
HAND_REWARDS = np.array(
    [
        [0.0, 1.0, 9.0],  # a: 2 turns, R = [1, 1]
        [0.5, 9.0, 9.0],  # b: 1 turn,  R = [0.5]
        [1.0, -1.0, 9.0],  # c: 2 turns, R = [0, -1]
        [1.0, 0.0, 2.0],  # d: 3 turns, R = [3, 2, 2]
        [2.0, 9.0, 9.0],  # e: 1 turn,  R = [2]
        [0.0, 9.0, 9.0],  # f: 1 turn,  R = [0]
    ],
    np.float32,
)
HAND_TURNS = np.array([2, 1, 2, 3, 1, 1], np.float32)


def test_turn_group_hand_case():
    # Group 1, turn 0: R = [1, 0.5, 0] over {a, b, c}, mean 0.5, centred [0.5, 0, -0.5];
    #   unbiased var (0.25 + 0 + 0.25) / 2 = 0.25, std 0.5 -> A = [1, 0, -1];
    #   population var 0.5 / 3, std 0.40825 -> A = +-1.22474.
    # Group 1, turn 1: only {a, c} reached it: R = [1, -1], mean 0, centred [1, -1];
    #   unbiased std sqrt(2) -> +-0.70711; population std 1 -> +-1; b gets 0 (not reached).
    # Group 2, turn 0: R = [3, 2, 0], mean 5/3, centred [4/3, 1/3, -5/3]; unbiased var
    #   (16 + 1 + 25) / 9 / 2 = 7/3. Turns 1 and 2: only d reached them -> exactly 0.
    def run(scale, unbiased):
        out = turn_group_advantages(
            jnp.asarray(HAND_REWARDS), jnp.asarray(HAND_TURNS), 3, 1.0, scale, 1e-6, unbiased
        )
        return np.asarray(out)

    s = 1 / np.sqrt(2)
    g2 = np.array([4, 1, -5]) / 3 / np.sqrt(7 / 3)
    want = [
        [1, s, 0],
        [0, 0, 0],
        [-1, -s, 0],
        [g2[0], 0, 0],
        [g2[1], 0, 0],
        [g2[2], 0, 0],
    ]
    np.testing.assert_allclose(run(True, True), want, rtol=1e-5, atol=1e-6)
    pop = run(True, False)
    np.testing.assert_allclose(pop[:3, 0], [1.224745, 0, -1.224745], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(pop[:3, 1], [1, 0, -1], rtol=1e-5, atol=1e-6)
    raw = run(False, True)
    np.testing.assert_allclose(raw[:3, :2], [[0.5, 1], [0, 0], [-0.5, -1]], atol=1e-6)
    np.testing.assert_allclose(raw[3:, 0], [4 / 3, 1 / 3, -5 / 3], rtol=1e-5)
    # A turn reached by one sample only, and turns nobody reached: exactly 0.
    for out in (run(True, True), pop, raw):
        assert np.all(out[3:, 1:] == 0) and np.all(out[1, 1:] == 0)


@pytest.mark.parametrize("gamma", [1.0, 0.8])
@pytest.mark.parametrize("scale, unbiased", [(True, True), (True, False), (False, True)])
def test_turn_group_matches_loop_with_ragged_turns(gamma, scale, unbiased):
    rng = np.random.default_rng(2)
    rewards = rng.normal(size=(8, 4)).astype(np.float32)
    num_turns = np.array([4, 2, 1, 3, 1, 1, 2, 4], np.float32)  # groups of 4, ragged
    fn = jax.jit(turn_group_advantages, static_argnums=(2, 3, 4, 5, 6))
    got = fn(rewards, num_turns, 4, gamma, scale, 1e-6, unbiased)
    want = reference_turn_group(rewards, num_turns, 4, gamma, scale, 1 if unbiased else 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_turn_group_equal_returns_give_exact_zero():
    # 0.1 + 0.2 is not exact in float32: a naive (R - mean) / eps would amplify the rounding
    # residue. Group 1 has equal returns on both turns; group 2 differs on turn 0 only.
    rewards = np.array(
        [[0.1, 0.2], [0.1, 0.2], [0.1, 0.2], [0.1, 0.2], [0.7, 0.2], [0.1, 0.2]], np.float32
    )
    num_turns = jnp.array([2, 2, 2, 2, 2, 2])
    for scale in (True, False):
        out = np.asarray(turn_group_advantages(jnp.asarray(rewards), num_turns, 3, 1.0, scale))
        assert np.all(np.isfinite(out))
        np.testing.assert_array_equal(out[:3], 0.0)
        np.testing.assert_array_equal(out[3:, 1], 0.0)
        assert np.abs(out[3:, 0]).max() > 0.1


def test_errors():
    with pytest.raises(ValueError, match="group_size=1"):
        turn_group_advantages(jnp.zeros((2, 2)), jnp.ones(2), 1)
    with pytest.raises(ValueError, match="group_size=3 does not divide batch 4"):
        turn_group_advantages(jnp.zeros((4, 2)), jnp.ones(4), 3)
    with pytest.raises(ValueError, match="gamma=1.5"):
        turn_returns(jnp.zeros((2, 2)), jnp.ones(2), 1.5)
    with pytest.raises(ValueError, match="lam=2"):
        turn_gae_transform(lam=2.0)
    with pytest.raises(ValueError, match="group_size=1"):
        turn_group_advantage_transform(1)


# ---------------------------------------------------------------- turn_gae


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.0), (0.99, 0.5), (0.9, 1.0)])
def test_turn_gae_matches_loop(gamma, lam):
    rng = np.random.default_rng(3)
    rewards = rng.normal(size=(4, 3)).astype(np.float32)
    values = rng.normal(size=(4, 3)).astype(np.float32)  # past num_turns: ignored
    num_turns = np.array([3, 1, 2, 0], np.float32)
    adv, ret = jax.jit(turn_gae, static_argnums=(3, 4))(rewards, values, num_turns, gamma, lam)
    want_adv, want_ret = reference_turn_gae(rewards, values, num_turns, gamma, lam)
    np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_turn_gae_lambda_one_is_return_minus_value(gamma):
    rng = np.random.default_rng(4)
    rewards = rng.normal(size=(3, 4)).astype(np.float32)
    values = rng.normal(size=(3, 4)).astype(np.float32)
    num_turns = np.array([4, 2, 3], np.float32)
    adv, ret = turn_gae(rewards, values, num_turns, gamma, 1.0)
    big_r = reference_returns(rewards, num_turns, gamma)
    reached = np.arange(4)[None, :] < num_turns[:, None]
    np.testing.assert_allclose(adv, (big_r - values) * reached, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, big_r, rtol=1e-5, atol=1e-5)


def test_turn_gae_zero_values_undiscounted_gives_the_returns():
    rewards = jnp.array([[1.0, -2.0, 0.5], [3.0, 7.0, 7.0]])
    num_turns = jnp.array([3, 1])
    adv, ret = turn_gae(rewards, jnp.zeros((2, 3)), num_turns, 1.0, 1.0)
    want = [[-0.5, -1.5, 0.5], [3.0, 0.0, 0.0]]
    np.testing.assert_allclose(adv, want, rtol=1e-6)
    np.testing.assert_allclose(ret, want, rtol=1e-6)
    np.testing.assert_allclose(turn_returns(rewards, num_turns, 1.0), want, rtol=1e-6)


# ---------------------------------------------------------------- broadcast, start values

ROWS = ["PPEEPEPP", "PPP", "", "PEEPP"]


def test_broadcast_zero_on_env_and_padding():
    policy, env = layout_masks(ROWS, 9)
    per_turn = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0], [-1.0, -2.0, -3.0]])
    got = np.asarray(broadcast_turns(per_turn, turn_ids(policy, env), policy))
    want = [
        [1, 1, 0, 0, 2, 0, 3, 3, 0],
        [4, 4, 4, 0, 0, 0, 0, 0, 0],
        [0] * 9,
        [-1, 0, 0, -2, -2, 0, 0, 0, 0],
    ]
    np.testing.assert_array_equal(got, want)
    assert np.all(got[env] == 0) and np.all(got[~(policy | env)] == 0)
    np.testing.assert_array_equal(got, reference_broadcast(np.asarray(per_turn), policy, env))


def test_broadcast_drops_turns_beyond_k():
    policy, env = layout_masks(["PEPEP"], 5)  # 3 turns, only K = 2 slots
    got = broadcast_turns(jnp.array([[1.0, 2.0]]), turn_ids(policy, env), policy)
    np.testing.assert_array_equal(got, [[1, 0, 2, 0, 0]])


def test_turn_start_values():
    policy, env = layout_masks(ROWS + ["PEPEP"], 9)
    values = np.arange(45, dtype=np.float32).reshape(5, 9) + 0.5
    got = jax.jit(turn_start_values, static_argnums=3)(values, turn_ids(policy, env), policy, 2)
    want = [[0.5, 4.5], [9.5, 0.0], [0.0, 0.0], [27.5, 30.5], [36.5, 38.5]]  # last: turn 2 dropped
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, reference_start_values(values, policy, 2))


# ---------------------------------------------------------------- transforms


def episode_batch(rows, t, turn_rewards, num_turns, rewards=None, values=None, group_size=2):
    """A multi-turn batch as the collector builds it (env_mask and num_turns as float32)."""
    policy, env = layout_masks(rows, t)
    b = len(rows)
    extras = {
        "env_mask": env.astype(np.float32),
        "turn_rewards": np.asarray(turn_rewards, np.float32),
        "num_turns": np.asarray(num_turns, np.float32),
    }
    if values is not None:
        extras["old_values"] = values
    if rewards is None:
        rewards = np.asarray(turn_rewards, np.float32).sum(axis=1)
    return make_batch(
        prompt_tokens=np.zeros((b, 2)),
        prompt_mask=np.ones((b, 2)),
        completion_tokens=np.zeros((b, t)),
        completion_mask=policy,
        group_id=np.arange(b) // group_size,
        rewards=rewards,
        extras=extras,
    ), (policy, env)


# Two groups of 3 with ragged turns; turn rewards 0 past each row's last turn.
EP_ROWS = ["PPEPEEP", "PPP", "PEPP", "PEPEP", "PPPP", "PEEPP"]
EP_TURNS = [3, 1, 2, 3, 1, 2]
EP_REWARDS = [
    [0.0, 0.5, 1.0],
    [0.3, 0.0, 0.0],
    [0.2, -1.0, 0.0],
    [0.1, 0.1, 0.1],
    [1.0, 0.0, 0.0],
    [0.0, 2.0, 0.0],
]


@pytest.mark.parametrize("gamma, scale", [(1.0, True), (0.9, False)])
def test_turn_group_transform_under_jit_matches_the_functions(gamma, scale):
    batch, (policy, env) = episode_batch(EP_ROWS, 8, EP_REWARDS, EP_TURNS, group_size=3)
    t = turn_group_advantage_transform(3, gamma=gamma, scale_by_std=scale)
    out, _, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    per_turn = turn_group_advantages(
        jnp.asarray(EP_REWARDS), jnp.asarray(EP_TURNS), 3, gamma, scale
    )
    want = broadcast_turns(per_turn, turn_ids(policy, env), policy)
    np.testing.assert_allclose(out.advantages, want, rtol=1e-6, atol=1e-7)
    # And against the loops end to end; env tokens and padding exactly 0.
    loop = reference_turn_group(np.array(EP_REWARDS), np.array(EP_TURNS), 3, gamma, scale, ddof=1)
    np.testing.assert_allclose(
        out.advantages, reference_broadcast(loop, policy, env), rtol=1e-4, atol=1e-5
    )
    assert np.all(np.asarray(out.advantages)[~policy] == 0)
    np.testing.assert_allclose(metrics["turn_group/num_turns_mean"], 2.0)
    assert "turn_group/advantages/mean" in metrics


def test_turn_gae_transform_under_jit_matches_the_functions():
    rng = np.random.default_rng(5)
    values = rng.normal(size=(6, 8)).astype(np.float32)
    batch, (policy, env) = episode_batch(EP_ROWS, 8, EP_REWARDS, EP_TURNS, values=values)
    t = turn_gae_transform(gamma=0.9, lam=0.8)
    out, _, metrics = jax.jit(t.apply)(batch, t.init(), CTX)
    ids = turn_ids(policy, env)
    turn_values = turn_start_values(values, ids, policy, 3)
    adv, ret = turn_gae(jnp.asarray(EP_REWARDS), turn_values, jnp.asarray(EP_TURNS), 0.9, 0.8)
    np.testing.assert_allclose(out.advantages, broadcast_turns(adv, ids, policy), rtol=1e-6)
    np.testing.assert_allclose(out.extras["returns"], broadcast_turns(ret, ids, policy), rtol=1e-6)
    # Against the loops: values at each turn's first policy token, GAE over turns.
    loop_v = reference_start_values(values, policy, 3)
    loop_adv, loop_ret = reference_turn_gae(
        np.array(EP_REWARDS), loop_v, np.array(EP_TURNS), 0.9, 0.8
    )
    np.testing.assert_allclose(
        out.advantages, reference_broadcast(loop_adv, policy, env), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(
        out.extras["returns"], reference_broadcast(loop_ret, policy, env), rtol=1e-5, atol=1e-6
    )
    assert np.all(np.asarray(out.advantages)[~policy] == 0)
    assert np.all(np.asarray(out.extras["returns"])[~policy] == 0)
    reached = np.arange(3)[None, :] < np.array(EP_TURNS)[:, None]
    np.testing.assert_allclose(metrics["turn_gae/returns_mean"], loop_ret[reached].mean(), 1e-5)


def test_transforms_declare_keys_that_pass_the_algorithm_check():
    check_algorithm(Algorithm(chain(turn_group_advantage_transform(3)), ppo_clip()))
    with_critic = Algorithm(
        chain(turn_gae_transform()), ppo_clip(), value_loss=clipped_value_loss()
    )
    check_algorithm(with_critic)
    with pytest.raises(ValueError, match="only the critic produces"):
        check_algorithm(with_critic._replace(value_loss=None))


def test_transforms_name_the_missing_extras():
    batch, _ = episode_batch(EP_ROWS, 8, EP_REWARDS, EP_TURNS, group_size=3)
    no_turns = batch.replace(extras={k: v for k, v in batch.extras.items() if k != "turn_rewards"})
    t = turn_group_advantage_transform(3)
    with pytest.raises(ValueError, match="needs batch.extras\\['turn_rewards'\\]"):
        t.apply(no_turns, (), CTX)
    with pytest.raises(ValueError, match="needs the critic's values"):
        turn_gae_transform().apply(batch, (), CTX)


# ---------------------------------------------------------------- trajectory-level GRPO


def test_existing_grpo_on_episodes_credits_policy_tokens_only():
    # rewards = the episode total (sum of turn rewards), one failed episode scored 0.
    totals = np.array(EP_REWARDS, np.float32).sum(axis=1)
    totals[4] = 0.0
    batch, (policy, env) = episode_batch(
        EP_ROWS, 8, EP_REWARDS, EP_TURNS, rewards=totals, group_size=3
    )
    t = group_advantages(3)
    out, _, _ = jax.jit(t.apply)(batch, t.init(), CTX)
    want = np.zeros(6)
    for start in (0, 3):  # numpy GRPO, unbiased std as grpo_advantages' default
        group = [float(x) for x in totals[start : start + 3]]
        mean = sum(group) / 3
        std = (sum((x - mean) ** 2 for x in group) / 2) ** 0.5
        for i in range(3):
            want[start + i] = (group[i] - mean) / (std + 1e-6)
    adv = np.asarray(out.advantages)
    for b in range(6):
        np.testing.assert_allclose(adv[b, policy[b]], want[b], rtol=1e-5)
    assert np.all(adv[env] == 0.0) and np.all(adv[~policy] == 0.0)
    assert env.sum() > 0 and np.abs(want).min() > 0.01  # the env zeros are not vacuous
