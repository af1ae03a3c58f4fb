"""The memory plan's simulation: compressed (a long loop runs its first and last iterations of
each stretch) against running every iteration, and its cost against the bounds.

``peak_bytes`` must be exact whatever the compression, the number of steps exact, and every
sampled point of the timeline equal to the full timeline at that step."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tempo_lab as tl
from tempo_lab.demo import decoder, make_weights
from tempo_lab.memory.simulate import simulate

sys.path.insert(0, str(Path(__file__).parents[1]))
from randprog import compile_program, program_strategy  # noqa: E402

EVERY = 10**9  # a run_all no loop here reaches: every iteration runs


def assert_compression_exact(prog):
    ast, stores, bounds = prog.schedule.ast, prog.memory.storages, prog.bounds
    full_steps, full, full_life, n_full, peak_full, _ = simulate(ast, stores, bounds, EVERY)
    steps, sampled, life, n, peak, _ = simulate(ast, stores, bounds, run_all=2)
    assert full_steps == list(range(n_full))
    assert (n, peak, life) == (n_full, peak_full, full_life)
    assert peak == max(full, default=0)
    for s, b in zip(steps, sampled):
        assert full[s] == b, f"step {s}: {b} sampled, {full[s]} in the full run"


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(program_strategy())
def test_compressed_simulation_equals_the_full_one_on_random_programs(program):
    prog = compile_program(program, config=tl.CompileConfig(executor="xla"))
    assert_compression_exact(prog)


def _windowed(T, window=4):
    ctx = tl.Context(dims=("t",))
    (t,), (T_,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((16,), "float32", domain=(t,))
        x[0] = tl.ones((16,))
        x[t] = x[t - 1] * 0.5 + 1.0
        y = x[tl.max(0, t - window + 1):t + 1].sum(axis=0)
        tl.sink(y, lambda p, v: None)
    return ctx.compile(bounds={T_: T}, outputs={})


@pytest.mark.parametrize("make", [
    lambda: _windowed(300), lambda: _causal(300),
    lambda: _decoder(40, window=None),
    lambda: _decoder(40, window=8)])
def test_compressed_simulation_equals_the_full_one_on_long_loops(make):
    assert_compression_exact(make())


def _decoder(T, window):
    w = make_weights(2, 16, 32)
    tokens = np.random.default_rng(0).standard_normal((T, 16)).astype(np.float32)
    ctx = tl.Context(dims=("n", "t"))
    N, T_ = ctx.bounds
    h = decoder(ctx, w, tokens, 2, window=window)
    return ctx.compile(bounds={N: 2, T_: T}, outputs={"h": h})


def test_the_plan_does_not_grow_with_the_bound():
    """The same statements are simulated at T = 10^3 and 10^9 (no work per step), with the
    same peak: the window's ring does not depend on T."""
    small, huge = _windowed(10**3), _windowed(10**9)
    assert huge.memory.peak_bytes == small.memory.peak_bytes
    assert len(huge.memory.timeline) == len(small.memory.timeline) < 200
    assert huge.memory.sampled and huge.memory.n_steps > 10**9


