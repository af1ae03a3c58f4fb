"""``tl.nn``: functional neural-network modules over recurrent tensors.

A module is a frozen dataclass holding only its sizes; ``module.init(seed)`` returns a dict of
NumPy parameters (nested modules use dotted names, ``"attn.wq"``) and ``module(params, x, ...)``
builds the ops for one point of ``x``'s domain. Parameters may be arrays (lifted as constants),
tensors to differentiate with ``tl.grad``, or tensors over an iteration dim.
"""
from ._params import ParamError
from .attention import MultiHeadAttention, TransformerBlock, attention, rope
from .layers import (
    ACTIVATIONS,
    MLP,
    Embedding,
    LayerNorm,
    Linear,
    RMSNorm,
    SwiGLU,
    gelu,
    silu,
)
from .params import as_tensors

__all__ = [
    "ACTIVATIONS", "MLP", "Embedding", "LayerNorm", "Linear", "MultiHeadAttention", "ParamError",
    "RMSNorm", "SwiGLU", "TransformerBlock", "as_tensors", "attention", "gelu", "rope", "silu",
]
