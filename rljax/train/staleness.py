"""Which parameters the sampler uses for a step: bounded staleness and the sampler's devices.

`StalePolicy` is the schedule of asynchronous RL (rollouts from a policy up to K versions old
while the trainer moves on), run in order so it is reproducible; its queue of versions is part
of the checkpoint, so a resumed run samples with the same parameters as an uninterrupted one.
`SamplerPolicy` adds the move onto the sampler's own devices (`mesh.sampler_devices`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rljax.core.state import TrainState
from rljax.train.sampler_mesh import SamplerDevices


class StalePolicy:
    """Bounded staleness: the sampler uses the policy of up to `max_staleness` updates ago.

    Each step samples with the oldest of the last K + 1 parameter versions (fewer at the start
    of a run). K = 0 is the synchronous loop, unchanged. The gap between sampler and trainer
    shows in the `mismatch/*` metrics, and the rollout corrections
    (`rollout_correction.name=tis|mis|ais`) correct it as they do quantized rollouts.

    Args:
      max_staleness: K >= 0 versions.
    """

    def __init__(self, max_staleness: int):
        if max_staleness < 0:
            raise ValueError(f"train.max_staleness={max_staleness} must be >= 0")
        self.max_staleness = max_staleness
        self.versions: collections.deque = collections.deque()
        self._restored: list[list[np.ndarray]] = []  # loaded leaves, placed at the next step

    def state_for(self, state: TrainState) -> tuple[TrainState, int]:
        """(the state to sample with, how many versions older than `state` its params are)."""
        if not self.max_staleness:
            return state, 0
        for saved in self._restored:  # onto the devices and layout of the run's parameters
            self.versions.append(placed_like(saved, state.params))
        self._restored = []
        # A copy: the update donates the state's buffers.
        self.versions.append(jax.tree.map(jnp.copy, state.params))
        while len(self.versions) > self.max_staleness + 1:
            self.versions.popleft()
        return state.replace(params=self.versions[0]), len(self.versions) - 1

    def state(self) -> dict[str, Any]:
        """The versions the next steps can still sample with (the last K), for a checkpoint."""
        kept = list(self.versions)[-self.max_staleness :] if self.max_staleness else []
        return {str(i): jax.tree.leaves(v) for i, v in enumerate(kept)}

    def load(self, state: dict[str, Any]) -> None:
        """Restores the versions saved by `state` (placed on devices at the next step)."""
        self.versions.clear()
        self._restored = [state[k] for k in sorted(state, key=int)]


def placed_like(saved: Any, params: Any) -> Any:
    """Parameters saved as a checkpoint's list of leaves (orbax may hand a list back as a dict
    keyed "0", "1", ...), placed on the devices and in the layout of the live `params`."""
    if isinstance(saved, dict):
        saved = [saved[k] for k in sorted(saved, key=int)]
    leaves, treedef = jax.tree.flatten(params)
    return jax.tree.unflatten(
        treedef, [jax.device_put(x, like.sharding) for x, like in zip(saved, leaves, strict=True)]
    )


class InFlight(NamedTuple):
    """Newer weights for a rollout under way (asynchronous RL's in-flight weight update).

    Attributes:
      version: the policy version of the state the rollout starts with.
      newer: polled between the rollout engine's decode calls: (version, the sampler's state
        of that version) to decode the rest with, or None to keep the current one.
    """

    version: int
    newer: Callable[[], tuple[int, TrainState] | None]


class Policies(NamedTuple):
    """The train states a step's collection reads.

    Attributes:
      current: the trainer's state (greedy baselines and rescoring use its policy).
      behaviour: the state whose parameters sample this step (K versions old under bounded
        staleness), on the trainer's mesh.
      sampler: `behaviour` where the sampler runs (its own devices, or `behaviour` itself).
      lag: how many versions `behaviour` is behind `current`.
      in_flight: newer weights the sampler may swap in mid-rollout (overlapped runs on the
        rollout engine), or None.
    """

    current: TrainState
    behaviour: TrainState
    sampler: TrainState
    lag: int = 0
    in_flight: InFlight | None = None


class SamplerPolicy:
    """The sampler's state for a step: `StalePolicy`'s version, moved to the sampler's devices.

    Args:
      max_staleness: K of `StalePolicy` (0: the trainer's current parameters).
      devices: the sampler's own devices (`mesh.sampler_devices`), or None to sample on the
        trainer's mesh.
    """

    def __init__(self, max_staleness: int = 0, devices: SamplerDevices | None = None):
        self.stale = StalePolicy(max_staleness)
        self.devices = devices

    def for_step(self, state: TrainState) -> tuple[Policies, dict[str, float]]:
        """The step's `Policies` and metrics: "staleness/versions" under staleness,
        "time/reshard_s" on the sampler's devices."""
        behaviour, lag = self.stale.state_for(state)
        sampler, metrics = behaviour, {}
        if self.stale.max_staleness:
            metrics["staleness/versions"] = float(lag)
        if self.devices is not None:
            sampler, metrics["time/reshard_s"] = self.devices.reshard(behaviour)
        return Policies(state, behaviour, sampler, lag), metrics

    def state(self) -> dict[str, Any]:
        return {"stale": self.stale.state()}

    def load(self, state: dict[str, Any]) -> None:
        self.stale.load(state["stale"])
