"""Train with a config file: `python -m launchers.train --config=configs/grpo_addition.py`.

Any config value can be overridden on the command line, e.g. `--config.train.steps=10`.
A typo in a key or a value of the wrong type stops the launcher with a one-line error.
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

from rljax.train.loop import train

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to an ml_collections config.", lock_config=True
)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing with one-line errors for unknown config keys and bad values."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as err:  # a value of the wrong type, a missing required flag
        sys.exit(f"error: {err}")
    except (AttributeError, KeyError) as err:  # ml_collections: a config key that is not there
        detail = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"error: unknown config key {detail}")
    except OSError as err:  # overrides of a config file that failed to load
        sys.exit("error: " + " ".join(str(err).split()))


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(
            f"unexpected arguments {argv[1:]}; config values are set with --config.KEY=VALUE"
        )
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax and grain are chatty at INFO
    config = _CONFIG.value
    try:
        logging.info("config:\n%s", config)
        records = train(config)
    except (ValueError, OSError) as err:
        # Bad settings, a missing checkpoint or config file (ml_collections defers that error
        # to the first use of the config): one line, or the traceback with -v.
        if flags.FLAGS["verbosity"].present:
            raise
        sys.exit("error: " + " ".join(str(err).split()))
    evals = [r for r in records if "eval/accuracy" in r]
    if evals:
        print(
            f"held-out accuracy: {evals[0]['eval/accuracy']:.3f} at step {evals[0]['step']}"
            f" -> {evals[-1]['eval/accuracy']:.3f} at step {evals[-1]['step']}"
        )
    print(f"metrics: {config.run_dir}/metrics.jsonl")


if __name__ == "__main__":
    flags.mark_flag_as_required("config")
    app.run(main, flags_parser=parse_flags)
