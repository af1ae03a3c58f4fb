"""Semantics of recurrent-tensor programs on every executor (docs/semantics.md).

Every expected value is computed independently with plain NumPy loops inside the test; nothing
is taken from tempo_lab except the value under test. A few tests also check the executor against
the reference interpreter, output by output (``rt_helpers.check_vs_reference``).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from rt_helpers import (
    check_vs_reference,
    close,
    compile_,
    ctx1,
    ctx2,
    rng,
    run,
)

import tempo_lab as tl

# every test on each executor (conftest.py); compile_ and run compile for it
pytestmark = pytest.mark.usefixtures("executor")


# ------------------------------------------------------------------------------------------------
# recurrences
# ------------------------------------------------------------------------------------------------
def test_doc_example_recurrence_and_reads():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((4,), "float32", domain=(b, t))
        x[b, 0] = tl.zeros((4,))
        x[b, t] = x[b, t - 1] * 2.0 + 1.0
        y = x[b, 0:t + 1].sum(axis=0)
        w = x[b, tl.max(0, t - 2):t + 1].mean(axis=0)
        total = x[b, 0:T].sum(axis=0)
    res = run(ctx, {B: 2, T: 8}, x=x, y=y, w=w, total=total)
    xs = np.zeros((8,))
    for i in range(1, 8):
        xs[i] = xs[i - 1] * 2 + 1
    xe = np.broadcast_to(xs[None, :, None], (2, 8, 4))
    close(res["x"], xe)
    close(res["y"], np.cumsum(xe, axis=1))
    we = np.stack([xe[:, max(0, i - 2):i + 1].mean(axis=1) for i in range(8)], axis=1)
    close(res["w"], we)
    close(res["total"], xe.sum(axis=1))
    assert res["y"].dtype == np.float32 and res["total"].shape == (2, 4)


def test_scalar_recurrence_1d_with_dim_value():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[t - 1] * 0.5 + t
    got = run(ctx, {T: 12}, x=x)["x"]
    exp = np.zeros(12)
    exp[0] = 1.0
    for i in range(1, 12):
        exp[i] = exp[i - 1] * 0.5 + i
    close(got, exp)
    assert got.dtype == np.float32


def test_vector_recurrence_2d_domain_with_input():
    r = rng(1)
    inp = r.normal(size=(3, 6, 2)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(inp, domain=(b, t))
        h = tl.placeholder((2,), "float32", domain=(b, t))
        h[b, 0] = u[b, 0]
        h[b, t] = tl.tanh(h[b, t - 1] * 0.5 + u)
    got = run(ctx, {B: 3, T: 6}, h=h)["h"]
    exp = np.zeros_like(inp, dtype=np.float64)
    exp[:, 0] = inp[:, 0]
    for i in range(1, 6):
        exp[:, i] = np.tanh(exp[:, i - 1] * 0.5 + inp[:, i])
    close(got, exp)


def test_recurrence_over_both_dims_binomial():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[0, t] = tl.ones(())
        x[(b >= 1) & tl.eq(t, 0)] = tl.ones(())
        x[b, t] = x[b - 1, t] + x[b, t - 1]
    got = run(ctx, {B: 5, T: 6}, x=x)["x"]
    exp = np.ones((5, 6))
    for i in range(1, 5):
        for j in range(1, 6):
            exp[i, j] = exp[i - 1, j] + exp[i, j - 1]
    close(got, exp)


def test_two_mutually_recursive_placeholders():
    ctx, t, T = ctx1()
    with ctx:
        a = tl.placeholder((), "float32", domain=(t,))
        c = tl.placeholder((), "float32", domain=(t,))
        a[0] = tl.constant(1.0)
        c[0] = tl.constant(0.0)
        a[t] = a[t - 1] + c[t - 1]
        c[t] = a[t] * 0.5 - c[t - 1]
    res = run(ctx, {T: 7}, a=a, c=c)
    ea, ec = np.zeros(7), np.zeros(7)
    ea[0], ec[0] = 1.0, 0.0
    for i in range(1, 7):
        ea[i] = ea[i - 1] + ec[i - 1]
        ec[i] = ea[i] * 0.5 - ec[i - 1]
    close(res["a"], ea)
    close(res["c"], ec)


def test_long_scalar_recurrence_no_recursion_error(executor):
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(0.0)
        x[t] = x[t - 1] * 0.999 + 1.0
    n = 10_000 if executor == "reference" else 2_000  # keep the test fast on every executor
    got = run(ctx, {T: n}, x=x)["x"]
    exp = np.empty(n, np.float32)
    exp[0] = 0.0
    for i in range(1, n):
        exp[i] = exp[i - 1] * np.float32(0.999) + np.float32(1.0)
    assert got.shape == (n,)
    close(got, exp, rtol=1e-4)


def test_long_recurrence_demanded_through_last_point(executor):
    """Only x[T - 1] is an output: demand-driven evaluation must still walk 10 000 steps."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "int32", domain=(t,))
        x[0] = tl.constant(0, dtype="int32")
        x[t] = x[t - 1] + 1
        last = x[T - 1]
    n = 10_000 if executor == "reference" else 2_000
    got = run(ctx, {T: n}, last=last)["last"]
    assert got.shape == () and int(got) == n - 1


