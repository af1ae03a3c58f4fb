"""Tracing: the Context, recurrent tensors, the functional API and compile-time validation."""
from .context import Context
from .tensor import RecurrentTensor
from .trace import Trace

__all__ = ["Context", "RecurrentTensor", "Trace"]
