"""The bad-input corpus (docs/semantics.md, "Errors"; docs/testing.md, "Bad input").

Every malformed program must raise the right ``tl.TempoLabError`` subclass whose message starts
with ``file:line`` of the offending line *in this file* -- never a crash, a hang, a wrong answer
or a bare Python exception. ``here()`` returns the number of the line below the call, so each
test marks the offending line right where it is written.
"""
from __future__ import annotations

import inspect
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rt_helpers import ALL, compile_

import tempo_lab as tl


def here(offset: int = 1) -> int:
    """The line number ``offset`` lines below the caller's line."""
    return inspect.currentframe().f_back.f_lineno + offset


def check(err: BaseException, cls: type, line: int | tuple[int, ...]):
    assert type(err) is cls, f"expected {cls.__name__}, got {type(err).__name__}: {err}"
    assert isinstance(err, tl.TempoLabError)
    lines = (line,) if isinstance(line, int) else line
    text = str(err)
    assert any(text.startswith(f"{__file__}:{n}: ") for n in lines), (
        f"message should start with {__file__}:{lines}, got:\n{text}")


def raises(cls, fn, line):
    with pytest.raises(tl.TempoLabError) as info:
        fn()
    check(info.value, cls, line)
    return info.value


def ctx1():
    ctx = tl.Context(dims=("t",))
    return ctx, ctx.dims[0], ctx.bounds[0]


def ctx2():
    ctx = tl.Context(dims=("b", "t"))
    return (ctx, *ctx.dims, *ctx.bounds)


# Errors found while running are checked on every executor (the compiled ones may find them
# earlier, at compile time): a test that takes ``executor`` runs on each (conftest.py).
def compile_and_run(ctx, bounds, executor, **outputs):
    config = tl.CompileConfig(executor=executor)
    return ctx.compile(bounds=bounds, outputs=outputs, config=config).run()


def test_here_helper_and_error_location():
    line = here()
    err = tl.ShapeError("boom")
    check(err, tl.ShapeError, line)


# ------------------------------------------------------------------------------------------------
# DefinitionError: branches
# ------------------------------------------------------------------------------------------------
def test_overlapping_condition_branches():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[t < 3] = tl.constant(0.0)
        line = here()
        x[t < 5] = tl.constant(1.0)
        x[t] = x[t - 1] + 1.0
    err = raises(tl.DefinitionError, lambda: compile_(ctx, {T: 8}, {"x": x}, "auto"), line)
    assert "overlap" in str(err)


def test_overlapping_point_key_and_condition():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(0.0)
        line = here()
        x[t < 2] = tl.constant(1.0)
        x[t] = x[t - 1] + 1.0
    raises(tl.DefinitionError, lambda: compile_(ctx, {T: 4}, {"x": x}, "auto"), line)


def test_overlapping_branches_2d():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[0, t] = tl.constant(0.0)
        line = here()
        x[b, 0] = tl.constant(1.0)
        x[b, t] = x[b - 1, t - 1] + 1.0
    err = raises(tl.DefinitionError, lambda: compile_(ctx, {B: 2, T: 3}, {"x": x}, "auto"), line)
    assert "b = 0" in str(err) and "t = 0" in str(err)  # names the shared point


def test_overlapping_shift_key_and_condition():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[t < 2] = tl.constant(0.0)
        line = here()
        x[t + 1] = x[t] * 2.0
    raises(tl.DefinitionError, lambda: compile_(ctx, {T: 5}, {"x": x}, "auto"), line)


def test_missing_coverage_hole():
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(0.0)
        x[t >= 2] = x[t - 1] + 1.0
    err = raises(tl.DefinitionError, lambda: compile_(ctx, {T: 5}, {"x": x}, "auto"), line)
    assert "t = 1" in str(err)


def test_missing_coverage_at_the_end():
    ctx, b, t, B, T = ctx2()
    with ctx:
        line = here()
        x = tl.placeholder((2,), "float32", domain=(b, t))
        x[t < 3] = tl.zeros((2,))
        x[(t >= 3) & (t < T - 1)] = tl.ones((2,))
    err = raises(tl.DefinitionError, lambda: compile_(ctx, {B: 2, T: 6}, {"x": x}, "auto"), line)
    assert "t = 5" in str(err)


def test_missing_coverage_only_some_bounds():
    """With T = 3 the branches cover everything; with T = 6 they do not."""
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        x = tl.placeholder((), "float32", domain=(t,))
        x[t < 3] = tl.constant(1.0)
    compile_(ctx, {T: 3}, {"x": x}, "auto").run()
    raises(tl.DefinitionError, lambda: compile_(ctx, {T: 6}, {"x": x}, "auto"), line)


def test_two_default_branches():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[t] = tl.constant(0.0)
        line = here()
        raises(tl.DefinitionError, lambda: x.__setitem__(t, tl.constant(1.0)), line)


def test_two_default_branches_written_as_statements():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, t] = tl.constant(0.0)
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[b, t] = tl.constant(1.0)
    check(info.value, tl.DefinitionError, line)
    assert "default" in str(info.value)


def test_assignment_to_non_placeholder():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros(()) + t
        y = x * 2.0
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            y[t] = tl.constant(1.0)
    check(info.value, tl.DefinitionError, line)
    assert "placeholder" in str(info.value)


def test_assignment_to_a_view_of_a_placeholder():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        v = x[t - 1]
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            v[t] = tl.constant(1.0)
    check(info.value, tl.DefinitionError, line)


def test_assignment_to_from_array():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.zeros(3, np.float32), domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[0] = 1.0
    check(info.value, tl.DefinitionError, line)


def test_never_defined_placeholder_used_by_output():
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        x = tl.placeholder((), "float32", domain=(t,))
        y = x * 2.0
    err = raises(tl.DefinitionError, lambda: compile_(ctx, {T: 3}, {"y": y}, "auto"), line)
    assert "never defined" in str(err)