# ------------------------------------------------------------------------------------------------
# branches: order independence, condition keys, shift keys, eq/ne, & | ~
# ------------------------------------------------------------------------------------------------
def _branchy(order, inp):
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(inp, domain=(b, t))
        x = tl.placeholder((2,), "float32", domain=(b, t))

        def init():
            x[b, 0] = u[b, 0] * 3.0

        def warm():
            x[(t >= 1) & (t < 3)] = x[b, t - 1] + 1.0

        def default():
            x[b, t] = x[b, t - 1] * 0.5 + u

        fns = {"init": init, "warm": warm, "default": default}
        for name in order:
            fns[name]()
    return run(ctx, {B: 2, T: 6}, x=x)["x"]


def test_branch_order_independence():
    inp = rng(2).normal(size=(2, 6, 2)).astype(np.float32)
    exp = np.zeros(inp.shape)
    for i in range(6):
        if i == 0:
            exp[:, i] = inp[:, 0] * 3.0
        elif i < 3:
            exp[:, i] = exp[:, i - 1] + 1.0
        else:
            exp[:, i] = exp[:, i - 1] * 0.5 + inp[:, i]
    results = [_branchy(order, inp) for order in itertools.permutations(("init", "warm",
                                                                         "default"))]
    for got in results:
        close(got, exp)


def test_condition_key():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[t < 3] = (tl.zeros(()) + t) * 10.0
        x[t] = x[t - 1] + 1.0
    got = run(ctx, {T: 7}, x=x)["x"]
    close(got, [0, 10, 20, 21, 22, 23, 24])


def test_positive_shift_key():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t + 1] = x[t] * 2.0
    got = run(ctx, {T: 8}, x=x)["x"]
    close(got, 2.0 ** np.arange(8))


def test_positive_shift_key_value_computed_at_t():
    """``x[t + 2] = v`` defines x at t + 2 from v (here u[t]) computed at t."""
    u_np = np.arange(10, 17).astype(np.float32)
    ctx, t, T = ctx1()
    with ctx:
        u = tl.from_array(u_np, domain=(t,))
        x = tl.placeholder((), "float32", domain=(t,))
        x[t < 2] = tl.constant(-1.0)
        x[t + 2] = u * 1.0 + x[t]
    got = run(ctx, {T: 7}, x=x)["x"]
    exp = np.zeros(7)
    exp[:2] = -1
    for i in range(2, 7):
        exp[i] = u_np[i - 2] + exp[i - 2]
    close(got, exp)


def test_negative_shift_key():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[T - 1] = tl.constant(5.0)
        x[t - 1] = x[t] * 2.0 + 1.0
    got = run(ctx, {T: 6}, x=x)["x"]
    exp = np.zeros(6)
    exp[5] = 5.0
    for i in range(4, -1, -1):
        exp[i] = exp[i + 1] * 2 + 1
    close(got, exp)


def test_shift_key_on_2d_domain():
    inp = rng(3).normal(size=(2, 5)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(inp, domain=(b, t))
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, 0] = tl.zeros(()) + b
        x[b, t + 1] = x[b, t] + u[b, t]
    got = run(ctx, {B: 2, T: 5}, x=x)["x"]
    exp = np.zeros((2, 5))
    exp[:, 0] = [0, 1]
    for i in range(1, 5):
        exp[:, i] = exp[:, i - 1] + inp[:, i - 1]
    close(got, exp)


