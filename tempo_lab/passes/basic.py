"""Clean-up passes: dead code, duplicates, constant folding and algebraic simplification."""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable

import numpy as np

from ..errors import ExprError
from ..ir.ops import CATALOG, flag
from ..ir.sdg import Edge, Op
from ..symbolic import TRUE, Const, and_
from ..symbolic import isl as I
from .manager import Editor, register


@register("dce", "dce")
def dead_code(ed: Editor):
    """Dead-code elimination: erase ops that no output or sink depends on."""
    live, stack = set(), list(ed.roots())
    while stack:
        i = stack.pop()
        if i in live:
            continue
        live.add(i)
        stack.extend(e.src for e in ed.in_edges(i))
    for i in sorted(set(ed.ops) - live):
        ed.erase(i, "unused")


def _value_key(v):
    if isinstance(v, np.ndarray):
        return ("array", v.dtype.str, v.shape, v.tobytes()) if v.size <= 4096 else ("id", id(v))
    if callable(v):  # by equality: two reads of ``net.policy`` are equal bound methods
        return ("fn", v) if isinstance(v, Hashable) else ("id", id(v))
    return repr(v)


def _key(ed: Editor, op: Op):
    attrs = tuple((k, _value_key(v)) for k, v in sorted(op.attrs.items()))
    ins = tuple((e.src, e.index, e.cond) for e in ed.in_edges(op.id))
    return (op.kind, attrs, op.domain, op.type, ins)


def _keep_name(ed: Editor, gone: Op, kept: int):
    """The user's name of an op replaced by another stays, if the other has none."""
    if gone.name and not ed.ops[kept].name:
        ed.update(kept, dataclasses.replace(ed.ops[kept], name=gone.name), f"named {gone.name}")


@register("cse", "cse")
def duplicates(ed: Editor):
    """Duplicate elimination: of two ops with the same kind, attributes, domain, type and
    inputs (read at the same index under the same condition), keep the first."""
    seen: dict = {}
    for i in sorted(ed.ops):
        op = ed.ops.get(i)
        if op is None or op.kind == "merge" or flag(op.kind, "effect"):
            continue
        k = _key(ed, op)
        if k in seen:
            ed.replace(i, seen[k], f"same as %{seen[k]}")
            _keep_name(ed, op, seen[k])
        else:
            seen[k] = i
    _explain_lifts(ed)


def _explain_lifts(ed: Editor):
    """A lifted function (a network's forward pass) applied twice to one tensor at other
    points could not be merged, so it is computed twice: note why, naming the inputs that
    differ, e.g. the loss's forward pass at ``theta[i, e, m]`` on a minibatch and the acting
    one at ``theta[i, 0, 0]``."""
    first: dict = {}
    for i in sorted(ed.ops):
        op = ed.ops[i]
        if op.kind != "lift":
            continue
        k = (_value_key(op.attrs["jax_fn"]), op.attrs.get("out"))
        if k not in first:
            first[k] = i
            continue
        j = first[k]
        pairs = [(a, b) for a, b in zip(ed.in_edges(i), ed.in_edges(j))
                 if (a.src, a.index, a.cond) != (b.src, b.index, b.cond)]
        if not any(_one_tensor(ed, a.src, b.src) for a, b in pairs):  # another layer, say
            continue
        why = [_differ(ed, a, b) for a, b in pairs]
        ed.note(i, f"the same function as %{j} on other inputs, so its forward pass is "
                   f"computed again: " + "; ".join(why), j)


def _one_tensor(ed: Editor, a: int, b: int) -> bool:
    """Whether ops ``a`` and ``b`` hold points of one tensor: they are one op, or one holds
    the other's points at some constant dims (``_pinned_reads``)."""
    pa, pb = ed.ops[a], ed.ops[b]
    return a == b or (pa.name is not None and pa.name == pb.name
                      and ("at" in pa.attrs or "at" in pb.attrs))


def _differ(ed: Editor, a, b) -> str:
    def read(e):
        p = ed.ops[e.src]
        index = e.index
        if "at" in p.attrs:  # the point of the tensor it holds a part of
            point = dict(zip((d.name for d in p.domain), e.index)) | dict(p.attrs["at"])
            index = [point[d.name] for d in ed.dims if d.name in point]
        return f"{p.label}[{', '.join(map(str, index))}]"
    same = " (other points of one tensor: a parameter differs after an update)" \
        if _one_tensor(ed, a.src, b.src) else ""
    return f"input {a.slot} reads {read(a)} here, {read(b)} there{same}"


FOLD_BYTES = 1 << 20  # a folded value of more bytes stays an op (see fold_constants)


