"""JAX implementations of the primitive ops on padded values.

A symbolic axis (a range read through ``0:t+1``, or anything computed from one) is padded to a
static size (``memory.pad``) so kernels compile once per size class. Each input comes with the
valid length of every padded axis (``None`` for static axes); ops that would let padding leak
into valid results (reductions, softmax, contractions, negative indices) mask it out. Dtype
rules are the reference interpreter's: operands are promoted as in ``jax.numpy``.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import custom_batching, lax

from ..ir.ops import BINARY, CATALOG, NONE, UNARY, accumulator, is_floating, promote, rule
from ..ir.sdg import Op
from . import counter_rng


class Zeroed(tuple):
    """The valid lengths of an input whose padding is known to hold zeros (a read of a store
    beyond what its loop has written yet): masking it with zeros is left out, so an
    attention step reads its values in place instead of copying them masked. A kernel's
    ``lens`` carry the fact with the input, through ``vmap`` and fused bodies."""


def _mask(x, axis: int, n, fill, lens=()):
    """``x`` with entries ``n:`` of ``axis`` set to ``fill`` (left out where ``lens``, the
    input's lengths, say its padding already holds zeros)."""
    if isinstance(lens, Zeroed) and fill == 0:
        return x
    keep = lax.broadcasted_iota(jnp.int32, x.shape, axis) < n
    return jnp.where(keep, x, jnp.asarray(fill, x.dtype))


def _extreme(dtype, low: bool):
    if jnp.issubdtype(dtype, jnp.floating):
        return -jnp.inf if low else jnp.inf
    if dtype == jnp.bool_:
        return not low
    info = jnp.iinfo(dtype)
    return info.min if low else info.max


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = (axis,) if isinstance(axis, int) else tuple(axis)
    return tuple(a % ndim for a in axis)


def compute(op: Op, xs: list, lens: list[tuple], in_types, out_shape) -> jax.Array:
    """The value of ``op`` at one point from padded inputs ``xs`` with valid ``lens``: its
    catalog JAX rule."""
    return CATALOG[op.kind].jax(op, xs, lens, in_types, out_shape)


# -- the JAX rule of every op --------------------------------------------------------------------
def _unary_rule(fn):
    return lambda op, xs, lens, types, out: fn(xs[0].astype(op.type.dtype))


def _binary_rule(fn):
    def rule_(op, xs, lens, types, out):
        cdt, _ = promote(types)
        a, b = _broadcastable(xs, out)
        return fn(a.astype(cdt), b.astype(cdt))
    return rule_


def _broadcastable(xs, out) -> list:
    """The operands of an elementwise op, each axis that is shorter than the output's padded
    axis (and not 1) padded to it: a whole static array read where the output's axis is a
    bound padded to its size class (``x[b, 0:T]`` of a 7-point array, vectorised, beside a
    mask of ``T`` padded to 8); and each longer one cut to it (a value batched over all of a
    range beside a read padded to the size class of a span of the loop, 32 of 256 tokens).
    The padding is past every valid point."""
    out = tuple(out)
    fitted = []
    for x in xs:
        lead = len(out) - x.ndim
        pads = [(0, 0)] * x.ndim
        for a in range(x.ndim):
            n = out[lead + a] if lead + a >= 0 else x.shape[a]
            if isinstance(n, int) and 1 < x.shape[a] < n:
                pads[a] = (0, n - x.shape[a])
            elif isinstance(n, int) and 1 < n < x.shape[a]:  # longer than the output's padded
                x = lax.slice_in_dim(x, 0, n, axis=a)  # axis (a whole range beside a span's
        fitted.append(jnp.pad(x, pads) if any(p != (0, 0) for p in pads) else x)  # size class)
    return fitted


for _k, _e in UNARY.items():
    rule("jax", _k)(_unary_rule(_e.jax))
for _k, _e in BINARY.items():
    rule("jax", _k)(_binary_rule(_e.jax))
rule("jax", "pow")(_binary_rule(jnp.power))
rule("jax", "div")(_binary_rule(jnp.true_divide))
rule("jax", "not")(lambda op, xs, lens, types, out: jnp.logical_not(xs[0]))
rule("jax", "identity")(lambda op, xs, lens, types, out: xs[0])
rule("jax", "merge")(lambda op, xs, lens, types, out: xs[0])
rule("jax", "cast")(lambda op, xs, lens, types, out: xs[0].astype(op.type.dtype))
rule("jax", "reshape")(lambda op, xs, lens, types, out: xs[0].reshape(op.type.shape))
rule("jax", "transpose")(lambda op, xs, lens, types, out: jnp.transpose(xs[0], op.attrs["perm"]))
rule("jax", "squeeze")(
    lambda op, xs, lens, types, out: jnp.squeeze(xs[0], axis=tuple(op.attrs["axis"])))
rule("jax", "expand_dims")(
    lambda op, xs, lens, types, out: jnp.expand_dims(xs[0], axis=tuple(op.attrs["axis"])))
rule("jax", "broadcast_to")(lambda op, xs, lens, types, out: jnp.broadcast_to(xs[0], out))
rule("jax", "getitem")(lambda op, xs, lens, types, out: xs[0][_dynamic_index(
    op.attrs["index"], lens[0], xs[0].ndim)])
rule("jax", "random")(lambda op, xs, lens, types, out: counter_rng.sample(jnp, op.attrs, xs))
rule("jax", "lift")(lambda op, xs, lens, types, out: lift_output(op.attrs, xs))


@rule("jax", "take")
def _jax_take(op, xs, lens, types, out):
    """One dynamic slice of size 1 on the indexed axes (clamped, as the reference): under
    ``vmap`` a single gather, however many axes are indexed."""
    x, index = xs[0], xs[1:]
    axis = op.attrs["axis"] % (x.ndim - len(index) + 1)
    starts = [0] * x.ndim
    sizes = list(x.shape)
    for k, i in enumerate(index):
        n = lens[0][axis + k]        # a range read's length, where the buffer is padded
        last = (x.shape[axis + k] if n is None else n) - 1
        starts[axis + k], sizes[axis + k] = jnp.clip(i, 0, last), 1
    return lax.dynamic_slice(x, starts, sizes).reshape(out)
rule("jax", "unindex")(lambda op, xs, lens, types, out: jnp.zeros(out, xs[0].dtype).at[
    op.attrs["index"]].set(xs[0]))
for _k in ("const", "dimval", "source", "from_array"):  # the kernel takes the host's value
    CATALOG[_k].jax = NONE
rule("jax", "sink")(lambda op, xs, lens, types, out: xs[0])  # the value delivered to the host


@rule("jax", "fused")
def _jax_fused(op, xs, lens, in_types, out):
    return run_body(op, xs, lens, in_types,
                    lambda o, a, ln, ts: compute(o, a, ln, ts, o.type.shape))


@rule("jax", "where")
def _jax_where(op, xs, lens, types, out):
    cdt, _ = promote(types[1:])
    c, a, b = _broadcastable(xs, out)
    return jnp.where(c, a.astype(cdt), b.astype(cdt))


IN_ORDER = 8  # NumPy adds fewer terms than this one after another (its pairwise sum's base)


def _reduce_rule(fn):
    def rule_(op, xs, lens, types, out):
        k, dt = op.kind, op.type.dtype
        x, ln = xs[0], lens[0]
        if k in ("sum", "mean"):
            x = x.astype(accumulator(dt))
        widened = x.dtype != dt and is_floating(dt)  # a 16-bit float summed in float32
        axes = _axes(op.attrs.get("axis"), x.ndim)
        fill = 0 if k in ("sum", "mean") else _extreme(x.dtype, low=(k == "max"))
        count = 1
        for ax in axes:
            if ln[ax] is not None:
                x = _mask(x, ax, ln[ax], fill, ln)
            count = count * (ln[ax] if ln[ax] is not None else x.shape[ax])
        keep = op.attrs.get("keepdims", False)
        if widened and len(axes) == 1 and 0 < x.shape[axes[0]] < IN_ORDER:
            y = _in_order(x, axes[0], keep)
        else:
            y = fn(x, axis=axes, keepdims=keep)
        return (y / jnp.asarray(count, x.dtype) if k == "mean" else y).astype(dt)
    return rule_


def _in_order(x, axis: int, keepdims: bool):
    """The sum of ``x`` along ``axis``, its terms added first to last, as NumPy adds a few: a
    float32 sum of 16-bit values near float32's largest (bfloat16's largest is one) overflows
    or not by the order of its terms (``max + max - max - max`` is inf in order, 0 in XLA's
    pairs)."""
    y = lax.index_in_dim(x, 0, axis, keepdims)
    for j in range(1, x.shape[axis]):
        y = y + lax.index_in_dim(x, j, axis, keepdims)
    return y


for _k, _fn in {"sum": jnp.sum, "mean": jnp.sum, "max": jnp.max, "min": jnp.min}.items():
    rule("jax", _k)(_reduce_rule(_fn))


@rule("jax", "softmax")
def _jax_softmax(op, xs, lens, types, out):
    dt = op.type.dtype
    x, ax = xs[0].astype(accumulator(dt)), op.attrs["axis"] % xs[0].ndim
    n = lens[0][ax]
    if n is None:
        return jax.nn.softmax(x, axis=ax).astype(dt)
    return _mask(jax.nn.softmax(_mask(x, ax, n, -jnp.inf), axis=ax), ax, n, 0).astype(dt)


@rule("jax", "matmul")
def _jax_matmul(op, xs, lens, types, out):
    """``jnp.matmul``. A vector or matrix ``y`` is contracted by one ``dot_general`` on the
    axis it is stored with (the last one for ``tb``; ``jnp.matmul`` of its transpose made XLA
    on the CPU copy a (2048, 128256) table, 1 GB, and take 20x longer) and in its own dtype
    (a bfloat16 weight is not converted to a float32 copy first)."""
    cdt, _ = promote(types)
    tb = op.attrs.get("tb", False)
    x, y = xs[0].astype(cdt), xs[1]
    ky = y.ndim - (1 if tb or y.ndim == 1 else 2)  # y's contracted axis
    x, y = _common_length(x, x.ndim - 1, y, ky)
    n = lens[0][-1] if lens[0][-1] is not None else lens[1][ky]
    if n is not None:
        x = _mask(x, x.ndim - 1, n, 0, lens[0])
        y = _mask(y, ky, n, 0, lens[1])
    if y.ndim == 2 and tb and _fused_product(x, y, cdt):
        rows = math.prod(x.shape[:-1])
        out = _rows_product(jnp.dtype(cdt))(x.reshape(rows, x.shape[-1]), y)
        return out.reshape(*x.shape[:-1], y.shape[0])
    if y.ndim <= 2 and (tb or y.dtype != cdt):  # as stored, in its dtype, accumulated in cdt
        return lax.dot_general(x, y, (((x.ndim - 1,), (ky,)), ((), ())),
                               preferred_element_type=cdt).astype(cdt)
    y = jnp.swapaxes(y, -1, -2) if tb else y
    return jnp.matmul(x, y.astype(cdt))


def _common_length(x, ax, y, ay):
    """``x`` and ``y`` cut to the same length on the axes they are contracted along. A range
    read comes padded to its size class, a value batched over the range (group vectorisation)
    has exactly its points, and the points past the shorter one's end are padding in both
    (a weight's gradient contracts the activations read as a range with the cotangents made
    in one batch)."""
    m = min(x.shape[ax], y.shape[ay])
    return lax.slice_in_dim(x, 0, m, axis=ax), lax.slice_in_dim(y, 0, m, axis=ay)


FEW_ROWS = 16  # rows of x up to which a 16-bit matrix is applied by a fused product (below)


def _fused_product(x, y, cdt) -> bool:
    """Whether ``x @ y.T`` is a multiply and sum over ``y``'s contiguous last axis instead of
    a dot: for a 16-bit ``y`` (a bfloat16 weight) and a few rows of ``x`` on the CPU, where
    XLA's dot first converts the whole matrix to a float32 copy (measured at (8192, 2048):
    dot 42-54 ms, the fused product 7 ms, a float32 dot 3-7 ms). On a GPU the dot is native."""
    return (y.dtype.itemsize < jnp.dtype(cdt).itemsize and jnp.issubdtype(cdt, jnp.floating)
            and math.prod(x.shape[:-1]) <= FEW_ROWS and jax.default_backend() == "cpu")


@functools.cache
def _rows_product(cdt):
    """``(x, w) -> x @ w.T`` for rows ``x`` (R, K) and a 16-bit ``w`` (N, K), as a multiply and
    sum that XLA fuses with the conversion of ``w``. One row is a vector product: XLA on the
    CPU emitted a (1, N, K) product 12x slower than (N, K) or (2, N, K), so batching (a
    vectorised dim, ``jax.vmap``) moves its dim into the rows instead of adding one. ``x`` and
    ``w`` pass one optimisation barrier together: ``w.astype`` alone is loop-invariant, and
    XLA hoisted it out of the decode loop as a float32 copy of every weight."""
    @custom_batching.custom_vmap
    def product(x, w):
        x, w = lax.optimization_barrier((x, w))  # else XLA hoists w's float32 copy from loops
        wf = w.astype(cdt)
        return (x[0] * wf).sum(-1)[None] if x.shape[0] == 1 else (x[:, None, :] * wf).sum(-1)

    @product.def_vmap
    def _batched(size, batched, x, w):
        if batched[1]:  # a weight per batch entry: no shared matrix to stream
            x = x if batched[0] else jnp.broadcast_to(x, (size, *x.shape))
            return jax.vmap(lambda a, b: (a[:, None, :] * b.astype(cdt)).sum(-1))(x, w), True
        if not batched[0]:
            return product(x, w), False
        return product(x.reshape(-1, x.shape[-1]), w).reshape(size, x.shape[1], -1), True

    return product


FEW_POSITIONS = 64  # positions up to which a scatter-add is a one-hot matmul (see below)


@rule("jax", "scatter_add")
def _jax_scatter_add(op, xs, lens, types, out):
    """One scatter-add (XLA's), accumulated as the reference does; the padding of a range
    read's points adds zeros. Into at most ``FEW_POSITIONS`` rows (the layers of weights
    stacked over a layer dim, ``tl.take(w, n)``) a one-hot matmul instead: on the CPU, for
    two (512, 256) layers, 64 against XLA's scatter's 87 us alone, 0.7 against 1.3 ms as
    profiled inside a training step."""
    g, index, axis = xs[0], xs[1:], op.attrs["axis"]
    if lens[0][0] is not None:
        g = _mask(g, 0, lens[0][0], 0, lens[0])
    m = min(g.shape[0], *(i.shape[0] for i in index))  # as _common_length, for all of them
    g = lax.slice_in_dim(g, 0, m)
    at = tuple(jnp.clip(lax.slice_in_dim(i, 0, m), 0, out[axis + k] - 1)
               for k, i in enumerate(index))
    if axis == 0 and len(at) == 1 and out[0] <= FEW_POSITIONS:  # a layer's weights: a matmul
        hot = (at[0][:, None] == jnp.arange(out[0])[None, :]).astype(accumulator(g.dtype))
        rows = jnp.dot(hot.T, g.reshape(g.shape[0], -1).astype(hot.dtype))
        return rows.reshape(out).astype(g.dtype)
    acc = jnp.zeros(out, accumulator(g.dtype))
    if axis:  # the points' axis goes where the indexed axes were (NumPy's advanced indexing)
        g = jnp.moveaxis(g, 0, axis)
    return acc.at[(slice(None),) * axis + at].add(g.astype(acc.dtype)).astype(g.dtype)


@rule("jax", "embed")
def _jax_embed(op, xs, lens, types, out):
    x, ax = xs[0], op.attrs["axis"] % xs[0].ndim
    if lens[0][ax] is not None:  # padding must not land inside the frame
        x = _mask(x, ax, lens[0][ax], 0, lens[0])
    frame = list(x.shape)
    frame[ax] = out[ax] + x.shape[ax]
    y = lax.dynamic_update_slice_in_dim(jnp.zeros(frame, x.dtype), x, xs[1], ax)
    return lax.slice_in_dim(y, 0, out[ax], axis=ax)


@rule("jax", "concatenate")
def _jax_concatenate(op, xs, lens, types, out):
    cdt, _ = promote(types)
    return jnp.concatenate([x.astype(cdt) for x in xs], axis=op.attrs["axis"])


def lift_output(attrs: dict, xs: list):
    """A ``tl.lift`` op's value: its function on the inputs (its products with a left operand
    contracted on its last axes: ``lhs_last``), the op's output picked out."""
    out = lhs_last(attrs["jax_fn"])(*xs)
    return out if attrs["out"] is None else out[attrs["out"]]


def lhs_last(fn):
    """``fn`` with each ``dot_general`` whose left operand is not contracted on its last axes
    (a weight's gradient ``x.T @ g`` as ``jax.vjp`` writes it: contracted on the samples'
    axis) given that operand transposed so that it is, and its product kept in that form, each
    held by an optimisation barrier (XLA otherwise folds both transposes back into the
    product). XLA:CPU runs the product in that form on its fast library (XNNPACK), the other
    on a slower path: a (64, 64) weight's gradient from 2 000 samples takes 116 us against 140,
    the transpose's copy included, and PPO's iteration 0.87x the time it took. Up to
    ``LHS_LAST_SIZE`` entries: past them the slower path is the faster (a (256, 32 768)
    operand: 134 ms against 167; (512, 4 096): 7.0 against 5.5). Nested ``jit`` calls are
    evaluated inline; other calls (control flow, custom derivatives) as they are."""
    def run(*args):
        closed, shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = _lhs_last_eval(closed.jaxpr, closed.consts, jax.tree_util.tree_leaves(args))
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(shape), out)
    return run


