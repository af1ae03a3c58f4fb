"""The functional API (``tl.zeros``, ``tl.placeholder``, ``tl.exp``, ``tl.where``, ...).

Names and semantics follow ``jax.numpy``; ``tl.min``/``tl.max`` are on index expressions (use
``tl.minimum``/``tl.maximum`` for tensors), as the design fixes.
"""
from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence

import numpy as np

from ..errors import (
    DefinitionError,
    ExprError,
    ShapeError,
    assigned_name,
    user_location,
)
from ..ir.ops import TensorType, canonical_dtype, cast_array, int_arg
from ..symbolic import eq as _eq
from ..symbolic import max_, min_
from ..symbolic import ne as _ne
from ..symbolic.cond import not_a_bool
from .context import _SCOPE as SCOPE
from .context import current_context, user_name
from .tensor import RecurrentTensor, apply, as_tensor, constant, numeric_array

RT = RecurrentTensor


def static_shape(shape) -> tuple[int, ...]:
    try:
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    except TypeError:
        shape = None
    if shape is None or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0
                            for s in shape):
        raise ShapeError(f"shape {shape!r} must be a tuple of non-negative ints")
    return tuple(int(s) for s in shape)


# -- scopes of library calls ---------------------------------------------------------------------
def library_scope(name: str | None = None):
    """Decorator of the public functions and methods of ``tl.nn``, ``tl.rl``, ``tl.optim``
    and ``tl.random``: the ops a call makes sit in a scope named after the function (inside
    the user's ``tl.scope``s), so that views group them and search finds them (``rope``,
    ``attention``). ``name`` defaults to the function's name; for a ``__call__`` or a method
    decorated with ``name=CLASS``, the class's name in snake case (``RMSNorm`` ->
    ``rms_norm``, ``Adam.minimize`` -> ``adam``). Scopes are for views only: the compiled
    program does not change.

    The wrapper lives in this module on purpose: ``errors`` reads its frame as part of the
    op-making API, so that locations and names still come from the user's line."""
    def decorate(fn):
        by_class = name == CLASS or (name is None and fn.__name__ == "__call__")
        fixed = name or fn.__name__

        @functools.wraps(fn)
        def scoped(*args, **kwargs):
            # the scope set here, not by a helper: one frame less under every op made
            # (names.SourceNames walks them); not again when the innermost scope has this
            # name already (MultiHeadAttention calls attention)
            label = _snake(type(args[0]).__name__) if by_class and args else fixed
            path = SCOPE.get()
            if path and path[-1] == label:
                return fn(*args, **kwargs)
            token = SCOPE.set(path + (label,))
            try:
                return fn(*args, **kwargs)
            finally:
                SCOPE.reset(token)
        scoped.scope_name = None if by_class else fixed
        return scoped
    return decorate


CLASS = "<class>"   # library_scope(CLASS): the scope is named after the instance's class


