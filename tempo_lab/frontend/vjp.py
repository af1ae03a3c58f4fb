"""Vector-Jacobian products of the primitive ops, written with the ops themselves and
registered in the op catalog (``CATALOG[kind].vjp``).

``vjp(node, g, xs, y)`` gets the op's node, the cotangent ``g`` of its value (a lifted call's
several outputs: ``{output: cotangent}``), its inputs
``xs`` as the op read them and its value ``y``; it returns one cotangent per input, shaped like
that input (``None``: no gradient). Ties and kinks follow ``jax.grad``: ``maximum``/``minimum``
split a tie evenly, ``max``/``min`` reductions share it among the equal elements, ``abs`` and
``relu`` have slope 0 at 0.

``vjp_sum(node, g, xs, k)`` is an op's cotangent for input ``k`` summed over points, for the
ops where the sum is a contraction (``CATALOG[kind].vjp_sum``): ``g`` and the inputs other than
``k`` carry the points as a leading axis, input ``k`` (a parameter, the same at every point)
does not. A weight read at every token then gets one matmul of the transposed activations with
the cotangents, an embedding table one scatter-add, as ``jax.grad`` of a batched model gives,
instead of a weight-sized value per token summed afterwards. None: no such form (the rule per
point and a sum are used, see autodiff.py).
"""
from __future__ import annotations

import numpy as np

from ..errors import GradientError
from ..ir.cotangent import Cotangent
from ..ir.ops import BINARY, CATALOG, NONE, UNARY, is_floating, norm_axes, norm_dim, rule
from .tensor import apply, as_tensor


def unbroadcast(g, shape):
    """Sum ``g`` down to ``shape``: the transpose of broadcasting."""
    extra = g.ndim - len(shape)
    if extra > 0:
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, (a, b) in enumerate(zip(g.shape, shape))
                 if norm_dim(b) == 1 and norm_dim(a) != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _where(c, a, b):
    return apply("where", [c, a, b])


def _zero_like_scalar(g):
    return as_tensor(np.zeros((), g.dtype), g.ctx)


def _swap(x):
    perm = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    return x.transpose(perm)


def _reduced(node, x, g):
    axes = norm_axes(node.attrs.get("axis"), x.ndim, node.kind)
    if not node.attrs.get("keepdims", False):
        g = g.expand_dims(tuple(sorted(axes)))
    return axes, g


def _count(x, axes):
    n = 1
    sym = []
    for a in axes:
        s = norm_dim(x.shape[a])
        if isinstance(s, int):
            n *= s
        else:
            sym.append(s)
    out = as_tensor(np.asarray(n, np.float32), x.ctx)
    for s in sym:  # a size with a ragged bound is each instance's: evaluated where x lives
        out = out * as_tensor(s, x.ctx, over=x.domain)
    return out


def _sum(node, g, xs, y):
    (x,) = xs
    _, g = _reduced(node, x, g)
    return [apply("broadcast_to", [g], {"shape": tuple(x.shape)})]


def _mean(node, g, xs, y):
    (x,) = xs
    axes, g = _reduced(node, x, g)
    return [apply("broadcast_to", [g / _count(x, axes)], {"shape": tuple(x.shape)})]


def _maxmin(node, g, xs, y):
    (x,) = xs
    _, g = _reduced(node, x, g)
    _, ye = _reduced(node, x, y)
    hit = (x == ye).astype(g.dtype)
    share = hit / hit.sum(axis=node.attrs.get("axis"), keepdims=True)
    return [g * share]


def _softmax(node, g, xs, y):
    return [y * (g - (g * y).sum(axis=node.attrs["axis"], keepdims=True))]


def _matmul(node, g, xs, y):
    a, b = xs
    if a.ndim == 1 and b.ndim == 1:
        return [g * b, g * a]
    if a.ndim == 1:
        ga = (g.expand_dims(-2) @ _swap(b)).squeeze(-2)
        gb = a.expand_dims(-1) * g.expand_dims(-2)
    elif b.ndim == 1:
        ga = g.expand_dims(-1) * b
        gb = (_swap(a) @ g.expand_dims(-1)).squeeze(-1)
    else:
        ga, gb = g @ _swap(b), _swap(a) @ g
    return [unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)]


