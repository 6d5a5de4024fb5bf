"""Test set-up: eight fake CPU devices so sharding tests run on one host, and a persistent
compilation cache so the many identical programs the suite compiles (every launch of the
resume tests, every notebook run's SFT and evaluation) are compiled once."""

import os
import tempfile

# Must be set before jax is imported anywhere in the test process; subprocesses (launcher
# runs, notebook kernels) inherit the cache settings.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rljax-test-jax-cache")
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# XLA's backend (LLVM) optimisations off: the suite's tiny programs compile about a third
# faster and run no slower that matters. Numerical comparisons compile both sides alike.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
