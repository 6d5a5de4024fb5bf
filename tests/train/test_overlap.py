"""Overlapped asynchronous RL (`rljax.train.overlap`): paced admission, version stamping,
in-flight swaps, checkpointed queues, and the driver's deterministic mode against the
ordered `max_staleness` run.

The collector's own tests use a fake inner collector whose "policy" is a number (version v
has parameters w = v), so they check the schedule without compiling a model; the driver tests
run the tiny model."""

import json
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from configs.grpo_addition import get_config
from rljax.core.state import TrainState
from rljax.train.collector import Collection
from rljax.train.host_batch import HostBatch
from rljax.train.loop import train
from rljax.train.overlap import CopyOnTrainer, OverlappedCollector, check_overlap
from rljax.train.timing import measures_the_machine
from tests.train.launching import tiny_driver_run


def fake_state(version: int) -> TrainState:
    return TrainState(
        step=jnp.asarray(version, jnp.int32),
        params={"w": jnp.full((2,), float(version))},
        opt_state=None,
        ref_params=None,
        rng=None,
        transform_state=None,
    )


def one_group(**extra) -> HostBatch:
    rows = {
        "prompt_tokens": np.ones((2, 3), np.int32),
        "prompt_mask": np.ones((2, 3), bool),
        "completion_tokens": np.ones((2, 4), np.int32),
        "completion_mask": np.ones((2, 4), bool),
        "rollout_logprobs": np.zeros((2, 4), np.float32),
        "rewards": np.zeros(2, np.float32),
        "prompt_id": np.zeros(2, np.int64),
    }
    return HostBatch({**rows, **extra}, 2)


class FakeInner:
    """Draws a one-group batch and logs, per batch, what it was given and when; `during`
    runs inside the draw (a rollout's body)."""

    def __init__(self, events: list, during=None, fail_at: int | None = None):
        self.events, self.during, self.fail_at = events, during, fail_at
        self.started: dict[int, tuple[int, int, int]] = {}  # index -> (version, lag, step)

    def draw_batch(self, policies, step):
        index = step - 1
        if index == self.fail_at:
            raise ValueError("boom in the reward")
        version = int(policies.sampler.params["w"][0])
        self.started[index] = (version, policies.lag, int(policies.sampler.step))
        self.events.append(("start", index))
        batch = one_group()
        if self.during is not None:
            batch = self.during(policies, index) or batch
        metrics = {"time/rollout_s": 0.5, "time/reward_s": 0.25, "reward/mean": float(index)}
        return Collection([batch], [], metrics)


def drive(collector, events, steps, first=0, pause=0.0):
    """The trainer's side: publish version i and take batch i, for i in first..steps-1."""
    out = {}
    for i in range(first, steps):
        events.append(("publish", i))
        out[i] = collector.collect(fake_state(i), i + 1)
        time.sleep(pause)  # the trainer's update: the sampler runs ahead meanwhile
    return out


def overlapped(inner, k, deterministic, **kwargs):
    return OverlappedCollector(inner, k, deterministic, CopyOnTrainer(), **kwargs)


@pytest.mark.parametrize("deterministic", [True, False], ids=["deterministic", "free"])
def test_admission_is_paced_by_max_staleness(deterministic):
    """Batch i starts only once version i - K is published, so its lag when learned is at
    most K; the deterministic schedule uses exactly version max(i - K, 0), the free one the
    newest published; every row records its version; the sampler runs ahead of a slow
    trainer (the queue fills)."""
    events, k, steps = [], 2, 6
    inner = FakeInner(events)
    collector = overlapped(inner, k, deterministic, steps=steps)
    try:
        taken = drive(collector, events, steps, pause=0.15)
    finally:
        collector.close()
    for i in range(steps):
        version, lag, step = inner.started[i]
        need = max(i - k, 0)
        assert events.index(("publish", need)) < events.index(("start", i)), (i, events)
        assert step == i  # the rollout's key comes from the batch's own step
        if deterministic:
            assert version == need
        assert need <= version <= i and lag == i - version
        collection = taken[i]
        rows = collection.fresh[0].rows
        np.testing.assert_array_equal(rows["policy_version"], version)
        metrics = collection.metrics
        assert metrics["staleness/versions"] == i - version <= k
        assert metrics["sampler/rollout_s"] == 0.5 and metrics["sampler/reward_s"] == 0.25
        assert metrics["time/reward_s"] == 0.0 and metrics["reward/mean"] == float(i)
    # The sampler drew batches 1 and 2 with version 0 while the trainer slept after step 1.
    assert taken[1].metrics["overlap/queue_depth"] >= 1
    if deterministic:
        assert [inner.started[i][0] for i in range(steps)] == [0, 0, 0, 1, 2, 3]