def test_never_defined_placeholder_reached_through_a_branch():
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        h = tl.placeholder((), "float32", domain=(t,))
        x = tl.placeholder((), "float32", domain=(t,))
        x[t] = h * 2.0
    raises(tl.DefinitionError, lambda: compile_(ctx, {T: 3}, {"x": x}, "auto"), line)


def test_branch_value_varies_over_a_dim_outside_the_domain():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[t] = tl.zeros(()) + b
    check(info.value, tl.DefinitionError, line)


def test_slice_key_is_rejected():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[0:3] = tl.constant(0.0)
    check(info.value, tl.DefinitionError, line)
    assert "t < 3" in str(info.value)  # suggests the condition to use


def test_unsupported_key_expression():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[2 * t] = tl.constant(0.0)
    check(info.value, tl.DefinitionError, line)


def test_key_with_too_many_entries():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((2,), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[t, 0] = tl.constant(0.0)
    check(info.value, tl.DefinitionError, line)


def test_domain_in_wrong_order():
    ctx, b, t, B, T = ctx2()
    with ctx:
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            tl.placeholder((), "float32", domain=(t, b))
    check(info.value, tl.DefinitionError, line)


# ------------------------------------------------------------------------------------------------
# BoundsError: reads outside a domain
# ------------------------------------------------------------------------------------------------
def test_read_previous_point_without_base_case():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        line = here()
        x[t] = x[t - 1] + 1.0
    err = raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"x": x}, "auto"), line)
    assert "t = 0" in str(err) and "t = -1" in str(err)


def test_read_next_point_at_the_last_point():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        y = x[t + 1] * 2.0
    err = raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)
    assert "t = 3" in str(err) and "t = 4" in str(err)


def test_slices_are_not_clipped():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        y = x[0:t + 2].sum()
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)


def test_slice_with_negative_start():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        y = x[t - 1:t + 1].sum()
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)


def test_constant_point_outside_domain():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        y = x[T] + 0.0
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)


def test_constant_point_outside_domain_as_view_output():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        y = x[5]
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)


def test_bad_read_in_2d_outer_dim():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, 0] = tl.constant(0.0)
        line = here()
        x[b, t] = x[b - 1, t - 1] + 1.0
    err = raises(tl.BoundsError, lambda: compile_(ctx, {B: 2, T: 3}, {"x": x}, "auto"), line)
    assert "b = 0" in str(err)


def test_read_fine_only_under_its_branch_does_not_raise(executor):
    ctx, t, T = ctx1()
    r_np = np.arange(5, dtype=np.float32)
    with ctx:
        r = tl.from_array(r_np, domain=(t,))
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(0.0)
        x[t] = x[t - 1] + 1.0                 # x[t - 1] is fine for t >= 1 only
        nxt = tl.placeholder((), "float32", domain=(t,))
        nxt[t < T - 1] = r[t + 1] * 2.0       # r[t + 1] is fine for t < T - 1 only
        nxt[T - 1] = tl.constant(-1.0)
        two = tl.placeholder((), "float32", domain=(t,))
        two[t >= 2] = r[t - 2] + r[0:t - 1].sum()   # also through a slice
        two[t] = tl.constant(0.0)
    res = compile_and_run(ctx, {T: 5}, executor, x=x, nxt=nxt, two=two)
    np.testing.assert_allclose(res["x"], np.arange(5))
    np.testing.assert_allclose(res["nxt"], [2, 4, 6, 8, -1])
    np.testing.assert_allclose(res["two"], [0, 0] + [r_np[i - 2] + r_np[:i - 1].sum()
                                                     for i in range(2, 5)])


def test_read_bad_even_under_its_branch():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        line = here()
        x[t < 3] = x[t - 1] * 2.0             # t = 0 is under this branch
        x[t] = tl.constant(1.0)
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 5}, {"x": x}, "auto"), line)


def test_bad_read_only_reached_by_a_sink():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        tl.sink(x[t + 1], lambda p, v: None)
        y = x * 1.0
    raises(tl.BoundsError, lambda: compile_(ctx, {T: 4}, {"y": y}, "auto"), line)


# ------------------------------------------------------------------------------------------------
# BoundsError: bounds passed to compile
# ------------------------------------------------------------------------------------------------
def _simple():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, 0] = tl.constant(0.0)
        x[b, t] = x[b, t - 1] + 1.0
    return ctx, (B, T), x


def test_missing_bound():
    ctx, (B, T), x = _simple()
    line = here()
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds={T: 3}, outputs={"x": x}), line)
    assert "B" in err.reason


def test_non_int_bounds():
    ctx, (B, T), x = _simple()
    for bad in (2.5, "3", True, 0, -1, None, np.float32(3)):
        line = here()
        raises(tl.BoundsError, lambda bad=bad: ctx.compile(bounds={B: 2, T: bad}, outputs=[x]), line)


def test_numpy_int_bound_is_fine_and_dim_keys_work():
    ctx, (B, T), x = _simple()
    b, t = ctx.dims
    res = ctx.compile(bounds={b: np.int64(2), "T": 3}, outputs={"x": x}).run()
    np.testing.assert_allclose(res["x"], [[0, 1, 2]] * 2)


def test_unknown_bound_key():
    ctx, (B, T), x = _simple()
    other = tl.Context(dims=("q",))
    for key in ("Q", other.bounds[0], other.dims[0], 3):
        line = here(2)
        raises(tl.BoundsError,
               lambda key=key: ctx.compile(bounds={B: 2, T: 3, key: 4}, outputs=[x]), line)


