"""The sampler on its own devices, with an explicit, timed weight resharding each step.

Generation and training want different layouts (the sampler: small batches of long decodes,
KV caches, often replicated or tensor-parallel weights; the trainer: FSDP-sharded weights and
optimizer state). With `mesh.sampler_devices = n` the first n devices form the sampler's mesh
(data-parallel over them) and the rest the trainer's; every step the policy's weights move
from the trainer's layout to the sampler's in one `jax.device_put` (`reshard`), timed and
logged as `time/reshard_s`: the step Tunix, Marin and MaxText users report as their
bottleneck, here measured rather than hidden. Only what sampling needs moves (the weights, the
step and the key); the optimizer state stays on the trainer. With several processes each
takes the first n / p of its own devices (`rljax.parallel.mesh.split_devices`) and the move
goes through `moved_to`.
"""

from __future__ import annotations

import time

import jax
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.algorithms import Algorithm
from rljax.core.state import FrozenBase, TrainState
from rljax.parallel.rules import param_shardings, replicated
from rljax.train.steps import RolloutConfig, Steps, make_steps


def sampler_view(state: TrainState) -> TrainState:
    """The part of a train state that sampling reads: params, step and key (and a LoRA run's
    frozen base)."""
    return TrainState(
        step=state.step,
        params=state.params,
        opt_state=None,
        ref_params=None,
        transform_state=None,
        rng=state.rng,
        base=state.base,
    )


class SamplerDevices:
    """The sampler's mesh, its jitted rollout, and the reshard onto it.

    Args:
      graphdef, optimizer, algorithm, rollout_config: as for `make_steps`.
      mesh: the sampler's mesh (its own devices).
      params: the policy parameters (for their logical axes and shapes; arrays already on
        `mesh`, such as an overlapped run's on the trainer's mesh, keep their shardings).
      base: a LoRA run's frozen base, on `mesh` (LoRA does not take `mesh.sampler_devices`
        yet), or None.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef,
        optimizer: optax.GradientTransformation,
        algorithm: Algorithm,
        rollout_config: RolloutConfig,
        mesh: Mesh,
        params: nnx.State,
        base: FrozenBase | None = None,
    ):
        self.mesh = mesh
        self.shardings = TrainState(
            step=replicated(mesh),
            params=_shardings(params, mesh),
            opt_state=None,
            ref_params=None,
            transform_state=None,
            rng=replicated(mesh),
            base=None if base is None else _shardings(base, mesh),
        )
        self.steps: Steps = make_steps(
            graphdef,
            optimizer,
            algorithm,
            rollout_config,
            mesh=mesh,
            state_shardings=self.shardings,
        )

    def reshard(self, state: TrainState) -> tuple[TrainState, float]:
        """(the sampler's copy of `state`'s params, step and key; seconds the move took)."""
        start = time.perf_counter()
        moved = jax.tree.map(moved_to, sampler_view(state), self.shardings)
        return jax.block_until_ready(moved), time.perf_counter() - start


def moved_to(x: jax.Array, target: NamedSharding) -> jax.Array:
    """`x` on `target`, device to device.

    Across processes JAX reshards only between the same devices (other device sets: TPU
    only), so there `x` is first replicated over its own devices (one all-gather among the
    trainer's devices), then each process copies its replica onto its share of the target
    devices and the pieces form the global array. The replica is the peak extra memory: one
    copy of the weights per trainer device while it lasts.
    """
    if x.is_fully_addressable or x.sharding.device_set == target.device_set:
        return jax.device_put(x, target)
    whole = jax.device_put(x, NamedSharding(x.sharding.mesh, PartitionSpec()))
    local = whole.addressable_shards[0].data
    pieces = [
        jax.device_put(local[index], device)
        for device, index in target.addressable_devices_indices_map(x.shape).items()
    ]
    return jax.make_array_from_single_device_arrays(x.shape, target, pieces)


def _shardings(tree, mesh: Mesh):
    """The shardings of `tree` on `mesh`: its arrays' own when they are already there (a LoRA
    run's adapters carry no logical axes), else from the parameters' logical axes."""
    devices = set(mesh.devices.flat)
    leaves = jax.tree.leaves(tree)
    if all(isinstance(x, jax.Array) and x.sharding.device_set == devices for x in leaves):
        return jax.tree.map(lambda x: x.sharding, tree)
    return param_shardings(tree, mesh)