def _snake(name: str) -> str:
    """``RMSNorm`` -> ``rms_norm``, ``MultiHeadAttention`` -> ``multi_head_attention``."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


# -- creation -------------------------------------------------------------------------------------
def full(shape, fill_value, dtype="float32") -> RT:
    fill = numeric_array(fill_value, "tl.full's fill value")
    if fill.ndim:
        raise ShapeError(f"tl.full: the fill value must be a scalar, got shape {fill.shape}; "
                         "use tl.constant for an array")
    return constant(np.full(static_shape(shape), fill), current_context(), dtype,
                    assigned_name())


def zeros(shape, dtype="float32") -> RT:
    return full(shape, 0, dtype)


def ones(shape, dtype="float32") -> RT:
    return full(shape, 1, dtype)


def arange(n, dtype="int32") -> RT:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ShapeError(f"tl.arange needs a non-negative int, got {n!r}")
    return constant(np.arange(int(n)), current_context(), dtype, assigned_name())


def constant_(value, dtype=None) -> RT:
    """``tl.constant(array_like)``: the same value at every point (empty domain)."""
    return constant(value, current_context(), dtype, assigned_name())


def from_array(array, domain, name: str | None = None) -> RT:
    """Value at point ``(b, t)`` is ``array[b, t]``; the bounds must match the leading axes."""
    ctx = current_context()
    loc = user_location()
    name = user_name(name, "tl.from_array", loc)
    domain = ctx.check_domain(domain)
    arr = numeric_array(array, "tl.from_array", loc)
    if arr.ndim < len(domain):
        raise ShapeError(f"from_array: the array has {arr.ndim} axes but the domain "
                         f"({', '.join(map(str, domain))}) needs at least {len(domain)}", loc)
    arr = cast_array(arr, canonical_dtype(arr.dtype), "tl.from_array", loc)
    attrs = {"array": arr, "ndomain": len(domain)}
    t = TensorType(arr.shape[len(domain):], arr.dtype)
    node = ctx.add_node("from_array", [], attrs, domain, t, name=name or assigned_name(),
                        loc=loc)
    ctx.record("from_array", f"%{node.id} = from_array(array({TensorType(arr.shape, arr.dtype)}), "
               f"domain=({', '.join(map(str, domain))}))", node, loc)
    return RT(ctx, node)


def source(fn: Callable[[dict], object], shape, dtype, domain, name: str | None = None) -> RT:
    """Value at a point is ``fn({dim name: int})`` (checked against ``shape`` and ``dtype``)."""
    ctx = current_context()
    loc = user_location()
    if not callable(fn):
        raise DefinitionError(f"tl.source needs a callable fn(point), got {type(fn).__name__}",
                              loc)
    name = user_name(name, "tl.source", loc)
    domain = ctx.check_domain(domain)
    t = TensorType(static_shape(shape), canonical_dtype(dtype))
    node = ctx.add_node("source", [], {"fn": fn, "shape": t.shape, "dtype": t.dtype}, domain, t,
                        name=name or assigned_name(), loc=loc)
    ctx.record("source", f"%{node.id} = source({getattr(fn, '__name__', 'fn')}, {t})", node,
               loc)
    return RT(ctx, node)


def placeholder(shape, dtype="float32", domain=(), name: str | None = None) -> RT:
    """A tensor defined by branch assignments ``x[key] = value`` (recurrences allowed)."""
    ctx = current_context()
    loc = user_location()
    name = user_name(name, "tl.placeholder", loc)
    domain = ctx.check_domain(domain)
    t = TensorType(static_shape(shape), canonical_dtype(dtype))
    node = ctx.add_node("merge", [], {"type": t}, domain, t, name=name or assigned_name(),
                        loc=loc)
    ctx.record("placeholder", f"{node.name or '%' + str(node.id)} = placeholder({t}, "
               f"domain=({', '.join(map(str, domain))}))", node, loc)
    return RT(ctx, node)


def sink(x: RT, fn: Callable[[dict, np.ndarray], None]) -> None:
    """Call ``fn(point, value)`` once per point of ``x``'s domain, in schedule order."""
    if not isinstance(x, RT):
        raise DefinitionError("tl.sink needs a recurrent tensor as its first argument")
    if not callable(fn):
        raise DefinitionError("tl.sink needs a callable fn(point, value)")
    ctx = x.ctx
    loc = user_location()
    node = ctx.add_node("sink", [x._input()], {"fn": fn}, x.domain,
                        TensorType((), np.dtype(np.bool_)), loc=loc)
    ctx._sinks.append(node)
    ctx.record("sink", f"sink({x._ref()}, {getattr(fn, '__name__', 'fn')})", node, loc)


# -- elementwise ----------------------------------------------------------------------------------
def _unary(kind):
    def f(x):
        return apply(kind, [x])
    f.__name__ = kind
    f.__doc__ = f"Elementwise ``{kind}`` (jax.numpy semantics)."
    return f


exp, log, sqrt, tanh, sigmoid, relu, sin, cos = map(
    _unary, ("exp", "log", "sqrt", "tanh", "sigmoid", "relu", "sin", "cos"))


def abs(x) -> RT:  # noqa: A001 - the jax.numpy name
    return apply("abs", [x])


def maximum(a, b) -> RT:
    return apply("maximum", [a, b])


def minimum(a, b) -> RT:
    return apply("minimum", [a, b])


def where(cond, a, b) -> RT:
    return apply("where", [not_a_bool(cond, "the condition of tl.where"), a, b])


def matmul(a, b) -> RT:
    return apply("matmul", [a, b])


def softmax(x, axis=-1) -> RT:
    return apply("softmax", [x], {"axis": int_arg(axis, "softmax: axis")})


def _values(xs, what: str) -> list:
    if isinstance(xs, (RT, str)) or not isinstance(xs, Sequence):
        raise ShapeError(f"{what} needs a list of tensors, got {type(xs).__name__}")
    return list(xs)


def concatenate(xs, axis=0) -> RT:
    return apply("concatenate", _values(xs, "concatenate"),
                 {"axis": int_arg(axis, "concatenate: axis")})


def stack(xs, axis=0) -> RT:
    xs = _values(xs, "stack")
    if not xs:
        raise ShapeError("stack needs at least one value")
    ctx = current_context(*xs)
    rts = [as_tensor(x, ctx) for x in xs]
    nd = rts[0].ndim + 1
    axis = int_arg(axis, "stack: axis")
    if not -nd <= axis < nd:
        raise ShapeError(f"stack: axis {axis} is out of range for results of rank {nd}")
    return concatenate([r.expand_dims(axis % nd) for r in rts], axis=axis % nd)


