"""``tl.nn``: functional neural-network modules over recurrent tensors.

A module is a frozen dataclass holding only its sizes; ``module.init(seed)`` returns a dict of
NumPy parameters (nested modules use dotted names, ``"attn.wq"``) and ``module(params, x, ...)``
builds the ops for one point of ``x``'s domain. Parameters may be arrays (lifted as constants),
tensors to differentiate with ``tl.grad``, or tensors over an iteration dim::

    block = tl.nn.TransformerBlock(embed=16, heads=2, hidden=32, window=4, rope=True)
    params = block.init(seed=0)              # {"attn.wq": array, "norm1.scale": array, ...}
    with ctx:                                # ctx = tl.Context(dims=("b", "t"))
        x = tl.from_array(tokens, domain=(b, t))
        ps = tl.nn.as_tensors(params)        # differentiable: tl.grad(loss, list(ps.values()))
        y = block(ps, x, t)                  # keys/values read over max(0, t-3):t+1 along t

Errors for wrong sizes, dtypes or missing parameters are ``tl.TempoLabError`` subclasses located
at the user's call.
"""
from ._params import ParamError
from .attention import (
    MultiHeadAttention,
    RopeScaling,
    TransformerBlock,
    attention,
    rope,
    rope_frequencies,
    tokens_known,
)
from .auto import AutoModel
from .checkpoint import load_llama
from .generate import TextStream, generate
from .gpt2 import GPT2
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
from .llama import Llama
from .params import as_tensors
from .sampling import sample
from .tokenizer import Tokenizer
from .trees import TreeLevels, tree_levels

__all__ = [
    "ACTIVATIONS", "AutoModel", "GPT2", "MLP", "Embedding", "LayerNorm", "Linear", "Llama", "MultiHeadAttention",
    "ParamError", "RMSNorm", "RopeScaling", "SwiGLU", "TextStream", "Tokenizer", "TransformerBlock",
    "TreeLevels",
    "as_tensors", "attention", "gelu", "generate", "load_llama", "rope", "rope_frequencies", "sample",
    "silu", "tokens_known", "tree_levels",
]
