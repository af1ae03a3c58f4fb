"""Freeze the traced graph that the outputs and sinks reach into an immutable SDG."""
from __future__ import annotations

import dataclasses

from ..errors import DefinitionError
from ..ir.sdg import SDG, Edge, Op
from ..symbolic import TRUE, not_, or_
from .context import Context, Node, named_results
from .tensor import RecurrentTensor


def build_sdg(ctx: Context, outputs: dict[str, RecurrentTensor], partial: bool = False,
              untils: dict[str, RecurrentTensor] | None = None, ragged=None) -> SDG:
    """Ops are numbered in trace order (producers before consumers, except recurrences through
    placeholders); an output that is a view (``x[T - 1]``) gets an identity op of its own.
    ``partial``: the program as written so far (placeholders may still lack branches).
    ``untils``: the ``done`` tensor of each data-dependent bound; ``ragged``: the ragged
    bounds (``ir.sdg.Ragged``)."""
    untils = dict(untils or {})
    ragged = dict(ragged or {})
    ends = {b: r.done for b, r in ragged.items() if r.done is not None}  # per-instance untils
    roots: list[Node] = ([rt.node for rt in outputs.values()] + list(ctx._sinks)
                         + [rt.node for rt in untils.values()]
                         + [rt.node for rt in ends.values()])
    seen: dict[int, Node] = {}
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n.id in seen:
            continue
        seen[n.id] = n
        if n.kind == "merge" and not n.inputs and not partial:
            raise DefinitionError(f"placeholder {n.name or '%' + str(n.id)} is never defined; "
                                  "assign its branches, e.g. x[0] = ... and x[t] = ...", n.loc)
        stack.extend(i.node for i in n.inputs)
    nodes = sorted(seen.values(), key=lambda n: n.id)
    renum = {n.id: k for k, n in enumerate(nodes)}
    results = named_results(nodes)
    ops = [Op(renum[n.id], n.kind, n.domain, n.type, dict(n.attrs), n.loc,
              n.name or results.get(n.id), n.scope) for n in nodes]
    edges = []
    for n in nodes:
        others = [i.cond for i in n.inputs if not i.default]
        for slot, i in enumerate(n.inputs):
            cond = not_(or_(*others)) if i.default and others else i.cond
            edges.append(Edge(renum[n.id], renum[i.node.id], slot, i.index, cond,
                              i.loc or n.loc))

    def op_of(rt: RecurrentTensor) -> int:
        """The op holding ``rt``'s value: a view (``x[T - 1]``) gets an identity op."""
        if rt.index is None:
            return renum[rt.node.id]
        op = Op(len(ops), "identity", rt.domain, rt.type, {}, rt.loc, None)
        ops.append(op)
        edges.append(Edge(op.id, renum[rt.node.id], 0, rt.index, TRUE, rt.loc))
        return op.id

    out_ids = {name: op_of(rt) for name, rt in outputs.items()}
    return SDG(ctx.dims, ops, edges, out_ids, [renum[n.id] for n in ctx._sinks],
               {b: op_of(rt) for b, rt in untils.items()},
               ragged={b: dataclasses.replace(r, done=op_of(ends[b])) if b in ends else r
                       for b, r in ragged.items()})
