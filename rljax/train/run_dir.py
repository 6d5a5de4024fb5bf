"""The run directory: one writer at a time, and a config history that keeps steps meaningful.

`RunDir(path, config)` is what the driver enters before it writes anything under `run_dir`:

- A lock. Process 0 holds `fcntl.flock(LOCK_EX | LOCK_NB)` on `<run_dir>/rljax.lock` for the
  whole run and writes its pid, host and start time into the file; a second writer (another
  run, or the same process entering twice) is refused with a one-line error naming the holder.
  The kernel drops the lock when the holder dies, even by SIGKILL, so the file left behind
  never blocks the next run. Child processes do not keep it: the descriptor is close-on-exec
  and a forked child closes its copy (`os.register_at_fork`). In a multi-process run only
  process 0 locks, and its verdict reaches every process (`from_lead`), so all stop with the
  same line.
- A config history (`begin`, once the driver knows the step it starts from). When resuming
  from a checkpoint, the run's config is compared with the stored `config.json`: a key that
  changes the train state or the meaning of the steps already taken (the model, the task, the
  algorithm and its settings, the optimizer, the rollout, batch and group sizes, the seed, ...)
  may change only with `train.allow_config_change=True`. The keys of `FREE_KEYS` are
  execution-only (run length and cadence of evals, checkpoints and logs, caches, sharding,
  memory/speed knobs that compute the same maths, how rewards are executed, the override
  flags themselves) and may always change; `train.steps` is free unless it sets a schedule's
  length (AQN's stages, a preset's `total_steps`). `config.json` then holds the current config
  and `configs.jsonl` one `{"step", "time", "config"}` record per start, so the config in
  effect at any logged step is the last record at or before it. Like `metrics.jsonl`, the
  history drops the records of steps a resume redoes, and a new run starts it afresh.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from collections.abc import Callable
from typing import Any

import jax
from absl import logging
from ml_collections import ConfigDict

from rljax.config import config_from_json, validate_config
from rljax.config.schema import SCHEMA, Key
from rljax.metrics.writers import keep_records_until
from rljax.parallel.distributed import from_lead
from rljax.train.builders import ALGORITHMS, preset_settings

LOCK = "rljax.lock"
CONFIG = "config.json"
HISTORY = "configs.jsonl"

# Keys (or section prefixes) a resumed run may change freely: they change how and how long the
# run executes, not its train state or what its earlier steps mean.
FREE_KEYS = frozenset(
    {
        "run_dir",
        "mesh",  # sharding: the same maths on another device layout
        "log",  # where metrics also go (W&B, MLflow, TensorBoard)
        "model.remat",  # recomputation in the backward pass
        "model.attention_chunk",  # attention in query chunks, the same scores
        "model.scan_layers",  # the same blocks, scanned or unrolled
        "model.attention_impl",  # the attention kernel, the same maths up to rounding
        # The rollout engine's schedule: what a request samples does not depend on it.
        "rollout.slots",
        "rollout.decode_steps",
        "rollout.admit_after",
        "rollout.span_bucket",
        "rollout.prefill_rows",
        "reward.workers",
        "reward.kind",
        "reward.timeout_s",
        "train.steps",  # unless a schedule's length (`_steps_set_a_schedule`)
        "train.eval_every",
        "train.checkpoint_every",
        "train.max_checkpoints",
        "train.log_samples",
        "train.compilation_cache",
        "train.max_consecutive_skips",
        "train.microbatches",  # gradient accumulation: memory, not maths
        "train.vocab_chunk",
        "train.pack_ratio",
        "train.pad_multiple",  # padding columns cut before learning: the same maths
        "train.allow_config_change",
        "train.allow_unverified_checkpoint",
    }
)
_SHOWN = 4  # changed keys named in the refusal

# Lock descriptors this process holds. A forked child (a reward worker) closes its copies, so
# the lock goes when the trainer goes; closing, unlike LOCK_UN, leaves the parent's lock alone.
_HELD: set[int] = set()


def _close_in_child() -> None:
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


os.register_at_fork(after_in_child=_close_in_child)


class RunDir:
    """Exclusive use of a run directory and its config history (see the module docstring).

    Args:
      path: the run directory (created if missing).
      config: the validated run config.
    """

    def __init__(self, path: str, config: ConfigDict):
        self.path = os.path.abspath(path)
        self.config = config
        self._fd: int | None = None

    def __enter__(self) -> RunDir:
        """Takes the lock (process 0).

        Raises:
          ValueError: another process holds it (its pid and host named), or it cannot be taken.
        """
        _agree(self._lock)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._fd is not None:
            _HELD.discard(self._fd)
            os.close(self._fd)  # the last descriptor of the lock: the kernel releases it
            self._fd = None

    def begin(self, step: int | None) -> None:
        """Checks the config against the stored one when resuming from `step` (None: a new run),
        then records it in `config.json` and `configs.jsonl` (process 0).

        Raises:
          ValueError: a key that may not change did, and `train.allow_config_change` is False.
        """

        def check_and_record() -> None:
            if step is not None:
                self._check_config()
            self._record(step)

        _agree(check_and_record)

    def _lock(self) -> None:
        os.makedirs(self.path, exist_ok=True)
        path = os.path.join(self.path, LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ValueError(
                f"run_dir {self.path} is in use by {holder} ({path} is locked); wait for that "
                "run to finish, or set run_dir to another directory"
            ) from None
        except OSError as err:
            os.close(fd)
            raise ValueError(
                f"cannot lock {path} ({err.strerror}); put run_dir on a filesystem with "
                "flock support (a local disk)"
            ) from None
        self._fd = fd
        _HELD.add(fd)
        started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)

    def _check_config(self) -> None:
        path = os.path.join(self.path, CONFIG)
        if not os.path.exists(path):
            logging.warning("%s has no %s; the resumed config is not compared", self.path, CONFIG)
            return
        try:
            with open(path, encoding="utf-8") as f:
                stored = json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{path} is not valid JSON ({err}); restore it, or delete it to resume with "
                "this run's config unchecked"
            ) from None
        changed = changed_keys(stored, self.config)
        if not changed:
            return
        shown = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changed[:_SHOWN])
        more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
        if self.config.train.allow_config_change:
            logging.warning("resuming %s with a changed config: %s%s", self.path, shown, more)
            return
        raise ValueError(
            f"run_dir {self.path} was trained with another config ({path}): {shown}{more}; "
            "these change the train state or the meaning of its steps: resume with the stored "
            "values, use another run_dir, or set train.allow_config_change=True"
        )

    def _record(self, step: int | None) -> None:
        text = self.config.to_json_best_effort(indent=2, sort_keys=True)
        path = os.path.join(self.path, CONFIG)
        with open(path + ".partial", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(path + ".partial", path)
        history = os.path.join(self.path, HISTORY)
        keep_records_until(history, None if step is None else step - 1)
        now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        record = {"step": step or 0, "time": now, "config": json.loads(text)}
        with open(history, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


class _Unset:
    """A key one of the two configs does not set (an open section's setting left out)."""

    def __repr__(self) -> str:
        return "unset"


_UNSET = _Unset()


def stored_config(path: str) -> ConfigDict:
    """The validated config a run stored in `path/config.json`, with `run_dir` set to `path`
    as it is now (the directory may have moved since training).

    Raises:
      FileNotFoundError: no config.json in `path` (or no such directory).
      ValueError: the stored config does not validate.
    """
    path = os.path.abspath(path)
    file = os.path.join(path, CONFIG)
    if not os.path.isfile(file):
        raise FileNotFoundError(
            f"{path} has no {CONFIG}: pass the run_dir of a training run (what `rljax train` wrote)"
        )
    with open(file, encoding="utf-8") as f:
        config = validate_config(config_from_json(json.load(f)))
    config.run_dir = path
    return config


def changed_keys(stored: dict[str, Any], config: ConfigDict) -> list[tuple[str, Any, Any]]:
    """(key, stored value, value in `config`) of each key that changed and may not: the
    `*.name` keys (they pick what the others mean) first, then by key.

    A schema key missing from the stored config (added to rljax since) counts as its default.
    """
    old = _flat(stored)
    new = _flat(json.loads(config.to_json_best_effort()))
    out = []
    for key in sorted(set(old) | set(new), key=lambda k: (not k.endswith(".name"), k)):
        before, after = old.get(key, _schema_default(key)), new.get(key, _UNSET)
        if before != after and not _free(key, config):
            out.append((key, before, after))
    return out


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> {"section.key": value}."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _schema_default(key: str) -> Any:
    """The schema default of a dotted key as JSON holds it, or `_UNSET` (not a schema key)."""
    entry: Any = SCHEMA
    for part in key.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None
    return json.loads(json.dumps(entry.default)) if isinstance(entry, Key) else _UNSET


def _free(key: str, config: ConfigDict) -> bool:
    if key == "train.steps" and _steps_set_a_schedule(config):
        return False
    return any(key == free or key.startswith(free + ".") for free in FREE_KEYS)


def _steps_set_a_schedule(config: ConfigDict) -> bool:
    """Whether `train.steps` is a schedule's length: AQN's stages, or a preset's `total_steps`
    (Entrocraft) that `algorithm.total_steps` does not set."""
    preset = ALGORITHMS.get(config.algorithm.name)
    takes = preset is not None and "total_steps" in preset_settings(preset)
    return config.rollout.aqn_sigma_start != 0 or (takes and "total_steps" not in config.algorithm)


def _holder(fd: int) -> str:
    """Who holds the lock, from what it wrote into the lock file."""
    try:
        holder = json.loads(os.pread(fd, 4096, 0))
        return f"pid {holder['pid']} on host {holder['host']} since {holder['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not written its pid and host yet)"


def _agree(decide: Callable[[], None]) -> None:
    """Runs `decide` on process 0 and raises its ValueError/OSError, as a one-line ValueError,
    on every process."""
    error = ""
    if jax.process_index() == 0:
        try:
            decide()
        except (OSError, ValueError) as err:
            if jax.process_count() == 1:
                raise
            error = str(err) or repr(err)
    error = from_lead(error)
    if error:
        raise ValueError(error)
