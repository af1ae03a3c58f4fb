"""Polyhedral scheduling: the ``Schedule`` stage (isl constraints, isl schedule tree, loop AST)."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import islpy as isl

from ..ir.sdg import SDG
from ..stage import Stage
from ..symbolic import TRUE
from . import build
from .loops import Exec, For, Free, If, Node, Seq, to_code

SCHEMA = "tempo_lab.schedule/1"


class Schedule(Stage):
    """How the SDG runs: one isl statement per op over its demanded points, the dependences
    that order them, the isl schedule tree, and the loop AST executors walk."""

    def __init__(self, sdg: SDG, domains: Mapping[int, isl.Set], validity: isl.UnionMap,
                 tree: isl.Schedule, ast: Node, order: isl.UnionMap):
        self.sdg, self.domains, self.validity, self.tree, self.ast = (sdg, dict(domains),
                                                                      validity, tree, ast)
        self.order = order  # statement instance -> time in the loop AST that runs

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
        deps = sorted(str(m) for m in build.maps_of(self.validity))
        return [("loops", self.code().splitlines()),
                ("statements (demanded points)", doms),
                ("validity = proximity (producer -> consumer)", deps),
                ("isl schedule tree", str(self.tree.get_root()).splitlines()
                 if hasattr(self.tree, "get_root") else str(self.tree).splitlines())]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "code": self.code().splitlines(),
                "domains": {str(i): str(self.domains[i]) for i in self.statements},
                "validity": sorted(str(m) for m in build.maps_of(self.validity)),
                "tree": str(self.tree)}


def _depth(node: Node) -> int:
    if isinstance(node, For):
        return 1 + _depth(node.body)
    if isinstance(node, Seq):
        return max((_depth(n) for n in node.body), default=0)
    if isinstance(node, If):
        return max(_depth(node.then), _depth(node.orelse) if node.orelse else 0)
    return 0


def schedule_sdg(sdg: SDG, domains: Mapping[int, isl.Set], maps) -> Schedule:
    """Schedule an SDG whose ops are demanded on ``domains`` (parametric isl sets)."""
    domains = build.statement_domains(domains)
    dom, validity = build.constraints(sdg, domains, maps)
    tree = build.compute(sdg, dom, validity)
    ast = build.lower(build.ast(tree, build.param_context(sdg)), sdg)
    order = build.time_map(ast, sdg)
    ast = build.insert_frees(ast, build.last_reads(sdg, order, domains, maps), sdg)
    return Schedule(sdg, domains, validity, tree, ast, order)


def walk(node: Node, env: dict[str, int],
         stop: Callable[[For, dict], bool] | None = None) -> Iterator[tuple[Node, tuple]]:
    """Execute the loop AST abstractly: yield ``(Exec or Free, point)`` in schedule order.

    ``env`` holds the bound values (and is updated with loop variables). ``stop(loop, env)`` is
    asked after every iteration of a loop and ends it early when true (data-dependent bounds);
    bounds in ``env`` may change meanwhile, so later loops see the new value.
    """
    if isinstance(node, Exec):
        yield node, tuple(a.evaluate(env) for a in node.args)
    elif isinstance(node, Free):
        yield node, ()
    elif isinstance(node, Seq):
        for n in node.body:
            yield from walk(n, env, stop)
    elif isinstance(node, If):
        if node.cond.evaluate(env):
            yield from walk(node.then, env, stop)
        elif node.orelse is not None:
            yield from walk(node.orelse, env, stop)
    elif isinstance(node, For):
        v, hi = node.lo.evaluate(env), node.hi.evaluate(env)
        while v < hi:
            env[node.var] = v
            yield from walk(node.body, env, stop)
            if stop is not None and stop(node, env):
                break
            v += node.step
            hi = node.hi.evaluate(env)
        env.pop(node.var, None)


__all__ = ["Schedule", "schedule_sdg", "walk", "Exec", "For", "Free", "If", "Seq", "Node"]
