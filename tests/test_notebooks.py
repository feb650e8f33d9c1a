"""Every notebook in ``notebooks/`` runs top to bottom, headlessly, against a demo's lakehouse.

Each runs in its own kernel (``nbclient``); a cell that raises fails the test. The
notebooks assert what they show (a topic holds each message once, time travel sees
fewer rows, the stream reads them all), and each must draw its plots.
"""

from __future__ import annotations

import os
import time

import nbformat
import pytest
from nbclient import NotebookClient

from support import REPO_ROOT

NOTEBOOKS = REPO_ROOT / "notebooks"
#: Plots each notebook must draw.
PLOTS = {"committed_topics": 0, "transaction_audit": 1, "health": 4}


def run_notebook(name: str, config: os.PathLike, monkeypatch: pytest.MonkeyPatch) -> None:
    """Execute ``notebooks/<name>.ipynb`` against the lakehouse of the coordinator TOML ``config``;
    assert no cell failed and every plot was drawn."""
    monkeypatch.setenv("TXCOORD_CONFIG", str(config))  # the kernel inherits our environment
    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    started = time.monotonic()

    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()

    print(f"notebook {name} ran in {time.monotonic() - started:.1f} s")
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == PLOTS[name]


def test_every_notebook_is_tested():
    assert sorted(path.stem for path in NOTEBOOKS.glob("*.ipynb")) == sorted(PLOTS)


#: The notebooks that start no JVM. All three also run against the demo on S3
#: (``tests/test_object_storage.py``); that is where ``committed_topics``' Spark SQL runs, as
#: ``tests/test_catalog.py`` covers the same catalog on a local disk (time travel, streams).
JVM_FREE = ["health", "transaction_audit"]


@pytest.mark.slow
@pytest.mark.parametrize("name", JVM_FREE)
def test_notebook_runs_against_the_demo_lakehouse(demo, name, monkeypatch):
    lakehouse, _, _ = demo
    run_notebook(name, lakehouse / "demo.toml", monkeypatch)