def test_eq_ne_conditions():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[tl.eq(t, 2)] = tl.constant(100.0)
        x[tl.ne(t, 2)] = tl.zeros(()) + t
    got = run(ctx, {T: 5}, x=x)["x"]
    close(got, [0, 1, 100, 3, 4])


def test_eq_ne_conditions_between_dims_identity_matrix():
    ctx, b, t, B, T = ctx2(("i", "j"))
    with ctx:
        x = tl.placeholder((), "int32", domain=(b, t))
        x[tl.eq(b, t)] = tl.constant(1, dtype="int32")
        x[tl.ne(b, t)] = tl.constant(0, dtype="int32")
    got = run(ctx, {B: 4, T: 5}, x=x)["x"]
    np.testing.assert_array_equal(got, np.eye(4, 5, dtype=np.int32))
    assert got.dtype == np.int32


def test_and_or_not_conditions_1d():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        mid = (t >= 2) & (t < 5)
        x[mid] = tl.zeros(()) + t * 10
        x[~mid & tl.eq(t % 2, 0)] = tl.constant(-1.0)
        x[((t < 2) | (t >= 5)) & tl.ne(t % 2, 0)] = tl.constant(7.0)
    got = run(ctx, {T: 8}, x=x)["x"]
    exp = [-1, 7, 20, 30, 40, 7, -1, 7]
    close(got, exp)


