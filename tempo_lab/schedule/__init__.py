"""Polyhedral scheduling: the ``Schedule`` stage (isl constraints, isl schedule tree, loop AST)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import islpy as isl

from ..errors import ArgumentError, user_location
from ..ir.demand import demand, param_context
from ..ir.sdg import SDG
from ..stage import Stage
from ..symbolic import TRUE
from ..symbolic import isl as I
from . import build, fusion
from .loops import Exec, Fetch, For, Free, If, Node, Offload, Seq, While, to_code

SCHEMA = "tempo_lab.schedule/1"


class Schedule(Stage):
    """How the SDG runs: one isl statement per op over its demanded points, the dependences
    that order them, the isl schedule tree, and the loop AST executors walk."""

    def __init__(self, sdg: SDG, domains: Mapping[int, isl.Set], validity: isl.UnionMap,
                 tree: isl.Schedule, ast: Node, order: isl.UnionMap,
                 options: Mapping[str, int] | None = None,
                 placed: Mapping[tuple[int, str], tuple[int, int]] | None = None,
                 freed: bool = False):
        self.sdg, self.domains, self.validity, self.tree, self.ast = (sdg, dict(domains),
                                                                      validity, tree, ast)
        self.freed = freed  # whether the AST frees each store after its last use (memory/)
        self.order = order  # statement instance -> time in the loop AST that runs
        self.options = options  # "fusion", or the isl scheduler options it was computed with
        # the fusion scheduler's loops: (op, dim) -> (direction, shift), point x of the op runs
        # at loop time direction * x + shift (how many iterations late a reader runs)
        self.placed = dict(placed or {})

    def with_ast(self, ast: Node, freed: bool | None = None) -> Schedule:
        """The same schedule running ``ast`` (the loop AST with frees or offloads placed in
        it: ``memory/``)."""
        return Schedule(self.sdg, self.domains, self.validity, self.tree, ast, self.order,
                        self.options, self.placed, self.freed if freed is None else freed)

    def lag(self, reader: int, producer: int, dim: str) -> int:
        """How many points along ``dim`` the producer has moved on when ``reader`` runs the
        same point (0 where neither is shifted or the schedule is isl's)."""
        w, s_r = self.placed.get((reader, dim), (1, 0))
        _, s_p = self.placed.get((producer, dim), (1, 0))
        return w * (s_r - s_p)

    @property
    def method(self) -> str:
        """Which scheduler made it: the fusion scheduler, or isl's with these options."""
        if self.options == "fusion":
            return "fusion (loop nests from the program's structure, checked by isl)"
        opts = ", ".join(f"{k}={v}" for k, v in self.options.items())
        return f"isl ({opts or 'default options'})"

    @property
    def statements(self) -> list[int]:
        return [i for i, d in self.domains.items() if not d.is_empty()]

    def code(self) -> str:
        """The loop AST as readable pseudo-code, dims named."""
        return "\n".join(to_code(self.ast, lambda i: self.sdg.ops[i].label, self._stmt))

    def _stmt(self, node: Exec) -> str:
        """``%3[n, t] = add(%1[n, t - 1], %2)``: the op at its point, reads spelled out."""
        sdg = self.sdg
        op = sdg.ops[node.op]
        at = dict(zip(op.domain, node.args))
        reads = []
        for e in sdg.in_edges(op.id):
            src = sdg.ops[e.src]
            idx = ", ".join(str(x.substitute(at)) for x in e.index)
            r = f"{src.label}[{idx}]" if idx else src.label
            if e.cond != TRUE:
                r += f" if {e.cond.substitute(at)}"
            reads.append(r)
        args = ", ".join(map(str, node.args))
        head = f"{op.label}[{args}]" if args else op.label
        return f"{head} = {op.kind}({', '.join(reads)})"

    def __repr__(self) -> str:
        loops = [n for n in self.ast.walk() if isinstance(n, For)]
        return (f"Schedule(statements={len(self.statements)}, loops={len(loops)}, "
                f"depth={_depth(self.ast)})")

    def _sections(self):
        doms = []
        for i in self.statements:
            doms.append(f"op{i}: {self.domains[i].reset_tuple_id()}  ({self.sdg.ops[i].label})")
        deps = sorted(str(m) for m in I.maps_of(self.validity))
        return [("loops", self.code().splitlines()),
                ("scheduler", [self.method]),
                ("statements (demanded points)", doms),
                ("validity = proximity (producer -> consumer)", deps),
                ("isl schedule", str(self.tree.get_root()).splitlines()
                 if hasattr(self.tree, "get_root") else
                 sorted(str(m) for m in I.maps_of(self.tree)))]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "repr": repr(self), "code": self.code().splitlines(),
                "method": self.method,
                "domains": {str(i): str(self.domains[i]) for i in self.statements},
                "validity": sorted(str(m) for m in I.maps_of(self.validity)),
                "tree": str(self.tree)}


