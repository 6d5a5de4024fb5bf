"""Every notebook runs top to bottom (with small step counts) in a fresh kernel."""

import glob
import os

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
