"""JAX's persistent compilation cache, on by default: a restarted run compiles nothing twice.

A 30-layer model's update program takes minutes to compile on a CPU; with the cache, a second
launch of the same run (a resume after a crash, the next experiment with the same shapes)
loads the compiled programs from disk. Keys cover the program, its shapes and shardings, the
compile options and the JAX version, so a code change never reuses a stale program.
"""

from __future__ import annotations

import os

import jax

# The most the cache may hold on disk; the least recently used programs go first.
MAX_CACHE_BYTES = 4 << 30


def enable_compilation_cache(directory: str) -> str | None:
    """Turns on the persistent compilation cache; returns its directory, or None when off.

    `JAX_COMPILATION_CACHE_DIR`, when set, wins over `directory` and keeps JAX's own size
    limit (none unless `JAX_COMPILATION_CACHE_MAX_SIZE` says); `directory` is held to
    `MAX_CACHE_BYTES`, least recently used programs evicted first. "" (and no such variable)
    leaves JAX's settings alone. Every compilation is cached, also those under a second
    (the sampler and the small steps of a tiny model add up on a CPU).

    Args:
      directory: the cache directory (`train.compilation_cache`, by default
        "~/.cache/rljax/jax"; "~" expands).
    """
    shared = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    path = shared or os.path.expanduser(directory)
    if not path:
        return None
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    if not shared:
        # Our own directory: bounded. A directory named by the environment may be shared
        # with JAX programs that do not evict, whose entries have no access-time files: JAX's
        # eviction then fails on them, and with it every write of this process.
        jax.config.update("jax_compilation_cache_max_size", MAX_CACHE_BYTES)
    return path