def test_a_rollout_takes_newer_weights_in_flight():
    """Free mode offers the weights the trainer publishes while a rollout runs: the rollout
    of batch 1 starts with version 0 and picks up version 1 mid-way, and says so in its
    rows; deterministic mode offers none."""
    events, seen = [], {}

    def during(policies, index):
        if index != 1:
            return None
        in_flight = policies.in_flight
        newer = None
        for _ in range(500):  # until the trainer publishes version 1
            newer = in_flight.newer()
            if newer is not None:
                break
            time.sleep(0.01)
        assert newer is not None
        seen[index] = (in_flight.version, newer[0], float(newer[1].params["w"][0]))
        assert in_flight.newer() is None  # nothing newer than that yet
        return one_group(
            policy_version=np.full(2, in_flight.version), policy_version_last=np.full(2, newer[0])
        )

    inner = FakeInner(events, during)
    collector = overlapped(inner, 1, False, in_flight=True, steps=3)
    try:
        taken = drive(collector, events, 3)
    finally:
        collector.close()
    assert seen[1] == (0, 1, 1.0)
    rows = taken[1].fresh[0].rows
    np.testing.assert_array_equal(rows["policy_version"], 0)
    np.testing.assert_array_equal(rows["policy_version_last"], 1)

    def offered(policies, index):
        seen["deterministic"] = policies.in_flight

    collector = overlapped(FakeInner([], offered), 1, True, in_flight=True, steps=1)
    try:
        drive(collector, [], 1)
    finally:
        collector.close()
    assert seen["deterministic"] is None


def test_the_queue_and_versions_survive_a_checkpoint():
    """`state()` waits for the batch under way and saves the queue, the next batch and (in
    deterministic mode) the versions later batches need; a new collector loaded from it
    hands out the queued batch and samples the next with the restored version."""
    events = []
    first = overlapped(FakeInner(events), 2, True, steps=2)  # the sampler stops at batch 2
    try:
        drive(first, events, 1)
        deadline = time.time() + 30
        while 1 not in first.inner.started and time.time() < deadline:
            time.sleep(0.01)
        saved = first.state()
    finally:
        first.close()
    assert int(saved["next"]) == 2 and set(saved["queue"]) == {"1"}
    assert set(saved["versions"]) == {"0"}  # batch 2 will need version max(2 - 2, 0) = 0
    saved["versions"]["0"] = [np.full(2, 7.0)]  # marked: batch 2 must sample with this copy
    resumed_inner = FakeInner([])
    resumed = overlapped(resumed_inner, 2, True, steps=4)
    resumed.load(saved)
    try:
        taken = drive(resumed, [], 4, first=1)
    finally:
        resumed.close()
    assert 1 not in resumed_inner.started  # batch 1 came from the saved queue
    np.testing.assert_array_equal(taken[1].fresh[0].rows["policy_version"], 0)
    assert resumed_inner.started[2][0] == 7  # the restored version 0
    assert resumed_inner.started[3][0] == 1


def test_a_failing_sampler_stops_the_trainer_with_its_error():
    collector = overlapped(FakeInner([], fail_at=1), 1, False, steps=4)
    try:
        with pytest.raises(RuntimeError, match="sampler thread failed.*boom") as raised:
            drive(collector, [], 4)
    finally:
        collector.close()
    assert isinstance(raised.value.__cause__, ValueError)