def _depth(node: Node) -> int:
    if isinstance(node, For):
        return 1 + _depth(node.body)
    if isinstance(node, Seq):
        return max((_depth(n) for n in node.body), default=0)
    if isinstance(node, If):
        return max(_depth(node.then), _depth(node.orelse) if node.orelse else 0)
    return 0


# What compilation tries, in order, until one gives a complete schedule: the fusion scheduler,
# then isl's scheduler under option sets (each limited to build.ISL_SECONDS). isl's default
# (incremental clustering) gives the natural nest for layer/step programs; clustering whole
# components keeps a window reader in its producer's loop where the default splits it off.
OPTION_SETS: tuple = ("fusion", {}, {"whole_component": 1})
# Tried only when every set above fails: isl has returned schedule trees that lose statements
# on a few programs; serialising strongly connected components avoids that code path.
FALLBACK_OPTION_SETS: tuple[dict[str, int], ...] = ({"serialize_sccs": 1},
                                                    {"serialize_sccs": 1, "algorithm": 1})


class IncompleteSchedule(Exception):
    """isl returned a schedule that does not run every statement instance, or crashed (isl
    bugs): the caller tries other option sets."""


def schedule_sdg(sdg: SDG, options: Mapping[str, int] | str | None = None) -> Schedule:
    """Schedule an SDG: ``options`` "fusion" (the default) builds the loop nest from the
    program's structure (``fusion.py``); a dict runs isl's scheduler with those options
    (names of isl's ``schedule_*`` options) set. Each op is a statement over the points
    someone reads. ``IncompleteSchedule``: this method has no schedule, try another."""
    options = "fusion" if options is None else options
    pctx = param_context(sdg)
    boxes = {i: sdg.isl_domain(i).intersect_params(pctx) for i in sdg.ops}
    maps = {e: sdg.isl_map(e) for e in sdg.edges}
    tight = {i for i, op in sdg.ops.items() if any(sdg.role(d) == "blocks" for d in op.domain)}
    domains = build.statement_domains(demand(sdg, boxes, maps), tight)
    build.check_untils(sdg, domains)
    dom, validity, deps = build.constraints(sdg, domains, maps)
    if options == "fusion":
        try:
            tree, placed = fusion.fusion_schedule(
                sdg, domains, [fusion.dep_of_map(m, sdg, index) for m, index in deps])
        except fusion.Declined as e:
            raise IncompleteSchedule(f"the fusion scheduler declined: {e}") from None
        if not fusion.check(tree.get_map(), [m for m, _ in deps]):
            raise IncompleteSchedule("the fused loop nest breaks a dependence")
    else:
        tree, placed = _isl_schedule(sdg, dom, validity, options), {}
    try:
        ast = build.mark_untils(build.lower(build.ast(tree, pctx), sdg), sdg,
                                shifts=options != "fusion")
    except build.IslScheduleRejected as e:
        raise IncompleteSchedule(str(e)) from None
    order = tree.get_map() if options == "fusion" else build.time_map(ast, sdg)
    if not dom.is_subset(order.domain()):
        raise IncompleteSchedule(f"the schedule ({options}) leaves out statement instances")
    return Schedule(sdg, domains, validity, tree, ast, order, options, placed)


def _isl_schedule(sdg: SDG, dom, validity, options: Mapping[str, int]):
    ctx = build.I.CTX
    saved = {k: getattr(ctx, f"get_schedule_{k}")() for k in options}
    try:
        for k, v in options.items():
            getattr(ctx, f"set_schedule_{k}")(v)
        try:
            return build.compute(sdg, dom, validity, tuple(sorted(options.items())))
        except build.IslCrashed as e:
            raise IncompleteSchedule(str(e)) from None
    finally:
        for k, v in saved.items():
            getattr(ctx, f"set_schedule_{k}")(v)


