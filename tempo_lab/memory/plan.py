"""Storage per tensor from its readers, checked against the schedule with isl.

Every stored op gets a buffer with one axis per domain dim. Along a dim the buffer is either a
*ring* of W slots (point index ``p mod W``; W = 1 is a point store) or *grows* in fixed-size
blocks as the computation reaches further (a block store, for ``0:t+1`` and constant slices).
W comes from the reads (``t - 2`` needs 3 slots, a window of 4 needs 4) and is accepted only if
isl proves that no slot is overwritten while a reader still needs it; otherwise that dim grows.
Outputs grow along every dim (all points are returned); values nobody reads get no storage.
"""
from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from functools import partial

import islpy as isl
import numpy as np

from ..cache import LRU
from ..ir.sdg import SDG, Op
from ..schedule import canon
from ..stage import Stage
from ..symbolic import Const, Dim, Expr, Slice
from ..symbolic import isl as I
from ..symbolic.expr import MinMax
from ..symbolic.sizes import const_cap, pad, size_class, store_extent
from .liveness import with_frees
from .simulate import simulate

SCHEMA = "tempo_lab.memory/1"


@dataclass(frozen=True)
class Storage:
    op: int
    dims: tuple[str, ...]
    slots: tuple[int | None, ...]  # per dim: ring size W, or None for a growing (block) axis
    spatial: tuple[int, ...]       # padded static spatial shape
    dtype: np.dtype
    blocks: tuple[int, ...]        # per dim: points per block of a growing axis

    @property
    def kind(self) -> str:
        if any(s is None for s in self.slots):
            return "block"
        return "ring" if any(s > 1 for s in self.slots) else "point"

    @property
    def item_bytes(self) -> int:
        return math.prod(self.spatial) * self.dtype.itemsize  # not np.prod: called per step

    def bytes_for(self, extents: tuple[int, ...]) -> int:
        """Bytes of the buffer once the growing axes reach ``extents`` (blocks, rounded up)."""
        n = 1
        for s, x, b in zip(self.slots, extents, self.blocks):
            n *= s if s is not None else -(-x // b) * b
        return n * self.item_bytes

    def allocated(self, k: int, bound: int) -> int:
        """Points a growing axis ``k`` holds for the whole run when its dim's bound is
        ``bound`` (a static allocation): one block if the bound fits, else whole blocks up to
        the bound's size class."""
        b = self.blocks[k]
        return b if bound <= b else -(-size_class(bound) // b) * b

    def describe(self) -> str:
        axes = [f"{d}:{'blocks of ' + str(b) if s is None else s}"
                for d, s, b in zip(self.dims, self.slots, self.blocks)]
        return (f"{self.kind} [{', '.join(axes)}] x {self.dtype.name}{list(self.spatial)}")


class MemoryPlan(Stage):
    """Storage per op, buffer lifetimes (schedule steps) and predicted live bytes over the
    schedule: ``timeline[k]`` is the bytes live after step ``steps[k]`` (every step of a short
    run; the steps of the iterations simulated, for a long one: see ``simulate.py``), of
    ``n_steps`` in all; ``peak_bytes`` is exact either way."""

    def __init__(self, sdg: SDG, storages: dict[int, Storage], timeline: list[int],
                 lifetimes: dict[int, tuple[int, int]], grown: tuple[int, ...] = (),
                 steps: list[int] | None = None, n_steps: int | None = None,
                 peak: int | None = None, offloaded_bytes: int = 0, budget: int | None = None,
                 block: int = 64):
        self.sdg, self.storages, self.timeline, self.lifetimes = (sdg, storages, timeline,
                                                                  lifetimes)
        self.grown = grown  # ops with a window reader whose ring this schedule makes grow
        self.steps = list(range(len(timeline))) if steps is None else steps
        self.n_steps = len(timeline) if n_steps is None else n_steps
        self._peak = max(timeline, default=0) if peak is None else peak
        self.offloaded_bytes = offloaded_bytes  # the most held on the host at once (offload)
        self.budget = budget  # the device memory budget it was planned under, or None
        self.block = block  # the points a growing store grows by (CompileConfig.block_size)

    @property
    def peak_bytes(self) -> int:
        return self._peak

    @property
    def sized_for_max(self) -> list[str]:
        """The ``tl.until`` bounds (and ragged bounds that end by a condition) the plan is
        sized for the ``max`` of: a run may end long before and hold far less."""
        return sorted({*self.sdg.untils, *(b for b, r in self.sdg.ragged.items()
                                           if r.done is not None)})

    def store_bytes(self, bounds) -> dict[int, int]:
        """Each store's bytes once it holds every point at ``bounds`` (a growing axis at its
        bound's value, a ring at its slots): what makes the peak, store by store."""
        return {i: s.bytes_for(tuple(bounds.get(d.bound.name, 1)
                                     for d in self.sdg.ops[i].domain))
                for i, s in self.storages.items()}

    @property
    def sampled(self) -> bool:
        """Whether the timeline holds a sample of the steps rather than every one."""
        return len(self.timeline) < self.n_steps

    def __repr__(self) -> str:
        kinds = {}
        for s in self.storages.values():
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        k = ", ".join(f"{n}={c}" for n, c in sorted(kinds.items()))
        return (f"MemoryPlan(stores={len(self.storages)} ({k}), peak_bytes={self.peak_bytes}, "
                f"steps={self.n_steps})")

    def _sections(self):
        lines = []
        for i, s in self.storages.items():
            a, b = self.lifetimes.get(i, (0, 0))
            lines.append(f"{self.sdg.ops[i].label}: {s.describe()}, live steps {a}..{b}")
        peak_at = self.steps[self.timeline.index(self.peak_bytes)] if self.timeline else 0
        sample = ([f"timeline: {len(self.timeline)} of the {self.n_steps} steps (the first and "
                   "last iterations of each stretch of a long loop; the peak is exact)"]
                  if self.sampled else [])
        host = ([f"offloaded: up to {self.offloaded_bytes} bytes on the host at once (the "
                 "timeline counts device bytes)"] if self.offloaded_bytes else [])
        untils = self.sized_for_max
        if untils:
            host.append(f"sized for the max of tl.until bound {', '.join(untils)}: a run that "
                        "ends earlier holds these stores whole on xla (allocated for the run); "
                        "codegen and the interpreter allocate a block when a step reaches it")
        if self.budget is not None:
            host.append(f"device budget {self.budget}: " + (
                "met" if self.peak_bytes <= self.budget else
                f"above it by {self.peak_bytes - self.budget} bytes (what is live at the peak "
                "is read there or has no idle stretch to spend on the host)"))
        return [("stores", lines),
                ("bytes", [f"peak {self.peak_bytes} at step {peak_at} of {self.n_steps}",
                           f"final {self.timeline[-1] if self.timeline else 0}", *sample,
                           *host])]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "peak_bytes": self.peak_bytes, "steps": self.n_steps,
                "offloaded_bytes": self.offloaded_bytes, "budget": self.budget,
                "timeline": {"steps": list(self.steps), "bytes": list(self.timeline)},
                "stores": [{"op": i, "kind": s.kind, "dims": list(s.dims),
                            "slots": list(s.slots), "spatial": list(s.spatial),
                            "dtype": s.dtype.name, "blocks": list(s.blocks),
                            "lifetime": list(self.lifetimes.get(i, (0, 0)))}
                           for i, s in self.storages.items()]}


# -- choosing slots ---------------------------------------------------------------------------
def _offset(x: Expr, d: Dim) -> int | None:
    """How far ``x`` reads from ``d``: ``t - 2`` -> -2; a clamped ``max(0, t - 2)`` or
    ``min(t + 1, T - 1)`` counts by its unclamped argument (the clamp only moves reads inward)."""
    if isinstance(x, MinMax):
        offs = [o for o in (_offset(a, d) for a in x.args) if o is not None]
        return max(offs, key=abs) if offs else None
    diff = x - d
    return diff.value if isinstance(diff, Const) else None


def _wanted_slots(sdg: SDG, op: Op, k: int, lag=lambda e, d: 0) -> int | None:
    """Ring size along the op's k-th dim that its readers' index patterns call for: the span
    of offsets they read relative to the point being written (``t - 2`` needs 3 slots, a window
    ``max(0, t - 3):t + 1`` needs 4; a reader the schedule runs ``lag`` points late reads
    ``lag`` further back; a read after the loop at ``T - 2`` needs the last 2), or None when
    a read is not within a constant distance."""
    d = op.domain[k]
    lo = hi = last = 0
    for e in sdg.out_edges(op.id):
        x = e.index[k]
        back = lag(e, d)
        if isinstance(x, Slice):
            cap, a, b = const_cap(x.length), _offset(x.start, d), _offset(x.stop, d)
            if a is None and (b is None or cap is None):
                return None
            first = a if a is not None else b - cap
            last = b - 1 if b is not None else (a + cap - 1 if cap is not None else None)
            if last is None:
                return None
            lo, hi = min(lo, first - back), max(hi, last - back)
        else:
            o = _offset(x, d)
            if o is not None:
                lo, hi = min(lo, o - back), max(hi, o - back)
            elif d not in sdg.ops[e.dst].domain:
                last = max(last, _from_end(x, d) or 0)
    return max(hi - lo + 1, last)


def _from_end(x: Expr, d: Dim) -> int | None:
    """How many of ``d``'s last points a read at ``x`` after its loop reaches back
    (``T - 2``: 2, the last two must still be held), None when not a constant count."""
    diff = d.bound - x
    return diff.value if isinstance(diff, Const) and diff.value > 0 else None


def _window(x, d: Dim) -> bool:
    """A slice that starts a constant distance from ``d`` (``max(0, t - 3):t + 1``)."""
    return isinstance(x, Slice) and _offset(x.start, d) is not None


def _conflicts(op: Op, slots, dom: isl.Set, readers: isl.UnionMap, smap: isl.UnionMap) -> bool:
    """Would a ring of ``slots`` lose a value before its last read (per the schedule)?"""
    n = len(op.domain)
    if n == 0 or all(s is None for s in slots):
        return False
    ps = [f"p{k}" for k in range(n)]
    qs = [f"q{k}" for k in range(n)]
    ks = [f"k{k}" for k in range(n)]
    cons = [f"{q} = {p}" if s is None else f"{q} = {p} + {s}*{kk}"
            for p, q, kk, s in zip(ps, qs, ks, slots)]
    params = ", ".join(dom.get_space().get_var_names(isl.dim_type.param))
    name = dom.get_tuple_name()
    txt = (f"[{params}] -> {{ {name}[{', '.join(ps)}] -> {name}[{', '.join(qs)}] : "
           f"exists ({', '.join(ks)} : {' and '.join(cons)}) }}")
    same_slot = isl.Map(txt).intersect_domain(dom).intersect_range(dom)
    same_slot = same_slot - isl.Map.identity(same_slot.get_space())
    s_p = smap.intersect_domain(isl.UnionSet.from_set(dom))
    later = isl.UnionMap.from_map(same_slot).intersect(s_p.lex_lt_union_map(s_p))
    s_r = smap.intersect_domain(readers.domain())
    overwritten = readers.apply_range(later).intersect(s_r.lex_gt_union_map(s_p))
    return not overwritten.is_empty()


_CONFLICTS = LRU(8192)


def _grow(slots: tuple, j: int) -> tuple:
    """``slots`` with dim ``j`` growing (a block axis) instead of a ring."""
    return tuple(None if k == j else s for k, s in enumerate(slots))


def plan_memory(sdg: SDG, schedule, bounds: dict[str, int], block: int = 64,
                budget: int | None = None) -> MemoryPlan:
    """The stores of ``schedule`` (its frees added first where it has none: a schedule made
    by ``schedule_sdg``) for these bounds, simulated in bytes. ``block``: the points a growing
    store grows by; ``budget``: the device memory budget the plan is made under (None: none),
    which the plan reports against (placing offloads to meet it is ``offload.meet_budget``)."""
    schedule = with_frees(sdg, schedule)
    order = I.fix(schedule.order, bounds)
    by_op = {int(m.get_tuple_name(isl.dim_type.in_)[2:]): m for m in I.maps_of(order)}
    keys = canon.Keys(by_op)
    domains = {i: I.fix(d, bounds) for i, d in schedule.domains.items()}
    early = _early_points(sdg, schedule, domains, bounds)
    storages: dict[int, Storage] = {}
    grown = []
    for i, op in sdg.ops.items():
        readers = [e for e in sdg.out_edges(i)
                   if not domains[e.dst].is_empty() or e.dst in early]
        kept = i in sdg.outputs.values() or i in sdg.untils.values()
        # an array's points are the user's array, there anyway: a ring of them copies each
        # point out of it (every layer's weights a second time) and saves nothing
        kept = kept or (op.kind == "from_array" and len(op.domain) > 0)
        if (domains[i].is_empty() and i not in early) or op.kind == "sink" or (
                not readers and not kept):
            continue
        if i in early:  # held whole: its points are not there at these bounds to size rings
            storages[i] = _storage(op, (None,) * len(op.domain), early[i], bounds, block,
                                   free=_ends(sdg))
            continue
        if kept:  # every point is returned (or checked when its dim may end)
            slots = (None,) * len(op.domain)
        else:
            slots = tuple(_wanted_slots(sdg, op, k, lambda e, d: schedule.lag(e.dst, e.src,
                                                                                d.name))
                          for k in range(len(op.domain)))
            rmap = None
            for e in readers:
                m = isl.UnionMap.from_map(I.fix(sdg.isl_map(e), bounds)
                                          .intersect_domain(domains[e.dst]))
                rmap = m if rmap is None else rmap.union(m)
            wanted = slots
            # only this op's and its readers' part of the schedule: isl's cost follows it
            involved = {i} | {e.dst for e in readers}
            smap = I.union_of([by_op[k] for k in involved if k in by_op])
            found = keys.key(involved, [domains[i], rmap])

            def conflicts(slots, op=op, i=i, rmap=rmap, smap=smap):
                return _conflicts(op, slots, domains[i], rmap, smap)

            def clash(slots, conflicts=conflicts, found=found):
                return (conflicts(slots) if found is None else  # another layer's answer
                        _CONFLICTS.get((found[0], slots), partial(conflicts, slots)))

            for _ in range(len(slots) + 1):
                if not clash(slots):
                    break
                rings = [j for j, s in enumerate(slots) if s is not None]
                # a point slot is given up first when that alone is enough: a window's ring
                # is what keeps a store from growing (a window's keys over (n, t) with the
                # layer loop inside the step loop: a block over n, a ring over t)
                slots = next((c for c in (_grow(slots, j) for j in rings if slots[j] == 1
                                          and j != rings[-1]) if not clash(c)),
                             _grow(slots, rings[-1]))
            # a recurrence over several dims (parameters updated over (i, e, m)) reads its last
            # point along an outer dim at the end of the inner one: a ring per dim holds the
            # product of their sizes, where one slot along an outer dim often does (the check
            # against the schedule decides), outermost first
            # (the innermost too: a value whose every read of the previous point comes before
            # the next point is written is updated in place, as an optimiser's parameters are)
            for j in range(len(slots)):
                if slots[j] is not None and slots[j] > 1:
                    fewer = slots[:j] + (1,) + slots[j + 1:]
                    if not clash(fewer):
                        slots = fewer
            if any(w is not None and s is None and any(_window(e.index[k], op.domain[k])
                                                       for e in readers)
                   for k, (w, s) in enumerate(zip(wanted, slots))):
                grown.append(i)
        storages[i] = _storage(op, slots, domains[i], bounds, block)
    return _simulated(sdg, storages, schedule, bounds, tuple(grown), block, budget)


def _early_points(sdg: SDG, schedule, domains: dict, bounds: dict[str, int]) -> dict:
    """The ops with no point at ``bounds`` that have points where a ``tl.until`` loop (or a
    ragged bound ended by a condition) stops before its ``max``: their points there, for any
    such end (the end a parameter from 1 to its ``max``: a shape it gives, ``x[t:T]``'s,
    is sized for the largest). The plan is made at the ``max``; without these, a
    placeholder's branch taken only when a loop ends early (the gradient of ``x[t + 2]``
    is zeros where ``T <= 2``) had no store, and its statement was left out: the executors
    stopped with "no branch holds" where the loop did end early."""
    ends = _ends(sdg)
    if not ends:
        return {}
    rest = {k: v for k, v in bounds.items() if k not in ends}
    out = {}
    for i, d in domains.items():
        if not d.is_empty():
            continue
        d = I.fix(schedule.domains[i], rest)
        names = d.get_space().get_var_names(isl.dim_type.param)
        moved = [b for b in ends if b in names]
        if not moved:
            continue
        d = d.intersect_params(isl.Set(f"[{', '.join(names)}] -> {{ : "
                                       + " and ".join(f"1 <= {b} <= {bounds[b]}" for b in moved)
                                       + " }"))
        if not d.is_empty():
            out[i] = d
    return out


def _ends(sdg: SDG) -> set[str]:
    """The bounds a condition ends: ``tl.until`` ones, and ragged ones ended by a condition."""
    return {*sdg.untils, *(b for b, r in sdg.ragged.items() if r.done is not None)}


def _storage(op: Op, slots: tuple, domain, bounds: dict[str, int], block: int,
             free: Collection[str] = ()) -> Storage:
    """``op``'s store for ``slots`` (per dim: a ring of that many points, or None: it grows)
    at ``bounds``: spatial extents padded to their size class (their largest over the
    ``free`` bounds' values that ``domain`` allows: where a loop may end), growth in blocks."""
    fixed = {k: v for k, v in bounds.items() if k not in free}
    spatial = tuple(x if isinstance(x, int) else pad(x, I.max_over(x, domain, op.domain, fixed))
                    for x in op.type.shape)
    # The innermost growing dim grows in blocks of ``block`` points whatever its bound
    # beyond one block, so buffer shapes (and so compiled kernels) do not depend on that
    # bound; a bound that fits in one block takes one block of its store extent (two
    # layers' weights are not stored as 64). Outer growing dims take their store extent,
    # so a (b, t) store is not block x block.
    growing = [k for k, w in enumerate(slots) if w is None]
    blocks = tuple(min(block, store_extent(bounds[d.bound.name]))
                   if growing and k == growing[-1] else
                   store_extent(bounds[d.bound.name]) for k, d in enumerate(op.domain))
    return Storage(op.id, tuple(d.name for d in op.domain), slots, spatial, op.type.dtype,
                   blocks)


def _simulated(sdg, storages, schedule, bounds, grown, block, budget) -> MemoryPlan:
    steps, timeline, lifetimes, n_steps, peak, host = simulate(schedule.ast, storages, bounds)
    return MemoryPlan(sdg, storages, timeline, lifetimes, grown, steps, n_steps, peak, host,
                      budget, block)


def replan(memory: MemoryPlan, schedule, bounds: dict[str, int]) -> MemoryPlan:
    """``memory`` at other bound values without compiling again: the same store kinds and ring
    sizes, extents and growth taken at ``bounds``, the schedule simulated there. An estimate:
    a compile at those bounds checks ring sizes against them and may choose others."""
    domains = {i: I.fix(d, bounds) for i, d in schedule.domains.items()}
    storages = {i: _storage(memory.sdg.ops[i], st.slots, domains[i], bounds, memory.block)
                for i, st in memory.storages.items()}
    return _simulated(memory.sdg, storages, schedule, bounds, memory.grown, memory.block,
                      memory.budget)
