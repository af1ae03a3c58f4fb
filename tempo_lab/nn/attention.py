"""Attention over a temporal dim: the query at point ``t`` reads keys and values over ``0:t+1``
(causal) or the last ``window`` steps, so the compiler sees the dependence pattern and can keep a
ring buffer for a window instead of the whole history. Plus rotary position embeddings and a
pre-norm transformer block built from the other modules."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ExprError, ShapeError
from ..frontend import api
from ..frontend.api import library_scope
from ..frontend.tensor import RecurrentTensor, as_tensor, constant
from ..ir.ops import is_floating, shape_str
from ..symbolic import Dim, Expr
from ._params import check_input, child_seed, nest, normal, param, rng, spatial_shape, sub
from .layers import RMSNorm, SwiGLU

RT = RecurrentTensor


# -- rotary position embeddings ---------------------------------------------------------------------
@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's scaling of the RoPE frequencies for long contexts (``rope_type: "llama3"`` in a
    Hugging Face ``config.json``): wavelengths longer than ``original_max_position_embeddings /
    low_freq_factor`` are divided by ``factor``, those shorter than ``... / high_freq_factor``
    kept, and the band between interpolated. Llama-3.2 uses factor 32, low 1, high 4, 8192."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        ok = (self.factor > 0 and self.original_max_position_embeddings > 0
              and 0 < self.low_freq_factor < self.high_freq_factor)
        if not ok:
            raise ShapeError(f"RopeScaling needs factor > 0, original_max_position_embeddings > 0 "
                             f"and 0 < low_freq_factor < high_freq_factor, got {self}")


def rope_frequencies(dim: int, base: float = 10000.0,
                     scaling: RopeScaling | None = None) -> np.ndarray:
    """The ``dim // 2`` angular frequencies ``base^(-2j/dim)`` of RoPE (float32, computed as
    ``transformers`` does), with Llama 3's ``scaling`` applied when given."""
    inv = (1.0 / (np.float32(base) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))))
    inv = inv.astype(np.float32)
    if scaling is None:
        return inv
    old = np.float32(scaling.original_max_position_embeddings)
    low, high = np.float32(scaling.low_freq_factor), np.float32(scaling.high_freq_factor)
    factor = np.float32(scaling.factor)
    wavelen = np.float32(2 * np.pi) / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


@library_scope()
def rope(x: RT, pos, base: float = 10000.0, scaling: RopeScaling | None = None) -> RT:
    """Rotate pairs ``(x[..., j], x[..., j + d/2])`` of the last axis by ``pos * base^(-2j/d)``
    (the half-split layout of GPT-NeoX and Llama; frequencies from ``rope_frequencies``, with
    Llama 3's ``scaling`` when given). ``pos`` is a dim or index expression (its value at the
    point, e.g. ``t``) or an integer scalar tensor."""
    if not isinstance(x, RT):
        raise ShapeError(f"rope takes a recurrent tensor, got {type(x).__name__}")
    shape = spatial_shape(x)
    if not shape or not isinstance(shape[-1], int) or shape[-1] % 2:
        raise ShapeError(f"rope needs an even-sized last axis, got an input of shape "
                         f"{shape_str(shape)}")
    if not is_floating(x.dtype):
        raise DTypeError(f"rope expects a floating input, got {x.dtype.name}")
    if scaling is not None and not isinstance(scaling, RopeScaling):
        raise ShapeError(f"rope: scaling must be a tl.nn.RopeScaling or None, got "
                         f"{type(scaling).__name__}")
    p = _position(pos, x.ctx)
    half = shape[-1] // 2
    inv_freq = constant(rope_frequencies(shape[-1], base, scaling), x.ctx, "float32")
    angle = p.astype("float32") * inv_freq
    cos, sin = api.cos(angle), api.sin(angle)
    x1, x2 = x[..., :half], x[..., half:]
    return api.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _position(pos, ctx) -> RT:
    if isinstance(pos, RT):
        if pos.shape != () or pos.dtype.kind not in "iu":
            raise ShapeError(f"rope: a tensor position must be an integer scalar, got "
                             f"{pos.type}")
        return pos
    if isinstance(pos, (Expr, int, np.integer)):
        return as_tensor(pos, ctx)
    raise ExprError(f"rope: the position must be a dim, an index expression or an integer "
                    f"tensor, got {type(pos).__name__}")


