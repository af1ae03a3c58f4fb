"""Re-execute tutorials in place so their stored outputs match the code (nbval compares them).

    python tutorials/refresh.py [tutorials/01_recurrent_tensors.ipynb ...]

Executes with nbclient from the tutorials folder and strips what would make diffs noisy:
execution timing metadata and widget state. Run after changing a tutorial or its outputs.
"""
from __future__ import annotations

import glob
import os
import sys

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))


def refresh(path: str) -> None:
    os.environ.setdefault("PYTHONHASHSEED", "0")
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": HERE}}).execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            out.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, path)
    print(f"refreshed {os.path.relpath(path)}")


if __name__ == "__main__":
    for p in sys.argv[1:] or sorted(glob.glob(os.path.join(HERE, "[0-9]*.ipynb"))):
        refresh(p)