def test_or_condition_and_default_on_2d():
    inp = rng(4).normal(size=(3, 4)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(inp, domain=(b, t))
        x = tl.placeholder((), "float32", domain=(b, t))
        x[tl.eq(b, 0) | tl.eq(t, 0)] = u * 1.0
        x[b, t] = x[b - 1, t - 1] + u
    got = run(ctx, {B: 3, T: 4}, x=x)["x"]
    exp = np.array(inp, np.float64)
    for i in range(1, 3):
        for j in range(1, 4):
            exp[i, j] = exp[i - 1, j - 1] + inp[i, j]
    close(got, exp)


# ------------------------------------------------------------------------------------------------
# layers as a dimension
# ------------------------------------------------------------------------------------------------
def _layers_program(emb, weights):
    ctx, n, t, N, T = ctx2(("n", "t"))
    D = emb.shape[-1]
    with ctx:
        embed = tl.from_array(emb, domain=(t,))
        W = tl.from_array(weights, domain=(n,))
        x_in = tl.placeholder((D,), "float32", domain=(n, t))
        x_out = tl.placeholder((D,), "float32", domain=(n, t))
        x_in[0, t] = embed[t]
        x_in[n, t] = x_out[n - 1, t]
        x_out[n, t] = tl.tanh(x_in[n, t] @ W[n]) + x_in[n, t]
        y = x_out[N - 1, t]
        every = x_out[0:N, t]
    return ctx, (N, T), y, every


def test_layers_as_a_dimension():
    r = rng(5)
    Tn, Nn, D = 5, 4, 3
    emb = r.normal(size=(Tn, D)).astype(np.float32)
    weights = (r.normal(size=(Nn, D, D)) * 0.5).astype(np.float32)
    ctx, (N, T), y, every = _layers_program(emb, weights)
    res = check_vs_reference(ctx, {N: Nn, T: Tn}, {"y": y, "every": every})
    h = emb.astype(np.float64)
    layers = []
    for k in range(Nn):
        h = np.tanh(h @ weights[k]) + h
        layers.append(h)
    assert res["y"].shape == (Tn, D)
    close(res["y"], h)
    close(res["every"], np.stack(layers, axis=1))  # domain (t,), spatial (N, D)
    assert res[y].shape == (Tn, D)  # indexing the run by the view itself


# ------------------------------------------------------------------------------------------------
# bootstrapped return
# ------------------------------------------------------------------------------------------------
def test_bootstrapped_discounted_return():
    rewards = rng(9).normal(size=(9,)).astype(np.float32)
    gamma = 0.9
    ctx, t, T = ctx1()
    with ctx:
        r = tl.from_array(rewards, domain=(t,))
        g = tl.placeholder((), "float32", domain=(t,))
        g[T - 1] = r[T - 1]
        g[t] = r[t] + gamma * g[t + 1]
    got = run(ctx, {T: 9}, g=g)["g"]
    exp = np.zeros(9)
    acc = 0.0
    for i in range(8, -1, -1):
        acc = rewards[i] + gamma * acc
        exp[i] = acc
    close(got, exp)


def test_bootstrapped_return_2d_with_value_bootstrap():
    r_np = rng(10).normal(size=(2, 5)).astype(np.float32)
    v_np = rng(11).normal(size=(2, 5)).astype(np.float32)
    gamma = 0.5
    ctx, b, t, B, T = ctx2()
    with ctx:
        r = tl.from_array(r_np, domain=(b, t))
        v = tl.from_array(v_np, domain=(b, t))
        g = tl.placeholder((), "float32", domain=(b, t))
        g[b, T - 1] = r + gamma * v
        g[b, t] = r[b, t] + gamma * g[b, t + 1]
    got = run(ctx, {B: 2, T: 5}, g=g)["g"]
    exp = np.zeros((2, 5))
    exp[:, 4] = r_np[:, 4] + gamma * v_np[:, 4]
    for i in range(3, -1, -1):
        exp[:, i] = r_np[:, i] + gamma * exp[:, i + 1]
    close(got, exp)


# ------------------------------------------------------------------------------------------------
# creation: from_array, source, dims in arithmetic, constant, arange
# ------------------------------------------------------------------------------------------------
def test_from_array_matmul_constant_weight():
    r = rng(12)
    xs = r.normal(size=(2, 4, 3)).astype(np.float32)
    wm = r.normal(size=(3, 5)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(xs, domain=(b, t))
        W = tl.constant(wm)
        y = x @ W
        z = tl.matmul(x, W) + 1.0
    assert y.domain == (b, t) and y.shape == (5,)
    res = run(ctx, {B: 2, T: 4}, y=y, z=z, x=x)
    exp = np.einsum("btd,de->bte", xs.astype(np.float64), wm.astype(np.float64))
    close(res["y"], exp)
    close(res["z"], exp + 1.0)
    close(res["x"], xs)
    assert res["y"].dtype == np.float32


def test_from_array_dtypes_canonicalised():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(np.arange(4, dtype=np.float64), domain=(t,))
        i = tl.from_array(np.arange(4, dtype=np.int64), domain=(t,))
    assert x.dtype == np.float32 and i.dtype == np.int32
    res = run(ctx, {T: 4}, x=x, i=i)
    assert res["x"].dtype == np.float32 and res["i"].dtype == np.int32
    np.testing.assert_array_equal(res["i"], np.arange(4))


def test_source():
    calls = []

    def fn(point):
        calls.append(dict(point))
        return np.full((2,), point["b"] * 10 + point["t"], np.float32)

    ctx, b, t, B, T = ctx2()
    with ctx:
        s = tl.source(fn, (2,), "float32", domain=(b, t))
        y = s * 2.0
    got = run(ctx, {B: 2, T: 3}, y=y)["y"]
    exp = np.array([[[20 * bb + 2 * tt] * 2 for tt in range(3)] for bb in range(2)])
    close(got, exp)
    assert sorted((c["b"], c["t"]) for c in calls) == [(bb, tt) for bb in range(2)
                                                        for tt in range(3)]
    assert all(set(c) == {"b", "t"} for c in calls)


def test_source_1d_domain_in_2d_context():
    ctx, b, t, B, T = ctx2()
    with ctx:
        s = tl.source(lambda p: np.float32(p["t"] ** 2), (), "float32", domain=(t,))
        y = s + tl.zeros(()) + b
    got = run(ctx, {B: 2, T: 4}, y=y)["y"]
    close(got, np.arange(4)[None, :] ** 2 + np.arange(2)[:, None])


def test_dims_in_arithmetic():
    ctx, b, t, B, T = ctx2()
    with ctx:
        v = tl.zeros(()) + t
        x = tl.ones((3,)) * 2.0
        y = x * (t + 1)
        z = tl.zeros((), "int32") + (b * 10 + t)
        w = t + tl.zeros(())  # reflected
        q = (tl.zeros((), "int32") + t) / 2
    assert v.dtype == np.float32 and v.domain == (t,)
    assert y.dtype == np.float32 and y.domain == (t,)
    assert z.dtype == np.int32 and z.domain == (b, t)
    assert q.dtype == np.float32
    res = run(ctx, {B: 2, T: 5}, v=v, y=y, z=z, w=w, q=q)
    close(res["v"], np.arange(5))
    assert res["v"].dtype == np.float32
    close(res["y"], 2.0 * (np.arange(5)[:, None] + 1) * np.ones((5, 3)))
    np.testing.assert_array_equal(res["z"], np.arange(2)[:, None] * 10 + np.arange(5)[None])
    assert res["z"].dtype == np.int32
    close(res["w"], np.arange(5))
    close(res["q"], np.arange(5) / 2)


def test_dim_expression_with_bound():
    ctx, t, T = ctx1()
    with ctx:
        rev = tl.zeros((), "int32") + (T - 1 - t)
        mod = tl.zeros((), "int32") + t % 3
    res = run(ctx, {T: 7}, rev=rev, mod=mod)
    np.testing.assert_array_equal(res["rev"], np.arange(6, -1, -1))
    np.testing.assert_array_equal(res["mod"], np.arange(7) % 3)


def test_constant_and_arange():
    ctx, t, T = ctx1()
    with ctx:
        c = tl.constant([[1.0, 2.0], [3.0, 4.0]])
        a = tl.arange(4)
        ci = tl.constant([1, 2, 3])
        x = tl.zeros((4,)) + t
        y = x + a
        z = c @ c
        f = tl.full((2,), 7, dtype="int32")
    assert c.dtype == np.float32 and a.dtype == np.int32 and ci.dtype == np.int32
    assert y.dtype == np.float32 and f.dtype == np.int32
    assert a.domain == () and y.domain == (t,)
    res = run(ctx, {T: 3}, c=c, a=a, y=y, z=z, ci=ci, f=f)
    close(res["c"], [[1, 2], [3, 4]])
    np.testing.assert_array_equal(res["a"], np.arange(4))
    assert res["a"].dtype == np.int32
    close(res["y"], np.arange(3)[:, None] + np.arange(4)[None, :])
    close(res["z"], np.array([[1, 2], [3, 4]]) @ np.array([[1, 2], [3, 4]]))
    np.testing.assert_array_equal(res["ci"], [1, 2, 3])
    np.testing.assert_array_equal(res["f"], [7, 7])


def test_placeholder_without_domain_and_constant_only_program():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((2,), "float32", domain=())
        x[()] = tl.ones((2,)) * 3.0
        y = x + tl.zeros(()) + t
    res = run(ctx, {T: 3}, x=x, y=y)
    close(res["x"], [3, 3])
    close(res["y"], 3 + np.arange(3)[:, None] * np.ones((3, 2)))


def test_outputs_as_list_and_run_indexing_by_tensor():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,), name="x")
        x[0] = tl.constant(2.0)
        x[t] = x[t - 1] + 1.0
        y = x * 3.0
    res = compile_(ctx, {T: 4}, [x, y]).run()
    close(res[x], [2, 3, 4, 5])
    close(res[y], [6, 9, 12, 15])
    close(res["x"], [2, 3, 4, 5])