def test_from_array_leading_axes_do_not_match_bounds():
    ctx, b, t, B, T = ctx2()
    with ctx:
        line = here()
        x = tl.from_array(np.zeros((2, 5, 3), np.float32), domain=(b, t))
        y = x * 2.0
    err = raises(tl.ShapeError, lambda: compile_(ctx, {B: 2, T: 4}, {"y": y}, "auto"), line)
    assert "(2, 5)" in str(err)


def test_from_array_with_too_few_axes():
    ctx, b, t, B, T = ctx2()
    with ctx:
        line = here()
        raises(tl.ShapeError, lambda: tl.from_array(np.zeros((3,)), domain=(b, t)), line)


# ------------------------------------------------------------------------------------------------
# ShapeError
# ------------------------------------------------------------------------------------------------
def test_shape_mismatch_in_add_at_trace_time():
    ctx, t, T = ctx1()
    with ctx:
        a = tl.zeros((3,))
        c = tl.zeros((4,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            a + c
    check(info.value, tl.ShapeError, line)


def test_shape_mismatch_with_recurrent_operands():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(np.zeros((2, 3, 4), np.float32), domain=(b, t))
        y = tl.from_array(np.zeros((3, 2), np.float32), domain=(t,))
        line = here()
        raises(tl.ShapeError, lambda: x[b, t - 1] * y, line)


def test_matmul_contraction_mismatch():
    ctx, t, T = ctx1()
    with ctx:
        a = tl.zeros((2, 3))
        w = tl.zeros((4, 5))
        line = here()
        err = raises(tl.ShapeError, lambda: a @ w, line)
        line = here()
        raises(tl.ShapeError, lambda: tl.matmul(tl.zeros((3,)), tl.zeros((4,))), line)
        line = here()
        raises(tl.ShapeError, lambda: tl.zeros(()) @ tl.zeros((3,)), line)
    assert "3" in str(err) and "4" in str(err)


def test_reshape_size_mismatch():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros((2, 3))
        line = here()
        raises(tl.ShapeError, lambda: x.reshape((4, 2)), line)
        line = here()
        raises(tl.ShapeError, lambda: x.reshape(-1, 4), line)
        line = here()
        raises(tl.ShapeError, lambda: x.reshape(-1, -1), line)


def test_other_layout_errors():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros((2, 3))
        cases = [
            (here(), lambda: x.squeeze(0)),
            (here(), lambda: x.transpose((0, 0))),
            (here(), lambda: x.sum(axis=2)),
            (here(), lambda: x.mean(axis=(0, 0))),
            (here(), lambda: x.expand_dims(5)),
            (here(), lambda: tl.concatenate([x, tl.zeros((3, 3))], axis=1)),
            (here(), lambda: tl.concatenate([x, tl.zeros((3,))])),
            (here(), lambda: tl.stack([x, tl.zeros((3, 2))])),
            (here(), lambda: tl.softmax(x, axis=3)),
            (here(), lambda: x[0, 0, 0]),
            (here(), lambda: x[..., 5]),
            (here(), lambda: x[..., ...]),
            (here(), lambda: tl.placeholder((-1,), "float32", domain=(t,))),
        ]
        for line, fn in cases:
            raises(tl.ShapeError, fn, line - 1)


def test_branch_value_with_wrong_shape():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[t] = tl.zeros((4,))
    check(info.value, tl.ShapeError, line)
    with ctx:
        y = tl.placeholder((3,), "float32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            y[0] = tl.zeros((2, 3))  # does not broadcast *to* (3,)
    check(info.value, tl.ShapeError, line)


def test_output_with_non_static_spatial_shape():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.zeros((5, 2), np.float32), domain=(t,))
        line = here()
        prefix = x[0:t + 1]
    err = raises(tl.ShapeError, lambda: compile_(ctx, {T: 5}, {"prefix": prefix}, "auto"), line)
    msg = err.reason
    assert "static" in msg and ("reduce" in msg or "0:T" in msg)  # says how to fix it


def test_output_with_non_static_shape_through_an_op():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.zeros((5, 2), np.float32), domain=(t,))
        line = here()
        y = tl.exp(x[tl.max(0, t - 2):t + 1])
    raises(tl.ShapeError, lambda: compile_(ctx, {T: 5}, {"y": y}, "auto"), line)


def test_reshape_of_a_symbolic_shape():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.zeros((5, 2), np.float32), domain=(t,))
        line = here()
        raises(tl.ShapeError, lambda: x[0:t + 1].reshape(-1), line)


def test_ragged_range_read():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.zeros((5, 2), np.float32), domain=(t,))
        prefix = x[0:t + 1] * 1.0           # shape (t + 1, 2)
        line = here()
        raises(tl.ShapeError, lambda: prefix[0:T], line)


def test_source_returning_wrong_shape_at_run_time(executor):
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        s = tl.source(lambda p: np.zeros((3,), np.float32), (2,), "float32", domain=(t,))
    raises(tl.ShapeError, lambda: compile_and_run(ctx, {T: 2}, executor, s=s), line)


def test_source_returning_wrong_dtype_at_run_time(executor):
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        s = tl.source(lambda p: np.zeros((2,), np.float32) + 0.5, (2,), "int32", domain=(t,))
    raises(tl.DTypeError, lambda: compile_and_run(ctx, {T: 2}, executor, s=s), line)


@st.composite
def _edge_values(draw):
    """A dtype and 1-3 values for it: just inside and just outside its range (ints around
    the least and greatest, floats around the greatest finite one, either sign), anywhere in
    it, and inf and NaN given as such (a float dtype keeps them)."""
    dt = np.dtype(draw(st.sampled_from(("int8", "int16", "int32", "uint8", "uint16", "uint32",
                                        "float16", "bfloat16", "float32"))))
    if dt.kind in "iu":
        lo, hi = int(np.iinfo(dt).min), int(np.iinfo(dt).max)
        value = st.one_of(st.integers(lo - 2, lo + 2), st.integers(hi - 2, hi + 2),
                          st.integers(lo, hi))
    else:
        top = float(ml_dtypes.finfo(dt).max)
        value = st.one_of(
            st.builds(lambda f, sign: sign * top * f, st.floats(0.995, 1.005),
                      st.sampled_from((1.0, -1.0))),
            st.floats(-1e300, 1e300), st.sampled_from((np.inf, -np.inf, np.nan)))
    return dt, draw(st.lists(value, min_size=1, max_size=3))


