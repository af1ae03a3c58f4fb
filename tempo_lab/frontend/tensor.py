"""Recurrent tensors: values over a domain of dims, written as code for one point.

A ``RecurrentTensor`` is either an op's value (``index is None``) or a *view*: the value of
another op read at a symbolic index such as ``x[b, t - 1]`` or ``x[0:t + 1]``. A view is not an
op; it becomes the dependence expression on the edge of whichever op consumes it.
"""
from __future__ import annotations

import numpy as np

from ..errors import (
    DefinitionError,
    DTypeError,
    ExprError,
    ShapeError,
    assigned_name,
    user_location,
)
from ..ir.ops import (
    TensorType,
    broadcast_shapes,
    canonical_dtype,
    cast_array,
    infer,
    int_tuple,
    is_floating,
    norm_dim,
    promote,
)
from ..symbolic import TRUE, Cond, Const, Dim, Expr, Product, Slice, and_, as_expr, eq
from ..symbolic.cond import not_a_bool
from .context import Context, Input, Node, current_context


def _entry_str(entries) -> str:
    return ", ".join(map(str, entries))


class RecurrentTensor:
    """A value at every point of ``domain`` with spatial ``shape`` and ``dtype``."""

    __array_priority__ = 1000  # NumPy defers to our reflected operators
    __hash__ = object.__hash__

    def __init__(self, ctx: Context, node: Node, index=None, domain=None, type_=None,
                 loc=None):
        self.ctx, self.node, self.index = ctx, node, index
        self.domain: tuple[Dim, ...] = node.domain if index is None else domain
        self.type: TensorType = node.type if index is None else type_
        self.loc = loc or node.loc

    # -- description --------------------------------------------------------------------------
    @property
    def shape(self):
        return self.type.shape

    @property
    def dtype(self) -> np.dtype:
        return self.type.dtype

    @property
    def ndim(self) -> int:
        return len(self.type.shape)

    @property
    def name(self) -> str:
        return self.node.name or f"%{self.node.id}"

    def _ref(self) -> str:
        base = self.node.name or f"%{self.node.id}"
        return base if self.index is None else f"{base}[{_entry_str(self.index)}]"

    def __repr__(self) -> str:
        dom = ", ".join(map(str, self.domain))
        return f"RecurrentTensor({self._ref()}: {self.type} over ({dom}))"

    def __bool__(self):
        raise ExprError("a recurrent tensor has no single truth value; use tl.where(cond, a, b) "
                        "or a branch condition on dims instead of 'if'")

    def __iter__(self):
        raise ShapeError("recurrent tensors are not iterable; index them explicitly")

    # -- plumbing -----------------------------------------------------------------------------
    def _input(self) -> Input:
        """This tensor as an op input; a plain read is located at the reading op's line."""
        if self.index is None:
            return Input(self.node, tuple(self.node.domain), TRUE, None)
        return Input(self.node, self.index, TRUE, self.loc)

    def materialize(self) -> RecurrentTensor:
        """An op holding this value (views get an identity op)."""
        if self.index is None:
            return self
        return apply("identity", [self])

    # -- arithmetic ---------------------------------------------------------------------------
    def __add__(self, o): return apply("add", [self, o])
    def __radd__(self, o): return apply("add", [o, self])
    def __sub__(self, o): return apply("sub", [self, o])
    def __rsub__(self, o): return apply("sub", [o, self])
    def __mul__(self, o): return apply("mul", [self, o])
    def __rmul__(self, o): return apply("mul", [o, self])
    def __truediv__(self, o): return apply("div", [self, o])
    def __rtruediv__(self, o): return apply("div", [o, self])
    def __floordiv__(self, o): return apply("floordiv", [self, o])
    def __rfloordiv__(self, o): return apply("floordiv", [o, self])
    def __mod__(self, o): return apply("mod", [self, o])
    def __rmod__(self, o): return apply("mod", [o, self])
    def __pow__(self, o): return apply("pow", [self, o])
    def __rpow__(self, o): return apply("pow", [o, self])
    def __matmul__(self, o): return apply("matmul", [self, o])
    def __rmatmul__(self, o): return apply("matmul", [o, self])
    def __neg__(self): return apply("neg", [self])
    def __pos__(self): return self
    def __abs__(self): return apply("abs", [self])
    def __invert__(self): return apply("not", [self])
    def __and__(self, o): return apply("and", [self, o])
    def __rand__(self, o): return apply("and", [o, self])
    def __or__(self, o): return apply("or", [self, o])
    def __ror__(self, o): return apply("or", [o, self])
    def __lt__(self, o): return apply("lt", [self, o])
    def __le__(self, o): return apply("le", [self, o])
    def __gt__(self, o): return apply("gt", [self, o])
    def __ge__(self, o): return apply("ge", [self, o])
    def __eq__(self, o): return apply("eq", [self, o])  # elementwise, as in jax.numpy
    def __ne__(self, o): return apply("ne", [self, o])

    # -- methods ------------------------------------------------------------------------------
    def sum(self, axis=None, keepdims=False):
        return apply("sum", [self], {"axis": axis, "keepdims": keepdims})

    def mean(self, axis=None, keepdims=False):
        return apply("mean", [self], {"axis": axis, "keepdims": keepdims})

    def max(self, axis=None, keepdims=False):
        return apply("max", [self], {"axis": axis, "keepdims": keepdims})

    def min(self, axis=None, keepdims=False):
        return apply("min", [self], {"axis": axis, "keepdims": keepdims})

    def reshape(self, *shape):
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]  # reshape((2, 3)) as well as reshape(2, 3)
        return apply("reshape", [self], {"shape": int_tuple(shape, "reshape: the shape")})

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        perm = (int_tuple(axes, "transpose: the axes") if axes
                else tuple(reversed(range(self.ndim))))
        return apply("transpose", [self], {"perm": perm})

    @property
    def T(self):
        return self.transpose()

    def squeeze(self, axis=None):
        if axis is None:
            axis = tuple(i for i, s in enumerate(self.shape) if norm_dim(s) == 1)
        return apply("squeeze", [self], {"axis": int_tuple(axis, "squeeze: axis")})

    def expand_dims(self, axis):
        return apply("expand_dims", [self], {"axis": int_tuple(axis, "expand_dims: axis")})

    def astype(self, dtype):
        return apply("cast", [self], {"dtype": canonical_dtype(dtype)})

    # -- temporal indexing --------------------------------------------------------------------
    def _split_key(self, key):
        key = key if isinstance(key, tuple) else (key,)
        n = len(self.domain)
        head = key[:n]
        # identity, not ==: a tensor in the key would turn `in` into an elementwise comparison
        k = next((i for i, e in enumerate(head) if e is Ellipsis), None)
        if k is not None:
            return key[:k], key[k:]
        return head, key[n:]

    def __getitem__(self, key):
        loc = user_location()
        temporal, spatial = self._split_key(key)
        entries = []
        for d, e in zip(self.domain, temporal):
            if isinstance(e, slice):
                entries.append(Slice.of(e, d.bound))
            elif isinstance(e, Cond):
                raise ExprError(f"{e} is a condition: conditions select branches in definitions "
                                f"(x[{e}] = ...), not reads; use tl.where to select values", loc)
            elif isinstance(e, RecurrentTensor):
                raise ExprError("a temporal dim cannot be indexed by a tensor value; index it "
                                "with an expression over dims and bounds", loc)
            else:
                entries.append(as_expr(not_a_bool(e, f"the index of {self.name} along {d}")))
        entries += list(self.domain[len(entries):])
        out = self
        if tuple(entries) != tuple(self.domain):
            out = self._view(tuple(entries), loc)
        if spatial:
            # Spatial entries index the tensor's own spatial axes (as in NumPy on the whole
            # B x T x ... grid): skip the axes that temporal slices prepend to the view.
            nslices = sum(isinstance(e, Slice) for e in entries)
            index = (slice(None),) * nslices + _spatial_index(spatial)
            out = apply("getitem", [out], {"index": index})
        return out

    def _view(self, entries, loc, record: bool = True) -> RecurrentTensor:
        base = self.materialize()
        for e in entries:
            self.ctx.check_expr(e, f"the index {e}")
        dims = set().union(*(e.dims() for e in entries))
        lengths = tuple(norm_dim(e.length) for e in entries if isinstance(e, Slice))
        # A symbolic spatial size is written in the producer's dims: re-express it at the read
        # point; a range read along a dim that the size depends on would be ragged.
        points = {d: e for d, e in zip(base.domain, entries) if not isinstance(e, Slice)}
        sliced = {d for d, e in zip(base.domain, entries) if isinstance(e, Slice)}
        shape = []
        for s in base.shape:
            if isinstance(s, Expr):
                if s.dims() & sliced:
                    raise ShapeError(f"cannot read a range of {base.name}: its spatial shape "
                                     f"{base.shape} changes along "
                                     f"{', '.join(sorted(map(str, s.dims() & sliced)))}, so the "
                                     "values would not stack; reduce the varying axis first, "
                                     "or read one point at a time", loc)
                s = norm_dim(s.substitute(points))
            shape.append(s)
        vtype = TensorType(lengths + tuple(shape), base.dtype, base.type.weak)
        view = RecurrentTensor(self.ctx, base.node, entries, self.ctx.order(dims), vtype, loc)
        if record:
            self.ctx.record("read", f"{view._ref()}", None, loc)
        return view

    # -- definitions --------------------------------------------------------------------------
    def __setitem__(self, key, value):
        loc = user_location()
        self.ctx.check_open(f"this branch of {self.name}", loc)
        if self.index is not None or self.node.kind != "merge":
            raise DefinitionError(f"{self.name} is not a placeholder: only tensors made with "
                                  "tl.placeholder(...) can be defined by assignment", loc)
        conds, mapping = [], {}
        if isinstance(key, Cond):
            key = (key,)
        key = key if isinstance(key, tuple) else (key,)
        for e in key:
            not_a_bool(e, f"the branch key of {self.name}")
        cond_key = bool(key) and isinstance(key[0], Cond)
        if len(key) > len(self.domain) and not all(isinstance(k, Cond) for k in key):
            raise DefinitionError(f"the key has {len(key)} entries but {self.name} has "
                                  f"{len(self.domain)} dims; spatial parts cannot be assigned "
                                  "separately (build the whole value, e.g. with tl.concatenate)",
                                  loc)
        for d, e in zip(self.domain, key) if not cond_key else ():
            if isinstance(e, Cond):
                conds.append(e)
                continue
            if isinstance(e, slice):
                raise DefinitionError(f"a branch key cannot be a slice ({d}: {e.start}:{e.stop});"
                                      f" use a condition instead, e.g. {self.name}[{d} < 3] = ...",
                                      loc)
            e = as_expr(e)
            self.ctx.check_expr(e, f"the key {e}")
            shift = e - d
            if e == d:
                continue
            if not e.dims():
                conds.append(eq(d, e))
            elif isinstance(shift, Const):
                c = shift.value
                conds.append(d >= c if c > 0 else d < d.bound + c)
                mapping[d] = d - c
            else:
                raise DefinitionError(f"unsupported key entry {e} for dim {d}: use {d} itself, a "
                                      f"point without dims ({d.bound} - 1), a shift ({d} + 1) or "
                                      f"a condition ({d} < 3)", loc)
        if cond_key:
            conds.extend(key)
        for c in conds:
            self.ctx.check_expr(c, f"the condition {c}")
        value = self._conform(as_tensor(value, self.ctx), loc)
        inp = value._input()
        inp.index = tuple(e.substitute(mapping) for e in inp.index)
        inp.cond, inp.loc, inp.default = and_(*conds), loc, not conds
        if inp.default:
            prev = next((i for i in self.node.inputs if i.default), None)
            if prev is not None:
                raise DefinitionError(f"{self.name} already has a default branch (at {prev.loc});"
                                      " give this one a condition or a point key", loc)
        self.node.inputs.append(inp)
        key_text = _entry_str(key) if not cond_key else str(and_(*key))
        self.ctx.record("define", f"{self.name}[{key_text}] = {value._ref()}", self.node, loc)

    def _conform(self, value: RecurrentTensor, loc) -> RecurrentTensor:
        """The value converted to this placeholder's shape and dtype (or a clear error)."""
        extra = set(value.domain) - set(self.domain)
        if extra:
            raise DefinitionError(f"the value assigned to {self.name} varies over "
                                  f"{', '.join(sorted(map(str, extra)))}, which is not in its "
                                  f"domain ({', '.join(map(str, self.domain))}); give "
                                  f"{self.name} those dims too (its domain=) if it holds a value "
                                  "per point of them, or reduce over or index them away", loc)
        if value.dtype != self.dtype:
            dt, _ = promote([self.type, value.type])
            if not value.type.weak or dt != self.dtype:
                raise DTypeError(f"{self.name} is {self.dtype.name} but the assigned value is "
                                 f"{value.dtype.name}; convert it with .astype('{self.dtype.name}')",
                                 loc)
            value = apply("cast", [value], {"dtype": self.dtype})
        want = tuple(map(norm_dim, self.shape))
        if tuple(map(norm_dim, value.shape)) != want:
            try:
                fits = broadcast_shapes(value.shape, self.shape) == want
            except ShapeError:
                fits = False
            if not fits:
                raise ShapeError(f"{self.name} has shape {self.shape} but the assigned value has "
                                 f"shape {value.shape}; reshape it to match", loc)
            value = apply("broadcast_to", [value], {"shape": self.shape})
        return value


