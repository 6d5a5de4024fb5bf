"""Bounded staleness: the sampler uses the policy of up to K updates ago; K = 0 is the
synchronous loop."""

import jax.numpy as jnp
import numpy as np
import pytest

from configs.grpo_addition import get_config
from rljax.core.state import TrainState
from rljax.train.loop import train
from rljax.train.staleness import StalePolicy


def fake_state(version):
    return TrainState(
        step=jnp.asarray(version),
        params={"w": jnp.full((2,), float(version))},
        opt_state=None,
        ref_params=None,
        rng=None,
        transform_state=None,
    )


def test_the_sampler_lags_by_at_most_k_versions():
    stale = StalePolicy(2)
    seen = []
    for version in range(6):
        sampler_state, lag = stale.state_for(fake_state(version))
        seen.append((float(sampler_state.params["w"][0]), lag, int(sampler_state.step)))
    # Versions 0..5 sample with 0, 0, 0, 1, 2, 3; the step (the sampling key) stays current.
    assert seen == [(0, 0, 0), (0, 1, 1), (0, 2, 2), (1, 2, 3), (2, 2, 4), (3, 2, 5)]
    current = fake_state(7)
    assert StalePolicy(0).state_for(current) == (current, 0)  # synchronous: the same state
    with pytest.raises(ValueError, match="max_staleness=-1"):
        StalePolicy(-1)


def run(tmp_path, staleness):
    config = get_config()
    config.model.update(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 4
    config.train.update(steps=3, prompts_per_step=8, eval_every=3, checkpoint_every=3)
    config.train.update(learning_rate=1e-2, warmup_steps=1, max_staleness=staleness)
    config.algorithm.entropy_coef = 0.1  # the untrained model scores 0: entropy moves it
    config.run_dir = str(tmp_path / f"k{staleness}")
    return {r["step"]: r for r in train(config)}


def test_a_stale_sampler_shows_in_the_mismatch_metrics(tmp_path):
    sync, stale = run(tmp_path, 0), run(tmp_path, 1)
    assert "staleness/versions" not in sync[2]
    assert [stale[s]["staleness/versions"] for s in (1, 2, 3)] == [0.0, 1.0, 1.0]
    # Step 1 samples with the same policy either way.
    for key in ("loss", "entropy", "mismatch/abs_gap_mean", "response_length/mean"):
        np.testing.assert_allclose(stale[1][key], sync[1][key], rtol=1e-6)
    # Then the sampler is one update behind the trainer: a log-prob gap opens.
    assert sync[3]["mismatch/abs_gap_mean"] < 1e-5
    assert stale[3]["mismatch/abs_gap_mean"] > 100 * sync[3]["mismatch/abs_gap_mean"]
