"""The launcher's restart with glibc's huge-page tunable: when, with what environment, once."""

import os
import platform
import subprocess
import sys

import pytest

from rljax.launch.huge_pages import TUNABLE, wanted, with_tunable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_tunable_joins_existing_ones_and_is_not_wanted_twice():
    assert with_tunable({})["GLIBC_TUNABLES"] == TUNABLE
    env = with_tunable({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "X": "1"})
    assert env == {"GLIBC_TUNABLES": f"glibc.malloc.arena_max=2:{TUNABLE}", "X": "1"}
    assert not wanted(env)  # the restarted process does not restart again
    assert not wanted({"RLJAX_HUGE_PAGES": "0"})


def huge_pages_available() -> bool:
    libc, version = platform.libc_ver()
    if libc != "glibc" or tuple(int(v) for v in version.split(".")[:2]) < (2, 35):
        return False
    try:
        return "[never]" not in open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return False


@pytest.mark.skipif(not huge_pages_available(), reason="needs glibc 2.35+ and THP")
def test_the_launcher_restarts_itself_once_with_the_tunable():
    """A process calling `restart_with_huge_pages` (as the launcher does first) carries on
    with the tunable set; with RLJAX_HUGE_PAGES=0 it carries on unchanged."""
    code = (
        "import os; from rljax.launch.huge_pages import restart_with_huge_pages; "
        "restart_with_huge_pages(); print(os.environ.get('GLIBC_TUNABLES'))"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "RLJAX_HUGE_PAGES")}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert proc.stdout.strip() == TUNABLE
    off = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**env, "RLJAX_HUGE_PAGES": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert off.stdout.strip() == "None"
