"""Temporal and spatial indexing (docs/semantics.md, "Symbolic indexing"): point reads, slices
(causal, window, future window, suffix, constant), reads that remove dims from the domain, and
spatial indices after temporal ones. Expected values come from plain NumPy.
"""
from __future__ import annotations

import numpy as np
import pytest
from rt_helpers import (
    close,
    ctx1,
    ctx2,
    rng,
    run,
)

import tempo_lab as tl

# every test on each executor (conftest.py); compile_ and run compile for it
pytestmark = pytest.mark.usefixtures("executor")

# ------------------------------------------------------------------------------------------------
# temporal reads: causal, window, future window, suffix, constant slices and points
# ------------------------------------------------------------------------------------------------
W_ = 3


def _expected_reads(xs, Tn, w):
    """xs: (..., T, D) with t the second-to-last axis. Returns dict of expected outputs."""
    ax = xs.ndim - 2

    def over(f):
        return np.stack([f(i) for i in range(Tn)], axis=ax)

    take = lambda lo, hi: np.take(xs, np.arange(lo, hi), axis=ax)
    return {
        "causal": over(lambda i: take(0, i + 1).sum(axis=ax)),
        "window": over(lambda i: take(max(0, i - w + 1), i + 1).mean(axis=ax)),
        "future": over(lambda i: take(i, min(i + w, Tn)).max(axis=ax)),
        "suffix": over(lambda i: take(i, Tn).sum(axis=ax)),
        "empty": over(lambda i: take(0, i).sum(axis=ax)),
        "total": take(0, Tn).sum(axis=ax),
        "mid": np.moveaxis(take(2, 5), ax, ax),  # (..., 3, D)
        "last": np.take(xs, Tn - 1, axis=ax),
        "first": np.take(xs, 0, axis=ax),
    }


def _reads(x, t, T):
    lead = () if len(x.domain) == 1 else (x.domain[0],)
    return {
        "causal": x[lead + (slice(0, t + 1),)].sum(axis=0),
        "window": x[lead + (slice(tl.max(0, t - W_ + 1), t + 1),)].mean(axis=0),
        "future": x[lead + (slice(t, tl.min(t + W_, T)),)].max(axis=0),
        "suffix": x[lead + (slice(t, T),)].sum(axis=0),
        "empty": x[lead + (slice(0, t),)].sum(axis=0),
        "total": x[lead + (slice(0, T),)].sum(axis=0),
        "mid": x[lead + (slice(2, 5),)],
        "last": x[lead + (T - 1,)],
        "first": x[lead + (0,)],
    }


def test_temporal_reads_1d():
    Tn, D = 7, 2
    data = rng(6).normal(size=(Tn, D)).astype(np.float32)
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        outs = _reads(x, t, T)
    assert outs["total"].domain == () and outs["total"].shape == (D,)
    assert outs["mid"].domain == () and outs["mid"].shape == (3, D)
    assert outs["causal"].domain == (t,)
    res = run(ctx, {T: Tn}, **outs)
    exp = _expected_reads(data.astype(np.float64), Tn, W_)
    for name in outs:
        close(res[name], exp[name])


