"""The pass manager and the clean-up passes: what each pass does, the PassTrace it leaves, the
invariants it keeps, and differential checks of every switch combination against the reference
interpreter with no passes."""
from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import tempo_lab as tl
from tempo_lab.passes import REGISTRY, check_invariants
from tempo_lab.symbolic import Dim

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ is not a package
from budget import examples  # noqa: E402
from randprog import assert_outputs_match, numpy_eval, program_strategy, run_tempo  # noqa: E402
from rt_helpers import COMPILED, DISTINCT_COMPILED, check_vs_reference  # noqa: E402

SWITCHES = tuple(REGISTRY[p].switch for p in tl.CompileConfig().passes)  # every pass
DRAWN = ("remat", "stream", "contract", "tile", "incrementalise")  # drawn, not enumerated
CORE = tuple(s for s in SWITCHES if s not in DRAWN)
NO_PASSES = {s: False for s in SWITCHES}


def config(executor="reference", **switches):
    """Small blocks for tiling; with incrementalisation on, a budget so small that a dim
    vectorises in blocks of a few points."""
    small = {"vectorise_budget_bytes": 24} if switches.get("incrementalise") else {}
    return tl.CompileConfig(executor=executor, check_invariants=True, tile_block=2,
                            **small, **switches)


def all_switches(n: int, combo) -> dict:
    """The core switches as given, the ``DRAWN`` ones drawn from ``n``."""
    rnd = random.Random(n)
    return {**dict(zip(CORE, combo)), **{s: rnd.random() < 0.5 for s in DRAWN}}


