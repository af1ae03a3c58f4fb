"""Execution of compiled programs: the memory model (predicted vs measured store bytes), storage
kinds, domain reduction, a GPT-2-style decoder on both executors, kernel reuse across bound
values, data-dependent bounds (``tl.until``), schedule errors, sinks, the stage objects of
scheduling / memory / execution, and a differential check of the interpreter against the
reference interpreter on random programs.

Expected values come from NumPy or from the reference interpreter, never from the path under test.
Kernels are cached process-wide (``tempo_lab.runtime.kernels.KERNELS``), so tests that count
kernels use spatial shapes no other test uses.
"""
from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import rt_helpers
from hypothesis import Phase, given, settings
from rt_helpers import COMPILED, PER_STATEMENT

import tempo_lab as tl
from tempo_lab.demo import decoder, make_weights, numpy_decoder
from tempo_lab.runtime import kernels as kernels_mod
from tempo_lab.symbolic.sizes import pad

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package

from randprog import ATOL, RTOL, build, program_strategy, to_source  # noqa: E402

REFERENCE = tl.CompileConfig(executor="reference")
INTERPRETER = tl.CompileConfig(executor="interpreter")  # kernel-cache tests (see section 5)
THIS_FILE = os.path.basename(__file__)


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def _here() -> int:
    """The caller's current line number."""
    return sys._getframe(1).f_lineno


def op_named(prog, name: str) -> int:
    ids = [i for i, op in prog.sdg.ops.items() if op.name == name]
    assert len(ids) == 1, (name, ids)
    return ids[0]


def ops_of_kind(prog, kind: str) -> list[int]:
    return [i for i, op in prog.sdg.ops.items() if op.kind == kind]


def assert_peaks_agree(prog, run, rel=0.10):
    """Predicted and measured (Profile) peak store bytes within ``rel``. The prediction is the
    executable's: the MemoryPlan's peak on the interpreter and generated code (stores grow and
    are freed as the schedule runs), the static stores on XLA loops (held for the whole run)."""
    pred, meas = prog.executable.predicted_peak_bytes, run.profile.peak_bytes
    assert pred > 0 and meas > 0, (pred, meas)
    assert abs(pred - meas) <= rel * max(pred, meas), (
        f"predicted peak {pred} B vs measured {meas} B differ by more than {rel:.0%}")


def kernel_counts() -> tuple[int, int]:
    """(entries in the executor's kernel cache, XLA compilations behind them).

    One ``KERNELS`` entry is one jitted function; ``jax.jit`` compiles it again for every new
    combination of input shapes (e.g. a store buffer of another length), which ``KERNELS`` does
    not see. ``_cache_size()`` counts those real compilations."""
    fns = kernels_mod.KERNELS.values()
    return len(fns), sum(f._cache_size() for f in fns)


close = functools.partial(rt_helpers.close, rtol=1e-4, atol=1e-4, same_shape=False)


# ================================================================================================
# 1. The memory model: a window of 4 costs the same bytes for every T; a causal read grows
# ================================================================================================
def recurrence_then_read(read: str, shape=(16,)):
    """``x[0] = 1; x[t] = x[t-1] * 0.5 + 1`` over (t,), and ``z = y[T-1]`` where ``y`` reads x
    with a window of 4 (``read="window"``) or causally (``read="causal"``)."""
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder(shape, "float32", domain=(t,), name="x")
        x[0] = tl.ones(shape)
        x[t] = x[t - 1] * 0.5 + 1.0
        if read == "window":
            y = x[tl.max(0, t - 3):t + 1].sum(axis=0)
        else:
            y = x[0:t + 1].sum(axis=0)
        z = y[T - 1]
    return ctx, T, z


def numpy_recurrence(n: int, shape=(16,)) -> np.ndarray:
    x = np.empty((n,) + shape, np.float32)
    x[0] = 1.0
    for i in range(1, n):
        x[i] = x[i - 1] * np.float32(0.5) + np.float32(1.0)
    return x


@pytest.fixture(scope="module")
def memory_runs():
    """(read kind, T) -> (prog, run) for the window / causal programs at T = 64 and 512."""
    out = {}
    for read in ("window", "causal"):
        ctx, T, z = recurrence_then_read(read)
        for n in (64, 512):
            prog = ctx.compile(bounds={T: n}, outputs={"z": z})
            out[read, n] = prog, prog.run()
    return out


def test_window_of_4_costs_the_same_bytes_for_every_T(memory_runs):
    (p64, r64), (p512, r512) = memory_runs["window", 64], memory_runs["window", 512]
    for prog, run, n in ((p64, r64, 64), (p512, r512, 512)):
        s = prog.memory.storages[op_named(prog, "x")]
        assert s.kind == "ring" and s.dims == ("t",) and s.slots == (4,), s.describe()
        assert_peaks_agree(prog, run)
        close(run["z"], numpy_recurrence(n)[-4:].sum(axis=0))
    assert p64.memory.peak_bytes == p512.memory.peak_bytes
    assert r64.profile.peak_bytes == r512.profile.peak_bytes


