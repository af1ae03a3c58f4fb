"""Working with parameter dicts: tensors of the active context, and nested modules' entries."""
from __future__ import annotations

from ..frontend.api import from_array
from ._params import nest, sub

__all__ = ["as_tensors", "nest", "sub"]


def as_tensors(params: dict, domain=()) -> dict:
    """Each parameter as a ``tl.from_array`` tensor named after its key, so that ``tl.grad`` can
    differentiate with respect to it; with ``domain=(i,)`` the arrays' leading axis is an
    iteration dim (one parameter set per point)."""
    return {k: from_array(v, domain=domain, name=k.replace(".", "_")) for k, v in params.items()}
