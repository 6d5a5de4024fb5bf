"""Train with a config file: `rljax train --config=configs/grpo_addition.py` (or
`python -m launchers.train ...`, the same program).

Any config value can be overridden on the command line, e.g. `--config.train.steps=10`.
A typo in a key or a value of the wrong type stops the launcher with a one-line error.

Multi-host: start the same command on every host with `--coordinator_address=HOST:PORT
--num_processes=N --process_id=I` (or the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
JAX_PROCESS_ID environment variables); on TPU pods and SLURM `--num_processes=-1` lets
`jax.distributed` find them. The mesh then spans every host's devices.
"""

from __future__ import annotations

import os
import sys

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from rljax.launch.flags import begin, parse_flags
from rljax.parallel import distributed
from rljax.train.disk import DiskFull
from rljax.train.loop import train
from rljax.train.signals import Stopped

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an ml_collections config.", lock_config=True
)
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0, for a multi-process run."
)
_NUM_PROCESSES = flags.DEFINE_integer(
    "num_processes", None, "Processes in the run (1: single host; -1: detect, TPU pods/SLURM)."
)
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index in [0, N).")


def main(argv: list[str]) -> None:
    begin(argv)
    config = _CONFIG.value
    try:
        distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
        logging.info("config:\n%s", config)
        records = train(config)
    except DiskFull as err:  # the run's files are closed; writer threads' exit hooks would
        # only repeat the error (and tensorboardX's can hang on it): leave without them
        print(f"error: {err}", file=sys.stderr, flush=True)
        os._exit(1)
    except Stopped as stopped:  # SIGINT/SIGTERM: the step in flight finished and was saved
        print(stopped, file=sys.stderr)
        sys.exit(stopped.exit_code)
    except (ValueError, OSError, FloatingPointError) as err:
        # Bad settings, a missing or corrupted checkpoint or config file (ml_collections
        # defers that error to the first use of the config), a run stopped by its numerical
        # guard: one line, or the traceback with -v.
        if flags.FLAGS["verbosity"].present:
            raise
        sys.exit("error: " + " ".join(str(err).split()))
    if jax.process_index() != 0:
        return
    evals = [r for r in records if "eval/accuracy" in r]
    if evals:
        print(
            f"held-out accuracy: {evals[0]['eval/accuracy']:.3f} at step {evals[0]['step']}"
            f" -> {evals[-1]['eval/accuracy']:.3f} at step {evals[-1]['step']}"
        )
    print(f"metrics: {config.run_dir}/metrics.jsonl")


def launch(argv: list[str] | None = None) -> None:
    """Parses `argv` (default sys.argv; argv[0] is the program's name) and trains; exits.

    Call `rljax.launch.huge_pages.restart_with_huge_pages()` first, before JAX is imported.
    """
    flags.mark_flag_as_required("config")
    app.run(main, argv=argv, flags_parser=parse_flags)