def test_causal_read_costs_bytes_that_grow_with_T(memory_runs):
    (p64, r64), (p512, r512) = memory_runs["causal", 64], memory_runs["causal", 512]
    for prog, run, n in ((p64, r64, 64), (p512, r512, 512)):
        s = prog.memory.storages[op_named(prog, "x")]
        assert s.kind == "block" and s.slots == (None,), s.describe()
        assert_peaks_agree(prog, run)
        close(run["z"], numpy_recurrence(n).sum(axis=0))
    assert p512.memory.peak_bytes > p64.memory.peak_bytes
    assert r512.profile.peak_bytes > r64.profile.peak_bytes
    # x alone needs T * 16 float32 at the end: 512 points are 8 blocks of 64
    assert p512.memory.peak_bytes >= 512 * 16 * 4


def test_window_read_at_every_step_costs_the_same_bytes_for_every_T():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder((16,), "float32", domain=(t,), name="x")
        x[0] = tl.ones((16,))
        x[t] = x[t - 1] * 0.5 + 1.0
        y = x[tl.max(0, t - 3):t + 1].sum(axis=0)   # needed at every t ...
        acc = tl.placeholder((16,), "float32", domain=(t,), name="acc")
        acc[0] = y
        acc[t] = acc[t - 1] + y                      # ... by a running sum
    progs = [ctx.compile(bounds={T: n}, outputs={"z": acc[T - 1]}) for n in (64, 512)]
    for prog in progs:
        s = prog.memory.storages[op_named(prog, "x")]
        assert s.kind == "ring" and s.slots == (4,), (s.describe(), prog.schedule.code())
    assert progs[0].memory.peak_bytes == progs[1].memory.peak_bytes
    runs = [p.run() for p in progs]
    assert runs[0].profile.peak_bytes == runs[1].profile.peak_bytes
    for prog, run in zip(progs, runs):
        assert_peaks_agree(prog, run)


# ================================================================================================
# 2. Storage kinds follow the readers
# ================================================================================================
def test_storage_kinds_point_ring_block_and_none():
    a = np.random.default_rng(0).standard_normal((9, 3)).astype(np.float32)
    seen = []
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.from_array(a, domain=(t,), name="x")
        e = tl.exp(x)                    # read only at the same point (by q)
        q = e * 2.0                      # read at t - 2 (by r): a ring of 3
        r = tl.placeholder((3,), "float32", domain=(t,), name="r")
        r[t < 2] = tl.zeros((3,))
        r[t] = q[t - 2] + 1.0
        tl.sink(r, lambda p, v: seen.append(p["t"]))
    # fusion would merge exp into the mul that reads it: look at the ops themselves
    prog = ctx.compile(bounds={T: 9}, outputs={"r": r}, config=tl.CompileConfig(fuse=False))
    st = prog.memory.storages
    (exp_id,) = ops_of_kind(prog, "exp")
    (mul_id,) = ops_of_kind(prog, "mul")
    (sink_id,) = ops_of_kind(prog, "sink")
    assert st[exp_id].kind == "point" and st[exp_id].slots == (1,), st[exp_id].describe()
    assert st[mul_id].kind == "ring" and st[mul_id].slots == (3,), st[mul_id].describe()
    r_id = op_named(prog, "r")
    assert st[r_id].kind == "block" and st[r_id].slots == (None,)  # an output: every point kept
    assert sink_id not in st  # effects have no store
    for s in st.values():
        if s.kind == "point":
            assert all(w == 1 for w in s.slots), s.describe()
    want = np.zeros((9, 3), np.float32)
    want[2:] = np.exp(a[:-2]) * 2 + 1
    run = prog.run()
    close(run["r"], want)
    assert_peaks_agree(prog, run)
    assert seen == list(range(9))


def test_recurrence_reading_t_minus_2_is_a_ring_of_3():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder((5,), "float32", domain=(t,), name="x")
        x[t < 2] = tl.ones((5,))
        x[t] = x[t - 2] * 0.5 + 1.0
    prog = ctx.compile(bounds={T: 10}, outputs={"last": x[T - 1]})
    s = prog.memory.storages[op_named(prog, "x")]
    assert s.kind == "ring" and s.slots == (3,), s.describe()
    want = np.ones(10, np.float32)
    for i in range(2, 10):
        want[i] = want[i - 2] * 0.5 + 1.0
    run = prog.run()
    close(run["last"], np.full(5, want[-1]))
    assert_peaks_agree(prog, run)


