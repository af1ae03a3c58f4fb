"""The research notebooks under notebooks/ execute without a cell error (quick settings).

They are not output-checked (docs/testing.md: research notebooks only have to execute); each is
run with nbclient in a fresh python3 kernel with TEMPO_LAB_QUICK=1 and PYTHONHASHSEED=0, the
same way ``notebooks/refresh.py --quick`` runs them, and the stored file is left untouched.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
TIMEOUT_S = 600  # per cell; quick settings take seconds to a minute per notebook


def _runner():
    """notebooks/refresh.py (notebooks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("notebooks_refresh", NOTEBOOKS / "refresh.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_research_notebooks():
    assert sorted(NOTEBOOKS.glob("*.ipynb")), "notebooks/ holds no notebook"


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_executes(path):
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("plotly")
    from nbclient.exceptions import CellExecutionError

    try:
        nb = _runner().execute(str(path), quick=True, timeout=TIMEOUT_S)
    except CellExecutionError as e:
        pytest.fail(f"{path.name}: a cell raised\n{e}", pytrace=False)
    errors = [out for cell in nb.cells for out in cell.get("outputs", [])
              if out.get("output_type") == "error"]
    assert not errors, f"{path.name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
