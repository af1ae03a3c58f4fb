"""The tiling pass: reductions over a range that grows with ``t`` run over static blocks. Every
case is checked against NumPy (never against tempo_lab) on each executor, with block sizes that
do and do not divide the range, and the cases it must leave alone are checked to stay as
they are."""
from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import compile_

import tempo_lab as tl
from tempo_lab.passes.tile import auto_block

T = 11
RNG = np.random.default_rng(0)
X = RNG.standard_normal((T, 3)).astype(np.float32)
Q = RNG.standard_normal((T, 2, 4)).astype(np.float32)
K = RNG.standard_normal((T, 2, 4)).astype(np.float32)
V = RNG.standard_normal((T, 2, 3)).astype(np.float32)


def compile_tiled(ctx, outputs, executor="reference", block=4, **kw):
    """``outputs`` at ``T`` points of the last dim, in tiles of ``block`` where tiling applies."""
    return compile_(ctx, {ctx.bounds[-1]: T}, outputs, executor, check_invariants=True,
                    tile_block=block, **kw)


def tiled(prog) -> bool:
    rec = next(r for r in prog.passes.records if r.name == "tile")
    return rec.count("created") > 0


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("block", [3, 4, 16])
def test_reductions_over_blocks_match_numpy(executor, block):
    wmat = RNG.standard_normal((3, 2)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.from_array(X, (t,))
        w = tl.constant(wmat)
        outs = {"sum": (x[0:t + 1] * 2.0).sum(axis=0),
                "max": tl.exp(x[0:t + 1]).max(axis=(0, 1)),
                "min": (x[0:t + 1] @ w).min(axis=0, keepdims=True),
                "dot": tl.tanh(x[0:t + 1]).transpose() @ x[0:t + 1]}
    want = {"sum": np.stack([2 * X[:i + 1].sum(0) for i in range(T)]),
            "max": np.stack([np.exp(X[:i + 1]).max() for i in range(T)]),
            "min": np.stack([(X[:i + 1] @ wmat).min(0, keepdims=True) for i in range(T)]),
            "dot": np.stack([np.tanh(X[:i + 1]).T @ X[:i + 1] for i in range(T)])}
    prog = compile_tiled(ctx, outs, executor, block)
    assert tiled(prog) == (block < T)
    if block < T:
        assert prog.bounds["T_TILE"] == -(-T // block)
        assert "t_tile" in [d.name for d in prog.sdg.dims]
    run = prog.run()
    for name, w_ in want.items():
        np.testing.assert_allclose(run[name], w_, rtol=1e-5, atol=1e-5, err_msg=name)


def _attention_program(kind: str):
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        q, k, v = (tl.from_array(a, (t,)) for a in (Q, K, V))
        if kind == "nn":  # tl.nn.attention: (heads, steps) scores, weights as the left operand
            return ctx, tl.nn.attention(q, k, v, t) * 1.0
        keys, values = k[0:t + 1], v[0:t + 1]                       # (steps, heads, d)
        s = tl.sum(keys * q.expand_dims(0), axis=-1).transpose() * 0.5   # (heads, steps)
        if kind == "values_left":  # weights as the right operand: v^T @ w^T
            w = tl.softmax(s, axis=-1).transpose()                   # (steps, heads)
            return ctx, (values.transpose(1, 2, 0) @ w.transpose().expand_dims(2)).squeeze(2)
        w = tl.softmax(s, axis=1)
        return ctx, (w.expand_dims(1) @ values.transpose(1, 0, 2)).squeeze(1)


@pytest.mark.parametrize("kind", ["nn", "values_left", "plain"])
def test_attention_over_blocks_matches_numpy(executor, kind):
    ctx, y = _attention_program(kind)
    prog = compile_tiled(ctx, {"y": y}, executor, block=4)
    assert tiled(prog)
    assert "softmax" not in {op.kind for op in prog.sdg.ops.values()}
    want = np.stack([np.einsum("hs,shd->hd", softmax(  # scale 1/sqrt(4) in every variant
        np.einsum("hd,shd->hs", Q[t], K[:t + 1]) * 0.5), V[:t + 1]) for t in range(T)])
    np.testing.assert_allclose(prog.run()["y"], want, rtol=1e-5, atol=1e-5)


def test_a_block_of_minus_infinity_scores_adds_nothing():
    """Scores of -inf (a mask written by the user) in a whole block: that block's weights are
    zero, as in softmax, not NaN."""
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    mask = np.where(np.arange(T)[:, None] < 4, -np.inf, 0).astype(np.float32)
    vals = RNG.standard_normal((T, 3)).astype(np.float32)
    with ctx:
        m = tl.from_array(np.broadcast_to(mask, (T, 1)).copy(), (t,))
        x = tl.from_array(X[:, :1], (t,))
        v = tl.from_array(vals, (t,))
        s = (x[0:t + 1] + m[0:t + 1]).squeeze(1) + 0.0         # (steps,)
        y = tl.softmax(s, axis=0) @ v[0:t + 1]
    prog = compile_tiled(ctx, {"y": y}, "reference", block=2)
    assert tiled(prog)
    got = prog.run()["y"]
    want = np.stack([softmax(X[:i + 1, 0] + mask[:i + 1, 0]) @ vals[:i + 1] for i in range(T)])
    assert np.isnan(want[:4]).all() and np.isnan(got[:4]).all()  # as softmax: all -inf
    np.testing.assert_allclose(got[4:], want[4:], rtol=1e-5, atol=1e-6)


def test_what_stays_untiled():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        x = tl.from_array(X, (t,))
        inner = x[0:t + 1] * 2.0
        outs = {"shown": inner.sum(axis=0), "twice": inner.max(axis=0),  # two reductions
                "mean": x[0:t + 1].mean(axis=0),                        # mean: not split
                "window": x[tl.max(0, t - 2):t + 1].sum(axis=0),       # static already
                "weights": tl.softmax(x[0:t + 1], axis=0).sum(axis=0)}  # a softmax, summed
    prog = compile_tiled(ctx, outs, block=2)
    assert not tiled(prog)
    assert not tiled(compile_tiled(ctx, {"s": outs["shown"]}, block=T))


def test_the_pass_trace_and_the_switch():
    ctx, y = _attention_program("nn")
    on = compile_tiled(ctx, {"y": y}, block=4)
    rec = next(r for r in on.passes.records if r.name == "tile")
    assert rec.count("created") > 10 and rec.count("erased") >= 7
    assert any("block" in ev.note for ev in rec.events)
    off = compile_tiled(ctx, {"y": y}, block=4, tile=False)
    assert "tile" not in [r.name for r in off.passes.records] and "T_TILE" not in off.bounds
    np.testing.assert_allclose(on.run()["y"], off.run()["y"], rtol=1e-5, atol=1e-6)


def test_auto_block_size():
    assert [auto_block(n) for n in (10, 128, 1024, 4096, 100000)] == [32, 32, 32, 128, 256]
