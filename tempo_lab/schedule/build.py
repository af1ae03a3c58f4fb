"""SDG -> isl schedule constraints -> isl schedule -> isl AST -> our loop AST.

One isl statement per op, named ``op<id>``, whose domain is the op's *demanded* points (domain
reduction: an op computes only what someone reads). Bounds stay isl parameters (constrained to be
positive), so one schedule serves every bound value. Validity and proximity constraints are the
reversed dependences: the producer point must run before each consumer point that reads it.

isl options: the scheduler runs with isl's defaults (the Pluto-style ILP scheduler with its
Feautrier fallback, outer coincidence off) because they already give the natural nest
``for n: for t: ...`` for recurrences and keep parameters symbolic; the AST builder detects
min/max bounds so loop bounds print as ``min(...)`` rather than as split loops.
"""
from __future__ import annotations

import faulthandler
import os
import select
import signal
import time
import warnings

import islpy as isl

from ..cache import LRU
from ..errors import BoundsError, ExprError, ScheduleError
from ..ir.ops import flag
from ..ir.sdg import SDG
from ..symbolic import Bound, Const, Dim, Expr, and_, eq, floordiv, le, lt, max_, min_, mod, or_
from ..symbolic import isl as I
from ..symbolic.cond import Cmp, Junction
from .loops import Exec, For, If, Node, Seq, While

_AST_OPS = isl.ast_expr_op_type


def statement_domains(demand: dict[int, isl.Set], tight=frozenset()) -> dict[int, isl.Set]:
    """Each op's demanded points, widened to one convex piece.

    Exact demand sets can be unions of many parametric pieces (``t = T - 1`` when ``T < 3``,
    ...); isl's scheduler is slower on them and has crashed on some. Computing a few points
    nobody reads is harmless: they are written where the plan expects them and never read.
    That piece is isl's simple hull, except for the ops in ``tight`` (tiled blocks): they take
    the convex hull, slower to compute but keeping constraints between dims (``2*t_tile <= t``)
    that the simple hull can drop, adding blocks whose reads would be empty.
    """
    return {i: _hull(d, i in tight) for i, d in demand.items()}


_HULLS = LRU(8192)


def _hull(d: isl.Set, tight: bool) -> isl.Set:
    """Memoised by the set's text without its statement name (repeated layers demand alike)."""
    def make():
        out = d if d.is_empty() else (d.convex_hull() if tight else d.simple_hull()).to_set()
        return out.coalesce().reset_tuple_id()

    name = d.get_tuple_name()
    return _HULLS.get((str(d.reset_tuple_id()), tight), make).set_tuple_name(name)


def constraints(sdg: SDG, domains: dict[int, isl.Set], maps) -> tuple:
    """(domain union set, validity union map, the dependences one by one as
    ``(map producer -> reader, the read's index or None)``) for the ops with demanded
    points."""
    live = {i: d for i, d in domains.items() if not d.is_empty()}
    dom = I.union_of(live.values())
    deps = [(maps[e].intersect_domain(live[e.dst]).intersect_range(live[e.src]).reverse(),
             e.index) for e in sdg.edges if e.dst in live and e.src in live]
    deps += [(m, None) for m in _steps_first(sdg, live) + until_order(sdg, live)]
    deps = [(m, index) for m, index in deps if not m.is_empty()]
    validity = I.union_of([m for m, _ in deps]).coalesce() if deps else \
        isl.UnionMap.empty(dom.get_space())
    return dom, validity, deps


def _steps_first(sdg: SDG, live: dict[int, isl.Set]) -> list[isl.Map]:
    """For an op over a tiled range's blocks ``(..., t, t_tile)``: every block of step ``t``
    before any of step ``t + 1``. Not a dependence, an order that keeps the loop over blocks
    inside the loop over steps (isl may otherwise put it outside, keeping every step's
    partial results alive at once)."""
    out = []
    for i, d in live.items():
        dims = sdg.ops[i].domain
        k = next((j for j, x in enumerate(dims) if sdg.role(x) == "blocks"), 0)
        if k == 0:
            continue
        ins = [f"i{j}" for j in range(len(dims))]
        outs = [f"i{j}" if j != k and j != k - 1 else f"i{j} + 1" if j == k - 1 else "o"
                for j in range(len(dims))]
        m = isl.Map(f"[{', '.join(sdg.params)}] -> {{ op{i}[{', '.join(ins)}] -> "
                    f"op{i}[{', '.join(outs)}] }}", context=I.CTX)
        out.append(m.intersect_domain(d).intersect_range(d))
    return out


