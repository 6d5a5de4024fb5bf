"""Every notebook runs top to bottom (with small step counts) in a fresh kernel, and the
quickstart installs rljax itself in a fresh Python, as on Colab."""

import glob
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
SMALL = {
    "RLJAX_NOTEBOOK_STEPS": "4",
    "RLJAX_NOTEBOOK_SFT_STEPS": "20",
    "RLJAX_NOTEBOOK_EVAL_SIZE": "64",
}


# The default suite runs the quickstart; these (a minute or more each, compiling several
# engines or training two recipes) run with `make test-slow`.
SLOW = {
    "agent_episode.ipynb",
    "mxfp4_rl.ipynb",
    "entropy_schedules.ipynb",
    "diffusion_rl.ipynb",
    "custom_transform.ipynb",
}


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.slow) if os.path.basename(p) in SLOW else p
        for p in NOTEBOOKS
    ],
    ids=os.path.basename,
)
def test_notebook_executes(path, monkeypatch):
    for key, value in SMALL.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("XLA_FLAGS", raising=False)  # one device, like a laptop or Colab
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path} is committed with outputs; strip them"
    )
    NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}
    ).execute()
    outputs = "".join(
        o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    assert "held-out accuracy" in outputs


# Run in the fresh virtual environment: the notebook from a folder outside the repository.
_EXECUTE = """
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=1200, kernel_name="python3").execute()
print("".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs))
"""


@pytest.mark.slow
def test_quickstart_installs_rljax_in_a_fresh_python_as_colab_would(tmp_path):
    """A fresh venv holding only a notebook kernel (Colab's base, without its preinstalled
    libraries) runs the quickstart from an empty folder: the first cell clones the committed
    repository (RLJAX_SOURCE=file://ROOT stands in for its public URL), installs it with its
    dependencies from the package index, and the notebook trains."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    kernel = ["ipykernel", "nbclient", "nbformat"]
    subprocess.run([python, "-m", "pip", "install", "-q", *kernel], check=True)
    content = tmp_path / "content"  # Colab's working folder
    content.mkdir()
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")},
        **SMALL,
        "RLJAX_SOURCE": f"file://{ROOT}",
    }
    done = subprocess.run(
        [python, "-c", _EXECUTE, os.path.join(ROOT, "notebooks", "quickstart.ipynb")],
        cwd=content,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "held-out accuracy" in done.stdout
    assert os.path.isfile(content / "rljax-src" / "setup.py")  # the clone the cell made
