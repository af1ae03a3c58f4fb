"""Dims, bounds, index expressions, conditions and their isl form."""
from .cond import FALSE, TRUE, Cond, and_, as_cond, eq, le, lt, ne, not_, or_
from .expr import (
    Bound,
    Const,
    Dim,
    Expr,
    Product,
    Slice,
    Sym,
    as_expr,
    floordiv,
    max_,
    min_,
    mod,
)

__all__ = ["Bound", "Const", "Cond", "Dim", "Expr", "FALSE", "Product", "Slice", "Sym", "TRUE", "and_",
           "as_cond", "as_expr", "eq", "floordiv", "le", "lt", "max_", "min_", "mod", "ne",
           "not_", "or_"]