# -- data-dependent bounds (tl.until) ----------------------------------------------------------
def until_order(sdg: SDG, live: dict[int, isl.Set]) -> list[isl.Map]:
    """What makes a ``tl.until`` bound ``T`` (of dim ``t``) well defined: the loop over ``t``
    that computes ``done`` stops after the first true point, and ``T`` is then known.

    * An op whose points or reads depend on ``T`` (``x[T - 1]``, ``x[0:T]``, a backward
      recurrence guarded by ``t < T - 1``, a value shaped ``(T,)``) runs after every point
      of ``done``, so it sees the ``T`` reached, never the ``max``.
    * An op over ``t`` that ``done`` reads runs at ``t`` only after ``done[t - 1]``, and any
      other op over ``t`` only after ``done[t]``: each stays in the loop that stops (or comes
      after it), and none computes a point past the end before the end is known.
    Both are orders, not data dependences; isl schedules them like any other."""
    out = []
    for bound, done in sdg.untils.items():
        if done not in live:
            continue
        t = sdg.until_dim(bound)
        needs = needs_bound(sdg, live, bound)
        feeds = ancestors(sdg, done)
        for i, dom in live.items():
            op = sdg.ops[i]
            if i in needs:
                m = isl.Map.from_domain_and_range(live[done], dom)
            elif t in op.domain:
                lag = 1 if i in feeds else 0
                ins = [f"v{k}" for k in range(len(op.domain))]
                m = isl.Map(f"[{', '.join(sdg.params)}] -> {{ op{done}[u] -> op{i}[{', '.join(ins)}]"
                            f" : u = v{op.domain.index(t)} - {lag} }}", context=I.CTX)
                m = m.intersect_domain(live[done]).intersect_range(dom)
            else:
                continue
            if not m.is_empty():
                out.append(m)
    return out


def ancestors(sdg: SDG, op: int) -> set[int]:
    """``op`` and every op it reads, transitively."""
    seen, stack = set(), [op]
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(e.src for e in sdg.in_edges(i))
    return seen


def check_untils(sdg: SDG, domains: dict[int, isl.Set]):
    """A ``done`` condition must not depend on where its own dim ends."""
    live = {i: d for i, d in domains.items() if not d.is_empty()}
    for bound, done in sdg.untils.items():
        needs = needs_bound(sdg, live, bound)
        seen, stack, via = set(), [done], {}
        while stack:
            i = stack.pop()
            if i in needs:
                path = [sdg.ops[i].label]
                while path[-1] != sdg.ops[done].label and i in via:
                    i = via[i]
                    path.append(sdg.ops[i].label)
                raise BoundsError(
                    f"tl.until for {bound}: its condition {sdg.ops[done].label} depends on "
                    f"{' <- '.join(path)}, which needs the value of {bound} (a read of "
                    f"{bound} - 1, a range up to {bound}, a shape or a point set that depends "
                    f"on it); where {sdg.until_dim(bound)} ends cannot depend on where it "
                    "ends: compute the condition from earlier points only",
                    sdg.ops[done].loc)
            if i in seen:
                continue
            seen.add(i)
            for e in sdg.in_edges(i):
                via.setdefault(e.src, i)
                stack.append(e.src)