def _first_misfit(values: list, dt: np.dtype):
    """The first of ``values`` that ``dt`` cannot hold, as NumPy converts: an int outside its
    range, a finite float that becomes inf; None if all fit."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return next((v for v in values if not info.min <= v <= info.max), None)
    with np.errstate(over="ignore"):
        held = np.array(values, np.float64).astype(dt)
    return next((v for v, h in zip(values, held) if np.isfinite(v) and not np.isfinite(h)),
                None)


@pytest.mark.parametrize("executor", ALL)  # not the fixture: hypothesis runs the examples
@settings(max_examples=10, deadline=None, derandomize=True, database=None)
@given(_edge_values())
def test_source_values_that_do_not_fit_the_dtype(executor, drawn):
    """A ``tl.source`` value outside its dtype's range (``2**40 + t`` for int32, ``1e300``
    for float32: they wrapped and became inf, silently) is a DTypeError at the tl.source line
    naming the source, the point, the first such value and the dtype, on every executor; a
    value inside it, inf and NaN included, comes back as given."""
    dt, values = drawn
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        s = tl.source(lambda p: np.array(values), (len(values),), dt, domain=(t,))
    bad = _first_misfit(values, dt)
    if bad is None:
        got = compile_and_run(ctx, {T: 2}, executor, s=s)["s"]
        with np.errstate(over="ignore"):
            want = np.array(values).astype(dt)
        np.testing.assert_array_equal(np.asarray(got, np.float64),
                                      np.broadcast_to(want.astype(np.float64), (2, len(values))))
        return
    err = raises(tl.DTypeError, lambda: compile_and_run(ctx, {T: 2}, executor, s=s), line)
    assert f"tl.source s at {{'t': 0}}: {bad!r} does not fit in {dt.name}" in str(err), err


# ------------------------------------------------------------------------------------------------
# DTypeError
# ------------------------------------------------------------------------------------------------
def test_assign_float_to_int_placeholder():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "int32", domain=(t,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            x[t] = tl.zeros(()) + t
    check(info.value, tl.DTypeError, line)
    assert "astype" in str(info.value)
    with ctx:
        line = here()
        raises(tl.DTypeError, lambda: x.__setitem__(t, 1.5), line)  # a weak float too


def test_assign_int_to_float_placeholder_is_an_error_unless_weak():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = 1  # weak Python int: fine
        line = here()
        raises(tl.DTypeError, lambda: x.__setitem__(t, tl.zeros((), "int32") + t), line)


def test_and_on_floats():
    ctx, t, T = ctx1()
    with ctx:
        a = tl.zeros((2,))
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            a & (a > 0)
    check(info.value, tl.DTypeError, line)
    with ctx:
        line = here()
        raises(tl.DTypeError, lambda: a | a, line)
        line = here()
        raises(tl.DTypeError, lambda: ~a, line)


def test_other_dtype_errors():
    ctx, t, T = ctx1()
    with ctx:
        f = tl.zeros((2,))
        bo = f > 0
        cases = [
            (here(), lambda: tl.where(f, f, f)),
            (here(), lambda: tl.abs(f) & bo),
            (here(), lambda: -bo),
            (here(), lambda: bo - bo),
            (here(), lambda: tl.zeros((2,), "floaty")),
            (here(), lambda: f.astype("not-a-dtype")),
            (here(), lambda: tl.constant({"a": 1})),
        ]
        for line, fn in cases:
            raises(tl.DTypeError, fn, line - 1)


# ------------------------------------------------------------------------------------------------
# ExprError
# ------------------------------------------------------------------------------------------------
def test_python_if_on_a_condition():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros(()) + t
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            if t < 3:
                x = x + 1.0
    check(info.value, tl.ExprError, line)


def test_python_if_on_a_tensor():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros(()) + t
        with pytest.raises(tl.TempoLabError) as info:
            line = here()
            if x > 0:
                pass
    check(info.value, tl.ExprError, line)


def test_chained_comparison_and_python_and():
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        raises(tl.ExprError, lambda: 1 < t < 3, line)
        line = here()
        raises(tl.ExprError, lambda: (t > 1) and (t < 3), line)


def test_bad_index_expressions():
    ctx, b, t, B, T = ctx2()
    other = tl.Context(dims=("q",))
    with ctx:
        x = tl.from_array(np.zeros((2, 3), np.float32), domain=(b, t))
        cases = [
            (here(), lambda: x[b, t * t]),      # a product is a value, not an index
            (here(), lambda: x[t * b, 0]),
            (here(), lambda: t % T),
            (here(), lambda: t // 0),
            (here(), lambda: x[b, t < 2]),
            (here(), lambda: x[b, other.dims[0]]),
            (here(), lambda: x[b, x]),
            (here(), lambda: x[b, 0:t:2]),
            (here(), lambda: tl.min(t)),
            (here(), lambda: tl.max(x, t)),
            (here(), lambda: x[b, 1.5]),
        ]
        for line, fn in cases:
            raises(tl.ExprError, fn, line - 1)


def test_bad_context_dims():
    for names in (("T",), ("a", "a"), ("1x",)):
        line = here()
        raises(tl.ExprError, lambda names=names: tl.Context(dims=names), line)


# ------------------------------------------------------------------------------------------------
# ScheduleError: cyclic definitions (never a hang, never a RecursionError)
# ------------------------------------------------------------------------------------------------
def _assert_cycle(ctx, bounds, lines, executor, **outs):
    with pytest.raises(tl.TempoLabError) as info:
        compile_and_run(ctx, bounds, executor, **outs)
    err = info.value
    assert not isinstance(err, RecursionError)
    check(err, tl.ScheduleError, lines)
    return err


def test_cyclic_definition_two_placeholders(executor):
    ctx, t, T = ctx1()
    with ctx:
        first = here()
        x = tl.placeholder((), "float32", domain=(t,))
        y = tl.placeholder((), "float32", domain=(t,))
        x[t] = y[t] + 1.0
        y[t] = x[t] * 2.0
    err = _assert_cycle(ctx, {T: 4}, tuple(range(first, first + 4)), executor, x=x)
    msg = str(err)
    assert "->" in msg  # names the cycle: the two placeholders and the ops between them
    assert f"{__file__}:{first + 2}" in msg and f"{__file__}:{first + 3}" in msg
    assert "const" not in msg  # only ops on the cycle, not the other inputs being evaluated


def test_self_cycle_at_the_same_point(executor):
    ctx, t, T = ctx1()
    with ctx:
        first = here()
        x = tl.placeholder((), "float32", domain=(t,))
        x[t] = x[t] + 1.0
    _assert_cycle(ctx, {T: 3}, (first, first + 1), executor, x=x)


def test_cycle_through_an_inclusive_prefix(executor):
    ctx, t, T = ctx1()
    with ctx:
        first = here()
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[0:t + 1].sum()
    _assert_cycle(ctx, {T: 3}, (first, first + 1, first + 2), executor, x=x)


def test_long_cycle_no_recursion_error(executor):
    ctx, t, T = ctx1()
    with ctx:
        first = here()
        x = tl.placeholder((), "float32", domain=(t,))
        x[T - 1] = x[0] + 1.0
        x[t] = x[t + 1] * 0.5
    limit = sys.getrecursionlimit()
    err = _assert_cycle(ctx, {T: 5 * limit}, (first, first + 1, first + 2), executor,
                        x=x)
    assert len(str(err)) < 5000  # a long cycle is summarised, not printed in full


# ------------------------------------------------------------------------------------------------
# misuse of the API
# ------------------------------------------------------------------------------------------------
def test_no_active_context():
    line = here()
    err = raises(tl.TempoLabError, lambda: tl.zeros((2,)), line)
    assert "with ctx" in str(err)


def test_tensors_from_two_contexts():
    c1, t1, T1 = ctx1()
    c2, t2, T2 = ctx1()
    with c1:
        a = tl.zeros(()) + t1
    with c2:
        c = tl.zeros(()) + t2
        line = here()
        raises(tl.TempoLabError, lambda: a + c, line)


def test_compile_without_outputs_or_with_a_non_tensor():
    ctx, (B, T), x = _simple()
    line = here()
    raises(tl.TempoLabError, lambda: ctx.compile(bounds={B: 1, T: 1}, outputs={}), line)
    line = here()
    raises(tl.ArgumentError, lambda: ctx.compile(bounds={B: 1, T: 1}, outputs={"y": 3}), line)


def test_output_from_another_context():
    ctx, (B, T), x = _simple()
    other, (B2, T2), y = _simple()
    line = here()
    raises(tl.TempoLabError, lambda: ctx.compile(bounds={B: 1, T: 1}, outputs={"y": y}), line)


def test_sink_needs_a_tensor_and_a_callable():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros(()) + t
        line = here()
        raises(tl.DefinitionError, lambda: tl.sink(3.0, print), line)
        line = here()
        raises(tl.DefinitionError, lambda: tl.sink(x, 3), line)


def test_every_error_class_is_exported_and_a_tempo_lab_error():
    for cls in (tl.ShapeError, tl.DTypeError, tl.DefinitionError, tl.BoundsError,
                tl.ScheduleError, tl.ExprError):
        assert issubclass(cls, tl.TempoLabError)


def test_max_over_an_empty_range(executor):
    """jnp.max of an empty array raises (max has no identity): so does a max over x[0:t] at
    t = 0, rather than returning an arbitrary value."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        m = x[0:t].max(axis=0)
    err = raises(tl.ShapeError, lambda: compile_and_run(ctx, {T: 4}, executor, m=m), line)
    assert "empty" in str(err)