def _spatial_index(entries) -> tuple:
    out = []
    for e in entries:
        if e is None or e is Ellipsis:
            out.append(e)
        elif isinstance(e, slice):
            parts = [None if p is None else int(as_expr(p)) for p in (e.start, e.stop, e.step)]
            out.append(slice(*parts))
        elif isinstance(e, RecurrentTensor):
            raise ShapeError("indexing by a tensor value (gather) is not supported yet; use a "
                             "one-hot matmul or tl.where")
        else:
            out.append(int(as_expr(e)))
    if out.count(Ellipsis) > 1:
        raise ShapeError("at most one ... in an index")
    return tuple(out)


# -- building ops ---------------------------------------------------------------------------------
def as_tensor(x, ctx: Context, over=()) -> RecurrentTensor:
    """Lift Python scalars, arrays and index expressions into recurrent tensors of ``ctx``;
    an expression's value is over its dims and the dims ``over`` (where a ragged bound in it
    means each instance's own)."""
    if isinstance(x, RecurrentTensor):
        if x.ctx is not ctx:
            raise ExprError("this tensor comes from another tl.Context; build a program inside "
                            "one context")
        return x
    if isinstance(x, Product):  # B * T: a value, the product of its factors' values
        out = as_tensor(x.factors[0], ctx, over)
        for f in x.factors[1:]:
            out = out * as_tensor(f, ctx, over)
        return out
    if isinstance(x, (Expr, Cond)):
        if isinstance(x, Const):
            return constant(x.value, ctx)
        ctx.check_expr(x, f"the expression {x}")
        loc = user_location()
        dims = x.dims() | set(over)
        node = ctx.add_node("dimval", [], {"expr": x}, tuple(d for d in ctx.dims if d in dims),
                            infer("dimval", [], {"expr": x}), loc=loc)
        ctx.record("dimval", f"%{node.id} = dimval({x})", node, loc)
        return RecurrentTensor(ctx, node)
    return constant(x, ctx)


