"""examples/quickstart.ipynb runs from top to bottom (executed by nbclient in a fresh kernel), so
that it cannot rot: loading the demo, generating, the draft tree, plain decoding, training."""
from __future__ import annotations

from pathlib import Path

import pytest

nbclient = pytest.importorskip("nbclient")
nbformat = pytest.importorskip("nbformat")

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"


@pytest.mark.extended
def test_quickstart_notebook_runs_and_dart_matches_plain_decoding():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    text = "".join(out.get("text", "") for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs)
    assert "identical outputs: True" in text
    assert "accepted path:" in text and "model.safetensors" in text
