"""The classes of disagreement between the compiled executors and the reference found by trying
tempo_lab as a user would, each written as the user wrote it and run on every executor (and
every gradient against ``jax.grad``). ``test_random_programs.py`` draws programs with the same
features at random; these are the cases as found."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rt_helpers import WITH_AUTO, check_vs_reference, compile_

import tempo_lab as tl

pytestmark = pytest.mark.executors(WITH_AUTO, reason='as a user runs them: on "auto" too')


# 1. a data-dependent bound read at its last point, over its whole range and through tl.grad
def test_until_means_the_last_point_reached_everywhere(executor):
    xs = np.linspace(0.1, 2.0, 20).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(xs, domain=(t,))
        h = tl.placeholder((), "float32", domain=(t,))
        h[0] = x[0]
        h[t] = h[t - 1] * 1.5 + x[t]
        done = h > 6.0
        last, total = h[T - 1], h[0:T].sum(axis=0)
        loss = h[T - 1] * h[T - 1] + (x[0:T] * x[0:T]).sum(axis=0)
        (dx,) = tl.grad(loss, [x])
    run = compile_(ctx, {T: tl.until(done, max=20)},
                   {"h": h, "last": last, "total": total, "dx": dx}, executor).run()

    def unrolled(v):  # the same recurrence in JAX, over the steps reached
        hs = [v[0]]
        for k in range(1, len(v)):
            hs.append(hs[-1] * 1.5 + v[k])
        return hs[-1] ** 2 + (v * v).sum(), jnp.stack(hs)

    ref = np.asarray(unrolled(jnp.asarray(xs))[1])
    n = int(np.argmax(ref > 6.0)) + 1                    # the first point where done holds
    assert run.bounds["T"] == n < 20
    np.testing.assert_allclose(run["h"], ref[:n], rtol=1e-6)
    np.testing.assert_allclose(run["last"], ref[n - 1], rtol=1e-6)
    np.testing.assert_allclose(run["total"], ref[:n].sum(), rtol=1e-6)
    want = jax.grad(lambda v: unrolled(v)[0])(jnp.asarray(xs[:n]))
    np.testing.assert_allclose(run["dx"], want, rtol=1e-5)


# 2. a condition on a dim used as a value
def test_a_dim_condition_as_a_value(executor):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a = tl.zeros((2,)) + 1.0
        y = tl.where(t < 2, a, a * 3.0) + tl.where((t >= 3) & tl.eq(t % 2, 1), 10.0, 0.0)
    run = compile_(ctx, {T: 6}, {"y": y}, executor).run()
    want = np.array([1, 1, 3, 13, 3, 13], np.float32)[:, None] * np.ones(2, np.float32)
    np.testing.assert_array_equal(run["y"], want)


# 3. the gradient of a whole-range read, vectorised, at a bound that is not a power of two
@pytest.mark.parametrize("n", [20, 7])
def test_gradient_of_a_whole_range_read_at_any_bound(executor, n):
    xs = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(xs, domain=(t,))
        (dx,) = tl.grad((x[0:T] * x[0:T]).sum(), [x])
    run = compile_(ctx, {T: n}, {"dx": dx}, executor).run()
    want = jax.grad(lambda v: (v * v).sum())(jnp.asarray(xs))
    np.testing.assert_allclose(run["dx"], want, rtol=1e-6)


# 4. a program whose only effects are sinks
def test_a_program_of_sinks_only(executor):
    calls = []
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.placeholder((), "float32", domain=(t,))
        x[0] = tl.ones(())
        x[t] = x[t - 1] * 2.0
        tl.sink(x, lambda p, v: calls.append((p["t"], float(v))))
    run = compile_(ctx, {T: 5}, {}, executor).run()
    assert calls == [(k, 2.0 ** k) for k in range(5)]
    assert run.bounds == {"T": 5}


# 5. integer division and remainder by zero, and negative integer powers
def test_integer_division_by_zero_follows_jax_numpy(executor):
    a = np.array([7, -7, 0, 5], np.int32)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(np.stack([a, a]), domain=(t,))
        z = tl.from_array(np.zeros((2, 4), np.int32), domain=(t,))
        q, r, p = x // z, x % z, x ** (z - 1)
    run = compile_(ctx, {T: 2}, {"q": q, "r": r, "p": p}, executor).run()
    zero = jnp.zeros(4, jnp.int32)
    for name, fn in (("q", jnp.floor_divide), ("r", jnp.remainder)):
        np.testing.assert_array_equal(run[name][0], fn(jnp.asarray(a), zero))
    np.testing.assert_array_equal(run["p"][0], jnp.asarray(a) ** (zero - 1))


# 6. random numbers: bit for bit the same on every executor, under every pass switch
@pytest.mark.parametrize("vectorise", [True, False])
def test_random_numbers_are_bit_identical(executor, vectorise):
    def program():
        ctx = tl.Context(dims=("b", "t"))
        b, t = ctx.dims
        B, T = ctx.bounds
        with ctx:
            n = tl.random.normal((5,), domain=(b, t), seed=3)
            u = tl.random.uniform((5,), domain=(t,), seed=4, minval=-2.0, maxval=3.0)
        return ctx, {B: 3, T: 7}, {"n": n, "u": u}

    check_vs_reference(*program(), executor, exact=True, vectorise=vectorise)


# 7. a tl.until loop that ends early: a placeholder's branch taken only there (the gradient of
# a read of t + 2 is zeros where T <= 2) had no store in a plan made at the max, so its
# statement was left out ("no branch holds"); and a value shaped by the bound (a read of
# t:T) left a lax.cond of the XLA program, which cannot make its zeros (random programs)
def _drawn_arrays(a, t):
    """The two arrays of the random programs cases 7 and 8 were found in: over ``(a,)`` and
    ``(a, t)``, 2 x 6 points."""
    return (tl.from_array(np.random.RandomState(2527).uniform(-1, 1, 2).astype("float32"),
                          domain=(a,)),
            tl.from_array(np.random.RandomState(13384).uniform(-1, 1, (2, 6)).astype("float32"),
                          domain=(a, t)))


def _ends_early(grad_of_range: bool):
    ctx = tl.Context(dims=("a", "b", "t"))
    (a, b, t), (A, B, T) = ctx.dims, ctx.bounds
    with ctx:
        v0, v1 = _drawn_arrays(a, t)
        v2 = tl.placeholder((), "float32", domain=(b, t))
        v2[b, t + 2] = v2 * -0.5 + v0[0:A].max(axis=0) * 0.5
        v2[t < 2] = tl.where(b < 1, tl.tanh(v1[0, 0:t + 1].max(axis=0)),
                             tl.maximum(v1[0, 0], v0[0]))
        v4 = v2[0, tl.max(0, t - 2):t + 1].sum(axis=0) * 0.25
        grads = tl.grad(v2, [v0, v1] if grad_of_range else [v0])
        done = v4 > 0.154
        outputs = {"v4": v4, **{f"d{k}": g for k, g in enumerate(grads)}}
        if grad_of_range:
            outputs["rest"] = v1[0, t:T].mean(axis=0)
            tl.sink(v2, lambda p, v: None)
    return ctx, {A: 2, B: 2, T: tl.until(done, max=6)}, outputs


@pytest.mark.parametrize("grad_of_range", [False, True])
def test_a_branch_taken_only_where_a_loop_ends_early(executor, grad_of_range):
    config = ({"check_invariants": True, "tile_block": 2, "fold_constants": False, "dce": False,
               "vectorise": False, "incrementalise": False} if grad_of_range else {})
    run = check_vs_reference(*_ends_early(grad_of_range), executor, **config)
    assert run.bounds["T"] == 2  # the loop did end early


# 8. a tl.until condition read from a batch placeholder's first steps (v3[0] from v2[0, 0]):
# no loop over t alone runs its recurrence (the fusion scheduler declines), and isl computes
# the next step's input after the condition, under ``T - 2 >= 0``, which the check of
# points ahead of the condition refused (random programs)
def test_a_condition_read_from_a_batch_placeholders_first_steps(executor):
    ctx = tl.Context(dims=("a", "b", "t"))
    (a, b, t), (A, B, T) = ctx.dims, ctx.bounds
    with ctx:
        v0, v1 = _drawn_arrays(a, t)
        v2 = tl.placeholder((), "float32", domain=(b, t))
        v2[t < 2] = tl.where(b < 1, tl.tanh(v1[0:A, t].sum(axis=0)), tl.tanh(v0[0]))
        v2[b, t + 2] = v2[0:B, t].mean(axis=0) * 0.5 + (
            (v2[b, 0:t + 1].mean(axis=0) + v2[b, tl.max(0, t - 1)]) * 0.25 + v2) * 0.25
        v3 = tl.placeholder((2,), "float32", domain=(t,))
        v3[t] = tl.tanh(v3[tl.max(0, t - 3):t].transpose(1, 0).max(axis=(1,))
                        + v1[0, tl.max(0, t - 2)])
        v3[0] = v2[0, 0] * 0.25 * (v2[B - 1, tl.max(0, t - 1)] * 0.25) - 1.0
        done = v3.max(axis=-1) > 0.403
    run = check_vs_reference(ctx, {A: 2, B: 2, T: tl.until(done, max=6)}, {"v3": v3}, executor)
    assert 1 < run.bounds["T"] < 6


# 9. an output that vectorisation found to be a value's rows taken in order: the value held
# the batch dim as its last axis, and the output came back transposed (a gradient over
# (b, t) as (T, B): with B == T, silently; random programs)
def test_a_gradient_whose_rows_are_one_value_keeps_its_axes(executor):
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        v0 = tl.from_array(np.arange(9, dtype=np.float32).reshape(3, 3) / 9 - 0.3,
                           domain=(b, t))
        v2 = tl.placeholder((1,), "float32", domain=(b, t))
        v2[b, t] = v2[b, 0:t].transpose(1, 0).max(axis=(1,)) * 0.5
        v2[b, 0] = tl.tanh(v0[0:B, t].sum(axis=0)) + tl.zeros((1,))
        (d_v0,) = tl.grad(v2.sum(axis=-1), [v0])
    run = check_vs_reference(ctx, {B: 3, T: 3}, {"d_v0": d_v0}, executor)
    assert np.count_nonzero(run["d_v0"][:, 0]) == 3 and not run["d_v0"][:, 1:].any()


# 10. a tl.until loop whose condition isl computed partly after the loop (its last two points
# peeled): there they ran again at the bound reached, reading a constant the loop had freed
# when it ended early (random programs)
def test_a_condition_is_computed_only_in_its_loop(executor):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        v0 = tl.from_array(np.random.RandomState(154).uniform(-1, 1, (7, 2)).astype("float32"),
                           domain=(t,))
        v1 = tl.placeholder((2,), "float32", domain=(t,))
        v1[t < 2] = tl.where(t < 2, tl.where(t < 1, v0[0:T].transpose(1, 0).max(axis=(1,)),
                                             v0[tl.max(0, t - 2)]),
                             v0[tl.max(0, t - 1):t + 1].transpose(1, 0).max(axis=(1,)))
        v1[t] = v1[t - 1] * 0.5 + (v0[T - 1] - v0[t - 2] - (tl.zeros(()) + t) * 0.25) * 0.25
        v3 = tl.placeholder((2,), "float32", domain=(t,))
        v3[t] = v3[tl.max(0, t - 3):t].transpose(1, 0).max(axis=(1,)) * 0.5 + ((
            v1[tl.max(0, t - 1):t + 1].sum(axis=0) * 0.125 * 4.0).astype("int32") % 2
        ).astype("float32")
        v3[t < 1] = 0.0
        v4 = tl.placeholder((2,), "float32", domain=(t,))
        v4[t < 1] = ((tl.where(t < 2, v3[tl.max(0, t - 1):t + 1].transpose(1, 0).max(axis=(1,)),
                               v3[tl.min(t + 1, T - 1)]) * 4.0).astype("int32") // 3
                     ).astype("float32") * 0.25
        v4[t] = v4[tl.max(0, t - 3):t].mean(axis=0) * 0.5 + v4[tl.max(0, t - 3):t].mean(
            axis=0) * 0.25
        done = v0.max(axis=-1) > 0.16330593824386597
    run = check_vs_reference(ctx, {T: tl.until(done, max=7)}, {"v4": v4}, executor,
                             check_invariants=True, tile_block=2, simplify=False,
                             fold_constants=False, contract=False, tile=False, vectorise=False,
                             incrementalise=False)
    assert run.bounds["T"] == 1


# 11. a tl.until loop that ends early, and the gradient of a read up to its bound (v0[t:T] in
# the first step's branch): an op with points only where the loop ends early is held whole
# (case 7), and its shape, which the bound gives, is sized for the largest bound it can
# have; the plan raised ExprError "T is not a bound" (random programs)
def test_a_shape_given_by_a_bound_where_the_loop_ends_early(executor):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        v0 = tl.from_array(np.random.RandomState(5482).uniform(-1, 1, (8, 2)).astype("float32"),
                           domain=(t,))
        v1 = tl.placeholder((2,), "float32", domain=(t,))
        v1[t] = tl.tanh(v1[0:t].mean(axis=0) + tl.where(
            t < 7, v0[0:t + 1].mean(axis=0), v0[0:T].transpose(1, 0).max(axis=(1,))))
        v1[t < 1] = v0[t:T].sum(axis=0) * 0.25
        (d_v0,) = tl.grad(v1.sum(axis=-1), [v0])
        done = v0.max(axis=-1) > -0.2324187010526657
    run = check_vs_reference(ctx, {T: tl.until(done, max=8)}, {"d_v0": d_v0}, executor)
    assert run.bounds["T"] == 1
    np.testing.assert_array_equal(run["d_v0"], np.full((1, 2), 0.25, np.float32))
