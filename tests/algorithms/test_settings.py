"""PPOSettings and Regularizers (rljax.algorithms.base): defaults, checks, and the presets
built from them."""

import dataclasses

import numpy as np
import pytest

from rljax.advantages.group import group_advantages
from rljax.algorithms import PPOSettings, Regularizers, cispo, gpg, grpo, rloo, uec_rl
from rljax.algorithms.base import ppo_preset, regularized_preset
from rljax.core.batch import make_batch
from rljax.core.transform import Context, stateless
from rljax.objectives.surrogate import ppo_clip


def test_defaults_are_the_former_keyword_defaults():
    # ppo_preset's and regularized_preset's keyword defaults before they took dataclasses.
    assert dataclasses.astuple(PPOSettings()) == (0.2, None, 0.0, "k3", 0.0, "token-mean", None)
    assert dataclasses.astuple(Regularizers()) == ("token-mean", None, 0.0, "k3", 0.0)


def test_settings_are_frozen_and_hashable():
    ppo = PPOSettings(kl_coef=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ppo.kl_coef = 0.2
    assert hash(ppo) == hash(PPOSettings(kl_coef=0.1))


def test_eps_high_and_regularizers_follow_the_fields():
    assert PPOSettings(clip_eps=0.1).eps_high == 0.1
    assert PPOSettings(clip_eps=0.1, clip_eps_high=0.28).eps_high == 0.28
    ppo = PPOSettings(0.1, 0.3, 0.01, "low_var_kl", 0.02, "seq-mean-token-sum-norm", 64)
    assert ppo.regularizers == Regularizers("seq-mean-token-sum-norm", 64, 0.01, "low_var_kl", 0.02)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"clip_eps": 1.0}, r"clip_eps=1.0 must be in \[0, 1\)"),
        ({"clip_eps": -0.1}, r"clip_eps=-0.1 must be in \[0, 1\)"),
        ({"clip_eps_high": -0.1}, r"clip_eps_high=-0.1 must be >= 0"),
        ({"kl_coef": -0.5}, r"kl_coef=-0.5 must be >= 0"),
        ({"kl_estimator": "k4"}, r"kl_estimator='k4' is unknown; use one of"),
        ({"aggregation": "sum"}, r"unknown aggregation mode 'sum'"),
        ({"max_len": 8}, r"max_len=8 is only used by 'seq-mean-token-sum-norm'"),
        ({"aggregation": "seq-mean-token-sum-norm", "max_len": 0}, r"max_len=0 must be positive"),
        ({"entropy_coef": float("inf")}, r"entropy_coef=inf must be finite"),
    ],
)
def test_out_of_range_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOSettings(**kwargs)
    regularizer_kwargs = {k: v for k, v in kwargs.items() if not k.startswith("clip_eps")}
    if regularizer_kwargs:
        with pytest.raises(ValueError, match=message):
            Regularizers(**regularizer_kwargs)


def test_preset_defaults_differ_where_the_preset_says():
    # uec_rl: EFRame's low-variance KL loss on by default; cispo and gpg: verl's estimator.
    assert uec_rl.__defaults__[-1] == PPOSettings(kl_coef=0.01, kl_estimator="low_var_kl")
    for preset in (cispo, gpg):
        assert preset.__defaults__[-1] == Regularizers(kl_estimator="low_var_kl")


# A batch of 2 groups of 2 completions, 3 tokens each (rewards: one right, one wrong per group).
MASK = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
OLD = np.full((4, 3), -1.0, np.float32)
NEW = OLD + np.array(
    [[0.5, -0.1, 0.0], [0.3, 0.0, 0.0], [-0.5, 0.1, 0.2], [0.0, 0.05, 0.0]], np.float32
)


def _loss(algorithm):
    batch = make_batch(
        np.ones((4, 2)), np.ones((4, 2)), np.ones((4, 3)), MASK, np.array([0, 0, 1, 1]),
        np.array([1.0, 0.0, 0.0, 1.0], np.float32),
        old_logprobs=OLD, ref_logprobs=OLD - 0.2,
    )  # fmt: skip
    ctx = Context(step=np.int32(0), rng=np.zeros(2, np.uint32))
    batch, _, _ = algorithm.transform.apply(batch, algorithm.transform.init(), ctx)
    loss, metrics = algorithm.objective(NEW, np.ones((4, 3), np.float32), batch)
    return batch, float(loss), metrics


def test_ppo_preset_uses_each_field():
    # clip 0.1 / 0.15, seq-mean-token-sum-norm with max_len 5, KL and entropy terms on.
    ppo = PPOSettings(0.1, 0.15, 0.3, "k1", 0.05, "seq-mean-token-sum-norm", 5)
    algorithm = rloo(2, ppo)
    assert algorithm.aggregation == "seq-mean-token-sum-norm"
    batch, loss, metrics = _loss(algorithm)
    adv = np.asarray(batch.advantages)
    r = np.exp(NEW - OLD)
    pg = np.maximum(-adv * r, -adv * np.clip(r, 0.9, 1.15))
    norm = 4 * 5  # rows x max_len
    np.testing.assert_allclose(metrics["pg/loss"], (pg * MASK).sum() / norm, rtol=1e-5)
    kl = (NEW - (OLD - 0.2)) * MASK  # k1
    np.testing.assert_allclose(metrics["kl/loss"], 0.3 * kl.sum() / norm, rtol=1e-5)
    np.testing.assert_allclose(metrics["entropy/loss"], -0.05 * MASK.sum() / norm, rtol=1e-5)
    np.testing.assert_allclose(
        loss, metrics["pg/loss"] + metrics["kl/loss"] + metrics["entropy/loss"], rtol=1e-6
    )


def test_regularized_preset_adds_terms_only_for_nonzero_coefficients():
    advantages = stateless(lambda batch, ctx: (batch, {}))

    def main(agg, max_len):
        return ppo_clip(0.2, 0.2, aggregation=agg, max_len=max_len)

    plain = regularized_preset(advantages, main, Regularizers())
    _, _, metrics = _loss(plain)
    assert not any(k.startswith(("kl/", "entropy/")) for k in metrics)
    both = regularized_preset(advantages, main, Regularizers(kl_coef=0.1, entropy_coef=0.1))
    _, _, metrics = _loss(both)
    assert "kl/loss" in metrics and "entropy/loss" in metrics


def test_grpo_passes_its_settings_through_ppo_preset():
    ppo = PPOSettings(clip_eps=0.1, kl_coef=0.2)
    _, got, _ = _loss(grpo(2, ppo=ppo))
    _, want, _ = _loss(ppo_preset(group_advantages(2), ppo))
    assert got == want
