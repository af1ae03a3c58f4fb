"""Live store bytes over a schedule, at a cost that does not grow with the bounds.

The loop AST is executed abstractly (bytes only), but a long loop is not run iteration by
iteration: its range is cut where anything in its body changes behaviour with the loop
variable (a guard ``t == T - 1`` or ``t >= 2``, the bound of an inner loop, the arms of a
``min``/``max``, a step of ``t // d``), and of each piece only the first and last ``period``
iterations are run (the period of the body's ``//`` and ``%`` of the variable, 1 without any),
whole periods being skipped in between. Inside a piece every guard keeps its truth value, so the
same stores are allocated and freed in every iteration, point and ring stores keep their size
and growing stores only grow: the bytes at each position of the body are monotone across the
piece, and the largest is in its first or last iterations (run after a silent run of the
iteration before them, so that a growing store already has the extent it would have there). So
the peak is exact. The timeline is the bytes after every statement that ran, with its step
number; the steps of the skipped periods are counted from the first period and the one after
them (exact when a period's steps are constant or grow linearly along the piece).
"""
from __future__ import annotations

import math

from ..schedule import Exec, Fetch, For, Free, If, Offload, Seq
from ..symbolic import Dim
from ..symbolic.cond import BoolConst, Cmp, Junction, Not
from ..symbolic.expr import DivMod, Lin, MinMax

RUN_ALL = 32     # a loop of at most this many iterations runs whole


class _State:
    def __init__(self, storages, run_all: int):
        self.storages, self.run_all = storages, run_all
        self.total = 0
        self.live: dict[int, int] = {}
        self.extents: dict[int, list[int]] = {}
        self.step = 0
        self.first: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.steps: list[int] = []
        self.roots: dict[int, tuple] = {}  # per loop node: its body's roots and period
        self.bytes: list[int] = []
        self.peak = 0
        self.host: dict[int, int] = {}  # offloaded stores' bytes
        self.host_peak = 0

    def record(self):
        self.steps.append(self.step)
        self.bytes.append(self.total)
        self.peak = max(self.peak, self.total)
        self.step += 1


def simulate(ast, storages, bounds, run_all: int = RUN_ALL):
    """``(steps, bytes, lifetimes, n_steps, peak, host_peak)``: the sampled timeline (step
    numbers and the device bytes live after them), each store's first and last step, the
    number of steps, the peak of live device bytes (exact), and the most bytes offloaded to the
    host at once."""
    st = _State(storages, run_all)
    _run(ast, dict(bounds), st)
    lifetimes = {i: (a, st.last[i]) for i, a in st.first.items()}
    return st.steps, st.bytes, lifetimes, st.step, st.peak, st.host_peak


def _run(node, env, st: _State):
    if isinstance(node, Exec):
        i = node.op
        s = st.storages.get(i)
        if s is not None:
            if i not in st.live or None in s.slots:
                ext = st.extents.setdefault(i, [1] * len(node.args))
                if None in s.slots:
                    for k, a in enumerate(node.args):
                        v = a.evaluate(env) + 1
                        if v > ext[k]:
                            ext[k] = v
                new = s.bytes_for(tuple(ext))
                st.total += new - st.live.get(i, 0)
                st.live[i] = new
            st.first.setdefault(i, st.step)
            st.last[i] = st.step
        st.record()
    elif isinstance(node, Offload):
        for o in node.ops:
            if o in st.live:  # a store not written yet has nothing to move
                st.host[o] = st.live.pop(o)
                st.total -= st.host[o]
        st.host_peak = max(st.host_peak, sum(st.host.values()))
        st.record()
    elif isinstance(node, Fetch):
        for o in node.ops:
            if o in st.host:
                st.live[o] = st.host.pop(o)
                st.total += st.live[o]
        st.record()
    elif isinstance(node, Free):
        for o in node.ops:
            st.host.pop(o, None)
            st.extents.pop(o, None)  # written again later (freed each iteration): it regrows
            st.total -= st.live.pop(o, 0)
            if o in st.first:
                st.last[o] = st.step
        st.record()
    elif isinstance(node, Seq):
        for n in node.body:
            _run(n, env, st)
    elif isinstance(node, If):
        if node.cond.evaluate(env):
            _run(node.then, env, st)
        elif node.orelse is not None:
            _run(node.orelse, env, st)
    elif isinstance(node, For):
        _loop(node, env, st)


def _loop(node: For, env, st: _State):
    lo, hi = node.lo.evaluate(env), node.hi.evaluate(env)
    values = range(lo, hi, node.step)
    if len(values) <= st.run_all:
        for v in values:
            _iteration(node, v, env, st)
        env.pop(node.var, None)
        return
    cuts, period = _cuts(node, env, st)
    ends = max(1, period)
    edges = sorted({lo, hi, *(c for c in cuts if lo < c < hi)})
    for a, b in zip(edges, edges[1:]):
        piece = range(a, b, node.step)
        if len(piece) <= 3 * ends + 2:
            for v in piece:
                _iteration(node, v, env, st)
            continue
        first = sum(_iteration(node, v, env, st) for v in piece[:ends])
        # skip whole periods, so the body sees the same ``//`` and ``%`` phases it would
        periods = (len(piece) - 2 * ends) // ends
        tail = ends * (1 + periods)
        _catch_up(node, piece[tail - 1], env, st)
        mark = st.step
        last = [_iteration(node, v, env, st) for v in piece[tail:]]
        # the skipped periods' steps: exact when a period's steps grow linearly along the piece
        extra = int(round(periods * (first + sum(last[:ends])) / 2))
        _shift(st, mark, extra)
    env.pop(node.var, None)