def numeric_array(value, what: str, loc=None) -> np.ndarray:
    """``value`` as a numeric NumPy array, or a DTypeError that says what it was."""
    try:
        arr = np.asarray(value)
    except Exception as e:  # ragged nested lists
        raise DTypeError(f"{what}: cannot turn {type(value).__name__} into an array ({e}); "
                         "give a rectangular array of numbers", loc) from None
    if arr.dtype.kind == "V" and arr.dtype.fields is None:  # ml_dtypes' int4 and others
        canonical_dtype(arr.dtype)  # numbers in a dtype not supported: it says which are
    if not (arr.dtype.kind in "biu" or is_floating(arr.dtype)):
        raise DTypeError(f"{what}: the values are {arr.dtype} ({type(value).__name__}), not "
                         "numbers; give an array of bools, ints or floats", loc)
    return arr


def constant(value, ctx: Context, dtype=None, name: str | None = None) -> RecurrentTensor:
    weak = isinstance(value, (bool, int, float, complex)) and dtype is None
    weak = weak and not isinstance(value, bool)
    loc = user_location()
    arr = numeric_array(value, "a constant", loc)
    dt = canonical_dtype(dtype if dtype is not None else arr.dtype)
    arr = cast_array(arr, dt, "a constant", loc)
    node = ctx.add_node("const", [], {"value": arr, "weak": weak}, (),
                        TensorType(arr.shape, dt, weak), name=name, loc=loc)
    shown = arr.item() if arr.ndim == 0 else f"array({TensorType(arr.shape, dt)})"
    ctx.record("const", f"%{node.id} = const({shown})", node, loc)
    return RecurrentTensor(ctx, node)


def apply(kind: str, args, attrs: dict | None = None) -> RecurrentTensor:
    """Record one primitive op on the (lifted) arguments; shape/dtype errors raise here."""
    attrs = attrs or {}
    ctx = current_context(*args)
    loc = user_location()
    ctx.check_open(f"this op ({kind})", loc)
    rts = [as_tensor(a, ctx) for a in args]
    type_ = infer(kind, [r.type for r in rts], attrs)
    domain = set().union(*(r.domain for r in rts)) if rts else set()
    node = ctx.add_node(kind, [r._input() for r in rts], attrs, domain, type_,
                        name=assigned_name(), loc=loc)
    shown = [f"{k}={v}" for k, v in attrs.items() if k not in ("value", "array", "fn")]
    ctx.record(kind, f"%{node.id} = {kind}({', '.join([r._ref() for r in rts] + shown)})",
               node, loc)
    return RecurrentTensor(ctx, node)