def _matmul_sum(node, g, xs, k):
    """``sum_s a[s] (x) g[s]`` for rows ``a`` (a vector at each point) read with a weight
    ``b``: ``A^T @ G``; and for a weight ``a`` applied to a vector ``b``: ``G^T @ B``. For
    matrices at each point with batch axes (attention's heads reading every token's keys),
    the points are contracted in one batched matmul and the rows (``k = 1``) or columns
    (``k = 0``) summed after it, as no reshape can merge a bound's points with them."""
    a, b = xs
    if k == 1 and a.ndim == 2 and b.ndim == 2:
        return _swap(a) @ g
    if k == 0 and a.ndim == 2 and b.ndim == 2:
        return _swap(g) @ b
    w, other = xs[k], xs[1 - k]
    nb = w.ndim - 2  # the summed input's batch axes, which the points' matrices must share
    if nb < 0 or other.ndim != w.ndim + 1 or g.ndim != w.ndim + 1 \
            or tuple(other.shape[1:nb + 1]) != tuple(w.shape[:nb]) \
            or tuple(g.shape[1:nb + 1]) != tuple(w.shape[:nb]):
        return None
    batch = tuple(range(1, nb + 1))
    if k == 1:  # sum over s, m of a[s, B, m, n] g[s, B, m, p]
        x = other.transpose((*batch, nb + 1, nb + 2, 0))    # (B, m, n, S)
        y = g.transpose((*batch, nb + 1, 0, nb + 2))        # (B, m, S, p)
    else:  # sum over s, p of g[s, B, m, p] b[s, B, n, p]
        x = g.transpose((*batch, nb + 2, nb + 1, 0))        # (B, p, m, S)
        y = other.transpose((*batch, nb + 2, 0, nb + 1))    # (B, p, S, n)
    return (x @ y).sum(axis=nb)


def _take_sum(node, g, xs, k):
    """The table's cotangent: every point's cotangent added at its (clamped) position."""
    x, index = xs[0], xs[1:]
    if k != 0:
        return None
    axis = node.attrs["axis"] % (x.ndim - len(index) + 1)
    return apply("scatter_add", [g, *index], {"axis": axis, "shape": tuple(x.shape)})


def _getitem(node, g, xs, y):
    (x,) = xs
    index = node.attrs["index"]
    n_real = sum(1 for e in index if e is not None and e is not Ellipsis)
    if Ellipsis in index:
        i = index.index(Ellipsis)
        index = index[:i] + (slice(None),) * (x.ndim - n_real) + index[i + 1:]
    new_axes, pos = [], 0
    for e in index:  # positions of the axes that None inserted into the result
        if e is None:
            new_axes.append(pos)
        if not isinstance(e, int):
            pos += 1
    if new_axes:
        g = g.squeeze(tuple(new_axes))
    index = tuple(e for e in index if e is not None)
    for e, size in zip(index, x.shape):
        if not isinstance(norm_dim(size), int) and isinstance(e, int) and e < 0:
            raise GradientError(f"no gradient for a negative index into the symbolic axis of "
                                f"size {size} (at {node.loc}); index from the start")
    return [apply("unindex", [g], {"index": index, "shape": tuple(x.shape)})]


def _concatenate(node, g, xs, y):
    axis = node.attrs["axis"] % y.ndim
    out, start = [], 0
    for x in xs:
        size = norm_dim(x.shape[axis])
        if not isinstance(size, int) or not isinstance(start, int):
            raise GradientError(f"no gradient for concatenating along a symbolic axis (at "
                                f"{node.loc}); concatenate along a static axis")
        index = (slice(None),) * axis + (slice(start, start + size),)
        out.append(apply("getitem", [g], {"index": index}))
        start += size
    return out


def _lift(node, g, xs, y):
    """Each input's cotangent is another lifted function: ``jax.vjp`` of the original. ``g``
    is a dict ``{output: cotangent}`` where several outputs of one call send cotangents back
    (``autodiff._Backward._same_call``): one ``vjp`` takes them all."""
    from .api import lift

    fn = node.attrs["jax_fn"]
    outs, gs = (tuple(g), list(g.values())) if isinstance(g, dict) else (node.attrs["out"], [g])
    return [lift(Cotangent(fn, outs, j))(*xs, *gs) if is_floating(x.dtype) else None
            for j, x in enumerate(xs)]


def _pow(node, g, xs, y):
    a, b = xs
    ga = g * b * a ** (b - 1)
    safe = _where(a == 0, as_tensor(np.ones((), a.dtype), a.ctx), a)
    gb = g * _where(a == 0, _zero_like_scalar(g), apply("log", [safe])) * y
    return [unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)]


