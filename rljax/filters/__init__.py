"""Sample filters and reward shaping: transforms that drop samples or edit rewards."""

from rljax.filters.dynamic_sampling import dynamic_sampling, select_informative_groups
from rljax.filters.overlong import (
    overlong_filter,
    overlong_punishment,
    soft_overlong_penalty,
    truncated_mask,
)

__all__ = [
    "dynamic_sampling",
    "overlong_filter",
    "overlong_punishment",
    "select_informative_groups",
    "soft_overlong_penalty",
    "truncated_mask",
]
