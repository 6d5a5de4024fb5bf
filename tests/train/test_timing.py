"""Phase timings: the step's phases add up to it, compile time is measured, eval and
checkpoints are timed apart."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from launching import tiny_driver_run

from configs.grpo_addition import get_config
from rljax.train.loop import train
from rljax.train.timing import STEP_PHASES, CompileClock, add_time, measures_the_machine, timed


def test_timed_waits_for_the_result_and_add_time_sums():
    out, seconds = timed(lambda: time.sleep(0.05) or jnp.ones(3))
    assert seconds >= 0.05 and np.asarray(out).sum() == 3
    metrics = {}
    add_time(metrics, "time/x_s", 1.5)
    add_time(metrics, "time/x_s", 0.5)
    assert metrics == {"time/x_s": 2.0}


def test_compile_clock_counts_compilations_only_while_open():
    with CompileClock() as clock:
        jax.jit(lambda x: jnp.cos(x) * 3.0)(jnp.ones(7)).block_until_ready()
        first = clock.take()
        assert first > 0 and clock.take() == 0.0  # take() starts a new interval
    jax.jit(lambda x: jnp.sin(x) * 5.0)(jnp.ones(9)).block_until_ready()  # closed: not counted
    assert clock.take() == 0.0


def test_the_phases_add_up_to_the_step(tmp_path):
    config = tiny_driver_run(get_config(), tmp_path / "run")
    records = {r["step"]: r for r in train(config)}
    for step in (1, 2):
        r = records[step]
        phases = [r[k] for k in STEP_PHASES]
        assert min(phases) >= 0 and r["time/other_s"] >= -1e-6
        assert sum(phases) + r["time/other_s"] == pytest.approx(r["time/step_s"], abs=1e-6)
    assert records[1]["time/compile_s"] > 0  # the first step compiles the sampler and update
    assert records[1]["time/rollout_s"] > 0 and records[1]["time/update_s"] > 0
    assert "time/eval_s" not in records[1] and records[2]["time/eval_s"] > 0
    assert "time/checkpoint_s" not in records[1] and records[2]["time/checkpoint_s"] >= 0


def test_wall_time_measurements_are_named_apart():
    assert measures_the_machine("time/step_s") and measures_the_machine("perf/mfu")
    assert measures_the_machine("replay/perf/mfu")
    assert measures_the_machine("sampler/busy_s") and measures_the_machine("overlap/queue_depth")
    assert not measures_the_machine("perf/row_positions") and not measures_the_machine("loss")
