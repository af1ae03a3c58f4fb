"""Offloading under a device memory budget: stores idle between two phases move to host memory.

``CompileConfig(device_memory_budget=BYTES)``: when the memory plan's peak is above the budget,
a store that one part of a sequence writes or reads and a later part reads again, with parts in
between that do not touch it, is copied to the host after the first part (``Offload``) and back
before the later one (``Fetch``). Candidates are every such gap in every ``Seq`` of the loop AST
(inside loops too: an iteration's phases); they are tried largest store first, and one is kept
when the simulated device peak (the same simulation as the plan's) falls, until it is within
the budget. What cannot be offloaded (a store read in every phase) stays, and the plan says
how far above the budget the program remains.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir.sdg import SDG
from ..schedule import Exec, Fetch, For, Free, If, Node, Offload, Seq
from ..symbolic import Dim
from .simulate import simulate


@dataclass(frozen=True)
class Gap:
    """Store ``op`` is idle between children ``after`` and ``before`` of the ``Seq`` at
    ``path`` (indices from the root through ``Seq`` bodies, ``For`` bodies and ``If``
    branches)."""

    path: tuple
    after: int
    before: int
    op: int


def _touches(node: Node, sdg: SDG, memo: dict) -> frozenset[int]:
    """The stores a subtree writes or reads."""
    key = id(node)
    if key not in memo:
        if isinstance(node, Exec):
            out = {node.op} | {e.src for e in sdg.in_edges(node.op)}
        elif isinstance(node, Seq):
            out = set().union(*(_touches(n, sdg, memo) for n in node.body))
        elif isinstance(node, For):
            out = set(_touches(node.body, sdg, memo))
        elif isinstance(node, If):
            out = set(_touches(node.then, sdg, memo))
            if node.orelse is not None:
                out |= _touches(node.orelse, sdg, memo)
        else:
            out = set()
        memo[key] = frozenset(out)
    return memo[key]


def gaps(ast: Node, sdg: SDG, stored: set[int]) -> list[Gap]:
    """Every stretch of a sequence over which a stored op is not touched, between two parts
    that touch it, and not freed within it."""
    memo: dict = {}
    out: list[Gap] = []

    def visit(node, path):
        if isinstance(node, Seq):
            seen: dict[int, int] = {}
            for k, child in enumerate(node.body):
                freed = set(child.ops) if isinstance(child, Free) else set()
                for o in freed:
                    seen.pop(o, None)
                for o in _touches(child, sdg, memo) & stored:
                    if o in seen and k > seen[o] + 1:
                        out.append(Gap(path, seen[o], k, o))
                    seen[o] = k
                visit(child, path + (k,))
        elif isinstance(node, For):
            visit(node.body, path + ("body",))
        elif isinstance(node, If):
            visit(node.then, path + ("then",))
            if node.orelse is not None:
                visit(node.orelse, path + ("else",))

    visit(ast, ())
    return out


def insert(ast: Node, chosen: list[Gap]) -> Node:
    """``ast`` with an ``Offload`` after and a ``Fetch`` before each chosen gap."""
    by_path: dict[tuple, list[Gap]] = {}
    for g in chosen:
        by_path.setdefault(g.path, []).append(g)

    def rebuild(node, path):
        if isinstance(node, Seq):
            body = [rebuild(c, path + (k,)) for k, c in enumerate(node.body)]
            here = by_path.get(path, [])
            out = []
            for k, c in enumerate(body):
                fetch = tuple(sorted(g.op for g in here if g.before == k))
                if fetch:
                    out.append(Fetch(fetch))
                out.append(c)
                off = tuple(sorted(g.op for g in here if g.after == k))
                if off:
                    out.append(Offload(off))
            return Seq(tuple(out))
        if isinstance(node, For):
            return dataclasses.replace(node, body=rebuild(node.body, path + ("body",)))
        if isinstance(node, If):
            return If(node.cond, rebuild(node.then, path + ("then",)),
                      None if node.orelse is None else rebuild(node.orelse, path + ("else",)))
        return node

    return rebuild(ast, ())


def place(ast: Node, sdg: SDG, storages: dict, bounds: dict, budget: int,
          peak: int) -> tuple[Node, list[Gap]]:
    """The loop AST with offloads that bring the simulated device peak to ``budget`` if they
    can (largest store first, each kept only if it lowers the peak), and the gaps chosen."""
    if peak <= budget:
        return ast, []
    item = {i: s.bytes_for(tuple(bounds[Dim(d).bound.name] for d in s.dims))
            for i, s in storages.items()}
    chosen: list[Gap] = []
    best = ast
    for g in sorted(gaps(ast, sdg, set(storages)), key=lambda g: (-item[g.op], g.path)):
        trial = insert(ast, chosen + [g])
        p = simulate(trial, storages, bounds)[4]
        if p < peak:
            chosen, best, peak = chosen + [g], trial, p
            if peak <= budget:
                break
    return best, chosen
