"""Execute the research notebooks in place, so their stored outputs match the code.

    python notebooks/refresh.py [--quick] [notebooks/decode_time_vs_seq_len.ipynb ...]

Full settings by default (minutes per notebook on two cores); ``--quick`` sets
``TEMPO_LAB_QUICK=1`` as CI does. Set ``TEMPO_LAB_DECODE_JSON`` to a saved
``python -m benchmarks.decode`` run to plot it in ``decode_time_vs_seq_len`` instead of
measuring there. Execution timing metadata and widget state are stripped so diffs show only
real changes. ``tests/test_notebooks.py`` executes the notebooks with ``execute`` (not in
place).
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

import nbformat
from nbclient import NotebookClient

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def notebooks() -> list[str]:
    return sorted(glob.glob(os.path.join(HERE, "*.ipynb")))


def kernel_env(quick: bool) -> dict[str, str]:
    """The environment the kernel inherits: fixed hash seed, CPU, the repository on the path
    (so ``import tempo_lab`` and ``benchmarks`` work whatever is installed), the quick switch."""
    env = {"PYTHONHASHSEED": "0", "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    if quick:
        env["TEMPO_LAB_QUICK"] = "1"
    return env


def execute(path: str, quick: bool, timeout: int = 1800) -> nbformat.NotebookNode:
    """Run every cell of the notebook at ``path`` (from its folder) and return it; a cell error
    raises ``nbclient.exceptions.CellExecutionError``."""
    env = {k: v for k, v in os.environ.items() if k != "TEMPO_LAB_QUICK"} | kernel_env(quick)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute(env=env)
    return nb


def strip_volatile(nb: nbformat.NotebookNode) -> None:
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        for out in cell.get("outputs", []):
            out.get("metadata", {}).pop("execution", None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--quick", action="store_true", help="TEMPO_LAB_QUICK=1 (CI sizes)")
    args = ap.parse_args(argv)
    for path in args.paths or notebooks():
        nb = execute(os.path.abspath(path), args.quick)
        strip_volatile(nb)
        nbformat.write(nb, path)
        print(f"refreshed {os.path.relpath(path)} ({'quick' if args.quick else 'full'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