def _lhs_last_eval(jaxpr, consts, args) -> list:
    from jax.extend.core import Literal

    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    for eqn in jaxpr.eqns:
        ins = [v.val if isinstance(v, Literal) else env[v] for v in eqn.invars]
        if eqn.primitive is lax.dot_general_p:
            outs = [_dot_lhs_last(*ins, **eqn.params)]
        elif eqn.primitive.name in ("pjit", "jit") and "jaxpr" in eqn.params:
            inner = eqn.params["jaxpr"]
            outs = _lhs_last_eval(inner.jaxpr, inner.consts, ins)
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)  # older jax: (subfuns, params)
            subfuns, params = bound if isinstance(bound, tuple) else ((), bound)
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*subfuns, *ins, **params)
            outs = outs if eqn.primitive.multiple_results else [outs]
        env.update(zip(eqn.outvars, outs))
    return [v.val if isinstance(v, Literal) else env[v] for v in jaxpr.outvars]


LHS_LAST_SIZE = 1 << 22  # entries of a left operand that lhs_last transposes, at most


def _dot_lhs_last(x, y, dimension_numbers, **params):
    (cx, cy), (bx, by) = dimension_numbers
    free = [a for a in range(x.ndim) if a not in cx and a not in bx]
    order = [*bx, *free, *cx]
    if order == list(range(x.ndim)) or x.size > LHS_LAST_SIZE:
        return lax.dot_general(x, y, dimension_numbers, **params)
    x = lax.optimization_barrier(jnp.transpose(x, order))
    nb, nf = len(bx), len(free)
    dims = ((tuple(range(nb + nf, x.ndim)), tuple(cy)), (tuple(range(nb)), tuple(by)))
    return lax.optimization_barrier(lax.dot_general(x, y, dims, **params))


