"""Repository-wide pytest setup.

Notebook kernels started by nbval inherit a fixed hash seed, so set iteration order (and anything
printed from it) is the same on every run, and the compilation cache turned off (below).

The suite runs on two pytest-xdist workers (``-n 2 --dist loadgroup`` in pyproject's addopts):
tests are handed out one at a time, except that a notebook's cells (they share one kernel, in
order) and a module whose fixtures are module-scoped (a JupyterLab server, compiled programs)
stay together on one worker. ``python -m pytest -n 0`` runs in one process.
"""
import os

import pytest

os.environ.setdefault("PYTHONHASHSEED", "0")
# No persistent compilation cache in the suite (tl.config.compilation_cache): a cache on disk
# shared by the workers and kept between runs would make a test's path depend on what earlier
# runs compiled. tests/runtime/test_compile_cache.py turns it on in processes of its own.
os.environ.setdefault("TEMPO_LAB_COMPILATION_CACHE", "")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        if path.endswith(".ipynb") or _has_module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(path))


def _has_module_fixtures(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in ("module", "package")
               and defs[-1].baseid  # the project's own fixtures, not pytest's or a plugin's
               for defs in info.name2fixturedefs.values())
