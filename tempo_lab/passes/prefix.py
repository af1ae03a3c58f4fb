"""Prefix splitting: the steps of a recurrence whose input is known (a prompt) as a batch.

A decode feeds step ``t`` the prompt's token while ``t < P`` and the token sampled from step
``t - 1`` after (``ids[t < P] = prompt[t]``, a branch of a merge). The recurrence through the
sampled token makes ``t`` a loop, so every prompt step runs the whole model alone: at 1B widths
a 512-token prompt was 512 decode steps, each reading every weight. But below ``P`` nothing
reads a sampled token: those steps are a computation over the prompt alone (what LLM runtimes
call the prefill), with no recurrence but causal range reads (attention's ``k[0:t + 1]``).

This pass splits the domain of that recurrence at ``P`` (index-set splitting). For each op of
the cycle through the merge (its strongly connected component over ``t``) it makes a copy over
a new dim ``t_pre`` of ``P`` points, reading the prefix branch in place of the merge and the
other copies in place of the originals (valid because every read in the cycle is causal: a
point ``<= t`` is ``< P`` when ``t`` is). Readers that need the originals at points below
``P`` (the decode steps' attention reads of the keys over ``0:t + 1``, outputs, a read of
``t - 1`` at ``t = P``) read a merge of the copy (``t < P``) and the original (``t >= P``), so
the originals are demanded, and computed, only from ``P`` on. The new dim has no recurrence:
vectorisation batches every op of the copy that reads ``t_pre`` only at its own point (the
projections, the MLP, the norms: each weight read once for the whole prompt), and the causal
attention of the prompt steps stays a loop over ``t_pre`` inside (``vectorise.group``).

Any recurrent-tensor program with a known prefix gets this, not only ``tl.nn`` decoders: the
condition is a merge over ``t`` with a branch ``t < P`` (``P`` a constant of at least
``MIN_PREFIX``) that reads nothing of the cycle, an op of the cycle that reads the merge at its
own step (the work to batch: a decode's embedding of the token; ``x[t - 2]`` alone holds none),
and causal reads in the cycle. Along a ``tl.until`` dim too (the prompt's steps are computed
whole however early the loop ends), unless the cycle itself decides where it ends; ops off the
cycle that the copy reads at its step (the prompt's token, a RoPE angle) are recomputed over
``t_pre``, so the batch waits for no step of the loop. Not along a dim a pass made.

What is left of the loop over ``t`` branches on ``P`` in every statement: the joins before it,
the model from it. The lowered program cuts that loop in two at ``P`` (``schedule/cut.py``), so
the decode steps run without a branch a step (before the cut, a small decode of 64 + 128 steps
took 25 ms a run split against 21 unsplit, and this pass declined prefixes under half of the
steps).
"""
from __future__ import annotations

from ..ir.graph import sccs
from ..ir.ops import TensorType, flag
from ..ir.sdg import Edge, Op
from ..symbolic import TRUE, Const, Dim, Slice
from ..symbolic.cond import Cmp
from .manager import Editor, register

MIN_PREFIX = 2  # a prefix of one step is a decode step: nothing to batch


@register("prefix", "vectorise_groups")
def prefix(ed: Editor):
    """Prefix splitting: the steps before a merge's ``t < P`` branch ends, where the recurrence
    through the merge reads nothing it makes, become a copy of the cycle over a dim of ``P``
    points, batched by vectorisation."""
    declined: set[int] = set()
    while True:  # a split renumbers the ops: look again
        found = next(((i, f) for i, op in sorted(ed.ops.items())
                      if op.kind == "merge" and i not in declined and not op.attrs.get("join")
                      and "needed" not in op.attrs and (f := _prefix_branch(ed, i))), None)
        if found is None:
            return
        i, branch = found
        if _split(ed, i, *branch):
            declined = set()
        else:
            declined.add(i)


def _prefix_branch(ed: Editor, m: int) -> tuple[Dim, int, Edge] | None:
    """``(t, P, the branch's edge)`` where merge ``m`` takes a branch exactly while ``t < P``."""
    op = ed.ops[m]
    for e in ed.in_edges(m):
        c = e.cond
        if not isinstance(c, Cmp) or c.op != ">=" or len(c.expr.symbols()) != 1:
            continue
        (t,) = c.expr.symbols()
        if not isinstance(t, Dim) or t not in op.domain or ed.role(t) \
                or t.bound.name not in ed.bounds:
            continue
        at0 = c.expr.substitute({t: Const(0)})
        step = c.expr.substitute({t: Const(1)}) - at0
        if isinstance(at0, Const) and isinstance(step, Const) and step.value == -1:
            return t, at0.value + 1, e  # P - 1 - t >= 0
    return None