# ================================================================================================
# Compile switches
# ================================================================================================
@pytest.mark.parametrize("kw", [{"tile_block": 0}, {"tile_block": -4}, {"tile_block": 2.5},
                                {"tile_block": True}, {"executor": "fast"}, {"block_size": 0},
                                {"xla_split": 0}, {"vectorise_budget_bytes": -1},
                                {"tile": "no"}, {"sync_profile": 1}])
def test_bad_compile_config_names_the_users_line(kw):
    err = raises(tl.ArgumentError, lambda: tl.CompileConfig(**kw), here(0))
    assert ("tile_block" in str(err)) == ("tile_block" in kw)


# ================================================================================================
# Every public entry point: arguments of the wrong kind or out of range
# ================================================================================================
def _one():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        y = x * 2.0
    return ctx, t, T, y


@pytest.mark.parametrize("bounds, words", [
    ([4], "give a dict"), ({"T": 0}, "positive int"), ({"T": -3}, "positive int"),
    ({"T": 2**63}, "exceeds"), ({"T": 4.0}, "positive int"),
    ({"T": 2.5}, "positive int"), ({"T": "4"}, "positive int"), ({"T": True}, "positive int"),
    ({"T": 2**40}, "exceeds"), ({"U": 4}, "not a bound"), ({}, "no value")])
def test_bad_bounds(bounds, words):
    ctx, t, T, y = _one()
    line = here()
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds=bounds, outputs={"y": y}), line)
    assert words in str(err)


