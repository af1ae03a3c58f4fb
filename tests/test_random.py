"""``tl.random``: values keyed by (seed, stream, point) do not depend on the executor, the
passes, vectorisation, the bounds or where in a program they are read."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tempo_lab as tl

CONFIGS = [tl.CompileConfig(executor="reference"), tl.CompileConfig(),
           tl.CompileConfig(vectorise=False, fuse=False, cse=False),
           *(tl.CompileConfig(executor=e) for e in ("xla", "codegen", "interpreter"))]


def program():
    ctx = tl.Context(dims=("b", "t"))
    b, t = ctx.dims
    with ctx:
        u = tl.random.uniform((3,), domain=(b, t), seed=1, minval=-2.0, maxval=3.0)
        z = tl.random.normal((2, 2), domain=(t,), seed=1)
        c = tl.random.normal((4000,), seed=2)
        acc = tl.placeholder((3,), domain=(b, t))  # the same values read inside a recurrence
        acc[b, 0] = u
        acc[b, t] = acc[b, t - 1] + u
    return ctx, {"u": u, "z": z, "c": c, "acc": acc}


def run(config, bounds=(2, 5)):
    ctx, outs = program()
    B, T = ctx.bounds
    return ctx.compile(bounds={B: bounds[0], T: bounds[1]}, outputs=outs, config=config).run()


def test_same_values_on_every_executor_and_pass_combination():
    base = run(CONFIGS[0])
    for config in CONFIGS[1:]:
        res = run(config)
        for name in ("u", "z", "c"):  # bit-identical: integer arithmetic, exact conversion
            np.testing.assert_array_equal(res[name], base[name], err_msg=str(config))
        np.testing.assert_allclose(res["acc"], base["acc"], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(base["acc"], np.cumsum(base["u"], axis=1), rtol=1e-6)


def test_values_do_not_depend_on_the_bounds():
    small, large = run(CONFIGS[0], (2, 5)), run(CONFIGS[1], (3, 9))
    np.testing.assert_allclose(large["u"][:2, :5], small["u"], rtol=1e-6)
    np.testing.assert_allclose(large["z"][:5], small["z"], rtol=1e-6, atol=1e-7)


def test_distributions_and_independence():
    res = run(CONFIGS[0])
    u, c = res["u"], res["c"]
    assert u.min() >= -2.0 and u.max() < 3.0
    assert abs(c.mean()) < 0.06 and abs(c.std() - 1.0) < 0.05
    assert len(np.unique(u)) == u.size  # points and elements get different values
    assert not np.allclose(res["z"][0], res["z"][1])


def test_streams_and_seeds_differ():
    ctx = tl.Context(dims=("t",))
    (t,) = ctx.dims
    with ctx:
        a = tl.random.uniform((8,), domain=(t,), seed=0)
        b = tl.random.uniform((8,), domain=(t,), seed=0)  # a second call: another stream
        c = tl.random.uniform((8,), domain=(t,), seed=7)
    res = ctx.compile(bounds={ctx.bounds[0]: 3}, outputs={"a": a, "b": b, "c": c}).run()
    assert not np.allclose(res["a"], res["b"]) and not np.allclose(res["a"], res["c"])


def test_integer_dtype_is_a_clear_error():
    ctx = tl.Context(dims=("t",))
    with ctx, pytest.raises(tl.DTypeError, match="floating") as e:
        tl.random.uniform((2,), domain=ctx.dims, dtype="int32")
    assert e.value.loc.file == __file__


def shuffled_program():
    """Minibatches of a shuffled epoch as dims: sample ``s`` of minibatch ``m`` in epoch ``e``
    is the rollout point at entry ``m * S + s`` of that epoch's permutation of ``B * T``."""
    ctx = tl.Context(dims=("e", "m", "s", "b", "t"))
    e, m, s, b, t = ctx.dims
    _, _, S, B, T = ctx.bounds
    with ctx:
        x = tl.random.normal((2,), domain=(b, t), seed=3)
        zero = tl.zeros((), "int32")           # dims and bounds as int tensors multiply
        flat = tl.random.permutation((zero + m) * S + s, (zero + B) * T, domain=(e,), seed=4)
        sample = tl.take(x[0:B, 0:T], (flat // T, flat % T))
    return ctx, {"x": x, "flat": flat, "sample": sample}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.executor + str(c.vectorise))
def test_permutations_shuffle_every_point_once_on_every_executor(config):
    ctx, outs = shuffled_program()
    E, M, S, B, T = ctx.bounds
    res = ctx.compile(bounds={E: 2, M: 3, S: 4, B: 3, T: 4}, outputs=outs, config=config).run()
    flat = np.asarray(res["flat"]).reshape(2, 12)
    for row in flat:
        assert sorted(row.tolist()) == list(range(12))
    assert (flat[0] != flat[1]).any()          # one permutation per epoch
    x = np.asarray(res["x"]).reshape(12, 2)
    np.testing.assert_array_equal(np.asarray(res["sample"]).reshape(2, 12, 2), x[flat])


@pytest.mark.parametrize("config", CONFIGS[:3], ids=lambda c: c.executor + str(c.vectorise))
def test_gradients_through_a_shuffled_take_match_jax(config):
    """Samples drawn with repetition (clamped positions too) from x over (b, t): the gradient
    of sum_s w_s x[b_s, t_s]^2 with respect to x, against jax.grad of the same gather."""
    import jax
    import jax.numpy as jnp

    ctx = tl.Context(dims=("s", "b", "t"))
    s, b, t = ctx.dims
    S, B, T = ctx.bounds
    rows = np.array([0, 2, 2, 1, 5, -1], np.int32)     # 5 and -1 are clamped to 2 and 0
    cols = np.array([3, 0, 0, 1, 2, 4], np.int32)
    with ctx:
        x = tl.random.normal((2,), domain=(b, t), seed=5)
        y = tl.take(x[0:B, 0:T], (tl.from_array(rows, (s,)), tl.from_array(cols, (s,))))
        w = tl.from_array(np.arange(1.0, 7.0, dtype=np.float32), (s,))
        g = tl.grad((w * (y * y).sum()).sum(), x)
    res = ctx.compile(bounds={S: 6, B: 3, T: 5}, outputs={"x": x, "g": g}, config=config).run()

    def loss(x):
        picked = x[jnp.clip(rows, 0, 2), cols]
        return (jnp.arange(1.0, 7.0) * (picked ** 2).sum(-1)).sum()

    np.testing.assert_allclose(res["g"], jax.grad(loss)(jnp.asarray(res["x"])), rtol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 10**6])
