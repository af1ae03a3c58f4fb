"""Incrementalisation: a dim too large to vectorise whole is vectorised in blocks along a new
dim. Checked against NumPy on every executor, for the memory it saves (predicted and measured)
and for where it must not apply."""
from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import MEMORY_BUDGET, compile_

import tempo_lab as tl

B, D = 16, 64
X = np.random.default_rng(0).standard_normal((B, D)).astype(np.float32)
MIB = 2**20


def outer_program():
    """A (D, D) value per batch entry, reduced to a scalar: big temporaries, small output."""
    ctx = tl.Context(dims=("b",))
    (b,) = ctx.dims
    with ctx:
        x = tl.from_array(X, (b,))
        y = tl.tanh(x.expand_dims(1) * x.expand_dims(0)).sum(axis=(0, 1))
    return ctx, y, np.tanh(X[:, :, None] * X[:, None, :]).sum((1, 2))


def compile_at_b(ctx, outs, executor="reference", **kw):
    """``outs`` at ``B`` points of the first dim (and 5 of a second)."""
    return compile_(ctx, {ctx.bounds[0]: B, **({ctx.bounds[1]: 5} if len(ctx.bounds) > 1
                                               else {})},
                    outs, executor, check_invariants=True, **kw)


def test_blocks_match_numpy(executor):
    ctx, y, want = outer_program()
    point = D * D * 4
    prog = compile_at_b(ctx, {"y": y}, executor, vectorise_budget_bytes=5 * point)
    assert prog.bounds["B_BLK"] == 4  # the largest divisor of 16 that fits: 4 points a block
    assert [d.name for d in prog.sdg.dims] == ["b_blk"]
    np.testing.assert_allclose(prog.run()["y"], want, rtol=1e-5, atol=1e-3)


def test_blocks_cut_the_store_peak():
    ctx, y, want = outer_program()
    point = D * D * 4
    runs = {}
    for name, kw in (("whole", {}), ("blocks", {"vectorise_budget_bytes": 4 * point})):
        prog = compile_at_b(ctx, {"y": y}, "interpreter", fuse=False, **kw)
        run = prog.run()
        np.testing.assert_allclose(run["y"], want, rtol=1e-5, atol=1e-3)
        runs[name] = (prog.memory.peak_bytes, run.profile.peak_bytes)
    assert runs["blocks"][0] * 3 < runs["whole"][0]   # predicted: 4 of 16 points at a time
    assert runs["blocks"][1] * 3 < runs["whole"][1]   # and measured


def test_outputs_over_a_blocked_dim_keep_their_layout(executor):
    """Outputs over (b, t) come back as (B, T, ...), a dim's value and random numbers over b
    are those of the unblocked program."""
    def build():
        ctx = tl.Context(dims=("b", "t"))
        b, t = ctx.dims
        with ctx:
            x = tl.from_array(np.broadcast_to(X[:, None], (B, 5, D)).copy(), (b, t))
            h = tl.placeholder((D,), domain=(b, t))
            h[b, 0] = x + tl.random.normal((D,), seed=1)
            h[b, t] = tl.tanh(h[b, t - 1] * 0.5 + x) + (tl.zeros(()) + b) * 0.01
            s = (h * h).sum(axis=0)
        return ctx, {"h": h, "s": s}
    ctx, outs = build()
    want = compile_at_b(ctx, outs, vectorise=False, incrementalise=False).run()
    ctx, outs = build()
    prog = compile_at_b(ctx, outs, executor, vectorise_budget_bytes=3 * D * 4)
    assert prog.bounds["B_BLK"] == 8  # blocks of 2
    got = prog.run()
    for k in outs:
        assert got[k].shape == want[k].shape
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-5)


def test_where_it_does_not_apply():
    ctx = tl.Context(dims=("b",))
    (b,) = ctx.dims
    with ctx:
        x = tl.from_array(X, (b,))
        big = tl.exp(x.expand_dims(1) * x.expand_dims(0)).sum(axis=(0, 1))
        centred = (x - x[0:B].mean(axis=0)).sum()           # reduced over all of b
    cases = [({"y": big}, D * D * 4),           # room for one point only: a block of 1
             ({"y": centred}, 4 * D * 4),       # b is reduced whole: no blocks
             ({"y": big}, None)]                # switched off
    for outs, budget in cases:
        kw = {"vectorise_budget_bytes": budget} if budget else {
            "vectorise_budget_bytes": 2 * D * D * 4, "incrementalise": False}
        prog = compile_at_b(ctx, outs, **kw)
        assert "B_BLK" not in prog.bounds and prog.sdg.dims[0].name == "b"
        assert any(op.domain for op in prog.sdg.ops.values())  # b stayed a loop


@pytest.mark.executors(MEMORY_BUDGET, reason="a device memory budget")
def test_a_device_memory_budget_runs_a_dim_too_large_for_it_in_blocks(executor):
    """A value vectorised over ``b`` would take 256 KiB: under a 200 KiB device budget it may
    take half of that, so ``b`` runs in blocks of 4 points and the peak is within the budget
    (unfused, so that the big values are stored)."""
    ctx, y, want = outer_program()
    whole = compile_at_b(ctx, {"y": y}, executor, fuse=False)
    assert whole.memory.peak_bytes > 200 * 2**10 and "B_BLK" not in whole.bounds
    prog = compile_at_b(ctx, {"y": y}, executor, fuse=False, device_memory_budget=200 * 2**10)
    assert prog.config.value_budget == 100 * 2**10 and prog.bounds["B_BLK"] == 4
    run = prog.run()
    np.testing.assert_allclose(run["y"], want, rtol=1e-5, atol=1e-3)
    assert run.profile.peak_bytes == prog.memory.peak_bytes <= 200 * 2**10


def test_a_dim_of_one_point_is_vectorised_whatever_its_point_takes():
    """One batch entry whose values are each over the value budget: batched, the dim holds no
    more than its loop would (at Llama-3.2-1B widths the embedding table's gradient, 1 GB a
    point, had kept the batch dim a loop and every per-entry gradient a store); two entries
    stay a loop."""
    for points, looped in ((1, False), (2, True)):
        ctx = tl.Context(dims=("b",))
        (b,) = ctx.dims
        with ctx:
            x = tl.from_array(X[:points], (b,))
            y = tl.tanh(x.expand_dims(1) * x.expand_dims(0)).sum(axis=(0, 1))
        prog = compile_(ctx, {ctx.bounds[0]: points}, {"y": y}, "reference",
                        vectorise_budget_bytes=D * D * 4 - 1)
        loops = {d.name for op in prog.sdg.ops.values() for d in op.domain}
        assert bool(loops) == looped, loops
        np.testing.assert_allclose(prog.run()["y"], np.tanh(
            X[:points, :, None] * X[:points, None, :]).sum((1, 2)), rtol=1e-5, atol=1e-3)