def redundant_program():
    """Foldable constants, duplicates, no-op arithmetic and an unused value."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    data = np.arange(12, dtype=np.float32).reshape(6, 2)
    with ctx:
        x = tl.from_array(data, domain=(t,))
        two = tl.constant(np.float32(1.5)) + tl.constant(np.float32(0.5))   # folds to 2
        a = x * two
        b = x * two                      # duplicate of a
        c = (a + b) * tl.ones(()) + tl.zeros(())   # * 1 and + 0 are no-ops
        neg_c = -c
        d = -neg_c                       # double negation
        _unused = tl.exp(x)              # nobody reads it
        y = d.astype("float32").reshape(2)
    want = (data * 2 + data * 2)
    return ctx, {T: 6}, {"y": y}, want


def kinds(sdg):
    return sorted(op.kind for op in sdg.ops.values())


def test_every_pass_is_registered_with_a_switch():
    for name, p in REGISTRY.items():  # but the ragged pass: executors run boxes only
        assert (name, p.switch) == ("ragged", None) or hasattr(tl.CompileConfig(), p.switch)
        assert p.doc


@pytest.mark.executors(("reference", "interpreter"), reason="the reference and one back end")
def test_passes_shrink_the_graph_and_keep_the_result(executor):
    ctx, bounds, outs, want = redundant_program()
    prog = ctx.compile(bounds=bounds, outputs=outs, config=config(executor, fuse=False))
    np.testing.assert_allclose(prog.run()["y"], want)
    before, after = prog.passes.initial, prog.sdg
    assert len(after.ops) < len(before.ops)
    assert "neg" not in kinds(after) and "cast" not in kinds(after)
    assert "reshape" not in kinds(after)
    assert kinds(after).count("mul") == 1          # a and b merged, * 1 dropped
    assert "exp" not in kinds(after)               # _unused: built only if reachable
    consts = [op for op in after.ops.values() if op.kind == "const"]
    assert any(op.attrs["value"].item() == 2.0 for op in consts if op.attrs["value"].ndim == 0)


def test_pass_trace_records_edits_with_provenance():
    ctx, bounds, outs, _ = redundant_program()
    trace = ctx.compile(bounds=bounds, outputs=outs, config=config()).passes
    default = tl.CompileConfig()
    on = [p for p in default.passes if getattr(default, REGISTRY[p].switch)]
    assert [r.name for r in trace.records] == on and "stream" not in on  # opt-in
    fold = next(r for r in trace.records if r.name == "fold")
    folded = [e for e in fold.events if e.kind == "rewritten"]  # in place: readers keep ids
    assert folded and all(e.op in fold.before.ops and fold.after.ops[e.op].kind == "const"
                          for e in folded)
    created = [e for r in trace.records for e in r.events if e.kind == "created"]
    assert all(e.source is None or e.source >= 0 for e in created)
    replaced = [e for r in trace.records for e in r.events if e.kind == "replaced"]
    assert replaced and all(e.source is not None for e in replaced)
    for r in trace.records:
        assert r.seconds >= 0 and len(r.after.ops) == len(r.before.ops) + r.count("created") \
            - r.count("erased")
    assert repr(trace).startswith(f"PassTrace(passes={len(on)}, ops=")
    assert "passes:" in trace.pretty() and "edits:" in trace.pretty()
    assert json.loads(json.dumps(trace.to_dict()))["schema"] == "tempo_lab.passtrace/1"
    assert isinstance(trace._repr_html_(), str)


def test_switches_turn_passes_off():
    ctx, bounds, outs, _ = redundant_program()
    prog = ctx.compile(bounds=bounds, outputs=outs, config=config(**NO_PASSES))
    assert len(prog.passes) == 0 and prog.sdg is prog.passes.initial


def test_invariant_check_catches_a_broken_graph():
    ctx, bounds, outs, _ = redundant_program()
    sdg = ctx.compile(bounds=bounds, outputs=outs, config=config(**NO_PASSES)).sdg
    check_invariants(sdg, "none")
    from tempo_lab.ir.sdg import SDG, Edge

    e = next(e for e in sdg.edges if e.index)
    broken = SDG(sdg.dims, sdg.ops.values(),
                 [Edge(e.dst, e.src, e.slot, e.index + e.index, e.cond, e.loc)]
                 + [x for x in sdg.edges if x is not e], sdg.outputs, sdg.sinks)
    with pytest.raises(tl.TempoLabError, match="after pass 'broken'"):
        check_invariants(broken, "broken")


def test_duplicate_elimination_keeps_distinct_reads_apart():
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    data = np.arange(5, dtype=np.float32)
    with ctx:
        x = tl.from_array(data, domain=(t,))
        a = x[tl.max(0, t - 1)] * 2.0
        b = x[t] * 2.0                   # same op on another point: not a duplicate
        y = a + b
    prog = ctx.compile(bounds={T: 5}, outputs={"y": y}, config=config(fuse=False))
    assert kinds(prog.sdg).count("mul") == 2
    want = data[np.maximum(0, np.arange(5) - 1)] * 2 + data * 2
    np.testing.assert_allclose(prog.run()["y"], want)



def test_a_placeholder_with_one_branch_is_its_branch():
    """Simplification forwards ``p`` to its only branch, so ``exp(p)`` and ``exp(x + x)``
    become duplicates (the branch, unnamed, takes the name ``p``); a same-point cycle is left
    for the scheduler to report as written."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    data = np.arange(8, dtype=np.float32).reshape(4, 2) * 0.1
    with ctx:
        x = tl.from_array(data, domain=(t,))
        p = tl.placeholder((2,), domain=(t,), name="p")
        y = tl.exp(p) + tl.exp(x + x)
        p[t] = x + x
    prog = ctx.compile(bounds={T: 4}, outputs={"y": y}, config=config(fuse=False))
    assert kinds(prog.sdg).count("exp") == 1 and "merge" not in kinds(prog.sdg)
    assert [op.kind for op in prog.sdg.ops.values() if op.name == "p"] == ["add"]
    np.testing.assert_allclose(prog.run()["y"], 2 * np.exp(2 * data), rtol=1e-6)
    with ctx:
        q = tl.placeholder((), domain=(t,), name="q")
        r = tl.placeholder((), domain=(t,), name="r")
        q[t] = r[t] + 1.0
        r[t] = q[t] * 2.0
    with pytest.raises(tl.ScheduleError, match=r"\bq\b"):
        ctx.compile(bounds={T: 4}, outputs={"q": q}, config=config("interpreter"))


