"""Helpers shared by the tests.

The executors the tests run on, derived from what the package registers (every back end in
``runtime.executable.BACKENDS`` and the reference interpreter) and from their capabilities in
``tempo_lab.executors.CAPS``: ``conftest.py`` parametrises every test that takes an
``executor`` argument over ``ALL`` unless ``@pytest.mark.executors(SUBSET, reason=...)`` names
a subset.

The semantic tests (``test_semantics``, ``test_indexing``, ``test_ops``) run on every executor;
their expected values never come from tempo_lab. Such a module activates the parametrisation
of ``compile_``/``run`` by importing ``executor`` (an autouse fixture)."""
import numpy as np
import pytest

import tempo_lab as tl
from tempo_lab.executors import CAPS
from tempo_lab.runtime.executable import BACKENDS

# every executor but "auto" (which runs one of the back ends): the back ends and the reference
ALL = (*BACKENDS, "reference")
# ALL and "auto": every name CompileConfig(executor=...) takes
WITH_AUTO = ("auto", *ALL)
# the back ends, which lower, schedule and plan memory (the reference does none of these)
COMPILED = tuple(BACKENDS)
# the back ends that take a device memory budget (move stores to the host between phases)
MEMORY_BUDGET = tuple(name for name in BACKENDS if CAPS[name].memory_budget)
# for slow tests: one back end per set of capabilities (of those sharing one, the last
# registered: the interpreter, which codegen runs the same kernels as, from generated code) and
# the reference
_ONE_PER_CAPS = {CAPS[name]: name for name in BACKENDS}
DISTINCT = tuple(name for name in ALL if name in (*_ONE_PER_CAPS.values(), "reference"))

assert set(WITH_AUTO) == set(tl.compile_config.EXECUTORS), (WITH_AUTO, tl.compile_config.EXECUTORS)

RTOL = 1e-5

ATOL = 1e-5

def close(actual, expected, rtol=RTOL, atol=ATOL):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)

_STATE = {"executor": "reference"}

@pytest.fixture(autouse=True)
def executor(request):
    """Each test of a module that imports this runs on every executor of ``ALL`` (parametrised
    by ``conftest.py``); ``compile_`` and ``run`` compile for it."""
    _STATE["executor"] = request.param
    yield request.param
    _STATE["executor"] = "reference"

def compile_(ctx, bounds, outputs):
    return ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor=_STATE["executor"]))

def run(ctx, bounds, **outputs):
    return compile_(ctx, bounds, outputs).run()

def ctx1():
    ctx = tl.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]

def ctx2(names=("b", "t")):
    ctx = tl.Context(dims=names)
    return (ctx, *ctx.dims, *ctx.bounds)

def rng(seed=0):
    return np.random.default_rng(seed)



def data_over(ctx, X, recurrent: bool):
    """``X`` over ``ctx``'s dims ``(i, b, t)`` as a tensor, or with ``recurrent`` a running sum
    along ``t`` (``x[t] = 0.5 x[t - 1] + X[t]``, so that ``t`` stays a loop, as in a rollout);
    the tensor and its NumPy value."""
    data = tl.from_array(X, domain=ctx.dims)
    if not recurrent:
        return data, X
    i, b, t = ctx.dims
    x = tl.placeholder(X.shape[3:], domain=ctx.dims)
    x[i, b, 0] = data
    x[i, b, t] = x[i, b, t - 1] * 0.5 + data
    return x, np.stack([sum(0.5 ** (k - j) * X[:, :, j] for j in range(k + 1))
                        for k in range(X.shape[2])], axis=2)
