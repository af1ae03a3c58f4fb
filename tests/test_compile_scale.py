"""Compiling at realistic size: programs of hundreds of ops (a decoder with its layers written
out, a long chain of ops), bounds up to 10^9, and the memos that let repeated layers share the
isl work (checked to give the same answers as solving every problem)."""
from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tempo_lab as tl
from tempo_lab.demo import make_weights, numpy_decoder
from tempo_lab.examples import op_chain, unrolled_decoder
from tempo_lab.memory import liveness, plan_memory
from tempo_lab.schedule import build, canon

sys.path.insert(0, str(Path(__file__).parent))
from randprog import compile_program, program_strategy  # noqa: E402


def _decoder(layers, steps, window=None, executor="auto", random_tokens=False):
    w = make_weights(layers, 16, 32)
    tokens = np.random.default_rng(1).standard_normal((steps, 16)).astype(np.float32) \
        if not random_tokens else None
    ctx = tl.Context(dims=("t",))
    (T,) = ctx.bounds
    if random_tokens:  # no array over t: a bound of 10^9 needs no data
        with ctx:
            tokens = tl.random.normal((16,), domain=ctx.dims, seed=0)
    y = unrolled_decoder(ctx, w, tokens, 2, window=window)
    prog = ctx.compile(bounds={T: steps}, outputs={"y": y},
                       config=tl.CompileConfig(executor=executor))
    return prog, w, tokens


def _without_memos(monkeypatch):
    monkeypatch.setattr(canon.Keys, "key", lambda self, ops, objects=(): None)


def _frees(prog):
    """Where each store is freed: per op, its last readers with the truth table of each
    condition over small bounds and points (isl may write one set in several equal ways,
    ``T - 2 >= 0`` or ``T - 3 >= 0 | T - 2 == 0``, with and without a memo)."""
    s = prog.schedule
    maps = {e: prog.sdg.isl_map(e) for e in prog.sdg.edges}
    found = liveness.last_reads(prog.sdg, s.order, s.domains, maps)
    return {k: sorted((i, _truth(c)) for i, c in v) for k, v in found.items()}


def _truth(c) -> tuple:
    names = sorted({str(x) for x in c.symbols()})
    ranges = [range(1, 6) if n.isupper() else range(5) for n in names]  # bounds are >= 1
    return tuple(bool(c.evaluate(dict(zip(names, values))))
                 for values in itertools.product(*ranges))


def _slots(prog):
    plan = plan_memory(prog.sdg, prog.schedule, prog.bounds)
    return {i: st.slots for i, st in plan.storages.items()}, plan.peak_bytes


def _same_with_and_without_memos(prog, monkeypatch):
    with_memos = _frees(prog), _slots(prog)
    with monkeypatch.context() as m:
        _without_memos(m)
        assert (_frees(prog), _slots(prog)) == with_memos


@pytest.mark.parametrize("window", [None, 4])
def test_repeated_layers_share_answers_that_solving_each_gives(window, monkeypatch):
    prog, _, _ = _decoder(4, 12, window, executor="interpreter")
    _same_with_and_without_memos(prog, monkeypatch)


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(program_strategy())
def test_memos_on_random_programs(program):
    prog = compile_program(program, config=tl.CompileConfig(executor="interpreter"))
    with pytest.MonkeyPatch.context() as mp:
        _same_with_and_without_memos(prog, mp)


def test_a_decoder_of_hundreds_of_ops_compiles_and_is_right():
    """24 layers written out (about a thousand traced ops, 460 after passes), scheduled by the
    fusion scheduler, against NumPy."""
    prog, w, tokens = _decoder(24, 6, executor="codegen")
    assert len(prog.passes.initial.ops) > 900 and len(prog.sdg.ops) > 400
    assert prog.schedule.method.startswith("fusion")
    np.testing.assert_allclose(prog.run()["y"], numpy_decoder(w, tokens, 2), rtol=2e-4,
                               atol=2e-4)


def test_a_chain_of_a_thousand_ops():
    data = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (T,) = ctx.bounds
    y, twin = op_chain(ctx, 1000, data)
    prog = ctx.compile(bounds={T: 5}, outputs={"y": y},
                       config=tl.CompileConfig(executor="codegen"))
    assert len(prog.passes.initial.ops) > 2000
    np.testing.assert_allclose(prog.run()["y"], twin(data), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("window", [None, 8])
def test_a_decoder_at_a_billion_steps_compiles_with_the_work_of_a_thousand(window):
    """Every stage's work follows the program, not the bound: the same statements (only numbers
    differ: the tile size follows the bound) and simulated steps of the same order at T = 10^3
    and 10^9 (no run: that would take a billion steps)."""
    small = _decoder(2, 10**3, window, executor="codegen", random_tokens=True)[0]
    huge = _decoder(2, 10**9, window, executor="codegen", random_tokens=True)[0]
    def shape(p):
        return re.sub(r"\d+", "N", p.schedule.code())

    assert shape(huge) == shape(small)
    assert len(huge.memory.timeline) < 4 * len(small.memory.timeline)
    assert huge.memory.n_steps > 10**9
    if window:  # the window is a ring: only the output (every step's y) grows with T
        def peak_besides_y(p):
            (y,) = [s for s in p.memory.storages.values() if s.kind == "block"]
            return p.memory.peak_bytes - y.bytes_for((p.bounds["T"],))

        assert peak_besides_y(huge) == peak_besides_y(small)


def test_isl_is_asked_once_per_problem(monkeypatch):
    """isl's schedule and AST are kept by problem text: the same program scheduled again (a
    notebook cell run twice, the program on another executor) does not run isl's scheduler
    again (PPO took 7.6 s of its 13 s compile there, before the fusion scheduler built its
    nest), and gets the same loop nest."""
    from tempo_lab.schedule import schedule_sdg

    calls = []
    real = build._in_child
    monkeypatch.setattr(build, "_in_child", lambda fn, s=None: calls.append(1) or real(fn, s))
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((3,), domain=(t,), name="x")
        x[0] = tl.ones((3,))
        x[t] = x[t - 1] * 0.5 + 1.0
        y = x[0:T].sum(axis=0)
    prog = ctx.compile(bounds={T: 9}, outputs={"y": y})
    options = {"whole_component": 1, "maximize_coincidence": 1}  # a set no other test asks for
    first = schedule_sdg(prog.sdg, options)
    again = schedule_sdg(prog.sdg, options)
    assert len(calls) == 1 and again.code() == first.code()