def test_a_bound_given_twice():
    ctx, t, T, y = _one()
    line = here()
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds={T: 4, "T": 4}, outputs={"y": y}),
                 line)
    assert "twice" in str(err)


@pytest.mark.parametrize("outputs, words", [({3: "y"}, "not a string"), ("y", "not a recurrent"),
                                            ("twice", "same name")])
def test_bad_outputs(outputs, words):
    ctx, t, T, y = _one()
    outputs = {3: y} if outputs == {3: "y"} else [y, y] if outputs == "twice" else outputs
    line = here()
    err = raises(tl.ArgumentError, lambda: ctx.compile(bounds={T: 4}, outputs=outputs), line)
    assert words in str(err)


def test_run_arguments():
    ctx, t, T, y = _one()
    prog = ctx.compile(bounds={T: 4}, outputs={"y": y})
    line = here()
    raises(tl.ArgumentError, lambda: prog.run(record="yes"), line)
    line = here()
    err = raises(tl.ArgumentError, lambda: prog.run(bounds={T: 9}), line)
    assert "unexpected keyword" in str(err)
    run = prog.run()
    line = here()
    err = raises(tl.OutputError, lambda: run["nope"], line)
    assert "'y'" in str(err)  # names the outputs there are


@pytest.mark.parametrize("kw, words", [({"fuse": 3}, "True or False"),
                                       ({"passes": ("nope",)}, "unknown pass"),
                                       ({"passes": ("fold", "fold")}, "named twice")])
def test_bad_config_switches(kw, words):
    err = raises(tl.ArgumentError, lambda: tl.CompileConfig(**kw), here(0))
    assert words in str(err)


def test_config_of_the_wrong_type():
    ctx, t, T, y = _one()
    line = here()
    raises(tl.ArgumentError, lambda: ctx.compile(bounds={T: 4}, outputs={"y": y},
                                                 config={"fuse": False}), line)


def test_an_op_outside_the_with_block():
    ctx, t, T, y = _one()
    line = here()
    err = raises(tl.DefinitionError, lambda: y + 1.0, line)
    assert "with ctx" in str(err)


def test_a_branch_added_after_the_with_block():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.zeros(())

    def late():
        x[t] = x[t - 1] + 1.0

    err = raises(tl.DefinitionError, late, here(-2))
    assert "with ctx" in str(err)


def test_a_cast_to_a_type_that_is_not_numeric():
    ctx, t, T, y = _one()
    with ctx:
        line = here()
        raises(tl.DTypeError, lambda: y.astype(object), line)
        line = here()
        raises(tl.DTypeError, lambda: y.astype("str"), line)


_UNSUPPORTED_DTYPE_USES = {
    "placeholder": lambda dt, t: tl.placeholder((2,), dt, domain=(t,)),
    "zeros": lambda dt, t: tl.zeros((2,), dt),
    "full": lambda dt, t: tl.full((2,), 1.0, dt),
    "constant": lambda dt, t: tl.constant([1.0, 2.0], dt),
    "astype": lambda dt, t: tl.zeros((2,)).astype(dt),
    "source": lambda dt, t: tl.source(lambda p: 0.0, (), dt, domain=(t,)),
    "from_array": lambda dt, t: tl.from_array(np.zeros((3,), dt), domain=(t,)),
    "random": lambda dt, t: tl.random.uniform((2,), domain=(t,), dtype=dt),
    "from_pretrained": lambda dt, t: tl.nn.Llama.from_pretrained(
        Path(__file__).parent / "fixtures" / "hf" / "llama3_tied", dtype=dt),
}


@pytest.mark.parametrize("use", _UNSUPPORTED_DTYPE_USES)
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4"])
def test_a_dtype_the_package_does_not_support(use, dtype):
    """An 8-bit float (or a 4-bit int) was accepted and then failed while being traced, with
    a JAX TypePromotionError and no location: it is refused where the user names it, by the
    one function every user dtype goes through, with the dtypes there are."""
    dt, make = np.dtype(getattr(ml_dtypes, dtype)), _UNSUPPORTED_DTYPE_USES[use]
    ctx, t, T = ctx1()
    with ctx:
        err = raises(tl.DTypeError, lambda: make(dt, t), make.__code__.co_firstlineno)
    assert f"dtype {dtype} is not supported; use one of bool, " in str(err)
    assert "bfloat16, float32" in str(err)


_NAMED = {
    "placeholder": lambda name, t: tl.placeholder((), domain=(t,), name=name),
    "source": lambda name, t: tl.source(lambda p: 0.0, (), "float32", (t,), name=name),
    "from_array": lambda name, t: tl.from_array(np.zeros(3, np.float32), (t,), name=name),
}


@pytest.mark.parametrize("make", _NAMED)
@pytest.mark.parametrize("name", [3, b"x", ["x"], ("x",), 1.5, "lone\ud800"])
def test_a_name_that_is_not_a_string(make, name):
    """``name=3`` (bytes, a list) was kept and broke the views that show names later, a list
    name being changed in place: an ArgumentError at the user's line, the name untouched."""
    given = [*name] if isinstance(name, list) else name
    ctx, t, T = ctx1()
    with ctx:
        fn = _NAMED[make]
        err = raises(tl.ArgumentError, lambda: fn(name, t), fn.__code__.co_firstlineno)
    assert ("name must be a string" in str(err) or "not text" in str(err)) and name == given
    assert not ctx._nodes


def test_a_scope_or_output_name_that_is_not_text():
    ctx, t, T = ctx1()
    raises(tl.ArgumentError, lambda: tl.scope("lone\ud800"), here(0))
    with ctx:
        x = tl.zeros((2,)) + t
    bad = {"y\udc00": x}
    err = raises(tl.ArgumentError, lambda: ctx.compile(bounds={T: 3}, outputs=bad), here(0))
    assert "not text" in str(err)