@pytest.mark.executors(COMPILED, reason="the schedule of the pass's result")
def test_a_read_at_a_constant_point_reads_only_the_branches_that_hold_there(executor):
    """PPO's shape in small: parameters ``w[i, m]`` updated once per minibatch ``m``, a rollout
    over ``t`` acting with ``w[i, 0]``, the updates reading the rollout. Read whole, ``w`` and
    the rollout would be one cycle of ops at each ``i`` that no loop over one dim runs (isl's
    scheduler had to take it); the read at ``m = 0`` reads a placeholder over ``i`` with the
    two branches that hold there, and the fusion scheduler builds the nest. Values are the
    reference's."""
    ctx = tl.Context(dims=("i", "m", "t"))
    (i, m, t), (NI, M, T) = ctx.dims, ctx.bounds
    xs = np.linspace(0.1, 0.9, 5, dtype=np.float32)
    with ctx:
        x = tl.from_array(xs, domain=(t,))
        w = tl.placeholder((), domain=(i, m), name="w")
        h = tl.placeholder((), domain=(i, t), name="h")
        h[i, 0] = x[0] * w[i, 0]
        h[i, t] = tl.tanh(h[i, t - 1] * w[i, 0] + x[t])
        g = w[i, m] * 0.5 + h[i, 0:T].sum()
        w[0, 0] = np.float32(1.0)
        w[(i >= 1) & tl.eq(m, 0)] = w[i - 1, M - 1] - 0.1 * g[i - 1, M - 1]
        w[i, m] = w[i, m - 1] - 0.1 * g[i, m - 1]
    bounds = {NI: 3, M: 2, T: 5}
    prog = ctx.compile(bounds=bounds, outputs={"w": w}, config=config(executor))
    assert prog.schedule.method.startswith("fusion")
    at = [op for op in prog.sdg.ops.values() if op.attrs.get("at") == (("m", 0),)]
    assert [(op.name, op.kind, [d.name for d in op.domain]) for op in at] == [("w", "merge", ["i"])]
    want = ctx.compile(bounds=bounds, outputs={"w": w}, config=config()).run()["w"]
    np.testing.assert_allclose(prog.run()["w"], want, rtol=1e-6)
    off = ctx.compile(bounds=bounds, outputs={"w": w}, config=config(executor, simplify=False))
    assert off.schedule.method.startswith("isl")


def test_a_sum_over_a_middle_vectorised_dim(executor):
    """Vectorised over (i, b, t), a reduction over all of b reads b's axis where it sits, in
    the middle of the producer's leading axes (it used to be taken as the first)."""
    ctx = tl.Context(dims=("i", "b", "t"))
    (i, _, t), bounds = ctx.dims, dict(zip(ctx.bounds, (2, 3, 4)))
    data = np.arange(24 * 2, dtype=np.float32).reshape(2, 3, 4, 2)
    with ctx:
        x = tl.exp(tl.from_array(data, domain=ctx.dims) * 0.01)
        y = x[i, 0:ctx.bounds[1], t].sum(axis=0)
    prog = ctx.compile(bounds=bounds, outputs={"y": y}, config=config(executor))
    assert prog.sdg.ops[prog.sdg.outputs["y"]].attrs["vdims"] == ("i", "t")
    np.testing.assert_allclose(prog.run()["y"], np.exp(data * 0.01).sum(axis=1), rtol=1e-6)