def mark_untils(root: Node, sdg: SDG, shifts: bool = True) -> Node:
    """Turn the loop that computes each ``tl.until`` condition into a ``While``. The loop sets
    the bound as soon as the condition holds and then runs on while its own bound, now
    evaluated with the value reached, allows (isl may compute an op a few iterations after its
    point); an op that the condition reads must not be computed ahead of its point, or a
    point past the end would run before the end is known, unless it runs after the condition
    under a guard that the bound reached settles (checked where the schedule may shift
    points, ``shifts``: the fusion scheduler's loops run every op at its own point)."""
    found: set[str] = set()

    def visit(node):
        if isinstance(node, Seq):
            return Seq(tuple(visit(n) for n in node.body))
        if isinstance(node, If):
            return If(node.cond, visit(node.then),
                      None if node.orelse is None else visit(node.orelse))
        if isinstance(node, For):
            body = visit(node.body)
            for bound, done in sdg.untils.items():
                at = _exec_in(body, done)
                # the condition's point is the loop variable shifted by a constant or by
                # fixed bounds (isl may shift a loop by a parameter: c0 = t + B)
                shift = None if at is None else at - Dim(node.var)
                if shift is not None and not shift.dims() \
                        and not any(s.name in sdg.untils for s in shift.bounds()):
                    found.add(bound)
                    loop = While(node.var, node.lo, node.hi, _spliced(body), node.dim,
                                 node.step, bound, done, at)
                    if shifts:
                        _check_ahead(loop, sdg)
                    _check_split(loop, sdg)
                    return loop
            return For(node.var, node.lo, node.hi, body, node.dim, node.step)
        return node

    out = visit(root)
    if shifts:
        _check_known_early(out, sdg)
    for loop in (n for n in out.walk() if isinstance(n, While)):
        inside = sum(1 for n in loop.walk() if isinstance(n, Exec) and n.op == loop.done)
        if sum(1 for n in out.walk() if isinstance(n, Exec) and n.op == loop.done) > inside:
            # isl peeled the condition's last points after the loop: there they are computed
            # again at the bound reached, after the loop freed what they read
            raise IslScheduleRejected(f"{sdg.ops[loop.done].label} runs outside the loop "
                                      "that ends at it in this schedule")
    missing = set(sdg.untils) - found
    if missing:
        b = sorted(missing)[0]
        raise ScheduleError(f"the loop that computes the tl.until condition of {b} is not a "
                            "plain loop over its dim in this schedule; please report it with "
                            "the program", sdg.ops[sdg.untils[b]].loc)
    return out


def _check_ahead(loop: While, sdg: SDG):
    """Every op the condition reads is computed in the loop at or after its own point, or
    after the condition's statement (``While.split``) under conditions that hold only below
    the bound: that part of an iteration sees the bound reached, so a point past the end is
    not computed (isl computed the next step's input there, ``if T - 2 >= 0 & t == 1``)."""
    t = sdg.ops[loop.done].domain[0]
    feeds = ancestors(sdg, loop.done)
    head, tail = loop.split()
    for part, below_end in ((head, False), (tail, True)):
        for n, conds in _guarded(part, ()):
            if n.op not in feeds or t not in sdg.ops[n.op].domain:
                continue
            point = n.args[sdg.ops[n.op].domain.index(t)]
            ahead = point - loop.at
            if isinstance(ahead, Const) and ahead.value <= 0 or _implied(
                    conds, le(point, loop.at), sdg) or below_end and _implied(
                    conds, lt(point, Bound(loop.bound)), sdg):
                continue
            raise IslScheduleRejected(f"{sdg.ops[n.op].label} runs ahead of the tl.until "
                                      "condition's point in this schedule")


def _check_known_early(root: Node, sdg: SDG):
    """Before a ``tl.until`` loop and in its iterations up to the condition, the bound is
    its ``max``: a statement there may be guarded by the bound only where a guard that holds
    at the bound reached holds at the max too (``T - 3 >= 0``: at worst it runs in vain).
    isl may place a statement by the bound's value (``if T - 1 == 0: x = ...`` before the
    loop, ``if t == T: x = ...`` in it), which at the max never runs when the loop ends
    early, and a later read found nothing."""
    for loop in [n for n in root.walk() if isinstance(n, While)]:
        early: list = []
        _before(root, loop, (), early)
        b = Bound(loop.bound)
        for n, conds in early:
            for c in conds:
                if b in c.symbols() and not _grows_with(c, b, sdg):
                    raise IslScheduleRejected(f"{sdg.ops[n.op].label} is placed by the value "
                                              f"of {loop.bound} before it is known")