def test_close_ends_an_in_flight_rollout():
    """A rollout polling for newer weights ends when the run closes."""
    polling = threading.Event()

    def during(policies, index):
        polling.set()
        while True:
            policies.in_flight.newer()
            time.sleep(0.01)

    collector = overlapped(FakeInner([], during), 1, False, in_flight=True, steps=1)
    errors = []

    def trainer():  # waits for batch 0, which never finishes
        try:
            collector.collect(fake_state(0), 1)
        except RuntimeError as error:
            errors.append(error)

    waiting = threading.Thread(target=trainer, daemon=True)
    waiting.start()
    assert polling.wait(30)
    collector.close()
    waiting.join(30)
    assert not collector._thread.is_alive() and not waiting.is_alive()
    assert "closed" in str(errors[0])


@pytest.mark.parametrize(
    "change,match",
    [
        ({"train.max_staleness": 0}, "needs train.max_staleness >= 1"),
        ({"replay.name": "fresh_per"}, r"does not support \['replay.name'\]"),
        ({"prompt_selection.name": "dare"}, r"does not support \['prompt_selection.name'\]"),
        ({"lope.num_perturbed": 2}, r"does not support \['lope.num_perturbed'\]"),
    ],
)
def test_unsupported_overlaps_raise(change, match):
    config = get_config()
    config.train.update(overlap="free", max_staleness=1)
    for key, value in change.items():
        section, name = key.split(".")
        config[section][name] = value

    class Plain:
        collection, greedy_baseline = None, False

    with pytest.raises(ValueError, match=match):
        check_overlap(config, object(), Plain())
    with pytest.raises(ValueError, match="max_staleness=0: an overlapped run needs >= 1"):
        overlapped(FakeInner([]), 0, False)


# --- the driver ----------------------------------------------------------------------------


def driver_config(run_dir, **train):
    config = tiny_driver_run(get_config(), run_dir, steps=4)
    config.rollout.n_samples = 4
    config.train.update(learning_rate=1e-2, warmup_steps=1, checkpoint_every=2, **train)
    config.algorithm.entropy_coef = 0.1  # the untrained model scores 0: entropy moves it
    return config


def same_numbers(ordered, overlapped_run, steps):
    for step in steps:
        a, b = ordered[step], overlapped_run[step]
        compared = {k for k in a if not measures_the_machine(k)}
        assert compared <= set(b), compared - set(b)
        assert {k: a[k] for k in compared} == {k: b[k] for k in compared}, step


def intervals(run_dir, role):
    with open(run_dir / "timeline.jsonl") as f:
        lines = [json.loads(line) for line in f]
    return {line["step"]: (line["start"], line["end"]) for line in lines if line["role"] == role}


LORA = {"rank": 4, "targets": ("q", "v", "down")}


# HeaPA picks prompts on the sampler thread from the rewards of the batches it drew. A short
# SFT on 1-digit sums makes the rewards mixed, so the selector hears more than zeros.
HOST_SIDE = {
    "prompt_selection": {"name": "heapa", "pool_size": 32},
    "task": {"max_digits": 1},
    "sft": {"steps": 60, "batch_size": 32, "learning_rate": 1e-2},
}