@pytest.mark.parametrize("dims, cls", [("t", tl.ArgumentError), ("bt", tl.ArgumentError),
                                       ((), tl.ArgumentError), (("T",), tl.ExprError),
                                       (("and",), tl.ExprError), (("t", "t"), tl.ExprError),
                                       (("t-1",), tl.ExprError), (("tä",), tl.ExprError),
                                       ((3,), tl.ExprError)])
def test_bad_dim_names(dims, cls):
    raises(cls, lambda: tl.Context(dims=dims), here(0))


@pytest.mark.parametrize("array, words", [(np.array(["a", "b"]), "not numbers"),
                                          ([[1, 2], [3]], "rectangular"),
                                          (np.array([2**40, 1]), "does not fit in int32"),
                                          (np.array([1e300, 1.0]), "does not fit in float32")])
def test_arrays_that_are_not_32_bit_numbers(array, words):
    """A value JAX would wrap or turn into inf is an error, not a silently wrong input."""
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        err = raises(tl.DTypeError, lambda: tl.from_array(array, domain=(t,)), line)
    assert words in str(err)


@pytest.mark.parametrize("kw, words", [({"seed": "a"}, "seed must be an int"),
                                       ({"seed": 1.5}, "seed must be an int"),
                                       ({"seed": 1, "minval": 2.0, "maxval": 1.0}, "below"),
                                       ({"seed": 1, "maxval": float("inf")}, "finite")])
def test_bad_random_arguments(kw, words):
    ctx, t, T = ctx1()
    with ctx:
        line = here()
        err = raises(tl.ArgumentError, lambda: tl.random.uniform((2,), domain=(t,), **kw), line)
    assert words in str(err)


def test_a_range_that_ends_before_it_starts():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        z = x[t + 2:t].sum(axis=0)
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds={T: 4}, outputs={"z": z}), line)
    assert "x[t + 2:t]" in str(err) and "start <= stop" in str(err)


def test_a_scope_name_must_be_a_string():
    ctx, t, T = ctx1()
    with ctx:
        raises(tl.ArgumentError, lambda: tl.scope(3), here(0))


@pytest.mark.parametrize("kw", [{"lr": -1.0}, {"lr": "a"}, {"b1": 1.0}, {"eps": -1.0}])
def test_bad_optimiser_hyper_parameters(kw):
    err = raises(tl.ArgumentError, lambda: tl.optim.Adam(**kw), here(0))
    assert next(iter(kw)) in str(err)


def test_a_sink_that_raises(executor):
    """The user's exception is the cause of a CallbackError at the line of tl.sink, on every
    executor (XLA runs sinks as host callbacks inside the compiled program)."""
    ctx, t, T, y = _one()
    with ctx:
        line = here()
        tl.sink(y, lambda p, v: 1 / 0)
    err = raises(tl.CallbackError, lambda: compile_and_run(ctx, {T: 4}, executor), line)
    assert isinstance(err.__cause__, ZeroDivisionError) and "{'t': 0}" in str(err)


def test_a_source_that_raises(executor):
    def fail(point):
        raise ValueError("no data")

    ctx, t, T = ctx1()
    with ctx:
        line = here()
        s = tl.source(fail, (), "float32", domain=(t,))
    err = raises(tl.CallbackError, lambda: compile_and_run(ctx, {T: 4}, executor, s=s), line)
    assert "no data" in str(err) and isinstance(err.__cause__, ValueError)


def test_ctrl_c_in_a_callback_comes_through_as_itself_and_the_program_runs_again(executor):
    """A KeyboardInterrupt in a user's function reaches the user as KeyboardInterrupt on every
    executor (the XLA program raised an XLA runtime error from inside the callback)."""
    ctx, t, T, y = _one()
    seen, once = [], [True]

    def interrupt(point, value):
        seen.append(point["t"])
        if point["t"] == 2 and once:
            once.pop()
            raise KeyboardInterrupt

    with ctx:
        tl.sink(y, interrupt)
    prog = ctx.compile(bounds={T: 4}, outputs={"y": y},
                       config=tl.CompileConfig(executor=executor))
    with pytest.raises(KeyboardInterrupt):
        prog.run()
    seen.clear()
    np.testing.assert_array_equal(prog.run()["y"], np.arange(4) * 2.0)
    assert sorted(seen) == [0, 1, 2, 3]


def test_a_call_that_does_not_fit_a_public_signature_is_located():
    """A missing, unknown or doubled argument to any public function (``tl``, ``tl.nn``,
    ``tl.random``, ...) is an ArgumentError at the user's line that shows the signature."""
    ctx, t, T = ctx1()
    with ctx:
        err = raises(tl.ArgumentError, lambda: tl.from_array(np.zeros(3)), here(0))
        assert "'domain'" in str(err) and "from_array(array, domain" in str(err)
        err = raises(tl.ArgumentError, lambda: tl.zeros((2,), bogus=1), here(0))
        assert "'bogus'" in str(err) and "help(tl.zeros)" in str(err)
        raises(tl.ArgumentError, lambda: tl.random.permutation(t), here(0))
        raises(tl.ArgumentError, lambda: tl.tanh(), here(0))
    raises(tl.ArgumentError, lambda: tl.nn.load_llama(), here(0))


def test_a_misspelt_config_field_names_the_closest_ones():
    err = raises(tl.ArgumentError, lambda: tl.CompileConfig(tile_blok=8), here(0))
    assert "'tile_block'" in str(err) and "no field 'tile_blok'" in str(err)
    raises(tl.ArgumentError, lambda: tl.CompileConfig(*range(40)), here(0))


