"""Helpers shared by the tests.

The executors the tests run on, derived from the package's one registry of back ends
(``tempo_lab.executors.REGISTRY``: each one's name and capabilities): ``conftest.py``
parametrises every test that takes an ``executor`` argument over ``ALL`` unless
``@pytest.mark.executors(SUBSET, reason=...)`` names one of the subsets below.

The semantic tests (``test_semantics``, ``test_indexing``, ``test_ops``) run on every executor;
their expected values never come from tempo_lab. Such a module runs every test on each executor
with ``pytestmark = pytest.mark.usefixtures("executor")``: the fixture (``conftest.py``) sets
the executor ``compile_`` and ``run`` compile for."""
import numpy as np

import tempo_lab as tl
from tempo_lab.executors import REGISTRY

# every executor but "auto" (which runs one of the others), in the registry's order
ALL = tuple(REGISTRY)
# ALL and "auto": every name CompileConfig(executor=...) takes
WITH_AUTO = ("auto", *ALL)
# the back ends that lower, schedule and plan memory (all but the reference interpreter)
COMPILED = tuple(name for name in ALL if REGISTRY[name].caps.lowers)
# the executors that do not lower: the reference interpreter, the SDG as built
REFERENCE = tuple(name for name in ALL if not REGISTRY[name].caps.lowers)
# the back ends that take a device memory budget (move stores to the host between phases)
MEMORY_BUDGET = tuple(name for name in COMPILED if REGISTRY[name].caps.memory_budget)
# for slow tests: one back end per set of capabilities (of those sharing one, the last
# registered: the interpreter, which codegen runs the same kernels as, from generated code) and
# the reference
_ONE_PER_CAPS = {REGISTRY[name].caps: name for name in ALL}
DISTINCT = tuple(name for name in ALL if name in _ONE_PER_CAPS.values())
# DISTINCT's back ends (one per set of capabilities, without the reference)
DISTINCT_COMPILED = tuple(name for name in DISTINCT if name in COMPILED)
# the back ends that dispatch each statement from Python (a profile with the store bytes after
# every statement, kernel events when recording, a run's progress bar)
PER_STATEMENT = tuple(name for name in COMPILED if REGISTRY[name].caps.store_timeline)

assert set(WITH_AUTO) == set(tl.compile_config.EXECUTORS), (WITH_AUTO, tl.compile_config.EXECUTORS)


RTOL = 1e-5

ATOL = 1e-5

def close(actual, expected, rtol=RTOL, atol=ATOL, msg="", same_shape=True):
    """``actual`` equals ``expected`` to the tolerances (and has its shape, unless
    ``same_shape=False``, which lets NumPy broadcast them)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    if same_shape:
        assert actual.shape == expected.shape, (actual.shape, expected.shape, msg)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol, err_msg=msg)


# the executor ``compile_`` and ``run`` compile for: set by the ``executor`` fixture
# (``conftest.py``) for the test it parametrises
STATE = {"executor": REFERENCE[0]}


def compile_(ctx, bounds, outputs, executor=None, **config):
    """``ctx.compile`` of ``outputs`` at ``bounds`` for ``executor`` (None: the one the
    ``executor`` fixture set, else the reference interpreter), with the other
    ``tl.CompileConfig`` fields given as keywords."""
    executor = STATE["executor"] if executor is None else executor
    return ctx.compile(bounds=bounds, outputs=outputs,
                       config=tl.CompileConfig(executor=executor, **config))


def run(ctx, bounds, **outputs):
    return compile_(ctx, bounds, outputs).run()


def check_vs_reference(ctx, bounds, outputs, executor=None, *, rtol=RTOL, atol=ATOL,
                       exact=False, **config):
    """The program of ``outputs`` at ``bounds`` on ``executor`` (as ``compile_`` picks it, with
    ``config``) against the reference interpreter (the SDG as built, NumPy point by point, no
    pass and no schedule): the same outputs, each equal to the reference's (bit for bit with
    ``exact``, else to ``rtol``/``atol``), and the same bounds reached. Returns the executor's
    run for what a test checks besides. (Loopy's ``auto_test_vs_ref``; a program that calls
    Python, ``tl.sink`` or ``tl.source``, runs its callbacks once on each.)"""
    run_ = compile_(ctx, bounds, outputs, executor, **config).run()
    ref = compile_(ctx, bounds, outputs, REFERENCE[0]).run()
    assert set(run_.keys()) == set(ref.keys()), (sorted(run_.keys()), sorted(ref.keys()))
    reached = {k: run_.bounds[k] for k in ref.bounds}  # (without the dims passes added)
    assert reached == ref.bounds, (run_.bounds, ref.bounds)
    for name in ref.keys():
        msg = f"{name!r} on {run_.executor} vs the reference"
        if exact:
            np.testing.assert_array_equal(run_[name], ref[name], err_msg=msg)
        else:
            close(run_[name], ref[name], rtol, atol, msg)
    return run_

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


def table_program():
    """``h[i, t]``, a recurrence over steps ``t`` whose iteration ``i`` starts from the last
    step of iteration ``i - 1`` (so the loop over ``i`` is outside the one over ``t``), reads
    a table of ``t`` alone, ``cos(t * f)``: an index function, needed at every step of every
    iteration."""
    ctx = tl.Context(dims=("i", "t"))
    i, t = ctx.dims
    _, T = ctx.bounds
    freqs = np.array([0.5, 0.25, 0.125], np.float32)
    with ctx:
        table = tl.cos(tl.constant(freqs) * t)  # t's value at the point
        h = tl.placeholder((3,), domain=(i, t), name="h")
        h[0, 0] = table
        h[(t < 1) & (i > 0)] = 0.5 * h[i - 1, T - 1]
        h[i, t] = 0.9 * h[i, t - 1] + table
        last = h[ctx.bounds[0] - 1, T - 1]
    return ctx, {"h": h, "last": last}, table
