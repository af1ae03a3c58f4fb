"""Helpers shared by the semantic tests: every test runs on each executor (the reference
interpreter, the ground truth, and the JAX interpreter); expected values never come from
tempo_lab. A test module activates the executor parametrisation by importing ``executor``."""
import numpy as np
import pytest

import tempo_lab as tl

RTOL = 1e-5

ATOL = 1e-5

def close(actual, expected, rtol=RTOL, atol=ATOL):
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)

EXECUTORS = [e for e in ("reference", "interpreter") if e in tl.compile_config.EXECUTORS]

_STATE = {"executor": "reference"}

@pytest.fixture(autouse=True, params=EXECUTORS)
def executor(request):
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

