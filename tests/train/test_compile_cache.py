"""The persistent compilation cache: on by default, JAX_COMPILATION_CACHE_DIR wins, "" is off,
and a second process loads what the first compiled."""

import os
import subprocess
import sys

import jax

from rljax.train.compile_cache import enable_compilation_cache

PROGRAM = """
import sys
import jax, jax.numpy as jnp
from rljax.train.compile_cache import enable_compilation_cache
enable_compilation_cache(sys.argv[1])
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event))
jax.jit(lambda x: jnp.tanh(x @ x.T) * 1.5)(jnp.ones((96, 96))).block_until_ready()
print(sum("cache_hits" in e for e in hits))
"""


def cache_hits_of_two_runs(directory: str, env: dict[str, str]) -> list[int]:
    """The persistent-cache hits of PROGRAM run twice, one process after the other."""
    runs = [
        subprocess.run(
            [sys.executable, "-c", PROGRAM, directory],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        for _ in range(2)
    ]
    return [int(r.stdout.split()[-1]) for r in runs]


def test_a_second_process_loads_the_programs_the_first_compiled(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    hits = cache_hits_of_two_runs(str(tmp_path / "cache"), env)
    assert os.listdir(tmp_path / "cache")  # the first process wrote its programs
    assert hits[0] == 0 and hits[1] > 0, hits


def test_a_shared_directory_with_entries_of_a_non_evicting_program_is_still_written(tmp_path):
    # Another JAX program (no size limit, so no access-time files) left an entry in the
    # directory the environment names. Our processes must still write and load theirs: with
    # a size limit, JAX's eviction fails on such an entry and every write fails with it.
    cache = tmp_path / "shared"
    cache.mkdir()
    (cache / "jit_other-0123-cache").write_bytes(b"x" * 100)
    hits = cache_hits_of_two_runs("unused", {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(cache)})
    assert hits[0] == 0 and hits[1] > 0, hits


def test_the_environment_wins_and_empty_is_off(tmp_path, monkeypatch):
    before = jax.config.jax_compilation_cache_dir
    try:
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "env"))
        assert enable_compilation_cache(str(tmp_path / "config")) == str(tmp_path / "env")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "env")
        monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR")
        assert enable_compilation_cache("") is None
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "env")  # left alone
        monkeypatch.setenv("HOME", str(tmp_path))
        assert enable_compilation_cache("~/c") == str(tmp_path / "c")
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