# -- attention --------------------------------------------------------------------------------------
@library_scope()
def attention(q: RT, k: RT, v: RT, t: Dim, window: int | None = None,
              masked: bool = False, start: RT | None = None) -> RT:
    """Scaled dot-product attention of the query at each point over keys and values read along
    ``t`` over ``0:t+1``, or ``max(0, t-window+1):t+1`` (other dims of ``k``/``v`` are read at
    the current point). Shapes: ``q`` is ``(heads, d)`` or ``(d,)``, ``k`` ``(kv_heads, d)``
    and ``v`` ``(kv_heads, dv)`` (or ``(d,)``/``(dv,)``); the result is ``(heads, dv)`` or
    ``(dv,)``. With fewer key/value heads than query heads (grouped-query attention, as in
    Llama), each key/value head serves ``heads // kv_heads`` consecutive query heads.

    ``masked``: read the keys and values over the whole of ``t`` (``0:T``) and mask the scores
    of the points after ``t`` (and before the window). Every point's attention then has the
    same shape, so the compiler batches the points into one masked attention and the
    gradients of ``k`` and ``v`` contract over them (``Q^T``-style matmuls), as a hand-written
    training step does; the reads over ``0:t+1`` instead run a loop over ``t``. Only where
    every key and value is made before any query reads it (a sequence given whole: training,
    scoring, a prompt); where the token at ``t + 1`` comes from the output at ``t``
    (decoding) the whole read would be a cycle: keep the default there. ``tl.nn.Llama`` and
    ``GPT2`` choose it themselves (``tokens_known``).

    ``start`` (an int scalar per point of the other dims, or None): the first step of each row's
    tokens, the steps before it padding (prompts of different lengths aligned at their ends,
    ``decoding.decode``). Keys there get weight 0; a query there reads its own step only, so
    that what it computes is finite (nothing real reads it)."""
    _check_attention(q, k, v, t, window)
    start = check_start(start, t, "attention")
    first = 0 if masked or window is None else api.max(0, t - int(window) + 1)
    stop = t.bound if masked else None
    keys, values = _read(k, t, first, stop), _read(v, t, first, stop)  # (steps, [kv,] d)
    scale = 1.0 / float(np.sqrt(spatial_shape(q)[-1]))
    mask = _causal(q.ctx, t, window) if masked else None
    if start is not None:
        here = as_tensor(t, q.ctx)
        steps = _read(here, t, first, stop)
        real = (steps >= start) | (steps == here)
        mask = real if mask is None else mask & real
    if q.ndim == 1:
        weights = _softmax((keys @ q) * scale, mask)                # (steps,)
        return weights @ values
    values = values.transpose(1, 0, 2)                          # (kv_heads, steps, dv)
    heads, kv_heads = spatial_shape(q)[0], spatial_shape(k)[0]
    if kv_heads == heads:
        keys = keys.transpose(1, 0, 2)                          # (heads, steps, d)
        scores = (keys @ q.expand_dims(2)).squeeze(2) * scale   # (heads, steps)
        weights = _softmax(scores, mask)
        return (weights.expand_dims(1) @ values).squeeze(1)
    # query heads in groups sharing a key/value head: one matmul per group, no copy of k, v
    qg = q.reshape(kv_heads, heads // kv_heads, spatial_shape(q)[-1])  # (kv, group, d)
    scores = (qg @ keys.transpose(1, 2, 0)) * scale             # (kv_heads, group, steps)
    weights = _softmax(scores, mask)
    return (weights @ values).reshape(heads, spatial_shape(v)[-1])


def check_start(start, t: Dim, me: str):
    """``start`` as given (None, or an int scalar tensor per row that does not vary over
    ``t``), else a ``ShapeError`` that says what it is."""
    if start is None:
        return None
    if not isinstance(start, RT) or start.shape != () or start.dtype.kind not in "iu":
        raise ShapeError(f"{me}: start must be an int scalar tensor per row (each row's first "
                         f"real step), got {getattr(start, 'type', type(start).__name__)}; "
                         f"e.g. tl.from_array(np.array([3, 0], np.int32), domain=(b,))")
    if t in start.domain:
        raise ShapeError(f"{me}: start varies over the step dim {t}; give one first step per "
                         f"row, over the other dims only")
    return start


def _read(x: RT, t: Dim, start, stop=None) -> RT:
    """``x`` over ``start:stop`` along ``t`` (``stop``: ``t+1`` by default) and at the current
    point along its other dims."""
    stop = t + 1 if stop is None else stop
    return x[tuple(slice(start, stop) if d == t else d for d in x.domain)]


def _causal(ctx, t: Dim, window: int | None) -> RT:
    """Which of the points ``0:T`` the query at ``t`` attends to: ``s <= t`` (and
    ``s > t - window``), a ``(T,)`` bool at each ``t``."""
    here = as_tensor(t, ctx)
    every = here[0:t.bound]
    keep = every <= here
    return keep if window is None else keep & (every > here - int(window))


def _softmax(scores: RT, mask: RT | None) -> RT:
    """The softmax over the last axis, of the kept points only (``-inf`` elsewhere: weight 0)."""
    if mask is not None:
        scores = api.where(mask, scores, float("-inf"))
    return api.softmax(scores, axis=-1)


def tokens_known(ids: RT, t: Dim) -> bool:
    """Whether every token of ``ids`` is made before the model reads any: no placeholder or
    source over ``t`` among what ``ids`` is computed from (a sequence given whole, not one fed
    back by decoding). Then attention can read every token under a causal mask
    (``attention(masked=True)``) and the tokens batch."""
    seen, stack = set(), [ids.node]
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        if node.kind in ("merge", "source") and t in node.domain:
            return False
        stack.extend(inp.node for inp in node.inputs)
    return True


def _check_attention(q, k, v, t, window):
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, RT):
            raise ShapeError(f"attention: {name} must be a recurrent tensor, got "
                             f"{type(x).__name__}")
        if x.ndim not in (1, 2):
            raise ShapeError(f"attention: {name} must have shape (heads, d) or (d,), got "
                             f"{shape_str(spatial_shape(x))}")
    if not isinstance(t, Dim):
        raise ExprError(f"attention: t must be a dim of the context (the one keys are read "
                        f"along), got {t!r}")
    for name, x in (("k", k), ("v", v)):
        if t not in x.domain:
            raise ShapeError(f"attention: {name} must vary over {t} to be read along it, but "
                             f"its domain is ({', '.join(map(str, x.domain))})")
    qs, ks, vs = spatial_shape(q), spatial_shape(k), spatial_shape(v)
    if (not (len(qs) == len(ks) == len(vs)) or qs[-1] != ks[-1] or ks[:-1] != vs[:-1]
            or (len(qs) == 2 and qs[0] % ks[0])):
        raise ShapeError(f"attention: q {shape_str(qs)}, k {shape_str(ks)} and v "
                         f"{shape_str(vs)} must agree: q and k the same head size, k and v the "
                         f"same heads, and q's heads a multiple of k's")
    if window is not None and (not isinstance(window, (int, np.integer)) or window < 1):
        raise ExprError(f"attention: window must be a positive int, got {window!r}")


