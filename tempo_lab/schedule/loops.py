"""A small loop AST, lowered from isl's AST, that executors walk and people read.

Index expressions and conditions in it are the project's own (``tempo_lab.symbolic``) over loop
iterators and bounds, so they evaluate with ``.evaluate(env)`` and print readably.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..symbolic import Cond, Expr


class Node:
    def walk(self) -> Iterator[Node]:
        yield self

    def has_free(self) -> bool:
        """Whether a ``Free`` is in this subtree."""
        return any(isinstance(n, Free) for n in self.walk())


@dataclass(frozen=True)
class Exec(Node):
    """Run op ``op`` at the point ``args`` (one expression per dim of its domain)."""

    op: int
    args: tuple[Expr, ...]


@dataclass(frozen=True)
class Free(Node):
    """Release the stores of ``ops``: their last reader has run."""

    ops: tuple[int, ...]


@dataclass(frozen=True)
class Offload(Node):
    """Copy the stores of ``ops`` to host memory and release them on the device: nothing reads
    them until the matching ``Fetch`` (placed by ``memory/offload.py`` under a device memory
    budget)."""

    ops: tuple[int, ...]


@dataclass(frozen=True)
class Fetch(Node):
    """Copy the stores of ``ops`` back to the device from host memory."""

    ops: tuple[int, ...]


@dataclass(frozen=True)
class Seq(Node):
    body: tuple[Node, ...]

    def walk(self):
        yield self
        for n in self.body:
            yield from n.walk()


@dataclass(frozen=True)
class For(Node):
    """``for var in range(lo, hi)``; ``dim`` names the dim it walks, if it walks exactly one."""

    var: str
    lo: Expr
    hi: Expr
    body: Node
    dim: str | None = None
    step: int = 1

    def walk(self):
        yield self
        yield from self.body.walk()


@dataclass(frozen=True)
class While(For):
    """A loop over a ``tl.until`` dim: it ends if ``done`` (an op over that dim alone) is true
    at the point ``at`` (the loop variable, perhaps shifted), and the bound ``bound`` then
    holds the number of points reached, ``at + 1``: the rest of that iteration (``split``) and
    later code see it."""

    bound: str = ""
    done: int = -1
    at: Expr | None = None

    def split(self) -> tuple[Node, Node]:
        """The body up to the top-level statement that runs ``done``, and the rest. The bound
        is set between them, the moment its condition holds: isl places an op that reads the
        bound after every point of ``done``, which may be later in that same iteration
        (``if t == T - 1: x[T - 1]``)."""
        body = self.body.body if isinstance(self.body, Seq) else (self.body,)
        k = next((j for j, n in enumerate(body)
                  if any(isinstance(x, Exec) and x.op == self.done for x in n.walk())),
                 len(body) - 1)
        return Seq(body[:k + 1]), Seq(body[k + 1:])


@dataclass(frozen=True)
class If(Node):
    cond: Cond
    then: Node
    orelse: Node | None = None

    def walk(self):
        yield self
        yield from self.then.walk()
        if self.orelse is not None:
            yield from self.orelse.walk()


def execs_under(node: Node, loops: tuple = (), conds: tuple = ()) -> Iterator[tuple]:
    """Every statement under ``node`` with the loops and the conditions (of ``If`` nodes)
    around it, within ``node``: ``(exec, loops, conds)``."""
    if isinstance(node, Seq):
        for n in node.body:
            yield from execs_under(n, loops, conds)
    elif isinstance(node, If):
        yield from execs_under(node.then, loops, conds + (node.cond,))
        if node.orelse is not None:
            yield from execs_under(node.orelse, loops, conds + (node.cond,))
    elif isinstance(node, For):
        yield from execs_under(node.body, loops + (node,), conds)
    elif isinstance(node, Exec):
        yield node, loops, conds


def to_code(node: Node, label=lambda op: f"%{op}", stmt=None, indent: int = 0) -> list[str]:
    """Readable loop pseudo-code, one statement per line; ``stmt(exec_node)`` may spell out
    what an ``Exec`` computes."""
    pad = "  " * indent
    if isinstance(node, Seq):
        return [line for n in node.body for line in to_code(n, label, stmt, indent)]
    if isinstance(node, For):
        step = f" step {node.step}" if node.step != 1 else ""
        until = f" until {label(node.done)}[{node.at}]" if isinstance(node, While) else ""
        head = f"{pad}for {node.var} in {node.lo}..{node.hi}{step}{until}:"
        if node.dim and node.dim != node.var:
            head += f"  # {node.dim}"
        return [head] + to_code(node.body, label, stmt, indent + 1)
    if isinstance(node, If):
        out = [f"{pad}if {node.cond}:"] + to_code(node.then, label, stmt, indent + 1)
        if node.orelse is not None:
            out += [f"{pad}else:"] + to_code(node.orelse, label, stmt, indent + 1)
        return out
    if isinstance(node, Exec):
        if stmt is not None:
            return [pad + stmt(node)]
        return [f"{pad}{label(node.op)}[{', '.join(map(str, node.args))}]"]
    if isinstance(node, (Free, Offload, Fetch)):
        word = type(node).__name__.lower()
        return [f"{pad}{word} {', '.join(label(o) for o in node.ops)}"]
    raise TypeError(node)