@pytest.mark.parametrize("order", [("s", "k"), ("k", "s")])
def test_a_dim_read_whole_after_a_range_of_a_loop_is_batched(executor, order):
    """Each slot ``k`` of step ``s`` gathers from every slot of the steps before
    (``state[0:s, 0:K]``, a tree level by level): ``k`` is batched, the loop over ``s``
    stays. Read whole *before* the other range (``state[0:K, 0:s]``), batching ``k`` would
    put its axis after the range's, so ``k`` stays a loop; both equal NumPy."""
    S, K = 5, 4
    rs = np.random.RandomState(0)
    data = rs.randn(S, K, 3).astype(np.float32)
    src_s = np.array([[rs.randint(0, max(s, 1)) for _ in range(K)] for s in range(S)])
    src_k = rs.randint(0, K, size=(S, K))
    want = data.copy()
    for s in range(1, S):
        want[s] = 0.5 * data[s] + np.tanh(want[src_s[s], src_k[s]])
    ctx = tl.Context(dims=order)
    dims = dict(zip(order, ctx.dims))
    s_, k_ = dims["s"], dims["k"]
    bound = dict(zip(order, ctx.bounds))
    lay = (lambda a: a) if order == ("s", "k") else (lambda a: np.swapaxes(a, 0, 1))
    with ctx:
        x = tl.from_array(lay(data), domain=ctx.dims)
        ps, pk = (tl.from_array(lay(a), domain=ctx.dims) for a in (src_s, src_k))
        state = tl.placeholder((3,), "float32", ctx.dims, "state")
        first = {s_: 0, k_: k_}
        state[tuple(first[d] for d in ctx.dims)] = x[tuple(first[d] for d in ctx.dims)]
        whole = {s_: slice(0, s_), k_: slice(0, bound["k"])}
        earlier = state[tuple(whole[d] for d in ctx.dims)]
        at = (ps, pk) if order == ("s", "k") else (pk, ps)
        state[ctx.dims] = 0.5 * x + tl.tanh(tl.take(earlier, at))
    prog = ctx.compile(bounds={bound["s"]: S, bound["k"]: K}, outputs={"y": state[ctx.dims]},
                       config=config(executor))
    vd = prog.sdg.ops[prog.sdg.outputs["y"]].attrs.get("vdims", ())
    assert ("k" in vd) == (order == ("s", "k")) and "s" not in vd
    np.testing.assert_allclose(lay(prog.run()["y"]), want, rtol=1e-5, atol=1e-6)


def test_the_ops_off_a_recurrence_are_batched_over_its_dim(executor):
    """A forward recurrence over t (h), a per-step network off it (y), and a backward
    recurrence reading y (g, GAE's shape): t stays a loop for h and g while y runs once,
    batched over all of t, reading h's whole range; g reads y through a per-point view."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    x0 = np.random.default_rng(0).normal(size=(3, 5, 4)).astype(np.float32)
    w = np.random.default_rng(1).normal(size=(4, 4)).astype(np.float32) * 0.5
    with ctx:
        x = tl.from_array(x0, domain=(b, t))
        h = tl.placeholder((4,), "float32", (b, t), "h")
        h[b, 0] = x
        h[b, t] = tl.tanh(h[b, t - 1] + x)
        y = tl.lift(lambda v: (jnp_tanh(v @ w)).sum())(h)
        g = tl.placeholder((), "float32", (b, t), "g")
        g[b, T - 1] = y
        g[b, t] = y + 0.5 * g[b, t + 1]
    prog = ctx.compile(bounds={B: 3, T: 5}, outputs={"g": g, "y": y},
                       config=config(executor, vectorise_groups=True))
    hs = x0.copy()
    for k in range(1, 5):
        hs[:, k] = np.tanh(hs[:, k - 1] + x0[:, k])
    ys = np.tanh(hs @ w).sum(-1)
    gs = np.zeros_like(ys)
    for k in reversed(range(5)):
        gs[:, k] = ys[:, k] + (0.5 * gs[:, k + 1] if k < 4 else 0)
    run = prog.run()
    np.testing.assert_allclose(run["y"], ys, rtol=1e-5)
    np.testing.assert_allclose(run["g"], gs, rtol=1e-5)
    vd = {op.name or op.kind: op.attrs.get("vdims", ()) for op in prog.sdg.ops.values()}
    assert vd["h"] == ("b",) and vd["g"] == ("b",)
    lifted = [op for op in prog.sdg.ops.values() if "t" in op.attrs.get("vdims", ())
              and Dim("t") not in op.domain]
    assert any("lift" in (op.kind, *(m.kind for m, _ in op.attrs.get("body", ())))
               for op in lifted)
    off = ctx.compile(bounds={B: 3, T: 5}, outputs={"g": g},
                      config=config(executor, vectorise_groups=False))
    assert not any("t" in op.attrs.get("vdims", ()) for op in off.sdg.ops.values())
    np.testing.assert_allclose(off.run()["g"], gs, rtol=1e-5)


def test_a_reader_outside_the_loop_sees_the_batched_axis_at_its_size(executor):
    """A recurrence keeps t a loop while the ops off it are batched over t; a reader outside
    the loop takes such an op's whole range (``x[0:T].transpose()``): its type has the bound
    where the batched value it reads has the bound's value, the same shape for a bound that
    no run changes. The invariant check compares types with those values written in; it
    found ``float32[1, T]`` from an input of ``float32[1, 2]`` (a random program)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    x0 = np.random.default_rng(3).uniform(-1, 1, (2, 1)).astype(np.float32)
    with ctx:
        x = tl.from_array(x0, domain=(t,))
        y = (x * 2.0)[0:T].transpose(1, 0).max(axis=(1,))
        h = tl.placeholder((), "float32", (t,), "h")
        h[t < 1] = x[0].mean(axis=-1)
        h[t + 1] = h[t] * 0.5
    prog = ctx.compile(bounds={T: 2}, outputs={"y": y, "h": h},
                       config=config(executor, vectorise_groups=True))
    run = prog.run()
    np.testing.assert_allclose(run["y"], (x0 * 2).max(axis=0), rtol=1e-6)
    np.testing.assert_allclose(run["h"], x0[0, 0] * np.float32([1, 0.5]), rtol=1e-6)