def test_clamped_point_read_is_a_ring():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.source(lambda p: np.full(4, p["t"], np.float32), (4,), "float32", domain=(t,),
                      name="x")
        y = x[tl.max(0, t - 2)] + 1.0
    prog = ctx.compile(bounds={T: 16}, outputs={"y": y})
    s = prog.memory.storages[op_named(prog, "x")]
    assert s.kind == "ring" and s.slots == (3,), s.describe()


# ================================================================================================
# 3. Domain reduction: only the demanded points are computed
# ================================================================================================
def test_only_the_demanded_point_is_computed():
    a = np.random.default_rng(1).standard_normal((16, 5)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.from_array(a, domain=(t,), name="x")
        y = tl.exp(x)
    prog = ctx.compile(bounds={T: 16}, outputs={"last": y[T - 1]})
    (exp_id,) = ops_of_kind(prog, "exp")
    run = prog.run()
    assert run.profile.calls[exp_id] == 1
    assert run.profile.calls[op_named(prog, "x")] == 1
    close(run["last"], np.exp(a[-1]), rtol=1e-6, atol=1e-6)

    # Two demanded points {0, T - 1}: the schedule widens demand to its convex hull
    # (schedule.build.statement_domains), so anything from 2 to T calls is allowed here.
    prog2 = ctx.compile(bounds={T: 16}, outputs={"last": y[T - 1], "first": y[0]})
    run2 = prog2.run()
    assert 2 <= run2.profile.calls[ops_of_kind(prog2, "exp")[0]] <= 16
    close(run2["first"], np.exp(a[0]), rtol=1e-6, atol=1e-6)
    close(run2["last"], np.exp(a[-1]), rtol=1e-6, atol=1e-6)


# ================================================================================================
# 4. A GPT-2-style decoder on both executors, against NumPy
# ================================================================================================
LAYERS, EMBED, HEADS, STEPS, BATCH, WINDOW = 2, 16, 2, 12, 2, 4


@pytest.fixture(scope="module")
def weights():
    return make_weights(LAYERS, EMBED, 2 * EMBED)


@pytest.fixture(scope="module")
def causal_decoder(weights):
    tokens = np.random.default_rng(1).standard_normal((STEPS, EMBED)).astype(np.float32)
    ctx = tl.Context(dims=("n", "t"))
    n, t = ctx.dims
    N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, HEADS)
    with ctx:
        y = h_out[N - 1, t]
    bounds = {N: LAYERS, T: STEPS}
    prog = ctx.compile(bounds=bounds, outputs={"y": y})
    ref = ctx.compile(bounds=bounds, outputs={"y": y}, config=REFERENCE)
    return tokens, prog, prog.run(), ref.run()


@pytest.fixture(scope="module")
def batched_window_decoder(weights):
    tokens = np.random.default_rng(2).standard_normal((BATCH, STEPS, EMBED)).astype(np.float32)
    ctx = tl.Context(dims=("b", "n", "t"))
    b, n, t = ctx.dims
    B, N, T = ctx.bounds
    h_out = decoder(ctx, weights, tokens, HEADS, WINDOW)
    with ctx:
        y = h_out[b, N - 1, t]
    bounds = {B: BATCH, N: LAYERS, T: STEPS}
    prog = ctx.compile(bounds=bounds, outputs={"y": y})
    ref = ctx.compile(bounds=bounds, outputs={"y": y}, config=REFERENCE)
    return tokens, prog, prog.run(), ref.run()


def test_causal_decoder_matches_numpy_on_both_executors(weights, causal_decoder):
    tokens, prog, run, ref = causal_decoder
    want = numpy_decoder(weights, tokens, HEADS)
    assert run["y"].shape == ref["y"].shape == (STEPS, EMBED)
    close(run["y"], want, msg="interpreter vs numpy_decoder")
    close(ref["y"], want, msg="reference vs numpy_decoder")
    close(run["y"], ref["y"], rtol=1e-5, atol=1e-5, msg="interpreter vs reference")
    assert ref.profile is None and run.profile is not None
    assert_peaks_agree(prog, run)


def test_batched_window_decoder_matches_numpy_on_both_executors(weights, batched_window_decoder):
    tokens, prog, run, ref = batched_window_decoder
    want = np.stack([numpy_decoder(weights, tokens[i], HEADS, WINDOW)
                     for i in range(BATCH)])
    # the window matters: the causal decoder differs from it (so the mask is really applied)
    causal = np.stack([numpy_decoder(weights, tokens[i], HEADS) for i in range(BATCH)])
    assert np.abs(causal - want).max() > 1e-2
    assert run["y"].shape == ref["y"].shape == (BATCH, STEPS, EMBED)
    close(run["y"], want, msg="interpreter vs numpy window decoder")
    close(ref["y"], want, msg="reference vs numpy window decoder")
    close(run["y"], ref["y"], rtol=1e-5, atol=1e-5, msg="interpreter vs reference")
    assert_peaks_agree(prog, run)
    # keys and values are read through a window of 4 steps: rings of 4 slots along t (over
    # the layers a block, as the layer loop runs inside the step loop)
    rings = [s for s in prog.memory.storages.values()
             if s.dims and s.dims[-1] == "t" and s.slots[-1] == WINDOW]
    assert len(rings) >= 2, prog.memory.pretty()