def walk(node: Node, env: dict[str, int],
         done: Callable[[While, int], bool] | None = None,
         tick: Callable[[], None] | None = None) -> Iterator[tuple[Node, tuple]]:
    """Execute the loop AST abstractly: yield ``(Exec, point)`` and ``(Free, Offload or
    Fetch, ())`` in schedule order.

    ``env`` holds the bound values (and is updated with loop variables). ``done(loop, point)``
    is asked in every iteration of a ``While`` loop, right after the statement that computes
    its condition (``While.split``), with the point of the condition, until it holds: the
    bound in ``env`` then becomes ``point + 1`` for the rest of the iteration, and the loop
    runs on while its own bound, evaluated with that value, allows; so do later loops. When that
    ends the loop early, the frees its last iteration would have made under the reached bound
    follow it (``last_frees``): those before the condition's statement were skipped while the
    bound was still the maximum. ``tick()`` is called after every iteration of an outermost
    loop (progress).
    """
    if isinstance(node, Exec):
        yield node, tuple(a.evaluate(env) for a in node.args)
    elif isinstance(node, (Free, Offload, Fetch)):
        yield node, ()
    elif isinstance(node, Seq):
        for n in node.body:
            yield from walk(n, env, done, tick)
    elif isinstance(node, If):
        if node.cond.evaluate(env):
            yield from walk(node.then, env, done, tick)
        elif node.orelse is not None:
            yield from walk(node.orelse, env, done, tick)
    elif isinstance(node, For):
        v, hi = node.lo.evaluate(env), node.hi.evaluate(env)
        ended = last = None
        head, tail = node.split() if isinstance(node, While) else (node.body, None)
        while v < hi:
            env[node.var] = last = v
            yield from walk(head, env, done)
            if tail is not None:
                if done is not None and ended is None:
                    at = node.at.evaluate(env)
                    if done(node, at):
                        ended, env[node.bound] = env[node.bound], at + 1
                yield from walk(tail, env, done)
            if tick is not None:
                tick()
            v += node.step
            hi = node.hi.evaluate(env)
        if ended is not None and ended != env[node.bound] and last is not None:
            env[node.var] = last
            yield from ((f, ()) for f in last_frees(node.body, env))
        env.pop(node.var, None)


def statement_counts(schedule: Schedule, bounds: Mapping[str, int]) -> dict[int, int]:
    """How many times each op's statement runs at these bound values, for a program without a
    ``tl.until`` bound (whose trips only a run knows): the points of its domain, counted by
    isl a range at a time (walking the loop AST step by step took 8.5 s at 10^6 steps)."""
    if schedule.sdg.untils:
        raise ArgumentError("statement_counts: a tl.until bound's value is known only by "
                            "running; read run.profile.calls", user_location())
    out = {}
    for i, dom in schedule.domains.items():
        n = I.fix(dom, dict(bounds)).count_val().to_python()
        if n:
            out[i] = n
    return out


def last_frees(node: Node, env: dict[str, int]) -> Iterator[Free]:
    """The ``Free`` nodes of ``node`` whose conditions hold in ``env`` (inner loops run over
    their ranges), without executing anything: what a ``While`` loop that ended early frees
    after its last iteration. Freeing a store twice is harmless to every executor."""
    if isinstance(node, Free):
        yield node
    elif isinstance(node, Seq):
        for n in node.body:
            yield from last_frees(n, env)
    elif isinstance(node, If):
        branch = node.then if node.cond.evaluate(env) else node.orelse
        if branch is not None:
            yield from last_frees(branch, env)
    elif isinstance(node, For) and node.has_free():
        v, hi = node.lo.evaluate(env), node.hi.evaluate(env)
        while v < hi:
            env[node.var] = v
            yield from last_frees(node.body, env)
            v += node.step
        env.pop(node.var, None)


__all__ = ["Schedule", "schedule_sdg", "walk", "last_frees", "statement_counts", "IncompleteSchedule", "OPTION_SETS",
           "FALLBACK_OPTION_SETS", "Exec", "Fetch", "For", "Free", "If", "Offload", "Seq", "Node",
           "While"]
