"""benchmarks.async_model: the discrete-event model of RL step schedules, on hand-computed
timelines."""

import pytest

from benchmarks.async_model import pod_split, simulate, step_time


def test_the_synchronous_loop_adds_every_phase():
    assert simulate(2.0, 3.0, 0.5, 3, 1, overlapped=False) == [5.5, 11.0, 16.5]


def test_overlap_by_hand():
    """K = 1, sampler 2 s, trainer 2 s, handoff 1 s (times worked out by hand):
    step 0 publishes at 1, samples 1-3, trains 3-5; step 1 publishes at 6 while batch 1
    (started at 3 on version 0) ended at 5, trains 6-8; step 2 publishes at 9, batch 2 waited
    for version 1 (published at 6), sampled 6-8, trains 9-11."""
    assert simulate(2.0, 2.0, 1.0, 3, 1, overlapped=True) == [5.0, 8.0, 11.0]


@pytest.mark.parametrize(
    "sampler,trainer,expected", [(1.0, 3.0, 3.0), (3.0, 1.0, 3.0), (2.0, 2.0, 2.0)]
)
def test_a_steady_overlapped_step_is_the_slower_side(sampler, trainer, expected):
    """Without handoff and with room to run ahead (K = 2), the step is max(sampler, trainer):
    the faster side waits, the slower one never does."""
    ends = simulate(sampler, trainer, 0.0, 30, 2, overlapped=True)
    assert step_time(ends, skip=10) == pytest.approx(expected)


def test_pacing_binds_when_the_sampler_may_not_run_ahead():
    """K = 1 with a 1 s handoff: batch i waits for version i - 1, published 1 s after the
    step before it ends, so a sampler as fast as the trainer cannot hide the handoff."""
    ends = simulate(2.0, 2.0, 1.0, 30, 1, overlapped=True)
    assert step_time(ends, skip=10) == pytest.approx(3.0)


def test_the_pod_prediction_gains_only_when_generation_scales_worse():
    """With generation scaling perfectly (alpha = 1) the best split only hides the reward's
    host time; with generation not scaling at all (alpha = 0) the sampler needs few devices
    and the overlapped step approaches the trainer's time on nearly all of them."""
    profile = {"generation_s": 10.0, "reward_s": 1.0, "trainer_s": 30.0}
    sync = 41.0
    linear = pod_split(profile, 0.0, 1.0, 2)
    # At best the reward's second is hidden: 41 s / 40 s (the grid of shares may miss it).
    assert 1.0 <= linear["speedup_vs_synchronous"] <= sync / 40.0
    flat = pod_split(profile, 0.0, 0.0, 2)
    assert flat["sampler_share"] == 1 / 16  # the smallest share listed
    assert flat["step_s"] == pytest.approx(max(11.0, 30.0 / (15 / 16)))