# ================================================================================================
# 5. Another bound value reuses the compiled kernels
# ================================================================================================
# These tests pin the loop-AST interpreter, whose kernels (shared with generated code) live in
# the process-wide cache counted here; tests/runtime/test_executors.py covers XLA loops.
# Kernels are specialised on static shapes only. A window of constant width reads a fixed number
# of slots and a ring store has a fixed size, so a program whose stores are all points and rings
# needs no new kernel (and no new XLA compilation) for another T. A causal range 0:t+1 is padded
# to a power of two (at least 8, memory.plan.pad), so a new T can add one kernel per *new padded
# size class* per op that reads a growing range, and nothing else.
def test_window_program_runs_another_T_without_compiling():
    shape = (5,)  # no other test uses it: these kernels are this test's own
    ctx, T, z = recurrence_then_read("window", shape)
    r16 = ctx.compile(bounds={T: 16}, outputs={"z": z}, config=INTERPRETER).run()
    before = kernel_counts()
    r32 = ctx.compile(bounds={T: 32}, outputs={"z": z}, config=INTERPRETER).run()
    assert kernel_counts() == before
    close(r16["z"], numpy_recurrence(16, shape)[-4:].sum(axis=0))
    close(r32["z"], numpy_recurrence(32, shape)[-4:].sum(axis=0))


def test_causal_program_adds_at_most_one_kernel_per_new_padded_size_class():
    shape = (6,)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder(shape, "float32", domain=(t,), name="x")
        x[0] = tl.ones(shape)
        x[t] = x[t - 1] * 0.5 + 1.0
        c = x[0:t + 1].mean(axis=0)              # the only read of a growing range
        acc = tl.placeholder(shape, "float32", domain=(t,), name="acc")
        acc[0] = c
        acc[t] = acc[t - 1] + c
    out = {"z": acc[T - 1]}
    prog = ctx.compile(bounds={T: 16}, outputs=out, config=INTERPRETER)
    prog.run()
    before, _ = kernel_counts()
    ctx.compile(bounds={T: 16}, outputs=out, config=INTERPRETER).run()   # the same T again: nothing new at all
    assert kernel_counts()[0] == before
    run = ctx.compile(bounds={T: 40}, outputs=out, config=INTERPRETER).run()
    new_classes = {pad(None, n) for n in range(1, 41)} - {pad(None, n) for n in range(1, 17)}
    assert new_classes == {32, 64}
    assert kernel_counts()[0] - before <= len(new_classes)
    x_np = numpy_recurrence(40, shape)
    want = (np.cumsum(x_np, axis=0) / np.arange(1, 41)[:, None]).sum(axis=0)
    close(run["z"], want)


def test_another_T_does_not_recompile_a_program_with_a_per_step_output():
    shape = (7, 3)  # no other test uses it
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        y = tl.zeros(shape) + t
    # per step, not vectorised: a vectorised t (one kernel for all steps) is sized by T
    per_step = tl.CompileConfig(executor="interpreter", vectorise=False)
    # a bound within one block is stored at its size class: 20 and 30 share 32
    ctx.compile(bounds={T: 20}, outputs={"y": y}, config=per_step).run()
    before = kernel_counts()
    run = ctx.compile(bounds={T: 30}, outputs={"y": y}, config=per_step).run()
    close(run["y"], np.broadcast_to(np.arange(30, dtype=np.float32)[:, None, None], (30,) + shape))
    assert kernel_counts() == before


# ================================================================================================
# 6. Data-dependent bounds: tl.until
# ================================================================================================
def counter(threshold: float):
    """``c[0] = 0; c[t] = c[t-1] + 1`` and ``done = c >= threshold`` over (t,)."""
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(t,), name="c")
        c[0] = tl.zeros(())
        c[t] = c[t - 1] + 1.0
        done = c >= threshold
        total = c[0:T].sum(axis=0)        # a later reader sees the reached T
        last = c[T - 1]
    return ctx, T, c, done, {"c": c, "total": total, "last": last}


