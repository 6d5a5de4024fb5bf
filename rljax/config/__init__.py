"""The run config's schema, defaults and validation.

`SCHEMA` holds every key the driver reads (default, type, range, one-line doc);
`default_config()` is the complete default config a recipe starts from; `validate_config`
checks a config and returns it complete, so code reads it and never supplies a default.
"""

from rljax.config.schema import OPEN_SECTIONS, SCHEMA, Key, config_from_json, default_config
from rljax.config.validate import validate_config

__all__ = [
    "OPEN_SECTIONS",
    "SCHEMA",
    "Key",
    "config_from_json",
    "default_config",
    "validate_config",
]
