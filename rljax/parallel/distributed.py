"""Multi-host runs on JAX's multi-controller runtime: start-up and host <-> global arrays.

Every process runs the same driver. The mesh spans all processes' devices; jitted steps take
and return global arrays whose batch rows are split over the mesh's "batch" axes, so each
process holds a contiguous block of rows (devices are ordered by process). The host side
(decoding, rewards, data) works on that block: `to_global` turns host-local numpy rows into
global arrays, `to_local` takes this process's rows back, and `allgather` collects a small
host-side array from every process (for metrics that must describe the whole batch).

With one process all three are cheap identities, so the driver has one code path.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, PartitionSpec


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
) -> None:
    """Starts `jax.distributed` when a multi-process run is asked for; else does nothing.

    The settings come from the arguments (launcher flags) or the environment
    (`JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`); on TPU pods and SLURM
    clusters `jax.distributed.initialize()` finds them itself, so `num_processes=-1` calls it
    with no arguments. On CPU the processes talk through gloo collectives.
    """
    env = os.environ
    address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS")
    count = num_processes if num_processes is not None else int(env.get("JAX_NUM_PROCESSES", 1))
    pid = process_id if process_id is not None else int(env.get("JAX_PROCESS_ID", 0))
    if count == -1:  # auto-detected cluster (TPU pod, SLURM, ...)
        jax.distributed.initialize()
        return
    if count == 1:
        return
    if count < 1 or not 0 <= pid < count or not address:
        raise ValueError(
            f"a multi-process run needs a coordinator address and 0 <= process_id < "
            f"num_processes; got address={address!r}, num_processes={count}, process_id={pid}"
        )
    # CPU devices need a collectives implementation across processes (accelerators have
    # their own; the setting only affects the CPU backend).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(address, num_processes=count, process_id=pid)


def to_global(tree: Any, mesh: Mesh, spec: PartitionSpec) -> Any:
    """Host-local arrays (this process's rows) -> global arrays sharded by `spec` on `mesh`."""
    return multihost_utils.host_local_array_to_global_array(tree, mesh, spec)


def to_local(tree: Any, mesh: Mesh, spec: PartitionSpec) -> Any:
    """Global arrays sharded by `spec` -> numpy arrays of this process's rows."""
    local = multihost_utils.global_array_to_host_local_array(tree, mesh, spec)
    return jax.tree.map(np.asarray, local)


def allgather(x: np.ndarray) -> np.ndarray:
    """Every process's `x` concatenated along axis 0, in process order (x itself alone)."""
    if jax.process_count() == 1:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(np.asarray(x), tiled=True))


def fetch(x: jax.Array) -> np.ndarray:
    """The whole value of a (possibly multi-process) global array, on every process."""
    if jax.process_count() == 1 or x.is_fully_addressable:
        return np.asarray(x)
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def from_lead(text: str, size: int = 4096) -> str:
    """Process 0's `text` on every process (its first `size` UTF-8 bytes); `text` alone with
    one process. Every process must call it: a decision only process 0 can make (it holds the
    run directory's lock) reaches the others, so all stop with the same message."""
    if jax.process_count() == 1:
        return text
    buffer = np.zeros(size, np.uint8)
    if jax.process_index() == 0:
        data = np.frombuffer(text.encode()[:size], np.uint8)
        buffer[: data.size] = data
    shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return shared.tobytes().rstrip(b"\0").decode(errors="replace")