def run_body(op: Op, xs: list, lens: list, in_types, compute_one):
    """Evaluate a fused op's body: ``compute_one(op, inputs, lens, input types)`` per member.
    Members have static shapes, so values made inside the body need no masks."""
    vals, types = [], []
    for member, refs in op.attrs["body"]:
        args = [xs[k] if where == "ext" else vals[k] for where, k in refs]
        ln = [lens[k] if where == "ext" else (None,) * len(types[k].shape)
              for where, k in refs]
        ts = [in_types[k] if where == "ext" else types[k] for where, k in refs]
        vals.append(compute_one(member, args, ln, ts).astype(member.type.dtype))
        types.append(member.type)
    return vals[-1]


def _dynamic_index(index, lens, ndim):
    """A negative int index on a padded axis counts from the valid end, not the padded end."""
    n_real = sum(1 for e in index if e is not None and e is not Ellipsis)
    if Ellipsis in index:
        i = index.index(Ellipsis)
        index = index[:i] + (slice(None),) * (ndim - n_real) + index[i + 1:]
    out, axis = [], 0
    for e in index:
        if e is None:
            out.append(None)
            continue
        if isinstance(e, int) and e < 0 and lens[axis] is not None:
            e = lens[axis] + e
        out.append(e)
        axis += 1
    return tuple(out)


def fit(x, shape) -> jax.Array:
    """Pad with zeros or cut ``x`` to ``shape`` (both are padded static shapes)."""
    if tuple(x.shape) == tuple(shape):
        return x
    x = x[tuple(slice(0, s) for s in shape)]
    return jnp.pad(x, [(0, s - d) for s, d in zip(shape, x.shape)])
