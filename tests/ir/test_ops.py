"""Spatial ops at one point: values against NumPy, result dtypes against ``jax.numpy``.

Each op is applied to tensors made with ``tl.from_array`` over a small domain ``(t,)``; the value
at every point is compared with the NumPy function applied to that point's array, and the dtype
(and shape) of the recurrent tensor and of the run's output with ``jax.eval_shape`` of the same
``jax.numpy`` function on the same per-point input types (Python scalars stay weakly typed).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from rt_helpers import (
    RTOL,
    compile_,
)

import tempo_lab as tl

# every test on each executor (conftest.py); compile_ and run compile for it
pytestmark = pytest.mark.usefixtures("executor")

T_ = 3
ATOL = 1e-6


def _data(shape, dtype, seed, kind="any"):
    r = np.random.default_rng(seed)
    full = (T_,) + tuple(shape)
    if dtype == "bool":
        return r.random(full) < 0.5
    if dtype == "int32":
        lo = 1 if kind == "pos" else -4
        return r.integers(lo, 5, size=full).astype(np.int32)
    if kind == "pos":
        return r.uniform(0.5, 2.0, size=full).astype(np.float32)
    return r.normal(size=full).astype(np.float32)


def check(tl_fn, jnp_fn, np_fn, specs, kind="any", rtol=RTOL, atol=ATOL):
    """specs: list of (shape, dtype) of the per-point inputs."""
    arrays = [_data(s, d, seed=i + 1, kind=kind) for i, (s, d) in enumerate(specs)]
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        ins = [tl.from_array(a, domain=(t,)) for a in arrays]
        y = tl_fn(*ins)
    want = jax.eval_shape(jnp_fn, *[jax.ShapeDtypeStruct(s, np.dtype(d)) for s, d in specs])
    assert y.dtype == want.dtype, f"tl gives {y.dtype}, jax.numpy gives {want.dtype}"
    assert tuple(y.shape) == tuple(want.shape)
    got = compile_(ctx, {T: T_}, {"y": y}).run()["y"]
    assert got.dtype == want.dtype
    assert got.shape == (T_,) + tuple(want.shape)
    for i in range(T_):
        with np.errstate(all="ignore"):
            exp = np.asarray(np_fn(*[a[i] for a in arrays]))
        if exp.dtype.kind in "biu" and got.dtype.kind in "biu":
            np.testing.assert_array_equal(got[i], exp)
        else:
            np.testing.assert_allclose(got[i].astype(np.float64), exp.astype(np.float64),
                                       rtol=rtol, atol=atol)
    return got


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


# ------------------------------------------------------------------------------------------------
# unary
# ------------------------------------------------------------------------------------------------
UNARY = [
    ("exp", tl.exp, jnp.exp, np.exp, "any"),
    ("log", tl.log, jnp.log, np.log, "pos"),
    ("sqrt", tl.sqrt, jnp.sqrt, np.sqrt, "pos"),
    ("tanh", tl.tanh, jnp.tanh, np.tanh, "any"),
    # jax.nn.sigmoid rejects ints; tl.sigmoid promotes them to float32 like jnp.tanh does
    ("sigmoid", tl.sigmoid, lambda x: jax.nn.sigmoid(x.astype(jnp.promote_types(x.dtype, "float32"))),
     _sigmoid, "any"),
    ("relu", tl.relu, jax.nn.relu, lambda x: np.maximum(x, 0), "any"),
    ("sin", tl.sin, jnp.sin, np.sin, "any"),
    ("cos", tl.cos, jnp.cos, np.cos, "any"),
    ("abs", tl.abs, jnp.abs, np.abs, "any"),
    ("abs_builtin", abs, jnp.abs, np.abs, "any"),
    ("neg", lambda x: -x, jnp.negative, np.negative, "any"),
    ("pos", lambda x: +x, lambda x: +x, lambda x: +x, "any"),
]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("name, f, jf, nf, kind", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, f, jf, nf, kind, dtype):
    check(f, jf, lambda x: nf(x.astype(np.float64) if dtype == "float32" else x),
          [((2, 3), dtype)], kind=kind)


@pytest.mark.parametrize("name, f, jf, nf", [u[:4] for u in UNARY if u[0] in (
    "exp", "log", "sqrt", "tanh", "sin", "cos", "abs")], ids=["exp", "log", "sqrt", "tanh", "sin",
                                                             "cos", "abs"])
def test_unary_on_bool(name, f, jf, nf):
    """jax.numpy promotes bools to float32 for transcendental ops; abs keeps bool."""
    check(f, jf, lambda x: nf(x.astype(np.float64)) if name != "abs" else x, [((2, 3), "bool")])


@pytest.mark.parametrize("name, f, nf", [("add", lambda a, b: a + b, np.logical_or),
                                         ("mul", lambda a, b: a * b, np.logical_and),
                                         ("maximum", lambda a, b: (tl if _is_rt(a) else jnp).maximum(a, b),
                                          np.logical_or),
                                         ("div", lambda a, b: a / b, np.true_divide)])
def test_bool_arithmetic_like_jnp(name, f, nf):
    """jnp: bool + bool is logical or, bool * bool logical and, bool / bool float32."""
    check(f, f, lambda a, b: nf(a, b) if name != "div" else nf(a.astype(float), b),
          [((2, 3), "bool"), ((2, 3), "bool")])


def test_unary_scalar_shape():
    check(tl.exp, jnp.exp, np.exp, [((), "float32")])


# ------------------------------------------------------------------------------------------------
# binary arithmetic and comparisons
# ------------------------------------------------------------------------------------------------
BINARY = [
    ("add", lambda a, b: a + b, np.add),
    ("sub", lambda a, b: a - b, np.subtract),
    ("mul", lambda a, b: a * b, np.multiply),
    ("div", lambda a, b: a / b, np.true_divide),
    ("floordiv", lambda a, b: a // b, np.floor_divide),
    ("mod", lambda a, b: a % b, np.mod),
    ("maximum", lambda a, b: tl.maximum(a, b) if _is_rt(a, b) else jnp.maximum(a, b),
     np.maximum),
    ("minimum", lambda a, b: tl.minimum(a, b) if _is_rt(a, b) else jnp.minimum(a, b),
     np.minimum),
    ("lt", lambda a, b: a < b, np.less),
    ("le", lambda a, b: a <= b, np.less_equal),
    ("gt", lambda a, b: a > b, np.greater),
    ("ge", lambda a, b: a >= b, np.greater_equal),
    ("eq", lambda a, b: a == b, np.equal),
    ("ne", lambda a, b: a != b, np.not_equal),
]


def _is_rt(*xs):
    return any(isinstance(x, tl.RecurrentTensor) for x in xs)


DTYPE_PAIRS = [("float32", "float32"), ("int32", "int32"), ("int32", "float32"),
               ("float32", "int32"), ("bool", "int32"), ("bool", "float32")]
SHAPE_PAIRS = [((2, 3), (2, 3)), ((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2,))]


def _np_binary(nf, da, db):
    def f(a, b):
        if nf in (np.floor_divide, np.mod) and ("int32" in (da, db)) and "float32" not in (da, db):
            b = np.where(b == 0, 1, b)
            return nf(a.astype(np.int64), b.astype(np.int64))
        return nf(a.astype(np.float64), b.astype(np.float64))
    return f


@pytest.mark.parametrize("da, db", DTYPE_PAIRS)
@pytest.mark.parametrize("name, f, nf", BINARY, ids=[b[0] for b in BINARY])
def test_binary_dtypes(name, f, nf, da, db):
    if name in ("floordiv", "mod", "div"):
        # avoid dividing by zero: the divisor is positive data
        def tf(a, b):
            return f(a, tl.abs(b) + 1) if db != "bool" else f(a, b.astype("int32") + 1)

        def jf(a, b):
            return f(a, jnp.abs(b) + 1) if db != "bool" else f(a, b.astype(jnp.int32) + 1)

        def npf(a, b):
            b = np.abs(b.astype(np.float64)) + 1
            if nf is np.true_divide or "float32" in (da, db):
                return nf(a.astype(np.float64), b)
            return nf(a.astype(np.int64), b.astype(np.int64))
        check(tf, jf, npf, [((2, 3), da), ((2, 3), db)])
        return
    check(f, f, _np_binary(nf, da, db), [((2, 3), da), ((2, 3), db)])


@pytest.mark.parametrize("sa, sb", SHAPE_PAIRS)
@pytest.mark.parametrize("name, f, nf", BINARY[:4] + BINARY[6:9],
                         ids=[b[0] for b in BINARY[:4] + BINARY[6:9]])
def test_binary_broadcasting(name, f, nf, sa, sb):
    check(f, f, _np_binary(nf, "float32", "float32"), [(sa, "float32"), (sb, "float32")])


def test_pow():
    check(lambda a, b: a ** b, lambda a, b: a ** b,
          lambda a, b: np.power(a.astype(np.float64), b.astype(np.float64)),
          [((2, 3), "float32"), ((2, 3), "float32")], kind="pos")
    check(lambda a, b: a ** b, lambda a, b: a ** b,
          lambda a, b: np.power(a.astype(np.int64), b.astype(np.int64)),
          [((2, 3), "int32"), ((2, 3), "int32")], kind="pos")
    check(lambda a: a ** 2, lambda a: a ** 2, lambda a: a.astype(np.float64) ** 2,
          [((3,), "float32")])
    check(lambda a: 2 ** a, lambda a: 2 ** a, lambda a: 2 ** a.astype(np.int64),
          [((3,), "int32")], kind="pos")
    check(lambda a: a ** 0.5, lambda a: a ** 0.5, lambda a: a.astype(np.float64) ** 0.5,
          [((3,), "int32")], kind="pos")


@pytest.mark.parametrize("dtype", ["int32", "int8", "uint8"])
def test_integer_division_by_zero_and_negative_powers_follow_jax_numpy(dtype):
    """One semantics everywhere (the reference interpreter included): jax.numpy's, with
    x // 0, x % 0 and negative integer exponents."""
    signed = dtype != "uint8"
    vals = np.array([7, -7, 3, 0, 1, -1, 100, -100] if signed else [7, 3, 0, 1, 200, 255], dtype)
    a, b = (x.ravel() for x in np.meshgrid(vals, vals))
    for name, fn in (("//", jnp.floor_divide), ("%", jnp.mod), ("**", jnp.power)):
        ctx = tl.Context(dims=("t",))
        (t,), (T,) = ctx.dims, ctx.bounds
        with ctx:
            x = tl.from_array(a[None], domain=(t,))
            y = tl.from_array(b[None], domain=(t,))
            z = {"//": x // y, "%": x % y, "**": x ** y}[name]
        out = compile_(ctx, {T: 1}, {"z": z}).run()["z"][0]
        np.testing.assert_array_equal(out, np.asarray(fn(a, b)), err_msg=f"{dtype} {name}")


# Python scalars are weakly typed: they never widen a tensor's dtype (jax.numpy rules).
SCALAR_CASES = [
    ("f32*2", lambda a: a * 2, "float32", lambda a: a * 2.0),
    ("f32*2.5", lambda a: a * 2.5, "float32", lambda a: a * 2.5),
    ("2-f32", lambda a: 2 - a, "float32", lambda a: 2.0 - a),
    ("i32*2", lambda a: a * 2, "int32", lambda a: a * 2),
    ("i32/2", lambda a: a / 2, "int32", lambda a: a / 2.0),
    ("2/i32", lambda a: 2 / (a * a + 1), "int32", lambda a: 2.0 / (a * a + 1)),
    ("i32*2.5", lambda a: a * 2.5, "int32", lambda a: a * 2.5),
    ("i32+True", lambda a: a + True, "int32", lambda a: a + 1),
    ("i32//3", lambda a: a // 3, "int32", lambda a: np.floor_divide(a, 3)),
    ("-7%i32", lambda a: -7 % (a * a + 1), "int32", lambda a: np.mod(-7, a * a + 1)),
    ("i32%3", lambda a: a % 3, "int32", lambda a: np.mod(a, 3)),
    ("f32%1.5", lambda a: a % 1.5, "float32", lambda a: np.mod(a, 1.5)),
    ("i32<2.5", lambda a: a < 2.5, "int32", lambda a: a < 2.5),
    ("f32==0", lambda a: a == 0, "float32", lambda a: a == 0),
    ("bool*1.0", lambda a: a * 1.0, "bool", lambda a: a * 1.0),
    ("bool+1", lambda a: a + 1, "bool", lambda a: a.astype(np.int64) + 1),
    ("max(i32,1.5)", lambda a: (tl.maximum(a, 1.5) if _is_rt(a) else jnp.maximum(a, 1.5)),
     "int32", lambda a: np.maximum(a, 1.5)),
    ("np.float32*i32", lambda a: np.float32(2) * a if _is_rt(a) else jnp.float32(2) * a,
     "int32", lambda a: 2.0 * a),
]


@pytest.mark.parametrize("name, f, dtype, nf", SCALAR_CASES, ids=[c[0] for c in SCALAR_CASES])
def test_python_scalars_are_weak(name, f, dtype, nf):
    check(f, f, lambda a: nf(a.astype(np.float64) if a.dtype == np.float32 else
                             (a.astype(np.int64) if a.dtype == np.int32 else a)),
          [((2, 3), dtype)])


def test_weak_scalar_result_types_match_jnp_result_type():
    ctx = tl.Context(dims=("t",))
    with ctx:
        for dt in ("float32", "int32", "bool"):
            x = tl.zeros((2,), dt)
            for s in (1, 2.5, True):
                if dt == "bool" and s is True:
                    continue
                for y, want in ((x + s, jnp.result_type(jnp.zeros((2,), dt), s)),
                                (s * x, jnp.result_type(s, jnp.zeros((2,), dt)))):
                    assert y.dtype == want, (dt, s, y.dtype, want)


def test_eq_ne_functions_on_tensors():
    check(lambda a, b: tl.eq(a, b) if _is_rt(a) else jnp.equal(a, b),
          lambda a, b: jnp.equal(a, b), np.equal, [((4,), "int32"), ((4,), "int32")])
    check(lambda a, b: tl.ne(a, b) if _is_rt(a) else jnp.not_equal(a, b),
          lambda a, b: jnp.not_equal(a, b), np.not_equal, [((4,), "int32"), ((4,), "int32")])
    check(lambda a: tl.eq(a, 1) if _is_rt(a) else jnp.equal(a, 1), lambda a: jnp.equal(a, 1),
          lambda a: a == 1, [((4,), "int32")])


# ------------------------------------------------------------------------------------------------
# logic and where
# ------------------------------------------------------------------------------------------------
def test_logic_ops_on_bools():
    specs = [((2, 3), "bool"), ((2, 3), "bool")]
    check(lambda a, b: a & b, lambda a, b: a & b, np.logical_and, specs)
    check(lambda a, b: a | b, lambda a, b: a | b, np.logical_or, specs)
    check(lambda a: ~a, lambda a: ~a, np.logical_not, specs[:1])
    check(lambda a, b: ~(a & b) | (a & ~b), lambda a, b: ~(a & b) | (a & ~b),
          lambda a, b: ~(a & b) | (a & ~b), specs)


def test_logic_of_comparisons():
    check(lambda a, b: (a > 0) & (b < 0.5) | ~(a < b), lambda a, b: (a > 0) & (b < 0.5) | ~(a < b),
          lambda a, b: ((a > 0) & (b < 0.5)) | ~(a < b), [((5,), "float32"), ((5,), "float32")])


@pytest.mark.parametrize("da, db", [("float32", "float32"), ("int32", "float32"),
                                    ("int32", "int32"), ("bool", "int32")])
def test_where(da, db):
    def f(c, a, b):
        w = tl.where if _is_rt(c) else jnp.where
        return w(c, a, b)
    check(f, f, np.where, [((2, 3), "bool"), ((2, 3), da), ((3,), db)])


def test_where_with_scalars():
    def f(c, a):
        w = tl.where if _is_rt(c) else jnp.where
        return w(c, a, 0.0)

    check(f, f, lambda c, a: np.where(c, a, 0.0), [((4,), "bool"), ((4,), "float32")])
    check(f, f, lambda c, a: np.where(c, a, 0.0), [((4,), "bool"), ((4,), "int32")])

    def g(a):
        w = tl.where if _is_rt(a) else jnp.where
        return w(a > 0, a, -a)

    check(g, g, np.abs, [((2, 2), "int32")])


# ------------------------------------------------------------------------------------------------
# reductions
# ------------------------------------------------------------------------------------------------
AXES = [None, 0, 1, -1, (0, 2), (1,), ()]


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=[str(a) for a in AXES])
@pytest.mark.parametrize("red", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reductions(red, axis, keepdims, dtype):
    def f(x):
        return getattr(x, red)(axis=axis, keepdims=keepdims)

    def jf(x):
        return getattr(jnp, red)(x, axis=axis, keepdims=keepdims)

    def nf(x):
        return getattr(np, red)(x.astype(np.float64), axis=axis, keepdims=keepdims)

    check(f, jf, nf, [((2, 3, 4), dtype)])


@pytest.mark.parametrize("red", ["sum", "mean"])
def test_reduction_functions(red):
    f = getattr(tl, red)
    jf = getattr(jnp, red)
    check(lambda x: f(x, axis=1) if _is_rt(x) else jf(x, axis=1), lambda x: jf(x, axis=1),
          lambda x: getattr(np, red)(x.astype(np.float64), axis=1), [((2, 3), "float32")])
    check(lambda x: f(x) if _is_rt(x) else jf(x), jf,
          lambda x: getattr(np, red)(x.astype(np.float64)), [((2, 3), "float32")])


def test_bool_reductions():
    check(lambda x: x.sum(), jnp.sum, lambda x: x.sum(), [((2, 3), "bool")])
    check(lambda x: x.sum(axis=0), lambda x: jnp.sum(x, axis=0), lambda x: x.sum(axis=0),
          [((2, 3), "bool")])
    check(lambda x: x.mean(axis=1), lambda x: jnp.mean(x, axis=1),
          lambda x: x.mean(axis=1), [((2, 3), "bool")])
    check(lambda x: x.max(axis=1), lambda x: jnp.max(x, axis=1), lambda x: x.max(axis=1),
          [((2, 3), "bool")])


# ------------------------------------------------------------------------------------------------
# layout
# ------------------------------------------------------------------------------------------------
LAYOUT = [
    ("reshape_tuple", lambda x: x.reshape((3, 4)), lambda x: x.reshape((3, 4))),
    ("reshape_args", lambda x: x.reshape(4, 3), lambda x: x.reshape(4, 3)),
    ("reshape_minus1", lambda x: x.reshape(-1), lambda x: x.reshape(-1)),
    ("reshape_minus1_2", lambda x: x.reshape((2, -1)), lambda x: x.reshape((2, -1))),
    ("reshape_fn", lambda x: (tl if _is_rt(x) else jnp).reshape(x, (12, 1)),
     lambda x: x.reshape((12, 1))),
    ("transpose", lambda x: x.transpose(), lambda x: x.transpose()),
    ("transpose_perm", lambda x: x.transpose((1, 0)), lambda x: x.transpose((1, 0))),
    ("transpose_args", lambda x: x.transpose(1, 0), lambda x: x.transpose(1, 0)),
    ("T", lambda x: x.T, lambda x: x.T),
    ("transpose_fn", lambda x: (tl if _is_rt(x) else jnp).transpose(x, (1, 0)),
     lambda x: x.transpose((1, 0))),
    ("expand0", lambda x: x.expand_dims(0), lambda x: np.expand_dims(x, 0)),
    ("expand_last", lambda x: x.expand_dims(-1), lambda x: np.expand_dims(x, -1)),
    ("expand_fn", lambda x: (tl if _is_rt(x) else jnp).expand_dims(x, 1),
     lambda x: np.expand_dims(x, 1)),
    ("expand_two", lambda x: x.expand_dims((0, 3)), lambda x: np.expand_dims(x, (0, 3))),
]


@pytest.mark.parametrize("name, f, nf", LAYOUT, ids=[c[0] for c in LAYOUT])
def test_layout(name, f, nf):
    jf = {"expand0": lambda x: jnp.expand_dims(x, 0), "expand_last":
          lambda x: jnp.expand_dims(x, -1), "expand_two": lambda x: jnp.expand_dims(x, (0, 3)),
          "expand_fn": lambda x: jnp.expand_dims(x, 1)}.get(name, f)
    check(f, jf, nf, [((3, 4), "float32")])


def test_transpose_3d():
    check(lambda x: x.transpose((2, 0, 1)), lambda x: x.transpose((2, 0, 1)),
          lambda x: x.transpose((2, 0, 1)), [((2, 3, 4), "int32")])
    check(lambda x: x.transpose(), lambda x: x.transpose(), lambda x: x.transpose(),
          [((2, 3, 4), "int32")])


def test_squeeze():
    check(lambda x: x.squeeze(), lambda x: jnp.squeeze(x), np.squeeze, [((1, 3, 1), "float32")])
    check(lambda x: x.squeeze(0), lambda x: jnp.squeeze(x, 0), lambda x: np.squeeze(x, 0),
          [((1, 3, 1), "float32")])
    check(lambda x: x.squeeze(-1), lambda x: jnp.squeeze(x, -1), lambda x: np.squeeze(x, -1),
          [((1, 3, 1), "float32")])
    check(lambda x: (tl if _is_rt(x) else jnp).squeeze(x, (0, 2)), lambda x: jnp.squeeze(x, (0, 2)),
          lambda x: np.squeeze(x, (0, 2)), [((1, 3, 1), "int32")])


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concatenate(axis):
    def f(a, b):
        return (tl if _is_rt(a) else jnp).concatenate([a, b], axis=axis)

    check(f, f, lambda a, b: np.concatenate([a, b], axis=axis),
          [((2, 2), "float32"), ((2, 2), "float32")])
    check(f, f, lambda a, b: np.concatenate([a.astype(np.float64), b], axis=axis),
          [((2, 2), "int32"), ((2, 2), "float32")])


def test_concatenate_uneven_and_three():
    def f(a, b, c):
        return (tl if _is_rt(a) else jnp).concatenate([a, b, c], axis=1)

    check(f, f, lambda a, b, c: np.concatenate([a, b, c], axis=1),
          [((2, 1), "int32"), ((2, 3), "int32"), ((2, 2), "int32")])
    check(lambda a: (tl if _is_rt(a) else jnp).concatenate([a, a * 2]),
          lambda a: jnp.concatenate([a, a * 2]), lambda a: np.concatenate([a, a * 2]),
          [((3,), "float32")])


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_stack(axis):
    def f(a, b):
        return (tl if _is_rt(a) else jnp).stack([a, b], axis=axis)

    check(f, f, lambda a, b: np.stack([a, b], axis=axis),
          [((2, 3), "float32"), ((2, 3), "float32")])


def test_stack_promotes_and_scalars():
    def f(a, b):
        return (tl if _is_rt(a) else jnp).stack([a, b, a])

    check(f, f, lambda a, b: np.stack([a, b.astype(np.float64), a]),
          [((), "float32"), ((), "int32")])


# ------------------------------------------------------------------------------------------------
# matmul
# ------------------------------------------------------------------------------------------------
MATMUL_SHAPES = [
    ((4,), (4,)),            # dot product -> scalar
    ((3, 4), (4,)),          # matrix @ vector
    ((4,), (4, 5)),          # vector @ matrix
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),     # batched @ matrix
    ((2, 3, 4), (2, 4, 5)),  # batched @ batched
    ((1, 3, 4), (2, 4, 5)),  # broadcast batch
    ((2, 1, 3, 4), (5, 4, 2)),
    ((2, 3, 4), (4,)),
]


@pytest.mark.parametrize("sa, sb", MATMUL_SHAPES, ids=[f"{a}@{b}" for a, b in MATMUL_SHAPES])
def test_matmul_shapes(sa, sb):
    npf = lambda a, b: np.matmul(a.astype(np.float64), b.astype(np.float64))
    check(lambda a, b: a @ b, lambda a, b: a @ b, npf, [(sa, "float32"), (sb, "float32")])
    check(lambda a, b: tl.matmul(a, b) if _is_rt(a) else jnp.matmul(a, b), jnp.matmul, npf,
          [(sa, "float32"), (sb, "float32")])


@pytest.mark.parametrize("da, db", [("int32", "int32"), ("int32", "float32"),
                                    ("float32", "int32")])
def test_matmul_dtypes(da, db):
    check(lambda a, b: a @ b, lambda a, b: a @ b,
          lambda a, b: np.matmul(a.astype(np.float64), b.astype(np.float64)),
          [((2, 3), da), ((3, 2), db)])


def test_matmul_with_numpy_constant_on_either_side():
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    check(lambda a: a @ w, lambda a: a @ w, lambda a: a.astype(np.float64) @ w,
          [((2, 3), "float32")])
    check(lambda a: w.T @ a, lambda a: w.T @ a, lambda a: w.T @ a.astype(np.float64),
          [((3, 2), "float32")])


# ------------------------------------------------------------------------------------------------
# softmax, astype
# ------------------------------------------------------------------------------------------------
def _np_softmax(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_softmax(axis, dtype):
    check(lambda x: tl.softmax(x, axis=axis) if _is_rt(x) else jax.nn.softmax(x, axis=axis),
          lambda x: jax.nn.softmax(x, axis=axis), lambda x: _np_softmax(x, axis),
          [((3, 4), dtype)])


def test_softmax_default_axis_and_large_values():
    check(lambda x: tl.softmax(x * 100.0) if _is_rt(x) else jax.nn.softmax(x * 100.0),
          lambda x: jax.nn.softmax(x * 100.0), lambda x: _np_softmax(x * 100.0, -1),
          [((5,), "float32")])


ASTYPE = [("float32", "int32"), ("float32", "bool"), ("int32", "float32"), ("int32", "bool"),
          ("bool", "float32"), ("bool", "int32"), ("float32", "float32")]


@pytest.mark.parametrize("src, dst", ASTYPE)
def test_astype(src, dst):
    def f(x):
        return x.astype(dst) if _is_rt(x) else x.astype(jnp.dtype(dst))

    def nf(x):
        y = x * 2.7 if src == "float32" else x  # exercise truncation toward zero
        return y.astype(dst)

    check(lambda x: f(x * 2.7) if src == "float32" else f(x),
          lambda x: f(x * 2.7) if src == "float32" else f(x), nf, [((2, 3), src)])


def test_astype_accepts_numpy_dtypes():
    check(lambda x: x.astype(np.int32), lambda x: x.astype(np.int32),
          lambda x: x.astype(np.int32), [((3,), "float32")])
    check(lambda x: x.astype(np.float64) if _is_rt(x) else x.astype(jnp.float32),
          lambda x: x.astype(jnp.float32), lambda x: x.astype(np.float32), [((3,), "int32")])


# ------------------------------------------------------------------------------------------------
# spatial getitem
# ------------------------------------------------------------------------------------------------
def _spatial(key):
    """x[(t,) + key] on a tensor over (t,) versus x[key] on the point's array."""
    def f(x):
        return x[(x.domain[0],) + key] if _is_rt(x) else x[key]
    return f


SPATIAL_KEYS = [
    (0,), (-1,), (1, 2), (slice(1, 3),), (slice(None, None, 2),), (slice(None, None, -1),),
    (Ellipsis, 0), (0, Ellipsis), (Ellipsis,), (None,), (slice(None), None), (1, slice(0, 2)),
    (Ellipsis, slice(1, None)), (-2, -1, 0),
]


@pytest.mark.parametrize("key", SPATIAL_KEYS, ids=[str(k) for k in SPATIAL_KEYS])
def test_spatial_getitem(key):
    f = _spatial(key)
    check(f, f, lambda x: x[key], [((3, 4, 2), "float32")])


def test_spatial_getitem_after_shifted_point():
    data = np.arange(5 * 3, dtype=np.float32).reshape(5, 3)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(t,))
        y = tl.placeholder((), "float32", domain=(t,))
        y[0] = tl.constant(-1.0)
        y[t] = x[t - 1, 0] + x[t, -1]
        z = x[tl.max(t - 2, 0), 1:]
    res = compile_(ctx, {T: 5}, {"y": y, "z": z}).run()
    exp = np.array([-1.0] + [data[i - 1, 0] + data[i, -1] for i in range(1, 5)])
    np.testing.assert_allclose(res["y"], exp, rtol=RTOL)
    np.testing.assert_allclose(res["z"], data[np.maximum(np.arange(5) - 2, 0), 1:], rtol=RTOL)


def test_chained_spatial_getitem_on_op_result():
    def f(x):
        t = x.domain[0] if _is_rt(x) else None
        y = x * 2.0
        return y[t, 1][t, ::-1] if _is_rt(x) else y[1][::-1]

    check(f, f, lambda x: (x * 2.0)[1][::-1], [((3, 4), "float32")])


# ------------------------------------------------------------------------------------------------
# composite: a small MLP at each point
# ------------------------------------------------------------------------------------------------
def test_mlp_composite():
    r = np.random.default_rng(0)
    w1 = r.normal(size=(4, 8)).astype(np.float32)
    w2 = r.normal(size=(8, 3)).astype(np.float32)

    def f(x):
        m = tl if _is_rt(x) else jnp
        act = tl.relu if _is_rt(x) else jax.nn.relu
        sm = tl.softmax if _is_rt(x) else jax.nn.softmax
        h = act(x @ w1 + 0.1)
        return sm(m.tanh(h @ w2), axis=-1).sum(axis=-1, keepdims=True) * h.mean()

    def nf(x):
        h = np.maximum(x.astype(np.float64) @ w1 + 0.1, 0)
        return _np_softmax(np.tanh(h @ w2), -1).sum(axis=-1, keepdims=True) * h.mean()

    check(f, f, nf, [((5, 4), "float32")], rtol=1e-4)


# ------------------------------------------------------------------------------------------------
# weak types from Python scalars and dim values (jax's weak_type)
# ------------------------------------------------------------------------------------------------
WEAK_CASES = [
    ("const_float", lambda c, i, h, t: c, lambda c, i, h: c),
    ("const_times_int", lambda c, i, h, t: c * 3, lambda c, i, h: c * 3),
    ("int_const_plus_float", lambda c, i, h, t: i + 0.5, lambda c, i, h: i + 0.5),
    ("f16_plus_weak_chain", lambda c, i, h, t: h + c * 3, lambda c, i, h: h + c * 3),
    ("f16_times_int_const", lambda c, i, h, t: h * i, lambda c, i, h: h * i),
    ("f16_plus_dim", lambda c, i, h, t: h + t, lambda c, i, h: h + i),
    ("int_const_div", lambda c, i, h, t: i / 2, lambda c, i, h: i / 2),
    ("astype_is_strong", lambda c, i, h, t: (c * 2).astype("float32") + h,
     lambda c, i, h: (c * 2).astype(jnp.float32) + h),
    ("exp_weak", lambda c, i, h, t: tl.exp(c) + h, lambda c, i, h: jnp.exp(c) + h),
]


@pytest.mark.parametrize("name, f, jf", WEAK_CASES, ids=[w[0] for w in WEAK_CASES])
def test_weak_types(name, f, jf):
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        c = tl.constant(2.0)                  # weak float32, like jnp.asarray(2.0)
        i = tl.constant(5)                    # weak int32, like jnp.asarray(5)
        h = tl.zeros((2,), "float16")
        y = f(c, i, h, t)
    want = jax.eval_shape(lambda: jf(jnp.asarray(2.0), jnp.asarray(5),
                                     jnp.zeros((2,), jnp.float16)))
    assert y.dtype == want.dtype
    assert y.type.weak == want.weak_type
    got = compile_(ctx, {T: 2}, {"y": y}).run()["y"]
    assert got.dtype == want.dtype


def test_every_op_has_each_rule_or_says_it_has_none():
    """One home per op: its OpDef carries the NumPy (reference), JAX and VJP rules, each a
    function or the explicit NONE; flags are from the documented set; a combining op exists."""
    import tempo_lab.runtime.jax_ops  # noqa: F401 - registers the JAX rules
    import tempo_lab.runtime.reference  # noqa: F401 - registers the NumPy rules
    from tempo_lab.ir.ops import CATALOG, FLAGS, NONE

    assert len(CATALOG) > 40
    for name, op in CATALOG.items():
        for kind in ("numpy", "jax", "vjp"):
            r = getattr(op, kind)
            assert r is NONE or callable(r), f"{name} has no {kind} rule"
        assert op.flags <= FLAGS, f"{name}: unknown flags {op.flags - FLAGS}"
        assert op.combine is None or CATALOG[op.combine].category == "elementwise", name
        # the reference computes every op; only values the host hands over have no kernel
        assert op.numpy is not NONE, name
        assert (op.jax is NONE) == ("value" in op.flags), name


# -- 16-bit floats ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16bit_sums_means_and_softmax_accumulate_in_float32(dtype):
    """A float16 mean of 60 000s was inf on every compiled executor (summed in float16) and
    60 000 in the reference and NumPy: every executor accumulates 16-bit floats in float32 and
    rounds once (``tl.ir.ops.accumulator``)."""
    dt = np.dtype(tl.ir.ops.canonical_dtype(dtype))
    big = 60000.0 if dtype == "float16" else 3e38
    data = np.full((4, 3), big, dt)
    data[:, 2] = -big
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(t,))
        outs = {"causal_mean": x[0:t + 1].mean(axis=0), "mean": x.mean(),
                "row_sum": x.sum(axis=-1), "softmax": tl.softmax(x * 1e-4, axis=-1)}
    got = compile_(ctx, {T: 4}, outs).run()
    f32 = data.astype(np.float32)
    want = {"causal_mean": np.stack([f32[:k + 1].mean(0) for k in range(4)]),
            "mean": f32.mean(-1), "row_sum": f32.sum(-1),
            "softmax": _softmax(f32 * np.float32(1e-4))}
    for name, w in want.items():
        assert got[name].dtype == dt, name
        np.testing.assert_allclose(got[name].astype(np.float32), w.astype(dt).astype(np.float32),
                                   rtol=1e-2, err_msg=name)
    if dtype == "float16":   # bfloat16 has float32's range: its sums overflow alike
        assert np.isfinite(got["causal_mean"].astype(np.float32)).all()


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_16bit_constant_factors_overflow_as_numpy_does():
    """XLA folded the constants of ``(x * 1000) / 1000`` to ``x`` and gave 65 504 where NumPy
    and the other executors overflow to inf; a constant a 16-bit op reads is opaque to it."""
    data = np.full((2, 3), 65504, np.float16)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        x = tl.from_array(data, domain=(t,))
        y = (x * 1000.0) / 1000.0
        z = (x * 0.5) * 2.0
    got = compile_(ctx, {T: 2}, {"y": y, "z": z}).run()
    np.testing.assert_array_equal(got["y"], (data * np.float16(1000)) / np.float16(1000))
    np.testing.assert_array_equal(got["z"], data)


