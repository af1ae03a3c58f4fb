"""A GPT-2 decoder over recurrent tensors, its layers as a dim (as ``tl.nn.Llama``'s).

GPT-2 differs from Llama in each part: learned position embeddings added to the token's
(no RoPE), LayerNorm with a bias, multi-head attention with biases and one key/value head per
query head, a two-matrix feed-forward with GELU (the tanh approximation, ``gelu_new``), and a
head tied to the token embedding. Matrices are ``(in, out)``, as GPT-2's ``Conv1D`` stores
them, so a checkpoint is read as it is; q, k and v come from one fused matrix, as in the
checkpoint (``c_attn``).

Parameters (NumPy arrays of one floating dtype; layer entries stacked over ``layers``)::

    embed.w               (vocab, embed)       tokens; also the output head
    pos.w                 (positions, embed)   positions 0 .. positions - 1
    layers.norm1.scale / bias                  (layers, embed)
    layers.attn.w_qkv     (layers, embed, 3 * embed),   layers.attn.b_qkv  (layers, 3 * embed)
    layers.attn.w_o       (layers, embed, embed),       layers.attn.b_o    (layers, embed)
    layers.norm2.scale / bias                  (layers, embed)
    layers.mlp.w_fc       (layers, embed, hidden),      layers.mlp.b_fc    (layers, hidden)
    layers.mlp.w_proj     (layers, hidden, embed),      layers.mlp.b_proj  (layers, embed)
    norm.scale / bias     (embed,)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..frontend.api import library_scope, maximum, placeholder, take
from ..frontend.tensor import RecurrentTensor as RT
from ..frontend.tensor import as_tensor
from ..runtime.host import aligned_empty
from ..symbolic import Dim
from ._params import ParamError, param, param_dims, rng, sub
from .attention import attention, check_start, tokens_known
from .decoding import at, decode, over_layers
from .layers import Embedding, LayerNorm, gelu
from .llama import _check_dims, _draw, floating_dtype


@dataclass(frozen=True)
class GPT2:
    """GPT-2's sizes. ``model(params, ids, t, n)`` gives the logits at every point of ``ids``
    (``t`` below ``positions``); ``model.generate(params, prompt, t, n)`` decodes."""

    vocab: int
    embed: int
    layers: int
    heads: int
    positions: int = 1024
    hidden: int | None = None       # None: 4 * embed
    eps: float = 1e-5

    def __post_init__(self):
        for name in ("vocab", "embed", "layers", "heads", "positions"):
            if not isinstance(getattr(self, name), (int, np.integer)) or getattr(self, name) < 1:
                raise ShapeError(f"GPT2: {name} must be a positive int, got "
                                 f"{getattr(self, name)!r}")
        if self.embed % self.heads:
            raise ShapeError(f"GPT2: embed {self.embed} must be a multiple of heads {self.heads}")
        if self.hidden is None:
            object.__setattr__(self, "hidden", 4 * self.embed)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape (see the module), matrices ``(in, out)``."""
        d, f, L = self.embed, self.hidden, self.layers
        one = {"norm1.scale": (d,), "norm1.bias": (d,), "attn.w_qkv": (d, 3 * d),
               "attn.b_qkv": (3 * d,), "attn.w_o": (d, d), "attn.b_o": (d,),
               "norm2.scale": (d,), "norm2.bias": (d,), "mlp.w_fc": (d, f), "mlp.b_fc": (f,),
               "mlp.w_proj": (f, d), "mlp.b_proj": (d,)}
        return {"embed.w": (self.vocab, d), "pos.w": (self.positions, d),
                **{f"layers.{k}": (L, *s) for k, s in one.items()},
                "norm.scale": (d,), "norm.bias": (d,)}

    def init(self, seed: int = 0, dtype="float32") -> dict[str, np.ndarray]:
        """Random weights in ``dtype``: N(0, 1/fan_in) matrices, N(0, 1/embed) embeddings,
        unit norm scales, zero biases."""
        dt = floating_dtype(dtype, "GPT2.init")
        out = {}
        for k, (name, shape) in enumerate(self.shapes().items()):
            buf = out[name] = aligned_empty(shape, dt)
            last = name.rsplit(".", 1)[-1]
            if last in ("scale", "bias") or last.startswith("b_"):
                buf[...] = last == "scale"
                continue
            std = self.embed ** -0.5 if name in ("embed.w", "pos.w") else shape[-2] ** -0.5
            for j, part in enumerate(buf if name.startswith("layers.") else [buf]):
                _draw(rng(seed, k, j), part, std)
        return out

    @library_scope()
    def __call__(self, params, ids: RT, t: Dim, n: Dim, masked: bool | None = None,
                 start: RT | None = None) -> RT:
        """Logits ``(vocab,)`` at every point of ``ids`` (int token ids over ``(..., t)``);
        ``masked`` and ``start`` as for ``tl.nn.Llama``."""
        me = f"GPT2(layers={self.layers})"
        ctx = _check_dims(ids, t, n, me)
        start = check_start(start, t, me)
        shapes = self.shapes()
        absent = [k for k in shapes if k not in params]
        if absent:
            raise ParamError(f"{me} needs the parameters {', '.join(absent)}; make them with "
                             "GPT2.init(seed) or tl.nn.AutoModel.from_pretrained(path)")
        with ctx:
            # the residual stream varies over the ids' dims and the parameters' (weights
            # over an iteration dim i, being trained), and over the layers
            dom = ctx.order((*ids.domain, *param_dims(params), n))
            w = {k[len("layers."):]: over_layers(shapes[k], params[k], k, n, me, "(in, out)")
                 for k in shapes if k.startswith("layers.")}
            table = param(params, "embed.w", shapes["embed.w"], ctx, me)
            step = as_tensor(t, ctx) if start is None else maximum(as_tensor(t, ctx) - start, 0)
            pos = take(param(params, "pos.w", shapes["pos.w"], ctx, me), step)
            h_in = placeholder((self.embed,), "float32", domain=dom, name="h_in")
            h_out = placeholder((self.embed,), "float32", domain=dom, name="h_out")
            h_in[at(dom, {n: 0})] = (Embedding(self.vocab, self.embed)(sub(params, "embed"), ids)
                                     + pos).astype("float32")
            h_in[at(dom, {})] = h_out[at(dom, {n: n - 1})]
            masked = tokens_known(ids, t) if masked is None else bool(masked)
            h_out[at(dom, {})] = self._block(w, h_in, t, masked, start)
            last = LayerNorm(self.embed, self.eps)(sub(params, "norm"),
                                                   h_out[at(dom, {n: n.bound - 1})])
            return last @ table.transpose(1, 0)

    def _block(self, w: dict, x: RT, t: Dim, masked: bool, start: RT | None) -> RT:
        """One layer: ``h = x + attn(ln1(x)); h + mlp(ln2(h))``."""
        d, heads = self.embed, self.heads
        a = LayerNorm(d, self.eps)(sub(w, "norm1"), x)
        qkv = a @ w["attn.w_qkv"] + w["attn.b_qkv"]
        q, k, v = (qkv[..., k * d:(k + 1) * d].reshape(heads, d // heads) for k in range(3))
        h = x + attention(q, k, v, t, masked=masked, start=start).reshape(d) @ w["attn.w_o"] + w["attn.b_o"]
        m = LayerNorm(d, self.eps)(sub(w, "norm2"), h)
        return h + gelu(m @ w["mlp.w_fc"] + w["mlp.b_fc"]) @ w["mlp.w_proj"] + w["mlp.b_proj"]

    @library_scope()
    def generate(self, params, prompt: RT, t: Dim, n: Dim, temperature: float = 0.0,
                 seed: int = 0) -> tuple[RT, RT]:
        """Autoregressive decoding, as ``tl.nn.Llama.generate``: returns ``(ids, logits)``
        over ``(prompt's dims, t)``; ``t`` must stay below ``positions``."""
        return decode(self, params, prompt, t, n, temperature, seed,
                      f"GPT2(layers={self.layers}).generate")