def test_lengths_of_a_run_are_indexed_by_the_bound_its_dim_or_its_name():
    ctx, b, t, B, T = ctx2()
    with ctx:
        y = tl.from_array(np.ones((3, 4), np.float32), domain=(b, t))[b, 0:T].sum()
    run = ctx.compile(bounds={B: 3, T: tl.lengths(np.array([2, 4, 3]), over=b)},
                      outputs={"y": y}).run()
    np.testing.assert_array_equal(run["y"], [2.0, 4.0, 3.0])
    for key in (T, t, "T"):
        assert key in run.lengths
        np.testing.assert_array_equal(run.lengths[key][1], [2, 4, 3])
    raises(tl.BoundsError, lambda: run.lengths[B], here(0))


def test_until_done_of_the_wrong_kind():
    ctx, t, T, y = _one()
    line = here()
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds={T: tl.until(y, max=4)},
                                                     outputs={"y": y}), line)
    assert "done (y," in str(err) and "bool scalar over (t,)" in str(err)
    with ctx:
        done = y[T - 1] > 1.0  # over no dim: it cannot end t
    line = here()
    raises(tl.BoundsError, lambda: ctx.compile(bounds={T: tl.until(done, max=4)},
                                               outputs={"y": y}), line)
    line = here()
    raises(tl.BoundsError, lambda: tl.until(done, max=0), line)


def test_until_done_that_reads_the_bound():
    """done[t] may not read T - 1: the bound is what done decides."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float32), domain=(t,))
        line = here()
        done = (x + x[T - 1]) > 2.0
    err = raises(tl.BoundsError, lambda: ctx.compile(bounds={T: tl.until(done, max=4)},
                                                     outputs={"x": x}), (line, line + 2))
    assert "done" in str(err)


def test_a_wrong_call_to_the_api_is_an_argument_error_not_an_internal_one():
    ctx, t, T, y = _one()
    line = here()
    err = raises(tl.ArgumentError, lambda: ctx.compile({T: 4}, {"y": y}, None, 5), line)
    assert "positional" in str(err)


MALFORMED = [None, "s", -1, 2.5, (), (1, -2), {"a": 1}, [1, [2]], np.array(["x"]),
             float("nan"), lambda *a: 1]
METHODS = ["sum", "mean", "max", "min", "reshape", "transpose", "astype", "squeeze",
           "expand_dims", "__getitem__", "__add__", "__matmul__", "__pow__", "__lt__"]


def test_every_public_function_rejects_malformed_arguments_at_the_users_line():
    """Each positional parameter of each public function and tensor method, given values of the
    wrong kind (the others well formed): a TempoLabError located in this file, never a raw
    exception from inside the package."""
    ctx, b, t, B, T = ctx2()
    escaped = {}

    def attempt(what, fn, *args):
        try:
            fn(*args)
        except tl.TempoLabError as e:
            assert str(e).startswith(__file__), f"{what}: {e}"
        except Exception as e:  # noqa: BLE001 - what the test looks for
            escaped.setdefault(what, f"{type(e).__name__}: {e}")

    with ctx:
        x = tl.from_array(np.ones((2, 3, 4), np.float32), domain=(b, t))
        for name in tl.__all__:
            fn = getattr(tl, name)
            if not callable(fn) or inspect.isclass(fn):
                continue
            params = [p for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            required = [p for p in params if p.default is inspect.Parameter.empty]
            for i in range(len(required)):
                for v in MALFORMED:
                    args = [v if j == i else x for j in range(len(required))]
                    attempt(f"tl.{name}(... {required[i].name}={v!r})", fn, *args)
        for m in METHODS:
            for v in MALFORMED:
                attempt(f"x.{m}({v!r})", getattr(x, m), v)
    assert not escaped, "\n".join(f"{k}: {v}" for k, v in escaped.items())


def test_equality_of_dims_is_not_a_condition():
    """``t == 1`` is Python's comparison of two expressions (False): used as a condition it
    would silently select nothing, so it is an error that names tl.eq."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        a = tl.zeros(())
        line = here()
        err = raises(tl.ExprError, lambda: tl.where(t == 1, a, a), line)
        assert "tl.eq(t, 1)" in str(err)
        line = here()
        raises(tl.ExprError, lambda: (t >= 3) & (t % 2 == 1), line)

        def branch():
            x[t == 0] = 1.0

        raises(tl.ExprError, branch, here(-2))


HOSTILE = ['q"uote', "new\nline", "<script>alert(1)</script>", "back\\slash", "uni\u00e9\u2603",
           'b\\"x\nz']


def test_hostile_names_reach_every_emitter_escaped():
    """Names a user gives go through DOT, HTML, JSON, text and generated code escaped: the DOT
    is valid for graphviz, no HTML has a live tag, and every executor still runs it."""
    import json
    import shutil
    import subprocess

    ctx, t, T = ctx1()
    outs = {}
    with ctx:
        for name in HOSTILE:
            x = tl.placeholder((), "float32", domain=(t,), name=name)
            x[0] = tl.zeros(())
            x[t] = x[t - 1] + 1.0
            outs[name] = x
    prog = ctx.compile(bounds={T: 3}, outputs=outs)
    for ex in ALL:
        run = prog.on(ex).run()
        assert all(float(run[n][-1]) == 2.0 for n in HOSTILE), ex
    for stage in (prog.sdg, prog.schedule, prog.memory, prog.lowered, prog.executable,
                  prog.passes):
        assert "<script>" not in stage._repr_html_(), type(stage).__name__
        assert json.loads(json.dumps(stage.to_dict()))
        assert "\n" not in repr(stage)
        stage.pretty()
    dot = prog.sdg.to_dot()
    assert all(line.count('"') % 2 == 0 for line in dot.splitlines())
    if shutil.which("dot"):
        done = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True)
        assert done.returncode == 0 and "<script>" not in done.stdout, done.stderr
