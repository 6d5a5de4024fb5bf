"""The device mesh: named axes (data, fsdp, tensor, expert), built in one place from the config."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor", "expert")


def make_mesh(
    data: int = 1,
    fsdp: int = 1,
    tensor: int = 1,
    devices: Sequence[jax.Device] | None = None,
    expert: int = 1,
) -> Mesh:
    """A Mesh with axes ("data", "fsdp", "tensor", "expert").

    One of the sizes may be -1: it takes whatever the device count leaves. "expert" is the
    fastest-varying axis and "tensor" the next, so expert- and tensor-parallel groups are
    neighbouring devices (as in MaxText's axis order); with expert=1 the device layout is the
    one of the three-axis mesh.

    Args:
      data: data-parallel replicas (batch split, parameters replicated).
      fsdp: fully-sharded data parallel (batch split, parameters sharded on "embed").
      tensor: tensor parallel (heads, MLP width and vocabulary sharded).
      devices: defaults to all of `jax.devices()`.
      expert: expert parallel (the expert dimension of MoE weights sharded). The batch is NOT
        split over it: an expert group holds the same rows, each device runs its experts on
        all of them and the expert mixture is summed across the group; dense layers are
        replicated across the group.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor, expert]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))}: at most one may be -1")
    if any(s == 0 or s < -1 for s in sizes):
        raise ValueError(f"mesh sizes {dict(zip(MESH_AXES, sizes))} must be positive (or -1)")
    if -1 in sizes:
        rest = math.prod(s for s in sizes if s != -1)
        if len(devices) % rest:
            raise ValueError(
                f"mesh sizes {dict(zip(MESH_AXES, sizes))}: {len(devices)} devices "
                f"are not divisible by {rest}"
            )
        sizes[sizes.index(-1)] = len(devices) // rest
    if math.prod(sizes) != len(devices):
        raise ValueError(
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} x expert={sizes[3]} = "
            f"{math.prod(sizes)} "
            f"devices, but {len(devices)} are available; set the sizes so their product is "
            f"{len(devices)} (one of them may be -1)"
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def split_devices(sampler_devices: int) -> tuple[list[jax.Device], list[jax.Device]]:
    """(the sampler's devices, the trainer's) for `mesh.sampler_devices`: the first n / p
    devices of each of the p processes and the rest, both in process order (one process: the
    first n devices and the rest). Every process thus samples its block of rows on its own
    devices and trains on its own devices.

    Raises:
      ValueError: n not a multiple of the process count.
    """
    count = jax.process_count()
    if sampler_devices % count:
        raise ValueError(
            f"mesh.sampler_devices={sampler_devices} does not split over {count} processes; "
            "make it a multiple of the process count (each process samples on its share)"
        )
    per = sampler_devices // count
    by_process = [[d for d in jax.devices() if d.process_index == i] for i in range(count)]
    return [d for ds in by_process for d in ds[:per]], [d for ds in by_process for d in ds[per:]]