@dataclass(frozen=True)
class MultiHeadAttention:
    """Multi-head self-attention over the dim ``t``: q, k, v projections at every point of the
    input's domain, keys and values read causally (or over a window) along ``t``, an output
    projection. ``kv_heads`` below ``heads`` gives grouped-query attention (Llama); ``head_dim``
    defaults to ``embed // heads``. Parameters: ``wq`` is ``(embed, heads * head_dim)``, ``wk,
    wv`` ``(embed, kv_heads * head_dim)``, ``wo`` ``(heads * head_dim, embed)``, init
    ``N(0, 1/fan_in)``. ``rope=True`` rotates q and k by their position along ``t`` (with
    ``rope_scaling``, Llama 3's frequencies). ``qkv_bias`` adds biases ``bq`` ``(heads *
    head_dim,)`` and ``bk, bv`` ``(kv_heads * head_dim,)`` to the projections (Qwen2), init 0."""

    embed: int
    heads: int
    window: int | None = None
    rope: bool = False
    rope_base: float = 10000.0
    kv_heads: int | None = None     # None: one key/value head per query head
    head_dim: int | None = None     # None: embed // heads (set so after construction)
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False

    def __post_init__(self):
        if self.head_dim is None:
            if self.heads < 1 or self.embed % self.heads:
                raise ShapeError(f"MultiHeadAttention: embed {self.embed} must be a multiple of "
                                 f"heads {self.heads} (or give head_dim)")
            object.__setattr__(self, "head_dim", self.embed // self.heads)
        if self.heads < 1 or self.head_dim < 1:
            raise ShapeError(f"MultiHeadAttention: heads {self.heads} and head_dim "
                             f"{self.head_dim} must be positive")
        if self.kv < 1 or self.heads % self.kv:
            raise ShapeError(f"MultiHeadAttention: heads {self.heads} must be a multiple of "
                             f"kv_heads {self.kv}")
        if self.rope and self.head_dim % 2:
            raise ShapeError(f"MultiHeadAttention: rope needs an even head size, got "
                             f"{self.head_dim}")

    @property
    def kv(self) -> int:
        """The number of key/value heads."""
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        e, q, kv = self.embed, self.heads * self.head_dim, self.kv * self.head_dim
        out = {"wq": (e, q), "wk": (e, kv), "wv": (e, kv), "wo": (q, e)}
        if self.qkv_bias:
            out.update(bq=(q,), bk=(kv,), bv=(kv,))
        return out

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        g = rng(seed)
        return {k: normal(g, s, 1.0 / np.sqrt(s[0])) if len(s) == 2 else
                np.zeros(s, np.float32) for k, s in self.shapes.items()}

    @library_scope("attention")
    def __call__(self, params, x: RT, t: Dim, masked: bool = False,
                 start: RT | None = None) -> RT:
        """The attention of ``x`` at each point of ``t`` (``masked``, ``start``: see
        ``attention``; with ``start``, positions count from it)."""
        me = f"MultiHeadAttention({self.embed}, {self.heads})"
        x = check_input(x, me, self.embed)
        if x.ndim != 1:
            raise ShapeError(f"{me} takes one ({self.embed},) vector per point, got "
                             f"{shape_str(spatial_shape(x))}; put batch entries on a dim")
        w = {k: param(params, k, s, x.ctx, me) for k, s in self.shapes.items()}
        q, k, v = (x @ w[m] + w["b" + m[1]] if self.qkv_bias else x @ w[m]
                   for m in ("wq", "wk", "wv"))
        q = q.reshape(self.heads, self.head_dim)
        k, v = (y.reshape(self.kv, self.head_dim) for y in (k, v))
        if self.rope:
            pos = t if start is None else as_tensor(t, x.ctx) - start
            q, k = (rope(y, pos, self.rope_base, self.rope_scaling) for y in (q, k))
        return attention(q, k, v, t, self.window, masked, start).reshape(
            self.heads * self.head_dim) @ w["wo"]


@dataclass(frozen=True)
class TransformerBlock:
    """Pre-norm residual block: ``h = x + attn(norm1(x)); h + mlp(norm2(h))`` with RMSNorm and
    SwiGLU. Parameters are nested: ``norm1.scale``, ``attn.wq``, ``norm2.scale``,
    ``mlp.w_gate``, ..."""

    embed: int
    heads: int
    hidden: int
    window: int | None = None
    rope: bool = False
    kv_heads: int | None = None
    rope_base: float = 10000.0
    eps: float = 1e-6
    head_dim: int | None = None
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False

    @property
    def parts(self) -> dict:
        return {"norm1": RMSNorm(self.embed, self.eps),
                "attn": MultiHeadAttention(self.embed, self.heads, self.window, self.rope,
                                           self.rope_base, self.kv_heads, self.head_dim,
                                           self.rope_scaling, self.qkv_bias),
                "norm2": RMSNorm(self.embed, self.eps), "mlp": SwiGLU(self.embed, self.hidden)}

    def init(self, seed: int = 0) -> dict[str, np.ndarray]:
        out = {}
        for k, (name, part) in enumerate(self.parts.items()):
            out.update(nest(name, part.init(child_seed(seed, k))))
        return out

    @library_scope("block")
    def __call__(self, params, x: RT, t: Dim, masked: bool = False,
                 start: RT | None = None) -> RT:
        p = self.parts
        h = x + p["attn"](sub(params, "attn"), p["norm1"](sub(params, "norm1"), x), t, masked,
                          start)
        return h + p["mlp"](sub(params, "mlp"), p["norm2"](sub(params, "norm2"), h))