def test_16bit_tiled_sums_add_the_blocks_in_float32(executor):
    """A tiled sum or matmul over ``0:t+1`` rounded each block's partial result to float16:
    60 000, 60 000, -60 000, -60 000 in blocks of 2 gave inf, then NaN from t = 3 on, where the
    untiled sum, the reference and NumPy give 60 000, inf, 60 000, 0. The partials are float32,
    rounded once."""
    x = np.array([6e4, 6e4, -6e4, -6e4, 1, 2, 3, 4], np.float16)[:, None]
    ones = np.ones_like(x)
    ctx = tl.Context(dims=("t",))
    (t,), (T,) = ctx.dims, ctx.bounds
    with ctx:
        a, b = tl.from_array(x, domain=(t,)), tl.from_array(ones, domain=(t,))
        outs = {"sum": a[0:t + 1].sum(axis=0), "matmul": a[0:t + 1].T @ b[0:t + 1]}
    got = ctx.compile(bounds={T: 8}, outputs=outs,
                      config=tl.CompileConfig(executor=executor, tile_block=2)).run()
    with np.errstate(over="ignore"):
        want = np.cumsum(x.astype(np.float32), axis=0).astype(np.float16)
    np.testing.assert_array_equal(got["sum"], want)
    np.testing.assert_array_equal(got["matmul"].reshape(8, 1), want)