def test_an_op_reads_a_batched_value_and_a_looped_range_of_one_size(executor):
    """Group vectorisation batches one branch's reads over t and leaves a range read of
    another (``v0[0:A, 0:T]``) as it was: their product outside the loop meets a batched
    axis of 6 and a range of T, one size at T = 6 (the invariant check found
    ``float32[2, A, 6]`` from ``float32[2, A, T]``: a random program)."""
    ctx = tl.Context(dims=("a", "b", "t"))
    (a, _, t), (A, B, T) = ctx.dims, ctx.bounds
    x0 = np.random.RandomState(43457).uniform(-1, 1, (2, 6, 2)).astype(np.float32)
    with ctx:
        v0 = tl.from_array(x0, domain=(a, t))
        v1 = tl.tanh(tl.where(t < 2, v0[a, t:T].transpose(1, 0).max(axis=(1,)),
                              v0[0:A, 0:T].transpose(2, 0, 1).max(axis=(1, 2))))
        v2 = tl.where(a < 1, v1[0:A, tl.max(0, t - 2):t + 1].mean(axis=(0, 1)),
                      ((v1[0:A, T - 1].sum(axis=0) * 4.0).astype("int32") % 3
                       ).astype("float32"))
        (d_v0,) = tl.grad(v1.sum(axis=-1), [v0])
    check_vs_reference(ctx, {A: 2, B: 1, T: 6}, {"v2": v2, "d_v0": d_v0}, executor,
                       check_invariants=True, vectorise_groups=True)


