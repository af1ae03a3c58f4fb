"""``tl.nn.Llama`` twice: its plain-JAX twin (the check and the decode benchmark's baselines) and
the tempo_lab program the decode benchmark times.

The twin takes the same parameter dict (layer entries stacked over layers, matrices ``(out,
in)``) and computes:

- ``forward(params, ids, model)``: logits ``(B, T, vocab)`` of a whole sequence at once, with a
  causal (or window) mask: the check, written without a cache;
- ``step(p, caches, ids_t, t, model)``: one decode step for every batch entry, the best plain
  JAX we can write for it: ``p = device_params(params, model)`` holds one device array per
  layer and matrix (each a view of the user's array, used in place on the CPU), ``caches`` one
  key and one value cache ``(B, kv_heads, T, head_dim)`` per layer (heads before T: attention
  reads each head's keys in place), the tied head is the embedding table itself. Slicing a
  layer out of arrays stacked over layers instead made XLA on the CPU copy it at every step
  (about 2x slower at Llama-3.2-1B widths).

A matrix is applied by ``linear``: one ``dot_general`` over its ``in`` axis as stored; for a
16-bit weight on the CPU with at most ``FEW_ROWS`` rows, a multiply and sum over that
(contiguous) axis, which XLA fuses with the conversion to float32: its CPU dot converts a
bfloat16 matrix to a float32 copy first (measured at (8192, 2048): dot 42-54 ms, fused 7 ms,
float32 dot 3-7 ms). ``x`` and ``w`` pass an optimisation barrier together, or XLA hoists
``w``'s conversion out of the decode loop: a float32 copy of every weight, held.

The decode benchmark generates: each system is given a prompt of ``PROMPT`` tokens per batch
entry and decodes greedily to ``T`` tokens, so that step ``t + 1`` depends on step ``t``'s
output through the whole model, as in serving. Where two logits nearly tie, float rounding may
make two correct systems pick different tokens, so a system's tokens are not compared with
another's: ``check`` runs the twin's whole-sequence forward on the tokens a system produced and
requires the prompt, and at every later step a token whose logit is the maximum to within a
tolerance.
"""
from __future__ import annotations

import numpy as np

FEW_ROWS = 16  # rows of x up to which a 16-bit matrix is applied by a fused multiply and sum


def _inv_freq(model) -> np.ndarray:
    import tempo_lab as tl

    return tl.nn.rope_frequencies(model.head_dim, model.rope_base, model.rope_scaling)


def linear(x, w):
    """``x @ w.T`` for ``w`` stored ``(out, in)``, accumulated in float32."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    rows = int(np.prod(x.shape[:-1]))
    if w.dtype.itemsize < 4 and rows <= FEW_ROWS and jax.default_backend() == "cpu":
        xs = x.reshape(rows, 1, x.shape[-1]) if rows > 1 else x.reshape(x.shape[-1])
        xs, w = lax.optimization_barrier((xs, w))  # else w's float32 copy leaves the loop
        y = (xs * w.astype(jnp.float32)).sum(-1)
        return y.reshape(*x.shape[:-1], w.shape[0])
    return lax.dot_general(x, w, (((x.ndim - 1,), (1,)), ((), ())),
                           preferred_element_type=jnp.float32)


def _rms(x, scale, eps):
    import jax.numpy as jnp

    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale.astype(jnp.float32)


def _rope(x, pos, inv_freq):
    """x: (..., heads, head_dim) at positions ``pos`` (broadcast against x's leading axes)."""
    import jax.numpy as jnp

    ang = jnp.asarray(pos, jnp.float32)[..., None, None] * inv_freq
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang),
                            x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], -1)


def per_layer(params: dict, layers: int, put=lambda x: x) -> dict:
    """The stacked parameter dict as ``{"embed.w", "norm.scale", ["head.w"], "layers": [one
    dict per layer]}``, each array passed through ``put``."""
    out = {k: put(v) for k, v in params.items() if not k.startswith("layers.")}
    out["layers"] = [{k[len("layers."):]: put(v[j]) for k, v in params.items()
                      if k.startswith("layers.")} for j in range(layers)]
    return out