def test_branch_value_broadcast_and_weak_cast():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((3,), "float32", domain=(t,))
        x[0] = 1  # python int: weak, broadcast to (3,)
        x[t] = x[t - 1] + tl.ones(())
        i = tl.placeholder((2,), "int32", domain=(t,))
        i[t] = tl.zeros((2,), "int32") + t
    res = run(ctx, {T: 3}, x=x, i=i)
    close(res["x"], np.arange(1, 4)[:, None] * np.ones((3, 3)))
    np.testing.assert_array_equal(res["i"], np.arange(3)[:, None] * np.ones((3, 2), int))
    assert res["x"].dtype == np.float32 and res["i"].dtype == np.int32


# ------------------------------------------------------------------------------------------------
# sinks
# ------------------------------------------------------------------------------------------------
def test_sink_called_once_per_point_in_lexicographic_order():
    calls = []
    data = rng(13).normal(size=(2, 3, 2)).astype(np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.from_array(data, domain=(b, t))
        h = tl.placeholder((2,), "float32", domain=(b, t))
        h[b, 0] = x[b, 0]
        h[b, t] = h[b, t - 1] + x
        tl.sink(h, lambda p, v: calls.append((dict(p), np.array(v))))
        y = h.sum()
    run(ctx, {B: 2, T: 3}, y=y)
    points = [(c[0]["b"], c[0]["t"]) for c in calls]
    assert points == [(bb, tt) for bb in range(2) for tt in range(3)]
    exp = np.cumsum(data.astype(np.float64), axis=1)
    for (p, v) in calls:
        close(v, exp[p["b"], p["t"]])


def test_sink_alone_is_run_and_sink_of_view():
    seen, seen_prev = {}, {}
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[t - 1] * 3.0
        tl.sink(x, lambda p, v: seen.setdefault(p["t"], float(v)))
        tl.sink(x[tl.max(t - 1, 0)], lambda p, v: seen_prev.setdefault(p["t"], float(v)))
        out = tl.constant(0.0)
    run(ctx, {T: 5}, out=out)
    assert seen == {i: 3.0 ** i for i in range(5)}
    assert seen_prev == {i: 3.0 ** max(i - 1, 0) for i in range(5)}


def test_sink_runs_once_per_run():
    count = [0]
    ctx, t, T = ctx1()
    with ctx:
        x = tl.zeros(()) + t
        tl.sink(x, lambda p, v: count.__setitem__(0, count[0] + 1))
    prog = compile_(ctx, {T: 4}, {"x": x})
    prog.run()
    assert count[0] == 4
    prog.run()
    assert count[0] == 8


@pytest.mark.parametrize("Tn", [1, 2])
def test_tiny_bounds(Tn):
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.constant(1.0)
        x[t] = x[t - 1] + 1.0
        s = x[0:T].sum()
        last = x[T - 1]
    res = run(ctx, {T: Tn}, x=x, s=s, last=last)
    close(res["x"], np.arange(1, Tn + 1))
    close(res["s"], np.arange(1, Tn + 1).sum())
    close(res["last"], Tn)


# ------------------------------------------------------------------------------------------------
# more combinations
# ------------------------------------------------------------------------------------------------
def test_read_last_point_of_previous_row():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[0, 0] = tl.constant(1.0)
        x[(b >= 1) & tl.eq(t, 0)] = x[b - 1, T - 1] * 10.0
        x[b, t] = x[b, t - 1] + 1.0
    got = run(ctx, {B: 3, T: 3}, x=x)["x"]
    exp = np.zeros((3, 3))
    for i in range(3):
        for j in range(3):
            if j == 0:
                exp[i, j] = 1.0 if i == 0 else exp[i - 1, 2] * 10
            else:
                exp[i, j] = exp[i, j - 1] + 1
    close(got, exp)


def test_causal_attention_over_symbolic_axis():
    r = rng(15)
    Tn, D = 6, 4
    q_np, k_np, v_np = (r.normal(size=(Tn, D)).astype(np.float32) for _ in range(3))
    ctx, t, T = ctx1()
    with ctx:
        q = tl.from_array(q_np, domain=(t,))
        k = tl.from_array(k_np, domain=(t,))
        v = tl.from_array(v_np, domain=(t,))
        scores = k[0:t + 1] @ q / np.sqrt(D)          # (t + 1,)
        att = tl.softmax(scores, axis=0)
        out = (att.expand_dims(-1) * v[0:t + 1]).sum(axis=0)
        out2 = att @ v[0:t + 1]
        win = tl.softmax(k[tl.max(0, t - 1):t + 1] @ q, axis=-1) @ v[tl.max(0, t - 1):t + 1]
    res = check_vs_reference(ctx, {T: Tn}, {"out": out, "out2": out2, "win": win})
    exp, expw = np.zeros((Tn, D)), np.zeros((Tn, D))
    for i in range(Tn):
        s = k_np[:i + 1].astype(np.float64) @ q_np[i] / np.sqrt(D)
        a = np.exp(s - s.max())
        exp[i] = (a / a.sum()) @ v_np[:i + 1]
        lo = max(0, i - 1)
        s = k_np[lo:i + 1].astype(np.float64) @ q_np[i]
        a = np.exp(s - s.max())
        expw[i] = (a / a.sum()) @ v_np[lo:i + 1]
    close(res["out"], exp)
    close(res["out2"], exp)
    close(res["win"], expw)


def test_branch_value_from_smaller_domain():
    data = np.arange(4, dtype=np.float32)
    ctx, b, t, B, T = ctx2()
    with ctx:
        u = tl.from_array(data, domain=(t,))
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, t] = u + tl.zeros(()) + b * 100
    got = run(ctx, {B: 2, T: 4}, x=x)["x"]
    close(got, data[None, :] + np.array([0, 100])[:, None])