def _before(node: Node, loop: While, conds: tuple, out: list) -> bool:
    """Into ``out``: the statements that run before ``loop`` and in its iterations up to its
    condition (``While.split``), with what holds where each runs (``_guarded``); True once
    ``loop`` is reached."""
    if node is loop:
        out.extend(_guarded(loop.split()[0], conds))
        return True
    if isinstance(node, Seq):
        return any(_before(n, loop, conds, out) for n in node.body)
    if isinstance(node, If):
        return _before(node.then, loop, conds + (node.cond,), out) or (
            node.orelse is not None and _before(node.orelse, loop, conds + (~node.cond,), out))
    if isinstance(node, For):
        v = Dim(node.var)
        return _before(node.body, loop, conds + (v >= node.lo, lt(v, node.hi)), out)
    if isinstance(node, Exec):
        out.append((node, conds))
    return False


def _grows_with(c, b: Bound, sdg: SDG) -> bool:
    """Whether ``c`` holding at a value of bound ``b`` means it holds at every larger one."""
    lo, hi = Bound(b.name + "__lo"), Bound(b.name + "__hi")
    return _implied((le(lo, hi), c.substitute({b: lo})), c.substitute({b: hi}), sdg,
                    (lo.name, hi.name))


def _spliced(body: Node) -> Node:
    """``body`` with the sequences at its top spliced into one: isl's AST may nest them, and
    ``While.split`` sets the bound between top-level statements."""
    if not isinstance(body, Seq):
        return body
    out = []
    for n in body.body:
        out.extend(_spliced(n).body if isinstance(n, Seq) else (n,))
    return Seq(tuple(out))


def _guarded(node: Node, conds: tuple):
    """Each statement under ``node`` with what holds where it runs: the conditions around it
    (negated in an ``else``) and the ranges of the loops around it."""
    if isinstance(node, Seq):
        for n in node.body:
            yield from _guarded(n, conds)
    elif isinstance(node, If):
        yield from _guarded(node.then, conds + (node.cond,))
        if node.orelse is not None:
            yield from _guarded(node.orelse, conds + (~node.cond,))
    elif isinstance(node, For):
        v = Dim(node.var)
        yield from _guarded(node.body, conds + (v >= node.lo, lt(v, node.hi)))
    elif isinstance(node, Exec):
        yield node, conds


def _implied(conds: tuple, goal, sdg: SDG, more: tuple = ()) -> bool:
    """Whether ``conds`` imply ``goal`` for every value of the loop variables and bounds in
    them (``more``: bounds beyond the program's), False where isl cannot tell."""
    names = sorted({d.name for x in (*conds, goal) for d in x.dims()})
    try:
        return I.cond_set(and_(*conds, ~goal), I.space([Dim(n) for n in names],
                                                       [*sdg.params, *more])).is_empty()
    except (ExprError, TypeError, isl.Error):
        return False


def _check_split(loop: While, sdg: SDG):
    """The bound is set between the top-level statements of the loop body (``While.split``):
    no statement that runs after the condition within the same top-level one may depend on
    the bound (through its point or a condition or range around it)."""
    head, _ = loop.split()
    b = Bound(loop.bound)
    seen = False

    def visit(node, under: bool):  # under: a condition or range around it reads the bound
        nonlocal seen
        if isinstance(node, Exec):
            if seen and (under or any(b in a.symbols() for a in node.args)):
                raise IslScheduleRejected(f"{sdg.ops[node.op].label} depends on {loop.bound} "
                                          "after its tl.until condition, in one statement")
            seen = seen or node.op == loop.done
        elif isinstance(node, Seq):
            for n in node.body:
                visit(n, under)
        elif isinstance(node, If):
            for n in (node.then, node.orelse):
                if n is not None:
                    visit(n, under or b in node.cond.symbols())
        elif isinstance(node, For):
            visit(node.body, under or b in node.lo.symbols() | node.hi.symbols())

    visit(head.body[-1], False)


