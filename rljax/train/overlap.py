"""Overlapped asynchronous RL: a sampler thread draws the next batches while the trainer learns.

With `train.overlap` = "free" or "deterministic" (and `train.max_staleness` = K >= 1) the
collector's draws run on a sampler thread, ahead of the trainer, into a queue from which the
trainer takes one batch per step. Versions count updates: version v is the policy after v
updates, and batch i is the batch step i learns from (with version i).

- Paced admission: batch i starts once version max(i - K, 0) is published, so no batch is more
  than K versions old when it is learned. The sampler waits rather than sampling batches it
  would later discard, so a long rollout is never thrown away and requeued.
- Weight handoff: every step the trainer publishes its parameters device to device: resharded
  onto the sampler's mesh (`mesh.sampler_devices`), or copied on the trainer's devices (the
  update donates its buffers). Only the sampler's view (params, step, key) moves; no host
  staging; under LoRA only the adapters (the frozen base is copied once). Timed as
  `overlap/handoff_s` and `overlap/handoff_gb_per_s`.
- "free": batch i samples with the newest published version and, on the rollout engine, takes
  newer ones between decode calls (partial rollouts; rows record their oldest and newest
  version as `policy_version` and `policy_version_last`). "deterministic": batch i samples
  with exactly version max(i - K, 0), the ordered schedule of `StalePolicy`, so the run equals
  the ordered `max_staleness` run bit for bit, whatever the threads' timing.
- Checkpoints: `state()` pauses the sampler at its next batch boundary (a started batch is
  finished, not dropped), so the data iterator is where the queued batches end; the queue and
  (deterministic mode) the versions later batches still need go into the checkpoint, and the
  next `collect` lets the sampler go on.
- Prompt selection (HeaPA, the curriculum) runs on the sampler thread: each batch's rewards
  reach the selector before the next batch is picked, as in the ordered run.
- `timeline.jsonl` (in the run directory) records each batch's sampling interval, each step's
  training interval (from taking its batch to asking for the next) and each handoff, in
  seconds since the collector started: the overlap is measured, not assumed.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from ml_collections import ConfigDict

from rljax.core.state import TrainState
from rljax.data.tasks import Task
from rljax.train.collector import Collection, GroupCollector
from rljax.train.episodes import is_episodic
from rljax.train.host_batch import HostBatch
from rljax.train.sampler_mesh import sampler_view
from rljax.train.staleness import InFlight, Policies, placed_like

# Seconds `close` waits for a sampler that is finishing a rollout it cannot interrupt.
_CLOSE_TIMEOUT_S = 300.0


class _Closing(Exception):
    """Raised inside an in-flight rollout when the run closes: the rollout ends there."""


class _Drawn(NamedTuple):
    """A finished batch in the queue: what it was drawn with and when."""

    collection: Collection
    version: int  # the version it started with
    start: float
    end: float


class OverlappedCollector:
    """Runs a `GroupCollector`'s draws on a sampler thread, paced by `max_staleness`.

    Args:
      inner: the collector whose `draw_batch` samples and scores a batch (built without
        staleness or sampler devices of its own: this class places and versions the weights).
      max_staleness: K >= 1; batch i starts once version max(i - K, 0) is published.
      deterministic: sample batch i with exactly version max(i - K, 0) (else the newest).
      place: the trainer's state -> the sampler's copy of its `sampler_view`, on the
        sampler's devices (new buffers: the update donates the trainer's).
      in_flight: offer newer versions to a rollout under way (the rollout engine; free mode).
      steps: the run's last step (the sampler draws no batch past it).
      timeline_path: where the timeline's JSON lines are appended (None: not written).
    """

    def __init__(
        self,
        inner: GroupCollector,
        max_staleness: int,
        deterministic: bool,
        place: Callable[[TrainState], TrainState],
        in_flight: bool = False,
        steps: int | None = None,
        timeline_path: str | None = None,
    ):
        if max_staleness < 1:
            raise ValueError(
                f"train.max_staleness={max_staleness}: an overlapped run needs >= 1 (with 0 "
                "the sampler waits for every update and nothing overlaps)"
            )
        self.inner, self.k, self.deterministic = inner, max_staleness, deterministic
        self.place, self.in_flight, self.steps = place, in_flight and not deterministic, steps
        self._cond = threading.Condition()
        self._versions: dict[int, TrainState] = {}  # published sampler states by version
        self._latest = -1  # newest published version
        self._queue: dict[int, _Drawn] = {}  # finished batches by index
        self._next = -1  # the next batch the sampler draws (-1: from the first collect's)
        self._busy = self._paused = self._closing = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._restored: dict[int, Any] = {}  # saved versions' leaves, placed at collect
        self._clock = time.perf_counter()
        self._trained_since: float | None = None  # when the trainer took its last batch
        self._timeline = open(timeline_path, "a") if timeline_path else None  # noqa: SIM115

    # -- the trainer's side ------------------------------------------------------------------

    def collect(self, state: TrainState, step: int) -> Collection:
        """Publishes `state`'s parameters to the sampler and returns batch `step - 1` (waiting
        for it if the sampler is behind), with its sampling metrics under "sampler/", the
        wait and handoff as "time/rollout_s", and the queue's state under "overlap/"."""
        index, version = step - 1, int(state.step)
        if self.deterministic and version != index:
            raise RuntimeError(
                f"train.overlap='deterministic' needs one update per step, but step {step} "
                f"learns with version {version}"
            )
        began = time.perf_counter()
        if self._trained_since is not None:
            self._event("trainer", index - 1, self._trained_since, began)
        self._restore_versions(state)
        published = self.place(state)
        jax.block_until_ready(published.params)
        handoff_s = time.perf_counter() - began
        self._event("handoff", index, began, began + handoff_s)
        with self._cond:
            self._versions[version] = published
            self._latest = version
            self._paused = False
            if self._next < 0:
                self._next = index
            self._prune()
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._sample, name="rljax-sampler", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
            while index not in self._queue and self._error is None and not self._closing:
                self._cond.wait()
            if self._error is not None:
                raise RuntimeError(f"the sampler thread failed: {self._error!r}") from self._error
            if self._closing:
                raise RuntimeError("the overlapped collector was closed while waiting for a batch")
            drawn = self._queue.pop(index)
            depth, held = len(self._queue), len(self._versions)
        self._trained_since = time.perf_counter()
        batch = drawn.collection.fresh[0]
        if "policy_version" not in batch.rows:  # one version for the whole batch
            versions = np.full(len(batch), drawn.version, np.int32)
            batch = batch.with_rows(policy_version=versions)
        metrics = {}
        for key, value in drawn.collection.metrics.items():
            metrics[key.replace("time/", "sampler/", 1) if key.startswith("time/") else key] = value
        gigabytes = _nbytes(published.params) / 1e9
        metrics.update(
            {
                "time/rollout_s": self._trained_since - began,
                "time/reward_s": 0.0,  # scored on the sampler's thread: in sampler/reward_s
                "sampler/busy_s": drawn.end - drawn.start,
                "overlap/wait_s": self._trained_since - began - handoff_s,
                "overlap/handoff_s": handoff_s,
                "overlap/handoff_gb_per_s": gigabytes / max(handoff_s, 1e-9),
                "overlap/queue_depth": float(depth),
                "overlap/versions_held": float(held),
                "overlap/held_gb": held * gigabytes,
                "staleness/versions": float(version - int(batch.rows["policy_version"].min())),
            }
        )
        return Collection([batch], [], metrics)

    def state(self) -> dict[str, Any]:
        """Pauses the sampler at its next batch boundary and returns the queue (and, when
        deterministic, the versions the next batches need) for a checkpoint; the data
        iterator then stands where the queued batches end. The next `collect` resumes."""
        with self._cond:
            self._paused = True
            while self._busy and self._error is None:
                self._cond.wait()
            out: dict[str, Any] = {"next": np.int64(self._next)}
            if self._queue:
                out["queue"] = {str(i): _saved(d) for i, d in self._queue.items()}
            if self.deterministic and self._versions:
                out["versions"] = {
                    str(v): jax.device_get(jax.tree.leaves(s.params))
                    for v, s in self._versions.items()
                }
            return out

    def load(self, state: dict[str, Any]) -> None:
        """Restores what `state` saved: the queue, the next batch, the versions."""
        self._next = int(state["next"])
        self._queue = {int(i): _loaded(d) for i, d in state.get("queue", {}).items()}
        self._restored = {int(v): x for v, x in state.get("versions", {}).items()}

    def close(self) -> None:
        """Stops the sampler (an in-flight engine rollout ends at its next decode call; a
        static one is waited for) and closes the timeline."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(_CLOSE_TIMEOUT_S)
            if self._thread.is_alive():
                logging.warning("the sampler thread did not stop in %.0f s", _CLOSE_TIMEOUT_S)
        if self._timeline is not None:
            self._timeline.close()
            self._timeline = None

    # -- the sampler's side ------------------------------------------------------------------

    def _sample(self) -> None:
        """The sampler thread: draws batch after batch as the pacing admits them."""
        try:
            while True:
                with self._cond:
                    index = self._next
                    need = max(index - self.k, 0)
                    while not self._closing and (
                        self._paused
                        or self._latest < need
                        or (self.steps is not None and index >= self.steps)
                    ):
                        self._cond.wait()
                    if self._closing:
                        return
                    version = need if self.deterministic else self._latest
                    sampler = self._versions[version]
                    self._busy = True
                start = time.perf_counter()
                policies = self._policies(sampler, index, version)
                collection = self.inner.draw_batch(policies, index + 1)
                end = time.perf_counter()
                self._event("sampler", index, start, end)
                with self._cond:
                    self._queue[index] = _Drawn(collection, version, start, end)
                    self._next = index + 1
                    self._busy = False
                    self._prune()
                    self._cond.notify_all()
        except _Closing:
            pass
        except BaseException as error:  # handed to the trainer, which raises it
            with self._cond:
                self._error = error
                self._cond.notify_all()
        finally:
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _policies(self, sampler: TrainState, index: int, version: int) -> Policies:
        """The sampler's `Policies` for batch `index`: its state carries the batch's step (the
        rollout's key comes from it, as in the ordered run)."""
        state = sampler.replace(step=np.asarray(index, np.int32))
        in_flight = None
        if self.in_flight:
            current = [version]

            def newer() -> tuple[int, TrainState] | None:
                with self._cond:
                    if self._closing:
                        raise _Closing
                    if self._latest <= current[0]:
                        return None
                    current[0] = self._latest
                    return current[0], self._versions[current[0]]

            in_flight = InFlight(version, newer)
        return Policies(state, state, state, index - version, in_flight)

    # -- shared ------------------------------------------------------------------------------

    def _prune(self) -> None:
        """Drops versions no batch will start with (under the lock): in deterministic mode
        those before max(next - K, 0), otherwise all but the newest."""
        keep = max(self._next - self.k, 0) if self.deterministic else self._latest
        for v in [v for v in self._versions if v < keep]:
            del self._versions[v]

    def _restore_versions(self, state: TrainState) -> None:
        """Publishes the versions a checkpoint saved, placed like `state`'s parameters."""
        for v, saved in sorted(self._restored.items()):
            placed = self.place(state.replace(params=placed_like(saved, state.params)))
            with self._cond:
                self._versions[v] = placed
        self._restored = {}

    def _event(self, role: str, index: int, start: float, end: float) -> None:
        """One timeline line: `role` ("sampler", "trainer", "handoff") busy on batch `index`."""
        if self._timeline is None:
            return
        line = {"role": role, "step": index + 1, "start": start - self._clock}
        line["end"] = end - self._clock
        with self._cond:
            self._timeline.write(json.dumps(line) + "\n")
            self._timeline.flush()


def _nbytes(tree: Any) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def _saved(drawn: _Drawn) -> dict[str, Any]:
    """A queued batch as a checkpoint's nested dict of arrays."""
    batch = drawn.collection.fresh[0]
    return {
        "rows": dict(batch.rows),
        "group_size": np.int64(batch.group_size),
        "version": np.int64(drawn.version),
        "metrics": {k: np.float64(v) for k, v in drawn.collection.metrics.items()},
    }


def _loaded(saved: dict[str, Any]) -> _Drawn:
    rows = {k: np.asarray(v) for k, v in saved["rows"].items()}
    metrics = {k: float(v) for k, v in saved.get("metrics", {}).items()}
    batch = HostBatch(rows, int(saved["group_size"]))
    return _Drawn(Collection([batch], [], metrics), int(saved["version"]), 0.0, 0.0)


class CopyOnTrainer:
    """The sampler's view of a state copied on the trainer's devices (the sampler shares the
    trainer's mesh; the copy survives the update's donation). Under LoRA only the adapters are
    copied each step; the frozen base is copied once and shared by every version."""

    def __init__(self):
        self.base = None

    def __call__(self, state: TrainState) -> TrainState:
        if state.base is not None and self.base is None:
            self.base = jax.tree.map(jnp.copy, state.base)
        view = jax.tree.map(jnp.copy, sampler_view(state.replace(base=None)))
        return view.replace(base=self.base)


def check_overlap(config: ConfigDict, task: Task, algorithm: Any) -> None:
    """What an overlapped run supports so far, checked before anything is built.

    Raises:
      ValueError: naming the keys to change.
    """
    t = config.train
    if t.overlap == "off":
        return
    if t.max_staleness < 1:
        raise ValueError(
            f"train.overlap={t.overlap!r} needs train.max_staleness >= 1 (how many versions "
            "the sampler may run ahead); with 0 nothing overlaps"
        )
    off = {
        # DARE rescores with the trainer's current policy, which the sampler thread lacks.
        "prompt_selection.name": config.prompt_selection.name == "dare",
        # Replay adds updates to a step; the sampler keys its rollouts by one update per step.
        "replay.name": config.replay.name != "none",
        # LoPE and ReMax sample and rescore with the trainer's current policy too.
        "lope.num_perturbed": config.lope.num_perturbed != 0,
        "algorithm.name": getattr(algorithm, "collection", None) is not None
        or getattr(algorithm, "greedy_baseline", False),
        "task.name": is_episodic(task),
        "model.kind": config.model.kind != "causal",
        "--num_processes": jax.process_count() > 1,
    }
    unsupported = [key for key, on in off.items() if on]
    if unsupported:
        raise ValueError(
            f"train.overlap={t.overlap!r} does not support {unsupported} yet (the sampler "
            "thread runs the plain group collector: refill, reward components, token-level "
            "rewards, a teacher, HeaPA's or the curriculum's prompt selection)"
        )
