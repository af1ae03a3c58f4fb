"""Random programs of 16-bit floats (float16, bfloat16) on every executor against the reference
interpreter: the floating-point contract of the README ("Floating point") checked on what
hypothesis draws, edge values included (the largest finite value and values near it, 0 and
-0, subnormals, mixed signs), so that an overflow, a rounding or an accumulation one executor
handles differently shows as a shrunk program.

A program: an input over ``(t,)`` of shape ``(4,)``, then a chain of steps, each an
elementwise op (with another drawn input or a constant), a reduction (over the spatial axis,
or along ``t`` over ``0:t+1`` or a window) or a softmax. Results must have the same infinities
and NaNs in the same places, and finite values within a few units of the dtype's last place
(XLA's fused kernels may order a reduction differently: one rounding apart)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from randprog import edge_values
from rt_helpers import COMPILED

import tempo_lab as tl

T = 4
DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
CONSTANTS = (1000.0, 0.5, 2.0, 1e-3, -3.0)


def _edges(dtype: str) -> list[float]:
    """``randprog.edge_values`` and a few ordinary values. For bfloat16 without its smallest
    normal: a product of it with a value below 1 is a float32 subnormal, which XLA on the CPU
    makes zero (the README's "Floating point")."""
    tiny = float(ml_dtypes.finfo(DTYPES[dtype]).smallest_normal)
    return [v for v in edge_values(dtype) if dtype == "float16" or abs(v) != tiny] + \
        [1.0, -1.0, 3.5]


@st.composite
def programs(draw):
    dtype = draw(st.sampled_from(sorted(DTYPES)))
    dt = DTYPES[dtype]
    small = st.floats(-4.0, 4.0, allow_nan=False, width=32)
    if dtype == "bfloat16":   # nothing that leads to a float32 subnormal, read as zero on XLA
        small = small.filter(lambda v: v == 0 or abs(v) > 1e-3)
    value = st.one_of(st.sampled_from(_edges(dtype)), small)
    arrays = [np.array(draw(st.lists(value, min_size=T * 4, max_size=T * 4)),
                       np.float32).astype(dt).reshape(T, 4) for _ in range(2)]
    steps = draw(st.lists(st.one_of(
        st.tuples(st.sampled_from(["add", "sub", "mul", "maximum"]), st.just(1)),
        st.tuples(st.sampled_from(["scale", "divide"]), st.sampled_from(CONSTANTS)),
        st.tuples(st.sampled_from(["neg", "abs", "tanh", "softmax"]), st.none()),
        st.tuples(st.sampled_from(["sum", "mean"]), st.sampled_from(["axis", "causal",
                                                                     "window"])),
        st.tuples(st.just("max"), st.sampled_from(["causal", "window"]))),
        min_size=1, max_size=5))
    return dtype, arrays, steps


def build(arrays, steps):
    ctx = tl.Context(dims=("t",))
    (t,), (Tb,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(arrays[0], domain=(t,))
        other = tl.from_array(arrays[1], domain=(t,))
        for kind, arg in steps:
            if kind in ("add", "sub", "mul"):
                x = {"add": x + other, "sub": x - other, "mul": x * other}[kind]
            elif kind == "maximum":
                x = tl.maximum(x, other)
            elif kind == "scale":
                x = x * arg
            elif kind == "divide":
                x = x / arg
            elif kind == "neg":
                x = -x
            elif kind == "abs":
                x = tl.abs(x)
            elif kind == "tanh":
                x = tl.tanh(x)
            elif kind == "softmax":
                x = tl.softmax(x, axis=-1)
            else:
                x = _reduce(x, kind, arg, t)
    return ctx, Tb, x


def _reduce(x, kind, where, t):
    if where == "axis":
        return getattr(x, kind)(axis=-1, keepdims=True) * tl.ones((4,), x.dtype.name)
    start = 0 if where == "causal" else tl.max(0, t - 1)
    return getattr(x[start:t + 1], kind)(axis=0)


def agree(got: np.ndarray, want: np.ndarray, dt: np.dtype) -> None:
    g, w = got.astype(np.float32), want.astype(np.float32)
    assert got.dtype == want.dtype == dt
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg="NaNs differ")
    np.testing.assert_array_equal(np.isposinf(g), np.isposinf(w), err_msg="+inf differ")
    np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg="-inf differ")
    fin = np.isfinite(w)
    eps = float(ml_dtypes.finfo(dt).eps)
    tiny = float(ml_dtypes.finfo(dt).smallest_normal)
    np.testing.assert_allclose(g[fin], w[fin], rtol=4 * eps, atol=4 * tiny)


@pytest.mark.parametrize("executor", COMPILED)  # not the fixture: hypothesis runs the examples
@settings(max_examples=examples(450), deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(program=programs())
def test_16bit_programs_agree_with_the_reference(executor, program):
    dtype, arrays, steps = program
    got, want = _run(build(arrays, steps), executor)
    agree(got, want, DTYPES[dtype])


def _run(built, executor: str):
    """``y`` of a built program on ``executor`` and on the reference interpreter."""
    ctx, Tb, y = built
    with np.errstate(all="ignore"):
        want = ctx.compile(bounds={Tb: T}, outputs={"y": y},
                           config=tl.CompileConfig(executor="reference")).run()["y"]
    got = ctx.compile(bounds={Tb: T}, outputs={"y": y},
                      config=tl.CompileConfig(executor=executor)).run()["y"]
    return got, want


@pytest.mark.parametrize("executor", COMPILED)
@pytest.mark.parametrize("row, want", [([1, 1, -1, -1], np.inf), ([1, -1, 1, -1], 0.0),
                                       ([-1, -1, 1, 1], -np.inf)])
def test_a_sum_that_overflows_float32_adds_its_terms_in_order(executor, row, want):
    """bfloat16's largest value is float32's, so a float32 sum of a few of them overflows or
    not by the order of its terms: NumPy adds them one after another, and so do the executors
    (XLA's own reduction added them in pairs: 0 where NumPy gives inf). A program drawn
    above found it."""
    big = float(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    a = (np.float32(row) * big).astype(ml_dtypes.bfloat16)
    arrays = [np.tile(a, (T, 1)), np.ones((T, 4), ml_dtypes.bfloat16)]
    for steps in ([("sum", "axis")], [("max", "causal"), ("mean", "axis")]):
        got, ref = _run(build(arrays, steps), executor)
        agree(got, ref, DTYPES["bfloat16"])
        assert np.all(np.asarray(ref, np.float32) == (want / 4 if "mean" in steps[-1] else want))