def device_params(params: dict, model) -> dict:
    """``per_layer`` with every array put on the device (in place where JAX allows it)."""
    import jax

    return per_layer(params, model.layers, jax.device_put)


def _head(p, h, model):
    table = p["embed.w"] if model.tied else p["head.w"]
    return linear(_rms(h, p["norm.scale"], model.eps), table)


def _mlp(lp, h, model):
    import jax

    x = _rms(h, lp["norm2.scale"], model.eps)
    gate = jax.nn.silu(linear(x, lp["mlp.w_gate"]))
    return linear(gate * linear(x, lp["mlp.w_up"]), lp["mlp.w_down"])


def _qkv(lp, h, pos, model):
    """q (..., heads, dh), k and v (..., kv_heads, dh) of h (..., embed), rotated at pos."""
    x = _rms(h, lp["norm1.scale"], model.eps)
    lead, dh = h.shape[:-1], model.head_dim
    q = linear(x, lp["attn.wq"]).reshape(*lead, model.heads, dh)
    k = linear(x, lp["attn.wk"]).reshape(*lead, model.kv_heads, dh)
    v = linear(x, lp["attn.wv"]).reshape(*lead, model.kv_heads, dh)
    inv = _inv_freq(model)
    return _rope(q, pos, inv), _rope(k, pos, inv), v


def _mask(q_pos, k_pos, window):
    m = k_pos <= q_pos
    return m if window is None else m & (k_pos > q_pos - window)


def _embed(p, ids):
    import jax.numpy as jnp

    return p["embed.w"][ids].astype(jnp.float32)


def layers(p, ids, model, remat: bool = False):
    """Every layer over a whole sequence of token ids ``(B, T)`` at once, with a causal (or
    window) mask: the last hidden state ``(B, T, embed)`` and each layer's keys and values
    ``(B, T, kv_heads, head_dim)``. ``remat``: each layer under ``jax.checkpoint``, so that a
    gradient recomputes its activations instead of holding them."""
    import jax
    import jax.numpy as jnp

    steps = ids.shape[1]
    pos = jnp.arange(steps)
    mask = _mask(pos[:, None], pos[None, :], model.window)                  # (Tq, Tk)
    group = model.heads // model.kv_heads

    def layer(lp, h):
        q, k, v = _qkv(lp, h, pos[None, :], model)                          # (B, T, H|KV, dh)
        q = q.reshape(*q.shape[:2], model.kv_heads, group, model.head_dim)
        s = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / np.sqrt(model.head_dim)
        w = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        att = jnp.einsum("bkgqs,bskd->bqkgd", w, v).reshape(*h.shape[:2], -1)
        h = h + linear(att, lp["attn.wo"])
        return h + _mlp(lp, h, model), (k, v)

    step = jax.checkpoint(layer) if remat else layer
    h, caches = _embed(p, ids), []
    for lp in p["layers"]:
        h, kv = step(lp, h)
        caches.append(kv)
    return h, caches


def forward(params, ids, model, remat: bool = False):
    """Logits ``(B, T, vocab)`` for token ids ``(B, T)``, the whole sequence at once
    (``remat``: see ``layers``)."""
    import jax.numpy as jnp

    p = per_layer(params, model.layers, jnp.asarray)
    return _head(p, layers(p, ids, model, remat)[0], model)


def cache_shape(model, batch: int, steps: int) -> tuple[int, ...]:
    """One layer's key (or value) cache."""
    return (batch, model.kv_heads, steps, model.head_dim)


def empty_caches(model, batch: int, steps: int) -> tuple:
    """``((keys, values), ...)``: one pair of zero caches per layer."""
    import jax.numpy as jnp

    shape = cache_shape(model, batch, steps)
    return tuple((jnp.zeros(shape), jnp.zeros(shape)) for _ in range(model.layers))