@register("fold", "fold_constants")
def fold_constants(ed: Editor):
    """Constant folding: an op over the empty domain whose inputs are all constants becomes a
    constant, computed with the reference interpreter's NumPy semantics. A value whose shape
    depends on a bound (``T``) stays an op: constants have static shapes. So does a value of
    more than ``FOLD_BYTES``, computed once when the program runs: folded, it was a second copy
    of a weight held by the SDG (a transposed embedding table, 1 GB at Llama's widths)."""
    for i in sorted(ed.ops):
        op = ed.ops.get(i)
        if (op is None or op.domain or not op.type.is_static
                or op.kind == "merge" or flag(op.kind, "value") or flag(op.kind, "effect")
                or math.prod(op.type.shape) * op.type.dtype.itemsize > FOLD_BYTES):
            continue
        ins = ed.in_edges(i)
        if not all(ed.ops[e.src].kind == "const" and e.cond == TRUE for e in ins):
            continue
        vals = [ed.ops[e.src].attrs["value"] for e in ins]
        types = [ed.ops[e.src].type for e in ins]
        with np.errstate(all="ignore"):
            value = np.asarray(CATALOG[op.kind].numpy(op, vals, types, {}))
        value = value.astype(op.type.dtype)
        ed.rewrite(i, Op(i, "const", (), op.type, {"value": value, "weak": op.type.weak},
                         op.loc, op.name), [], "folded")


def _is_const(ed: Editor, e, value) -> bool:
    p = ed.ops[e.src]
    return p.kind == "const" and e.cond == TRUE and bool(np.all(p.attrs["value"] == value))


def _passthrough(ed: Editor, op: Op, slot: int) -> int | None:
    """The producer of input ``slot`` if ``op`` may be replaced by it: read at the same point,
    unconditionally, with exactly the op's domain and type."""
    e = ed.in_edges(op.id)[slot]
    p = ed.ops[e.src]
    if e.cond != TRUE or tuple(e.index) != tuple(p.domain) or p.domain != op.domain:
        return None
    return p.id if p.type == op.type else None


def _reaches(ed: Editor, start: int, target: int, same_point: bool) -> bool:
    """Whether op ``start`` reads ``target``: through ops other than placeholders, or with
    ``same_point`` through any op but only at the point itself (no shift)."""
    srcs: dict[int, list[int]] = {}
    for e in ed.edges:
        if not same_point or tuple(e.index) == tuple(ed.ops[e.src].domain):
            srcs.setdefault(e.dst, []).append(e.src)
    seen, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i == target:
            return True
        if i not in seen and (same_point or i == start or ed.ops[i].kind != "merge"):
            seen.add(i)
            stack.extend(srcs.get(i, ()))
    return False


def _pinned_reads(ed: Editor) -> bool:
    """Each read of a placeholder at a constant point along some of its dims (``theta[i, 0,
    0]``) reads a placeholder over its other dims that has only the branches that can hold
    there; True if any read changed. Why: PPO's rollout reads the parameters at the first
    update of an iteration, a placeholder whose other branches read the rollout's results;
    read whole, the two form one cycle of ops at each iteration that no loop over one dim
    runs, and the scheduler's fused nest was declined (isl then took 8 s)."""
    made: dict[tuple, int | None] = {}
    for e in ed.edges:
        m = ed.ops[e.src]
        if m.kind != "merge" or e.src == e.dst:
            continue
        pins = {d: x for d, x in zip(m.domain, e.index) if isinstance(x, Const)}
        key = (m.id, tuple((d.name, x.value) for d, x in pins.items()))
        if pins and key not in made:
            made[key] = _branches_at(ed, m, pins)
        if pins and made[key] is not None:
            ed.reindex(e, [x for d, x in zip(m.domain, e.index) if d not in pins],
                       f"reads {m.label} where only some of its branches hold", made[key])
    return any(v is not None for v in made.values())


def _branches_at(ed: Editor, m: Op, pins: dict) -> int | None:
    """A placeholder over ``m``'s dims but ``pins`` with the branches of ``m`` that can hold
    where those dims have the pinned values (None if that is all of them)."""
    rest = tuple(d for d in m.domain if d not in pins)
    params = [d.bound.name for d in ed.dims]
    within = and_(*[(d.bound >= 1) for d in ed.dims], *[d.bound > x for d, x in pins.items()])
    kept = []
    for b in ed.in_edges(m.id):
        cond = b.cond.substitute(pins)
        try:
            holds = I.cond_set(cond & within, I.space(rest, params)) & I.box(rest, params)
        except (ExprError, TypeError):  # a condition over something other than dims, bounds
            return None
        if not holds.is_empty():
            kept.append(Edge(-1, b.src, len(kept), tuple(x.substitute(pins) for x in b.index),
                             cond, b.loc))
    if len(kept) == len(ed.in_edges(m.id)) or not kept:
        return None
    at = tuple((d.name, x.value) for d, x in pins.items())
    point = ", ".join(f"{d} = {x}" for d, x in at)
    return ed.add(Op(-1, "merge", rest, m.type, {**m.attrs, "at": at}, m.loc, m.name, m.scope),
                  kept, m.id, f"{m.label} at {point}: the branches that hold there")