@pytest.mark.executors(("interpreter", "reference"), reason="the reference and one back end")
@pytest.mark.parametrize("threshold, reached", [(5.0, 6), (100.0, 20)])
def test_until_stops_after_the_first_done_point(executor, threshold, reached):
    ctx, T, c, done, outs = counter(threshold)
    assert done.dtype == np.bool_ and done.shape == ()
    prog = ctx.compile(bounds={T: tl.until(done, max=20)}, outputs=outs,
                       config=tl.CompileConfig(executor=executor))
    run = prog.run()
    assert run.bounds["T"] == reached
    np.testing.assert_array_equal(run["c"], np.arange(reached, dtype=np.float32))
    assert float(run["total"]) == sum(range(reached))
    assert float(run["last"]) == reached - 1


def test_until_with_a_second_dim_and_a_sink():
    seen = []
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(t,), name="c")
        c[0] = tl.zeros(())
        c[t] = c[t - 1] + 1.0
        x = tl.placeholder((), "float32", domain=(b, t), name="x")
        x[b, 0] = tl.zeros(()) + b
        x[b, t] = x[b, t - 1] + c
        tl.sink(x, lambda p, v: seen.append((p["b"], p["t"], float(v))))
        done = c >= 3.0
    bounds = {B: 2, T: tl.until(done, max=10)}
    want = np.array([[0, 1, 3, 6], [1, 2, 4, 7]], np.float32)
    for config in (tl.CompileConfig(), REFERENCE):
        seen.clear()
        run = ctx.compile(bounds=bounds, outputs={"x": x}, config=config).run()
        assert run.bounds == {"B": 2, "T": 4}
        np.testing.assert_array_equal(run["x"], want)
        assert sorted(seen) == [(i, j, float(want[i, j])) for i in range(2) for j in range(4)]



@pytest.mark.executors(COMPILED, reason="a loop of the schedule")
def test_until_loop_that_isl_shifts_by_a_bound(executor):
    """isl may run the until's dim as ``c0 = t + B`` (here: a loop over ``b`` before it): the
    loop is still the one that ends at the condition (it was refused as not a plain loop)."""
    data = np.array([0.1, 0.4, 0.2, 0.9, -0.2, 0.3], np.float32)
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        v0 = tl.from_array(data, domain=(t,))
        v1 = v0[tl.max(0, t - 1):t + 1].mean(axis=0) + 1.0
        v3 = tl.from_array(np.array([2.0], np.float32), domain=(b,))
        v4 = tl.placeholder((), "float32", domain=(t,))
        v4[t] = v4[t - 1] * 0.5 + v3[B - 1]
        v4[0] = 0.0
        done = v0 > 0.3
    bounds, outs = {B: 1, T: tl.until(done, max=6)}, {"v1": v1, "v3": v3, "v4": v4}
    run = ctx.compile(bounds=bounds, outputs=outs,
                      config=tl.CompileConfig(executor=executor)).run()
    assert run.bounds["T"] == 2
    np.testing.assert_allclose(run["v4"], [0.0, 2.0])
    np.testing.assert_allclose(run["v1"], [1.1, 1.25])


