"""Lifetimes in the loop AST: after which statement instance each store is dead, and the
``Free`` nodes that say so.

A store is freed right after the last instance (in the order the AST runs, ``time_map``) of
any statement that reads or writes it; outputs and ``tl.until`` conditions are kept to the
end. ``iteration_frees`` finds the stricter frees the memory objective asks for (a store
freed in every iteration of the deepest loop whose iterations read all its values). The
pipeline adds the first kind to every schedule before planning its memory (``with_frees``);
``offload.py`` inserts the second where it helps.
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..cache import LRU
from ..ir.demand import param_context
from ..ir.sdg import SDG
from ..schedule import Schedule, canon
from ..schedule.loops import Exec, For, Free, If, Node, Seq, While
from ..symbolic import Bound, and_
from ..symbolic import isl as I

_LAST_READS = LRU(8192)


def with_frees(sdg: SDG, schedule: Schedule) -> Schedule:
    """``schedule`` running its loop AST with a ``Free`` after each store's last use (as it
    is where it has them already)."""
    if schedule.freed:
        return schedule
    maps = {e: sdg.isl_map(e) for e in sdg.edges}
    frees = last_reads(sdg, schedule.order, schedule.domains, maps)
    ast = _after_the_bound(insert_frees(schedule.ast, frees, sdg))
    return schedule.with_ast(ast, freed=True)


def _after_the_bound(node: Node) -> Node:
    """Each ``tl.until`` loop with the frees that its bound guards (``if t == T - 1: free x``)
    moved from the part of its body that runs before the bound is set (``While.split``) to
    right after that part. There the guard saw the ``max``: where the loop ended early, the
    last iteration skipped the free, and the store stayed live through the rest of the run,
    above the plan (a measured peak of 66 B against 58 planned)."""
    if isinstance(node, Seq):
        return Seq(tuple(_after_the_bound(n) for n in node.body))
    if isinstance(node, If):
        return If(node.cond, _after_the_bound(node.then),
                  None if node.orelse is None else _after_the_bound(node.orelse))
    if not isinstance(node, For):
        return node
    node = dataclasses.replace(node, body=_after_the_bound(node.body))
    if not isinstance(node, While):
        return node
    first, rest = node.split()
    bound = Bound(node.bound)
    moved = []

    def guarded(n) -> bool:
        return isinstance(n, If) and isinstance(n.then, Free) and n.orelse is None \
            and bound in n.cond.symbols()

    def keep(n):
        if isinstance(n, Seq):
            moved.extend(x for x in n.body if guarded(x))
            return Seq(tuple(x for x in n.body if not guarded(x)))
        return n

    first = tuple(keep(n) for n in first.body)
    if not moved:
        return node
    return dataclasses.replace(node, body=Seq((*first, *moved, *rest.body)))


def maps_by_op(order: isl.UnionMap) -> dict[int, isl.Map]:
    """The schedule's map of each op (``op12[...] -> [time]``), by op id."""
    return {int(m.get_tuple_name(isl.dim_type.in_)[2:]): m for m in I.maps_of(order)}


def last_reads(sdg: SDG, smap: isl.UnionMap, domains, maps) -> dict[int, list[tuple]]:
    """For each op, the stores it frees and where: ``{op: [(store, cond)]}``.

    A store is freed right after the last (in ``smap`` time) instance of any of its readers;
    outputs are kept to the end.
    """
    params = param_context(sdg)
    keep = set(sdg.outputs.values()) | set(sdg.untils.values())
    by_op = maps_by_op(smap)
    keys = canon.Keys(by_op, str(params))
    out: dict[int, list[tuple]] = {}
    for i in sdg.ops:
        if i in keep or domains[i].is_empty():
            continue
        edges = [e for e in sdg.out_edges(i) if not domains[e.dst].is_empty()]
        objects = [domains[i]] + [x for e in edges for x in (maps[e], domains[e.dst])]
        found = keys.key([i] + [e.dst for e in edges], objects)

        def solve(i=i, edges=edges):
            return _last_reads_of(sdg, i, edges, by_op, domains, maps, params)

        if found is None:
            frees = solve()
        else:  # the same problem as another layer's: its answer, with this layer's ops
            key, order = found
            frees = [(order[j], cond) for j, cond in _LAST_READS.get(
                key, lambda order=order: [(order.index(r), c) for r, c in solve()])]
        for reader, cond in frees:
            out.setdefault(reader, []).append((i, cond))
    return out


def _last_reads_of(sdg: SDG, i: int, edges, by_op, domains, maps, params) -> list[tuple]:
    """``[(reader, cond)]``: after which instances of which readers op ``i`` is dead."""
    readers = [maps[e].intersect_domain(domains[e.dst]).domain() for e in edges]
    readers = [r for r in readers if not r.is_empty()]
    if not readers:
        return []
    # after the last read, and after the last write (a point may be computed, unread); only
    # these statements' part of the schedule takes part (isl's cost follows it)
    ops = {i} | {int(r.get_tuple_name()[2:]) for r in readers}
    local = I.union_of([by_op[k] for k in sorted(ops) if k in by_op])
    times = I.union_of(readers + [domains[i]]).apply(local)
    return _where(sdg, times.lexmax().apply(local.reverse()), params)