class IslScheduleRejected(Exception):
    """A schedule isl returned that the executors cannot run (another option set may do)."""


def _exec_in(node: Node, op: int) -> Expr | None:
    """The point at which ``op`` (over one dim) runs in this loop body (perhaps under an inner
    loop that runs it once, guarded to one of its points)."""
    return next((n.args[0] for n in node.walk() if isinstance(n, Exec) and n.op == op
                 and len(n.args) == 1), None)


def needs_bound(sdg: SDG, live: dict[int, isl.Set], bound: str) -> set[int]:
    """The ops whose work depends on the value of ``bound`` beyond its loop: they read with
    it, are shaped by it, or compute points (demand) that a loop stopped early would not."""
    b = Bound(bound)
    t = sdg.until_dim(bound)
    out = set()
    for i, op in sdg.ops.items():
        reads = any(b in x.symbols() for e in sdg.in_edges(i) for x in (*e.index, e.cond))
        shaped = any(not isinstance(x, int) and b in x.symbols() for x in op.type.shape)
        valued = op.kind == "dimval" and b in op.attrs["expr"].symbols()
        if reads or shaped or valued or (i in live and not _prefix_closed(live[i], op, t, b)):
            out.add(i)
    return out


def _prefix_closed(dom: isl.Set, op, t: Dim, b: Bound) -> bool:
    """Whether an op's points under a bound ``T_a`` are among its points under any larger
    ``T_b`` cut at ``t < T_a``: what a loop run up to ``max`` and stopped at ``T_a``
    computes."""
    pos = dom.find_dim_by_name(isl.dim_type.param, b.name)
    if pos < 0:
        return True
    dom = I.named(dom, op.domain)
    a = dom.set_dim_name(isl.dim_type.param, pos, "T__a")
    z = dom.set_dim_name(isl.dim_type.param, pos, "T__b")
    a = a.align_params(z.get_space())
    z = z.align_params(a.get_space())
    affs = isl.affs_from_space(z.get_space())
    if t in op.domain:
        z = z & affs[t.name].lt_set(affs["T__a"])
    order = (affs["T__a"].le_set(affs["T__b"]) & affs["T__a"].ge_set(affs[0] + 1)).params()
    a, z = a.intersect_params(order), z.intersect_params(order)
    # points computed in vain are harmless, but a callback must run at exactly its points
    return a.is_equal(z) if flag(op.kind, "effect") else a.is_subset(z)


ISL_SECONDS = 60.0  # how long one attempt of isl's scheduler may take (it runs in a child)


_ISL_SCHEDULES = LRU(64)  # isl's answers by problem text: the same program compiled again (a
# notebook cell run twice, another executor) is not scheduled again (PPO: 7.6 s each time)


def compute(sdg: SDG, dom: isl.UnionSet, validity: isl.UnionMap,
            options: tuple = ()) -> isl.Schedule:
    """isl's schedule of ``dom`` under ``validity`` (``options``: the scheduler options set,
    part of what the answer depends on)."""
    key = (str(dom), str(validity), options)
    text = _ISL_SCHEDULES.get(key, lambda: _in_child(lambda: _schedule_text(dom, validity),
                                                     ISL_SECONDS))
    if text is None:
        _ISL_SCHEDULES.pop(key)  # a crash or a timeout may not happen again
        raise IslCrashed(f"isl's scheduler crashed or took over {ISL_SECONDS:.0f} s")
    if text == "":
        raise cycle_error(sdg, validity)
    return isl.Schedule.read_from_str(I.CTX, text)


class IslCrashed(Exception):
    """isl died (an isl bug) while scheduling; another option set may avoid it."""