def test_read_of_the_until_bound_in_the_iteration_that_ends_it(executor):
    """``v0[b, T - 1]`` runs inside the until's loop, under ``if t == T - 1`` after the
    condition: the bound is set the moment the condition holds, so that guard sees the ``T``
    reached (it saw the max, the read never ran, and ``v6`` came out as zeros)."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        v2 = tl.from_array(np.array([0.1, 0.2, 0.05], np.float32), domain=(t,))
        v0 = tl.from_array(np.array([[1.0, 2.0, 3.0]], np.float32), domain=(b, t))
        v5 = tl.from_array(np.array([[4.0, 5.0, 6.0]], np.float32), domain=(b, t))
        v6 = tl.placeholder((), "float32", domain=(b, t))
        v6[b, t] = v6[b, t - 1] * 0.5 + v6[b, t - 1] * 0.25
        v6[b, 0] = v0[b, T - 1]
        done = v2 > 0.15
    prog = ctx.compile(bounds={B: 1, T: tl.until(done, max=3)}, outputs={"v5": v5, "v6": v6},
                       config=tl.CompileConfig(executor=executor))
    if executor != "reference":  # the case this test is about
        loop = prog.schedule.pretty().split("until done")[1].split("for t")[0]
        assert "if t == T - 1:\n      v0[T - 1] = from_array()" in loop
    run = prog.run()
    assert run.bounds["T"] == 2
    np.testing.assert_allclose(run["v6"], [[2.0, 1.5]])
    np.testing.assert_allclose(run["v5"], [[4.0, 5.0]])


def test_until_loop_body_splits_where_its_bound_is_set():
    """The bound is set after the top-level statement that computes the condition; a schedule
    that reads the bound after the condition inside that same statement is refused (another
    scheduler is tried), as that read would still see the max."""
    from types import SimpleNamespace

    from tempo_lab.schedule import Exec, If, Seq, While, build
    from tempo_lab.symbolic import Bound, Dim, eq
    t, T = Dim("t"), Bound("T")
    sdg = SimpleNamespace(ops={0: SimpleNamespace(label="done"), 1: SimpleNamespace(label="x")})
    done, read = Exec(0, (t,)), Exec(1, (T - 1,))
    loop = While("t", 0, T, Seq((done, If(eq(t, T - 1), read))), "t", 1, "T", 0, t)
    head, tail = loop.split()
    assert head.body == (done,) and len(tail.body) == 1
    build._check_split(loop, sdg)  # split between them: the read sees the bound reached
    inside = While("t", 0, T, Seq((If(t >= 0, Seq((done, read))),)), "t", 1, "T", 0, t)
    with pytest.raises(build.IslScheduleRejected, match="x depends on T"):
        build._check_split(inside, sdg)

def test_statement_counts_are_what_walk_runs_without_visiting_every_point():
    """``statement_counts`` (how the XLA executor counts a program without a ``tl.until``
    bound) gives what walking the loop AST runs, per op, counted by isl over each op's
    domain: the same at 50 steps (a first step, a branch per iteration), and at 10^6 steps at
    once; a ``tl.until`` bound, which only a run decides, is refused at the user's line."""
    import time
    from collections import Counter

    from tempo_lab.schedule import Exec, statement_counts, walk
    ctx, outs, _ = rt_helpers.table_program()
    N, T = ctx.bounds
    prog = ctx.compile(bounds={N: 2, T: 50}, outputs=outs)
    walked = Counter(n.op for n, _ in walk(prog.schedule.ast, {"I": 2, "T": 50})
                     if isinstance(n, Exec))
    assert statement_counts(prog.schedule, {"I": 2, "T": 50}) == dict(walked)
    big = ctx.compile(bounds={N: 2, T: 10**6}, outputs=outs)
    t0 = time.perf_counter()
    got = statement_counts(big.schedule, {"I": 2, "T": 10**6})
    assert time.perf_counter() - t0 < 1.0
    assert max(got.values()) == 2 * 10**6 and sum(got.values()) > 4 * 10**6
    ctx, T, c, done, outs = counter(5.0)
    until = ctx.compile(bounds={T: tl.until(done, max=20)}, outputs=outs)
    line = _here() + 2
    with pytest.raises(tl.TempoLabError, match=rf"test_execution.py:{line}.*tl.until"):
        statement_counts(until.schedule, {"T": 20})


def test_until_errors():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        c = tl.placeholder((), "float32", domain=(t,), name="c")
        c[0] = tl.zeros(())
        c[t] = c[t - 1] + 1.0
        over_nothing = c[T - 1] >= 3.0       # bool, but over ()
        vector = (tl.zeros((2,)) + c) >= 3.0  # bool[2]
        done = c >= 3.0
    for bad in (c, over_nothing, vector):  # over (b, t) ends t per instance: test_ragged.py
        with pytest.raises(tl.BoundsError, match="tl.until"):
            ctx.compile(bounds={B: 2, T: tl.until(bad, max=10)}, outputs={"c": c})
    with pytest.raises(tl.BoundsError):
        tl.until(np.zeros(3, bool), max=3)
    with pytest.raises(tl.BoundsError):
        tl.until(done, max=0)


# ================================================================================================
# 7. ScheduleError names the cycle
# ================================================================================================
def test_cyclic_placeholders_raise_schedule_error_naming_both():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        line_x = _here() + 1
        x = tl.placeholder((), "float32", domain=(t,), name="x")
        y = tl.placeholder((), "float32", domain=(t,), name="y")
        line_xdef = _here() + 1
        x[t] = y[t] + 1.0
        line_ydef = _here() + 1
        y[t] = x[t] * 2.0
    with pytest.raises(tl.ScheduleError) as info:
        ctx.compile(bounds={T: 4}, outputs={"x": x})
    msg = str(info.value)
    first = msg.split("\n")[0]
    assert re.match(rf".*{re.escape(THIS_FILE)}:\d+: ", first), msg
    assert f"{THIS_FILE}:{line_x}: " in first, msg
    # each step of the cycle is located at the line that reads
    assert f"{THIS_FILE}:{line_xdef}" in msg and f"{THIS_FILE}:{line_ydef}" in msg, msg
    assert "->" in msg
    assert re.search(r"\bx\b", msg) and re.search(r"\by\b", msg), msg