def test_permutation_entry_is_a_bijection_up_to_a_million(n):
    """The plain-JAX function behind tl.random.permutation visits every position of [0, n)
    once (cycle walking included), for tiny n and for n = 10^6 (a 32 x 31 250 rollout)."""
    import jax
    import jax.numpy as jnp

    keys = jnp.asarray(np.random.default_rng(n).random(tl.random.ROUNDS), jnp.float32)
    perm = jax.jit(jax.vmap(tl.random.permutation_entry, (0, None, None)))(
        jnp.arange(n), n, keys)
    np.testing.assert_array_equal(np.sort(np.asarray(perm)), np.arange(n))
    if n >= 1000:   # shuffled: position and value are uncorrelated
        assert abs(np.corrcoef(np.arange(n), np.asarray(perm))[0, 1]) < 0.1


def test_permutation_needs_integer_scalars_and_a_positive_n():
    ctx = tl.Context(dims=("b",))
    (b,) = ctx.dims
    with ctx:
        with pytest.raises(tl.DTypeError, match="index must be an integer scalar") as e:
            tl.random.permutation(tl.zeros(()), 10, domain=(b,))
        assert e.value.loc.file == __file__
        with pytest.raises(tl.DTypeError, match="n must be an integer scalar"):
            tl.random.permutation(b, 10.5, domain=(b,))
        with pytest.raises(tl.ArgumentError, match="at least 1"):
            tl.random.permutation(b, 0, domain=(b,))
        with pytest.raises(tl.DTypeError, match="n is uint32.*give it as int32"):
            tl.random.permutation(b, tl.zeros((), "uint32") + 5, domain=(b,))


def test_a_permutation_of_a_size_given_as_data_never_hangs(executor):
    """``n`` from data may be 0 at run time, an index may fall outside ``[0, n)``: cycle
    walking then has nothing to find; it stops (it looped forever) and the entry is -1."""
    ctx = tl.Context(dims=("b",))
    (b,) = ctx.dims
    (B,) = ctx.bounds
    sizes = np.array([0, 3, 5, 2], np.int32)
    with ctx:
        n = tl.from_array(sizes, domain=(b,))
        p = tl.random.permutation(b, n, domain=(b,), seed=1)
    got = ctx.compile(bounds={B: 4}, outputs={"p": p},
                      config=tl.CompileConfig(executor=executor)).run()["p"]
    assert got[0] == -1 and got[3] == -1 and 0 <= got[1] < 3 and 0 <= got[2] < 5