def test_shift_key_in_both_dims():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[0, t] = tl.zeros(()) + t
        x[(b >= 1) & tl.eq(t, 0)] = tl.zeros(()) - b
        x[b + 1, t + 1] = x[b, t] * 2.0 + 1.0
    got = run(ctx, {B: 3, T: 4}, x=x)["x"]
    exp = np.zeros((3, 4))
    exp[0] = np.arange(4)
    exp[1:, 0] = -np.arange(1, 3)
    for i in range(1, 3):
        for j in range(1, 4):
            exp[i, j] = exp[i - 1, j - 1] * 2 + 1
    close(got, exp)


def test_mixed_point_condition_and_shift_entries_in_a_key():
    ctx, b, t, B, T = ctx2()
    with ctx:
        x = tl.placeholder((), "float32", domain=(b, t))
        x[b, t < 2] = tl.zeros(()) + b * 10 + t       # a condition entry next to a dim entry
        x[0, t + 2] = x[0, t] + 100.0                 # point entry and a shift of 2
        x[(b >= 1) & (t >= 2)] = x[b - 1, t] + 1.0
    got = run(ctx, {B: 3, T: 5}, x=x)["x"]
    exp = np.zeros((3, 5))
    for i in range(3):
        for j in range(5):
            if j < 2:
                exp[i, j] = i * 10 + j
            elif i == 0:
                exp[i, j] = exp[0, j - 2] + 100
            else:
                exp[i, j] = exp[i - 1, j] + 1
    close(got, exp)


