"""A non-editable install ships `rljax` only, and works beside a user's own `configs/` package."""

import os
import shutil
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_wheel_has_no_configs_or_launchers_and_imports_beside_a_users_configs(tmp_path):
    source = tmp_path / "source"  # a copy, so building leaves nothing in the repository
    source.mkdir()
    shutil.copytree(
        os.path.join(ROOT, "rljax"), source / "rljax", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("setup.py", "README.md"):
        shutil.copy(os.path.join(ROOT, name), source / name)
    for name in ("configs", "launchers"):  # present in the tree, as in the repository
        shutil.copytree(os.path.join(ROOT, name), source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("rljax-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        z.extractall(site)  # a pure-python wheel: unpacking it is installing it
    assert "rljax" in tops
    assert not tops & {"configs", "launchers"}, tops

    project = tmp_path / "project"  # a user's project with its own configs package
    (project / "configs").mkdir(parents=True)
    (project / "configs" / "__init__.py").write_text("MINE = True\n")
    check = (
        "import os, sys\n"
        "import configs\n"
        "assert configs.MINE and configs.__file__.startswith(os.getcwd()), configs.__file__\n"
        "import rljax, rljax.train, rljax.config\n"
        "assert rljax.__file__.startswith(sys.argv[1]), rljax.__file__\n"
        "rljax.config.validate_config(rljax.config.default_config())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site), "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", check, str(site)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
