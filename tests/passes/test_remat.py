"""Rematerialisation of index functions (passes/remat.py) and their placement in their readers'
loop (schedule/fusion.py): same results, memory that does not grow with the bound."""
import numpy as np
import pytest
from rt_helpers import table_program

import tempo_lab as tl
from tempo_lab.ir.sdg import index_functions


def test_a_table_of_t_is_recomputed_in_the_loop_and_gives_the_same_result(executor):
    ctx, outs, _ = table_program()
    N, T = ctx.bounds
    bounds = {N: 2, T: 50}
    want = ctx.compile(bounds=bounds, outputs=outs,
                       config=tl.CompileConfig(executor="reference")).run()
    for remat in (True, False):
        got = ctx.compile(bounds=bounds, outputs=outs, config=tl.CompileConfig(
            executor=executor, remat=remat, check_invariants=True)).run()
        for k in outs:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("groups", [False, True])
def test_the_table_is_not_stored_over_t(groups):
    """Nor when the ops off the recurrence are batched (``vectorise_groups``): a value of
    ``t`` alone stays in the loop rather than join a batch held for every step."""
    ctx, outs, table = table_program()
    N, T = ctx.bounds
    outs = {"last": outs["last"]}
    on, off = (ctx.compile(bounds={N: 2, T: 4096}, outputs=outs,
                           config=tl.CompileConfig(remat=r, vectorise_groups=groups))
               for r in (True, False))
    assert not any(s.kind == "block" for s in on.memory.storages.values())
    assert any(s.kind == "block" and "t" in s.dims for s in off.memory.storages.values())
    assert on.memory.peak_bytes < off.memory.peak_bytes / 10
    notes = [e.note for r in on.passes.records if r.name == "remat" for e in r.events]
    assert any("recomputed over (i, t)" in n for n in notes)


def test_index_functions_are_dim_values_and_what_is_computed_from_them_alone():
    ctx, outs, table = table_program()
    sdg = ctx.compile(bounds={ctx.bounds[0]: 2, ctx.bounds[1]: 8}, outputs=outs
                      ).passes.records[0].before  # as traced
    cheap = index_functions(sdg)
    kinds = {sdg.ops[i].kind for i in cheap}
    assert {"dimval", "cos"} <= kinds
    assert not any(sdg.ops[i].name == "h" for i in cheap)  # a recurrence is not


@pytest.mark.parametrize("groups", [False, True])
def test_windowed_llama_decode_memory_is_flat_up_to_a_million_steps(groups):
    """The RoPE tables, the step index and the prompt test used to be computed for every step
    up front; now the plan grows only by the generated tokens (an output, 4 bytes a step),
    with the ops off the recurrence batched too (they held 12 MB at 10^6 steps)."""
    model = tl.nn.Llama(vocab=64, embed=16, layers=2, heads=2, kv_heads=1, hidden=32,
                        window=8)
    params = model.init(0)
    peaks = {}
    for steps in (10**3, 10**6):
        ctx = tl.Context(dims=("n", "t"))
        n, t = ctx.dims
        N, T = ctx.bounds
        with ctx:
            ids, _ = model.generate(params, tl.constant(np.arange(4, dtype=np.int32)), t, n)
        prog = ctx.compile(bounds={N: 2, T: steps}, outputs={"ids": ids},
                           config=tl.CompileConfig(vectorise_groups=groups))
        out = prog.memory.storages[prog.sdg.outputs["ids"]]  # (the prompt's copy is "ids" too)
        peaks[steps] = prog.memory.peak_bytes - out.bytes_for((steps,))
    assert peaks[10**6] <= 1.05 * peaks[10**3] + 64 * 4


def test_a_value_of_t_read_at_several_points_after_the_loop_is_not_stored(executor):
    """``y[T - 1] + y[T - 2]`` of ``y = sin(t * 0.01)``: each point is recomputed where it is
    read, so the plan does not grow with ``T`` (it stored every ``t`` with two reads)."""
    def program():
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            y = tl.sin((tl.zeros((4,)) + t) * 0.01)
            z = y[T - 1] + y[T - 2] + y[0]
        return ctx, T, z

    peaks = []
    for n in (1_000, 1_000_000):
        ctx, T, z = program()
        prog = ctx.compile(bounds={T: n}, outputs={"z": z},
                           config=tl.CompileConfig(executor=executor, check_invariants=True))
        peaks.append(prog.memory.peak_bytes if prog.memory else 0)  # the reference plans none
        want = np.sin(np.float32(0.01) * np.float32([n - 1, n - 2, 0])).sum()
        np.testing.assert_allclose(prog.run()["z"], np.full(4, want, np.float32), rtol=1e-5)
    assert peaks[0] == peaks[1] < 100, peaks