def test_shift_key_value_uses_dim_value_at_source_point():
    """``x[t + 1] = x[t] + t``: the dim value is the point the value is computed at (t), so
    x[t] = 0 + 1 + ... + (t - 1)."""
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "int32", domain=(t,))
        x[0] = tl.constant(0, dtype="int32")
        x[t + 1] = x[t] + t
    got = run(ctx, {T: 7}, x=x)["x"]
    np.testing.assert_array_equal(got, [i * (i - 1) // 2 for i in range(7)])


def test_negative_shift_of_two():
    ctx, t, T = ctx1()
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[t >= T - 2] = tl.zeros(()) + t
        x[t - 2] = x[t] - 1.0
    got = run(ctx, {T: 7}, x=x)["x"]
    exp = np.zeros(7)
    exp[5:] = [5, 6]
    for i in range(4, -1, -1):
        exp[i] = exp[i + 2] - 1
    close(got, exp)


def test_guarded_max_over_a_range_that_is_empty_at_t0():
    data = np.array([3.0, -1.0, 4.0, 1.0, 5.0], np.float32)
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        m = tl.placeholder((), "float32", domain=(t,))
        m[0] = tl.constant(-np.inf)
        m[t] = x[0:t].max()          # only ever evaluated where the range is non-empty
    got = run(ctx, {T: 5}, m=m)["m"]
    close(got, [-np.inf] + [data[:i].max() for i in range(1, 5)])


def test_sink_of_range_reads():
    data = np.arange(4, dtype=np.float32) * 2
    prefixes, whole = [], []
    ctx, t, T = ctx1()
    with ctx:
        x = tl.from_array(data, domain=(t,))
        tl.sink(x[0:t + 1], lambda p, v: prefixes.append((p["t"], np.array(v))))
        tl.sink(x[0:T], lambda p, v: whole.append((dict(p), np.array(v))))
        y = x * 1.0
    run(ctx, {T: 4}, y=y)
    assert [p for p, _ in prefixes] == [0, 1, 2, 3]
    for p, v in prefixes:
        close(v, data[:p + 1])
    assert len(whole) == 1 and whole[0][0] == {}
    close(whole[0][1], data)


@pytest.mark.parametrize("names", [("b", "t"), ("t", "b")])
def test_domains_union_in_universe_order(names):
    u_np = np.arange(4, dtype=np.float32)          # over t
    v_np = np.arange(3, dtype=np.float32) * 10     # over b
    ctx = tl.Context(dims=names)
    dims = dict(zip(names, ctx.dims))
    bounds = dict(zip(names, ctx.bounds))
    b, t = dims["b"], dims["t"]
    with ctx:
        u = tl.from_array(u_np, domain=(t,))
        v = tl.from_array(v_np, domain=(b,))
        y = u + v
    assert y.domain == tuple(ctx.dims)
    got = run(ctx, {bounds["b"]: 3, bounds["t"]: 4}, y=y)["y"]
    exp = v_np[:, None] + u_np[None, :]
    close(got, exp if names == ("b", "t") else exp.T)
