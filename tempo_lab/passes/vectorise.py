"""Vectorisation: a dim that no read crosses becomes a spatial axis (whole, or in blocks).

If every read of every op over ``d`` happens at the reader's own ``d`` (no ``b - 1``, no partial
slice or constant point along ``d``, no condition or index that mentions ``d``), the points along
``d`` are independent: the whole range can run at once. A read of the *whole* range ``0:D`` (a
reduction over the batch) is allowed when it is the read's last slice: it then reads the
producer's leading axis as it is, and a reader over ``d`` gets it whole rather than one element
(``attrs["whole"]`` lists those input slots). Each op over ``d`` then drops ``d`` from its
domain and gains a leading axis of size ``D``; it keeps its own attributes and is applied per
element of that axis (``vdims`` lists the vectorised dims, outermost leading axis first), so op
semantics need no batching rules: the JAX executor uses ``jax.vmap``, the reference a loop.

Rejected when ``d`` is data-dependent (``tl.until``), read by a sink or a ``tl.source``, or when
the largest value would exceed the budget for one value (``CompileConfig.value_budget``).

The innermost dim some reads cross (a recurrence: ``x[t - 1]``) is vectorised per op group
(``vectorise_group``): the ops on no cycle that crosses ``d`` and that read ``d`` only at their
own point become one batched computation over all of ``d``, outside the loop that the
recurrence keeps. They read a looped producer's whole range (``attrs["stacked"]``), and a looped
reader reads them through a per-point view (``take`` at the value of ``d``); a read at one point
that no dim moves (a boundary step's ``x[b, 0]``) takes that point from the batch where it is
read (``_point_reads``). This is how the
rollout's recurrence stays a loop over ``t`` while the value network, GAE's inputs, the per-step
losses and their cotangents run as batched computations, as hand-written JAX would do them.
Not along a dim the stream pass made running sums along (``CompileConfig(stream=True)``): a
batch reads every step of the loop's values, so memory would grow with the steps again.
Values of ``d``'s index alone stay in the loop (``_left_in_loop``), and so do inputs the
recurrence reads (``_looped_inputs``). A layer's weights taken at the layer's index and read
by several ops (its forward and backward pass) are taken once per reader
(``_takes_per_reader``), each beside its reader, not held from one to the other. On by
default; ``CompileConfig(vectorise_groups=False)`` keeps the ops in the loop.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..ir.demand import demand, param_context
from ..ir.graph import sccs
from ..ir.ops import CATALOG, TensorType, flag, infer, norm_dim
from ..ir.sdg import Edge, Op, index_functions, taken_view
from ..symbolic import TRUE, Bound, Const, Dim, Expr, Slice
from ..symbolic import isl as I
from ..symbolic.expr import MinMax
from ..symbolic.sizes import const_cap
from .manager import Editor, register


def _mentions(x, d: Dim) -> bool:
    return d in x.dims()


def _whole(x, d: Dim) -> bool:
    return isinstance(x, Slice) and x.start == 0 and x.stop == d.bound


def eligible(ed: Editor, d: Dim, size: int, budget: int | None) -> bool:
    """Whether ``d`` can become a spatial axis of ``size`` (``budget`` None: whatever the
    values' size)."""
    return obstacle(ed, d, size, budget) is None


def obstacle(ed: Editor, d: Dim, size: int, budget: int | None) -> tuple[int, str] | None:
    """The first op that keeps ``d`` a loop and why, in words (None: nothing does)."""
    crossing = [e for e in ed.edges if not _own_point(ed, e, d)]
    by_index = [e for e in crossing if not _own_point(ed, dataclasses.replace(e, cond=TRUE), d)]
    for e in by_index or crossing:
        read = f"{ed.ops[e.src].label}[{e.index_str()}]"
        if e in by_index:
            return e.dst, f"its read {read} crosses {d} (a recurrence or a range along it)"
        return e.dst, f"its read {read} holds only where {e.cond}, a condition on {d}"
    for e in ed.edges:
        if d in ed.ops[e.dst].domain and ed.ops[e.dst].kind == "sink" \
                and d in ed.ops[e.src].domain:
            return e.dst, f"a sink runs once per point of {d}, in order"
    for op in ed.ops.values():
        if d in op.domain:
            why = _unbatchable(op, d, size, budget)
            if why:
                return op.id, why
    return None


def _batchable(op: Op, d: Dim, size: int, budget: int | None) -> bool:
    return not _unbatchable(op, d, size, budget)


def _unbatchable(op: Op, d: Dim, size: int, budget: int | None) -> str:
    """Why ``op`` itself allows no batch over ``d`` (empty: it allows one): an effect, a value
    or shape that depends on ``d`` otherwise, or more bytes than the budget. A dim of one
    point batches into no more bytes than its loop holds, however large the point (a batch of
    one whose gradient is a 1 GB embedding table: looped, each such value was a store carried
    through the loop instead of a value XLA frees)."""
    if flag(op.kind, "effect"):
        return f"an effect ({op.kind}) runs once per point of {d}"
    if op.kind == "dimval" and op.attrs["expr"] != d and _mentions(op.attrs["expr"], d):
        return f"its value {op.attrs['expr']} depends on {d}"
    if any(not isinstance(s, int) and _mentions(s, d) for s in op.type.shape):
        return f"its shape {op.type} depends on {d}"
    if budget is not None and size > 1 and largest_point(op) * size > budget:
        return (f"a batch of {size} points would take {largest_point(op) * size} B, over "
                f"the {budget} B one value may take (CompileConfig.value_budget)")
    return ""


def largest_point(op: Op) -> int:
    """Bytes of one point's value, over its static axes."""
    static = int(np.prod([s for s in op.type.shape if isinstance(s, int)], dtype=np.int64))
    return static * op.type.dtype.itemsize


def vectorise_dim(ed: Editor, d: Dim, size: int, block: int | None = None,
                  only: set[int] | None = None):
    """Rewrite every op over ``d`` (or those in ``only``, none of them shaped by ``d``'s
    bound) in place (same ids: readers keep reading the same op). ``block``: ``block``
    points of ``d`` at a time, the blocks along a new dim ``d_blk`` that takes ``d``'s place
    (incrementalisation)."""
    n = block or size
    db = ed.add_dim("parts", d, size // block, in_place=True) if block else None
    renumber = False
    for i, op in list(ed.ops.items()):  # d's own value (domain (d,)): the array 0..D-1
        if only is not None and i not in only:
            continue
        if op.kind == "dimval" and op.attrs["expr"] == d and op.domain == (d,):
            arr = np.arange(size, dtype=op.type.dtype)
            ed.update(i, Op(i, "from_array", op.domain, op.type, {"array": arr, "ndomain": 1},
                            op.loc, op.name), f"value of {d} -> array 0..{size - 1}")
        elif op.kind == "dimval" and d in op.domain:
            # over more dims than its expression's (recomputed where it is read, remat.py):
            # d's values read at d, or the value over the other dims (constant along d)
            expr, rest = op.attrs["expr"], tuple(x for x in op.domain if x != d)
            if expr == d:
                at = ed.add(Op(-1, "from_array", (d,), op.type,
                               {"array": np.arange(size, dtype=op.type.dtype), "ndomain": 1},
                               op.loc), [], i, f"value of {d} -> array 0..{size - 1}")
                index = (d,)
                if only is not None:  # vectorised with the group that reads it
                    only.add(at)
            else:  # _batchable: an expression over d is d itself
                at = ed.add(Op(-1, "dimval", rest, op.type, dict(op.attrs), op.loc), [], i,
                            f"the value of {expr} without {d}")
                index = rest
            ed.rewrite(i, Op(i, "identity", op.domain, op.type, {}, op.loc, op.name),
                       [Edge(i, at, 0, index, TRUE, op.loc)], f"the value of {expr}, read")
            renumber = True
    old = {i: op.domain for i, op in ed.ops.items()}
    touched = [i for i, dom in old.items() if d in dom and (only is None or i in only)]
    reads = [e for e in ed.edges if e.src in touched]
    for i in touched:
        op = ed.ops[i]
        k = op.domain.index(d)
        attrs = dict(op.attrs)
        attrs["vdims"] = (d.name,) + tuple(attrs.get("vdims", ()))
        if op.kind == "from_array":
            arr, nd = attrs["array"], attrs["ndomain"]
            if block:
                arr = arr.reshape(arr.shape[:k] + (size // block, block) + arr.shape[k + 1:])
                attrs["array"] = np.moveaxis(arr, k + 1, nd)
            else:
                attrs["array"], attrs["ndomain"] = np.moveaxis(arr, k, nd - 1), nd - 1
        if op.kind == "merge":
            t = attrs["type"]
            attrs["type"] = TensorType((n,) + t.shape, t.dtype, t.weak)
        domain = tuple(db if x == d else x for x in op.domain if x != d or block)
        ed.update(i, Op(i, op.kind, domain, TensorType((n,) + tuple(op.type.shape),
                                                       op.type.dtype, op.type.weak),
                        attrs, op.loc, op.name),
                  f"{d} -> leading axis" + (f" of {block}-point blocks over {db}" if block else ""))
    for e in reads:
        k = old[e.src].index(d)
        rest = (db,) if block else ()
        ed.reindex(e, e.index[:k] + rest + e.index[k + 1:], f"{d} read whole as an axis")
        if isinstance(e.index[k], Slice) and e.dst in touched:  # a reduction over d
            c = ed.ops[e.dst]
            attrs = {**c.attrs, "whole": tuple(sorted({*c.attrs.get("whole", ()),
                                                       (d.name, e.slot)}))}
            ed.update(c.id, Op(c.id, c.kind, c.domain, c.type, attrs, c.loc, c.name),
                      f"reads all of {d} as an axis")
    if only is None:
        _pin_bound(ed, d.bound, size)
    if renumber:  # an identity reads the op made for it
        ed.renumber()


def _pin_bound(ed: Editor, bound: Bound, value: int):
    """Write ``bound``'s value into every shape that mentions it. A vectorised dim's axis has
    the bound's exact size, so a value shaped by the bound (``x[0:T]``, a gradient's
    ``broadcast_to((T,))``) must have it too, not a padded size class."""
    def pin(v):
        if isinstance(v, Expr) and bound in v.symbols():
            return norm_dim(v.substitute({bound: value}))
        if isinstance(v, TensorType):
            return TensorType(tuple(map(pin, v.shape)), v.dtype, v.weak)
        if isinstance(v, tuple) and not (v and isinstance(v[0], tuple) and v[0]
                                         and isinstance(v[0][0], Op)):  # not a fused body
            return tuple(map(pin, v))
        return v

    for i, op in list(ed.ops.items()):
        keys = [k for k in ("shape", "size", "type") if k in op.attrs]
        new_type = pin(op.type)
        if new_type == op.type and all(pin(op.attrs[k]) == op.attrs[k] for k in keys):
            continue
        attrs = {**op.attrs, **{k: pin(op.attrs[k]) for k in keys}}
        ed.update(i, Op(i, op.kind, op.domain, new_type, attrs, op.loc, op.name),
                  f"{bound} = {value} in its shape")


# -- per op group -------------------------------------------------------------------------------
def _own_point(ed: Editor, e, d: Dim) -> bool:
    """Whether read ``e`` sees ``d`` only at the reader's own point (or the producer's whole
    range along it as the read's last range), under a condition free of ``d``."""
    if _mentions(e.cond, d):
        return False
    for pos, (pd, x) in enumerate(zip(ed.ops[e.src].domain, e.index)):
        if pd == d:
            if not _only_whole(e, pos, d) and (isinstance(x, Slice) or x != d):
                return False
        elif _mentions(x, d):
            return False
    return True


def _only_whole(e, pos: int, d: Dim) -> bool:
    """Read ``e``'s entry ``pos`` is ``d``'s whole range and the read's last range. A batched
    producer's axis follows the axes of the read's other ranges (``ir/vmap.py``), so the value
    keeps its layout: ``x[0:t, 0:K]`` over ``(t, k)`` is ``(t, K, ...)`` either way, which
    lets the nodes of a step be batched while they gather from all the steps before."""
    return _whole(e.index[pos], d) and not any(isinstance(y, Slice) for y in e.index[pos + 1:])


def _recurrent(ed: Editor, d: Dim, over: set[int]) -> set[int]:
    """The ops over ``d`` on a dependence cycle that reads across ``d`` (a strongly connected
    component with such a read): the recurrence a loop over ``d`` must keep. A read of
    points other than the reader's own along another dim of the ops (``h[n - 1, t]``, a
    gradient's ``g[n + 1, t]``: groups are batched along innermost loops, so that dim's loop
    is outside ``d``'s) is made by another iteration of that loop and closes no cycle within
    one: a layer recurrence outside the loop over tokens leaves the tokens' projections
    batchable. (A read that includes the reader's own point, ``k[0:t + 1, n]`` with ``t``
    outside, may close one.)"""
    def inner(e) -> bool:
        src = ed.ops[e.src]
        return not any(_elsewhere(e.index[src.domain.index(x)], x)
                       for x in ed.ops[e.dst].domain if x != d and x in src.domain)

    comps = sccs(sorted(over), {i: [e.dst for e in ed.out_edges(i) if e.dst in over
                                    and inner(e)] for i in over})
    out: set[int] = set()
    for comp in comps:
        crossing = [e for i in comp for e in ed.in_edges(i)
                    if e.src in comp and not _own_point(ed, e, d)]
        if crossing:
            out |= set(comp)
    return out


def _elsewhere(x, d: Dim) -> bool:
    """Whether index entry ``x`` reads only points other than ``d``'s own, all before it or
    all after it (``d - 1``, ``0:d``, ``d + 1``, ``d + 1:D``): made in another iteration of
    a loop over ``d``."""
    if isinstance(x, Slice):
        end, start = x.stop - d, x.start - d
        return isinstance(end, Const) and end.value <= 0 \
            or isinstance(start, Const) and start.value >= 1
    off = x - d
    return isinstance(off, Const) and off.value != 0


def group(ed: Editor, d: Dim, size: int, budget: int | None) -> set[int] | None:
    """The ops over ``d`` that can run batched over all of ``d`` while a recurrence along
    ``d`` loops: on no cycle across ``d``, reading ``d`` only at their own point, no effects,
    no shape or value that depends on ``d`` otherwise, and within the budget. None: no
    recurrence along ``d``."""
    over = {i for i, op in ed.ops.items() if d in op.domain}
    loop = _recurrent(ed, d, over)
    out: set[int] = set()
    if not loop and ed.role(d) != "prefix":  # no recurrence along d: it was kept a loop
        return None  # for a constant point's read (a prompt's steps: for causal range reads)
    left = _left_in_loop(ed, over)
    for i in sorted(over - loop - left - _looped_inputs(ed, d, over, loop)):
        ins = ed.in_edges(i)
        if _batchable(ed.ops[i], d, size, budget) and all(_own_point(ed, e, d) for e in ins) \
                and not any(_shaped_by(ed.ops[k], d) for k in (i, *(e.src for e in ins))):
            out.add(i)
    if not out:
        return out
    out = _demanded_everywhere(ed, out, d, size)
    for i in sorted(stay := _made_per_step(ed, d, out, left)):
        ed.note(i, f"stays in the loop over {d}: made from {d}'s index alone and read within "
                f"a few steps, batched it would be held for every step, the only store "
                f"growing with {d.bound}")
    out -= stay
    return out | _read_by_batch_only(ed, d, size, budget, left, out)


def _made_per_step(ed: Editor, d: Dim, batch: set[int], left: set[int]) -> set[int]:
    """Those of ``batch`` made from ``d``'s index alone (random numbers keyed by the step,
    values of the indices left in the loop, constants, values without ``d``; not an input,
    which holds every step already) that no other op of the batch reads and that the loop
    reads within a constant distance of its own step. In the loop, a ring of a few steps
    holds such a value; batched, it is held for every step. Where nothing else is
    (``_holds_every_step``), the batch alone would make memory grow with ``d``'s bound (a
    window's noise, 8 B a step: 800 KB at 10^5 steps against 40 B): it stays in the loop,
    made step by step, a batch's speed given up for a flat peak. Where memory grows with the
    bound anyway (PPO's rollout, kept for training), the batch adds to it in proportion."""
    if _holds_every_step(ed, d):
        return set()
    made: set[int] = set()
    while True:  # the ops the batch makes from nothing held over all of d
        more = {i for i in batch - made if ed.in_edges(i) and all(
            ed.ops[e.src].kind == "const" or d not in ed.ops[e.src].domain
            or e.src in left or e.src in made for e in ed.in_edges(i))}
        if not more:
            break
        made |= more
    out: set[int] = set()
    kept = ed.roots()
    while True:  # readers first: a value only a value that leaves reads leaves with it
        more = {i for i in made - out if i not in kept and all(
            (e.dst not in batch or e.dst in out) and _near(ed, e, d) for e in ed.out_edges(i))}
        if not more:
            return out
        out |= more


def _holds_every_step(ed: Editor, d: Dim) -> bool:
    """Whether some value over ``d`` is held for every step whatever is batched: an input
    over ``d``, a result returned over it, or a value read further than a constant distance
    from the reader's step (``x[0:t + 1]``, ``x[T - 1 - t]``)."""
    roots = ed.roots()
    return any(d in op.domain and (op.kind == "from_array" or i in roots)
               for i, op in ed.ops.items()) or any(
        d in ed.ops[e.src].domain and not _near(ed, e, d) for e in ed.edges)


def _near(ed: Editor, e, d: Dim) -> bool:
    """Whether read ``e`` wants its producer's values along ``d`` within a constant distance
    of the reader's own step (``z[t]``, ``z[t - 1]``, ``z[max(0, t - 3):t + 1]``), or at
    points, by a reader outside the loop over ``d`` (``z[T - 1]``): what a ring holds."""
    x = e.index[ed.ops[e.src].domain.index(d)]
    if d not in ed.ops[e.dst].domain:
        return not isinstance(x, Slice)
    if isinstance(x, Slice):
        return _distance(x.start, d) is not None and (
            _distance(x.stop, d) is not None or const_cap(x.length) is not None)
    return _distance(x, d) is not None


def _distance(x: Expr, d: Dim) -> int | None:
    """How far ``x`` is from ``d`` (``t - 2``: -2; a clamp ``max(0, t - 2)`` by its argument
    that mentions ``d``), None when not a constant."""
    if isinstance(x, MinMax):
        found = [k for k in (_distance(a, d) for a in x.args) if k is not None]
        return found[0] if found else None
    diff = x - d
    return diff.value if isinstance(diff, Const) else None


def _read_by_batch_only(ed: Editor, d: Dim, size: int, budget: int | None, fns: set[int],
                        batch: set[int]) -> set[int]:
    """Those of ``fns``, values of the indices left in the loop (``_left_in_loop``), that
    only ``batch`` reads, at its own point: they join it. Left in the loop, each was stored at
    every step for the batch to read whole, a loop of copies of its own (PPO's rollout noise
    read ``i``, ``b`` and ``t`` so: three loops before the training loop); batched, they take
    what that store took."""
    out: set[int] = set()
    while True:
        more = {i for i in fns - out if _batchable(ed.ops[i], d, size, budget)
                and ed.out_edges(i) and all((e.dst in batch or e.dst in out)
                                            and _own_point(ed, e, d) for e in ed.out_edges(i))}
        if not more:
            return out
        out |= more


def _looped_inputs(ed: Editor, d: Dim, over: set[int], loop: set[int]) -> set[int]:
    """Inputs (``tl.from_array``) that the recurrence reads, or that some op reads over part of
    ``d``'s range (``x[b, 0:t + 1]``): their store holds every point from the start, where a
    batch would be read by the loop through a per-point view, copied point by point at every
    step (a ragged group's input was). An input only batched ops and reads at one point read
    joins the batch, whose ops then read it whole in their layout (left out, a BiRNN's input
    cost it 5-7 %)."""
    out = set()
    for i in over:
        if ed.ops[i].kind == "from_array":
            k = ed.ops[i].domain.index(d)
            if any(e.dst in loop or isinstance(e.index[k], Slice) and not _only_whole(e, k, d)
                   for e in ed.out_edges(i)):
                out.add(i)
    return out


def _left_in_loop(ed: Editor, over: set[int]) -> set[int]:
    """Ops off the recurrence that no batch is made of: values of ``d``'s index alone (a RoPE
    table, a step's key), cheap to make in the loop; batched, they would be held for every
    point of ``d``, as remat.py recomputes them not to be (a windowed decode's memory grew
    with its steps again: 12 MB at 10^6 steps against 33 KB)."""
    return index_functions(ed) & over


def _demanded_everywhere(ed: Editor, ops: set[int], d: Dim, size: int) -> set[int]:
    """Those of ``ops`` that may be computed at every point of their domain (for every bound
    value). Batched, an op is computed at every point of ``d`` and reads its producers there,
    so a point nobody read before (a step a branch guards, where a ``max`` over a range would
    be empty) must not become one: an op qualifies when some reader needs it everywhere, or
    when it is no ``max``/``min``, its producers all exist everywhere and it is needed at
    most points of ``d`` (an RNN's input projection, which only the steps after the first
    read; not ``exp(x)`` read at ``T - 1`` alone, which batched would be computed and held at
    every step for one)."""
    import islpy as isl

    sdg = ed.result()
    pctx = param_context(sdg)
    boxes: dict[int, isl.Set] = {i: sdg.isl_domain(i).intersect_params(pctx) for i in sdg.ops}
    got = demand(sdg, boxes, {e: sdg.isl_map(e) for e in sdg.edges})
    full = {i for i in sdg.ops if boxes[i].is_subset(got[i])}
    out = ops & full
    safe = {i for i in ops - out if not flag(ed.ops[i].kind, "nonempty")
            and 2 * _points_along(got[i], ed.ops[i].domain.index(d), ed.bounds) >= size}
    # the steps of a prompt split off (passes/prefix.py): the prompt's length decides whether
    # any step reads an op, so demand says no op exists everywhere (for every bound); and the
    # last layer needs its rows at the last step only. An op defined at every point gives rows
    # nobody reads, never an error: it may be read from the batch.
    held = _total(ed) if ed.role(d) == "prefix" else set()
    while True:  # an op safe at every point whose inputs all exist there may join too
        more = {i for i in safe - out
                if all(e.src in full or e.src in out or e.src in held for e in ed.in_edges(i))}
        if not more:
            return out
        out |= more


def _total(ed: Editor) -> set[int]:
    """The ops defined at every point of their domain: none of them, nor anything they read,
    a ``max``/``min`` over a range that can be empty. Computed at a point no reader demands,
    such an op gives a value nobody reads, never an error."""
    partial = [i for i, op in ed.ops.items() if flag(op.kind, "nonempty")]
    seen = set(partial)
    while partial:  # what reads them, at any distance
        for e in ed.out_edges(partial.pop()):
            if e.dst not in seen:
                seen.add(e.dst)
                partial.append(e.dst)
    return set(ed.ops) - seen


def _points_along(s, pos: int, bounds: dict[str, int]) -> float:
    """How many values of dim ``pos`` the set ``s`` has at these bound values (infinite where
    a bound has none: a data-dependent one)."""
    import islpy as isl

    if any(n not in bounds for n in s.get_space().get_var_names(isl.dim_type.param)):
        return math.inf
    nd = s.dim(isl.dim_type.set)
    one = I.fix(s, bounds).project_out(isl.dim_type.set, pos + 1, nd - pos - 1)
    return one.project_out(isl.dim_type.set, 0, pos).count_val().to_python()


def _shaped_by(op: Op, d: Dim) -> bool:
    """Whether ``op``'s shape depends on ``d`` or its bound: batched, it would be ragged, or
    a length the loop's ops keep symbolic would be pinned to the bound's value."""
    return any(not isinstance(x, int) and (_mentions(x, d) or d.bound in x.symbols())
               for x in op.type.shape)


def vectorise_group(ed: Editor, d: Dim, size: int, ops: set[int]):
    """Vectorise ``ops`` over ``d`` (see ``group``) and leave the rest in their loop: an op of
    the group reads a looped producer's whole range as its batch axis (``stacked``); a looped
    reader (or a partial read) of an op of the group reads a per-point view of it instead,
    ``take`` at ``d``'s value, which has the op's old domain and type."""
    at = None  # d's value, made once for every view
    for i in sorted(ops):
        _point_reads(ed, i, d, ops)
        out = [e for e in ed.out_edges(i) if e.dst not in ops and not _direct(ed, e, d)]
        if not out:
            continue
        if at is None:
            at = ed.add(Op(-1, "dimval", (d,), infer("dimval", [], {"expr": d}), {"expr": d},
                           ed.ops[i].loc), [], i, f"value of {d}")
        op = ed.ops[i]
        attrs = {"axis": 0, **({"vdims": op.attrs["vdims"]} if "vdims" in op.attrs else {})}
        x = ed.add(Op(-1, "take", op.domain, op.type, attrs, op.loc, op.name),
                   [Edge(-1, i, 0, tuple(op.domain), TRUE, op.loc),
                    Edge(-1, at, 1, (d,), TRUE, op.loc)], i,
                   f"%{i} at {d} (a looped reader's view of the batched op)")
        for e in out:
            c = ed.ops[e.dst]
            ed.rewrite(c.id, c, [Edge(c.id, x, e2.slot, e2.index, e2.cond, e2.loc)
                                 if e2 == e else e2 for e2 in ed.in_edges(c.id)],
                       f"reads %{i} through its per-point view %{x}")
    for i in sorted(ops):
        c = ed.ops[i]
        stacked = []
        for e in ed.in_edges(i):
            p = ed.ops[e.src]
            if d in p.domain and e.src not in ops and not _direct(ed, e, d):
                k = p.domain.index(d)
                ed.reindex(e, e.index[:k] + (Slice(Const(0), d.bound),) + e.index[k + 1:],
                           f"all of {d} as the batch axis")
                stacked.append((d.name, e.slot))
        if stacked:
            attrs = {**c.attrs, "stacked": tuple(sorted({*c.attrs.get("stacked", ()),
                                                         *stacked}))}
            ed.update(i, Op(i, c.kind, c.domain, c.type, attrs, c.loc, c.name),
                      f"reads its looped producers over all of {d}")
    # the new ops' readers come first: number them in order again
    vectorise_dim(ed, d, size, only=ops)
    ed.renumber()


def _point_reads(ed: Editor, i: int, d: Dim, ops: set[int]):
    """Reads of op ``i`` of the group at one point of ``d`` that no dim moves (``x[b, 0]``,
    ``x[b, T - 1]``) by ops outside it: each takes that point out of the batched value read
    whole, where it is read. Through the per-point view, the point was a statement of the
    loop over ``d``, and the view's index a value stored at every step of a loop of its own
    (a BiRNN's first input step; a ragged group's input, batched, copied point by point)."""
    op = ed.ops[i]
    k = op.domain.index(d)
    rest = op.domain[:k] + op.domain[k + 1:]
    made: dict = {}
    for e in list(ed.out_edges(i)):
        x = e.index[k]
        if e.dst in ops or isinstance(x, Slice) or x.dims() \
                or any(isinstance(y, Slice) for y in e.index[k + 1:]):
            continue
        if x not in made:
            at = ed.add(Op(-1, "dimval", (), infer("dimval", [], {"expr": x}), {"expr": x},
                           op.loc), [], i, f"{d} = {x}")
            whole = op.domain[:k] + (Slice(Const(0), d.bound),) + op.domain[k + 1:]
            attrs = {"axis": 0, **({"vdims": op.attrs["vdims"]} if "vdims" in op.attrs else {})}
            made[x] = ed.add(Op(-1, "take", rest, op.type, attrs, op.loc, op.name),
                             [Edge(-1, i, 0, whole, TRUE, op.loc),
                              Edge(-1, at, 1, (), TRUE, op.loc)], i,
                             f"%{i} at {d} = {x}, taken from the batch")
        c = ed.ops[e.dst]
        index = e.index[:k] + e.index[k + 1:]
        ed.rewrite(c.id, c, [Edge(c.id, made[x], e2.slot, index, e2.cond, e2.loc)
                             if e2 == e else e2 for e2 in ed.in_edges(c.id)],
                   f"reads %{i} at {d} = {x} taken from the batch %{made[x]}")


def _direct(ed: Editor, e, d: Dim) -> bool:
    """A read of the whole range of ``d`` as its last range (a reduction): it reads the
    batched value as it is."""
    return _only_whole(e, ed.ops[e.src].domain.index(d), d)


def _worth(ed: Editor, ops: set[int]) -> bool:
    """A group is worth a batch when it computes something (not only values and layout)."""
    return any(ed.ops[i].kind == "random" or (
        ed.ops[i].kind in CATALOG and CATALOG[ed.ops[i].kind].category in (
            "elementwise", "reduce", "linalg", "lift")) for i in ops)


def _outer(ed: Editor, d: Dim) -> bool:
    """Whether a loop runs inside ``d`` (an op over ``d`` keeps a dim after it). Groups are
    batched along innermost recurrences only: batching one over an outer loop (training
    iterations) would hold every outer point's inputs at once, for values cheap to make per
    point (random numbers, permutations); measured slower on PPO. Sibling recurrences (the
    groups of a ragged bound) are each innermost."""
    later = set(ed.dims[ed.dims.index(d) + 1:])
    return any(d in op.domain and later & set(op.domain) for op in ed.ops.values())


@register("vectorise", "vectorise")
def vectorise(ed: Editor):
    """Vectorisation: dims with no read across them become leading spatial axes; of a dim
    that some reads cross, the ops outside the recurrence become a batched group."""
    budget = ed.config.value_budget
    later = []
    for d in reversed(ed.dims):  # innermost first, so leading axes end up in universe order
        size = ed.bounds.get(d.bound.name)
        if size is None or d.bound.name in ed.dynamic:
            continue
        if not any(d in op.domain for op in ed.ops.values()):
            continue
        why = obstacle(ed, d, size, budget)
        if why is None:
            vectorise_dim(ed, d, size)
            continue
        ed.note(why[0], f"{d} stays a loop: {why[1]}")
        if ed.config.device_memory_budget is not None:
            later.append((d, size))  # after the outer dims: see below
            continue
        ops = _batched_group(ed, d, size, budget)
        if ops and _reads_a_range_of_another_dim(ed, d, ops):
            later.append((d, size))
        elif ops:
            vectorise_group(ed, d, size, ops)
    # After the outer dims, a group that reduces over a range of one (h[0:B, t].mean()): batched
    # over d first, it would read that range as one that is not its last, and the outer dim
    # (the batch) would stay a loop for every op. Under a memory budget, too: batched over d
    # first, a group of values a batch dim multiplies could leave the batch dim no room to be
    # vectorised whole, only in blocks (and then it could not be sharded); batched after it,
    # the group is sized with the batch axis in it and declined where it does not fit.
    for d, size in later:
        ops = _batched_group(ed, d, size, budget)
        if ops:
            vectorise_group(ed, d, size, ops)
    _identity_takes(ed)
    _takes_per_reader(ed)


def _identity_takes(ed: Editor):
    """A ``take`` batched over ``d`` of every row of a value that is not, in order (the index
    ``d``'s values ``0..D-1``, the value's first axis ``D`` long): the value itself. Each
    layer's weights taken by their layer's index (``tl.take(w, n)``), batched over the
    layers, were a copy of all of them. Only where no reader is batched over ``d`` (which
    would read the value row by row, not whole), and not for an output: its axes are the
    take's, ``d`` first (the value holds ``d`` as a spatial axis, returned after the dims:
    a gradient over ``(b, t)`` came back ``(T, B)``)."""
    outputs = set(ed.outputs.values())
    for i in sorted(ed.ops):
        op = ed.ops.get(i)
        if op is None or op.kind != "take" or op.attrs.get("axis") != 0 \
                or len(op.attrs.get("vdims", ())) != 1 or set(op.attrs) != {"axis", "vdims"} \
                or i in outputs:
            continue
        ins = ed.in_edges(i)
        if len(ins) != 2 or any(e.cond != TRUE for e in ins):
            continue
        data, index = ins
        src = ed.ops[data.src]
        if src.attrs.get("vdims") or src.domain != op.domain or src.type != op.type \
                or tuple(data.index) != tuple(src.domain):
            continue
        k = index.src
        while ed.ops[k].kind == "identity" and tuple(ed.in_edges(k)[0].index) == tuple(
                ed.ops[ed.in_edges(k)[0].src].domain):
            k = ed.in_edges(k)[0].src
        at = ed.ops[k]
        d = op.attrs["vdims"][0]  # a batched reader would read the value per row, not whole
        if any(d in ed.ops[e.dst].attrs.get("vdims", ()) for e in ed.out_edges(i)):
            continue
        if at.kind == "from_array" and at.attrs.get("vdims") == op.attrs["vdims"] \
                and np.array_equal(at.attrs["array"], np.arange(op.type.shape[0])):
            ed.replace(i, data.src, "takes every row in order: the value itself")


def _takes_per_reader(ed: Editor):
    """A ``take`` at a dim's index (``tl.take(w, n)``) of a value held over fewer dims (a
    layer's weights of one iteration, over ``(i,)``; the take over ``(i, n)``) that several ops
    read at its own point: one take per reader, which the scheduler places beside it. Read by
    a layer's forward and backward pass, one take was a store of every layer's weights held
    from the one to the other (a second copy of them: 0.45 GiB at Llama-3.2-1B widths with 2
    layers, 3.6 GiB with 16); a take per reader is a value of its reader's step."""
    changed = False
    cheap = index_functions(ed)
    for i in sorted(ed.ops):
        op = ed.ops.get(i)
        if op is None or not taken_view(ed, i, cheap):
            continue
        ins = ed.in_edges(i)
        outs = ed.out_edges(i)
        readers = sorted({e.dst for e in outs})
        if len(readers) < 2 or any(tuple(e.index) != tuple(op.domain) or e.cond != TRUE
                                   for e in outs):
            continue
        for r in readers[1:]:
            take = ed.add(Op(-1, op.kind, op.domain, op.type, dict(op.attrs), op.loc, op.name),
                          [Edge(-1, e.src, e.slot, e.index, e.cond, e.loc) for e in ins], i,
                          f"%{i} taken again for %{r}")
            edges = [Edge(r, take, e.slot, e.index, e.cond, e.loc) if e.src == i else e
                     for e in ed.in_edges(r)]
            ed.rewrite(r, ed.ops[r], edges, f"reads its own take of %{i}")
            changed = True
    if changed:
        ed.renumber()  # producers before their readers, as fusion orders a kernel's body


def _batched_group(ed: Editor, d: Dim, size: int, budget: int) -> set[int] | None:
    """The ops off the recurrence along ``d`` to batch over it, if group vectorisation
    applies to ``d`` and they are worth a batch."""
    if not ed.config.vectorise_groups or ed.role(d) not in (None, "prefix") or _outer(ed, d) \
            or eligible(ed, d, size, None):
        return None
    running = [i for i, op in ed.ops.items() if op.attrs.get("running") == d.name]
    if running:
        ed.note(running[0], f"the ops outside the recurrence along {d} stay in its "
                f"loop: the stream pass made running sums along {d} so that each "
                f"step is consumed in the loop; batched over all of {d}, what they "
                f"read would be stored for every step (memory growing with {d.bound})")
        return None
    ops = group(ed, d, size, budget)
    return ops if ops and _worth(ed, ops) else None


def _reads_a_range_of_another_dim(ed: Editor, d: Dim, ops: set[int]) -> bool:
    return any(isinstance(x, Slice) and pd != d
               for i in ops for e in ed.in_edges(i)
               for pd, x in zip(ed.ops[e.src].domain, e.index))


@register("incrementalise", "incrementalise")
def incrementalise(ed: Editor):
    """Incrementalisation: a dim too large to vectorise whole runs in blocks of its points.

    A dim that vectorisation declined only for the memory budget becomes a new dim ``d_blk``
    over blocks (a loop, so only a block's values need be live at once) whose points inside a
    block form a leading spatial axis, as vectorisation would make it for the whole dim. The
    block is the largest divisor of the bound whose values fit the budget, so no block is
    padded. Not for a dim some op reduces over whole (``x[0:B]``) or with a block under 2.
    """
    budget = ed.config.value_budget
    for d in reversed(ed.dims):
        size = ed.bounds.get(d.bound.name)
        ops = [op for op in ed.ops.values() if d in op.domain]
        if size is None or d.bound.name in ed.dynamic or not ops or ed.role(d) \
                or _reduced_whole(ed, d) or not eligible(ed, d, size, None):
            continue
        big = max(largest_point(op) for op in ops)
        if big * size <= budget:  # fits whole: not vectorised for another reason (or off)
            continue
        block = max((b for b in _divisors(size) if b < size and b * big <= budget), default=1)
        if block >= 2:
            vectorise_dim(ed, d, size, block)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` (in O(sqrt n): a bound may be 10**9)."""
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return small + [n // k for k in small]


def _reduced_whole(ed: Editor, d: Dim) -> bool:
    return any(isinstance(x, Slice) for e in ed.edges for pd, x in
               zip(ed.ops[e.src].domain, e.index) if pd == d)
