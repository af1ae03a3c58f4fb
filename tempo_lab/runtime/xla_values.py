"""Which values the XLA executor traces rather than stores (``XlaPlan.local`` and
``XlaPlan.from_conds``): a value written and read in one iteration of its loop is a traced value
of that iteration, never a buffer carried through the loop. ``local_values`` finds them from the
loop AST; ``settled_locals`` decides those read after the ``If`` that wrote them, which a
``lax.cond`` then returns."""
from __future__ import annotations

import numpy as np

from ..ir.sdg import SDG
from ..memory.plan import MemoryPlan
from ..schedule import Exec, For, If, Seq, While
from ..symbolic import Dim, as_expr
from ..symbolic.cond import decide
from .xla_loops import ranged, traced_statements


def local_values(sdg: SDG, plan: MemoryPlan, ast, keep: set[int]
                  ) -> tuple[set[int], set[int]]:
    """Point stores whose every read happens later in the same loop iteration that wrote them,
    inside the If branch that wrote them (if any): held as traced values, never stored. And
    those that qualify but for a read outside that If (``settled_locals``
    decides those), provided their point names the loop's variable: one that does not (a
    value of no dims made under ``i == 0`` and read at every step) is written at one step and
    read at later ones, so it stays a store."""
    where: dict[int, tuple] = {}   # exec op -> (enclosing For id, position, If branches)
    execs: dict[int, Exec] = {}
    loops: dict[int, str] = {}     # For id -> its variable
    count: dict[int, int] = {}
    pos = [0]

    def visit(node, loop, branches):
        if isinstance(node, Seq):
            for n in node.body:
                visit(n, loop, branches)
        elif isinstance(node, For):
            loops[id(node)] = node.var
            visit(node.body, id(node), ())
        elif isinstance(node, If):
            visit(node.then, loop, branches + (id(node.then),))
            if node.orelse is not None:
                visit(node.orelse, loop, branches + (id(node.orelse),))
        elif isinstance(node, Exec):
            pos[0] += 1
            count[node.op] = count.get(node.op, 0) + 1
            where.setdefault(node.op, (loop, pos[0], branches))
            execs.setdefault(node.op, node)

    visit(ast, None, ())
    out, apart = set(), set()
    outputs = set(sdg.outputs.values())
    for i, s in plan.storages.items():
        if i in outputs or i in keep or any(w != 1 for w in s.slots) or count.get(i) != 1:
            continue
        if i not in where:
            continue
        loop, p, branches = where[i]
        w_op = sdg.ops[i]
        w_at = tuple(execs[i].args)
        moved = {d.name for a in w_at for d in as_expr(a).dims()}  # loop variables it names
        ok = True
        for e in sdg.out_edges(i):
            r = execs.get(e.dst)
            if r is None:
                continue
            if count.get(e.dst) != 1:
                ok = False
                break
            rloop, rp, rbranches = where[e.dst]
            at = {Dim(d.name): a for d, a in zip(sdg.ops[e.dst].domain, r.args)}
            idx = tuple(x.substitute(at) if not hasattr(x, "stop") else None for x in e.index)
            if rloop != loop or rp <= p or idx != w_at or len(idx) != len(w_op.domain):
                ok = False
                break
            if rbranches[:len(branches)] != branches:
                if loop is not None and loops[loop] not in moved:
                    # the same point at every step, written under a condition (a value
                    # of no dims made at the first step): a later step reads what an
                    # earlier one wrote, which a lax.cond returning it would give as zeros
                    ok = False
                    break
                ok = None  # a reader outside the If that wrote it: settled_locals
        if ok:
            out.add(i)
        elif ok is None:
            apart.add(i)
    return out, apart


def settled_locals(xp, ops: set[int]) -> set[int]:
    """Those of ``ops`` (written inside an If, read after it in the same step) that are
    traced before every read as the trace runs: each If around the write is one the
    loop's range settles where a read is traced (``t >= 1`` in the steps after a peeled
    first step), so the value is there, or a ``lax.cond`` that returns it (zeros from the
    branch that does not write it: a reader reads it only where it was written, as the
    SDG's reads stay in their producer's domain, and in the step that wrote it, as
    ``local_values`` offers only values whose point moves with the loop). PPO's
    rollout step kept one such value (the state where the episode went on) in a store
    carried through the loop: XLA then
    copied four stores of every step (164 KB each, a sixth of the iteration) to keep that
    store's reads apart from their in-place updates; an optimiser's new moments and
    parameters (written under ``i >= 1``, read by the merge after it) were stores as big
    as the parameters, held for the whole run. Only values of a static shape leave a
    ``lax.cond`` (its other branch makes their zeros)."""
    bad: set[int] = set()

    def static(i: int) -> bool:
        return all(isinstance(x, (int, np.integer)) for x in xp.sdg.ops[i].type.shape)

    def walk(node, lower, seen: set[int], sure: bool):
        """``seen``: the values traced so far in this scope; ``sure``: the trace runs this
        code as it stands (not a loop split into spans)."""
        if isinstance(node, Seq):
            for n in node.body:
                walk(n, lower, seen, sure)
        elif isinstance(node, For):
            if id(node) in xp.unrolled:
                first, end = xp.unrolled[id(node)]
                for v in range(first, end):
                    walk(node.body, ranged(xp, node, lower, as_expr(v), True), set(), sure)
                return
            segs = xp.segments(node)
            if not segs and xp.peeled(node, lower):
                walk(node.body, ranged(xp, node, lower, node.lo, True), set(), sure)
                walk(node.body, ranged(xp, node, lower, as_expr(node.lo) + 1, False),
                     set(), sure)
            else:
                walk(node.body, ranged(xp, node, lower, node.lo, False), set(),
                     sure and not segs and not isinstance(node, While))
        elif isinstance(node, If):
            settled = decide(node.cond, lower)
            if settled is not None:
                sub = node.then if settled else node.orelse
                if sub is not None:
                    walk(sub, lower, seen, sure)
                return
            for sub in (node.then, node.orelse):
                if sub is not None:  # a lax.cond branch: its own scope, which returns
                    inner = set(seen)  # the values of static shape written in it
                    walk(sub, lower, inner, sure)
                    seen |= {i for i in inner - seen if static(i)}
        elif isinstance(node, Exec):
            for k in traced_statements(xp.lowered, xp.lowered.of_exec[id(node)], lower):
                bad.update(r.src for r in xp.lowered.stmts[k].reads if r.src in ops and (
                    not sure or r.src not in seen))
            if node.op in ops:
                seen.add(node.op)

    walk(xp.lowered.ast, xp.floors, set(), True)
    return {i for i in ops - bad if static(i)}  # a shape of bounds: not out of a cond