def _schedule_text(dom, validity) -> str:
    sc = isl.ScheduleConstraints.on_domain(dom).set_validity(validity).set_proximity(validity)
    try:
        sched = sc.compute_schedule()
    except isl.Error:
        return ""
    if sched is None or (sched.get_map().is_empty() and not dom.is_empty()):
        return ""
    return str(sched)


def _in_child(fn, seconds: float | None = None) -> str | None:
    """Run ``fn() -> str`` in a forked child so that an isl crash (isl has segfaulted on a few
    inputs) cannot take the user's kernel down, nor a search that takes too long (over
    ``seconds``) hang it; None if the child died or was stopped. Where fork is not available
    the function runs in this process."""
    if not hasattr(os, "fork"):
        return fn()
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns about fork in a threaded process
        pid = os.fork()
    if pid == 0:  # the child: only isl runs here, then it leaves without cleanup
        code = 1
        faulthandler.disable()  # a crash here is handled by the parent: no dump on stderr
        try:
            data = fn().encode()
            while data:
                data = data[os.write(w, data):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    chunks = []
    deadline = None if seconds is None else time.monotonic() + seconds
    with os.fdopen(r, "rb") as f:
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([f], [], [], left)[0]):
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            chunk = os.read(f.fileno(), 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
        return None
    return b"".join(chunks).decode()


def cycle_error(sdg: SDG, validity: isl.UnionMap) -> ScheduleError:
    """Name a cycle of ops in which some point depends on itself."""
    closure, _exact = validity.transitive_closure()
    bad = set()
    for m in I.maps_of(closure):
        if m.get_tuple_name(isl.dim_type.in_) == m.get_tuple_name(isl.dim_type.out):
            ident = isl.Map.identity(m.get_space())
            if not (m & ident).is_empty():
                bad.add(int(m.get_tuple_name(isl.dim_type.in_)[2:]))
    cycle = _find_cycle(sdg, bad or set(sdg.ops))
    if not cycle:
        return ScheduleError("no legal schedule exists for this program (isl found none)")
    parts = []
    for e in cycle:
        p, c = sdg.ops[e.src], sdg.ops[e.dst]
        parts.append(f"{c.label} ({c.kind}) reads {p.label}[{e.index_str()}] at {e.loc}")
    first = sdg.ops[cycle[0].dst]
    return ScheduleError(
        "no legal schedule: these ops need each other at the same point: " + " -> ".join(parts)
        + ". Break the cycle by reading an earlier point (e.g. x[t - 1]) with a base-case "
        "branch", first.loc)


def _find_cycle(sdg: SDG, ops: set[int]):
    """A cycle of edges (consumer -> producer) through ``ops``, by depth-first search."""
    for start in sorted(ops):
        stack = [(start, [])]
        seen = set()
        while stack:
            node, path = stack.pop()
            for e in sdg.in_edges(node):
                if e.src == start:
                    return path + [e]
                if e.src in ops and e.src not in seen:
                    seen.add(e.src)
                    stack.append((e.src, path + [e]))
    return None


# -- isl AST -> loop AST --------------------------------------------------------------------------
_ASTS = LRU(64)  # isl's ASTs by schedule text (PPO's: 1.9 s each time)


def ast(sched, context: isl.Set) -> isl.AstNode:
    """isl's AST of a schedule tree or a schedule map."""
    def make():
        I.CTX.set_ast_build_detect_min_max(1)
        build = isl.AstBuild.from_context(context)
        if isinstance(sched, isl.UnionMap):
            return build.node_from_schedule_map(sched)
        return build.node_from_schedule(sched)
    return _ASTS.get((type(sched).__name__, str(sched), str(context)), make)


def lower(node: isl.AstNode, sdg: SDG) -> Node:
    params = set(sdg.params)
    raw = _lower(node, params)
    return _name_iterators(raw, sdg)


def _lower(node, params) -> Node:
    t = node.get_type()
    if t == isl.ast_node_type.block:
        kids = node.block_get_children()
        return Seq(tuple(_lower(kids.get_at(i), params) for i in range(kids.n_ast_node())))
    if t == isl.ast_node_type.for_:
        var = node.for_get_iterator().get_id().get_name()
        inc = node.for_get_inc().get_val().to_python()
        lo = _expr(node.for_get_init(), params)
        hi = _upper(_cond(node.for_get_cond(), params), var)
        return For(var, lo, hi, _lower(node.for_get_body(), params), step=inc)
    if t == isl.ast_node_type.if_:
        orelse = _lower(node.if_get_else_node(), params) if node.if_has_else_node() else None
        return If(_cond(node.if_get_cond(), params), _lower(node.if_get_then_node(), params),
                  orelse)
    if t == isl.ast_node_type.user:
        call = node.user_get_expr()
        name = call.get_op_arg(0).get_id().get_name()
        args = tuple(_expr(call.get_op_arg(i), params) for i in range(1, call.get_op_n_arg()))
        return Exec(int(name[2:]), args)
    if t == isl.ast_node_type.mark:
        return _lower(node.mark_get_node(), params)
    raise ScheduleError(f"unexpected isl AST node {node.to_C_str()}")


def _upper(cond, var: str) -> Expr:
    """The exclusive upper bound ``hi`` of a loop condition ``var < hi`` (or ``<=``)."""
    if isinstance(cond, Junction) and cond.op == "and":
        return min_(*[_upper(c, var) for c in cond.args])
    if isinstance(cond, Cmp) and cond.op == ">=":
        v = Dim(var)
        coeff = dict(getattr(cond.expr, "terms", ((cond.expr, 1),))).get(v)
        if coeff == -1:
            return cond.expr + v + 1
    raise ScheduleError(f"unexpected loop condition {cond} for {var}")


def _sym(name, params):
    return Bound(name) if name in params else Dim(name)


def _expr(e, params) -> Expr:
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return Const(e.get_val().to_python())
    if t == isl.ast_expr_type.id:
        return _sym(e.get_id().get_name(), params)
    op = e.get_op_type()
    args = [_expr(e.get_op_arg(i), params) if op not in _CONDS else None
            for i in range(e.get_op_n_arg())]
    if op == _AST_OPS.add:
        return args[0] + args[1]
    if op == _AST_OPS.sub:
        return args[0] - args[1]
    if op == _AST_OPS.mul:
        return args[0] * args[1]
    if op == _AST_OPS.minus:
        return -args[0]
    if op == _AST_OPS.min:
        return min_(*args)
    if op == _AST_OPS.max:
        return max_(*args)
    if op in (_AST_OPS.fdiv_q, _AST_OPS.pdiv_q, _AST_OPS.div):
        return floordiv(args[0], args[1])
    if op in (_AST_OPS.pdiv_r, _AST_OPS.zdiv_r):
        return mod(args[0], args[1])
    raise ScheduleError(f"unexpected isl AST expression {e.to_C_str()}")


_CONDS = {_AST_OPS.and_, _AST_OPS.and_then, _AST_OPS.or_, _AST_OPS.or_else, _AST_OPS.eq,
          _AST_OPS.le, _AST_OPS.lt, _AST_OPS.ge, _AST_OPS.gt}


def _cond(e, params):
    op = e.get_op_type()
    a, b = e.get_op_arg(0), e.get_op_arg(1)
    if op in (_AST_OPS.and_, _AST_OPS.and_then):
        return and_(_cond(a, params), _cond(b, params))
    if op in (_AST_OPS.or_, _AST_OPS.or_else):
        return or_(_cond(a, params), _cond(b, params))
    x, y = _expr(a, params), _expr(b, params)
    return {_AST_OPS.eq: lambda: eq(x, y), _AST_OPS.le: lambda: x <= y,
            _AST_OPS.lt: lambda: x < y, _AST_OPS.ge: lambda: x >= y,
            _AST_OPS.gt: lambda: x > y}[op]()


def _name_iterators(root: Node, sdg: SDG) -> Node:
    """Rename isl's iterators c0, c1, ... to the dim each loop walks, where the ops in that
    loop use it as one dim only (and no enclosing loop has that name already)."""
    return _rename(root, sdg, {})


def _walked(body: Node, var: str, sdg: SDG) -> set[str]:
    """The dims that the ops under a loop read its variable ``var`` as."""
    return {d.name for n in body.walk() if isinstance(n, Exec)
            for d, a in zip(sdg.ops[n.op].domain, n.args) if a == Dim(var)}


def _rename(node: Node, sdg: SDG, names: dict[str, str]) -> Node:
    """``names``: the renamed variables of the enclosing loops (isl name -> dim name)."""
    def sub(x):
        return x.substitute({Dim(k): Dim(v) for k, v in names.items()})

    if isinstance(node, Seq):
        return Seq(tuple(_rename(n, sdg, names) for n in node.body))
    if isinstance(node, For):
        walked = _walked(node.body, node.var, sdg)
        dim = next(iter(walked)) if len(walked) == 1 else None
        taken = set(names.values()) | {k for k in names}
        inner = dict(names)
        if dim is not None and dim not in taken:
            inner[node.var] = dim
        else:
            dim = None
            inner.pop(node.var, None)
        return For(inner.get(node.var, node.var), sub(node.lo), sub(node.hi),
                   _rename(node.body, sdg, inner), dim, node.step)
    if isinstance(node, If):
        return If(sub(node.cond), _rename(node.then, sdg, names),
                  None if node.orelse is None else _rename(node.orelse, sdg, names))
    if isinstance(node, Exec):
        return Exec(node.op, tuple(sub(a) for a in node.args))
    return node


# -- execution order ------------------------------------------------------------------------------
def time_map(root: Node, sdg: SDG) -> isl.UnionMap:
    """When each statement instance runs *in the loop AST*: ``op[point] -> [time vector]``.

    isl's AST generator may order independent statements differently from the schedule map
    (it is free to, within the dependences), so lifetimes and ring-buffer checks use the order
    of the AST that actually runs: sequence positions and loop iterators, outermost first.
    """
    found: list[tuple] = []

    def visit(node, prefix, loops, conds):
        if isinstance(node, Seq):
            for k, n in enumerate(node.body):
                visit(n, prefix + [k], loops, conds)
        elif isinstance(node, For):
            v = Dim(node.var)
            c = (v >= node.lo) & (v < node.hi)
            if node.step != 1:
                c = c & eq(mod(v - node.lo, node.step), 0)
            visit(node.body, prefix + [v], loops + [v], conds + [c])
        elif isinstance(node, If):
            visit(node.then, prefix + [0], loops, conds + [node.cond])
            if node.orelse is not None:
                visit(node.orelse, prefix + [1], loops, conds + [~node.cond])
        elif isinstance(node, Exec):
            found.append((node, prefix, loops, conds))

    visit(root, [], [], [])
    depth = max((len(p) for _, p, _, _ in found), default=0)
    params = list(sdg.params)
    out = None
    for node, prefix, loops, conds in found:
        op = sdg.ops[node.op]
        names = ([v.name + "~" for v in loops] + [d.name for d in op.domain]
                 + [f"i{k}" for k in range(depth)])
        sp = isl.Space.create_from_names(I.CTX, set=names, params=params)
        affs = isl.affs_from_space(sp)
        ren = {v: Dim(v.name + "~") for v in loops}
        rel = I.cond_set(and_(*conds).substitute(ren), sp)
        for d, a in zip(op.domain, node.args):
            rel &= affs[d.name].eq_set(I.pw_aff(a.substitute(ren), affs))
        for k in range(depth):
            x = prefix[k] if k < len(prefix) else 0
            rel &= affs[f"i{k}"].eq_set(I.pw_aff(x.substitute(ren) if isinstance(x, Expr)
                                                 else Const(x), affs))
        rel = rel.project_out(isl.dim_type.set, 0, len(loops))
        m = isl.Map.from_range(rel).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0,
                                              len(op.domain))
        m = m.set_tuple_name(isl.dim_type.in_, f"op{op.id}")
        out = isl.UnionMap.from_map(m) if out is None else out.union(isl.UnionMap.from_map(m))
    return out
