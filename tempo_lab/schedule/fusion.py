"""The fusion scheduler: a loop nest built from the program's structure, checked by isl.

isl's scheduler solves an integer linear program over every statement at once; it is exact,
but its cost grows steeply with the number of statements (a 300-op decoder did not finish in
five minutes). The nests tempo programs want are simpler: loops over their dims, the ops of a
recurrence in one loop, producers fused with their readers where the dependences allow. So
this builds them directly, level by level:

* at each level (the loops around it fixed), the ops form a graph of the dependences that hold
  at equal outer loop values; its strongly connected components (the recurrences) must share a
  loop, over a dim along which every dependence among them points one way (forwards, or
  backwards for a recurrence such as a gradient's ``t + 1``);
* the components are placed in a topological order, each joining the open loop when it has the
  loop's dim and every dependence from the loop's ops to it points the loop's way, else
  starting a new loop (over its outermost valid dim, in universe order) or standing alone;
* inside a loop the same is done with the dependences at distance 0 along it.

A component may also join the open loop *shifted*: when every dependence from the loop's ops to
it reaches a bounded number of points ahead along the loop (a TD(n) return reading the reward
``n`` steps on, a value at ``t + 1``), it runs that many iterations late (``t + s``), so it
still consumes each value in the loop that makes it instead of in a second loop after the
whole range. A shift is a constant found with isl from the dependences; a loop over a
``tl.until`` dim is never shifted (its end is known only when the condition holds).

The result is a "2d+1" schedule (``[beta0, +-d1, beta1, +-d2, ...]`` per op); isl checks that
it runs every producer instance before its readers and generates the loop AST from it. Where a
component has no valid dim (a wavefront a skewed schedule could run) this scheduler declines
and isl's scheduler is tried instead.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import islpy as isl

from ..ir.graph import sccs
from ..ir.ops import flag
from ..ir.sdg import SDG, index_functions, taken_views
from ..symbolic import Const, Dim, Slice
from ..symbolic import isl as I


class Declined(Exception):
    """No fused loop nest for this program: another scheduler must try."""


@dataclass
class Dep:
    """``src``'s instances run before ``dst``'s: ``rel`` holds the pairs (a set over
    ``s0..`` = ``src``'s dims and ``d0..`` = ``dst``'s, with the bounds as parameters);
    ``index`` is the read (one entry per ``src`` dim, over ``dst``'s dims) when known."""

    src: int
    dst: int
    rel: isl.Set
    index: tuple | None = None
    _signs: dict = field(default_factory=dict)


def dep_of_map(m: isl.Map, sdg: SDG, index=None) -> Dep:
    """A dependence map ``op<src>[...] -> op<dst>[...]`` as a ``Dep``."""
    src = int(m.get_tuple_name(isl.dim_type.in_)[2:])
    dst = int(m.get_tuple_name(isl.dim_type.out)[2:])
    rel = m.wrap().reset_tuple_id()
    ns, nd = m.dim(isl.dim_type.in_), m.dim(isl.dim_type.out)
    for k in range(ns):
        rel = rel.set_dim_name(isl.dim_type.set, k, f"s{k}")
    for k in range(nd):
        rel = rel.set_dim_name(isl.dim_type.set, ns + k, f"d{k}")
    return Dep(src, dst, rel, index)


class _Fusion:
    def __init__(self, sdg: SDG, live: set[int], deps: list[Dep]):
        self.sdg, self.live, self.deps = sdg, live, deps
        self.order = {d: k for k, d in enumerate(sdg.dims)}
        self.out: dict[int, list[Dep]] = {}
        for dep in deps:
            self.out.setdefault(dep.src, []).append(dep)
        # (op, dim) -> (direction, shift) of the loop over dim that runs op: point x of op runs
        # at loop time direction * x + shift
        self.placed: dict[tuple[int, str], tuple[int, int]] = {}
        self.unshifted = {d.name for d in sdg.dims if d.bound.name in sdg.untils}
        # placed with their readers: index functions, and the views taken of a value at one
        # (passes/vectorise.py gives each reader its own take of a layer's weights)
        self.cheap = index_functions(sdg)
        self.cheap |= taken_views(sdg, self.cheap)

    def _level_gap(self, dep: Dep, o: str) -> int:
        """The distance ``dst.o - src.o`` at which the two run at the same loop time."""
        w, s_dst = self.placed.get((dep.dst, o), (1, 0))
        _, s_src = self.placed.get((dep.src, o), (1, 0))
        return w * (s_src - s_dst)

    # -- dependence distances -------------------------------------------------------------
    def signs(self, dep: Dep, outer: tuple[str, ...], d: str | None) -> frozenset[int]:
        """The signs of ``dst.d - src.d`` over the pairs of ``dep`` whose outer loop values
        are equal (``d`` None: {0} if any such pair exists, else empty)."""
        key = (outer, d)
        if key not in dep._signs:
            dep._signs[key] = self._fast(dep, outer, d)
            if dep._signs[key] is None:
                dep._signs[key] = self._isl(dep, outer, d)
        return dep._signs[key]

    def _pos(self, op: int, name: str) -> int:
        return [x.name for x in self.sdg.ops[op].domain].index(name)

    def _fast(self, dep: Dep, outer, d):
        """From the read itself when each entry involved is the reader's dim plus a
        constant (most reads): exact, no isl."""
        if dep.index is None:
            return None
        for o in outer:
            c = self._shift(dep, o)
            if c is None:
                return None
            if c != self._level_gap(dep, o):
                return frozenset()  # never at equal outer loop times
        if d is None:
            return frozenset({0})
        c = self._shift(dep, d)
        return None if c is None else frozenset({(c > 0) - (c < 0)})

    def _shift(self, dep: Dep, name: str) -> int | None:
        """``dst.name - src.name`` when the read's entry is ``name`` plus a constant."""
        x = dep.index[self._pos(dep.src, name)]
        if isinstance(x, Slice):
            return None
        c = x - Dim(name)
        return -c.value if isinstance(c, Const) else None

    def _at_equal_times(self, dep: Dep, outer) -> isl.Set:
        """The pairs of ``dep`` that run at equal loop times of the ``outer`` loops."""
        rel = dep.rel
        affs = isl.affs_from_space(rel.get_space())
        for o in outer:
            gap = affs[0] + self._level_gap(dep, o)
            rel = rel & (affs[f"d{self._pos(dep.dst, o)}"]
                         - affs[f"s{self._pos(dep.src, o)}"]).eq_set(gap)
        return rel

    def least_distance(self, dep: Dep, outer, d: str, w: int) -> int | float | None:
        """The least ``w * (dst.d - src.d)`` over the pairs at equal outer loop times: None
        if there are none, ``-inf`` if it is unbounded (grows with a bound)."""
        if dep.index is not None and all(self._shift(dep, o) is not None for o in outer) \
                and self._shift(dep, d) is not None:
            if any(self._shift(dep, o) != self._level_gap(dep, o) for o in outer):
                return None
            return w * self._shift(dep, d)
        rel = self._at_equal_times(dep, outer)
        if rel.is_empty():
            return None
        hi, lo = f"d{self._pos(dep.dst, d)}", f"s{self._pos(dep.src, d)}"
        return I.least_gap(rel, hi, lo) if w > 0 else I.least_gap(rel, lo, hi)

    def _isl(self, dep: Dep, outer, d) -> frozenset[int]:
        rel = self._at_equal_times(dep, outer)
        affs = isl.affs_from_space(rel.get_space())

        def s(name):
            return affs[f"s{self._pos(dep.src, name)}"]

        def t(name):
            return affs[f"d{self._pos(dep.dst, name)}"]

        if rel.is_empty():
            return frozenset()
        if d is None:
            return frozenset({0})
        out = set()
        diff = t(d) - s(d)
        for sign, part in ((-1, diff.lt_set(affs[0])), (0, diff.eq_set(affs[0])),
                           (1, diff.gt_set(affs[0]))):
            if not (rel & part).is_empty():
                out.add(sign)
        return frozenset(out)

    # -- one level ------------------------------------------------------------------------
    def remaining(self, op: int, outer) -> list[str]:
        return [x.name for x in self.sdg.ops[op].domain if x.name not in outer]

    def level(self, ops: list[int], outer: tuple[str, ...], dirs: tuple[int, ...]) -> list:
        """The items of one level: ``("op", i)`` or ``("loop", dim, direction, items)``."""
        members = set(ops)
        succ: dict[int, list[Dep]] = {i: [] for i in ops}
        for i in ops:
            for dep in self.out.get(i, ()):
                if dep.dst in members and self.signs(dep, outer, None):
                    succ[i].append(dep)
        into: dict[int, list[Dep]] = {i: [] for i in ops}  # the same dependences, by reader
        for i in ops:
            for dep in succ[i]:
                into[dep.dst].append(dep)
        comps = sccs(sorted(ops), {i: [dp.dst for dp in succ[i]] for i in ops})
        comp_of = {i: k for k, c in enumerate(comps) for i in c}
        preds: dict[int, set[int]] = {k: set() for k in range(len(comps))}
        after: dict[int, set[int]] = {k: set() for k in range(len(comps))}
        for i in ops:
            for dep in succ[i]:
                a, b = comp_of[i], comp_of[dep.dst]
                if a != b:
                    preds[b].add(a)
                    after[a].add(b)
        waiting = {k: len(p) for k, p in preds.items()}  # predecessors not yet placed
        ways = [self._ways(c, succ, comp_of, k, outer) for k, c in enumerate(comps)]
        items: list = []
        loop = None  # [dim, direction, ops, {op: shift}] of the open loop
        ready = sorted((k for k in range(len(comps)) if not preds[k]), key=lambda k: comps[k][0])
        in_loop: set[int] = set()  # components in the open loop
        cheap = {k for k, c in enumerate(comps) if all(i in self.cheap for i in c)}
        readers: dict[int, set[int]] = {}

        def read_by(k) -> set[int]:
            """The components that read ``k``, through index functions."""
            if k not in readers:
                readers[k] = set().union(*(read_by(j) if j in cheap else {j}
                                           for j in after[k]))
            return readers[k]

        def best(k):
            """The loop ``k`` starts: its outermost valid one, or for index functions the
            one most of their readers can join."""
            if k in cheap:
                return _best(ways, k, read_by(k))
            return ways[k][0] if ways[k] else None

        def elsewhere(k) -> bool:
            """An index-function component whose readers cannot run in the open loop: it
            starts their loop instead of joining this one (or being stored for it)."""
            if not loop or k not in cheap:
                return False
            return best(k) not in (None, tuple(loop[:2])) and not any(
                tuple(loop[:2]) in ways[j] for j in read_by(k))

        while ready:
            pick, shift = None, 0
            for k in (ready if loop else ()):
                shift = None if elsewhere(k) else self._joins(loop, comps[k], ways[k], into,
                                                              outer)
                if shift is not None:
                    pick = k
                    break
            if pick is not None:
                loop[2].extend(comps[pick])
                loop[3].update(dict.fromkeys(comps[pick], shift))
                in_loop.add(pick)
            else:
                # one that does not need the open loop runs before it (hoisted), which keeps
                # the loop open for the ops after; else the loop closes here
                pick = next((k for k in ready if not preds[k] & in_loop), ready[0])
                if loop and (preds[pick] & in_loop or elsewhere(pick)):
                    items.append(("loop", *loop))
                    loop, in_loop = None, set()
                comp = comps[pick]
                way = best(pick)
                if way and loop is None:
                    loop, in_loop = [*way, list(comp), dict.fromkeys(comp, 0)], {pick}
                elif way:  # another loop, independent of the open one: before it
                    items.append(("loop", *way, list(comp), dict.fromkeys(comp, 0)))
                elif len(comp) > 1 or self.remaining(comp[0], outer) \
                        or any(dep.dst == comp[0] for dep in succ[comp[0]]):
                    raise Declined(f"no loop over one dim runs the recurrence of "
                                   f"{', '.join(self.sdg.ops[i].label for i in comp)}")
                else:
                    items.append(("op", comp[0]))
            ready.remove(pick)
            for k in after[pick]:
                waiting[k] -= 1
                if not waiting[k]:
                    bisect.insort(ready, k, key=lambda k: comps[k][0])
        if loop:
            items.append(("loop", *loop))
        items = self._sink(items, outer)
        return [it if it[0] == "op" else self._loop(it, outer, dirs) for it in items]

    def _sink(self, items: list, outer) -> list:
        """Each item moves down to the first later item that reads it, as late as no item in
        between reads it: a loop joins that item when it is a loop over the same dim and
        direction whose points it reaches no later than they read it (its values are then
        made in the iteration that reads them, not all before), an op (no effect) runs just
        before it. Values are then held from where they are needed, not from where they
        could first be made: PPO's minibatches were all taken before the first update, and
        the first update's Adam moments were made before the rollout; a budgeted PPO's peak
        held them all."""
        here = {i for it in items for i in _members(it)}
        k = len(items) - 1
        while k >= 0:
            a = items[k]
            readers = self._readers(a, here, outer)
            b = next((j for j in range(k + 1, len(items))
                      if not readers.isdisjoint(_members(items[j]))), None)
            turned = None
            if b is not None and a[0] == "loop" and items[b][0] == "loop" \
                    and items[b][1] == a[1]:
                turned = a if items[b][2] == a[2] else self._turned(a, outer)
            if turned is not None and self._ahead(turned, items[b], outer):
                _, d, w, ops, shifts = items[b]
                items[b] = ("loop", d, w, a[3] + ops, {**shifts, **a[4]})
                del items[k]
            elif b is not None and a[0] == "op" and b > k + 1 \
                    and not flag(self.sdg.ops[a[1]].kind, "effect"):
                items.insert(b - 1, items.pop(k))
            k -= 1
        return items

    def _turned(self, loop, outer):
        """``loop`` running the other way along its dim, where no value it makes is read by
        its own ops at another point of the dim (each point stands alone: a per-point view of
        a batched value, which can then join the reversed loop that reads it, as PPO's
        advantage recursion does, instead of a loop of its own); else None."""
        _, d, w, ops, shifts = loop
        mine = set(ops)
        for i in ops:
            for dep in self.out.get(i, ()):
                if dep.dst in mine and self.signs(dep, outer, d) - {0}:
                    return None
        return ("loop", d, -w, ops, shifts)

    def _readers(self, item, here: set[int], outer) -> set[int]:
        """The ops of this level (``here``) that read a value of ``item``'s ops at equal outer
        loop times."""
        return {dep.dst for i in _members(item) for dep in self.out.get(i, ())
                if dep.dst in here and self.signs(dep, outer, None)}

    def _ahead(self, loop, other, outer) -> bool:
        """Whether every point ``loop``'s ops make runs no later in ``other``'s loop than the
        points of ``other`` that read it (both unshifted)."""
        _, d, w, ops, shifts = loop
        if any(shifts.values()) or any(other[4].values()):
            return False
        mine = set(other[3])
        for i in ops:
            for dep in self.out.get(i, ()):
                if dep.dst in mine:
                    least = self.least_distance(dep, outer, d, w)
                    if least is not None and not least >= 0:
                        return False
        return True

    def _loop(self, item, outer, dirs):
        """A loop item with its body's levels, once its ops' shifts are fixed."""
        _, d, w, ops, shifts = item
        for i in ops:
            self.placed[(i, d)] = (w, shifts[i])
        return ("loop", d, w, self.level(ops, outer + (d,), dirs + (w,)), shifts)

    def _ways(self, comp, succ, comp_of, k, outer) -> list[tuple[str, int]]:
        """The (dim, direction) loops a component may run in, best first: dims every op of it
        has (universe order, forwards first), along which its inner dependences all point the
        loop's way."""
        common = [d for d in self.remaining(comp[0], outer)
                  if all(d in self.remaining(i, outer) for i in comp[1:])]
        inner = [dep for i in comp for dep in succ[i] if comp_of[dep.dst] == k]
        out = []
        for d in sorted(common, key=lambda n: self.order[Dim(n)]):
            signs = set().union(*(self.signs(dep, outer, d) for dep in inner))
            out += [(d, w) for w in (1, -1) if -w not in signs]
        return out

    def _joins(self, loop, comp, ways, into, outer) -> int | None:
        """The shift at which a component may run in the open loop, or None: it can run in
        such a loop, and every dependence from the loop's ops to it reaches a bounded number
        of points ahead along the loop (none, for a ``tl.until`` loop)."""
        d, w, _, shifts = loop
        if (d, w) not in ways:
            return None
        shift = 0
        for i in comp:
            for dep in into[i]:
                if dep.src not in shifts:
                    continue
                least = self.least_distance(dep, outer, d, w)
                if least is not None:
                    shift = max(shift, shifts[dep.src] - least)
        if shift == math.inf or (shift and d in self.unshifted):
            return None
        return shift


def _best(ways: list, k: int, successors) -> tuple | None:
    """Of the loops component ``k`` may run in, the first that the most of ``successors`` may
    run in too, so they can join it (an index table over (n, t) read in a decode's loop over
    t starts a loop over t, not over the layers)."""
    if not ways[k]:
        return None
    return max(ways[k], key=lambda w: sum(w in ways[j] for j in successors))


def fusion_schedule(sdg: SDG, domains: dict[int, isl.Set], deps: list[Dep]):
    """The fused loop nest of every op with demanded points, as an isl schedule tree: a
    sequence node per level, a band node (one member: the loop's dim, negated for a loop that
    runs backwards, plus the op's shift) per loop (``Declined`` if no such nest exists); and
    ``{(op, dim): (direction, shift)}`` of every op in a loop."""
    live = {i for i, d in domains.items() if not d.is_empty()}
    f = _Fusion(sdg, live, [dep for dep in deps if dep.src in live and dep.dst in live])
    items = f.level(sorted(live), (), ())
    dom = I.union_of([domains[i] for i in sorted(live)])
    node = isl.Schedule.from_domain(dom).get_root().child(0)
    return _insert(node, items, sdg, domains).get_schedule(), dict(f.placed)


def _members(item) -> list[int]:
    """The ops of an item of a level before its loop's body is built."""
    return [item[1]] if item[0] == "op" else list(item[3])


def _ops_of(item) -> list[int]:
    return [item[1]] if item[0] == "op" else [i for it in item[3] for i in _ops_of(it)]


def _insert(node, items, sdg: SDG, domains):
    """Put ``items`` below ``node`` (a leaf); returns a node of the same tree."""
    if len(items) > 1:
        filters = isl.UnionSetList.alloc(I.CTX, len(items))
        for it in items:
            filters = filters.add(I.union_of([domains[i] for i in _ops_of(it)]))
        node = node.insert_sequence(filters)
        for k, it in enumerate(items):
            node = _insert(node.child(k).child(0), [it], sdg, domains).parent().parent()
        return node
    it = items[0]
    if it[0] == "op":
        return node
    _, d, w, body, shifts = it
    member = None
    for i in _ops_of(it):
        names = [f"x{k}" for k in range(len(sdg.ops[i].domain))]
        k = [x.name for x in sdg.ops[i].domain].index(d)
        m = isl.Map(f"[{', '.join(sdg.params)}] -> {{ op{i}[{', '.join(names)}] -> "
                    f"[{'-' if w < 0 else ''}x{k} + {shifts[i]}] }}", context=I.CTX)
        m = isl.UnionMap.from_map(m.intersect_domain(domains[i]))
        member = m if member is None else member.union(m)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(member))
    return _insert(node.child(0), body, sdg, domains).parent()


def check(schedule: isl.UnionMap, deps: list[isl.Map]) -> bool:
    """Whether ``schedule`` runs every dependence's source before its sink (checked one
    dependence at a time, each through its two statements' part of the schedule: isl's cost
    then follows the program's size, not its square)."""
    by_op = {m.get_tuple_name(isl.dim_type.in_): m
             for m in (schedule.get_map_list().get_at(k)
                       for k in range(schedule.get_map_list().n_map()))}
    depth = next(iter(by_op.values())).dim(isl.dim_type.out) if by_op else 0
    sp = isl.Space.create_from_names(I.CTX, set=[f"c{k}" for k in range(depth)],
                                     params=schedule.get_space().get_var_names(
                                         isl.dim_type.param))
    ge = isl.Map.lex_ge(sp)
    for m in deps:
        src = by_op[m.get_tuple_name(isl.dim_type.in_)]
        dst = by_op[m.get_tuple_name(isl.dim_type.out)]
        pairs = m.apply_domain(src).apply_range(dst)
        pairs, g = pairs.align_params(ge.get_space()), ge.align_params(pairs.get_space())
        if not (pairs & g).is_empty():
            return False
    return True
