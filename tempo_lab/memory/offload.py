"""Meeting a device memory budget: stores freed every iteration, or moved to host memory while
they are idle.

``CompileConfig(device_memory_budget=BYTES)``: while the memory plan's peak is above the budget,
moves are tried largest store first, and one is kept only where the simulated device peak (the
same simulation as the plan's) falls, or fewer steps reach it (two phases at the same peak each
need a move before it falls):

1. the cheap move first: a store whose values are all read in the iteration of a loop that made
   them is freed at the end of every iteration instead of after the last
   (``liveness.iteration_frees``), at the price of a fresh buffer per iteration;
2. then copies: a store that one part of a sequence touches and a later part touches again, with
   parts in between that do not, goes to the host after the first (``Offload``) and comes back
   before the later one (``Fetch``); in a loop's body the idle stretch may wrap around, from the
   store's last touch in one iteration to its first in the next (an optimizer's moments during
   the forward pass), and the store then comes back after the loop where it is touched next.

Stores below 1/64 of the excess are left alone: a copy or a fresh buffer per iteration costs
time that so few bytes do not repay. What cannot move (a store read in every phase) stays, and
the plan says how far above the budget the program remains.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..ir.sdg import SDG
from ..schedule import Exec, Fetch, For, Free, If, Node, Offload, Seq, While
from ..symbolic import Dim
from .liveness import insert_frees, iteration_frees, maps_by_op
from .plan import MemoryPlan, plan_memory
from .simulate import simulate

SMALL = 64  # stores below 1/SMALL of the excess are not moved


@dataclass(frozen=True)
class Gap:
    """Store ``op`` is idle between children ``after`` and ``before`` of the ``Seq`` at
    ``path`` (indices from the root through ``Seq`` bodies, ``For`` bodies and ``If``
    branches). A gap in a loop's body may wrap around (``after >= before``): from ``after`` to
    the end of one iteration and from the start of the next to ``before``; the store then ends
    the loop on the host and is fetched before each child at ``back`` (``(path, index)``) that
    can touch it next."""

    path: tuple
    after: int
    before: int
    op: int
    back: tuple = ()


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


def gaps(ast: Seq, sdg: SDG, stored: set[int]) -> list[Gap]:
    """In ``ast`` (every loop body and branch a sequence: ``_sequences``), every stretch of a
    sequence over which a stored op is not touched, between two parts that touch it, and not
    freed within it; and in a loop's body, the stretch from its last touch in one iteration to
    its first in the next (inside the branch that touches it, when that is one ``if``)."""
    memo: dict = {}
    out: list[Gap] = []
    keep = set(sdg.outputs.values()) | set(sdg.untils.values())

    def visit(node, path, up):
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
                visit(child, path + (k,), up + ((node, path, k),))
        elif isinstance(node, For):
            visit(node.body, path + ("body",), up + ((node, path, None),))
            if not isinstance(node, While):
                out.extend(_wrapped(node, path, up, sdg, stored, memo, keep))
        elif isinstance(node, If):
            visit(node.then, path + ("then",), up)
            if node.orelse is not None:
                visit(node.orelse, path + ("else",), up)

    visit(ast, (), ())
    return out


def _wrapped(loop_node: For, loop: tuple, up: tuple, sdg: SDG, stored: set[int], memo: dict,
             keep: set[int]) -> list[Gap]:
    """The gaps of a loop's body that wrap around from one iteration to the next."""
    body = loop_node.body
    touched = [_touches(c, sdg, memo) & stored for c in body.body]
    out = []
    for o in set().union(*touched):
        at = [k for k, t in enumerate(touched) if o in t]
        first, last = at[0], at[-1]
        child = body.body[first]
        back = _back(o, loop_node, up, sdg, memo, keep)
        if (first == last and isinstance(child, If) and child.then.body
                and (child.orelse is None or o not in _touches(child.orelse, sdg, memo))):
            # only a branch touches it: around that branch, idle whenever it does not run
            out.append(Gap(loop + ("body", first, "then"), len(child.then.body) - 1, 0, o,
                           back))
        elif first > 0 or last < len(body.body) - 1:
            out.append(Gap(loop + ("body",), last, first, o, back))
    return out


