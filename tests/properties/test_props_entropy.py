"""Property tests over every public function and transform of `rljax.entropy`.

Random batches (see prop_cases.py) with fully masked rows, single-token rows, extreme
advantages and rewards and large log-prob gaps: Clip-Cov / KL-Cov losses, metrics and
gradients finite; Entrocraft / ENTROPIC advantages finite and 0 on masked tokens, their state
kept; covariances finite; the host-side UEC rules on the same extreme inputs.
"""

import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given

sys.path.insert(0, os.path.dirname(__file__))
from prop_cases import (  # noqa: E402
    CTX,
    PROPS,
    assert_finite,
    assert_metrics,
    assert_same_structure,
    assert_token_field,
    build_batch,
    cases,
    jit_program,
)

from rljax import entropy as ent  # noqa: E402
from rljax.advantages import group_advantages  # noqa: E402
from rljax.data.row_buffer import RowBuffer  # noqa: E402

BANDS = {
    "above": ent.entropy_band("constant", (0.0, 0.0), (0.1, 0.1), 10),
    "below": ent.entropy_band("linear", (20.0, 30.0), (40.0, 50.0), 10),
    "inside": ent.entropy_band("cosine", (0.0, 0.0), (40.0, 40.0), 10),
}


def _program(a: dict, g: int) -> dict:
    """Every jittable function of `rljax.entropy` on one case (traced, G static)."""
    out = {"objectives": {}, "transforms": {}}
    batch = build_batch(a, ("cov_noise", "old_entropy"))
    objectives = {
        "clip_cov": ent.clip_cov(clip_ratio=0.5, cov_lower=-1e30, cov_upper=1e30),
        "clip_cov_all": ent.clip_cov(exclude_zero_weight=False),
        "kl_cov": ent.kl_cov(k_ratio=0.5),
    }
    for name, objective in objectives.items():

        def loss_fn(lp, objective=objective):
            return objective(lp, a["new_entropy"], batch)

        (loss, metrics), grad = jax.value_and_grad(loss_fn, has_aux=True)(a["new_logprobs"])
        out["objectives"][name] = (loss, metrics, grad)
    transforms = {
        "covariance_noise": ent.covariance_noise(),
        "raw_reward_advantages": ent.raw_reward_advantages(),
        "host_advantages": ent.host_advantages(),
        "signed_rewards": ent.entrocraft.signed_rewards(),
        "entropic": ent.entropic_advantages(group_advantages(g), 1.0),
        "entropic_raw": ent.entropic_advantages(ent.raw_reward_advantages(), lambda s: 2.0 + s),
    }
    for kind, band in BANDS.items():
        for outside in ent.entrocraft.OUTSIDE_MODES:
            for selection in ent.entrocraft.SELECTIONS:
                inner = group_advantages(g)
                t = ent.entrocraft_advantages(inner, band, outside, selection)
                transforms[f"entrocraft_{kind}_{outside}_{selection}"] = t
    extras = ("cov_noise", "old_entropy", "sequence_advantage")
    for name, t in transforms.items():
        state = t.init()
        new_batch, new_state, metrics = t.apply(build_batch(a, extras), state, CTX)
        out["transforms"][name] = (new_batch, state, new_state, metrics)
    mask = a["completion_mask"]
    out["token_covariance"] = ent.token_covariance(a["old_logprobs"], a["advantages"], mask)
    out["covariance"] = ent.logprob_advantage_covariance(a["old_logprobs"], a["advantages"], mask)
    out["batch_entropy"] = ent.batch_entropy(batch)
    out["bands"] = {k: band(jnp.int32(s)) for k, band in BANDS.items() for s in (0, 5, 99)}
    return out


run = jit_program(_program)


@PROPS
@given(case=cases())
def test_covariance_objectives_are_finite(case):
    out, mask = run(case), case.completion_mask
    for name, (loss, metrics, grad) in out["objectives"].items():
        assert loss.shape == () and np.isfinite(loss), f"{name} loss {loss}"
        assert_metrics(metrics)
        assert grad.shape == mask.shape
        assert_finite(grad, f"{name} gradient")
        assert np.all(grad[~mask] == 0), f"{name} has gradient on masked tokens"
    cov = out["token_covariance"]
    assert_token_field(cov, mask, "token_covariance")
    assert out["covariance"].shape == () and np.isfinite(out["covariance"])
    np.testing.assert_allclose(
        out["covariance"],
        cov[mask].astype(np.float64).mean() if mask.any() else 0.0,
        rtol=1e-4,
        atol=1e-4 * (np.abs(cov).max() + 1e-30),
    )


@PROPS
@given(case=cases())
def test_entropy_transforms_are_finite_and_masked(case):
    out, mask = run(case), case.completion_mask
    for name, (batch, state, new_state, metrics) in out["transforms"].items():
        assert_metrics(metrics)
        assert_same_structure(new_state, state)
        assert_token_field(
            np.asarray(batch.advantages),
            mask,
            f"{name} advantages",
            zero_off_mask=name not in ("covariance_noise", "signed_rewards"),
        )
        assert_finite(batch.extras, f"{name} extras")
        assert_finite(batch.rewards, f"{name} rewards")
    noise = np.asarray(out["transforms"]["covariance_noise"][0].extras["cov_noise"])
    assert noise.shape == mask.shape and np.all((noise >= 0) & (noise < 1))
    h = out["batch_entropy"]
    assert h.shape == () and 0 <= h <= np.log(32000.0) + 1e-4
    for lo, up in out["bands"].values():
        assert np.isfinite(lo) and np.isfinite(up) and lo <= up


@PROPS
@given(case=cases())
def test_uec_host_rules(case):
    g = case.group_size
    hard = ent.hard_prompts(case.rewards, g, 0.01)
    assert hard.shape == (case.shape[0] // g,) and hard.dtype == bool
    np.testing.assert_array_equal(hard, np.all(case.rewards.reshape(-1, g) < 0.01, axis=1))
    truncated = ent.truncated_rows(case.completion_tokens, case.completion_mask, eos_id=0)
    assert truncated.shape == case.rewards.shape
    keep = ent.keep_samples(case.extras["sequence_advantage"], truncated, 0.05)
    assert not np.any(keep & truncated & (case.extras["sequence_advantage"] > 0))
    buffer = RowBuffer(capacity=5)
    buffer.add({"rewards": case.rewards, "advantage": case.extras["sequence_advantage"]})
    assert len(buffer) == min(5, case.shape[0])
    rows = buffer.sample(len(buffer), np.random.default_rng(0))
    assert_finite(rows, "replayed rows")
    np.testing.assert_array_equal(buffer.pop(len(buffer))["rewards"], case.rewards[-5:])
    assert len(buffer) == 0 and ent.UECSettings().explore_samples >= 2
