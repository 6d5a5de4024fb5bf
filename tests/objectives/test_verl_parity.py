"""rljax's policy losses and rollout corrections against verl 0.9.1 on identical float32
inputs: `core_algos`' policy losses and `rollout_corr_helper`'s IS weights and rejection masks.

verl runs in a subprocess from a throwaway --no-deps install (verl_reference.py); every call
of this module is answered by one subprocess. Compared: the loss, its gradient w.r.t. the new
log-probs and the metrics that mean the same thing, to 1e-5 relative; the IS weights to 1e-5;
the rejection masks exactly.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages.gdpo import gdpo_advantages
from rljax.advantages.optimal_token_baseline import optimal_token_baseline_advantages
from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.objectives.dppo import dppo
from rljax.objectives.gmpo import gmpo
from rljax.objectives.sapo import sapo
from rljax.quant.mismatch import divergence_rejection, icepop, masked_is, truncated_is

sys.path.insert(0, os.path.dirname(__file__))
import verl_reference  # noqa: E402

pytest.importorskip("torch", reason="the verl reference needs the [hf] extra (torch)")
pytestmark = pytest.mark.hf

B, T = 8, 16


def _inputs() -> dict[str, np.ndarray]:
    """Ragged rows (no empty one); probabilities in (0.05, 0.95), half of the new ones far from
    the old (ratios from ~0.01 to ~20: clips, masks and caps all fire) and half close; one
    advantage per row, both signs and zero; finite garbage on padding."""
    rng = np.random.default_rng(7)
    lengths = np.array([16, 11, 3, 14, 1, 9, 16, 6])
    mask = np.arange(T)[None, :] < lengths[:, None]
    p_old = rng.uniform(0.05, 0.95, (B, T))
    far = rng.random((B, T)) < 0.5
    p_new = np.where(far, rng.uniform(0.01, 0.99, (B, T)), p_old * rng.uniform(0.9, 1.1, (B, T)))
    p_new = np.clip(p_new, 1e-3, 0.999)
    adv = np.array([1.3, -0.8, 0.5, -1.7, 0.9, 0.0, -0.4, 1.1])[:, None] * mask
    old, new = np.log(p_old), np.log(p_new)
    old[~mask], new[~mask] = -3.0, -2.5
    return {
        "old_log_prob": old.astype(np.float32),
        "log_prob": new.astype(np.float32),
        "advantages": adv.astype(np.float32),
        "response_mask": mask.astype(np.float32),
    }


INPUTS = _inputs()

# (id, verl policy loss, its ActorConfig fields, its loss_agg_mode, our objective, metric map
# {ours: verl's}). DPPO's bounds are asymmetric and fall between the inputs' divergences on
# both sides, so that swapping low and high changes the masks.
CASES = [
    ("sapo", "sapo", {"tau_pos": 1.0, "tau_neg": 1.05}, "seq-mean-token-mean", sapo(), {}),
    (
        "sapo_sharp",
        "sapo",
        {"tau_pos": 2.0, "tau_neg": 3.0},
        "seq-mean-token-mean",
        sapo(tau_pos=2.0, tau_neg=3.0),
        {},
    ),
    (
        "gmpo",
        "geo_mean",
        {"clip_ratio": 0.4, "clip_ratio_low": 0.4, "clip_ratio_high": 0.4},
        "token-mean",
        gmpo(),
        {},
    ),
    (
        "gmpo_asymmetric",
        "geo_mean",
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.3},
        "token-mean",
        gmpo(eps_low=0.2, eps_high=0.3),
        {},
    ),
    (
        "dppo_tv",
        "dppo_tv",
        {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.1, "clip_ratio_c": 1.5},
        "token-mean",
        dppo("tv", delta_low=0.2, delta_high=0.1, ratio_cap=1.5),
        {"dppo/masked_frac": "actor/pg_clipfrac", "dppo/capped_frac": "actor/pg_clipfrac_lower"},
    ),
    (
        "dppo_kl",
        "dppo_kl",
        {"clip_ratio": 0.15, "clip_ratio_low": 0.15, "clip_ratio_high": 0.03, "clip_ratio_c": 3.0},
        "token-mean",
        dppo("kl", delta_low=0.15, delta_high=0.03, ratio_cap=3.0),
        {"dppo/masked_frac": "actor/pg_clipfrac", "dppo/capped_frac": "actor/pg_clipfrac_lower"},
    ),
    (
        "dppo_tv_seq_mean",
        "dppo_tv",
        {"clip_ratio": 0.2, "clip_ratio_c": 20.0},
        "seq-mean-token-mean",
        dppo("tv", aggregation="seq-mean-token-mean"),
        {"dppo/masked_frac": "actor/pg_clipfrac"},
    ),
]


def _correction_inputs() -> dict[str, np.ndarray]:
    """The policy-loss inputs' mask, and log(pi_old / mu) spread N(0, 0.4) per token (rows'
    sums and means spread too); finite garbage on padding."""
    rng = np.random.default_rng(11)
    mask = INPUTS["response_mask"]
    log_ratio = np.where(mask > 0, rng.normal(0.0, 0.4, (B, T)), 3.0)
    return {"log_ratio": log_ratio.astype(np.float32), "response_mask": mask}


CORRECTION_INPUTS = _correction_inputs()

# (id, verl's kind, its options, our transform). verl's *_k1 rejection keeps
# lower <= mu / pi_old <= upper (its k1 is -log rho): masked_is(low=1/upper, high=1/lower).
CORRECTIONS = [
    (
        "tis_token",
        "is_weights",
        {"rollout_is": "token", "rollout_is_threshold": 1.3},
        truncated_is(1.3),
    ),
    (
        "tis_sequence",
        "is_weights",
        {"rollout_is": "sequence", "rollout_is_threshold": 2.0},
        truncated_is(2.0, level="sequence"),
    ),
    (
        "icepop",
        "is_weights",
        {"rollout_is": "token", "rollout_is_threshold": "0.7_1.4"},
        icepop(0.7, 1.4),
    ),
    (
        "mis_token",
        "rejection",
        {"rollout_rs": "token_k1", "rollout_rs_threshold": "0.6_1.5"},
        masked_is(1 / 1.5, 1 / 0.6),
    ),
    (
        "mis_geometric",
        "rejection",
        {"rollout_rs": "seq_mean_k1", "rollout_rs_threshold": "0.8_1.1"},
        masked_is(1 / 1.1, 1 / 0.8, level="sequence", sequence_ratio="geometric"),
    ),
    (
        "mis_product",
        "rejection",
        {"rollout_rs": "seq_sum_k1", "rollout_rs_threshold": "0.5_2.5"},
        masked_is(1 / 2.5, 1 / 0.5, level="sequence", sequence_ratio="product"),
    ),
    (
        "k2_token",
        "rejection",
        {"rollout_rs": "token_k2", "rollout_rs_threshold": 0.05},
        divergence_rejection(0.05, "k2", "token"),
    ),
    (
        "k3_token",
        "rejection",
        {"rollout_rs": "token_k3", "rollout_rs_threshold": 0.05},
        divergence_rejection(0.05, "k3", "token"),
    ),
    (
        "k3_seq_sum",
        "rejection",
        {"rollout_rs": "seq_sum_k3", "rollout_rs_threshold": 0.6},
        divergence_rejection(0.6, "k3", "sequence_sum"),
    ),
    (
        "k2_seq_mean",
        "rejection",
        {"rollout_rs": "seq_mean_k2", "rollout_rs_threshold": 0.07},
        divergence_rejection(0.07, "k2", "sequence_mean"),
    ),
    (
        "k3_seq_max",
        "rejection",
        {"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 0.3},
        divergence_rejection(0.3, "k3", "sequence_max"),
    ),
]


def _gdpo_inputs() -> dict[str, np.ndarray]:
    """Three reward dimensions of different scales (0/1 correctness, a 0-3 format score, a
    length penalty in [-0.2, 0]) in groups of 4, one group constant in the first."""
    rng = np.random.default_rng(5)
    rewards = np.stack(
        [
            np.array([1, 0, 0, 1, 1, 1, 1, 1], np.float32),
            rng.integers(0, 4, B).astype(np.float32),
            -rng.uniform(0, 0.2, B).astype(np.float32),
        ],
        axis=1,
    )
    return {
        "rewards": rewards,
        "response_mask": INPUTS["response_mask"],
        "index": np.arange(B) // 4,
    }


GDPO_INPUTS = _gdpo_inputs()
# (id, weights, normalize_std).
GDPO_CASES = [
    ("gdpo", [1.0, 1.0, 1.0], True),
    ("gdpo_weighted", [1.0, 0.5, 2.0], True),
    ("gdpo_centred", [1.0, 1.0, 1.0], False),
]


def _otb_inputs(multi_turn: bool) -> dict[str, np.ndarray]:
    """Groups of 4 with ragged lengths (one group with a unique longest row, for the zero
    tail); multi-turn rows have environment-token gaps inside the completion. sum_pi^2 is a
    valid one: pi_t^2 plus some of the (1 - pi_t)^2 the other tokens can hold."""
    rng = np.random.default_rng(3)
    lengths = np.array([16, 9, 5, 12, 8, 8, 3, 14])
    mask = np.arange(T)[None, :] < lengths[:, None]
    if multi_turn:  # an observation of 3 tokens after each row's 4th policy token
        mask[:, 4:7] = False
    p = rng.uniform(0.05, 0.95, (B, T))
    sum_sq = p**2 + (1 - p) ** 2 * rng.uniform(0, 1, (B, T))
    last = np.array([np.flatnonzero(row)[-1] for row in mask])
    token_rewards = np.zeros((B, T))
    token_rewards[np.arange(B), last] = rng.integers(0, 2, B)
    token_rewards[mask & (rng.random((B, T)) < 0.1)] += 0.3  # some shaped rewards
    return {
        "token_rewards": (token_rewards * mask).astype(np.float32),
        "response_mask": mask.astype(np.float32),
        "index": np.arange(B) // 4,
        "old_log_prob": np.log(p).astype(np.float32),
        "sum_pi_squared": sum_sq.astype(np.float32),
    }


# (id, multi-turn rows and TIR-OTB, handle_zero_tail).
OTB_CASES = [("otb", False, False), ("otb_zero_tail", False, True), ("tir_otb", True, True)]


@pytest.fixture(scope="module")
def verl_results(tmp_path_factory):
    site = verl_reference.install(tmp_path_factory.mktemp("verl") / "site")
    calls = (
        [
            {
                "kind": "policy_loss",
                "name": name,
                "config": config,
                "loss_agg_mode": agg,
                "inputs": INPUTS,
            }
            for _, name, config, agg, _, _ in CASES
        ]
        + [
            {"kind": kind, "options": options, "inputs": CORRECTION_INPUTS}
            for _, kind, options, _ in CORRECTIONS
        ]
        + [
            {"kind": "gdpo", "inputs": GDPO_INPUTS, "weights": weights, "normalize_std": norm}
            for _, weights, norm in GDPO_CASES
        ]
        + [
            {"kind": "otb", "inputs": _otb_inputs(mt), "multi_turn": mt, "handle_zero_tail": tail}
            for _, mt, tail in OTB_CASES
        ]
    )
    results = verl_reference.run(site, calls, tmp_path_factory.mktemp("verl_io"))
    ids = [c[0] for c in CASES + CORRECTIONS + GDPO_CASES + OTB_CASES]
    return dict(zip(ids, results, strict=True))


def _ours(objective):
    mask = INPUTS["response_mask"].astype(bool)
    batch = make_batch(
        prompt_tokens=np.zeros((B, 1)),
        prompt_mask=np.ones((B, 1)),
        completion_tokens=np.zeros((B, T)),
        completion_mask=mask,
        group_id=np.arange(B) // 2,
        rewards=np.zeros(B),
        old_logprobs=INPUTS["old_log_prob"],
        advantages=INPUTS["advantages"],
    )
    new = jnp.asarray(INPUTS["log_prob"])
    return jax.value_and_grad(objective, has_aux=True)(new, jnp.zeros((B, T)), batch)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_loss_gradient_and_metrics_match_verl(case, verl_results):
    case_id, _, _, _, objective, metric_map = case
    (loss, metrics), grad = _ours(objective)
    ref = verl_results[case_id]
    mask = INPUTS["response_mask"].astype(bool)
    assert abs(ref["loss"]) > 1e-3 and np.abs(ref["grad"][mask]).max() > 1e-3  # not vacuous
    np.testing.assert_allclose(loss, ref["loss"], rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad)[mask], ref["grad"][mask], rtol=1e-5, atol=1e-7)
    for ours, theirs in metric_map.items():
        np.testing.assert_allclose(metrics[ours], ref["metrics"][theirs], rtol=1e-5, atol=1e-7)


def test_the_cases_exercise_the_trust_regions(verl_results):
    # DPPO masks some tokens and caps some ratios, GMPO clips some log-ratios, SAPO's gates
    # differ from 1: no comparison above passes by having nothing to compare.
    assert 0 < verl_results["dppo_tv"]["metrics"]["actor/pg_clipfrac"] < 1
    assert 0 < verl_results["dppo_kl"]["metrics"]["actor/pg_clipfrac"] < 1
    assert verl_results["dppo_tv"]["metrics"]["actor/pg_clipfrac_lower"] > 0
    gm = verl_results["gmpo"]["metrics"]
    assert gm["actor/pg_clipfrac"] + gm["actor/pg_clipfrac_lower"] > 0


def _corrected(transform):
    mask = CORRECTION_INPUTS["response_mask"].astype(bool)
    rollout = np.full((B, T), -1.2, np.float32)
    batch = make_batch(
        prompt_tokens=np.zeros((B, 1)),
        prompt_mask=np.ones((B, 1)),
        completion_tokens=np.zeros((B, T)),
        completion_mask=mask,
        group_id=np.arange(B) // 2,
        rewards=np.zeros(B),
        rollout_logprobs=rollout,
        old_logprobs=rollout + CORRECTION_INPUTS["log_ratio"],
    )
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    out = transform.apply(batch, transform.init(), ctx)[0]
    return out, mask


@pytest.mark.parametrize("case", CORRECTIONS, ids=[c[0] for c in CORRECTIONS])
def test_rollout_corrections_match_verl(case, verl_results):
    case_id, kind, _, transform = case
    out, mask = _corrected(transform)
    ref = verl_results[case_id]
    if kind == "is_weights":
        np.testing.assert_allclose(
            np.asarray(out.extras["is_weight"])[mask], ref["weights"][mask], rtol=1e-5
        )
    else:
        kept = np.asarray(out.loss_weights)[mask] > 0
        np.testing.assert_array_equal(kept, ref["mask"][mask] > 0)
        assert 0 < kept.sum() < kept.size  # the threshold cuts between the tokens or rows


@pytest.mark.parametrize("case", GDPO_CASES, ids=[c[0] for c in GDPO_CASES])
def test_gdpo_advantages_match_verl(case, verl_results):
    case_id, weights, normalize_std = case
    mask = GDPO_INPUTS["response_mask"].astype(bool)
    ours = gdpo_advantages(
        jnp.asarray(GDPO_INPUTS["rewards"]), mask, 4, jnp.asarray(weights), normalize_std
    )
    ref = verl_results[case_id]["advantages"]
    assert np.abs(ref[mask]).max() > 0.1
    np.testing.assert_allclose(np.asarray(ours)[mask], ref[mask], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", OTB_CASES, ids=[c[0] for c in OTB_CASES])
def test_optimal_token_baseline_matches_verl(case, verl_results):
    case_id, multi_turn, zero_tail = case
    x = _otb_inputs(multi_turn)
    mask = x["response_mask"].astype(bool)
    batch = make_batch(
        prompt_tokens=np.zeros((B, 1)),
        prompt_mask=np.ones((B, 1)),
        completion_tokens=np.zeros((B, T)),
        completion_mask=mask,
        group_id=x["index"],
        rewards=np.zeros(B),
        old_logprobs=x["old_log_prob"],
        extras={"token_rewards": x["token_rewards"], "old_sum_sq_prob": x["sum_pi_squared"]},
    )
    align = "policy_token" if multi_turn else "position"
    t = optimal_token_baseline_advantages(4, handle_zero_tail=zero_tail, align=align)
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    ours = np.asarray(t.apply(batch, t.init(), ctx)[0].advantages)
    ref = verl_results[case_id]["advantages"]
    np.testing.assert_allclose(ours[mask], ref[mask], rtol=1e-5, atol=1e-6)
    assert np.abs(ref[mask]).max() > 0.1
    if multi_turn:  # aligning by position would differ: the gap is what TIR-OTB skips
        by_position = optimal_token_baseline_advantages(4, handle_zero_tail=zero_tail)
        other = np.asarray(by_position.apply(batch, by_position.init(), ctx)[0].advantages)
        assert not np.allclose(other[mask], ref[mask], rtol=1e-3, atol=1e-4)