def _transposed_array(ed: Editor, e):
    """The read of a value (an array, or a weight being trained) that ``e`` reads through a
    transpose of its last two axes, at the transpose's own point; else None."""
    t = ed.ops[e.src]
    if t.kind != "transpose" or e.cond != TRUE or t.type.ndim < 2:
        return None
    perm = tuple(t.attrs["perm"])
    n = len(perm)
    if perm != tuple(range(n - 2)) + (n - 1, n - 2):
        return None
    return _at_own_point(ed, t)


def _at_own_point(ed: Editor, op: Op):
    """``op``'s one input edge if it reads its producer unconditionally at ``op``'s own point
    (the same domain); else None."""
    (inner,) = ed.in_edges(op.id)
    src = ed.ops[inner.src]
    if inner.cond != TRUE or src.domain != op.domain or tuple(inner.index) != tuple(src.domain):
        return None
    return inner


def _untransposed(ed: Editor, op: Op) -> int | None:
    """The value a transpose of a transpose gives back (their permutations undo each other,
    both read at their own point): a gradient's transpose of a transposed weight."""
    e = _at_own_point(ed, op)
    inner = ed.ops[e.src] if e else None
    if inner is None or inner.kind != "transpose":
        return None
    both = tuple(inner.attrs["perm"][j] for j in op.attrs["perm"])
    first = _at_own_point(ed, inner)
    if both != tuple(range(op.type.ndim)) or first is None \
            or ed.ops[first.src].type != op.type:
        return None
    return first.src


@register("simplify", "simplify")
def simplify(ed: Editor):
    """Algebraic simplification. Rules (each only when the result has the operand's exact
    domain, shape, dtype and weak type, so no broadcast or promotion is lost):
    x + 0, 0 + x, x - 0 -> x;  x * 1, 1 * x, x / 1 -> x;  -(-x) -> x;  ~~x -> x;
    identity(x) -> x;  reshape/broadcast_to to x's own shape, transpose by the identity
    permutation, cast to x's own dtype -> x;  a @ swapaxes(w, -1, -2) of an array ``w`` ->
    a matmul that reads ``w`` as stored (``tb``: no transposed copy of a weight);  a placeholder with one unconditional branch
    -> that branch (so ops on it and on the branch become duplicates: ``tl.rl``'s loss reuses
    the acting forward pass), unless the branch reads the placeholder back other than through
    another placeholder, or at the same point (a cycle the scheduler reports as written);
    a read of a placeholder at constant points of some of its dims -> a placeholder of the
    branches that hold there (``_pinned_reads``)."""
    forwarded = _pinned_reads(ed)
    for i in sorted(ed.ops):
        op = ed.ops.get(i)
        if op is None:
            continue
        ins = ed.in_edges(i)
        k = op.kind
        keep = None
        if k in ("add", "sub", "mul", "div"):
            unit = 0 if k in ("add", "sub") else 1
            if _is_const(ed, ins[1], unit):
                keep = _passthrough(ed, op, 0)
            elif k in ("add", "mul") and _is_const(ed, ins[0], unit):
                keep = _passthrough(ed, op, 1)
        elif k in ("neg", "not"):
            inner = ed.ops[ins[0].src]
            if inner.kind == k and _passthrough(ed, op, 0) is not None:
                keep = _passthrough(ed, inner, 0)
        elif k in ("identity", "reshape", "broadcast_to", "cast") or (
                k == "transpose" and tuple(op.attrs["perm"]) == tuple(range(op.type.ndim))):
            keep = _passthrough(ed, op, 0)
        elif k == "transpose" and _untransposed(ed, op) is not None:
            keep = _untransposed(ed, op)
            ed.replace(i, keep, "undoes the transpose it reads")
            continue
        elif k == "matmul" and _transposed_array(ed, ins[1]) is not None:
            src = _transposed_array(ed, ins[1])
            ed.rewrite(i, Op(i, k, op.domain, op.type, {**op.attrs, "tb": True}, op.loc,
                             op.name, op.scope),
                       [ins[0], Edge(i, src.src, 1, ins[1].index, TRUE, ins[1].loc)],
                       "reads the array it transposed as stored (tb)")
        elif k == "merge" and len(ins) == 1 and not any(
                _reaches(ed, ins[0].src, i, same) for same in (False, True)):
            keep = _passthrough(ed, op, 0)
            forwarded = forwarded or keep is not None
        if keep is not None:
            ed.replace(i, keep, "a placeholder with one branch" if k == "merge"
                       else f"{k} is a no-op")
            if k == "merge":
                _keep_name(ed, op, keep)
    if forwarded:  # readers of a placeholder may come before its branch: ids in order again
        ed.renumber()
