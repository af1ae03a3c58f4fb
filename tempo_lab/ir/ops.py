"""The primitive-op catalog: every op kind the SDG may hold, each an ``OpDef`` that is the one
home of what the op means: shape and dtype inference, the NumPy rule (the reference
interpreter), the JAX rule (the kernels), the VJP (``tl.grad``) and flags that passes and
executors read instead of lists of kinds. The rules are written where their vocabulary lives
(``runtime/reference.py``, ``runtime/jax_ops.py``, ``frontend/vjp.py``) and registered here by
name; an elementwise op is one row of ``UNARY``/``BINARY`` below, which gives all four.
``tests/ir/test_ops.py`` checks that every op has every rule or says it has none (``NONE``).

Shapes are tuples of ints and (for ranges read through a slice such as ``0:t+1``) symbolic index
expressions. Dtypes follow ``jax.numpy`` promotion, including weak types for Python scalars and
dims, so a program means the same on the reference interpreter and on JAX.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from ..errors import DTypeError, ShapeError
from ..symbolic import Cond, Const, Expr

Dim_ = int | Expr


@dataclass(frozen=True)
class TensorType:
    """Spatial shape, dtype and JAX weak-typedness of an op's value at one point."""

    shape: tuple[Dim_, ...]
    dtype: np.dtype
    weak: bool = False

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_static(self) -> bool:
        return all(isinstance(s, int) for s in self.shape)

    def __str__(self) -> str:
        return f"{self.dtype.name}[{', '.join(map(str, self.shape))}]"


NONE = "none"  # a rule an op does not have, said explicitly (e.g. the VJP of a comparison)

# Flags (read by passes and executors; each names a property, never a list of kinds):
#   value      the kernel gets its value from the host (constant, array, dim value, tl.source)
#   array      a host array, uploaded to the device once (const, from_array)
#   effect     calls the user's Python function (tl.sink, tl.source): never merged or moved
#   nonempty   no value over an empty range (max, min): checked at run time
#   no_grad    no gradient flows through it (integer or boolean results, sources)
#   ct_only    its VJP reads only the cotangent, never a forward value
#   bwd_only   made by tl.grad only; no VJP of its own (no second order through it)
#   along      acts pointwise along an axis it keeps (tiling may split that axis in blocks)
#   relayout   only moves axes (tiling lays a softmax's row factors out through it)
#   keeps_zeros  zero padding in, zero padding out (the XLA executor reads such values in place)
FLAGS = frozenset({"value", "array", "effect", "nonempty", "no_grad", "ct_only", "bwd_only",
                   "along", "relayout", "keeps_zeros"})


@dataclass
class OpDef:
    name: str
    category: str  # source | elementwise | reduce | layout | linalg | control | effect
    infer: Callable[[list[TensorType], dict], TensorType]
    flags: frozenset = frozenset()
    combine: str | None = None  # the elementwise op that combines partial results (tiling)
    numpy: Callable | str | None = None   # (op, ins, in_types, env) -> ndarray
    jax: Callable | str | None = None     # (op, xs, lens, in_types, out_shape) -> array
    vjp: Callable | str | None = None     # (node, g, xs, y) -> cotangent per input
    # (node, g, xs, k) -> input k's cotangent summed over a leading axis of points that g and
    # the other inputs carry and input k does not (a parameter read at every token), made
    # without a parameter-sized value per point; None where the rule has no such form
    vjp_sum: Callable | None = None
    ragged: Callable | None = None  # how a mask past a ragged end passes it (passes/ragged.py)

    def has(self, flag: str) -> bool:
        return flag in self.flags


CATALOG: dict[str, OpDef] = {}


def _register(name: str, category: str, flags=(), combine: str | None = None):
    assert set(flags) <= FLAGS, flags
    def deco(fn):
        CATALOG[name] = OpDef(name, category, fn, frozenset(flags), combine)
        return fn
    return deco


def rule(kind: str, name: str):
    """Register ``fn`` as the ``kind`` rule ("numpy", "jax", "vjp" or "ragged") of op
    ``name``."""
    def deco(fn):
        setattr(CATALOG[name], kind, fn)
        return fn
    return deco


