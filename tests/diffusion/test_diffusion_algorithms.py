"""The diffusion presets: which ones read a reference policy, their settings' ranges, and
DACA's progress transform against `daca_weights` / `daca_advantages`."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.core.batch import make_batch
from rljax.core.transform import Context
from rljax.diffusion import daca_advantages, daca_weights
from rljax.diffusion.algorithms import (
    DIFFUSION_ALGORITHMS,
    DiffusionSettings,
    daca,
    daca_progress,
    diffu_grpo,
    rspo,
    wd1,
)


def test_reference_is_kept_only_where_the_objective_reads_it():
    no_kl, kl = DiffusionSettings(beta=0.0), DiffusionSettings(beta=0.5)
    assert diffu_grpo(2).needs_reference and not diffu_grpo(2, no_kl).needs_reference
    assert not wd1(2, kl).needs_reference  # wd1 has no KL term
    assert rspo(2, no_kl).needs_reference  # RSPO's log-ratio is to ref
    assert set(DIFFUSION_ALGORITHMS) == {"diffu_grpo", "rldf", "wd1", "rspo", "daca"}


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("clip_eps", 1.0, "algorithm.clip_eps=1.0 must be in [0, 1)"),
        ("rldf_k", 0, "algorithm.rldf_k=0 must be >= 1"),
        ("rspo_beta", 0.0, "algorithm.rspo_beta=0.0 must be > 0"),
    ],
)
def test_settings_out_of_range_name_the_key(key, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        DiffusionSettings(**{key: value})


def test_daca_progress_scales_token_advantages_by_progress_scores():
    step_map = jnp.array([[0, 3, 1, 2], [2, 0, 1, 3]], jnp.int32)
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]], bool)
    adv = jnp.array([0.5, -2.0])
    batch = make_batch(
        jnp.ones((2, 3), jnp.int32),
        jnp.ones((2, 3), bool),
        jnp.zeros((2, 4), jnp.int32),
        mask,
        jnp.array([0, 0]),
        jnp.zeros(2),
        advantages=adv[:, None] * mask,
        extras={"step_map": step_map.astype(jnp.float32)},  # as HostBatch.to_batch casts it
    )
    ctx = Context(step=jnp.int32(0), rng=jax.random.PRNGKey(0))
    out, _ = daca_progress(4).apply(batch, (), ctx)[::2]
    want = daca_advantages(adv, daca_weights(step_map, mask, 4))
    np.testing.assert_allclose(out.advantages, want, rtol=1e-6)
    # Row 0: u = 1 - (0, 3, 1) / 4 = (1, .25, .75), mean 2/3 -> weights (1.5, .375, 1.125).
    np.testing.assert_allclose(out.advantages[0], 0.5 * np.array([1.5, 0.375, 1.125, 0]))
    assert daca(2, num_steps=4).name == "daca"
