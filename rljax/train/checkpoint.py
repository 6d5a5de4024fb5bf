"""Checkpoints of the whole TrainState plus the data-iterator state, with orbax.

Each checkpoint is a step directory holding `state` (the TrainState pytree, sharded arrays
saved by each host), `data` (the grain iterator state as JSON) and, for drivers that keep
host-side state (UEC-RL's sample buffers), `driver` (a nested dict of numpy arrays). orbax
writes into a temporary directory and renames it when complete, so a run killed mid-write
never leaves a checkpoint that `latest_step` would pick up.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from rljax.core.state import TrainState


class Checkpointer:
    """Saves and restores (TrainState, data state) under one directory.

    Args:
      directory: where step directories go (created if missing).
      max_to_keep: how many of the newest checkpoints to keep.
      async_save: write in a background thread while training continues.
    """

    def __init__(self, directory: str, max_to_keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        """The newest complete checkpoint's step, or None."""
        return self._manager.latest_step()

    def save(
        self,
        step: int,
        state: TrainState,
        data_state: dict[str, Any],
        driver_state: dict[str, Any] | None = None,
    ) -> None:
        """Starts writing a checkpoint of `state`, the iterator state and the driver's state."""
        items = dict(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state))
        if driver_state is not None:
            # A leaf that is always there: orbax cannot save a tree without any array.
            tree = {"present": np.int32(1), "state": driver_state}
            items["driver"] = ocp.args.StandardSave(tree)
        self._manager.save(step, args=ocp.args.Composite(**items))

    def _check_step(self, step: int) -> None:
        if step not in self._manager.all_steps():
            raise FileNotFoundError(
                f"no complete checkpoint for step {step} in {self.directory}; "
                f"available: {list(self._manager.all_steps())}"
            )

    def restore(self, step: int, like: TrainState) -> tuple[TrainState, dict[str, Any]]:
        """Restores the checkpoint at `step` into the structure, shapes and shardings of `like`.

        Raises:
          FileNotFoundError: there is no complete checkpoint at `step`.
          ValueError: the checkpoint does not fit `like` (another model or optimizer).
        """
        self._check_step(step)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
                ),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(
                f"checkpoint {os.path.join(self.directory, str(step))} does not match this "
                f"run's train state (different model, optimizer or algorithm?): {err}"
            ) from err
        return restored.state, restored.data

    def restore_driver(self, step: int) -> dict[str, Any]:
        """The driver state saved with the checkpoint at `step` (UEC-RL's sample buffers).

        Raises:
          FileNotFoundError: there is no complete checkpoint at `step`, or it was written by a
            driver without state (another algorithm).
        """
        self._check_step(step)
        path = os.path.join(self.directory, str(step))
        if not os.path.isdir(os.path.join(path, "driver")):
            raise FileNotFoundError(
                f"checkpoint {path} holds no driver state (written by an algorithm whose driver "
                "keeps none?); resume with the algorithm that wrote it or use a new run_dir"
            )
        restored = self._manager.restore(
            step, args=ocp.args.Composite(driver=ocp.args.StandardRestore())
        )
        return restored.driver["state"]

    def wait(self) -> None:
        """Blocks until pending asynchronous writes are complete."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()
