"""The launchers: `rljax train` and `rljax eval` (also `python -m launchers.train|eval`)."""