# ================================================================================================
# 8. Sinks on the interpreter
# ================================================================================================
def test_sinks_run_once_per_point_in_order_with_the_right_values():
    calls, windows = [], []
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    (T,) = ctx.bounds
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,), name="x")
        x[0] = tl.ones((3,))
        x[t] = x[t - 1] * 2.0
        tl.sink(x, lambda p, v: calls.append((dict(p), np.array(v))))
        tl.sink(x[tl.max(0, t - 1):t + 1], lambda p, v: windows.append((p["t"], np.array(v))))
    prog = ctx.compile(bounds={T: 6}, outputs={"last": x[T - 1]})
    assert prog.executor == "codegen", prog.executable.pretty()  # sinks keep auto off XLA
    prog.run()
    assert [p for p, _ in calls] == [{"t": i} for i in range(6)]
    for i, (_, v) in enumerate(calls):
        np.testing.assert_array_equal(v, np.full(3, 2.0 ** i, np.float32))
    assert [i for i, _ in windows] == list(range(6))
    for i, v in windows:
        want = np.stack([np.full(3, 2.0 ** j, np.float32) for j in range(max(0, i - 1), i + 1)])
        np.testing.assert_array_equal(v, want)
    # the reference interpreter makes the same calls
    interp = [(p["t"], v.tolist()) for p, v in calls]
    calls.clear()
    ctx.compile(bounds={T: 6}, outputs={"last": x[T - 1]}, config=REFERENCE).run()
    assert sorted((p["t"], v.tolist()) for p, v in calls) == interp


def test_sinks_over_two_dims_follow_the_dependences():
    calls = []
    data = np.random.default_rng(3).standard_normal((3, 4, 2)).astype(np.float32)
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        h = tl.placeholder((2,), "float32", domain=(b, t), name="h")
        h[b, 0] = x[b, 0]
        h[b, t] = h[b, t - 1] + x
        tl.sink(h, lambda p, v: calls.append(((p["b"], p["t"]), np.array(v))))
        s = h[0:B, T - 1].sum(axis=0)
    ctx.compile(bounds={B: 3, T: 4}, outputs={"s": s}).run()
    points = [p for p, _ in calls]
    assert sorted(points) == [(i, j) for i in range(3) for j in range(4)]  # once each
    for i in range(3):  # h[b, t] after h[b, t - 1]
        ts = [pt[1] for pt in points if pt[0] == i]
        assert ts == sorted(ts)
    want = np.cumsum(data, axis=1)
    for (i, j), v in calls:
        close(v, want[i, j], rtol=1e-5, atol=1e-5)


# ================================================================================================
# 9. Stage objects of scheduling, memory and execution
# ================================================================================================
def _stage_program():
    ctx, T, z = recurrence_then_read("window", (3,))
    prog = ctx.compile(bounds={T: 8}, outputs={"z": z})
    return prog, prog.run()


def test_stage_objects_have_the_stage_vocabulary():
    (p1, r1), (p2, r2) = _stage_program(), _stage_program()
    pairs = {"schedule": (p1.schedule, p2.schedule), "memory": (p1.memory, p2.memory),
             "lowered": (p1.lowered, p2.lowered), "executable": (p1.executable, p2.executable),
             "profile": (r1.profile, r2.profile)}
    for what, (a, b) in pairs.items():
        rep = repr(a)
        assert "\n" not in rep and "0x" not in rep and rep, (what, rep)
        assert rep == repr(b), (what, rep, repr(b))
        text = a.pretty()
        assert text == str(a) and text.splitlines()[0] == rep
        assert re.search(r"^\S[^\n]*:$", text, re.M), (what, text)  # labelled sections
        assert "\x1b[" not in text and "0x" not in text
        page = a._repr_html_()
        assert isinstance(page, str) and page and "0x" not in page
        d = a.to_dict()
        json.dumps(d)
        assert re.fullmatch(r"tempo_lab\.\w+/\d+", d["schema"]), (what, d["schema"])
    assert p1.schedule.pretty() == p2.schedule.pretty()
    assert p1.memory.pretty() == p2.memory.pretty()
    assert p1.memory.to_dict() == p2.memory.to_dict()
    assert p1.lowered.to_dict() == p2.lowered.to_dict()
    assert p1.lowered.to_dict()["schema"] == "tempo_lab.lowered/1"
    code = str(p1.schedule)
    assert "for t in" in code and code == p1.schedule.pretty()
    assert "for t in" in p1.schedule.code()
    assert r1.profile.peak_bytes == max(r1.profile.timeline)
    assert p1.memory.peak_bytes == max(p1.memory.timeline)


