"""Index expressions and conditions as Python source (for generated executors) or as traced JAX
integers (for XLA loops), instead of walking ``Expr.evaluate`` at every statement instance.

Loop variables and dims print as ``i_<name>`` and bounds as ``N_<name>``, so they cannot clash
with the generated code's own names.
"""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from ..symbolic import Bound, Const, Dim, Expr
from ..symbolic.cond import BoolConst, Cmp, Cond, Junction, Not
from ..symbolic.expr import DivMod, Lin, MinMax

KNOWN_INT = (int, np.integer)  # an index known while tracing: a constant of the program


def var(name: str) -> str:
    return f"i_{name}"


def bound(name: str) -> str:
    return f"N_{name}"


def expr_src(e) -> str:
    """Python source of an integer index expression."""
    if isinstance(e, int):
        return str(e)
    if isinstance(e, Const):
        return str(e.value)
    if isinstance(e, Bound):
        return bound(e.name)
    if isinstance(e, Dim):
        return var(e.name)
    if isinstance(e, Lin):
        parts = []
        for a, c in e.terms:
            body = expr_src(a) if abs(c) == 1 else f"{abs(c)} * {_atom(a)}"
            parts.append(("- " if c < 0 else "+ ") + body)
        if e.const:
            parts.append(("- " if e.const < 0 else "+ ") + str(abs(e.const)))
        out = " ".join(parts)
        return out[2:] if out.startswith("+ ") else "-" + out[2:]
    if isinstance(e, MinMax):
        return f"{e.op}({', '.join(expr_src(a) for a in e.args)})"
    if isinstance(e, DivMod):
        return f"({expr_src(e.arg)}) {e.op} {e.divisor}"
    raise TypeError(f"no source for index expression {e!r}")


def _atom(e) -> str:
    s = expr_src(e)
    return s if isinstance(e, (Const, Bound, Dim, MinMax)) else f"({s})"


def cond_src(c: Cond) -> str:
    """Python source of a condition on dims and bounds."""
    if isinstance(c, BoolConst):
        return "True" if c.value else "False"
    if isinstance(c, Cmp):
        return f"{expr_src(c.expr)} {c.op} 0"
    if isinstance(c, Junction):
        sep = " and " if c.op == "and" else " or "
        return sep.join(f"({cond_src(a)})" for a in c.args)
    if isinstance(c, Not):
        return f"not ({cond_src(c.arg)})"
    raise TypeError(f"no source for condition {c!r}")


def jax_int(e, env: dict):
    """The value of an index expression with traced (or plain) ints in ``env``: names are
    ``i_<dim>`` / ``N_<bound>`` as in the generated source."""
    if isinstance(e, int):
        return e
    if isinstance(e, Const):
        return e.value
    if isinstance(e, Bound):
        return env[bound(e.name)]
    if isinstance(e, Dim):
        return env[var(e.name)]
    if isinstance(e, Lin):
        out = e.const
        for a, c in e.terms:
            out = out + c * jax_int(a, env)
        return out
    if isinstance(e, MinMax):
        vals = [jax_int(a, env) for a in e.args]
        out = vals[0]
        for v in vals[1:]:
            out = jnp.minimum(out, v) if e.op == "min" else jnp.maximum(out, v)
        return out
    if isinstance(e, DivMod):
        v = jax_int(e.arg, env)
        if isinstance(v, KNOWN_INT):  # stays a constant of the trace
            return v // e.divisor if e.op == "//" else v % e.divisor
        return _floor_divmod(v, e.divisor, e.op)
    raise TypeError(f"cannot evaluate index expression {e!r}")


def _floor_divmod(v, k: int, op: str):
    """``v // k`` or ``v % k`` for a traced ``v`` and a positive ``k``, in a few lax ops:
    ``jnp``'s operators also handle a negative divisor, and each call is a nested jit to trace,
    which an index inside every statement of a large program pays hundreds of times."""
    r = lax.rem(v, k)
    neg = r < 0
    if op == "%":
        return lax.select(neg, r + k, r)
    q = lax.div(v, k)
    return lax.select(neg, q - 1, q)


def jax_bool(c: Cond, env: dict):
    """A condition as a traced bool (``jnp``), with the names of :func:`jax_int`."""
    if isinstance(c, BoolConst):
        return jnp.asarray(c.value)
    if isinstance(c, Cmp):
        v = jax_int(c.expr, env)
        return jnp.asarray(v >= 0 if c.op == ">=" else v == 0)
    if isinstance(c, Junction):
        vals = [jax_bool(a, env) for a in c.args]
        out = vals[0]
        for v in vals[1:]:
            out = (out & v) if c.op == "and" else (out | v)
        return out
    if isinstance(c, Not):
        return ~jax_bool(c.arg, env)
    raise TypeError(f"cannot evaluate condition {c!r}")


def value_src(x) -> str:
    """Python source of a dim value: an integer expression or a condition (``tl.where(t < 2,
    ...)`` makes a bool value of a condition)."""
    return cond_src(x) if isinstance(x, Cond) else expr_src(x)


def jax_value(x, env: dict):
    """A dim value (integer expression or condition) as a traced JAX scalar."""
    return jax_bool(x, env) if isinstance(x, Cond) else jax_int(x, env)


def is_expr(x) -> bool:
    return isinstance(x, (int, Expr))
