"""The one executor parametrisation: a test that takes an ``executor`` argument (or uses the
fixture, ``pytest.mark.usefixtures("executor")``) runs once on each executor of
``rt_helpers.ALL`` (ids: the executor names), or of the subset that
``@pytest.mark.executors(SUBSET, reason=...)`` names (on the test, or as a module's
``pytestmark``); the subsets are derived in ``rt_helpers`` from the package's registry of back
ends (``tempo_lab.executors.REGISTRY``). A test that parametrises ``executor`` together with
other arguments (``pytest.mark.parametrize("executor,batched", ...)``) keeps its own."""
from __future__ import annotations

import importlib
import pkgutil

import pytest
import rt_helpers
from rt_helpers import ALL


def pytest_sessionstart(session):
    """Every module of ``tempo_lab`` and ``benchmarks`` loaded before any test runs. Hypothesis
    mixes the literal constants of the project's loaded modules into what it draws, so a
    derandomised test drew other values according to what earlier tests had imported: CI, a
    worker with ``benchmarks.decode`` loaded, drew a checkpoint config of 10**12 layers that
    the test alone never drew. Loaded up front, a test draws the same examples alone, in the
    suite, on any worker."""
    for name in ("tempo_lab", "benchmarks"):
        package = importlib.import_module(name)
        for info in pkgutil.walk_packages(package.__path__, f"{name}."):
            importlib.import_module(info.name)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "executors(names, reason): run the test on these executors only (a subset "
        "from rt_helpers) and say why")


def _parametrised_by_mark(metafunc, name):
    for mark in metafunc.definition.iter_markers("parametrize"):
        names = mark.args[0]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if name in names:
            return True
    return False


def pytest_generate_tests(metafunc):
    if "executor" not in metafunc.fixturenames or _parametrised_by_mark(metafunc, "executor"):
        return
    mark = metafunc.definition.get_closest_marker("executors")
    if mark is None:
        names = ALL
    else:
        names = tuple(mark.args[0])
        assert mark.kwargs.get("reason"), "pytest.mark.executors needs a reason="
        assert set(names) <= {"auto", *ALL}, names
    metafunc.parametrize("executor", names, ids=list(names), indirect=True)


@pytest.fixture
def executor(request):
    """The executor's name (parametrised by ``pytest_generate_tests``), which
    ``rt_helpers.compile_`` and ``run`` compile for while the test runs."""
    rt_helpers.STATE["executor"] = request.param
    yield request.param
    rt_helpers.STATE["executor"] = rt_helpers.REFERENCE[0]