def test_stages_hold_each_fact_once_and_are_not_changed():
    """The compiled bounds are one dict, held by the Lowered and read (not copied) by the
    program and the XLA plan; the program's SDG, schedule and memory plan are its stages'; the
    executable is made for its program; the budget is the memory planner's argument; a run
    leaves the executable as it was."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((256,), "float32", domain=(t,), name="x")
        x[0] = tl.ones((256,))
        x[t] = x[t - 1] * 0.5 + 1.0
        y = x[0:T].sum(axis=0)
    prog = ctx.compile(bounds={T: 40}, outputs={"y": y})
    assert prog.bounds is prog.lowered.bounds == {"T": 40}
    if prog.executor == "xla":
        assert prog.executable.plan.bounds is prog.lowered.bounds
    assert prog.sdg is prog.passes.final and prog.schedule is prog.lowered.schedule
    assert prog.memory is prog.lowered.memory and prog.memory.budget is None
    assert prog.executable.program is prog and prog.on("codegen").executable.program is not prog
    before = dict(vars(prog.executable))
    run = prog.run()
    assert run.program is prog and vars(prog.executable).keys() == before.keys()
    assert all(vars(prog.executable)[k] is v for k, v in before.items() if k != "_unchecked")
    budget = prog.memory.peak_bytes // 2
    held = ctx.compile(bounds={T: 40}, outputs={"y": y},
                       config=tl.CompileConfig(device_memory_budget=budget))
    assert held.memory.budget == budget == held.memory.to_dict()["budget"]


# ================================================================================================
# 10. Differential: the default executor against the reference interpreter on random programs
# (a few here; tests/test_random_programs.py runs 200 on every executor and pass switch)
# ================================================================================================
@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          phases=tuple(p for p in Phase if p is not Phase.explain))
@given(program_strategy())
def test_random_programs_interpreter_matches_reference(program):
    ctx, outputs, bounds = build(program)
    prog = ctx.compile(bounds=bounds, outputs=outputs)
    run = prog.run()
    ref = ctx.compile(bounds=bounds, outputs=outputs, config=REFERENCE).run()
    src = to_source(program)
    for name in program.outputs:
        np.testing.assert_allclose(run[name], ref[name], rtol=RTOL, atol=ATOL,
                                   err_msg=f"output {name!r}: interpreter vs reference\n{src}")
    assert_peaks_agree(prog, run)


# ================================================================================================
# Regressions found by the random-program tests
# ================================================================================================
def test_schedule_that_would_lose_a_statement_falls_back():
    """isl once returned a schedule tree without the from_array statement (silent zeros)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        v0 = tl.from_array(np.array([1.0, 2.0], "float32"), domain=(t,))
        v1 = v0[t:T].sum(axis=0) + v0[tl.max(0, t - 1):t + 1].sum(axis=0)
        v2 = tl.placeholder((), "float32", domain=(t,))
        v2[t + 1] = (v2[tl.max(0, t - 1):t + 1].max(axis=0) * 0.5
                     + tl.minimum(v0[0], v1[tl.min(t + 1, T - 1)]) * 0.25)
        v2[t < 1] = tl.maximum(v1[tl.max(0, t - 1)], -0.25)
    prog = ctx.compile(bounds={T: 2}, outputs={"v2": v2})
    close(prog.run()["v2"], [4.0, 2.25])


def test_a_step_that_copies_its_own_earlier_point():
    """The placeholder reads its own store: its kernel must not donate that buffer."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = 1.0
        x[t] = x[t - 1]
    close(ctx.compile(bounds={T: 3}, outputs={"x": x}).run()["x"], [1.0, 1.0, 1.0])


@pytest.mark.executors(PER_STATEMENT, reason="a progress bar counts the steps run from Python")
def test_a_runs_progress_bar_is_made_only_once_the_run_is_long(executor, monkeypatch):
    """A short run makes no progress bar (a tqdm bar costs about 100 µs, most of a short run);
    one still going after ``progress.DELAY_S`` gets one that counts every outermost step."""
    from tempo_lab import progress
    from tempo_lab.runtime import host as H

    made = []

    class Bar:
        def __init__(self, total, desc, unit="it", delay=0.0):
            self.total, self.n, self.closed = total, 0, False
            if desc.startswith("run"):     # not the compile's own bar
                made.append(self)

        def set_description_str(self, text, refresh=False):
            pass

        def update(self, n=1):
            self.n += n

        def close(self):
            self.closed = True

    monkeypatch.setattr(tl.config, "progress", True)
    monkeypatch.setattr(progress, "bar", lambda *a, **k: Bar(*a, **k))
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((2,), domain=(t,), name="x")
        x[0] = tl.ones((2,))
        x[t] = x[t - 1] * 0.5
    prog = ctx.compile(bounds={T: 6}, outputs={"x": x},
                       config=tl.CompileConfig(executor=executor))
    prog.run()
    assert made == []                                       # short: no bar at all
    monkeypatch.setattr(H.progress, "DELAY_S", 0.0)
    prog.run()
    assert len(made) == 1 and made[0].total == 6 and made[0].n == 6 and made[0].closed