@pytest.mark.executors(COMPILED, reason="where the schedule runs the view")
def test_a_per_point_view_runs_in_the_backward_loop_that_reads_it(executor):
    """GAE's shape: a value batched over t (y) that a backward recurrence (g) reads through a
    per-point view. The view's points stand alone, so it runs in g's backward loop instead of
    a forward loop of its own (one loop over t, not two: in PPO that loop of 250 steps cost a
    fifth of an iteration)."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    x0 = np.random.default_rng(0).normal(size=(16,)).astype(np.float32)
    with ctx:
        y = tl.tanh(tl.from_array(x0, domain=(t,)) * 2.0)
        g = tl.placeholder((), "float32", (t,), "g")
        g[T - 1] = y
        g[t] = y + 0.5 * g[t + 1]
    prog = ctx.compile(bounds={T: 16}, outputs={"g": g},
                       config=config(executor, vectorise_groups=True))
    ys, gs = np.tanh(x0 * 2.0), np.zeros(16, np.float32)
    for k in reversed(range(16)):
        gs[k] = ys[k] + (0.5 * gs[k + 1] if k < 15 else 0)
    np.testing.assert_allclose(prog.run()["g"], gs, rtol=1e-5)
    assert any("t" in op.attrs.get("vdims", ()) for op in prog.sdg.ops.values())  # y
    assert len(prog.lowered.loops) == 1, prog.schedule.pretty()


def _rnn_over_b_t():
    """An RNN's context over ``(b, t)`` (3 x 6 points), its input ``x`` (4 features), input
    and recurrent weights ``w`` and ``u``: their arrays and tensors."""
    ctx = tl.Context(dims=("b", "t"))
    rs = np.random.RandomState(4)
    arrays = (rs.randn(3, 6, 4).astype(np.float32), rs.randn(4, 4).astype(np.float32),
              rs.randn(4, 4).astype(np.float32) * 0.5)
    with ctx:
        tensors = (tl.from_array(arrays[0], domain=ctx.dims), tl.constant(arrays[1]),
                   tl.constant(arrays[2]))
    return ctx, ctx.dims, ctx.bounds, arrays, tensors


@pytest.mark.executors(DISTINCT_COMPILED, reason="one back end per set of capabilities")
def test_an_input_projection_read_only_by_later_steps_is_batched(executor):
    """An RNN's ``x[t] @ w`` feeds only the steps t >= 1 (step 0 is its own branch). It has
    no looped input, so computing it at t = 0 too is safe: it leaves the loop as one matmul.
    A ``max`` read only by later steps stays in the loop (at t = 0 its range is empty)."""
    ctx, (b, t), (B, T), (x0, w0, u0), (x, w, u) = _rnn_over_b_t()
    with ctx:
        h = tl.placeholder((4,), "float32", (b, t), "h")
        h[b, 0] = tl.tanh(x[b, 0] @ w)
        h[b, t] = tl.tanh(x[b, t] @ w + h[b, t - 1] @ u + x[b, 0:t].max(axis=0))
    prog = ctx.compile(bounds={B: 3, T: 6}, outputs={"h": h},
                       config=config(executor, vectorise_groups=True))
    batched = [op for op in prog.sdg.ops.values() if "t" in op.attrs.get("vdims", ())]
    assert any(op.kind == "matmul" or "matmul" in [m.kind for m, _ in op.attrs.get("body", ())]
               for op in batched)
    assert not any(op.kind == "max" for op in batched)
    want = np.zeros((3, 6, 4), np.float32)
    want[:, 0] = np.tanh(x0[:, 0] @ w0)
    for k in range(1, 6):
        want[:, k] = np.tanh(x0[:, k] @ w0 + want[:, k - 1] @ u0 + x0[:, :k].max(axis=1))
    np.testing.assert_allclose(prog.run()["h"], want, rtol=1e-5, atol=1e-5)


def test_a_read_at_one_point_of_a_batched_op_takes_it_from_the_batch(executor):
    """A bidirectional RNN's boundary steps read the batched input projection at t = 0 and
    t = T - 1: each takes its point out of the batch where it is read. Through the per-point
    view, the point was a statement of a loop over t of its own, with the view's index
    stored at every step (three loops, not the two recurrences)."""
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    rs = np.random.RandomState(7)
    x0 = rs.randn(3, 6, 4).astype(np.float32)
    w0, u0, v0 = (rs.randn(4, 4).astype(np.float32) * 0.5 for _ in range(3))
    with ctx:
        x = tl.from_array(x0, domain=(b, t))
        w, u, v = tl.constant(w0), tl.constant(u0), tl.constant(v0)
        f = tl.placeholder((4,), "float32", (b, t), "f")
        f[b, 0] = tl.tanh(x[b, 0] @ w)
        f[b, t] = tl.tanh(x[b, t] @ w + f[b, t - 1] @ u)
        g = tl.placeholder((4,), "float32", (b, t), "g")
        g[b, T - 1] = tl.tanh(x[b, T - 1] @ v)
        g[b, t] = tl.tanh(x[b, t] @ v + g[b, t + 1] @ u)
        y = f[b, T - 1] + g[b, 0]
    prog = ctx.compile(bounds={B: 3, T: 6}, outputs={"y": y},
                       config=config(executor, vectorise_groups=True))
    fs, gs = np.zeros_like(x0), np.zeros_like(x0)
    fs[:, 0], gs[:, 5] = np.tanh(x0[:, 0] @ w0), np.tanh(x0[:, 5] @ v0)
    for k in range(1, 6):
        fs[:, k] = np.tanh(x0[:, k] @ w0 + fs[:, k - 1] @ u0)
        gs[:, 5 - k] = np.tanh(x0[:, 5 - k] @ v0 + gs[:, 6 - k] @ u0)
    np.testing.assert_allclose(prog.run()["y"], fs[:, 5] + gs[:, 0], rtol=1e-5, atol=1e-5)
    if executor == "reference":
        return
    taken = [ev.note for p in prog.passes for ev in p.events if "taken from the batch" in ev.note]
    assert any("t = 0" in n for n in taken) and any("t = T - 1" in n for n in taken), taken
    assert len(prog.lowered.loops) == 2, prog.schedule.pretty()


def test_an_index_value_only_the_batch_reads_is_batched_with_it(executor):
    """``0.1 * t + 1`` read only by the batched projection off the recurrence, at its own
    point: it joins the batch (an array of the steps' values), where left in the loop it
    was stored at every step by a loop of its own for the batch to read whole."""
    from tempo_lab.schedule import For
    ctx, (b, t), (B, T), (x0, w0, u0), (x, w, u) = _rnn_over_b_t()
    with ctx:
        p = (x * (tl.constant(0.1) * t + 1.0)) @ w
        h = tl.placeholder((4,), "float32", (b, t), "h")
        h[b, 0] = tl.tanh(p[b, 0])
        h[b, t] = tl.tanh(p[b, t] + h[b, t - 1] @ u)
    prog = ctx.compile(bounds={B: 3, T: 6}, outputs={"h": h},
                       config=config(executor, vectorise_groups=True))
    pw = np.stack([(x0[:, k] * (0.1 * k + 1.0)) @ w0 for k in range(6)], 1)
    want = np.zeros((3, 6, 4), np.float32)
    want[:, 0] = np.tanh(pw[:, 0])
    for k in range(1, 6):
        want[:, k] = np.tanh(pw[:, k] + want[:, k - 1] @ u0)
    np.testing.assert_allclose(prog.run()["h"], want, rtol=1e-5, atol=1e-6)
    if executor != "reference":  # it runs the SDG: no schedule
        assert sum(isinstance(n, For) for n in prog.schedule.ast.walk()) == 1


@pytest.mark.executors(DISTINCT_COMPILED, reason="one back end per set of capabilities")
def test_an_op_read_at_one_point_of_the_recurrence_stays_at_that_point(executor):
    """``exp(x)`` off a recurrence whose only reader wants ``T - 1``: it is computed there,
    as without groups, not batched over every step and held for all of them (memory growing
    with ``T`` for one value; a projection that every step but the first reads is batched:
    ``test_an_input_projection_read_only_by_later_steps_is_batched``)."""
    def build(T_):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.placeholder((), domain=(t,), name="x")
            x[0] = tl.zeros(())
            x[t] = x[t - 1] * 0.5 + 1.0
            y = tl.exp(x * 0.1)
        return ctx.compile(bounds={T: T_}, outputs={"last": y[T - 1]},
                           config=config(executor, vectorise_groups=True))
    small, big = build(8), build(1000)
    xs = [0.0]
    for _ in range(7):
        xs.append(xs[-1] * 0.5 + 1.0)
    np.testing.assert_allclose(small.run()["last"], np.exp(xs[-1] * 0.1), rtol=1e-6)
    assert not any("t" in op.attrs.get("vdims", ()) for op in small.sdg.ops.values())
    assert small.memory.peak_bytes == big.memory.peak_bytes


def _windowed_noise(T_, executor="auto"):
    """Noise over ``t`` that a recurrence reads through a window of 4 steps (and its first
    step at ``t = 0``): made from the step's index alone, nothing else held for every step."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        z = tl.random.normal((), domain=(t,))
        y = z[tl.max(0, t - 3):t + 1].sum(axis=0)
        x = tl.placeholder((), domain=(t,), name="x")
        x[0] = y
        x[t] = x[t - 1] * 0.5 + y
    return ctx.compile(bounds={T: T_}, outputs={"last": x[T - 1]},
                       config=config(executor, vectorise_groups=True))


def test_noise_read_through_a_window_stays_in_the_loop_and_its_plan_is_flat():
    """Batched over all of ``t``, the noise and its steps' indices were held for every step,
    8 B a step (8 MB at 10^6 steps, against 40 B at 10^8, where the batch no longer fit the
    value budget): memory that only the batch made grow with ``T``. In the loop, a ring of 4
    holds it at every bound."""
    small, big = _windowed_noise(10**3), _windowed_noise(10**6)
    assert small.memory.peak_bytes == big.memory.peak_bytes < 100
    assert not any("t" in op.attrs.get("vdims", ()) for op in big.sdg.ops.values())
    notes = [e.note for r in big.passes.records if r.name == "vectorise" for e in r.events]
    assert any("stays in the loop over t: made from t's index alone" in n for n in notes)


@pytest.mark.executors(DISTINCT_COMPILED, reason="one back end per set of capabilities")
def test_noise_kept_in_the_loop_gives_the_reference_results(executor):
    want = _windowed_noise(40, "reference").run()["last"]
    np.testing.assert_allclose(_windowed_noise(40, executor).run()["last"], want, rtol=1e-5)


def test_every_final_op_traces_back_to_the_line_that_wrote_it():
    """``PassTrace.origin`` follows new ops to what they were made from and ids through the
    renumbering passes do (group vectorisation renumbers): each final op comes from an op of
    the initial SDG written on its own line, also after a save and load."""
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,), name="x")
        x[0] = tl.ones((3,))
        x[t] = x[t - 1] * 0.5 + 1.0
        a = x * (tl.constant(2.0) * tl.constant(3.0))
        y = tl.exp(a) + 1.0
        out = y.sum()
    prog = ctx.compile(bounds={T: 6}, outputs={"out": out},
                       config=tl.CompileConfig(vectorise_groups=True))
    assert any(r.name == "vectorise" and r.count("rewritten") for r in prog.passes.records)
    back = tl.load(json.loads(json.dumps(prog.to_dict()))).passes  # as tl.save writes it
    for trace in (prog.passes, back):
        for i, op in trace.final.ops.items():
            o = trace.origin(i)
            assert o is not None and trace.initial.ops[o].loc == op.loc, (i, op, o)
    for bad in (len(prog.sdg.ops) + 5, -1, "x", True):
        with pytest.raises(tl.ArgumentError, match="an op of the final SDG") as e:
            prog.passes.origin(bad)
        assert e.value.loc.file == __file__