def _back(o: int, loop: For, up: tuple, sdg: SDG, memo: dict, keep: set[int]) -> tuple:
    """Where a store that ends ``loop`` on the host must come back: before the next child of
    each enclosing sequence that touches it after the loop, and before the first that touches
    it in the next iteration of an enclosing loop (unless that is ``loop`` itself, which
    fetches it on its own); at the end of the program for an output."""
    found = []
    for node, path, index in reversed(up):  # innermost first; a loop's body is a sequence
        if isinstance(node, Seq):
            k = index
            later = [j for j in range(k + 1, len(node.body))
                     if o in _touches(node.body[j], sdg, memo)]
            if later:
                return tuple(found) + ((path, later[0]),)
        else:  # a loop: its next iteration
            first = next(j for j, c in enumerate(node.body.body)
                         if o in _touches(c, sdg, memo))
            if first < k or (first == k and _before(node.body.body[k], loop, o, sdg, memo)):
                found.append((path + ("body",), first))
    if o in keep:  # (``place`` makes the root a sequence)
        found.append(((), len(up[0][0].body)))
    return tuple(found)


def _before(node: Node, target: Node, o: int, sdg: SDG, memo: dict) -> bool | None:
    """Whether something may touch store ``o`` before ``target`` runs in ``node``: before it,
    or in the other branch of an ``if`` around it (None: ``target`` is not in ``node``)."""
    if node is target:
        return False
    if isinstance(node, Seq):
        for c in node.body:
            found = _before(c, target, o, sdg, memo)
            if found is not None:
                return found
            if o in _touches(c, sdg, memo):
                return True
        return None
    if isinstance(node, For):
        return _before(node.body, target, o, sdg, memo)
    if isinstance(node, If):  # the other branch may run instead, touching it first
        for branch, other in ((node.then, node.orelse), (node.orelse, node.then)):
            found = None if branch is None else _before(branch, target, o, sdg, memo)
            if found is not None:
                return found or (other is not None and o in _touches(other, sdg, memo))
        return None
    return None


def insert(ast: Node, chosen: list[Gap]) -> Node:
    """``ast`` with an ``Offload`` after and a ``Fetch`` before each chosen gap (and, for a
    gap that wraps around a loop, ``Fetch``es where it comes back)."""
    by_path: dict[tuple, list[Gap]] = {}
    back: dict[tuple, set[int]] = {}
    for g in chosen:
        by_path.setdefault(g.path, []).append(g)
        for where in g.back:
            back.setdefault(where, set()).add(g.op)

    def rebuild(node, path):
        if isinstance(node, Seq):
            body = [rebuild(c, path + (k,)) for k, c in enumerate(node.body)]
            here = by_path.get(path, [])
            out = []
            for k, c in enumerate(body):
                fetch = tuple(sorted({g.op for g in here if g.before == k}
                                     | back.get((path, k), set())))
                if fetch:
                    out.append(Fetch(fetch))
                out.append(c)
                off = tuple(sorted(g.op for g in here if g.after == k))
                if off:
                    out.append(Offload(off))
            end = tuple(sorted(back.get((path, len(body)), ())))
            return Seq(tuple(out) + ((Fetch(end),) if end else ()))
        if isinstance(node, For):
            return dataclasses.replace(node, body=rebuild(node.body, path + ("body",)))
        if isinstance(node, If):
            return If(node.cond, rebuild(node.then, path + ("then",)),
                      None if node.orelse is None else rebuild(node.orelse, path + ("else",)))
        return node

    return rebuild(ast, ())


def refree(ast: Node, op: int, frees: list[tuple], sdg: SDG) -> Node:
    """``ast`` with store ``op`` freed where ``frees`` (``[(reader, cond)]``) says instead of
    where it was."""
    def strip(node):
        if isinstance(node, Free):
            ops = tuple(o for o in node.ops if o != op)
            return Free(ops) if ops else None
        if isinstance(node, Seq):
            return Seq(tuple(n for n in map(strip, node.body) if n is not None))
        if isinstance(node, For):
            return dataclasses.replace(node, body=strip(node.body))
        if isinstance(node, If):
            then = strip(node.then)
            orelse = None if node.orelse is None else strip(node.orelse)
            if then is None and orelse is None:
                return None
            return If(node.cond, Seq(()) if then is None else then, orelse)
        return node

    out: dict[int, list[tuple]] = {}
    for reader, cond in frees:
        out.setdefault(reader, []).append((op, cond))
    return insert_frees(strip(ast), out, sdg)