def _where(sdg: SDG, instances: isl.UnionSet, params, domains=None) -> list[tuple]:
    """``[(op, cond)]``: statement instances as the condition on each op's point (simplified
    within its domain, when ``domains`` are given)."""
    found = []
    for s in I.sets_of(instances):
        op = int(s.get_tuple_name()[2:])
        if domains is not None:
            s = s.gist(domains[op])
        s = I.named(s, sdg.ops[op].domain)
        found.append((op, I.cond_from_set(s.gist_params(params).reset_tuple_id())))
    return found


def iteration_frees(sdg: SDG, by_op: dict[int, isl.Map], domains,
                    i: int) -> list[tuple] | None:
    """``[(reader, cond)]``: where store ``i`` can be freed in *every* iteration of the
    deepest loop (of the schedule whose maps are ``by_op``: ``maps_by_op``) within whose
    iterations all its values are read (the next iteration writes it afresh), or None: a value is read in a later iteration (a recurrence along every
    loop), the store is an output, or a ``tl.until`` bound is involved (a loop that ends early
    frees only what its last iteration would). Freeing each iteration costs a fresh buffer per
    iteration, so the memory objective (``memory/offload.py``) asks for it where it helps."""
    if i in set(sdg.outputs.values()) | set(sdg.untils.values()) or domains[i].is_empty():
        return None
    edges = [e for e in sdg.out_edges(i) if not domains[e.dst].is_empty()]
    ops = {i} | {e.dst for e in edges}
    if not edges or any(d.bound.name in sdg.untils for k in ops for d in sdg.ops[k].domain):
        return None
    if not ops <= set(by_op):
        return None
    reads = {e: sdg.isl_map(e).intersect_domain(domains[e.dst]) for e in edges}
    # dependences in time: the reader's time -> the time the value it reads was made
    deps = [m.intersect_range(domains[i]).apply_domain(by_op[e.dst]).apply_range(by_op[i])
            for e, m in reads.items()]
    deps = [m for d in deps for m in (I.maps_of(d) if isinstance(d, isl.UnionMap) else [d])
            if not m.is_empty()]
    if not deps:
        return None
    n, depth = deps[0].dim(isl.dim_type.out), 0
    while depth < n:  # the longest prefix of the time vector every dependence stays within
        same = isl.Map.universe(deps[0].get_space())
        for j in range(depth + 1):
            same = same.equate(isl.dim_type.in_, j, isl.dim_type.out, j)
        if not all(m.is_subset(same.align_params(m.get_space())) for m in deps):
            break
        depth += 1
    if depth == 0:
        return None
    local = I.union_of([by_op[k] for k in sorted(ops)])
    times = I.sets_of(I.union_of([m.domain() for m in reads.values()] + [domains[i]])
                      .apply(local))
    touched = times[0]
    for s in times[1:]:
        touched = touched.union(s)
    last = (isl.Map.from_range(touched).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0,
                                                  depth).lexmax()
            .move_dims(isl.dim_type.out, 0, isl.dim_type.in_, 0, depth).range())
    if last.is_equal(touched.lexmax()):  # the prefix is the same throughout: no loop in it
        return None
    return _where(sdg, isl.UnionSet.from_set(last).apply(local.reverse()), param_context(sdg),
                  domains)


_AT = LRU(8192)


def _at(cond, mapping: tuple):
    """``cond`` at the statement's point (memoised: repeated layers free alike)."""
    return _AT.get((cond, mapping), lambda: cond.substitute(dict(mapping)))


def insert_frees(node: Node, frees: dict[int, list[tuple]], sdg: SDG) -> Node:
    if isinstance(node, Seq):
        return Seq(tuple(insert_frees(n, frees, sdg) for n in node.body))
    if isinstance(node, For):
        return dataclasses.replace(node, body=insert_frees(node.body, frees, sdg))
    if isinstance(node, If):
        return If(node.cond, insert_frees(node.then, frees, sdg),
                  None if node.orelse is None else insert_frees(node.orelse, frees, sdg))
    if isinstance(node, Exec) and node.op in frees:
        dims = sdg.ops[node.op].domain
        mapping = {d: a for d, a in zip(dims, node.args)}
        groups: dict = {}
        for store, cond in frees[node.op]:
            groups.setdefault(_at(cond, tuple(mapping.items())), []).append(store)
        after = [Free(tuple(ops)) if c == and_() else If(c, Free(tuple(ops)))
                 for c, ops in groups.items()]
        return Seq((node, *after))
    return node