def jnp_tanh(v):
    import jax.numpy as jnp

    return jnp.tanh(v)


@pytest.mark.executors(("reference", "interpreter"), reason="the reference and one back end")
def test_fusion_runs_a_chain_as_one_op(executor):
    ctx, bounds, outs, want = redundant_program()
    prog = ctx.compile(bounds=bounds, outputs=outs, config=config(executor))
    np.testing.assert_allclose(prog.run()["y"], want)
    fused = [op for op in prog.sdg.ops.values() if op.kind == "fused"]
    assert len(fused) == 1
    assert [m.kind for m, _ in fused[0].attrs["body"]] == ["mul", "add"]   # (a + b) after cse
    assert kinds(prog.sdg) == ["const", "from_array", "fused"]
    fuse = next(r for r in prog.passes.records if r.name == "fuse")
    assert fuse.count("rewritten") == 1 and fuse.count("erased") == 1


@pytest.mark.parametrize("n, combo", list(enumerate(itertools.product([False, True],
                                                                        repeat=len(CORE)))),
                         ids=lambda c: "".join("1" if x else "0" for x in c)
                         if isinstance(c, tuple) else str(c))
def test_every_switch_combination_on_a_recurrence(n, combo):
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    B, T = ctx.bounds
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(b, t))
        x[b, 0] = tl.ones((3,)) * (tl.constant(np.float32(0.5)) * 2.0)
        x[b, t] = tl.tanh(x[b, t - 1] * 1.0 + 0.0) + x[b, t - 1] * 0.5
        y = x[b, 0:t + 1].sum(axis=0) + x[b, tl.max(0, t - 2):t + 1].mean(axis=0)
    want = ctx.compile(bounds={B: 4, T: 6}, outputs={"y": y},
                       config=config(**NO_PASSES)).run()["y"]
    got = ctx.compile(bounds={B: 4, T: 6}, outputs={"y": y},
                      config=config("interpreter", **all_switches(n, combo))).run()["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@settings(max_examples=examples(25), deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(program_strategy())
def test_random_programs_under_every_switch_combination(program):
    want = numpy_eval(program)
    for n, combo in enumerate(itertools.product([False, True], repeat=len(CORE))):
        got = run_tempo(program, config=config(**all_switches(n, combo)))
        assert_outputs_match(program, got, what=f"reference with passes {combo}")
    got = run_tempo(program, config=config("interpreter"))
    assert_outputs_match(program, got, what="interpreter with all passes")
    assert want.keys() >= set(program.outputs)
