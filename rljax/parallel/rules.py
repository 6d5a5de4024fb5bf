"""Logical-axis sharding rules: parameter axis names -> mesh axes -> NamedShardings.

Parameters carry logical axis names (`rljax.models.transformer`); a rules table maps each name
to mesh axes. A dimension that its mesh axes do not divide (e.g. 2 kv heads on tensor=4) is
replicated instead, so any model runs on any mesh.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes = str | tuple[str, ...] | None

# FSDP shards the model width, tensor parallelism the heads, MLP width and vocabulary, expert
# parallelism the expert dimension of MoE weights. The batch is not split over "expert" (see
# `rljax.parallel.mesh.make_mesh`).
DEFAULT_RULES: Mapping[str, MeshAxes] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "q_heads": "tensor",
    "kv_heads": "tensor",
    "mlp": "tensor",
    "vocab": "tensor",
    "head_dim": None,
    "norm": None,
    "expert": "expert",
    "layers": None,  # the stacked blocks' leading axis: every device holds every layer's slice
}


def _axis_size(mesh: Mesh, axes: MeshAxes) -> int:
    if axes is None:
        return 1
    names = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[n] for n in names)


def logical_to_spec(
    logical: tuple[str | None, ...],
    shape: tuple[int, ...],
    mesh: Mesh,
    rules: Mapping[str, MeshAxes] = DEFAULT_RULES,
) -> PartitionSpec:
    """PartitionSpec for an array of `shape` whose dimensions have the given logical names."""
    if len(logical) != len(shape):
        raise ValueError(f"logical axes {logical} do not match shape {shape}")
    spec, used = [], set()
    for name, dim in zip(logical, shape):
        if name is not None and name not in rules:
            raise ValueError(f"logical axis {name!r} has no sharding rule; known: {sorted(rules)}")
        axes = None if name is None else rules[name]
        names = () if axes is None else ((axes,) if isinstance(axes, str) else tuple(axes))
        if not names or dim % _axis_size(mesh, axes) or used & set(names):
            spec.append(None)  # replicate: no rule, not divisible, or mesh axis already used
        else:
            spec.append(axes)
            used |= set(names)
    return PartitionSpec(*spec)


def param_shardings(
    params: nnx.State, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> nnx.State:
    """A pytree like `params` whose leaves are the NamedShardings of each parameter."""
    logical = nnx.get_partition_spec(params)
    return jax.tree.map(
        lambda spec, x: NamedSharding(mesh, logical_to_spec(tuple(spec), x.shape, mesh, rules)),
        logical,
        params,
        is_leaf=lambda s: isinstance(s, PartitionSpec),
    )


def batch_sharding(
    mesh: Mesh, ndim: int, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> NamedSharding:
    """Sharding of an [B, ...] array with `ndim` dims: B split over the "batch" mesh axes."""
    return NamedSharding(mesh, PartitionSpec(rules["batch"], *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    """The same value on every device (PRNG keys, scalars)."""
    return NamedSharding(mesh, PartitionSpec())


def shard_params(
    params: nnx.State, mesh: Mesh, rules: Mapping[str, MeshAxes] = DEFAULT_RULES
) -> nnx.State:
    """Places each parameter on the mesh according to the rules."""
    return jax.device_put(params, param_shardings(params, mesh, rules))


def mesh_shardings(tree, mesh: Mesh):
    """The shardings of `tree`'s arrays, with anything not yet on `mesh` replicated over it.

    Optimizer states and scalars created outside a sharded computation live on one device;
    jitted steps need every input on the same mesh. Use with `jax.device_put(tree, result)`.
    """

    def on_mesh(x):
        sharding = getattr(x, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return sharding
        return replicated(mesh)

    return jax.tree.map(on_mesh, tree)
