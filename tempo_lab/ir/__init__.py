"""The primitive-op catalog and the symbolic dependence graph."""
from .ops import CATALOG, OpDef, TensorType
from .sdg import SDG, Edge, Op

__all__ = ["CATALOG", "Edge", "Op", "OpDef", "SDG", "TensorType"]
