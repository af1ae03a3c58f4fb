"""Boolean conditions over index expressions.

Comparisons are normalised to ``e >= 0`` and ``e == 0`` so that equal conditions compare equal;
``& | ~`` build And/Or/Not with constant folding. A condition is never a Python bool: using one
in ``if`` raises, because that is almost always a mistake in traced code.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ExprError
from .expr import Bound, Const, Dim, Expr, Lin, MinMax, Sym, as_expr, fast_evaluate


def not_a_bool(value, what: str):
    """A Python bool where a condition is expected is almost always ``t == 1`` (``==`` on
    expressions compares them as objects, for dicts and shapes): say so instead of using it."""
    if isinstance(value, (bool, np.bool_)):
        raise ExprError(f"{what} is the Python bool {bool(value)}: == and != on dims and index "
                        "expressions compare the expressions themselves, not their values; "
                        "write tl.eq(t, 1) or tl.ne(t, 1) for a condition")
    return value


class Cond:
    __slots__ = ()

    # with anything but a condition (e.g. a bool tensor) let the other operand decide
    def __and__(self, other):
        return and_(self, not_a_bool(other, "the right of &")) if isinstance(
            other, (Cond, bool)) else NotImplemented

    def __or__(self, other):
        return or_(self, not_a_bool(other, "the right of |")) if isinstance(
            other, (Cond, bool)) else NotImplemented

    def __invert__(self):
        return not_(self)

    def __rand__(self, other):
        return and_(not_a_bool(other, "the left of &"), self) if isinstance(
            other, (Cond, bool)) else NotImplemented

    def __ror__(self, other):
        return or_(not_a_bool(other, "the left of |"), self) if isinstance(
            other, (Cond, bool)) else NotImplemented

    def __bool__(self):
        raise ExprError(f"the condition {self} is symbolic and has no truth value here; use it as "
                        "a branch key (x[t < 3] = ...), in tl.where, or combine with & | ~ "
                        "(not 'and'/'or'/'not' or chained comparisons)")

    def evaluate(self, env: dict[str, int]) -> bool:
        """Compiled to a Python lambda on first use, like ``Expr.evaluate``."""
        return fast_evaluate(self, env)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_fn"}

    def symbols(self):
        raise NotImplementedError

    def dims(self):
        return frozenset(s for s in self.symbols() if isinstance(s, Dim))

    def substitute(self, mapping) -> Cond:
        raise NotImplementedError


@dataclass(frozen=True, eq=True, repr=False)
class BoolConst(Cond):
    value: bool

    def evaluate(self, env):
        return self.value

    def _py(self):
        return str(bool(self.value))

    def symbols(self):
        return frozenset()

    def substitute(self, mapping):
        return self

    def __str__(self):
        return "true" if self.value else "false"

    __repr__ = __str__


TRUE = BoolConst(True)
FALSE = BoolConst(False)


@dataclass(frozen=True, eq=True, repr=False)
class Cmp(Cond):
    """``expr >= 0`` (op ">=") or ``expr == 0`` (op "==")."""

    op: str
    expr: Expr

    def _eval(self, env):
        v = self.expr.evaluate(env)
        return v >= 0 if self.op == ">=" else v == 0

    def _py(self):
        return f"({self.expr._py()} {self.op} 0)"

    def symbols(self):
        return self.expr.symbols()

    def substitute(self, mapping):
        return compare(self.op, self.expr.substitute(mapping))

    def __str__(self):
        # Put one dim with coefficient +-1 on the left: "t >= 1", "t < T", "t == 0".
        e = self.expr
        terms = e.terms if isinstance(e, Lin) else ((e, 1),)
        lead = next(((a, c) for a, c in terms if isinstance(a, Dim) and abs(c) == 1), None)
        if lead is None:
            return f"{e} {self.op} 0"
        a, c = lead
        rest = -(e - a * c) * c  # a*c + r >= 0  <=>  a >= -r (c=1)  or  a <= r (c=-1)
        if self.op == "==":
            return f"{a} == {rest}"
        if c == 1:
            return f"{a} >= {rest}"
        return f"{a} < {rest + 1}"

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class Junction(Cond):
    op: str  # "and" | "or"
    args: tuple[Cond, ...]

    def _eval(self, env):
        vals = (a.evaluate(env) for a in self.args)
        return all(vals) if self.op == "and" else any(vals)

    def _py(self):
        return "(" + f" {self.op} ".join(a._py() for a in self.args) + ")"

    def symbols(self):
        return frozenset().union(*(a.symbols() for a in self.args))

    def substitute(self, mapping):
        return _junction(self.op, [a.substitute(mapping) for a in self.args])

    def __str__(self):
        sep = " & " if self.op == "and" else " | "
        return sep.join(f"({a})" if isinstance(a, Junction) else str(a) for a in self.args)

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class Not(Cond):
    arg: Cond

    def _eval(self, env):
        return not self.arg.evaluate(env)

    def _py(self):
        return f"(not {self.arg._py()})"

    def symbols(self):
        return self.arg.symbols()

    def substitute(self, mapping):
        return not_(self.arg.substitute(mapping))

    def __str__(self):
        if isinstance(self.arg, Cmp) and self.arg.op == "==":
            return str(self.arg).replace(" == ", " != ", 1)
        return f"~({self.arg})"

    __repr__ = __str__


def as_cond(c) -> Cond:
    if isinstance(c, Cond):
        return c
    if isinstance(c, bool):
        return TRUE if c else FALSE
    raise ExprError(f"{c!r} is not a condition; build one with < <= > >= tl.eq tl.ne & | ~")


def compare(op: str, e: Expr) -> Cond:
    if isinstance(e, Const):
        return as_cond(e.value >= 0 if op == ">=" else e.value == 0)
    if op == "==" and isinstance(e, Lin) and e.terms[0][1] < 0:
        e = -e  # t - 1 == 0 and 1 - t == 0 are the same condition
    return Cmp(op, e)


def le(a, b) -> Cond:
    return compare(">=", as_expr(b) - as_expr(a))


def lt(a, b) -> Cond:
    return compare(">=", as_expr(b) - as_expr(a) - 1)


def eq(a, b) -> Cond:
    """``tl.eq(a, b)``: the symbolic ``a == b`` (Python ``==`` is structural equality)."""
    return compare("==", as_expr(a) - as_expr(b))


def ne(a, b) -> Cond:
    """``tl.ne(a, b)``: the symbolic ``a != b``."""
    return not_(eq(a, b))


def _junction(op: str, args) -> Cond:
    unit, absorbing = (TRUE, FALSE) if op == "and" else (FALSE, TRUE)
    flat: list[Cond] = []
    for a in map(as_cond, args):
        for x in (a.args if isinstance(a, Junction) and a.op == op else (a,)):
            if x == absorbing:
                return absorbing
            if x != unit and x not in flat:
                flat.append(x)
    if not flat:
        return unit
    return flat[0] if len(flat) == 1 else Junction(op, tuple(flat))


def and_(*args) -> Cond:
    return _junction("and", args)


def or_(*args) -> Cond:
    return _junction("or", args)


def not_(c) -> Cond:
    c = as_cond(c)
    if isinstance(c, BoolConst):
        return as_cond(not c.value)
    if isinstance(c, Not):
        return c.arg
    if isinstance(c, Cmp) and c.op == ">=":
        return compare(">=", -c.expr - 1)  # ~(e >= 0)  <=>  -e - 1 >= 0
    return Not(c)


@dataclass(frozen=True)
class AtMost:
    """A key of ``decide``'s ranges: ``sym`` is at most the entry's expression (a loop's
    variable is at most its end less one)."""

    sym: Sym


def decide(c: Cond, lower: dict) -> bool | None:
    """Whether ``c`` holds wherever each dim or bound of ``lower`` is at least its expression
    (or equal to it, where flagged exact): True or False when that settles it, else None. A
    loop's body then drops the branches its range settles (``t >= 1`` after the first step).
    An ``AtMost(v)`` key gives ``v`` a largest value too. Each reading of the ranges is sound
    alone, so ``c`` is tried at the lower ends, then with the variables that have one at
    their upper ends (``t <= P - 1`` settles ``t >= P``); a ``max`` lower end (``min`` upper
    end) is read as each of its arguments (the loop from a cut at ``P``, ``max(0, P)..T``)."""
    tops = {k.sym: e for k, (e, _) in lower.items() if isinstance(k, AtMost)}
    lows = {k: v for k, v in lower.items() if not isinstance(k, AtMost)}
    starts = _ends(lows, "max")
    ends = _ends({v: (e, False) for v, e in tops.items()}, "min") if tops else []
    readings = [(lo, {}) for lo in starts] + [(lo, top) for lo in starts for top in ends]
    for lo, top in readings[:16]:
        got = _decide(c, lo, {v: e for v, (e, _) in top.items()})
        if got is not None:
            return got
    return None


def _ends(ranges: dict, op: str) -> list[dict]:
    """``ranges`` with each ``op`` (``max`` for lower ends) read as one of its arguments,
    every combination."""
    out = [{}]
    for v, (e, exact) in ranges.items():
        out = [{**r, v: (a, exact)} for r in out for a in ((e,) if exact else _alts(e, op))]
    return out


def _alts(e, op: str) -> tuple:
    """``e``'s readings: the arguments of an ``op`` in it (``min(T, P) - 1``: ``T - 1`` and
    ``P - 1``), or ``e`` alone."""
    e = as_expr(e)
    if isinstance(e, Lin) and len(e.terms) == 1 and e.terms[0][1] == 1:
        return tuple(a + e.const for a in _alts(e.terms[0][0], op))
    return e.args if isinstance(e, MinMax) and e.op == op else (e,)


def _decide(c: Cond, lower: dict, tops: dict) -> bool | None:
    above = {v: Sym(f"{v.name}+") for v in lower}  # v = lo + (v+), with v+ >= 0
    below = {v: Sym(f"{v.name}-") for v in tops}  # v = top - (v-), with v- >= 0
    mapping = {v: as_expr(lo) if exact else as_expr(lo) + above[v]
               for v, (lo, exact) in lower.items()}
    mapping.update({v: as_expr(top) - below[v] for v, top in tops.items()})
    # a variable between two ends says the upper is at least the lower (a loop from P to T
    # runs only where T - 1 - P >= 0): a bound in that fact is written as what it is at
    # least, plus a fresh amount (T = P + 1 + (T~)), so that a guard on it settles
    facts, fresh = {}, set(above.values()) | set(below.values())
    for v, top in tops.items():
        if v in lower and not lower[v][1]:
            fact = as_expr(top) - as_expr(lower[v][0])
            terms = dict(fact.terms) if isinstance(fact, Lin) else {fact: 1} if isinstance(
                fact, Bound) else {}
            b = next((b for b, k in terms.items() if isinstance(b, Bound) and abs(k) == 1
                      and b not in facts), None)
            if b is not None:
                f = Sym(f"{b.name}~")
                fresh.add(f)
                facts[b] = as_expr(b) - fact + f if terms[b] == 1 else as_expr(b) + fact - f
    # the loops' variables first, then the facts, then the bounds their ranges name (c0
    # from -T + 1 with T from 8: c0 + T - 2 >= 0 holds after the first step, once T has
    # cancelled)
    steps = [m for m in ({v: e for v, e in mapping.items() if not isinstance(v, Bound)},
                         facts,
                         {v: e for v, e in mapping.items() if isinstance(v, Bound)}) if m]

    def go(c: Cond) -> bool | None:
        if isinstance(c, BoolConst):
            return c.value
        if isinstance(c, Not):
            r = go(c.arg)
            return None if r is None else not r
        if isinstance(c, Junction):
            rs = [go(a) for a in c.args]
            settle, other = (False, True) if c.op == "and" else (True, False)
            return settle if settle in rs else other if all(r is other for r in rs) else None
        if not isinstance(c, Cmp):
            return None
        e = c.expr
        for step in steps:
            e = e.substitute(step)
        terms, b = ((e.terms, e.const) if isinstance(e, Lin) else
                    ((), e.value) if isinstance(e, Const) else (((e, 1),), 0))
        if any(a not in fresh for a, _ in terms):
            return None
        up, down = any(k > 0 for _, k in terms), any(k < 0 for _, k in terms)
        # e takes values in [b, inf) (only up), (-inf, b] (only down), or {b} (neither)
        if c.op == ">=":
            return True if not down and b >= 0 else False if not up and b < 0 else None
        if (not down and b > 0) or (not up and b < 0):
            return False
        return b == 0 if not up and not down else None

    return go(c)
