"""Property tests over every public function and transform of `rljax.advantages`.

Random batches (see prop_cases.py): fully masked rows, single-token rows, extreme and
all-equal rewards, large log-prob gaps. Every output must be finite with the right
shape/dtype, token advantages must be 0 on masked tokens (every transform here promises it),
and the invariances the docstrings state must hold (group sums, group permutations,
telescoping sums). All functions run in one jitted program per shape (`_program`).
"""

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, os.path.dirname(__file__))
from prop_cases import (  # noqa: E402
    CAPACITY,
    CTX,
    GROUP_SHAPES,
    PROPS,
    assert_finite,
    assert_metrics,
    assert_same_structure,
    assert_token_field,
    build_batch,
    cases,
    group_sums,
    jit_program,
)

from rljax import advantages as adv  # noqa: E402

# name -> (transform factory given G, extras it reads, rewards key or None for "rewards").
TRANSFORMS = {
    "group_advantages": (lambda g: adv.group_advantages(g), (), None),
    "group_advantages_dr": (lambda g: adv.group_advantages(g, normalize_std=False), (), None),
    "leave_one_out_advantages": (lambda g: adv.leave_one_out_advantages(g), (), None),
    "greedy_baseline_advantages": (
        lambda g: adv.greedy_baseline_advantages(),
        ("baseline_reward",),
        None,
    ),
    "batch_whitened_advantages": (lambda g: adv.batch_whitened_advantages(), (), None),
    "batch_whitened_advantages_g": (lambda g: adv.batch_whitened_advantages(g), (), None),
    "gae_advantages": (lambda g: adv.gae_advantages(kl_coef=0.1), ("old_values",), None),
    "gae_advantages_token": (
        lambda g: adv.gae_advantages(lam=1.0, kl_coef=0.1, kl_estimator="k3"),
        ("old_values", "token_rewards"),
        None,
    ),
    "length_weighted_baseline_advantages": (
        lambda g: adv.length_weighted_baseline_advantages(g),
        (),
        None,
    ),
    "agent_advantages": (lambda g: adv.agent_advantages(g), ("agent_id",), None),
    "deviation_gated_advantages": (
        lambda g: adv.deviation_gated_advantages(32000),
        ("old_entropy", "old_ref_hellinger"),
        None,
    ),
    "expthink_advantages": (lambda g: adv.expthink_advantages(g), ("correct",), None),
    "expthink_advantages_no_flag": (lambda g: adv.expthink_advantages(g), (), None),
    "kernel_baseline_advantages": (
        lambda g: adv.kernel_baseline_advantages(1e-3),
        ("prompt_embedding",),
        None,
    ),
    "lead_advantages": (lambda g: adv.lead_advantages(g, l_min=1.0, l_max=8.0), (), None),
    "lead_advantages_asym": (
        lambda g: adv.lead_advantages(g, l_min=1.0, l_max=8.0, mode="max_asym", w_min=0.0),
        (),
        None,
    ),
    "optimal_token_baseline_advantages": (
        lambda g: adv.optimal_token_baseline_advantages(g, use_is_weight=True),
        ("old_sum_sq_prob",),
        None,
    ),
    "optimal_token_baseline_advantages_tail": (
        lambda g: adv.optimal_token_baseline_advantages(g, True, True, is_cap=2.0),
        ("old_sum_sq_prob", "token_rewards"),
        None,
    ),
    "pass_at_k_group_advantages": (
        lambda g: adv.pass_at_k_group_advantages(g, 2),
        (),
        "binary_rewards",
    ),
    "implicit_process_advantages": (lambda g: adv.implicit_process_advantages(g), (), None),
    "exploration_bias": (lambda g: adv.exploration_bias(0.1), (), None),
    "exploration_bias_correct": (
        lambda g: adv.exploration_bias(10.0, source="ref", only_correct=True),
        (),
        None,
    ),
}
# Transforms that write `batch.rewards`, not advantages.
REWARD_TRANSFORMS = ("exploration_bias", "exploration_bias_correct")
# Estimators comparing samples within groups only (or over the whole batch): reordering the
# groups reorders their advantages and nothing else.
PERMUTATION_INVARIANT = (
    "group_advantages",
    "leave_one_out_advantages",
    "batch_whitened_advantages_g",
    "length_weighted_baseline_advantages",
    "agent_advantages",
    "expthink_advantages",
    "lead_advantages",
    "pass_at_k_group_advantages",
    "implicit_process_advantages",
)
BANDWIDTHS = (1e-30, 1e-3, 1.0, 1e30)
TEMPERATURES = (1e-3, 1.0, 1e3)


