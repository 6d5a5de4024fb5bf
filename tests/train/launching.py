"""Shared by the tests that start the training launcher in a subprocess: where to run it, the
tiny model's flags and its environment."""

import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A one-layer model of width 32: compiles in seconds.
TINY_MODEL = (
    "--config.model.d_model=32",
    "--config.model.n_layers=1",
    "--config.model.n_heads=2",
    "--config.model.n_kv_heads=1",
    "--config.model.d_ff=64",
)
CACHE = "JAX_COMPILATION_CACHE_DIR"


def launcher_env(compile_cache: bool = True) -> dict[str, str]:
    """This process's environment for a launcher on one CPU device (no XLA_FLAGS). Without
    `compile_cache` also without the persistent compilation cache, for tests that read every
    line of the output: other test processes evict its entries, and JAX then warns about a
    failed cache write that has nothing to do with the test (pass
    `--config.train.compilation_cache=` too)."""
    hidden = ("XLA_FLAGS",) if compile_cache else ("XLA_FLAGS", CACHE)
    return {k: v for k, v in os.environ.items() if k not in hidden}