def flag(kind: str, f: str) -> bool:
    """Whether op kind ``kind`` has flag ``f``."""
    return f in CATALOG[kind].flags


def infer(kind: str, inputs: list[TensorType], attrs: dict) -> TensorType:
    return CATALOG[kind].infer(inputs, attrs)


# -- dtypes -------------------------------------------------------------------------------------
def is_floating(dtype) -> bool:
    """Whether ``dtype`` is a floating type, the 16-bit ones included: NumPy gives
    ``ml_dtypes.bfloat16`` the kind ``'V'``, so ``dtype.kind == 'f'`` would miss it."""
    return bool(jnp.issubdtype(np.dtype(dtype), jnp.floating))


def accumulator(dtype) -> np.dtype:
    """The dtype a sum, mean or softmax of ``dtype`` values accumulates in: float32 for the
    16-bit floats (as NumPy's mean and JAX's reductions do; a float16 sum of 60 000s
    overflows after two terms), the dtype itself otherwise. The result is rounded to
    ``dtype`` once, at the end, on every executor and in the reference."""
    dt = np.dtype(dtype)
    return np.dtype(np.float32) if is_floating(dt) and dt.itemsize == 2 else dt


def is_numeric(dtype) -> bool:
    dt = np.dtype(dtype)
    return dt.kind in "biufc" or is_floating(dt)