@pytest.mark.parametrize(
    "sampler_devices,lora,host_side",
    [
        (0, None, {}),
        # The reshard onto sampler devices is the ordered run's own (test_sampler_mesh).
        pytest.param(4, None, {}, marks=pytest.mark.slow),
        (0, LORA, {}),
        pytest.param(0, None, HOST_SIDE, marks=pytest.mark.slow),
    ],
    ids=["shared", "split", "lora", "selection"],
)
def test_deterministic_overlap_equals_the_ordered_run(tmp_path, sampler_devices, lora, host_side):
    """Every logged number but the timings equals the ordered `max_staleness` run's, while
    the timeline shows the sampler drawing later batches during the trainer's steps. Under
    LoRA the handoff moves the adapters only."""
    settings, mesh = dict(max_staleness=2), {"sampler_devices": sampler_devices}
    ordered_config = driver_config(tmp_path / "ordered", **settings)
    config = driver_config(tmp_path / "overlap", overlap="deterministic", **settings)
    for c in (ordered_config, config):
        c.mesh.update(mesh)
        if lora:
            c.lora.update(lora)
        for section, values in host_side.items():
            c[section].update(values)
    ordered = train(ordered_config)
    runs = [{r["step"]: r for r in run} for run in (ordered, train(config))]
    same_numbers(*runs, steps=range(0, 5))
    overlapped_run = runs[1]
    assert [overlapped_run[s]["staleness/versions"] for s in (1, 2, 3, 4)] == [0, 1, 2, 2]
    sampler = intervals(tmp_path / "overlap", "sampler")
    trainer = intervals(tmp_path / "overlap", "trainer")
    overlaps = [
        (s, t)
        for s, (s0, s1) in sampler.items()
        for t, (t0, t1) in trainer.items()
        if s0 < t1 and t0 < s1 and s > t
    ]
    assert overlaps, (sampler, trainer)
    # Bytes handed over per version: the whole model (d16 x 1 layer, vocab 14: ~8k float32
    # parameters) or LoRA's adapters on q, v and down (rank 4: under 1k).
    last = overlapped_run[4]
    per_version = last["overlap/held_gb"] / last["overlap/versions_held"] * 1e9
    assert per_version < 4_000 if lora else per_version > 20_000, per_version
    if host_side:  # the selector scored prompts and heard non-zero rewards
        assert overlapped_run[4]["selection/cold"] < 32
        assert 0 < max(overlapped_run[s]["reward/mean"] for s in (1, 2, 3, 4)) < 1


class KillAt:
    """Wraps a collector and raises at `step` (a crash after the checkpoint before it)."""

    def __init__(self, inner, step):
        self.inner, self.step = inner, step

    def collect(self, state, step):
        if step == self.step:
            raise KeyboardInterrupt("killed")
        return self.inner.collect(state, step)

    def state(self):
        return self.inner.state()

    def load(self, state):
        self.inner.load(state)


def test_a_killed_overlapped_run_resumes_exactly(tmp_path):
    """Killed at step 4 (after the step-2 checkpoint, with batches queued), the resumed
    deterministic run logs what the uninterrupted run logs."""
    settings = dict(max_staleness=2, overlap="deterministic")
    whole = {r["step"]: r for r in train(driver_config(tmp_path / "whole", **settings))}
    config = driver_config(tmp_path / "killed", **settings)
    with pytest.raises(KeyboardInterrupt):
        train(config, wrap_collector=lambda c: KillAt(c, 4))
    resumed = {r["step"]: r for r in train(driver_config(tmp_path / "killed", **settings))}
    assert min(resumed) == 3
    same_numbers(whole, resumed, steps=(3, 4))


def test_free_overlap_on_the_engine_stamps_versions(tmp_path):
    """Free mode: every row records versions no older than K behind the step that learns
    it and no newer than that step; `policy_version_last` is at least `policy_version`."""
    batches = {}

    class Capture:
        def __init__(self, inner):
            self.inner = inner

        def collect(self, state, step):
            collection = self.inner.collect(state, step)
            batches[step] = collection.fresh[0].rows
            return collection

        def state(self):
            return self.inner.state()

        def load(self, state):
            self.inner.load(state)

    config = driver_config(tmp_path / "free", max_staleness=1, overlap="free")
    config.rollout.update(decode_steps=1)
    records = {r["step"]: r for r in train(config, wrap_collector=Capture)}
    for step, rows in batches.items():
        first, last = rows["policy_version"], rows["policy_version_last"]
        assert ((step - 1 - 1 <= first) & (first <= last) & (last <= step - 1)).all(), step
        assert records[step]["staleness/versions"] == step - 1 - first.min()
