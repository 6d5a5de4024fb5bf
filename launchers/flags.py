"""absl flag parsing shared by the launchers: one-line errors for bad config keys and values."""

from __future__ import annotations

import sys

from absl import flags


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