def _tie(g, a, b, wins):
    """``g`` where ``a`` strictly wins, half of it at a tie, else 0 (jax.grad's split)."""
    half = as_tensor(np.asarray(0.5, g.dtype), g.ctx)
    return g * _where(a == b, half, wins.astype(g.dtype))


def _elementwise(fn):
    def rule(node, g, xs, y):
        return [None if c is None else unbroadcast(c, x.shape)
                for c, x in zip(fn(g, *xs, y), xs)]
    return rule


def _sign(x):
    one = as_tensor(np.ones((), x.dtype), x.ctx)
    zero = as_tensor(np.zeros((), x.dtype), x.ctx)
    return _where(x > 0, one, _where(x < 0, -one, zero))


class _Helpers:
    """What the VJPs of elementwise ops (``ir/ops.py``: ``UNARY``, ``BINARY``) are written
    with, besides the operators of recurrent tensors."""

    @staticmethod
    def where(c, a, b):
        return _where(c, a, b)

    @staticmethod
    def op(kind, *args):
        return apply(kind, list(args))

    sign = staticmethod(_sign)
    tie = staticmethod(_tie)


F = _Helpers()
for _k, _e in (*UNARY.items(), *BINARY.items()):
    if _e.vjp == NONE:
        CATALOG[_k].vjp = NONE
    else:
        rule("vjp", _k)(_elementwise(lambda g, *xs, _f=_e.vjp: _f(F, g, *xs)))
for _k in ("not", "dimval", "const", "from_array", "source", "sink", "random", "embed",
           "scatter_add"):
    CATALOG[_k].vjp = NONE  # no gradient (flags no_grad or bwd_only)
CATALOG["merge"].vjp = NONE  # a placeholder's adjoint is a placeholder (frontend/autodiff.py)
CATALOG["fused"].vjp = NONE  # gradients are built before any pass fuses ops

rule("vjp", "identity")(lambda node, g, xs, y: [g])
rule("vjp", "div")(_elementwise(lambda g, a, b, y: [g / b, -g * y / b]))
rule("vjp", "pow")(_pow)
rule("vjp", "cast")(lambda node, g, xs, y: [g if is_floating(xs[0].dtype) else None])
rule("vjp", "where")(_elementwise(lambda g, c, a, b, y: [None, _where(c, g, _zero_like_scalar(g)),
                                                         _where(c, _zero_like_scalar(g), g)]))
rule("vjp", "sum")(_sum)
rule("vjp", "mean")(_mean)
rule("vjp", "max")(_maxmin)
rule("vjp", "min")(_maxmin)
rule("vjp", "softmax")(_softmax)
rule("vjp", "matmul")(_matmul)
rule("vjp_sum", "matmul")(_matmul_sum)
rule("vjp_sum", "take")(_take_sum)
rule("vjp", "reshape")(lambda node, g, xs, y: [g.reshape(tuple(xs[0].shape))])
rule("vjp", "transpose")(lambda node, g, xs, y: [
    g.transpose(tuple(int(i) for i in np.argsort(node.attrs["perm"])))])
rule("vjp", "squeeze")(lambda node, g, xs, y: [g.expand_dims(tuple(sorted(node.attrs["axis"])))])
rule("vjp", "expand_dims")(lambda node, g, xs, y: [g.squeeze(tuple(node.attrs["axis"]))])
rule("vjp", "broadcast_to")(lambda node, g, xs, y: [unbroadcast(g, xs[0].shape)])
rule("vjp", "getitem")(_getitem)
rule("vjp", "lift")(_lift)
rule("vjp", "unindex")(lambda node, g, xs, y: [apply("getitem", [g],
                                                     {"index": node.attrs["index"]})])


@rule("vjp", "take")
def _take(node, g, xs, y):
    """The cotangent embedded at the (clamped) positions, innermost indexed axis first."""
    x, index = xs[0], xs[1:]
    axis = node.attrs["axis"] % (x.ndim - len(index) + 1)
    for k in reversed(range(len(index))):
        size = x.shape[axis + k]
        at = apply("maximum", [apply("minimum", [index[k], as_tensor(size - 1, g.ctx)]),
                               as_tensor(0, g.ctx)])
        g = apply("embed", [g.expand_dims(axis), at], {"axis": axis, "size": size})
    return [g] + [None] * len(index)
rule("vjp", "concatenate")(_concatenate)
