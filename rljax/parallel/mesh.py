"""The device mesh: named axes (data, fsdp, tensor), built in one place from the config."""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

MESH_AXES = ("data", "fsdp", "tensor")


def make_mesh(
    data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A Mesh with axes ("data", "fsdp", "tensor").

    One of the sizes may be -1: it takes whatever the device count leaves. `tensor` is the
    fastest-varying axis, so tensor-parallel groups are neighbouring devices.

    Args:
      data: data-parallel replicas (batch split, parameters replicated).
      fsdp: fully-sharded data parallel (batch split, parameters sharded on "embed").
      tensor: tensor parallel (heads, MLP width and vocabulary sharded).
      devices: defaults to all of `jax.devices()`.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = [data, fsdp, tensor]
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
            f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} = {math.prod(sizes)} "
            f"devices, but {len(devices)} are available; set the sizes so their product is "
            f"{len(devices)} (one of them may be -1)"
        )
    return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)