def step(p, caches, ids_t, t, model):
    """One step at every batch entry: logits ``(B, vocab)`` of tokens ``ids_t`` (B,) at
    position ``t``, and the caches with step t's keys and values written."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    steps = caches[0][0].shape[2]
    group = model.heads // model.kv_heads
    mask = _mask(t, jnp.arange(steps), model.window)                        # (T,)
    h = _embed(p, ids_t)                                                    # (B, D)
    out = []
    for lp, (kc, vc) in zip(p["layers"], caches):
        q, k, v = _qkv(lp, h, t, model)                                     # (B, H|KV, dh)
        kc = lax.dynamic_update_slice(kc, k[:, :, None], (0, 0, t, 0))
        vc = lax.dynamic_update_slice(vc, v[:, :, None], (0, 0, t, 0))
        out.append((kc, vc))
        q = q.reshape(q.shape[0], model.kv_heads, group, model.head_dim)
        s = jnp.einsum("bkgd,bksd->bkgs", q, kc) / np.sqrt(model.head_dim)
        w = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        att = jnp.einsum("bkgs,bksd->bkgd", w, vc).reshape(h.shape[0], -1)
        h = h + linear(att, lp["attn.wo"])
        h = h + _mlp(lp, h, model)
    return _head(p, h, model), tuple(out)


PROMPT = 16


def prompt_of(ids: np.ndarray) -> np.ndarray:
    """The benchmark's prompt: the first ``PROMPT`` (at most T) of the given token ids."""
    return ids[:, :min(PROMPT, ids.shape[1])]


def _next(logits, prompt, t):
    """The token fed at step ``t + 1``: the prompt's while it lasts, else the greedy one."""
    import jax.numpy as jnp

    plen = prompt.shape[1]
    given = prompt[:, jnp.minimum(t + 1, plen - 1)]
    return jnp.where(t + 1 < plen, given, jnp.argmax(logits, -1).astype(jnp.int32))


def scan_decode(model, steps: int):
    """``decode(prompt, p) -> ids (B, steps)`` (``p`` from ``device_params``): one
    ``lax.scan`` over the steps with a preallocated KV cache per layer."""
    import jax.numpy as jnp
    from jax import lax

    def decode(prompt, p):
        def body(carry, t):
            caches, tok = carry
            # the weights pass a barrier with t: else XLA hoists what it makes of a weight
            # alone (a float32 copy of a bfloat16 table) out of the loop and holds it
            _, q = lax.optimization_barrier((t, p))
            logits, caches = step(q, caches, tok, t, model)
            return (caches, _next(logits, prompt, t)), tok

        start = (empty_caches(model, prompt.shape[0], steps), prompt[:, 0])
        _, ids = lax.scan(body, start, jnp.arange(steps))
        return ids.T
    return decode


def jitted_step(model):
    """``one(caches, tok, prompt, t, p) -> (caches, next token)`` for a Python loop."""
    def one(caches, tok, prompt, t, p):
        logits, caches = step(p, caches, tok, t, model)
        return caches, _next(logits, prompt, t)
    return one


def check(model, params, prompt: np.ndarray, ids: np.ndarray, tol: float = 1e-3) -> float:
    """How far ``ids`` is from a greedy decode of ``prompt``: 0 when every token after the
    prompt has the largest logit of the twin's forward on ``ids``; else the largest shortfall
    (logit units), which the caller compares with ``tol``. Raises ValueError when the prompt
    is not kept."""
    import jax

    plen = prompt.shape[1]
    if ids.shape[:1] != prompt.shape[:1] or not np.array_equal(ids[:, :plen], prompt):
        raise ValueError("the generated ids do not start with the prompt")
    logits = np.asarray(jax.jit(lambda p, x: forward(p, x, model))(params, ids))[:, plen - 1:-1]
    picked = np.take_along_axis(logits, ids[:, plen:, None], -1)[..., 0]
    return float(np.max(logits.max(-1) - picked, initial=0.0))


# -- tempo_lab -------------------------------------------------------------------------------------
def tempo_lab_program(ctx, model, params, ids: np.ndarray):
    """The greedy decode in ``ctx`` (dims ``(b, n, t)``) from ``prompt_of(ids)``: the token
    ids fed at every step, over ``(b, t)``."""
    import tempo_lab as tl

    b, n, t = ctx.dims
    with ctx:
        prompt = tl.from_array(prompt_of(ids), domain=(b,), name="prompt")
        out, _ = model.generate(params, prompt, t, n)
        return out
