"""Sharding: the (data, fsdp, tensor) mesh and logical-axis rules for parameters and batches."""

from rljax.parallel.mesh import MESH_AXES, make_mesh
from rljax.parallel.rules import (
    DEFAULT_RULES,
    batch_sharding,
    logical_to_spec,
    mesh_shardings,
    param_shardings,
    replicated,
    shard_params,
)

__all__ = [
    "MESH_AXES",
    "make_mesh",
    "DEFAULT_RULES",
    "batch_sharding",
    "logical_to_spec",
    "mesh_shardings",
    "param_shardings",
    "replicated",
    "shard_params",
]