@settings(max_examples=8, deadline=None, derandomize=True, database=None)
@given(st.lists(st.integers(-3, 40), min_size=1, max_size=4), st.integers(1, 50),
       st.sampled_from(["reference", "interpreter", "codegen", "xla"]))
def test_permutations_of_sizes_given_as_data(sizes, indices, executor):
    """A size from data per instance (below 1 included) and indices past it: every index in
    ``[0, n)`` gets a distinct entry in ``[0, n)``, every other one -1, on every executor.
    Never a hang."""
    ctx = tl.Context(dims=("b", "j"))
    b, j = ctx.dims
    B, J = ctx.bounds
    with ctx:
        n = tl.from_array(np.array(sizes, np.int32), domain=(b,))
        p = tl.random.permutation(j, n, domain=(b,), seed=3)
    got = np.asarray(ctx.compile(bounds={B: len(sizes), J: indices}, outputs={"p": p},
                                 config=tl.CompileConfig(executor=executor)).run()["p"])
    for size, row in zip(sizes, got.reshape(len(sizes), indices)):
        inside = row[:max(size, 0)]
        assert sorted(inside.tolist()) == sorted(set(inside.tolist())), row
        assert ((inside >= 0) & (inside < size)).all(), (size, row)
        assert (row[max(size, 0):] == -1).all(), (size, row)
        if indices >= size > 0:
            assert sorted(inside.tolist()) == list(range(size))


def test_a_product_of_bounds_is_a_size_and_not_an_index():
    """``B * T`` as the README writes it: a value wherever a tensor goes (permutation's ``n``,
    arithmetic with tensors; a dim times a bound too), and as an index, or in more index
    arithmetic, an ExprError at the user's line that says how to use it."""
    ctx = tl.Context(dims=("b", "t", "j"))
    t, j, (B, T, J) = ctx.dims[1], ctx.dims[2], ctx.bounds
    with ctx:
        x = tl.from_array(np.ones((5, 2), np.float32), domain=(t,))
        p = tl.random.permutation(j, B * T)
        q = tl.random.permutation(j, (tl.zeros((), "int32") + B) * T)   # the form it needed
        scaled = x * (t * T) + (B * T * 2)
        for bad in (lambda: x[B * T - 1], lambda: x[t * T], lambda: x[0:B * T],
                    lambda: t < B * T, lambda: -(B * T)):
            with pytest.raises(tl.ExprError, match=r"test_random.py:\d+: (B|t) \* T is not an "
                               r"index expression.*tl.random.permutation\(j, (B|t) \* T\)"):
                bad()
    got = ctx.compile(bounds={B: 3, T: 5, J: 15},
                      outputs={"p": p, "q": q, "scaled": scaled}).run()
    assert sorted(np.asarray(got["p"]).tolist()) == list(range(15))
    assert sorted(np.asarray(got["q"]).tolist()) == list(range(15))
    np.testing.assert_array_equal(np.asarray(got["scaled"])[:, 0], np.arange(5) * 5 + 30)


LARGE_N = (2**31 - 1, 2**31 - 2, 2**30 + 1, 2**30, 2**30 - 1, 2**16 + 1)
SMALL_N = (1, 2, 3, 4, 5, 15, 16, 17, 63, 64)


def test_permutations_near_the_largest_int32_and_of_small_sizes(executor):
    """64 entries of permutations of ``n`` up to ``2**31 - 1`` are distinct and inside
    ``[0, n)`` (above ``2**30`` the Feistel domain is ``2**32``, whose step bound wrapped to 0
    in uint32: 28 of 64 entries were -1), and permutations of small ``n`` (powers of two and
    their neighbours) visit ``[0, n)`` once, -1 past it, on every executor."""
    ctx = tl.Context(dims=("j",))
    (j,), (J,) = ctx.dims, ctx.bounds
    with ctx:
        outs = {f"p{n}": tl.random.permutation(j, n, seed=5) for n in LARGE_N + SMALL_N}
    got = ctx.compile(bounds={J: 64}, outputs=outs,
                      config=tl.CompileConfig(executor=executor)).run()
    for n in LARGE_N:
        p = np.asarray(got[f"p{n}"]).astype(np.int64)
        assert ((p >= 0) & (p < n)).all() and len(set(p.tolist())) == 64, (n, p)
    for n in SMALL_N:
        p = np.asarray(got[f"p{n}"])
        assert sorted(p[:n].tolist()) == list(range(n)) and (p[n:] == -1).all(), (n, p)