def test_16bit_streamed_sums_run_in_float32(executor):
    """A sum over the whole of ``t`` streamed into ``t``'s loop (``stream=True``) was a float16
    running sum: 60 000, 60 000, -60 000, -60 000, 1, 2 gave inf from the second step on where
    the sum is 3. The running sum is float32, rounded once at the last step."""
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    data = np.array([[6e4, 6e4, -6e4, -6e4, 1, 2]], np.float16)
    with ctx:
        u = tl.from_array(data, domain=(b, t))
        x = tl.placeholder((), domain=(b, t), name="x", dtype="float16")
        x[b, 0] = u
        x[b, t] = 0.5 * x[b, t - 1] * 0.0 + u   # a recurrence: the sum runs in its loop
        total = x[b, 0:T].sum()
    prog = ctx.compile(bounds={B: 1, T: 6}, outputs={"total": total},
                       config=tl.CompileConfig(executor=executor, stream=True,
                                               check_invariants=True))
    got = prog.run()["total"]
    assert got.dtype == np.float16 and got.tolist() == [3.0]
    if executor != "reference":  # no passes there
        assert "0:T" not in prog.schedule.code()


def test_16bit_ragged_means_add_and_count_in_float32(executor):
    """A mean over a ragged bound (``tl.lengths``) is a masked sum over a count: of float16
    60 000s it was inf (the float16 sum) on every compiled executor, 60 000 in the reference."""
    data = np.full((2, 6), 6e4, np.float16)
    data[1, 4:] = -6e4   # past instance 1's end: left out
    ctx = tl.Context(dims=("b", "t"))
    (b, t), (B, T) = ctx.dims, ctx.bounds
    with ctx:
        m = tl.from_array(data, domain=(b, t))[b, 0:T].mean()
    got = ctx.compile(bounds={B: 2, T: tl.lengths(np.array([6, 4]), over=b)}, outputs={"m": m},
                      config=tl.CompileConfig(executor=executor)).run()["m"]
    assert got.dtype == np.float16 and got.tolist() == [6e4, 6e4]