def _transform_program(a: dict, g: int) -> dict:
    """Every advantage transform on one case (traced, G static)."""
    out = {}
    for name, (factory, extras, rewards_key) in TRANSFORMS.items():
        t = factory(g)
        rewards = None if rewards_key is None else a[rewards_key]
        batch, state, metrics = t.apply(build_batch(a, extras, rewards), t.init(), CTX)
        out[name] = {
            "advantages": batch.advantages,
            "rewards": batch.rewards,
            "extras": batch.extras,
            "state": state,
            "init": t.init(),
            "metrics": metrics,
        }
    return out


def _array_program(a: dict, g: int) -> dict:
    """Every array function of `rljax.advantages` on one case (traced, G static)."""
    out = {}
    r, mask = a["rewards"], a["completion_mask"]
    out["grpo"] = {
        f"{n}_{u}": adv.grpo_advantages(r, g, n, u) for n in (True, False) for u in (True, False)
    }
    out["rloo"] = adv.rloo_advantages(r, g)
    out["remax"] = adv.remax_advantages(r, a["baseline_reward"])
    out["reinforce_pp"] = {
        "plain": adv.reinforce_pp_advantages(r, mask),
        "grouped": adv.reinforce_pp_advantages(r, mask, g),
    }
    last = adv.last_token_rewards(r, mask)
    out["last_token_rewards"] = last
    out["gae"] = {
        f"{gamma}_{lam}": adv.gae(last, a["old_values"], mask, gamma, lam)
        for gamma in (0.0, 0.9, 1.0)
        for lam in (0.0, 1.0)
    }
    lengths = mask.sum(axis=1)
    out["opo"] = adv.opo_advantages(r, lengths, g)
    out["agent"] = adv.agent_normalized_advantages(r, a["group_id"], a["agent_id"], g)
    out["dgpo_weights"] = [
        adv.dgpo_token_weights(a["old_entropy"], a["old_ref_hellinger"], mask, 32000, temp)
        for temp in TEMPERATURES
    ]
    seq = {n: adv.sequence_logprob(a["old_logprobs"], mask, n) for n in (True, False)}
    out["sequence_logprob"] = seq
    out["biased"] = adv.exploration_biased_rewards(r, seq[True], 0.1)
    t = adv.expthink_rewards(CAPACITY, full_credit=1.0, discount=0.5)
    states, tiers = [t.init()], []
    for _ in range(2):  # the second apply reads the L* the first one wrote
        batch, state, metrics = t.apply(build_batch(a, ("prompt_id",)), states[-1], CTX)
        states.append(state)
        tiers.append((batch.rewards, batch.extras["correct"], metrics))
    out["expthink_rewards"] = {"states": states, "tiers": tiers}
    out["difficulty"] = adv.difficulty_adaptive_advantages(r, a["correct"], g)
    out["gpm"] = adv.gpm_dimension_rewards(a["gpm_embedding"], g)
    multi = r[:, None] * jnp.array([1.0, 1.5, 2.0], jnp.float32)  # [B, 3] per-dimension
    out["gprl"] = adv.gprl_advantages(multi, g)
    t = adv.preference_advantages(g, num_dimensions=3, drift_window=2)
    state, batch, pref = t.init(), build_batch(a, (), multi), []
    for _ in range(3):  # fills the drift monitor's window
        batch, new_state, metrics = t.apply(batch, state, CTX)
        pref.append((state, new_state, metrics))
        state = new_state
    out["preference"] = {"steps": pref, "batch": (batch.advantages, batch.extras)}
    out["kernel_baseline"] = [adv.kernel_baseline(r, a["prompt_embedding"], h) for h in BANDWIDTHS]
    lengths_f = lengths.astype(jnp.float32)
    correct = r >= 1.0
    targets = adv.target_lengths(lengths_f, correct, g, l_min=1.0, l_max=8.0)
    r_eff = {m: adv.efficiency_rewards(lengths_f, targets, correct, m) for m in adv.lead.MODES}
    mu, sigma = adv.pooled_group_stats(r, correct, g)
    psi = adv.psi_target_weights(mu, sigma, jnp.mean(r_eff["max_sym"]), jnp.std(r_eff["max_sym"]))
    out["lead"] = {"targets": targets, "r_eff": r_eff, "stats": (mu, sigma), "psi": psi}
    proxy = adv.logit_gradient_proxy(a["old_logprobs"], a["old_sum_sq_prob"])
    returns = r[:, None] * mask
    out["otb"] = {
        "proxy": proxy,
        "adv": [adv.optimal_token_baseline(returns, proxy, mask, g, tail) for tail in (0, 1)],
    }
    rb = a["binary_rewards"]
    ks = sorted({1, 2, g})
    out["pass_at_k"] = {
        "values": [adv.pass_at_k_values(rb, g, k) for k in ks],
        "adv": [adv.pass_at_k_advantages(rb, g, k) for k in ks],
    }
    out["prefix_tree"] = adv.prefix_tree_advantages(a["completion_tokens"], mask, r, g)
    out["masked_stats"] = adv.masked_stats(r[:, None] * mask, mask, "s")
    return out