def _split(ed: Editor, m: int, t: Dim, p: int, branch: Edge) -> bool:
    """Split the cycle through merge ``m`` at ``t = p`` (whether it did)."""
    over = {i for i, op in ed.ops.items() if t in op.domain}
    comp = next((set(c) for c in sccs(sorted(over), {
        i: [e.dst for e in ed.out_edges(i) if e.dst in over] for i in over}) if m in c), set())
    if len(comp) < 2:
        return False  # no cycle through the merge: nothing loops along t because of it
    steps = ed.bounds[t.bound.name]
    if p < MIN_PREFIX or p >= steps:
        ed.note(m, f"not split at {t} < {p}: the prefix is under {MIN_PREFIX} steps or "
                   f"covers every step")
        return False
    if comp & (set(ed.untils.values()) | {r.done for r in ed.ragged.values()}):
        ed.note(m, f"not split at {t} < {p}: the recurrence itself decides where a "
                   f"data-dependent bound ends")
        return False
    if branch.src in comp:
        ed.note(m, f"not split at {t} < {p}: its branch there reads the recurrence itself")
        return False
    if not any(e.dst in comp and _own_t(ed, e, t) for e in ed.out_edges(m)):
        ed.note(m, f"not split at {t} < {p}: the recurrence reads it only at earlier steps, so "
                   f"the steps before {p} hold nothing to batch")
        return False
    for i in comp:
        for e in ed.in_edges(i):
            if e.src in comp and not _causal(ed, e, t):
                ed.note(e.dst, f"not split at {t} < {p}: its read "
                               f"{ed.ops[e.src].label}[{e.index_str()}] is not causal along "
                               f"{t} (a point after the reader's own)", m)
                return False
    last = max(ed.dims.index(d) for i in comp for d in ed.ops[i].domain)
    tp = ed.new_dim(f"{t.name}_pre", ed.dims[last], p,
                    why=f"the steps of {t} before the branch {branch.cond} of "
                        f"{ed.ops[m].label} ends")
    ed.made[tp.name] = ("prefix", t.name)
    to_pre = {t: tp}  # the split at t = P is written with t_pre's bound (its value is P), so
    # that it is consistent for every value of the bounds the schedule is made for
    order = ed.dims

    def pre_domain(op: Op) -> tuple:
        dims = {tp if d == t else d for d in op.domain}
        return tuple(d for d in order if d in dims)

    pre: dict[int, int] = {}
    for i in sorted(comp):  # made first, their reads after: the copies read each other
        op = ed.ops[i]
        kind, attrs = ("identity", {}) if i == m else (op.kind, _sub_attrs(op.attrs, to_pre))
        pre[i] = ed.add(Op(-1, kind, pre_domain(op), _sub_type(op.type, to_pre), attrs,
                           op.loc, op.name, op.scope), [], i,
                        f"%{i} over the {p} steps of {t} before {branch.cond}")
    memo: dict[int, bool] = {}

    def known(i: int) -> bool:
        """Whether op ``i`` (over ``t``, off the cycle) can be recomputed over ``t_pre``: no
        effect or callback, and what it reads over ``t`` it reads at its own step or over
        steps up to it, from ops that can be too (the prompt's token at a step, a RoPE angle,
        a position, a padded row's mask of the steps so far)."""
        if i not in memo:
            op = ed.ops[i]
            memo[i] = False
            memo[i] = i not in comp and not flag(op.kind, "effect") and op.kind != "source" \
                and all(t not in ed.ops[e.src].domain or (
                    _so_far(ed, e, t) and known(e.src)) for e in ed.in_edges(i))
        return memo[i]

    def clone(i: int) -> int:
        """Op ``i`` recomputed over ``t_pre``: read at a step of ``t``, the copy would be
        batched over ``t_pre`` only after the loop over ``t`` had made it (and along a
        ``tl.until`` dim, after the steps that decide where the loop ends)."""
        if i not in pre:
            op = ed.ops[i]
            srcs = [clone(e.src) if t in ed.ops[e.src].domain else e.src
                    for e in ed.in_edges(i)]
            ins = [Edge(-1, src, e.slot, index(e, src), e.cond.substitute(to_pre), e.loc)
                   for e, src in zip(ed.in_edges(i), srcs)]
            pre[i] = ed.add(Op(-1, op.kind, pre_domain(op), _sub_type(op.type, to_pre),
                               _sub_attrs(op.attrs, to_pre), op.loc, op.name, op.scope), ins,
                            i, f"%{i} recomputed over {tp}")
        return pre[i]

    def source(e: Edge) -> int:
        """What a copy reads for ``e``: the copy of an op of the cycle, the op recomputed over
        ``t_pre`` where ``e`` reads it at its own step, else ``e``'s source."""
        if e.src in comp:
            return pre[e.src]
        src = ed.ops[e.src]
        if t in src.domain and _so_far(ed, e, t) and known(e.src):
            return clone(e.src)
        return e.src

    def index(e: Edge, src: int) -> tuple:
        """``e``'s index in the copy's dims; of a copy, in the order of its domain."""
        if src == e.src:
            return tuple(_sub(x, to_pre) for x in e.index)
        at = dict(zip(ed.ops[e.src].domain, e.index))
        return tuple(_sub(at[t if d == tp else d], to_pre) for d in ed.ops[src].domain)

    for i in sorted(comp):
        ins = [branch] if i == m else ed.in_edges(i)
        srcs = [source(e) for e in ins]
        edges = [Edge(pre[i], src, slot, index(e, src),
                      TRUE if i == m else e.cond.substitute(to_pre), e.loc)
                 for slot, (e, src) in enumerate(zip(ins, srcs))]
        ed.rewrite(pre[i], ed.ops[pre[i]], edges, f"reads the copies over {tp}")
    # the originals from P on: readers of points below P read a merge of copy and original
    merged: dict[int, int] = {}

    def merge_of(i: int) -> int:
        if i not in merged:
            op = ed.ops[i]
            at_t = tuple(t if d == tp else d for d in ed.ops[pre[i]].domain)
            merged[i] = ed.add(
                Op(-1, "merge", op.domain, op.type, {"type": op.type, "join": True}, op.loc,
                   op.name, op.scope),
                [Edge(-1, pre[i], 0, at_t, t < tp.bound, op.loc),
                 Edge(-1, i, 1, op.domain, t >= tp.bound, op.loc)], i,
                f"%{i}: the copy over {tp} below {t} = {p}, the original from there")
        return merged[i]

    copies = set(pre.values())  # the copies of the cycle and the ops recomputed over t_pre
    for i in sorted(comp):
        for e in ed.out_edges(i):
            if e.dst in copies or e.dst in merged.values() or (
                    e.dst in comp and _own_t(ed, e, t)):  # a copy, a join, the same step
                continue
            ed.reindex(e, e.index, f"reads %{i} below {t} = {p} from its copy over {tp}",
                       src=merge_of(i))
        ed.outputs = {k: merge_of(i) if v == i else v for k, v in ed.outputs.items()}
        ed.sinks = [merge_of(s) if s == i else s for s in ed.sinks]
    for i in comp:  # from P on: placeholders are demanded whole unless they say otherwise
        op = ed.ops[i]
        if op.closes_cycles:
            ed.update(i, Op(i, op.kind, op.domain, op.type,
                            {**op.attrs, "needed": t >= tp.bound}, op.loc, op.name, op.scope),
                      f"needed from {t} = {p} on")
    _drop_unread(ed, copies)
    ed.renumber()
    return True