def _causal(T):
    """A recurrence that reads its whole past: its store grows by a block every 64 steps."""
    ctx = tl.Context(dims=("t",))
    (t,), (T_,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((16,), "float32", domain=(t,))
        r = tl.placeholder((16,), "float32", domain=(t,))
        x[0] = tl.ones((16,))
        x[t] = tl.tanh(r[t - 1] + 0.1)
        r[t] = x[0:t + 1].mean(axis=0)
    return ctx.compile(bounds={T_: T}, outputs={"final": x[T_ - 1]},
                       config=tl.CompileConfig(executor="interpreter", fuse=False))


@pytest.mark.parametrize("make", [lambda: _windowed(5000), lambda: _causal(256)])
def test_the_sampled_timeline_is_the_measured_one(make):
    """At every step the plan simulated, the bytes the interpreter's stores hold."""
    prog = make()
    run = prog.run()
    assert prog.memory.sampled
    assert run.profile.peak_bytes == prog.memory.peak_bytes
    assert len(run.profile.timeline) == prog.memory.n_steps
    assert [run.profile.timeline[s] for s in prog.memory.steps] == prog.memory.timeline


def test_a_schedule_made_by_hand_is_planned_with_its_frees():
    """The scheduler returns its loop AST without frees; the memory stage adds them. A plan
    made from ``schedule_sdg``'s result (as tutorial 03 does) is the pipeline's plan, not one
    that holds every store to the end."""
    from tempo_lab.memory import plan_memory, with_frees
    from tempo_lab.schedule import Free, schedule_sdg

    prog = _causal(64)
    bare = schedule_sdg(prog.sdg, prog.schedule.options)
    assert not bare.freed and not any(isinstance(n, Free) for n in bare.ast.walk())
    freed = with_frees(prog.sdg, bare)
    assert freed.freed and any(isinstance(n, Free) for n in freed.ast.walk())
    assert with_frees(prog.sdg, freed) is freed
    assert plan_memory(prog.sdg, bare, prog.bounds).peak_bytes == prog.memory.peak_bytes


def test_the_plan_says_a_tl_until_store_is_sized_for_its_max():
    """The plan is for a ``tl.until``'s max, and XLA allocates it whole: the plan says so."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.placeholder((16,), domain=(b, t))
        x[b, 0] = tl.from_array(np.ones((4, 16), np.float32), domain=(b,))
        x[b, t] = x[b, t - 1] + 1.0
        done = tl.zeros(()) + t >= 3.0
    prog = ctx.compile(bounds={B: 4, T: tl.until(done, max=1000)}, outputs={"x": x})
    assert prog.memory.peak_bytes > 1000 * 4 * 16 * 4
    assert "sized for the max of tl.until bound T" in prog.memory.pretty()
    assert prog.run().bounds["T"] == 4


def test_a_store_freed_where_the_loop_ends_early_is_freed_there():
    """A store whose last reader is the loop's last step is freed under ``t == T - 1``; where
    that free came before the condition in the loop's body, a loop that ended early saw the
    ``max`` there, skipped it, and held the store for the rest of the run: a measured peak
    of 66 B against the plan's 58 (random programs). The free now waits for the bound."""
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    rng = np.random.RandomState(1791)
    with ctx:
        v0 = tl.from_array(rng.uniform(-1, 1, (1, 2, 3)).astype("float32"), domain=(b, t))
        v1 = tl.from_array(np.float32([0.5, -0.3]), domain=(t,))
        v3 = tl.from_array(np.float32([[0.9, 0.1, 0.2], [0.0, 0.1, 0.2]]), domain=(t,))
        v4 = ((tl.abs(v1[T - 1]) * 4.0).astype("int32") // 3).astype("float32")
        done = v3.max(axis=-1) > 0.5
    prog = ctx.compile(bounds={B: 1, T: tl.until(done, max=2)}, outputs={"v0": v0, "v4": v4},
                       config=tl.CompileConfig(executor="interpreter", incrementalise=True,
                                               vectorise=False, vectorise_budget_bytes=24))
    for executor in ("interpreter", "codegen"):
        run = prog.on(executor).run()
        assert run.bounds["T"] == 1 and run["v4"] == 0.0
        assert run.profile.peak_bytes <= prog.memory.peak_bytes, executor


def _window_sum_read_at_the_end(T, executor, back=2):
    """``y[T - 1] + y[T - back]`` after the loop, ``y`` a window sum of a value of ``t``
    alone (not itself one, so remat does not recompute it at those points)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T_,) = ctx.dims, ctx.bounds
    with ctx:
        v = tl.cos(tl.constant(0.1) * t)
        y = v[tl.max(0, t - 3):t + 1].sum(axis=0)
        z = y[T_ - 1] + y[T_ - back]
    return ctx.compile(bounds={T_: T}, outputs={"z": z},
                       config=tl.CompileConfig(executor=executor, check_invariants=True))


@pytest.mark.parametrize("back", [2, 6])
def test_points_read_after_the_loop_are_held_in_a_ring_of_the_last_steps(executor, back):
    """The last ``back`` steps of ``y`` are what the reads after the loop need: a ring of
    that many holds them (checked against the schedule, as every ring is), where the plan
    stored every ``t`` (4 KB at T = 10^3, 40 MB at 10^7)."""
    v = np.cos(np.float32(0.1) * np.arange(1000, dtype=np.float32))
    y = [v[max(0, k - 3):k + 1].sum() for k in (999, 1000 - back)]
    small = _window_sum_read_at_the_end(1000, executor, back)
    np.testing.assert_allclose(small.run()["z"], y[0] + y[1], rtol=1e-5)
    if small.memory is not None:  # the reference plans none
        huge = _window_sum_read_at_the_end(10**7, executor, back)
        assert small.memory.peak_bytes == huge.memory.peak_bytes < 100
        y_store = next(s for i, s in small.memory.storages.items()
                       if small.sdg.ops[i].kind == "sum")
        assert y_store.slots == (back,)