def test_temporal_reads_2d():
    Bn, Tn, D = 3, 7, 2
    data = rng(7).normal(size=(Bn, Tn, D)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        outs = _reads(x, t, T)
    assert outs["total"].domain == (b,)
    res = run(ctx, {B: Bn, T: Tn}, **outs)
    exp = _expected_reads(data.astype(np.float64), Tn, W_)
    for name in outs:
        close(res[name], exp[name])


def test_temporal_reads_of_a_recurrence():
    """Reads of a placeholder (not only of from_array data)."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[t - 1] + 2.0
        c = x[0:t + 1].sum()
        s = x[t:T].sum()
        f = x[t:tl.min(t + 2, T)].sum()
    res = run(ctx, {T: 6}, c=c, s=s, f=f)
    xs = 1.0 + 2.0 * np.arange(6)
    close(res["c"], np.cumsum(xs))
    close(res["s"], np.cumsum(xs[::-1])[::-1])
    close(res["f"], [xs[i:i + 2].sum() for i in range(6)])


def test_empty_causal_read_sums_to_zero():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,))
        x[t] = tl.ones((3,)) * (t + 1)
        y = x[0:t].sum(axis=0)
        m = x[0:t].max(axis=0, keepdims=True).shape
    res = run(ctx, {T: 4}, y=y)
    exp = np.stack([np.arange(1, i + 1).sum() * np.ones(3) for i in range(4)])
    close(res["y"], exp)
    assert res["y"][0].tolist() == [0.0, 0.0, 0.0]
    assert len(m) == 2


def test_slices_over_both_dims_empty_domain():
    Bn, Tn = 2, 3
    data = rng(8).normal(size=(Bn, Tn, 4)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        whole = x[0:B, 0:T]
        rows = x[0:b + 1, t].sum(axis=0)
        col = x[0, t]
    assert whole.domain == () and whole.shape[-1] == 4
    assert col.domain == (t,)
    res = run(ctx, {B: Bn, T: Tn}, whole=whole, rows=rows, col=col)
    close(res["whole"], data)
    close(res["rows"], np.cumsum(data.astype(np.float64), axis=0))
    close(res["col"], data[0])


def test_clipped_point_reads():
    data = np.arange(6, dtype=np.float32) ** 2
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        ahead = x[tl.min(t + 3, T - 1)]
        behind = x[tl.max(t - 2, 0)]
        half = x[t // 2]
    res = run(ctx, {T: 6}, ahead=ahead, behind=behind, half=half)
    close(res["ahead"], [data[min(i + 3, 5)] for i in range(6)])
    close(res["behind"], [data[max(i - 2, 0)] for i in range(6)])
    close(res["half"], [data[i // 2] for i in range(6)])


def test_recurrence_reading_its_own_prefix():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[0:t].sum() + 1.0
    got = run(ctx, {T: 8}, x=x)["x"]
    exp = np.zeros(8)
    for i in range(8):
        exp[i] = exp[:i].sum() + 1.0
    close(got, exp)


def test_short_key_indexes_leading_dims():
    """``x[t]`` on a (b, t) tensor reads the point b = t (entries go in domain order)."""
    data = rng(14).normal(size=(4, 4)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        diag = x[t]
        row = x[1]
    assert diag.domain == (t,) and row.domain == (t,)
    res = run(ctx, {B: 4, T: 4}, diag=diag, row=row)
    close(res["diag"], np.diag(data))
    close(res["row"], data[1])


# ------------------------------------------------------------------------------------------------
# view metadata: domains and (symbolic) shapes
# ------------------------------------------------------------------------------------------------
def test_view_domains_and_shapes():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((4,), "float32", domain=(b, t))
        assert x[b, t] is x  # the current point is the tensor itself
        assert x[b] is x
        assert x[b, t - 1].domain == (b, t) and x[b, t - 1].shape == (4,)
        assert x[b, 0].domain == (b,)
        assert x[0, t].domain == (t,)
        assert x[0, 0].domain == () and x[B - 1, T - 1].shape == (4,)
        causal = x[b, 0:t + 1]
        assert causal.domain == (b, t) and causal.shape[1:] == (4,)
        assert causal.shape[0] == t + 1  # symbolic length
        assert x[b, 0:T].domain == (b,) and x[b, 0:T].shape == (T, 4)
        assert x[b, 2:5].shape == (3, 4)
        assert x[0:B, 0:T].domain == () and x[0:B, 0:T].shape == (B, T, 4)
        assert x[0:b + 1, t].domain == (b, t)
        assert x[b, 0:b + 1].domain == (b,)   # the slice ends use b only: t leaves the domain
        assert x[b, t - 1, 0].shape == ()     # spatial entries after the temporal ones
        assert x[..., 1:3].domain == (b, t) and x[..., 1:3].shape == (2,)
        assert x.dtype == np.float32 and x.ndim == 1


def test_ragged_slice_depending_on_another_dim():
    data = rng(20).normal(size=(4, 5, 2)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        tri = x[b, 0:b + 1].sum(axis=0)          # domain (b,)
        band = x[b, b:T].mean(axis=0)            # domain (b,)
    res = run(ctx, {B: 4, T: 5}, tri=tri, band=band)
    d = data.astype(np.float64)
    close(res["tri"], np.stack([d[i, :i + 1].sum(0) for i in range(4)]))
    close(res["band"], np.stack([d[i, i:].mean(0) for i in range(4)]))


def test_index_expressions_scaled_reversed_mod():
    data = np.arange(10, dtype=np.float32) * 1.5
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        rev = x[T - 1 - t]
        even = x[2 * t]
        wrap = x[(t + 3) % 4]
        clamp = x[tl.min(tl.max(t - 2, 0), 4)]
    ctx_short = {T: 10}
    res = run(ctx, ctx_short, rev=rev, wrap=wrap, clamp=clamp)
    close(res["rev"], data[::-1])
    close(res["wrap"], data[(np.arange(10) + 3) % 4])
    close(res["clamp"], data[np.clip(np.arange(10) - 2, 0, 4)])
    # 2*t leaves the domain for t >= 5: only valid inside a guarding branch
    with ctx:
        y = tl.placeholder((), "float32", domain=(t,))
        y[t < 5] = even
        y[t] = tl.constant(-1.0)
    res = run(ctx, ctx_short, y=y)
    close(res["y"], np.where(np.arange(10) < 5, data[np.minimum(2 * np.arange(10), 9)], -1))


def test_cross_dim_point_read():
    """A tensor over (t,) read at a point written in another dim: u[b] in a (b, t) program."""
    data = np.arange(5, dtype=np.float32) + 0.5
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(data, domain=(t,))
        y = u[b] * 1.0 + u                      # domain (b, t)
        z = u[tl.min(b + t, T - 1)]
    assert y.domain == (b, t)
    res = run(ctx, {B: 3, T: 5}, y=y, z=z)
    close(res["y"], data[:3, None] + data[None, :])
    close(res["z"], data[np.minimum(np.arange(3)[:, None] + np.arange(5)[None], 4)])


def test_slice_reads_feeding_spatial_ops():
    data = rng(21).normal(size=(6, 3)).astype(np.float32)
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        mx = x[0:t + 1].max(axis=0)
        mn = x[tl.max(0, t - 1):t + 1].min(axis=(0, 1))
        kd = x[0:t + 1].sum(axis=0, keepdims=True)
        first_col = x[0:t + 1, 0].sum()            # spatial index after a temporal slice
        tr = x[0:T].T @ x[0:T]                     # (3, 3) Gram matrix, empty domain
    assert kd.shape == (1, 3)
    res = run(ctx, {T: 6}, mx=mx, mn=mn, kd=kd, first_col=first_col, tr=tr)
    d = data.astype(np.float64)
    close(res["mx"], np.maximum.accumulate(d, axis=0))
    close(res["mn"], [d[max(0, i - 1):i + 1].min() for i in range(6)])
    close(res["kd"], np.cumsum(d, axis=0)[:, None, :])
    close(res["first_col"], np.cumsum(d[:, 0]))
    close(res["tr"], d.T @ d)


# ------------------------------------------------------------------------------------------------
# spatial indices after temporal ones
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spatial, np_index", [
    ((0,), (0,)),
    ((-1,), (-1,)),
    ((slice(1, 3),), (slice(1, 3),)),
    ((slice(None, None, 2),), (slice(None, None, 2),)),
    ((Ellipsis, 1), (Ellipsis, 1)),
    ((1, Ellipsis), (1, Ellipsis)),
    ((None,), (None,)),
    ((slice(None), None, 2), (slice(None), None, 2)),
    ((2, slice(None, None, -1)), (2, slice(None, None, -1))),
    ((Ellipsis,), (Ellipsis,)),
])
def test_spatial_index_after_temporal_point(spatial, np_index):
    data = rng(22).normal(size=(2, 5, 3, 4)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        prev = tl.placeholder(x[(b, t) + spatial].shape, "float32", domain=(b, t))
        prev[b, 0] = x[(b, 0) + spatial] * 0.0
        prev[b, t] = x[(b, t - 1) + spatial]
        cur = x[(b, t) + spatial]
        first = x[(b, 0) + spatial]
    res = run(ctx, {B: 2, T: 5}, prev=prev, cur=cur, first=first)
    for bb in range(2):
        for tt in range(5):
            close(res["cur"][bb, tt], data[bb, tt][np_index])
            exp_prev = data[bb, tt - 1][np_index] if tt else 0.0 * data[bb, 0][np_index]
            close(res["prev"][bb, tt], exp_prev)
        close(res["first"][bb], data[bb, 0][np_index])


def test_spatial_index_on_temporal_slice():
    data = rng(23).normal(size=(5, 3, 2)).astype(np.float32)
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        a = x[0:T, 1]          # (T, 2): the spatial index applies after the prepended axis
        c = x[2:5, :, 0]       # (3, 3)
        d = x[tl.max(0, t - 1):t + 1, 2, 1].sum()
    assert a.shape == (T, 2) and c.shape == (3, 3)
    res = run(ctx, {T: 5}, a=a, c=c, d=d)
    close(res["a"], data[:, 1])
    close(res["c"], data[2:5, :, 0])
    close(res["d"], [data[max(0, i - 1):i + 1, 2, 1].sum() for i in range(5)])


def test_symbolic_shape_follows_the_read_point():
    """A value whose shape is ``(t + 1, ...)`` read at ``t - 1`` has shape ``(t, ...)``."""
    data = np.arange(6, dtype=np.float32)
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        pre = x[0:t + 1] * 2.0                     # shape (t + 1,)
        assert pre.shape == (t + 1,)
        prev = pre[tl.max(t - 1, 0)]
        assert prev.shape == (tl.max(t - 1, 0) + 1,)
        y = prev.sum()
        last = pre[T - 1]                          # static shape (T,)
        assert last.shape == (T,) and last.domain == ()
    res = run(ctx, {T: 6}, y=y, last=last)
    close(res["y"], [2 * data[:max(i - 1, 0) + 1].sum() for i in range(6)])
    close(res["last"], 2 * data)


def test_spatial_entries_after_two_temporal_slices():
    data = rng(24).normal(size=(2, 3, 4)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        col = x[0:B, 0:T, 1]
        tail = x[0:B, 1:T, ::2]
        ell = x[0:B, 0:T, ...]
    assert col.shape == (B, T) and ell.shape == (B, T, 4)
    res = run(ctx, {B: 2, T: 3}, col=col, tail=tail, ell=ell)
    close(res["col"], data[:, :, 1])
    close(res["tail"], data[:, 1:, ::2])
    close(res["ell"], data)