def _causal(ed: Editor, e: Edge, t: Dim) -> bool:
    """Whether read ``e`` (both ends over ``t``) reads only points of ``t`` at or before the
    reader's own, and mentions ``t`` nowhere else."""
    src = ed.ops[e.src]
    for d, x in zip(src.domain, e.index):
        if d != t:
            if t in x.dims():
                return False
            continue
        end = (x.stop - 1 if isinstance(x, Slice) else x) - t
        if not isinstance(end, Const) or end.value > 0:
            return False
    return True


def _own_t(ed: Editor, e: Edge, t: Dim) -> bool:
    """Whether read ``e`` reads the producer at the reader's own ``t``."""
    src = ed.ops[e.src]
    return all(x == t for d, x in zip(src.domain, e.index) if d == t)


def _so_far(ed: Editor, e: Edge, t: Dim) -> bool:
    """Whether ``e`` reads its source at the reader's own point, or along ``t`` over steps
    up to the reader's (``0:t + 1``, a window ending there): read by a copy over ``t_pre``,
    those steps are all below ``P``."""
    dims = tuple(ed.ops[e.src].domain)
    if len(e.index) != len(dims):
        return False
    for d, x in zip(dims, e.index):
        if d != t:
            if x != d:
                return False
        elif isinstance(x, Slice):
            if not isinstance(x.stop - t, Const) or (x.stop - t).value > 1 \
                    or not x.start.dims() <= {t}:
                return False
        elif x != t:
            return False
    return True


def _sub(x, mapping):
    return x.substitute(mapping) if hasattr(x, "substitute") else x


def _sub_type(ty: TensorType, mapping) -> TensorType:
    return TensorType(tuple(s if isinstance(s, int) else _sub(s, mapping) for s in ty.shape),
                      ty.dtype, ty.weak)


def _sub_attrs(attrs, mapping) -> dict:
    out = {}
    for k, v in attrs.items():
        if isinstance(v, TensorType):
            v = _sub_type(v, mapping)
        elif k == "expr":
            v = _sub(v, mapping)
        elif k in ("shape", "size") and isinstance(v, tuple):
            v = tuple(_sub(s, mapping) for s in v)
        out[k] = v
    return out


def _drop_unread(ed: Editor, ops: set[int]):
    """Erase those of ``ops`` nothing reads (a copy of what only the steps from P on need)."""
    roots = ed.roots()
    while True:
        dead = [i for i in ops if i in ed.ops and i not in roots and not ed.out_edges(i)]
        if not dead:
            return
        for i in dead:
            ed.erase(i, "read by no step before the split")