# what a program may hold: the 64-bit types are held in 32 bits unless JAX's x64 is on. The
# 8-bit floats (and 4-bit ints) are not: jax.numpy refuses to promote them with anything, so a
# program using one failed while being traced, far from the line that chose it.
SUPPORTED_DTYPES = tuple(np.dtype(d) for d in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", jnp.bfloat16, "float32", "float64", "complex64", "complex128"))


def canonical_dtype(dtype) -> np.dtype:
    """A dtype as JAX will hold it (float64 -> float32 unless x64 is on; bfloat16 and
    float16 stay as they are): the one place a user's dtype is read (placeholders, constants,
    ``astype``, sources, arrays, ``tl.random``, ``tl.nn``), so the one place where a dtype
    the package does not support is refused, at the user's line."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or not is_numeric(dt) or dt not in SUPPORTED_DTYPES:
        shown = dt.name if dt is not None else repr(dtype)
        raise DTypeError(f"dtype {shown} is not supported; use one of "
                         f"{', '.join(d.name for d in SUPPORTED_DTYPES)} (64-bit types are "
                         "held in 32 bits unless JAX's x64 mode is on)")
    return np.dtype(jax.dtypes.canonicalize_dtype(dt))


def cast_array(arr: np.ndarray, dtype, what: str, loc=None) -> np.ndarray:
    """``arr`` in ``dtype``: the array itself where its dtype is already that (a lifted
    weight is used in place, never copied or scanned), else a converted copy, or a
    DTypeError naming the first value that does not fit (JAX computes in 32 bits: an int64
    2**40 would wrap and a float64 1e300 become inf, silently). One vectorised check: a
    ``tl.source`` value goes through it at every point. An inf or NaN given as such is kept
    in a float dtype; in an integer one it does not fit."""
    dt = np.dtype(dtype)
    if arr.dtype == dt:
        return arr
    bad = None
    if arr.size and dt.kind in "iu" and (arr.dtype.kind in "iu" or is_floating(arr.dtype)):
        info = np.iinfo(dt)
        bad = ~((arr >= info.min) & (arr <= info.max))
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(dt)
    if arr.size and is_floating(dt) and (arr.dtype.kind in "iu" or is_floating(arr.dtype)) \
            and np.isinf(out).any():  # one reduction where all is well
        bad = np.isfinite(arr) & np.isinf(out)
    if bad is not None and bad.any():
        count = int(bad.sum())
        info = jnp.iinfo(dt) if dt.kind in "iu" else jnp.finfo(dt)
        lo, hi = (info.min, info.max) if dt.kind in "iu" else (f"{float(info.min):.6g}",
                                                               f"{float(info.max):.6g}")
        more = f" (and {count - 1} more values)" if count > 1 else ""
        wide = (" (a 64-bit type is held in 32 bits, as in JAX's default)"
                if arr.dtype.itemsize == 8 and dt.itemsize == 4 else "")
        raise DTypeError(f"{what}: {arr[bad].flat[0].item()!r} does not fit in {dt}{wide}, "
                         f"which holds {lo} to {hi}{more}; scale the values or "
                         "use a wider dtype", loc)
    return out


def _weak_proxy(t: TensorType):
    if t.weak and t.dtype.kind in "iufc":
        return {"i": 0, "u": 0, "f": 0.0, "c": 0j}[t.dtype.kind]
    return t.dtype


def promote(types: list[TensorType]) -> tuple[np.dtype, bool]:
    dt = np.dtype(jnp.result_type(*[_weak_proxy(t) for t in types]))
    return dt, all(t.weak for t in types)


def _floatish(dtype: np.dtype) -> np.dtype:
    return dtype if is_floating(dtype) or dtype.kind == "c" else canonical_dtype(np.float32)


# -- shapes -------------------------------------------------------------------------------------
def norm_dim(d) -> Dim_:
    if isinstance(d, Const):
        return d.value
    if isinstance(d, (int, np.integer)):
        return int(d)
    return d


def shape_str(shape) -> str:
    return "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"


def broadcast_shapes(*shapes) -> tuple:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        sizes = {norm_dim(s[len(s) - nd + i]) for s in shapes if len(s) - nd + i >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            raise ShapeError(f"shapes {', '.join(shape_str(s) for s in shapes)} do not broadcast "
                             f"(axis {i - nd} has sizes {sorted(map(str, sizes))}); reshape or "
                             "expand_dims one operand so the sizes match or are 1")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def int_tuple(value, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as a tuple of ints, or a ShapeError naming ``what``."""
    items = (value,) if isinstance(value, (int, np.integer)) else value
    try:
        items = tuple(items)
    except TypeError:
        items = None
    if items is None or any(isinstance(a, bool) or not isinstance(a, (int, np.integer))
                            for a in items):
        raise ShapeError(f"{what} must be an int or a tuple of ints, got {value!r}")
    return tuple(int(a) for a in items)


def int_arg(value, what: str) -> int:
    """One int, or a ShapeError naming ``what``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ShapeError(f"{what} must be an int, got {value!r}")
    return int(value)


def norm_axes(axis, ndim: int, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = int_tuple(axis, f"{what}: axis")
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{what}: axis {a} is out of range for a value of rank {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {axis}")
    return tuple(out)


# -- sources and control ------------------------------------------------------------------------
@_register("const", "source", ("value", "array", "no_grad"))
def _const(ins, attrs):
    v = attrs["value"]
    return TensorType(tuple(v.shape), np.dtype(v.dtype), attrs.get("weak", False))


@_register("dimval", "source", ("value", "no_grad"))
def _dimval(ins, attrs):
    """The value of an index expression (weak int32) or of a condition on dims (bool)."""
    if isinstance(attrs["expr"], Cond):
        return TensorType((), np.dtype(np.bool_))
    return TensorType((), np.dtype(np.int32), True)


@_register("from_array", "source", ("value", "array", "no_grad"))
def _from_array(ins, attrs):
    a = attrs["array"]
    return TensorType(tuple(a.shape[attrs["ndomain"]:]), np.dtype(a.dtype))


@_register("source", "source", ("value", "effect", "no_grad"))
def _source(ins, attrs):
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


@_register("random", "source", ("no_grad",))
def _random(ins, attrs):
    """Counter-based random values at a point; the inputs are the point's dim values."""
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


@_register("merge", "control")
def _merge(ins, attrs):
    return attrs["type"]


@_register("identity", "control", ("ct_only", "along", "keeps_zeros"))
def _identity(ins, attrs):
    return ins[0]


@_register("sink", "effect", ("effect", "no_grad"))
def _sink(ins, attrs):
    return TensorType((), np.dtype(np.bool_))


# -- elementwise --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Elementwise:
    """One elementwise op: its NumPy and ``jax.numpy`` functions, whether its result is
    floating (as ``jnp.exp`` of an int is), and its VJP written with the helpers ``F`` of
    ``frontend/vjp.py``: ``vjp(F, g, *inputs, y) -> [cotangent per input]`` (``NONE``: no
    gradient)."""

    numpy: Callable
    jax: Callable
    vjp: Callable | str
    floating: bool = False


def _int_floordiv(x, y):
    """Integer ``//`` as JAX (XLA) defines it: a quotient truncated towards zero (``x / 0`` is
    all ones: -1 signed, the maximum unsigned), then floored; so ``x // 0`` is -2 for a
    signed ``x != 0``, -1 for ``0 // 0``. NumPy gives 0 (with a warning) instead."""
    zero = y == 0
    safe = np.where(zero, 1, y)
    if x.dtype.kind == "u":
        return np.where(zero, np.iinfo(x.dtype).max, x // safe).astype(x.dtype)
    trunc = _trunc_div(x, safe)
    q = np.where(zero, -1, trunc)
    r = np.where(zero, x, x - trunc * safe)
    return np.where((np.sign(x) != np.sign(y)) & (r != 0), q - 1, q).astype(x.dtype)


def _trunc_div(x, y):
    """Integer division truncated towards zero (C and XLA), exact for every integer width."""
    q = np.floor_divide(x, y)
    return q + ((q * y != x) & ((x < 0) != (y < 0)))


def _int_mod(x, y):
    """Integer ``%`` as ``jax.numpy`` defines it: the sign of the divisor, and ``x % 0`` is
    0 (the divisor is taken as 1)."""
    return np.mod(x, np.where(y == 0, 1, y)).astype(x.dtype)


def _int_power(x, y):
    """Integer ``**`` as ``jax.numpy`` computes it: binary exponentiation over the low 6 bits
    of the exponent, wrapping on overflow (a negative exponent gives what those bits give,
    not an error)."""
    bits = y.astype(np.dtype(f"u{y.dtype.itemsize}"))
    acc = np.where((x == 0) & (y != 0), 0, 1).astype(x.dtype)
    for _ in range(6):
        acc = np.where(bits & 1, acc * x, acc).astype(x.dtype)
        x = (x * x).astype(x.dtype)
        bits = bits >> 1
    return acc


def _integer_aware(float_fn, int_fn):
    def f(x, y):
        return int_fn(x, y) if x.dtype.kind in "iu" else float_fn(x, y)
    return f


POW_NUMPY = _integer_aware(np.power, _int_power)  # the pow op's NumPy semantics


def _relu_np(x):
    return np.maximum(x, 0)


def _relu_jnp(x):
    return jnp.maximum(x, 0)


def _sigmoid_np(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY: dict[str, Elementwise] = {
    "neg": Elementwise(np.negative, jnp.negative, lambda F, g, a, y: [-g]),
    "abs": Elementwise(np.abs, jnp.abs, lambda F, g, a, y: [g * F.sign(a)]),
    "relu": Elementwise(_relu_np, _relu_jnp, lambda F, g, a, y: [F.where(a > 0, g, 0)]),
    "exp": Elementwise(np.exp, jnp.exp, lambda F, g, a, y: [g * y], True),
    "log": Elementwise(np.log, jnp.log, lambda F, g, a, y: [g / a], True),
    "sqrt": Elementwise(np.sqrt, jnp.sqrt, lambda F, g, a, y: [g * 0.5 / y], True),
    "tanh": Elementwise(np.tanh, jnp.tanh, lambda F, g, a, y: [g * (1 - y * y)], True),
    "sigmoid": Elementwise(_sigmoid_np, jax.nn.sigmoid, lambda F, g, a, y: [g * y * (1 - y)],
                           True),
    "sin": Elementwise(np.sin, jnp.sin, lambda F, g, a, y: [g * F.op("cos", a)], True),
    "cos": Elementwise(np.cos, jnp.cos, lambda F, g, a, y: [-g * F.op("sin", a)], True),
}
BINARY: dict[str, Elementwise] = {
    "add": Elementwise(np.add, jnp.add, lambda F, g, a, b, y: [g, g]),
    "sub": Elementwise(np.subtract, jnp.subtract, lambda F, g, a, b, y: [g, -g]),
    "mul": Elementwise(np.multiply, jnp.multiply, lambda F, g, a, b, y: [g * b, g * a]),
    "maximum": Elementwise(np.maximum, jnp.maximum, lambda F, g, a, b, y: [
        F.tie(g, a, b, a > b), F.tie(g, b, a, b > a)]),
    "minimum": Elementwise(np.minimum, jnp.minimum, lambda F, g, a, b, y: [
        F.tie(g, a, b, a < b), F.tie(g, b, a, b < a)]),
    "mod": Elementwise(_integer_aware(np.mod, _int_mod), jnp.mod,
                       lambda F, g, a, b, y: [g, -g * F.op("floordiv", a, b)]),
    "floordiv": Elementwise(_integer_aware(np.floor_divide, _int_floordiv), jnp.floor_divide,
                            NONE),
    "lt": Elementwise(np.less, jnp.less, NONE),
    "le": Elementwise(np.less_equal, jnp.less_equal, NONE),
    "gt": Elementwise(np.greater, jnp.greater, NONE),
    "ge": Elementwise(np.greater_equal, jnp.greater_equal, NONE),
    "eq": Elementwise(np.equal, jnp.equal, NONE),
    "ne": Elementwise(np.not_equal, jnp.not_equal, NONE),
    "and": Elementwise(np.logical_and, jnp.logical_and, NONE),
    "or": Elementwise(np.logical_or, jnp.logical_or, NONE),
}
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC = ("and", "or")


def _unary(name):
    e = UNARY[name]

    @_register(name, "elementwise", ("along",) + (("ct_only",) if name == "neg" else ()))
    def f(ins, attrs):
        (x,) = ins
        if x.dtype == np.bool_ and not e.floating and name != "abs":
            raise DTypeError(f"{name} is not defined on bool values; cast with .astype first")
        dt = _floatish(x.dtype) if e.floating else x.dtype  # jnp.exp(bool) is float
        return TensorType(x.shape, dt, x.weak)


for _n in UNARY:
    _unary(_n)


@_register("not", "elementwise", ("no_grad", "along"))
def _not(ins, attrs):
    (x,) = ins
    if x.dtype != np.bool_:
        raise DTypeError(f"~ needs a bool value, got {x.dtype.name}; compare first (x > 0)")
    return x


@_register("cast", "elementwise", ("ct_only", "along"))
def _cast(ins, attrs):
    return TensorType(ins[0].shape, attrs["dtype"], False)


def _binary(name):
    flags = ("along",) + (("no_grad",) if BINARY[name].vjp == NONE else ()) + (
        ("ct_only",) if name in ("add", "sub") else ())

    @_register(name, "elementwise", flags)
    def f(ins, attrs):
        a, b = ins
        shape = broadcast_shapes(a.shape, b.shape)
        dt, weak = promote([a, b])
        if name in LOGIC:
            if a.dtype != np.bool_ or b.dtype != np.bool_:
                raise DTypeError(f"{'&' if name == 'and' else '|'} needs bool operands, got "
                                 f"{a.dtype.name} and {b.dtype.name}; compare first (x > 0)")
            return TensorType(shape, np.dtype(np.bool_))
        if name in COMPARE:
            return TensorType(shape, np.dtype(np.bool_))
        if dt == np.bool_ and name not in ("maximum", "minimum", "add", "mul"):  # as jnp
            raise DTypeError(f"{name} is not defined on bool values; cast with .astype first")
        return TensorType(shape, dt, weak)


for _n in BINARY:
    _binary(_n)


@_register("pow", "elementwise", ("along",))
def _pow(ins, attrs):
    a, b = ins
    dt, weak = promote([a, b])
    if dt == np.bool_:
        raise DTypeError("pow is not defined on bool values; cast with .astype first")
    return TensorType(broadcast_shapes(a.shape, b.shape), dt, weak)


@_register("div", "elementwise", ("along",))
def _div(ins, attrs):
    a, b = ins
    dt, weak = promote([a, b])
    return TensorType(broadcast_shapes(a.shape, b.shape), _floatish(dt), weak)


@_register("where", "elementwise", ("along",))
def _where(ins, attrs):
    c, a, b = ins
    if c.dtype != np.bool_:
        raise DTypeError(f"tl.where needs a bool condition, got {c.dtype.name}")
    dt, weak = promote([a, b])
    return TensorType(broadcast_shapes(c.shape, a.shape, b.shape), dt, weak)


# -- reductions ---------------------------------------------------------------------------------
def _reduce(name):
    flags = ("along",) + (("nonempty",) if name in ("max", "min") else ()) + (
        ("ct_only",) if name in ("sum", "mean") else ())

    @_register(name, "reduce", flags, combine={"sum": "add", "max": "maximum",
                                               "min": "minimum"}.get(name))
    def f(ins, attrs):
        (x,) = ins
        axes = norm_axes(attrs.get("axis"), x.ndim, name)
        keep = attrs.get("keepdims", False)
        shape = tuple((1 if keep else None) if i in axes else s for i, s in enumerate(x.shape))
        shape = tuple(s for s in shape if s is not None)
        dt = x.dtype
        if name == "sum" and dt == np.bool_:
            dt = canonical_dtype(np.int32)
        if name == "mean":
            dt = _floatish(dt)
        return TensorType(shape, dt, x.weak)


for _n in ("sum", "mean", "max", "min"):
    _reduce(_n)


@_register("softmax", "reduce", ("along",))
def _softmax(ins, attrs):
    (x,) = ins
    norm_axes(attrs["axis"], x.ndim, "softmax")
    return TensorType(x.shape, _floatish(x.dtype), x.weak)


# -- layout -------------------------------------------------------------------------------------
def _static(shape, what: str) -> tuple[int, ...]:
    if not all(isinstance(norm_dim(s), int) for s in shape):
        raise ShapeError(f"{what} needs a static shape, but {shape_str(shape)} is symbolic; "
                         "reduce over the symbolic axis first, or read a constant-size window")
    return tuple(norm_dim(s) for s in shape)


@_register("reshape", "layout", ("ct_only",))
def _reshape(ins, attrs):
    (x,) = ins
    new = tuple(attrs["shape"])
    if tuple(map(norm_dim, x.shape)) == new:
        return x
    old = _static(x.shape, "reshape")
    size = math.prod(old)
    if new.count(-1) > 1:
        raise ShapeError("reshape: at most one -1 in the new shape")
    if -1 in new:
        rest = math.prod(s for s in new if s != -1)
        if rest == 0 or size % rest:
            raise ShapeError(f"reshape: cannot reshape {shape_str(old)} into {shape_str(new)}")
        new = tuple(size // rest if s == -1 else s for s in new)
    if math.prod(new) != size:
        raise ShapeError(f"reshape: cannot reshape {shape_str(old)} ({size} elements) into "
                         f"{shape_str(new)} ({math.prod(new)} elements)")
    return TensorType(new, x.dtype, x.weak)


@_register("transpose", "layout", ("ct_only", "along", "relayout", "keeps_zeros"))
def _transpose(ins, attrs):
    (x,) = ins
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the {x.ndim} axes")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype, x.weak)


@_register("squeeze", "layout", ("ct_only", "along", "relayout", "keeps_zeros"))
def _squeeze(ins, attrs):
    (x,) = ins
    axes = norm_axes(attrs["axis"], x.ndim, "squeeze")
    for a in axes:
        if norm_dim(x.shape[a]) != 1:
            raise ShapeError(f"squeeze: axis {a} has size {x.shape[a]}, not 1")
    return TensorType(tuple(s for i, s in enumerate(x.shape) if i not in axes), x.dtype, x.weak)


@_register("expand_dims", "layout", ("ct_only", "along", "relayout", "keeps_zeros"))
def _expand_dims(ins, attrs):
    (x,) = ins
    axes = norm_axes(attrs["axis"], x.ndim + len(attrs["axis"]), "expand_dims")
    shape, it = [], iter(x.shape)
    for i in range(x.ndim + len(axes)):
        shape.append(1 if i in axes else next(it))
    return TensorType(tuple(shape), x.dtype, x.weak)


@_register("broadcast_to", "layout", ("ct_only",))
def _broadcast_to(ins, attrs):
    (x,) = ins
    shape = tuple(map(norm_dim, attrs["shape"]))
    if broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"cannot broadcast {shape_str(x.shape)} to {shape_str(shape)}")
    return TensorType(shape, x.dtype, x.weak)


@_register("getitem", "layout", ("ct_only",))
def _getitem(ins, attrs):
    (x,) = ins
    index = attrs["index"]
    n_real = sum(1 for e in index if e is not None and e is not Ellipsis)
    if n_real > x.ndim:
        raise ShapeError(f"too many spatial indices ({n_real}) for a value of shape "
                         f"{shape_str(x.shape)}")
    if Ellipsis in index:
        i = index.index(Ellipsis)
        index = index[:i] + (slice(None),) * (x.ndim - n_real) + index[i + 1:]
    index = index + (slice(None),) * (x.ndim - sum(1 for e in index if e is not None))
    shape, axis = [], 0
    for e in index:
        if e is None:
            shape.append(1)
            continue
        size = norm_dim(x.shape[axis])
        if isinstance(e, int):
            if isinstance(size, int) and not -size <= e < size:
                raise ShapeError(f"index {e} is out of range for axis {axis} of size {size}")
        elif isinstance(e, slice):
            if isinstance(size, int):
                shape.append(len(range(*e.indices(size))))
            elif e == slice(None):
                shape.append(size)
            else:
                raise ShapeError(f"cannot slice the symbolic axis {axis} (size {size}) with "
                                 f"{e.start}:{e.stop}:{e.step}; only ':' is allowed there")
        axis += 1
    return TensorType(tuple(shape), x.dtype, x.weak)


@_register("concatenate", "layout", ("ct_only",))
def _concatenate(ins, attrs):
    if not ins:
        raise ShapeError("concatenate needs at least one value")
    nd = ins[0].ndim
    if any(t.ndim != nd for t in ins):
        raise ShapeError("concatenate: all values need the same rank, got shapes "
                         + ", ".join(shape_str(t.shape) for t in ins))
    (axis,) = norm_axes(attrs["axis"], nd, "concatenate")
    for i in range(nd):
        if i != axis and len({norm_dim(t.shape[i]) for t in ins}) > 1:
            raise ShapeError(f"concatenate: axis {i} differs between shapes "
                             + ", ".join(shape_str(t.shape) for t in ins))
    length = sum((t.shape[axis] for t in ins), 0)
    dt, weak = promote(ins)
    shape = list(ins[0].shape)
    shape[axis] = norm_dim(length)
    return TensorType(tuple(shape), dt, weak)


@_register("matmul", "linalg", ("along",), combine="add")
def _matmul(ins, attrs):
    """``a @ b``; with ``tb`` (set by ``simplify`` for a transposed weight), ``a @ b.swapaxes(-1,
    -2)`` reading ``b`` as it is stored (XLA contracts either axis; a transposed copy of a
    GB-sized embedding table would be a second table)."""
    a, b = ins
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul needs operands of rank >= 1; use * for scalars")
    if attrs.get("tb"):
        b = TensorType(b.shape[:-2] + (b.shape[-1], b.shape[-2]), b.dtype, b.weak)
    ash = a.shape if a.ndim > 1 else (1,) + a.shape
    bsh = b.shape if b.ndim > 1 else b.shape + (1,)
    if norm_dim(ash[-1]) != norm_dim(bsh[-2]):
        raise ShapeError(f"matmul: contraction sizes differ: {shape_str(a.shape)} @ "
                         f"{shape_str(b.shape)} ({ash[-1]} != {bsh[-2]})")
    batch = broadcast_shapes(ash[:-2], bsh[:-2])
    shape = batch + ((ash[-2],) if a.ndim > 1 else ()) + ((bsh[-1],) if b.ndim > 1 else ())
    dt, weak = promote([a, b])
    return TensorType(tuple(map(norm_dim, shape)), dt, weak)


@_register("lift", "lift")
def _lift(ins, attrs):
    """A pure JAX function applied at each point (``tl.lift``): its type came from
    ``jax.eval_shape`` when it was traced."""
    return attrs["type"]


@_register("take", "layout")
def _take(ins, attrs):
    """``x`` at one position of each of the axes ``axis, axis + 1, ...``, given by integer
    scalars (clamped to the axes): how a gradient picks a producer point out of a frame (see
    frontend/autodiff.py), and ``tl.take``'s data-dependent reads."""
    x, *index = ins
    if not index or len(index) > x.ndim:
        raise ShapeError(f"take needs between 1 and {x.ndim} indices, got {len(index)}")
    (axis,) = norm_axes(attrs["axis"], x.ndim - len(index) + 1, "take")
    for i in index:
        if i.shape or i.dtype.kind not in "iu":
            raise DTypeError(f"take needs integer scalar indices, got {i}")
    return TensorType(x.shape[:axis] + x.shape[axis + len(index):], x.dtype, x.weak)


@_register("embed", "layout", ("bwd_only",))
def _embed(ins, attrs):
    """``x`` placed at an integer offset along ``axis`` of zeros of length ``size``: a range
    read's cotangent put back in the producer's absolute positions."""
    x, off = ins
    (axis,) = norm_axes(attrs["axis"], x.ndim, "embed")
    if off.shape or off.dtype.kind not in "iu":
        raise DTypeError(f"embed needs an integer scalar offset, got {off}")
    shape = list(x.shape)
    shape[axis] = norm_dim(attrs["size"])
    return TensorType(tuple(shape), x.dtype, x.weak)


@_register("scatter_add", "layout", ("bwd_only",))
def _scatter_add(ins, attrs):
    """Zeros of ``shape`` with ``g[s]`` added at the (clamped) positions ``index[s]`` of the
    axes ``axis, axis + 1, ...`` for every ``s`` along ``g``'s leading axis: the cotangent of
    ``take`` summed over the points that read it (an embedding's gradient), one scatter-add
    rather than a table-sized value per point."""
    g, *index = ins
    shape = tuple(attrs["shape"])
    axis = attrs["axis"]
    if not index or any(i.shape != g.shape[:1] or i.dtype.kind not in "iu" for i in index):
        raise DTypeError(f"scatter_add needs one integer index per entry of g's leading axis, "
                         f"got {', '.join(map(str, index))} for {g}")
    want = shape[:axis] + shape[axis + len(index):]
    if tuple(map(norm_dim, g.shape[1:])) != tuple(map(norm_dim, want)):
        raise ShapeError(f"scatter_add: g {shape_str(g.shape)} does not hold points of "
                         f"{shape_str(want)}")
    return TensorType(tuple(map(norm_dim, shape)), g.dtype, g.weak)


@_register("unindex", "layout", ("ct_only",))
def _unindex(ins, attrs):
    """Zeros of ``shape`` with ``x`` at a basic index: the transpose of spatial indexing."""
    return TensorType(tuple(attrs["shape"]), ins[0].dtype, ins[0].weak)


@_register("fused", "fused")
def _fused(ins, attrs):
    """A tree of ops run as one kernel: the type of its last (root) op."""
    vals: list[TensorType] = []
    for op, refs in attrs["body"]:
        args = [ins[k] if where == "ext" else vals[k] for where, k in refs]
        vals.append(infer(op.kind, args, op.attrs))
    return vals[-1]
