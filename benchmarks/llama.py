"""``tl.nn.Llama`` twice: its plain-JAX twin (the check and the decode benchmark's baselines) and
the tempo_lab program the decode benchmark times.

The twin takes the same parameter dict (layer entries stacked over layers) and computes:

- ``forward(params, ids, model)``: logits ``(B, T, vocab)`` of a whole sequence at once, with a
  causal (or window) mask: the check, written without a cache;
- ``step(params, kc, vc, ids_t, t, model)``: one decode step for every batch entry over a
  preallocated KV cache ``(layers, B, kv_heads, T, head_dim)`` (heads before T, so attention
  reads each head's keys in place; see ``benchmarks.decode.KV_LAYOUTS``).

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


def _inv_freq(model) -> np.ndarray:
    half = model.head_dim // 2
    return (model.rope_base ** (-np.arange(half) / half)).astype(np.float32)


def _rms(x, scale, eps):
    import jax.numpy as jnp

    return x / jnp.sqrt((x * x).mean(-1, keepdims=True) + eps) * scale


def _rope(x, pos, inv_freq):
    """x: (..., heads, head_dim) at positions ``pos`` (broadcast against x's leading axes)."""
    import jax.numpy as jnp

    ang = jnp.asarray(pos, jnp.float32)[..., None, None] * inv_freq
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * jnp.cos(ang) - x2 * jnp.sin(ang),
                            x2 * jnp.cos(ang) + x1 * jnp.sin(ang)], -1)


def _head(params, h, model):
    w = params["embed.w"].T if model.tied else params["head.w"]
    return _rms(h, params["norm.scale"], model.eps) @ w


def _mlp(p, layer, h, model):
    import jax

    x = _rms(h, p["layers.norm2.scale"][layer], model.eps)
    gate = jax.nn.silu(x @ p["layers.mlp.w_gate"][layer])
    return (gate * (x @ p["layers.mlp.w_up"][layer])) @ p["layers.mlp.w_down"][layer]


def _qkv(p, layer, h, pos, model):
    """q (..., heads, dh), k and v (..., kv_heads, dh) of h (..., embed), rotated at pos."""
    x = _rms(h, p["layers.norm1.scale"][layer], model.eps)
    lead, dh = h.shape[:-1], model.head_dim
    q = (x @ p["layers.attn.wq"][layer]).reshape(*lead, model.heads, dh)
    k = (x @ p["layers.attn.wk"][layer]).reshape(*lead, model.kv_heads, dh)
    v = (x @ p["layers.attn.wv"][layer]).reshape(*lead, model.kv_heads, dh)
    inv = _inv_freq(model)
    return _rope(q, pos, inv), _rope(k, pos, inv), v


def _mask(q_pos, k_pos, window):
    m = k_pos <= q_pos
    return m if window is None else m & (k_pos > q_pos - window)


def forward(params, ids, model):
    """Logits ``(B, T, vocab)`` for token ids ``(B, T)``, the whole sequence at once."""
    import jax
    import jax.numpy as jnp

    p = {k: jnp.asarray(v) for k, v in params.items()}
    steps = ids.shape[1]
    pos = jnp.arange(steps)
    mask = _mask(pos[:, None], pos[None, :], model.window)                  # (Tq, Tk)
    group = model.heads // model.kv_heads
    h = p["embed.w"][ids]
    for layer in range(model.layers):
        q, k, v = _qkv(p, layer, h, pos[None, :], model)                    # (B, T, H|KV, dh)
        q = q.reshape(*q.shape[:2], model.kv_heads, group, model.head_dim)
        s = jnp.einsum("bqkgd,bskd->bkgqs", q, k) / np.sqrt(model.head_dim)
        w = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        att = jnp.einsum("bkgqs,bskd->bqkgd", w, v).reshape(*h.shape[:2], model.embed)
        h = h + att @ p["layers.attn.wo"][layer]
        h = h + _mlp(p, layer, h, model)
    return _head(p, h, model)


def cache_shape(model, batch: int, steps: int) -> tuple[int, ...]:
    return (model.layers, batch, model.kv_heads, steps, model.head_dim)


def step(p, kc, vc, ids_t, t, model):
    """One step at every batch entry: logits ``(B, vocab)`` of tokens ``ids_t`` (B,) at
    position ``t``; the caches get step t's keys and values."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    steps = kc.shape[3]
    group = model.heads // model.kv_heads
    mask = _mask(t, jnp.arange(steps), model.window)                        # (T,)
    h = p["embed.w"][ids_t]                                                 # (B, D)
    for layer in range(model.layers):
        q, k, v = _qkv(p, layer, h, t, model)                               # (B, H|KV, dh)
        kc = lax.dynamic_update_slice(kc, k[None, :, :, None], (layer, 0, 0, t, 0))
        vc = lax.dynamic_update_slice(vc, v[None, :, :, None], (layer, 0, 0, t, 0))
        q = q.reshape(q.shape[0], model.kv_heads, group, model.head_dim)
        s = jnp.einsum("bkgd,bksd->bkgs", q, kc[layer]) / np.sqrt(model.head_dim)
        w = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
        att = jnp.einsum("bkgs,bksd->bkgd", w, vc[layer]).reshape(h.shape)
        h = h + att @ p["layers.attn.wo"][layer]
        h = h + _mlp(p, layer, h, model)
    return _head(p, h, model), kc, vc


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
    """``decode(prompt, params) -> ids (B, steps)``: one ``lax.scan`` over the steps with a
    preallocated KV cache."""
    import jax.numpy as jnp
    from jax import lax

    def decode(prompt, p):
        cache = jnp.zeros(cache_shape(model, prompt.shape[0], steps), jnp.float32)

        def body(carry, t):
            kc, vc, tok = carry
            logits, kc, vc = step(p, kc, vc, tok, t, model)
            return (kc, vc, _next(logits, prompt, t)), tok

        _, ids = lax.scan(body, (cache, cache, prompt[:, 0]), jnp.arange(steps))
        return ids.T
    return decode


def jitted_step(model):
    """``one(kc, vc, tok, prompt, t, params) -> (kc, vc, next token)`` for a Python loop."""
    def one(kc, vc, tok, prompt, t, p):
        logits, kc, vc = step(p, kc, vc, tok, t, model)
        return kc, vc, _next(logits, prompt, t)
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