run_transforms = jit_program(_transform_program)
run = jit_program(_array_program)


def _scale(x: np.ndarray, g: int) -> np.ndarray:
    """[B/G] largest |x| of each group (float64), a tolerance scale."""
    return np.abs(np.asarray(x, np.float64)).reshape(-1, g).max(axis=1)


@PROPS
@given(case=cases())
def test_advantage_transforms_are_finite_masked_and_keep_their_state(case):
    out = run_transforms(case)
    mask = case.completion_mask
    for name in TRANSFORMS:
        o = out[name]
        assert_metrics(o["metrics"])
        assert_same_structure(o["state"], o["init"])
        assert_finite(o["extras"], f"{name} extras")
        if name in REWARD_TRANSFORMS:
            assert o["rewards"].shape == case.rewards.shape
            assert_finite(o["rewards"], f"{name} rewards")
            empty = ~mask.any(axis=1)  # a fully masked row gets no bonus
            np.testing.assert_array_equal(o["rewards"][empty], case.rewards[empty])
        else:
            assert_token_field(o["advantages"], mask, f"{name} advantages")
    for name in ("gae_advantages", "gae_advantages_token"):
        assert_token_field(out[name]["extras"]["returns"], mask, f"{name} returns")


@pytest.mark.parametrize("name", PERMUTATION_INVARIANT)
@PROPS
@given(case=cases(), perm_seed=st.integers(0, 1000))
def test_permuting_groups_permutes_advantages(name, case, perm_seed):
    n_groups = case.shape[0] // case.group_size
    perm = np.random.default_rng(perm_seed).permutation(n_groups)
    rows = (perm[:, None] * case.group_size + np.arange(case.group_size)).reshape(-1)
    out = run_transforms(case)[name]["advantages"]
    out_perm = run_transforms(case.permuted(perm))[name]["advantages"]
    scale = max(float(np.max(np.abs(out))), 1.0)
    np.testing.assert_allclose(out_perm, out[rows], atol=1e-4 * scale)


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_group_relative_advantages_sum_to_zero_and_vanish_on_equal_groups(case):
    out, g, r = run(case), case.group_size, case.rewards
    equal = np.all(r.reshape(-1, g) == r.reshape(-1, g)[:, :1], axis=1)
    slack = 1e-5 * g * (_scale(r, g) + 1e-30)
    for key, a in out["grpo"].items():
        assert a.shape == r.shape and a.dtype == np.float32
        assert_finite(a, f"grpo {key}")
        assert np.all(a.reshape(-1, g)[equal] == 0)
        # Centred on the group mean: ~0 relative to the largest advantage (+1 for z-scores).
        assert np.all(np.abs(group_sums(a, g)) <= 1e-4 * g * (_scale(a, g) + 1.0))
    for name in ("rloo", "difficulty"):
        assert_finite(out[name], name)
        assert np.all(out[name].reshape(-1, g)[equal] == 0)
        assert np.all(np.abs(group_sums(out[name], g)) <= slack)
    # OPO: sum_i L_i A_i = 0 in every group.
    lengths = case.completion_mask.sum(axis=1)
    assert_finite(out["opo"], "opo")
    weighted = group_sums(out["opo"] * lengths, g)
    assert np.all(np.abs(weighted) <= 1e-5 * lengths.reshape(-1, g).sum(axis=1) * _scale(r, g))
    # Dr. MAS: the advantages of each (group, agent) cell sum to 0.
    agents = case.extras["agent_id"].reshape(-1, g)
    a = out["agent"].reshape(-1, g).astype(np.float64)
    assert_finite(a, "agent")
    for group in range(a.shape[0]):
        for agent in np.unique(agents[group]):
            cell = a[group][agents[group] == agent]
            assert abs(cell.sum()) <= 1e-4 * (np.abs(cell).max() + 1.0)


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_remax_and_reinforce_pp(case):
    out, mask = run(case), case.completion_mask
    np.testing.assert_array_equal(out["remax"], case.rewards - case.extras["baseline_reward"])
    for key, a in out["reinforce_pp"].items():
        assert_token_field(a, mask, f"reinforce_pp {key}")
        valid = a[mask].astype(np.float64)
        if np.any(valid != 0):  # whitened: zero token mean over the valid tokens
            assert abs(valid.mean()) <= 1e-3 * np.abs(valid).max()


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_gae_and_last_token_rewards(case):
    out, mask = run(case), case.completion_mask
    last = out["last_token_rewards"]
    assert_token_field(last, mask, "last_token_rewards")
    # The reward sits on one token of each row with a valid token, none of an empty row.
    np.testing.assert_array_equal(last.sum(axis=1), np.where(mask.any(axis=1), case.rewards, 0))
    for key, (a, ret) in out["gae"].items():
        assert_token_field(a, mask, f"gae {key} advantages")
        assert_token_field(ret, mask, f"gae {key} returns")
    # gamma = lam = 1 with a terminal reward: A_t = r - V_t on every valid token.
    a = out["gae"]["1.0_1.0"][0].astype(np.float64)
    expected = np.where(mask, case.rewards[:, None] - case.extras["old_values"], 0.0)
    np.testing.assert_allclose(a, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_dgpo_weights_sum_to_length(case):
    out, mask = run(case), case.completion_mask
    for w in out["dgpo_weights"]:
        assert_token_field(w, mask, "dgpo weights")
        assert np.all(w >= 0)
        np.testing.assert_allclose(w.sum(axis=1, dtype=np.float64), mask.sum(axis=1), rtol=1e-4)


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_exploration_bias_parts(case):
    out, mask = run(case), case.completion_mask
    for seq in out["sequence_logprob"].values():
        assert seq.shape == case.rewards.shape
        assert_finite(seq, "sequence_logprob")
        assert np.all(seq <= 0) and np.all(seq[~mask.any(axis=1)] == 0)
    assert_finite(out["biased"], "exploration_biased_rewards")
    assert np.all(out["biased"] >= case.rewards)  # the bonus -coef * log pi is >= 0


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_expthink_rewards_are_tiers_and_shortest_lengths_never_grow(case):
    out = run(case)["expthink_rewards"]
    states = out["states"]
    for old, new in zip(states[:-1], states[1:]):
        assert_same_structure(new, old)
        assert np.all(new <= old)
    for rewards, correct, metrics in out["tiers"]:
        assert_metrics(metrics)
        assert set(np.unique(rewards)) <= {0.0, 0.5, 1.0}
        np.testing.assert_array_equal(correct, case.rewards >= 1.0)


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_gprl_rewards_advantages_and_drift_monitor(case):
    out, g = run(case), case.group_size
    r = out["gpm"]
    assert r.shape == (case.shape[0], 3)
    assert_finite(r, "gpm rewards")
    # Skew-symmetric scores: every dimension's rewards sum to 0 over a group.
    emb_scale = np.abs(case.extras["gpm_embedding"]).max() ** 2 + 1e-30
    sums = r.astype(np.float64).reshape(-1, g, 3).sum(axis=1)
    assert np.all(np.abs(sums) <= 1e-5 * g * emb_scale)
    assert out["gprl"].shape == case.rewards.shape
    assert_finite(out["gprl"], "gprl advantages")
    for state, new_state, metrics in out["preference"]["steps"]:
        assert_same_structure(new_state, state)
        assert_metrics(metrics)
    advantages, extras = out["preference"]["batch"]
    assert_token_field(advantages, case.completion_mask, "preference advantages")
    assert_finite(extras["clip_scale"], "clip_scale")


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_kernel_baseline_is_a_convex_combination_of_rewards(case):
    r = case.rewards
    slack = 1e-5 * np.abs(r).max()
    for v in run(case)["kernel_baseline"]:
        assert v.shape == r.shape
        assert_finite(v, "kernel_baseline")
        assert np.all(v >= r.min() - slack) and np.all(v <= r.max() + slack)


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_lead_parts_are_finite_and_bounded(case):
    out = run(case)["lead"]
    assert np.all((out["targets"] >= 1.0) & (out["targets"] <= 8.0))
    for mode, r_eff in out["r_eff"].items():
        assert_finite(r_eff, mode)
        assert np.all((r_eff >= -1.0) & (r_eff <= 1.0))
    mu, sigma = out["stats"]
    assert_finite((mu, sigma), "pooled_group_stats")
    assert sigma >= 0
    assert out["psi"].shape == (2,)
    assert_finite(out["psi"], "psi weights")
    assert np.all(out["psi"] >= 0) and out["psi"].sum() <= 1.0 + 1e-5


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_optimal_token_baseline(case):
    out, mask = run(case)["otb"], case.completion_mask
    assert out["proxy"].shape == mask.shape
    assert np.all((out["proxy"] >= 0) & (out["proxy"] <= 2))
    for a in out["adv"]:
        assert_token_field(a, mask, "optimal_token_baseline")


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_pass_at_k_values_bounded_and_advantages_sum_to_zero(case):
    out, g = run(case)["pass_at_k"], case.group_size
    for values, a in zip(out["values"], out["adv"]):
        assert values.shape == (case.shape[0] // g,)
        assert np.all((values >= 0) & (values <= 1))
        assert_finite(a, "pass@k advantages")
        assert np.all(np.abs(group_sums(a, g)) <= 1e-4 * (_scale(a, g) + 1.0))


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_prefix_tree_advantages_telescope(case):
    g, mask, tok = case.group_size, case.completion_mask, case.completion_tokens
    a = run(case)["prefix_tree"]
    assert_token_field(a, mask, "ibpo")
    # Row sum = mean reward of the group's responses that agree with i up to i's last valid
    # token (same validity, same valid tokens) minus the group mean; 0 for an empty row.
    r = case.rewards.astype(np.float64)
    for i in range(len(r)):
        start = i - i % g
        expected = 0.0
        if mask[i].any():
            last = np.flatnonzero(mask[i])[-1] + 1
            valid = mask[i, :last]
            same = [
                j
                for j in range(start, start + g)
                if np.array_equal(mask[j, :last], valid)
                and np.array_equal(tok[j, :last][valid], tok[i, :last][valid])
            ]
            expected = r[same].mean() - r[start : start + g].mean()
        scale = np.abs(r[start : start + g]).max() + 1e-30
        assert abs(a[i].astype(np.float64).sum() - expected) <= 1e-5 * scale


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_masked_stats_are_finite_and_ordered(case):
    stats = run(case)["masked_stats"]
    assert_metrics(stats)
    if case.completion_mask.any():
        lo, hi, mean = stats["s/min"], stats["s/max"], stats["s/mean"]
        assert lo <= hi and stats["s/std"] >= 0
        assert lo - 1e-6 * abs(lo) <= mean <= hi + 1e-6 * abs(hi)
    else:
        assert all(v == 0 for v in stats.values())
