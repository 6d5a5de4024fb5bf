"""Property tests over every public objective and transform of `rljax.objectives`.

Random batches (see prop_cases.py) with fully masked rows, single-token rows, extreme
advantages and old/new log-prob gaps up to 30 nats: every loss, metric and gradient with
respect to the new log-probs must be finite, losses scalars, and the gradient 0 on tokens
whose loss weight is 0. All objectives run in one jitted program (`_program`).
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

sys.path.insert(0, os.path.dirname(__file__))
from prop_cases import (  # noqa: E402
    GROUP_SHAPES,
    PROPS,
    assert_finite,
    assert_metrics,
    assert_token_field,
    build_batch,
    cases,
    jit_program,
)

from rljax import objectives as obj  # noqa: E402
from rljax.core.aggregation import AGGREGATION_MODES  # noqa: E402
from rljax.core.objective import sum_objectives  # noqa: E402

OBJECTIVES = {
    **{f"ppo_clip_{m}": obj.ppo_clip(aggregation=m) for m in AGGREGATION_MODES},
    "ppo_clip_dual": obj.ppo_clip(0.2, 0.28, dual_clip_c=3.0),
    "cispo": obj.cispo(),
    "cispo_low": obj.cispo(eps_low=0.2, aggregation="seq-mean-token-mean"),
    "entropy_bonus": obj.entropy_bonus(0.01),
    "gpg": obj.gpg(),
    "gspo": obj.gspo(),
    "gspo_token": obj.gspo_token(aggregation="token-mean"),
    **{f"kl_loss_{e}": obj.kl_loss(0.1, e) for e in obj.KL_ESTIMATORS},
    "mu_grpo": obj.mu_grpo(),
    "weighted_sft": obj.weighted_sft(),
    "segment_po": obj.segment_po((0,)),
    "segment_po_none": obj.segment_po(()),
    "sapo": obj.sapo(),
    "gmpo": obj.gmpo(aggregation="token-mean"),
    "dppo_tv": obj.dppo("tv"),
    "dppo_kl": obj.dppo("kl", aggregation="seq-mean-token-sum"),
    "ipo": obj.ipo(0.1, 0.01),
    "sum": sum_objectives(obj.ppo_clip(), obj.kl_loss(0.1), obj.entropy_bonus(0.01)),
}


def _program(a: dict, g: int) -> dict:
    """Every objective (loss, metrics, gradient) and transform on one case (traced)."""
    out = {"objectives": {}, "transforms": {}}
    # is_weight from TIS: the objectives multiply their per-token loss by it.
    batch = build_batch(a)
    is_weight = jnp.minimum(jnp.exp(a["old_logprobs"] - a["rollout_logprobs"]), 2.0)
    batch = batch.replace(extras={"is_weight": is_weight})
    new_lp, new_ent = a["new_logprobs"], a["new_entropy"]
    for name, objective in OBJECTIVES.items():

        def loss_fn(lp, objective=objective):
            return objective(lp, new_ent, batch)

        (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(new_lp)
        out["objectives"][name] = (loss, metrics, grad)
    value_batch = batch.replace(
        extras={"returns": a["old_values"] * 3.0, "old_values": a["old_values"]}
    )
    for clip in (0.2, None):
        fn = obj.clipped_value_loss(clip=clip)
        (loss, metrics), grad = jax.value_and_grad(fn, has_aux=True)(a["old_values"], value_batch)
        out["objectives"][f"value_{clip}"] = (loss, metrics, grad)
    transforms = {
        "valid_group_scaling": obj.valid_group_scaling(g),
        "kl_reward_penalty": obj.kl_reward_penalty(0.1),
        "kl_reward_penalty_k3": obj.kl_reward_penalty(0.1, "k3"),
        "power_weighting": obj.power_weighting(g),
        "power_weighting_norm": obj.power_weighting(g, 1.0, "old", "rollout", True),
    }
    for name, t in transforms.items():
        out["transforms"][name] = t.apply(build_batch(a), t.init(), None)
    return out


def _array_program(a: dict, g: int) -> dict:
    """The array functions of `rljax.objectives` on one case (traced, G static)."""
    out = {}
    mask, new_lp = a["completion_mask"], a["new_logprobs"]
    out["kl_penalty"] = {e: obj.kl_penalty(new_lp, a["ref_logprobs"], e) for e in obj.KL_ESTIMATORS}
    out["sequence_log_ratio"] = obj.sequence_log_ratio(new_lp, a["old_logprobs"], mask)
    out["veto"] = obj.negative_advantage_veto(
        new_lp - a["old_logprobs"], a["advantages"], mask, 0.2
    )
    out["segment_ids"] = obj.segment_ids(a["completion_tokens"], mask, (0,))
    out["valid_group_scale"] = obj.valid_group_scale(a["rewards"], g)
    seq = lambda lp: jnp.where(mask, lp, 0.0).sum(axis=1)  # noqa: E731
    out["power_weights"] = obj.power_weights(
        seq(a["ref_logprobs"]), seq(a["old_logprobs"]), 4.0, g, mask.any(axis=1)
    )
    return out


run = jit_program(_program)
run_arrays = jit_program(_array_program)


@PROPS
@given(case=cases())
def test_objectives_losses_metrics_and_gradients_are_finite(case):
    out = run(case)["objectives"]
    mask = case.completion_mask
    for name, (loss, metrics, grad) in out.items():
        assert loss.shape == () and np.isfinite(loss), f"{name} loss {loss}"
        assert_metrics(metrics)
        assert grad.shape == mask.shape, name
        assert_finite(grad, f"{name} gradient")
        # Loss weights are the completion mask: masked tokens get no gradient.
        assert np.all(grad[~mask] == 0), f"{name} has gradient on masked tokens"


@PROPS
@given(case=cases())
def test_objective_transforms_are_finite(case):
    out = run(case)["transforms"]
    mask = case.completion_mask
    for name, (batch, state, metrics) in out.items():
        assert state == ()
        assert_metrics(metrics)
        assert_token_field(np.asarray(batch.advantages), mask, f"{name} advantages", False)
        assert_token_field(np.asarray(batch.loss_weights), mask, f"{name} loss_weights")
        assert np.asarray(batch.rewards).shape == case.rewards.shape
        assert_finite(batch.rewards, f"{name} rewards")
    # The KL penalty removes coef * sum_t KL from each reward; empty rows keep theirs.
    empty = ~mask.any(axis=1)
    for name in ("kl_reward_penalty", "kl_reward_penalty_k3"):
        np.testing.assert_array_equal(np.asarray(out[name][0].rewards)[empty], case.rewards[empty])


@PROPS
@given(case=cases(GROUP_SHAPES))
def test_objective_array_functions(case):
    out, mask, g = run_arrays(case), case.completion_mask, case.group_size
    for estimator, kl in out["kl_penalty"].items():
        assert kl.shape == mask.shape
        assert_finite(kl, estimator)
        if estimator != "k1":
            assert np.all(kl >= 0)
    slr = out["sequence_log_ratio"]
    assert slr.shape == case.rewards.shape
    assert np.all(np.abs(slr) <= 20) and np.all(slr[~mask.any(axis=1)] == 0)
    veto = out["veto"]
    assert veto.shape == mask.shape and veto.dtype == bool
    # The kept set of each row is a prefix: once vetoed, always vetoed.
    assert np.all(np.diff(veto.astype(np.int8), axis=1) <= 0)
    seg = out["segment_ids"]
    assert seg.shape == mask.shape and np.all(np.diff(seg, axis=1) >= 0)
    assert np.all((seg >= 0) & (seg < mask.shape[1]))
    alpha = out["valid_group_scale"]
    assert alpha.shape == () and 1.0 <= alpha <= case.shape[0]
    w = out["power_weights"].astype(np.float64)
    assert_finite(w, "power_weights")
    assert np.all((w >= 0) & (w <= 1))
    has = mask.any(axis=1).reshape(-1, g).any(axis=1)
    np.testing.assert_allclose(w.reshape(-1, g).sum(axis=1), has.astype(float), atol=1e-5)
