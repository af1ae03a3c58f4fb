"""A Llama-3.2-style decoder over recurrent tensors, its layers as a dim.

The layer index is a dim ``n`` of the context (bound = ``layers``), not a Python loop: the
program has one block whatever the depth, each layer's weights are read at ``n`` from arrays
stacked over layers, and layer ``n`` reads layer ``n - 1``'s output at the same point. Keys and
values are read along ``t`` over ``0:t+1`` (causal) or the last ``window`` steps, so the
compiler sees the KV cache as a dependence, not a buffer the user manages.

Parameters (NumPy arrays of one floating dtype, float32 or bfloat16/float16, which the program
keeps: the residual stream and every matmul accumulate in float32; layer entries stacked over a
leading ``layers`` axis; matrices ``(out, in)`` as Hugging Face stores them, so that a
checkpoint is read without a transpose and XLA contracts them as they are; ``q = heads *
head_dim``, ``kv = kv_heads * head_dim``)::

    embed.w                (vocab, embed)          token embedding; also the output head (tied)
    layers.norm1.scale     (layers, embed)
    layers.attn.wq         (layers, q, embed),     layers.attn.wo  (layers, embed, q)
    layers.attn.wk / wv    (layers, kv, embed)
    layers.attn.bq         (layers, q),            layers.attn.bk / bv  (layers, kv)
                                                   only with qkv_bias=True (Qwen2)
    layers.norm2.scale     (layers, embed)
    layers.mlp.w_gate/w_up (layers, hidden, embed),  layers.mlp.w_down (layers, embed, hidden)
    norm.scale             (embed,)
    head.w                 (vocab, embed)          only with tied=False

``Llama.from_pretrained(path)`` builds the model and its parameters from a Hugging Face
checkpoint directory (see ``tl.nn.checkpoint``).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ArgumentError, DTypeError, ShapeError, user_api
from ..frontend.api import library_scope, placeholder
from ..frontend.tensor import RecurrentTensor as RT
from ..ir.ops import canonical_dtype, is_floating
from ..runtime.host import aligned_empty
from ..symbolic import Dim
from ._params import ParamError, param, param_dims, rng, sub
from .attention import RopeScaling, TransformerBlock, check_start, tokens_known
from .decoding import at, decode, over_layers
from .layers import Embedding, RMSNorm

LINEAR = ("attn.wq", "attn.wk", "attn.wv", "attn.wo", "mlp.w_gate", "mlp.w_up", "mlp.w_down")
BIASES = ("layers.attn.bq", "layers.attn.bk", "layers.attn.bv")


@dataclass(frozen=True)
class Llama:
    """The decoder's sizes. ``model(params, ids, t, n)`` gives the logits at every point of
    ``ids``; ``model.generate(params, prompt, t, n)`` decodes autoregressively. Defaults follow
    Llama 3.2 (RoPE base 500 000, RMSNorm eps 1e-5, tied embeddings, ``head_dim = embed //
    heads``); ``rope_scaling`` is Llama 3's frequency scaling, as its checkpoints configure
    it (``from_pretrained`` reads it from ``config.json``). The same decoder is Qwen2 with
    ``qkv_bias=True`` and Mistral with a sliding ``window`` (keys and values read over the
    last ``window`` steps)."""

    vocab: int
    embed: int
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    window: int | None = None
    rope_base: float = 500000.0
    eps: float = 1e-5
    tied: bool = True
    head_dim: int | None = None     # None: embed // heads (set so after construction)
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False

    def __post_init__(self):
        for name in ("vocab", "embed", "layers", "heads", "kv_heads", "hidden"):
            if not isinstance(getattr(self, name), (int, np.integer)) or getattr(self, name) < 1:
                raise ShapeError(f"Llama: {name} must be a positive int, got "
                                 f"{getattr(self, name)!r}")
        object.__setattr__(self, "head_dim", self.block.parts["attn"].head_dim)  # checks sizes

    @classmethod
    @user_api
    def from_pretrained(cls, path, dtype=None) -> tuple[Llama, dict[str, np.ndarray]]:
        """``(model, params)`` from a Hugging Face checkpoint directory (``config.json`` and
        ``model.safetensors`` or shards listed in ``model.safetensors.index.json``), the
        checkpoint's dtype kept unless ``dtype`` is given; see ``tl.nn.checkpoint``."""
        from .checkpoint import from_pretrained

        return from_pretrained(path, dtype)

    @property
    def block(self) -> TransformerBlock:
        """One layer (its parameters are the ``layers.*`` entries at one layer)."""
        return TransformerBlock(self.embed, self.heads, self.hidden, self.window, rope=True,
                                kv_heads=self.kv_heads, rope_base=self.rope_base, eps=self.eps,
                                head_dim=self.head_dim, rope_scaling=self.rope_scaling,
                                qkv_bias=self.qkv_bias)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape, layer entries with their leading ``layers`` axis; matrices
        ``(out, in)`` (``LINEAR``), as Hugging Face stores them."""
        d, f, L = self.embed, self.hidden, self.layers
        one = {"norm1.scale": (d,), **{f"attn.{k}": s[::-1] for k, s in
                                        self.block.parts["attn"].shapes.items()},
               "norm2.scale": (d,), "mlp.w_gate": (f, d), "mlp.w_up": (f, d),
               "mlp.w_down": (d, f)}
        out = {"embed.w": (self.vocab, d), **{f"layers.{k}": (L, *s) for k, s in one.items()},
               "norm.scale": (d,)}
        if not self.tied:
            out["head.w"] = (self.vocab, d)
        return out

    def init(self, seed: int = 0, dtype="float32") -> dict[str, np.ndarray]:
        """Random weights in ``dtype`` (e.g. ``"bfloat16"``): N(0, 1/fan_in) matrices, unit
        norm scales, zero biases, N(0, 1/embed) embeddings (so that tied logits start near unit scale).
        Each array is allocated once, aligned so that JAX uses it in place, and drawn into
        layer by layer in float32 (no float64 draws, no stacking copy)."""
        dt = floating_dtype(dtype, "Llama.init")
        out = {}
        for k, (name, shape) in enumerate(self.shapes().items()):
            buf = out[name] = aligned_empty(shape, dt)
            if name.endswith("scale") or name in BIASES:
                buf[...] = name.endswith("scale")   # norm scales 1, biases 0
                continue
            std = self.embed ** -0.5 if name in ("embed.w", "head.w") else shape[-1] ** -0.5
            for j, part in enumerate(buf if name.startswith("layers.") else [buf]):
                _draw(rng(seed, k, j), part, std)
        return out

    # -- the program ------------------------------------------------------------------------------
    @library_scope()
    def __call__(self, params, ids: RT, t: Dim, n: Dim, masked: bool | None = None,
                 start: RT | None = None) -> RT:
        """Logits ``(vocab,)`` at every point of ``ids`` (int token ids over ``(..., t)``), from
        a residual stream over ``ids``'s dims plus the layer dim ``n``. ``masked``: attention
        over every token under a causal mask, batched over the tokens (``attention``); by
        default where every token is known before the model runs (``tokens_known``: training,
        scoring), not where decoding feeds them back. ``start``: each row's first real step,
        the steps before it padding (``attention``); positions count from it."""
        me = f"Llama(layers={self.layers})"
        ctx = _check_dims(ids, t, n, me)
        start = check_start(start, t, me)
        with ctx:
            # the residual stream varies over the ids' dims and the parameters' (weights
            # over an iteration dim i, being trained), and over the layers
            dom = ctx.order((*ids.domain, *param_dims(params), n))
            blocks = {k[len("layers."):]: self._over_layers(v, k, n, me)
                      for k, v in params.items() if k.startswith("layers.")}
            # the block takes (in, out): the transpose is no copy (simplify reads the array as
            # it is stored, see passes.basic)
            blocks = {k: v.transpose(1, 0) if k in LINEAR else v for k, v in blocks.items()}
            h_in = placeholder((self.embed,), "float32", domain=dom, name="h_in")
            h_out = placeholder((self.embed,), "float32", domain=dom, name="h_out")
            h_in[at(dom, {n: 0})] = Embedding(self.vocab, self.embed)(
                sub(params, "embed"), ids).astype("float32")
            h_in[at(dom, {})] = h_out[at(dom, {n: n - 1})]
            masked = tokens_known(ids, t) if masked is None else bool(masked)
            h_out[at(dom, {})] = self.block(blocks, h_in, t, masked, start)
            last = RMSNorm(self.embed, self.eps)(sub(params, "norm"),
                                                 h_out[at(dom, {n: n.bound - 1})])
            if self.tied:
                table = param(params, "embed.w", (self.vocab, self.embed), ctx, me)
            else:
                table = param(params, "head.w", (self.vocab, self.embed), ctx, me)
            return last @ table.transpose(1, 0)

    @library_scope()
    def generate(self, params, prompt: RT, t: Dim, n: Dim, temperature: float = 0.0,
                 seed: int = 0) -> tuple[RT, RT]:
        """Autoregressive decoding: ``prompt`` holds ``P`` int token ids per point of its dims
        (shape ``(P,)``, e.g. ``tl.from_array(prompts, domain=(b,))`` for ``(B, P)`` prompts);
        step ``t`` reads the prompt while ``t < P`` and otherwise the token sampled from step
        ``t - 1``'s logits (``tl.nn.sample``: greedy at temperature 0). Returns ``(ids,
        logits)`` over ``(prompt's dims, t)``; ``ids[..., t]`` is the token fed at step t."""
        return decode(self, params, prompt, t, n, temperature, seed,
                      f"Llama(layers={self.layers}).generate")

    def _over_layers(self, value, key: str, n: Dim, me: str):
        """A ``layers.*`` entry as a tensor over ``n`` (arrays are lifted; tensors are the
        caller's, e.g. ``tl.from_array(w, domain=(n,))`` to differentiate)."""
        want = self.shapes().get(key)
        if want is None:
            raise ParamError(f"{me}: '{key}' is not a parameter of {self!r}; its layer "
                             f"parameters are {', '.join(k for k in self.shapes() if 'layers.' in k)}")
        return over_layers(want, value, key, n, me, "(out, in)")


def floating_dtype(dtype, me: str) -> np.dtype:
    dt = canonical_dtype(dtype)
    if not is_floating(dt):
        raise DTypeError(f"{me}: dtype must be floating (float32, bfloat16, float16), got "
                         f"{dt.name}")
    return dt


def _draw(gen: np.random.Generator, out: np.ndarray, std: float, rows: int = 4096) -> None:
    """``out`` filled with N(0, std^2) draws made in float32: in place when it is float32,
    else through a float32 buffer of ``rows`` rows at a time."""
    if out.dtype == np.float32:
        gen.standard_normal(out.shape, np.float32, out=out)
        out *= np.float32(std)
        return
    for k in range(0, len(out), rows):
        part = gen.standard_normal(out[k:k + rows].shape, np.float32)
        part *= np.float32(std)
        out[k:k + rows] = part


def _check_dims(ids, t: Dim, n: Dim, me: str):
    if not isinstance(ids, RT):
        raise ShapeError(f"{me} takes a recurrent tensor of token ids, got {type(ids).__name__}")
    if ids.dtype.kind not in "iu" or ids.ndim:
        raise DTypeError(f"{me} needs one int token id per point, got {ids.type}; convert with "
                         ".astype('int32')")
    for d, what in ((t, "t (the dim keys are read along)"), (n, "n (the layer dim)")):
        if not isinstance(d, Dim) or d not in ids.ctx.dims:
            raise ArgumentError(f"{me}: {what} must be a dim of the context, got {d!r}")
    if t not in ids.domain or n in ids.domain or t == n:
        raise ShapeError(f"{me}: the token ids must vary over t={t} and not over the layer dim "
                         f"n={n}; their domain is ({', '.join(map(str, ids.domain))})")
    return ids.ctx