def take(x, index, axis=0) -> RT:
    """``x`` at position ``index`` along ``axis``: an integer scalar tensor (data, not a
    symbolic point), or a tuple of them for the axes from ``axis`` on. The axes may have
    symbolic lengths: e.g. a shuffled minibatch sample out of a whole iteration's rollout,
    ``tl.take(obs[i, 0:B, 0:T], (b_of_s, t_of_s))``. Positions outside an axis are clamped to
    its ends (as ``jnp.take(mode="clip")``); ``tl.grad`` puts the cotangent back at the
    position read."""
    index = index if isinstance(index, tuple) else (index,)
    ctx = current_context(x, *index)
    return apply("take", [as_tensor(x, ctx), *(as_tensor(i, ctx) for i in index)],
                 {"axis": int_arg(axis, "take: axis")})


def _tensor(x) -> RT:
    """``tl.sum(x)`` and friends also take arrays and numbers, as ``jnp.sum`` does."""
    return as_tensor(x, current_context(x))


def sum(x, axis=None, keepdims=False) -> RT:  # noqa: A001
    return _tensor(x).sum(axis, keepdims)


def mean(x, axis=None, keepdims=False) -> RT:
    return _tensor(x).mean(axis, keepdims)


def reshape(x, shape) -> RT:
    return _tensor(x).reshape(shape)


def transpose(x, axes=None) -> RT:
    return _tensor(x).transpose(*(() if axes is None else (axes,)))


def squeeze(x, axis=None) -> RT:
    return _tensor(x).squeeze(axis)


def expand_dims(x, axis) -> RT:
    return _tensor(x).expand_dims(axis)


# -- index expressions ----------------------------------------------------------------------------
def _index_only(fn, tensor_alt: str):
    def f(*args):
        if any(isinstance(a, RT) for a in args):
            raise ExprError(f"tl.{fn.__name__.rstrip('_')} works on index expressions; for "
                            f"tensors use tl.{tensor_alt}")
        return fn(*args)
    f.__name__ = fn.__name__.rstrip("_")
    f.__doc__ = fn.__doc__
    return f


min = _index_only(min_, "minimum")  # noqa: A001
max = _index_only(max_, "maximum")  # noqa: A001


def eq(a, b):
    """Symbolic ``a == b`` for index expressions; elementwise for tensors."""
    if isinstance(a, RT) or isinstance(b, RT):
        return apply("eq", [a, b])
    return _eq(a, b)


def ne(a, b):
    """Symbolic ``a != b`` for index expressions; elementwise for tensors."""
    if isinstance(a, RT) or isinstance(b, RT):
        return apply("ne", [a, b])
    return _ne(a, b)


# -- lifting JAX functions ------------------------------------------------------------------------
def lift(fn: Callable) -> Callable:
    """``tl.lift(fn)(x, y, ...)``: the pure JAX function ``fn`` applied at every point, on the
    values of ``x, y, ...`` there (static shapes). Its result types come from
    ``jax.eval_shape``; a tuple or list result gives a tuple of tensors. Lifted ops fuse into
    kernels like any other op, and ``tl.grad`` differentiates them with ``jax.vjp``."""
    if not callable(fn):
        raise DefinitionError(f"tl.lift needs a function, got {type(fn).__name__}")

    def lifted(*args):
        import jax

        from .tensor import as_tensor

        ctx = current_context(*args)
        loc = user_location()
        rts = [as_tensor(a, ctx) for a in args]
        for r in rts:
            if not r.type.is_static:
                raise ShapeError(f"tl.lift({_name(fn)}) needs static shapes, but an argument has "
                                 f"shape {r.shape}; reduce the symbolic axis first", loc)
        specs = [jax.ShapeDtypeStruct(r.shape, r.dtype) for r in rts]
        try:
            out = jax.eval_shape(fn, *specs)
        except Exception as e:
            raise ShapeError(f"tl.lift({_name(fn)}) fails on arguments "
                             f"{', '.join(str(r.type) for r in rts)}: {e}", loc) from None
        many = isinstance(out, (tuple, list))
        outs = list(out) if many else [out]
        if not all(hasattr(o, "shape") and hasattr(o, "dtype") for o in outs):
            raise ShapeError(f"tl.lift({_name(fn)}) must return an array or a tuple of arrays, "
                             f"got {type(out).__name__}", loc)
        made = tuple(apply("lift", rts, {"jax_fn": fn, "out": k if many else None,
                                         "type": TensorType(tuple(o.shape),
                                                            canonical_dtype(o.dtype))})
                     for k, o in enumerate(outs))
        return made if many else made[0]

    lifted.__name__ = f"lift_{_name(fn)}"
    lifted.__doc__ = fn.__doc__
    return lifted


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
