"""Checkpoints of the whole TrainState plus the data-iterator state, with orbax.

Each checkpoint is a step directory holding `state` (the TrainState pytree, sharded arrays
saved by each host), `data` (the grain iterator state as JSON) and, for drivers that keep
host-side state (UEC-RL's sample buffers), `driver` (a nested dict of numpy arrays). orbax
writes into a temporary directory and renames it when complete, so a run killed mid-write
never leaves a checkpoint that `latest_step` would pick up.

When a checkpoint's files are written, process 0 records the size and SHA-256 of each in
`MANIFEST` (inside the temporary directory, before the rename: every save, synchronous ones
too, goes through orbax's asynchronous path, whose callback runs before the rename); a restore
checks them first, and refuses a checkpoint without a manifest unless told to
(`allow_unverified`). orbax itself does not notice a flipped or truncated array file (it
restores the wrong numbers), so the manifest is what turns disk or copy corruption into an
error naming the file. Hashing reads the checkpoint once more after each save (in the
background) and at restore (~1 GB/s). A state with a NaN or infinity is neither saved nor
restored (`first_non_finite` names the tensor): a diverged run must not overwrite good
checkpoints, and an unverified checkpoint that restores a NaN must not train on.

Under LoRA the frozen base (`TrainState.base.params`) is not written: a checkpoint holds the
adapters, their optimizer state and the base's fingerprint; a restore takes the base from the
run's own state (`like`, rebuilt from `model.checkpoint`) and refuses another base.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from rljax.core.state import TrainState
from rljax.parallel.distributed import fetch

MANIFEST = "rljax_manifest.json"


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(step_dir: str) -> None:
    """Records the size and SHA-256 of every file of a checkpoint's items (state, data,
    driver: the files in its subdirectories)."""
    files = {}
    for root, _, names in os.walk(step_dir):
        for name in sorted(names):
            path = os.path.join(root, name)
            rel = os.path.relpath(path, step_dir)
            if os.sep not in rel:  # orbax's step metadata, rewritten when the write commits
                continue
            files[rel] = {"bytes": os.path.getsize(path), "sha256": _sha256(path)}
    partial = os.path.join(step_dir, MANIFEST + ".partial")
    with open(partial, "w", encoding="utf-8") as f:
        json.dump(files, f, indent=0, sort_keys=True)
    os.replace(partial, os.path.join(step_dir, MANIFEST))


def verify_manifest(step_dir: str, allow_missing: bool = False) -> None:
    """Checks a checkpoint's files against its manifest.

    Args:
      step_dir: the checkpoint's step directory.
      allow_missing: without a manifest, warn and return instead of raising.

    Raises:
      ValueError: the manifest is missing (unless allowed), or a file is missing, has another
        size, or other content; the message names it.
    """
    path = os.path.join(step_dir, MANIFEST)
    if not os.path.exists(path):
        if not allow_missing:
            raise ValueError(
                f"checkpoint {step_dir} has no {MANIFEST}, so its files cannot be verified; "
                "delete it to resume from an earlier checkpoint, or set "
                "train.allow_unverified_checkpoint=True to restore it anyway"
            )
        logging.warning("%s has no %s; restoring it unverified", step_dir, MANIFEST)
        return
    with open(path, encoding="utf-8") as f:
        files = json.load(f)
    advice = "the checkpoint is corrupted; delete the directory to resume from an earlier one"
    for rel, want in files.items():
        name = os.path.join(step_dir, rel)
        if not os.path.exists(name):
            raise ValueError(f"checkpoint file {name} is missing; {advice}")
        size = os.path.getsize(name)
        if size != want["bytes"]:
            raise ValueError(
                f"checkpoint file {name} has {size} bytes, {want['bytes']} were written; {advice}"
            )
        digest = _sha256(name)
        if digest != want["sha256"]:
            raise ValueError(
                f"checkpoint file {name} differs from what was written (sha256 {digest[:12]}, "
                f"recorded {want['sha256'][:12]}); {advice}"
            )


@jax.jit
def _finite(leaves: list[jax.Array]) -> jax.Array:
    """[len(leaves)] bool: whether each leaf is free of NaN and infinity."""
    return jnp.stack([jnp.isfinite(x).all() for x in leaves])


def first_non_finite(tree: Any) -> str | None:
    """The path (`jax.tree_util.keystr`) of the first floating-point leaf of `tree` holding a
    NaN or an infinity, or None when all are finite.

    One jitted pass over the leaves, one transfer of a flag per leaf; in a multi-process run
    every process calls it (the leaves may be global arrays).
    """
    named = [
        (path, leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if jnp.issubdtype(jnp.result_type(leaf), jnp.floating)
    ]
    if not named:
        return None
    finite = fetch(_finite([leaf for _, leaf in named]))
    bad = np.flatnonzero(~finite)
    return jax.tree_util.keystr(named[bad[0]][0]) if bad.size else None


def _flat_shapes(tree: Any) -> dict[tuple[str, ...], tuple[tuple[int, ...], str]]:
    """Leaf path (names only) -> (shape, dtype), for comparing a run's state with a stored one."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        names = tuple(
            str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path
        )
        names = tuple(n for n in names if n != "value")  # nnx variables wrap their arrays
        out[names] = (tuple(getattr(leaf, "shape", ())), str(getattr(leaf, "dtype", "")))
    return out