def _iteration(node: For, v: int, env, st: _State) -> int:
    """Run one iteration; the number of steps it took."""
    env[node.var] = v
    before = st.step
    _run(node.body, env, st)
    return st.step - before


def _catch_up(node: For, v: int, env, st: _State):
    """Bring the stores to where they stand before the last iterations: run the skipped
    iteration ``v`` without recording it, keeping only what it leaves behind (a growing store's
    extent; every other store is allocated and freed alike in each iteration of a piece)."""
    saved = (len(st.steps), st.step, dict(st.first), dict(st.last), st.peak)
    _iteration(node, v, env, st)
    n, st.step, st.first, st.last, st.peak = saved
    del st.steps[n:], st.bytes[n:]


def _shift(st: _State, mark: int, extra: int):
    """Move every step recorded from ``mark`` on by ``extra`` (the steps skipped before it)."""
    if not extra:
        return
    k = len(st.steps)
    while k > 0 and st.steps[k - 1] >= mark:
        k -= 1
    st.steps[k:] = [s + extra for s in st.steps[k:]]
    for d in (st.first, st.last):
        for i, s in d.items():
            if s >= mark:
                d[i] = s + extra
    st.step += extra


# -- where a body changes behaviour with the loop variable ---------------------------------------
def _cuts(node: For, env, st: _State) -> tuple[set[int], int]:
    """Values of the loop variable at which some guard, inner bound or min/max arm of the body
    can change (the pieces start there), and the period of its ``//``/``%`` of the variable
    (0: none). The body is analysed once per loop; each call only evaluates the roots."""
    found = st.roots.get(id(node))
    if found is None:
        found = st.roots[id(node)] = _roots(node)
    roots, period = found
    cuts: set[int] = set()
    for root in roots:
        root(env, cuts)
    return cuts, period


def _roots(node: For):
    """The functions ``(env, cuts)`` that add the cuts of each affine form of the body."""
    v = Dim(node.var)
    roots: list = []
    periods: list[int] = []

    def expr(e):
        if isinstance(e, MinMax):
            for a in e.args:
                expr(a)
            for a, b in zip(e.args, e.args[1:]):
                _root(a - b, v, roots, equal=True)
        elif isinstance(e, Lin):
            for a, _ in e.terms:
                expr(a)
        elif isinstance(e, DivMod):
            if v in e.arg.dims():
                periods.append(e.divisor)
            expr(e.arg)

    def cond(c):
        if isinstance(c, Cmp):
            expr(c.expr)
            _root(c.expr, v, roots, equal=c.op == "==")
        elif isinstance(c, Junction):
            for a in c.args:
                cond(a)
        elif isinstance(c, Not):
            cond(c.arg)
        elif not isinstance(c, BoolConst):
            raise TypeError(c)

    for n in node.body.walk():
        if isinstance(n, If):
            cond(n.cond)
        elif isinstance(n, For):
            expr(n.lo)
            expr(n.hi)
        elif isinstance(n, Exec):
            for a in n.args:
                expr(a)
    return roots, math.lcm(*periods) if periods else 0


def _root(e, v: Dim, roots: list, equal: bool):
    """Add the function giving where ``e`` (affine in ``v``, or in one ``(a * v + b) // d``)
    crosses 0; none when it depends on an inner loop's variable (settled inside)."""
    if not isinstance(e, Lin):
        if e == v:
            roots.append(lambda env, cuts: cuts.update({0, 1}))
        return
    coef = dict(e.terms).get(v)
    if coef:
        rest = e - v * coef
        names = {s.name for s in rest.symbols()}

        def linear(env, cuts):
            if names <= env.keys():
                x = -rest.evaluate(env) / coef  # e == 0 at v == x
                cuts.update({math.floor(x), math.floor(x) + 1, math.ceil(x), math.ceil(x) + 1})
                if equal:
                    cuts.add(math.floor(x) - 1)
        roots.append(linear)
        return
    divs = [(a, c) for a, c in e.terms if v in a.dims()]
    if len(divs) != 1 or not isinstance(divs[0][0], DivMod) or divs[0][0].op != "//":
        return  # ``%`` repeats (the period covers it); anything else is not affine
    (q, k), = divs
    rest = e - q * k
    names = {s.name for s in rest.symbols()}
    # ``q`` steps where its argument meets a multiple ``m`` of the divisor around the root
    m = Dim("__multiple")
    meets: list = []
    _root(q.arg - m * q.divisor, v, meets, equal=False)

    def quotient(env, cuts):
        if names <= env.keys():
            x = -rest.evaluate(env) / k  # q == x
            for n in {math.floor(x), math.floor(x) + 1, math.ceil(x), math.ceil(x) + 1}:
                for f in meets:
                    f({**env, m.name: n}, cuts)
    roots.append(quotient)
