"""The primitive-op catalog: every op kind the SDG may hold, with shape and dtype inference.

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


@dataclass(frozen=True)
class OpDef:
    name: str
    category: str  # source | elementwise | reduce | layout | linalg | control | effect
    infer: Callable[[list[TensorType], dict], TensorType]


CATALOG: dict[str, OpDef] = {}


def _register(name: str, category: str):
    def deco(fn):
        CATALOG[name] = OpDef(name, category, fn)
        return fn
    return deco


def infer(kind: str, inputs: list[TensorType], attrs: dict) -> TensorType:
    return CATALOG[kind].infer(inputs, attrs)


# -- dtypes -------------------------------------------------------------------------------------
def canonical_dtype(dtype) -> np.dtype:
    """A dtype as JAX will hold it (float64 -> float32 unless x64 is on)."""
    try:
        dt = np.dtype(dtype)
    except (TypeError, ValueError):
        dt = None
    if dt is None or dt.kind not in "biufc":
        raise DTypeError(f"{dtype!r} is not a numeric dtype; use e.g. 'float32', 'int32', "
                         "'bool'")
    return np.dtype(jax.dtypes.canonicalize_dtype(dt))


def _weak_proxy(t: TensorType):
    if t.weak and t.dtype.kind in "iufc":
        return {"i": 0, "u": 0, "f": 0.0, "c": 0j}[t.dtype.kind]
    return t.dtype


def promote(types: list[TensorType]) -> tuple[np.dtype, bool]:
    dt = np.dtype(jnp.result_type(*[_weak_proxy(t) for t in types]))
    return dt, all(t.weak for t in types)


def _floatish(dtype: np.dtype) -> np.dtype:
    return dtype if dtype.kind in "fc" else canonical_dtype(np.float32)


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


def norm_axes(axis, ndim: int, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not -ndim <= a < ndim:
            raise ShapeError(f"{what}: axis {a} is out of range for a value of rank {ndim}")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: repeated axis in {axis}")
    return tuple(out)


# -- sources and control ------------------------------------------------------------------------
@_register("const", "source")
def _const(ins, attrs):
    v = attrs["value"]
    return TensorType(tuple(v.shape), np.dtype(v.dtype), attrs.get("weak", False))


@_register("dimval", "source")
def _dimval(ins, attrs):
    """The value of an index expression (weak int32) or of a condition on dims (bool)."""
    if isinstance(attrs["expr"], Cond):
        return TensorType((), np.dtype(np.bool_))
    return TensorType((), np.dtype(np.int32), True)


@_register("from_array", "source")
def _from_array(ins, attrs):
    a = attrs["array"]
    return TensorType(tuple(a.shape[attrs["ndomain"]:]), np.dtype(a.dtype))


@_register("source", "source")
def _source(ins, attrs):
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


@_register("random", "source")
def _random(ins, attrs):
    """Counter-based random values at a point; the inputs are the point's dim values."""
    return TensorType(tuple(attrs["shape"]), attrs["dtype"])


@_register("merge", "control")
def _merge(ins, attrs):
    return attrs["type"]


@_register("identity", "control")
def _identity(ins, attrs):
    return ins[0]


@_register("sink", "effect")
def _sink(ins, attrs):
    return TensorType((), np.dtype(np.bool_))


# -- elementwise --------------------------------------------------------------------------------
UNARY_FLOAT = ("exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos")
UNARY_SAME = ("neg", "abs", "relu")
ARITH = ("add", "sub", "mul", "pow", "maximum", "minimum", "floordiv", "mod")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGIC = ("and", "or")


def _unary(name):
    @_register(name, "elementwise")
    def f(ins, attrs):
        (x,) = ins
        if x.dtype == np.bool_ and name not in UNARY_FLOAT + ("abs",):
            raise DTypeError(f"{name} is not defined on bool values; cast with .astype first")
        dt = _floatish(x.dtype) if name in UNARY_FLOAT else x.dtype  # jnp.exp(bool) is float
        return TensorType(x.shape, dt, x.weak)


for _n in UNARY_FLOAT + UNARY_SAME:
    _unary(_n)


@_register("not", "elementwise")
def _not(ins, attrs):
    (x,) = ins
    if x.dtype != np.bool_:
        raise DTypeError(f"~ needs a bool value, got {x.dtype.name}; compare first (x > 0)")
    return x


@_register("cast", "elementwise")
def _cast(ins, attrs):
    return TensorType(ins[0].shape, attrs["dtype"], False)


def _binary(name):
    @_register(name, "elementwise")
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


for _n in ARITH + COMPARE + LOGIC:
    _binary(_n)


@_register("div", "elementwise")
def _div(ins, attrs):
    a, b = ins
    dt, weak = promote([a, b])
    return TensorType(broadcast_shapes(a.shape, b.shape), _floatish(dt), weak)


@_register("where", "elementwise")
def _where(ins, attrs):
    c, a, b = ins
    if c.dtype != np.bool_:
        raise DTypeError(f"tl.where needs a bool condition, got {c.dtype.name}")
    dt, weak = promote([a, b])
    return TensorType(broadcast_shapes(c.shape, a.shape, b.shape), dt, weak)


# -- reductions ---------------------------------------------------------------------------------
def _reduce(name):
    @_register(name, "reduce")
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


@_register("softmax", "reduce")
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


@_register("reshape", "layout")
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


@_register("transpose", "layout")
def _transpose(ins, attrs):
    (x,) = ins
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: {perm} is not a permutation of the {x.ndim} axes")
    return TensorType(tuple(x.shape[p] for p in perm), x.dtype, x.weak)


@_register("squeeze", "layout")
def _squeeze(ins, attrs):
    (x,) = ins
    axes = norm_axes(attrs["axis"], x.ndim, "squeeze")
    for a in axes:
        if norm_dim(x.shape[a]) != 1:
            raise ShapeError(f"squeeze: axis {a} has size {x.shape[a]}, not 1")
    return TensorType(tuple(s for i, s in enumerate(x.shape) if i not in axes), x.dtype, x.weak)


@_register("expand_dims", "layout")
def _expand_dims(ins, attrs):
    (x,) = ins
    axes = norm_axes(attrs["axis"], x.ndim + len(attrs["axis"]), "expand_dims")
    shape, it = [], iter(x.shape)
    for i in range(x.ndim + len(axes)):
        shape.append(1 if i in axes else next(it))
    return TensorType(tuple(shape), x.dtype, x.weak)


@_register("broadcast_to", "layout")
def _broadcast_to(ins, attrs):
    (x,) = ins
    shape = tuple(map(norm_dim, attrs["shape"]))
    if broadcast_shapes(x.shape, shape) != shape:
        raise ShapeError(f"cannot broadcast {shape_str(x.shape)} to {shape_str(shape)}")
    return TensorType(shape, x.dtype, x.weak)


@_register("getitem", "layout")
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


@_register("concatenate", "layout")
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


@_register("matmul", "linalg")
def _matmul(ins, attrs):
    a, b = ins
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError("matmul needs operands of rank >= 1; use * for scalars")
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
    """``x`` at one position of ``axis``, given by an integer scalar (a dim's value): how a
    gradient picks a producer point out of a frame (see frontend/autodiff.py)."""
    x, i = ins
    (axis,) = norm_axes(attrs["axis"], x.ndim, "take")
    if i.shape or i.dtype.kind not in "iu":
        raise DTypeError(f"take needs an integer scalar index, got {i}")
    return TensorType(x.shape[:axis] + x.shape[axis + 1:], x.dtype, x.weak)


@_register("embed", "layout")
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


@_register("unindex", "layout")
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