def without_base(state: Any) -> Any:
    """`state` as a checkpoint holds it: a LoRA TrainState without the frozen base's weights,
    anything else as it is."""
    if not isinstance(state, TrainState) or state.base is None:
        return state
    return state.replace(base=state.base.replace(params=None))


def _per_layer(names: tuple[str, ...]) -> bool:
    """A key of the per-layer block layout ("layers", "0", ...) that stacked blocks replaced."""
    return any(a == "layers" and b.isdigit() for a, b in zip(names, names[1:]))


def describe_mismatch(stored: Any, like: Any) -> str:
    """The first difference between a stored state's structure and a run's, in words ("" if
    none is found)."""
    a, b = _flat_shapes(stored), _flat_shapes(like)
    for key in sorted(set(a) | set(b)):
        name = "/".join(key)
        if key not in b and _per_layer(key):
            return (
                f"{name} is in the checkpoint: it holds one entry per layer, as rljax wrote "
                "before the decoder's blocks were stacked for the layer scan; resume it with "
                "the rljax version that wrote it, or export it with that version "
                "(save_hf_checkpoint) and start from the export"
            )
        if key not in b:
            return f"{name} is in the checkpoint but not in this run's state"
        if key not in a:
            return f"{name} is in this run's state but not in the checkpoint"
        if a[key][0] != b[key][0]:
            return f"{name} has shape {a[key][0]} in the checkpoint, {b[key][0]} in this run"
    return ""


