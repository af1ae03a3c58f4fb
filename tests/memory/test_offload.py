"""Offloading under CompileConfig(device_memory_budget=...) (memory/offload.py): stores idle
between phases move to host memory and back; results equal the reference, device bytes
measured equal the plan's."""
import numpy as np
import pytest
from budget import examples
from hypothesis import HealthCheck, given, settings
from randprog import assert_outputs_match, program_strategy, run_tempo
from rt_helpers import MEMORY_BUDGET

import tempo_lab as tl

pytestmark = pytest.mark.executors(MEMORY_BUDGET, reason="offloading needs a memory budget")


def _phases():
    """Phase 1 makes ``a`` (256 floats per step), phase 2 makes ``b``, stored whole and summed,
    without reading ``a``; phase 3 reads ``a`` again. Without a budget the peak is in phase 2,
    with ``a`` and ``b`` both live."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tl.placeholder((256,), domain=(t,), name="a")
        a[0] = tl.ones((256,))
        a[t] = a[t - 1] * 0.99 + 0.01
        b = tl.placeholder((256,), domain=(t,), name="b")
        b[0] = a[T - 1] * 0.5
        b[t] = b[t - 1] * 0.9 + 1.0
        s = b[0:T].sum(axis=0)
        c = tl.placeholder((256,), domain=(t,), name="c")
        c[0] = s
        c[t] = c[t - 1] + a[t]
        out = c[T - 1].sum()
    return ctx, {T: 100}, {"out": out}


def _with_half_budget(program, executor):
    """The reference's ``out``, the program compiled without a budget, and under half of its
    peak."""
    ctx, bounds, outs = program
    want = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()["out"]
    free = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(executor=executor))
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, device_memory_budget=free.memory.peak_bytes // 2))
    return want, free, prog


def test_a_store_idle_in_the_middle_phase_goes_to_the_host(executor):
    want, free, prog = _with_half_budget(_phases(), executor)
    budget = free.memory.peak_bytes // 2
    code = prog.schedule.code()
    assert "offload a" in code and "fetch a" in code
    run = prog.run()
    np.testing.assert_allclose(run["out"], want, rtol=1e-5)
    a_bytes = 128 * 256 * 4  # two blocks of 64 steps
    assert prog.memory.offloaded_bytes == run.profile.offloaded_bytes == a_bytes
    assert run.profile.peak_bytes == prog.memory.peak_bytes  # measured = planned, on device
    assert prog.memory.peak_bytes <= free.memory.peak_bytes - a_bytes + 4096
    # a is live in phase 3, with c: the budget (half) is not quite reachable, and it says so
    assert prog.memory.peak_bytes > budget
    assert any("above it by" in line for _, lines in prog.memory._sections() for line in lines)


def test_no_offload_when_the_peak_fits():
    ctx, bounds, outs = _phases()
    free = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(executor="codegen"))
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor="codegen", device_memory_budget=free.memory.peak_bytes))
    assert "offload" not in prog.schedule.code()
    assert prog.memory.peak_bytes == free.memory.peak_bytes


def test_auto_runs_a_budget_on_codegen_and_xla_says_why_not():
    ctx, bounds, outs = _phases()
    prog = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(device_memory_budget=100_000))
    assert prog.executor == "codegen" and "device_memory_budget" in " ".join(
        prog.executable.choice)
    with pytest.raises(tl.TempoLabError, match="executor=.xla.: that executor holds every store"):
        tl.CompileConfig(executor="xla", device_memory_budget=100_000)
    with pytest.raises(tl.TempoLabError, match="device_memory_budget"):
        tl.CompileConfig(device_memory_budget=-1)


def _iterations():
    """An outer loop over ``i``: ``w`` (4096 floats) is updated once per iteration and idle
    while the inner loop over ``t`` fills ``x``, which is read whole at the end of the same
    iteration; ``w`` is read again after the loop."""
    ctx = tl.Context(dims=("i", "t"))
    (i, t), (n_iter, T) = ctx.dims, ctx.bounds
    with ctx:
        w = tl.placeholder((4096,), domain=(i,), name="w")
        s = tl.placeholder((64,), domain=(i,), name="s")
        w[0] = tl.ones((4096,))
        w[i] = w[i - 1] * 0.9 + s[i - 1].sum() * 0.001
        x = tl.placeholder((64,), domain=(i, t), name="x")
        x[i, 0] = tl.ones((64,)) * 2.0
        x[i, t] = x[i, t - 1] * 0.5 + 1.0
        s[i] = x[i, 0:T].sum(axis=0)
        out = w[n_iter - 1].sum()
    return ctx, {n_iter: 4, T: 100}, {"out": out}


def test_a_store_read_in_the_iteration_that_made_it_can_be_freed_every_iteration():
    from tempo_lab.memory.liveness import iteration_frees, maps_by_op

    ctx, bounds, outs = _iterations()
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(executor="codegen"))
    sch, by = prog.schedule, {op.label: i for i, op in prog.sdg.ops.items()}
    by_op = maps_by_op(sch.order)
    frees = iteration_frees(prog.sdg, by_op, sch.domains, by["x"])
    # after the sum of its iteration (and, in the last iteration, where that sum is not
    # computed, after its last write): never only in the last iteration
    assert frees and all("i == I - 1" not in str(c) or "t == T - 1" in str(c)
                         for _, c in frees)
    assert any(prog.sdg.ops[r].label == "s" for r, _ in frees)
    # w and s are read in the next iteration: no such free
    assert iteration_frees(prog.sdg, by_op, sch.domains, by["w"]) is None
    assert iteration_frees(prog.sdg, by_op, sch.domains, by["s"]) is None


def test_a_store_idle_for_most_of_each_iteration_wraps_around_to_the_host(executor):
    want, free, prog = _with_half_budget(_iterations(), executor)
    code = prog.schedule.code().splitlines()
    # w leaves after its update in every iteration, comes back before the next update and,
    # after the loop, before the output reads it
    loop = code.index("for i in 0..I:")
    assert "  fetch w" in code[loop + 1:] and "  offload w" in code
    assert code.index("fetch w", loop + 5) < code.index("out = sum(w[I - 1])")
    # x is freed at the end of every iteration: the sum that reads it, then no condition
    at = code.index("    s[i] = sum(x[i, 0:T])")
    assert code[at + 1] == "    free x"
    run = prog.run()
    np.testing.assert_allclose(run["out"], want, rtol=1e-5)
    assert run.profile.peak_bytes == prog.memory.peak_bytes < 0.65 * free.memory.peak_bytes
    # w is updated in place (its one slot: every read of w[i - 1] comes before w[i] is written)
    assert run.profile.offloaded_bytes == prog.memory.offloaded_bytes == 4096 * 4


def test_an_output_that_ends_a_loop_on_the_host_comes_back(executor):
    """The whole program is one loop nest; under the smallest budget the output leaves the
    device in every iteration and must be fetched after the loop (found by hypothesis)."""
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    data = np.random.RandomState(0).uniform(-1, 1, size=(2, 1)).astype("float32")
    with ctx:
        v0 = tl.from_array(data, domain=(b, t))
        v1 = v0[b, tl.max(0, t - 1)]
        tl.sink(v0, lambda p, v: None)
    prog = ctx.compile(bounds={B: 2, T: 1}, outputs={"v1": v1}, config=tl.CompileConfig(
        executor=executor, device_memory_budget=1))
    code = prog.schedule.code().splitlines()
    assert code[0].startswith("for ") and code[-1].startswith("fetch ")
    np.testing.assert_array_equal(prog.run()["v1"], data)


def test_a_store_offloaded_in_one_branch_comes_back_for_the_other(executor):
    """A loop over ``c0`` whose body is one ``if``: its ``then`` branch is a loop that reads a
    store and moves it to the host after each iteration, its ``else`` branch a loop that reads
    it too. The next iteration may take the ``else`` branch, so the store must come back before
    the ``if`` (found by hypothesis: the gradient's wavefront over ``(b, t)``)."""
    ctx = tl.Context(dims=("a", "b", "t"))
    (a, b, t), (A, B, T) = ctx.dims, ctx.bounds
    data = np.random.RandomState(575).uniform(-1, 1, size=(3, 8, 2)).astype("float32")
    with ctx:
        v0 = tl.from_array(data, domain=(b, t))
        v1 = tl.placeholder((2,), "float32", domain=(a, b, t))
        v1[a, b, 0] = ((v0[b, 0] * v0[b, 0:t + 1].transpose(1, 0).max(axis=(1,)) * 4.0)
                       .astype("int32") // 2).astype("float32")
        v1[a, b, t] = v1[a, b, t - 1] * -0.5 + v0[0:B, 0:t + 1].sum(axis=(0, 1)) * 0.0625
        v2 = v1[a, 0, tl.max(0, t - 1):t + 1].transpose(1, 0).max(axis=(1,))
        v3 = tl.placeholder((2,), "float32", domain=(a, b, t))
        v3[a, b, t] = (v3[a, b, tl.max(0, t - 3):t].mean(axis=0) * 0.5
                       + v3[A - 1, b, 0:t].mean(axis=0) * 0.25)
        v3[t < 2] = tl.where(a < 1, v0[B - 1, T - 1],
                             ((v1[A - 1, 0, T - 1] * 4.0).astype("int32") % 3).astype("float32"))
        d_v0, = tl.grad(v1.sum(axis=-1), [v0])
        tl.sink(v0, lambda p, v: None)
    bounds, outs = {A: 1, B: 3, T: 8}, {"v2": v2, "v3": v3, "d_v0": d_v0}
    want = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()
    prog = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
        executor=executor, device_memory_budget=1))
    got = prog.run()
    for k in outs:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


@settings(max_examples=examples(40), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program_strategy())
def test_random_programs_under_a_budget_match_numpy(program):
    """Half the unbudgeted peak (values vectorised up to a quarter of it, stores freed every
    iteration and moved to the host where that lowers the peak), and one byte (nothing
    vectorised; every move that lowers the peak): results still equal NumPy's, and the
    measured device peak is the plan's (without a tl.until, whose plan is for its maximum)."""
    for executor in MEMORY_BUDGET:
        free = run_tempo(program, config=tl.CompileConfig(executor=executor))
        for budget in (max(1, free["_peak"][1] // 2), 1):
            got = run_tempo(program, config=tl.CompileConfig(executor=executor,
                                                             device_memory_budget=budget))
            assert_outputs_match(program, got, what=f"{executor} under a {budget}-byte budget")
            if program.until is None:  # (the plan is for a tl.until's maximum, not the run's)
                assert got["_peak"][0] == got["_peak"][1]
