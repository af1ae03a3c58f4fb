"""Integer index expressions over dims and bounds.

Expressions are kept in a canonical linear form (a sorted sum of atoms with integer coefficients
plus a constant), so that ``t + 1 - 1 == t`` holds structurally and ``==``/``hash`` can be plain
dataclass equality. Atoms are symbols (dims, bounds) and the non-linear pieces ``min``, ``max``,
``// c`` and ``% c``; together these are exactly isl's quasi-affine expressions.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

from ..errors import ExprError

if TYPE_CHECKING:
    pass

IntLike = Union[int, "Expr"]


class Expr:
    """Base of index expressions. Python ``==`` is structural; ``< <= > >=`` build conditions."""

    __slots__ = ()

    def __getstate__(self):  # the compiled lambda is a cache, not state (and not picklable)
        return {k: v for k, v in self.__dict__.items() if k != "_fn"}

    # -- arithmetic -------------------------------------------------------------------------
    def _not_integer(self, other, op: str):
        raise ExprError(f"index expressions are integers: {self} {op} {other!r} is not one. For "
                        f"integer division use //; to compute with {self} as a value, lift it "
                        f"first: (tl.zeros(()) + {self}) {op} {other!r}")

    def __truediv__(self, other):
        self._not_integer(other, "/")

    def __rtruediv__(self, other):
        self._not_integer(other, "/")

    def __add__(self, other):
        if _is_float(other):
            self._not_integer(other, "+")
        return _combine(self, other, 1) if _is_int_like(other) else NotImplemented

    def __radd__(self, other):
        return _combine(other, self, 1) if _is_int_like(other) else NotImplemented

    def __sub__(self, other):
        if _is_float(other):
            self._not_integer(other, "-")
        return _combine(self, other, -1) if _is_int_like(other) else NotImplemented

    def __rsub__(self, other):
        return _combine(other, self, -1) if _is_int_like(other) else NotImplemented

    def __neg__(self):
        return _scale(self, -1)

    def __pos__(self):
        return self

    def __mul__(self, other):
        if _is_float(other):
            self._not_integer(other, "*")
        if not _is_int_like(other):
            return NotImplemented
        other = as_expr(other)
        if isinstance(other, Const):
            return _scale(self, other.value)
        if isinstance(self, Const):
            return _scale(other, self.value)
        return Product((self, other))

    __rmul__ = __mul__

    def __floordiv__(self, other):
        return floordiv(self, other) if _is_int_like(other) else NotImplemented

    def __rfloordiv__(self, other):
        return floordiv(other, self) if _is_int_like(other) else NotImplemented

    def __mod__(self, other):
        return mod(self, other) if _is_int_like(other) else NotImplemented

    def __rmod__(self, other):
        return mod(other, self) if _is_int_like(other) else NotImplemented

    # -- conditions ---------------------------------------------------------------------------
    def __lt__(self, other):
        from .cond import lt
        return lt(self, other)

    def __le__(self, other):
        from .cond import le
        return le(self, other)

    def __gt__(self, other):
        from .cond import lt
        return lt(other, self)

    def __ge__(self, other):
        from .cond import le
        return le(other, self)

    def __index__(self):
        if isinstance(self, Const):
            return self.value
        raise ExprError(f"{self} is symbolic and cannot be used as a Python int; "
                        "evaluate it at a point with .evaluate({...}) first")

    # -- queries ------------------------------------------------------------------------------
    def evaluate(self, env: dict[str, int]) -> int:
        """Value at a point: ``env`` maps dim and bound names to ints. Compiled to a Python
        lambda on first use: the memory planner and the executors evaluate the same
        expressions millions of times."""
        return fast_evaluate(self, env)

    def atoms(self) -> tuple[Expr, ...]:
        """The symbols and non-linear pieces this expression is a linear combination of."""
        return (self,)

    def symbols(self) -> frozenset[Sym]:
        out: set[Sym] = set()
        for a in self.atoms():
            out |= a.symbols() if not isinstance(a, Sym) else {a}
        return frozenset(out)

    def dims(self) -> frozenset[Dim]:
        return frozenset(s for s in self.symbols() if isinstance(s, Dim))

    def bounds(self) -> frozenset[Bound]:
        return frozenset(s for s in self.symbols() if isinstance(s, Bound))

    def substitute(self, mapping: dict[Sym, IntLike]) -> Expr:
        """Replace symbols by expressions (and re-canonicalise)."""
        raise NotImplementedError

    @property
    def is_const(self) -> bool:
        return isinstance(self, Const)

    def _key(self) -> str:
        return str(self)


@dataclass(frozen=True, eq=False, repr=False)
class Const(Expr):
    value: int

    def __eq__(self, other):  # Const(3) == 3, so shapes may mix ints and constant expressions
        if isinstance(other, Const):
            return self.value == other.value
        return isinstance(other, int) and not isinstance(other, bool) and self.value == other

    def __hash__(self):
        return hash(self.value)

    def evaluate(self, env):
        return self.value

    def _py(self):
        return f"({self.value})"

    def atoms(self):
        return ()

    def substitute(self, mapping):
        return self

    def __str__(self):
        return str(self.value)

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class Sym(Expr):
    name: str

    def evaluate(self, env):
        try:
            return env[self.name]
        except KeyError:
            raise ExprError(f"no value for {self.name} when evaluating an index expression; "
                            "give every bound in ctx.compile(bounds=...)") from None

    def _py(self):
        return f"env[{self.name!r}]"

    def symbols(self):
        return frozenset({self})

    def substitute(self, mapping):
        return as_expr(mapping[self]) if self in mapping else self

    def __str__(self):
        return self.name

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class Dim(Sym):
    """A temporal dimension (loop variable) ``d in [0, D)``; its bound is the upper-case name."""

    @property
    def bound(self) -> Bound:
        return Bound(self.name.upper())

    def _key(self):
        return "0" + self.name


@dataclass(frozen=True, eq=True, repr=False)
class Bound(Sym):
    """The symbolic size of a dimension, given a value at compile time."""

    def _key(self):
        return "1" + self.name


@dataclass(frozen=True, eq=True, repr=False)
class Lin(Expr):
    """``sum(coeff * atom) + const`` with at least two parts; built only by ``_make``."""

    terms: tuple[tuple[Expr, int], ...]
    const: int

    def _eval(self, env):
        return sum(c * a.evaluate(env) for a, c in self.terms) + self.const

    def _py(self):
        return "(" + " + ".join([f"{c} * {a._py()}" for a, c in self.terms]
                                + [str(self.const)]) + ")"

    def atoms(self):
        return tuple(a for a, _ in self.terms)

    def substitute(self, mapping):
        return sum((a.substitute(mapping) * c for a, c in self.terms), Const(self.const))

    def __str__(self):
        out = ""
        for a, c in sorted(self.terms, key=lambda ac: ac[1] < 0):  # "T - t", not "-t + T"
            mag = abs(c)
            body = str(a) if mag == 1 else (
                f"{mag}*({a})" if isinstance(a, DivMod) else f"{mag}*{a}")
            out += (body if c > 0 else f"-{body}") if not out else (
                f" + {body}" if c > 0 else f" - {body}")
        if self.const:
            out += f" + {self.const}" if self.const > 0 else f" - {-self.const}"
        return out

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class MinMax(Expr):
    op: str  # "min" | "max"
    args: tuple[Expr, ...]

    def _eval(self, env):
        vals = [a.evaluate(env) for a in self.args]
        return min(vals) if self.op == "min" else max(vals)

    def _py(self):
        return f"{self.op}({', '.join(a._py() for a in self.args)})"

    def symbols(self):
        return frozenset().union(*(a.symbols() for a in self.args))

    def substitute(self, mapping):
        return _minmax(self.op, [a.substitute(mapping) for a in self.args])

    def __str__(self):
        return f"{self.op}({', '.join(map(str, self.args))})"

    __repr__ = __str__


@dataclass(frozen=True, eq=True, repr=False)
class DivMod(Expr):
    op: str  # "//" | "%"
    arg: Expr
    divisor: int

    def _eval(self, env):
        v = self.arg.evaluate(env)
        return v // self.divisor if self.op == "//" else v % self.divisor

    def _py(self):
        return f"({self.arg._py()} {self.op} {self.divisor})"

    def symbols(self):
        return self.arg.symbols()

    def substitute(self, mapping):
        sub = self.arg.substitute(mapping)
        return floordiv(sub, self.divisor) if self.op == "//" else mod(sub, self.divisor)

    def __str__(self):
        inner = str(self.arg)
        if isinstance(self.arg, Lin):
            inner = f"({inner})"
        return f"{inner} {self.op} {self.divisor}"

    __repr__ = __str__


# -- construction helpers --------------------------------------------------------------------
def fast_evaluate(x, env):
    """``x._py()`` compiled once per object and cached on it; a missing name falls back to
    ``x._eval``, which says which one (shared by expressions and conditions)."""
    fn = x.__dict__.get("_fn")
    if fn is None:
        fn = eval(f"lambda env: {x._py()}", {"min": min, "max": max})  # noqa: S307 - our AST
        object.__setattr__(x, "_fn", fn)
    try:
        return fn(env)
    except KeyError:
        return x._eval(env)


@dataclass(frozen=True)
class Product:
    """``B * T`` or ``t * T``: a product of expressions that are not constants. Not an index
    expression (isl's are quasi-affine), but a size users write: the frontend lifts it to a
    value wherever a tensor goes (``tl.random.permutation(j, B * T)``, ``x * (B * T)``). As an
    index, or in more index arithmetic, it is an ExprError that says so."""

    factors: tuple[Expr, ...]

    def __mul__(self, other):
        if isinstance(other, Product):
            return Product(self.factors + other.factors)
        return Product(self.factors + (as_expr(other),)) if _is_int_like(other) \
            else NotImplemented

    __rmul__ = __mul__

    def __str__(self) -> str:
        return " * ".join(f"({f})" if isinstance(f, Lin) else str(f) for f in self.factors)

    def error(self) -> ExprError:
        return ExprError(
            f"{self} is not an index expression: index expressions multiply only by integer "
            f"constants (write e.g. 2*t). As a value (a size, a count) it is fine where a tensor "
            f"goes, e.g. tl.random.permutation(j, {self}); for more arithmetic on it, make it "
            f"a tensor first: tl.zeros((), 'int32') + {self}")

    def _refuse(self, other):
        if not (_is_int_like(other) or isinstance(other, Product)):
            return NotImplemented   # a tensor's own operator lifts this product
        raise self.error()

    __add__ = __radd__ = __sub__ = __rsub__ = __floordiv__ = __rfloordiv__ = _refuse
    __mod__ = __rmod__ = __lt__ = __le__ = __gt__ = __ge__ = _refuse

    def __neg__(self):
        raise self.error()


def _is_int_like(x) -> bool:
    import numpy as np

    return isinstance(x, (int, Expr, np.integer)) and not isinstance(x, bool)


def _is_float(x) -> bool:
    import numpy as np

    return isinstance(x, (float, np.floating))


def as_expr(x) -> Expr:
    """Coerce an int (or numpy integer) to ``Const``; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if _is_int_like(x):
        return Const(int(x))
    if isinstance(x, Product):
        raise x.error()
    raise ExprError(f"{x!r} is not an integer index expression; use ints, dims, bounds and "
                    "+ - * // % tl.min tl.max")


def _linear(e: Expr) -> tuple[dict[Expr, int], int]:
    if isinstance(e, Const):
        return {}, e.value
    if isinstance(e, Lin):
        return dict(e.terms), e.const
    return {e: 1}, 0


def _make(terms: dict[Expr, int], const: int) -> Expr:
    items = sorted(((a, c) for a, c in terms.items() if c != 0), key=lambda ac: ac[0]._key())
    if not items:
        return Const(const)
    if len(items) == 1 and items[0][1] == 1 and const == 0:
        return items[0][0]
    return Lin(tuple(items), const)


def _combine(a, b, sign: int) -> Expr:
    ta, ca = _linear(as_expr(a))
    tb, cb = _linear(as_expr(b))
    terms = dict(ta)
    for atom, c in tb.items():
        terms[atom] = terms.get(atom, 0) + sign * c
    return _make(terms, ca + sign * cb)


def _scale(e: Expr, k: int) -> Expr:
    terms, c = _linear(e)
    return _make({a: k * v for a, v in terms.items()}, k * c)


def _positive_divisor(d, op: str) -> int:
    d = as_expr(d)
    if not isinstance(d, Const) or d.value <= 0:
        raise ExprError(f"'{op}' needs a positive integer constant on the right, got {d}")
    return d.value


def floordiv(a, d) -> Expr:
    a, k = as_expr(a), _positive_divisor(d, "//")
    terms, c = _linear(a)
    if k == 1:
        return a
    if all(v % k == 0 for v in terms.values()) and c % k == 0:
        return _make({x: v // k for x, v in terms.items()}, c // k)
    return DivMod("//", a, k)


def mod(a, d) -> Expr:
    a, k = as_expr(a), _positive_divisor(d, "%")
    terms, c = _linear(a)
    if k == 1 or (all(v % k == 0 for v in terms.values()) and c % k == 0):
        return Const(0)
    if not terms:
        return Const(c % k)
    return DivMod("%", a, k)


def _minmax(op: str, args) -> Expr:
    flat: list[Expr] = []
    for a in map(as_expr, args):
        flat.extend(a.args if isinstance(a, MinMax) and a.op == op else [a])
    kept: list[Expr] = []
    for a in flat:  # drop an argument dominated by another that differs by a constant
        for i, k in enumerate(kept):
            diff = _combine(a, k, -1)
            if isinstance(diff, Const):
                a_wins = diff.value < 0 if op == "min" else diff.value > 0
                kept[i] = a if a_wins else k
                break
        else:
            kept.append(a)
    if len(kept) == 1:
        return kept[0]
    return MinMax(op, tuple(sorted(kept, key=lambda e: e._key())))


def min_(*args) -> Expr:
    """``tl.min(a, b, ...)`` on index expressions."""
    if len(args) < 2:
        raise ExprError("tl.min needs at least two index expressions")
    return _minmax("min", args)


def max_(*args) -> Expr:
    """``tl.max(a, b, ...)`` on index expressions."""
    if len(args) < 2:
        raise ExprError("tl.max needs at least two index expressions")
    return _minmax("max", args)


@dataclass(frozen=True, eq=True)
class Slice:
    """A half-open range ``start:stop`` of a temporal dim; its length may be symbolic."""

    start: Expr
    stop: Expr

    @staticmethod
    def of(s: slice, bound: Bound) -> Slice:
        if s.step is not None:
            raise ExprError(f"temporal slices take no step (got {s.step}); read a range and "
                            "index it spatially instead")
        start = as_expr(0 if s.start is None else s.start)
        stop = as_expr(bound if s.stop is None else s.stop)
        return Slice(start, stop)

    @property
    def length(self) -> Expr:
        """``stop - start``, with a window's ``max``/``min`` end distributed out, so that
        ``max(0, t - 2):t + 1`` has length ``min(t + 1, 3)``."""
        if isinstance(self.start, MinMax) and self.start.op == "max":
            return min_(*(Slice(a, self.stop).length for a in self.start.args))
        if isinstance(self.stop, MinMax) and self.stop.op == "min":
            return min_(*(Slice(self.start, a).length for a in self.stop.args))
        return self.stop - self.start

    def symbols(self):
        return self.start.symbols() | self.stop.symbols()

    def dims(self):
        return self.start.dims() | self.stop.dims()

    def substitute(self, mapping):
        return Slice(self.start.substitute(mapping), self.stop.substitute(mapping))

    def __str__(self):
        return f"{self.start}:{self.stop}"

    __repr__ = __str__