class Checkpointer:
    """Saves and restores (TrainState, data state) under one directory.

    Args:
      directory: where step directories go (created if missing).
      max_to_keep: how many of the newest checkpoints to keep.
      async_save: write in a background thread while training continues (else `save` waits).
      allow_unverified: restore a checkpoint that has no manifest (with a warning).
    """

    def __init__(
        self,
        directory: str,
        max_to_keep: int = 3,
        async_save: bool = True,
        allow_unverified: bool = False,
    ):
        self.directory = os.path.abspath(directory)
        self._async = async_save
        self._allow_unverified = allow_unverified
        self._writing: int | None = None  # the step whose write is in flight
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep,
            enable_async_checkpointing=True,  # a synchronous save waits: the manifest callback
            create=True,
            async_options=ocp.AsyncOptions(post_finalization_callback=self._finalized),
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options)

    def _finalized(self) -> None:
        """Once a checkpoint's files are written, process 0 adds its manifest. orbax calls
        this before it renames the temporary directory, so the manifest is part of the atomic
        commit."""
        step, self._writing = self._writing, None
        if step is None or jax.process_index() != 0:
            return
        pending = glob.glob(os.path.join(self.directory, f"{step}.orbax-checkpoint-tmp*"))
        final = os.path.join(self.directory, str(step))
        write_manifest(pending[0] if len(pending) == 1 else final)

    def all_steps(self) -> list[int]:
        """The steps of the complete checkpoints, oldest first."""
        return sorted(self._manager.all_steps())

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
        """Starts writing a checkpoint of `state`, the iterator state and the driver's state.

        Raises:
          ValueError: a tensor of `state` holds a NaN or infinity (named); nothing is written.
        """
        bad = first_non_finite(state)
        if bad is not None:
            raise ValueError(
                f"refusing to save checkpoint {step}: {bad} of the train state holds NaN or inf "
                f"(the run diverged); the checkpoints in {self.directory} are kept: resume from "
                f"step {self.latest_step()} with a lower train.learning_rate"
            )
        saved = without_base(state)
        items = dict(state=ocp.args.StandardSave(saved), data=ocp.args.JsonSave(data_state))
        if driver_state is not None:
            # A leaf that is always there: orbax cannot save a tree without any array.
            tree = {"present": np.int32(1), "state": driver_state}
            items["driver"] = ocp.args.StandardSave(tree)
        self._manager.wait_until_finished()  # (orbax would too) the last write has its manifest
        self._writing = step
        self._manager.save(step, args=ocp.args.Composite(**items))
        if not self._async:
            self._manager.wait_until_finished()

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
          ValueError: the checkpoint has no manifest (unless `allow_unverified`), a file of it
            is corrupted (named), it does not fit `like` (another model or optimizer; the first
            differing tensor is named), it adapts another LoRA base than `like`'s, or a
            restored tensor holds NaN or inf (named).
        """
        full, like = like, without_base(like)
        self._check_step(step)
        path = os.path.join(self.directory, str(step))
        verify_manifest(path, self._allow_unverified)
        mismatch = f"checkpoint {path} does not match this run's train state (different model, "
        mismatch += "optimizer or algorithm?): "
        stored = ocp.StandardCheckpointer().metadata(os.path.join(path, "state")).item_metadata
        if stored is None:  # reachable without a manifest only
            raise ValueError(
                f"checkpoint {path} has no readable state metadata (state/_METADATA); the "
                "checkpoint is damaged: delete it to resume from an earlier checkpoint"
            )
        difference = describe_mismatch(stored.tree, like)
        if difference:  # orbax would fill a tensor missing from the checkpoint without a word
            raise ValueError(mismatch + difference)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        try:
            restored = self._manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()
                ),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(mismatch + str(err)) from err
        bad = first_non_finite(restored.state)
        if bad is not None:
            raise ValueError(
                f"checkpoint {path}: {bad} holds NaN or inf after restoring (a corrupted file, or "
                "a state saved after the run diverged); delete it to resume from an earlier "
                "checkpoint"
            )
        state = restored.state
        if isinstance(full, TrainState) and full.base is not None:
            if not np.array_equal(fetch(state.base.fingerprint), fetch(full.base.fingerprint)):
                raise ValueError(
                    f"checkpoint {path} holds LoRA adapters of another base model than this "
                    "run's model.checkpoint (fingerprint differs); resume with the base it was "
                    "trained on"
                )
            state = state.replace(base=state.base.replace(params=full.base.params))
        return state, restored.data

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
        """Waits for the write in flight, then releases orbax's threads."""
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb) -> None:
        """Closes; while an error is propagating, a failure to close is logged, not raised, so
        that it cannot mask the error that stopped the run. Closing before the interpreter
        exits also lets the write in flight commit: left to interpreter shutdown, orbax's commit
        thread fails ("cannot schedule new futures after shutdown") and prints its traceback
        after the run's error."""
        if error is None:
            self.close()
            return
        try:
            self.close()
        except Exception as close_error:  # logged: the run's own error follows
            logging.warning(
                "closing the checkpointer of %s failed: %s", self.directory, close_error
            )
