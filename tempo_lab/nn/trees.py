"""Many trees evaluated level by level: every node placed on a grid of steps × slots.

A recursion over a data-given tree (a TreeLSTM: each node's state from its children's) batches
across nodes whose children are all done. ``tree_levels`` lays out the nodes of every tree in a
batch on ``steps × width`` slots so that a node's children sit at earlier steps. A program then
runs over two dims, the step ``s`` (a loop) and the slot ``k`` (batched): each slot gathers its
children's states from the steps before with ``tl.take(state[0:s, 0:W], (child_step,
child_slot))``, so the number of sequential steps is the trees' height, not their size.

The layout is Hu's highest-level-first list schedule: at each step, of the nodes whose
children are done, those farthest from their root go first, at most ``width`` of them. For
trees (each node read by one parent) and unit work per node it takes the fewest steps any
schedule with ``width`` slots can (Hu, 1961). With no ``width`` given, the width is chosen to
minimise an *estimate* of the time, ``steps × (width + STEP_COST)``: a step's own cost counted
as ``STEP_COST`` nodes' work.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError

STEP_COST = 32  # a step's fixed cost (loop control, launches) in nodes' work: an estimate


@dataclass(frozen=True, eq=False)
class TreeLevels:
    """The layout of a batch of trees on ``steps × width`` slots (see the module docstring).

    ``step[b, n]``, ``slot[b, n]``: where node ``n`` of tree ``b`` runs (-1 past the tree's
    length). ``child_step``, ``child_slot``: ``(steps, width, arity)``, where each slot's
    children ran (0 where there is none); ``has_child``: whether that child exists (all False
    for a leaf and for an empty slot); ``used``: ``(steps, width)``, whether a node runs there.
    """

    step: np.ndarray
    slot: np.ndarray
    child_step: np.ndarray
    child_slot: np.ndarray
    has_child: np.ndarray
    used: np.ndarray

    @property
    def steps(self) -> int:
        return self.used.shape[0]

    @property
    def width(self) -> int:
        return self.used.shape[1]

    @property
    def useful_fraction(self) -> float:
        """Nodes over slots: the share of the batched work that is real."""
        return float(self.used.mean())

    def place(self, per_node) -> np.ndarray:
        """``(trees, nodes, ...)`` values per node (a node's input) on the grid: ``(steps,
        width, ...)``, zeros in empty slots."""
        a = np.asarray(per_node)
        if a.shape[:2] != self.step.shape:
            raise ArgumentError(f"TreeLevels.place takes values of shape (trees, nodes, ...) = "
                                f"{self.step.shape + ('...',)}, got {a.shape}; pass one value "
                                f"per node of each tree, padded past its length")
        out = np.zeros((self.steps, self.width) + a.shape[2:], a.dtype)
        real = self.step >= 0
        out[self.step[real], self.slot[real]] = a[real]
        return out

    def __repr__(self) -> str:
        return (f"TreeLevels({self.step.shape[0]} trees, {int(self.used.sum())} nodes on "
                f"{self.steps} steps x {self.width} slots, "
                f"{self.useful_fraction:.0%} used)")


def tree_levels(children, lengths=None, width: int | None = None) -> TreeLevels:
    """Lay out a batch of trees level by level (see the module docstring).

    ``children``: ``(trees, nodes, arity)`` integers, each node's children as indices of nodes
    of the same tree, -1 for none (a leaf has none). ``lengths``: each tree's number of nodes
    (default: all ``nodes``); entries past it are ignored. ``width``: slots per step (default:
    chosen from the estimate in the module docstring)."""
    kids = np.asarray(children)
    if kids.ndim == 2:
        kids = kids[..., None]
    if kids.ndim != 3 or not np.issubdtype(kids.dtype, np.integer):
        raise ArgumentError(f"tree_levels takes children as integers of shape (trees, nodes, "
                            f"arity), -1 for no child; got {kids.dtype.name} {kids.shape}")
    trees, nodes, _ = kids.shape
    lens = np.full(trees, nodes) if lengths is None else np.asarray(lengths)
    if lens.shape != (trees,) or not np.issubdtype(lens.dtype, np.integer) \
            or (lens < 0).any() or (lens > nodes).any():
        raise ArgumentError(f"tree_levels: lengths must be {trees} integer counts in "
                            f"0..{nodes}, got {lens.tolist()}")
    parent, label = _parents(kids, lens), {}
    for b in range(trees):
        for n in _top_down(kids, parent, b, int(lens[b])):
            up = parent.get((b, n))
            label[b, n] = 0 if up is None else label[up] + 1
    if width is None:
        width = _best_width(kids, lens, parent, label)
    elif isinstance(width, bool) or not isinstance(width, int | np.integer) or width < 1:
        raise ArgumentError(f"tree_levels: width must be a positive int, got {width!r}")
    where = _hu(kids, lens, parent, label, int(width))
    return _grid(kids, lens, where, int(width))


def _parents(kids: np.ndarray, lens: np.ndarray) -> dict:
    parent = {}
    for b in range(kids.shape[0]):
        n = int(lens[b])
        for i in range(n):
            for c in kids[b, i]:
                c = int(c)
                if c == -1:
                    continue
                if c < -1 or c >= n:
                    raise ArgumentError(f"tree_levels: node {i} of tree {b} has child {c}, "
                                        f"outside the tree's {n} nodes; children index nodes "
                                        f"of the same tree, exactly -1 for none")
                if (b, c) in parent:
                    raise ArgumentError(f"tree_levels: node {c} of tree {b} is a child of "
                                        f"nodes {parent[b, c][1]} and {i}; in a tree each "
                                        f"node has one parent")
                parent[b, c] = (b, i)
    return parent


def _top_down(kids: np.ndarray, parent: dict, b: int, n: int) -> list[int]:
    """Tree ``b``'s nodes, each after its parent (roots first); a cycle is an error (its
    nodes all have parents, so none is reached from a root)."""
    order = []
    todo = [i for i in range(n) if (b, i) not in parent]
    while todo:
        i = todo.pop()
        order.append(i)
        todo.extend(int(c) for c in kids[b, i] if c >= 0)
    if len(order) < n:
        lost = sorted(set(range(n)) - set(order))[:5]
        raise ArgumentError(f"tree_levels: nodes {lost} of tree {b} are on a cycle of "
                            f"children; a tree's child links must not loop")
    return order


def _hu(kids, lens, parent, label, width: int) -> dict:
    """Highest label first, ``width`` nodes a step: ``(tree, node) -> (step, slot)``."""
    waiting = {}
    ready = []
    for b in range(kids.shape[0]):
        for i in range(int(lens[b])):
            waiting[b, i] = int((kids[b, i] >= 0).sum())
            if waiting[b, i] == 0:
                ready.append((-label[b, i], b, i))
    heapq.heapify(ready)
    where, step = {}, 0
    while ready:
        now = [heapq.heappop(ready) for _ in range(min(width, len(ready)))]
        for slot, (_, b, i) in enumerate(now):
            where[b, i] = (step, slot)
        for _, b, i in now:
            up = parent.get((b, i))
            if up is not None:
                waiting[up] -= 1
                if waiting[up] == 0:
                    heapq.heappush(ready, (-label[up], *up))
        step += 1
    return where


def _best_width(kids, lens, parent, label) -> int:
    """The width of least estimated time among a few: from the one the trees' height needs
    at full slots up to the widest set of leaves."""
    total = int(lens.sum())
    if total == 0:
        return 1
    height = 1 + max(label.values())
    leaves = int(sum(((kids[b, :int(lens[b])] >= 0).sum(-1) == 0).sum()
                     for b in range(kids.shape[0])))
    lo, hi = max(1, math.ceil(total / height)), max(1, leaves)
    cands = {lo, hi} | {int(round(lo * (hi / lo) ** (k / 8))) for k in range(1, 8)}
    best = None
    for w in sorted(cands):
        steps = 1 + max(s for s, _ in _hu(kids, lens, parent, label, w).values())
        cost = steps * (w + STEP_COST)
        if best is None or cost < best[0]:
            best = (cost, w)
    return best[1]


def _grid(kids, lens, where: dict, width: int) -> TreeLevels:
    trees, nodes, arity = kids.shape
    steps = 1 + max((s for s, _ in where.values()), default=0)
    step = np.full((trees, nodes), -1, np.int32)
    slot = np.full((trees, nodes), -1, np.int32)
    child_step = np.zeros((steps, width, arity), np.int32)
    child_slot = np.zeros((steps, width, arity), np.int32)
    has_child = np.zeros((steps, width, arity), bool)
    used = np.zeros((steps, width), bool)
    for (b, i), (s, k) in where.items():
        step[b, i], slot[b, i], used[s, k] = s, k, True
        for a, c in enumerate(kids[b, i]):
            if c >= 0:
                child_step[s, k, a], child_slot[s, k, a] = where[b, int(c)]
                has_child[s, k, a] = True
    return TreeLevels(step, slot, child_step, child_slot, has_child, used)