def _sequences(node: Node) -> Seq:
    """``node`` as a ``Seq``, with every loop body and every branch in it one too: a gap and
    the place a store comes back are positions in a sequence (an output may come back at the
    program's end)."""
    if isinstance(node, For):
        node = dataclasses.replace(node, body=_sequences(node.body))
    elif isinstance(node, If):
        node = If(node.cond, _sequences(node.then),
                  None if node.orelse is None else _sequences(node.orelse))
    if isinstance(node, Seq):
        return Seq(tuple(n if isinstance(n, (Exec, Free, Offload, Fetch)) else
                         _unwrap(_sequences(n)) for n in node.body))
    return Seq((node,))


def _unwrap(s: Seq) -> Node:
    """A child of a sequence: a loop or branch made a sequence above goes back to itself."""
    return s.body[0] if len(s.body) == 1 and isinstance(s.body[0], (For, If)) else s


def _score(ast: Node, storages: dict, bounds: dict) -> tuple[int, int, int]:
    """What a move must lower: the simulated peak, then how many steps reach it (two phases
    at the same peak each need a move before it falls), then the bytes held over time."""
    _, timeline, _, _, peak, _ = simulate(ast, storages, bounds)
    return peak, timeline.count(peak), sum(timeline)


def meet_budget(schedule, memory: MemoryPlan, bounds: dict, budget: int):
    """(the schedule, its memory plan) with the moves that bring the predicted device peak of
    ``memory`` (a plan of ``schedule`` made under ``budget``) down to ``budget`` where they
    can: the same two when none is needed or none helps, else the schedule running the loop
    AST with the moves placed and its plan made again."""
    ast, chosen = place(schedule.ast, schedule, memory.storages, bounds, budget,
                        memory.peak_bytes)
    if not chosen:
        return schedule, memory
    schedule = schedule.with_ast(ast)
    return schedule, plan_memory(memory.sdg, schedule, bounds, memory.block, budget)


def place(ast: Node, schedule, storages: dict, bounds: dict, budget: int,
          peak: int) -> tuple[Node, list]:
    """The loop AST with early frees and offloads that bring the simulated device peak to
    ``budget`` if they can (largest store first, each kept only if it lowers the peak, or the
    steps at the peak), and the moves chosen (``(op, frees)`` for an early free, a ``Gap`` for
    an offload)."""
    if peak <= budget:
        return ast, []
    sdg = schedule.sdg
    ast = _sequences(ast)
    item = {i: s.bytes_for(tuple(bounds[Dim(d).bound.name] for d in s.dims))
            for i, s in storages.items()}
    chosen: list = []
    best, score = ast, _score(ast, storages, bounds)
    by_op = maps_by_op(schedule.order)
    least = (score[0] - budget) // SMALL
    for op in sorted((o for o in storages if item[o] >= least), key=lambda o: (-item[o], o)):
        frees = iteration_frees(sdg, by_op, schedule.domains, op)
        if not frees:
            continue
        trial = refree(best, op, frees, sdg)
        got = _score(trial, storages, bounds)
        if got < score:
            chosen, best, score = chosen + [(op, tuple(frees))], trial, got
            if score[0] <= budget:
                return best, chosen
    todo = sorted((g for g in gaps(best, sdg, set(storages)) if item[g.op] >= least),
                  key=lambda g: (-item[g.op], g.path))
    start, gapped = best, []
    while todo:  # passes until none helps: a phase at the same peak may need a later move first
        left = []
        for g in todo:
            trial = insert(start, gapped + [g])
            got = _score(trial, storages, bounds)
            if got[:2] < score[:2]:  # a copy that only lowers bytes away from the peak: no
                gapped, best, score = gapped + [g], trial, got
                if score[0] <= budget:
                    return best, chosen + gapped
            else:
                left.append(g)
        if len(left) == len(todo):
            break
        todo = left
    return best, chosen + gapped
