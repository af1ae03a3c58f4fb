"""Autoregressive decoding over the step dim, shared by the decoders (``tl.nn.Llama``,
``tl.nn.GPT2``): step ``t`` is fed the prompt's token while ``t < P``, else the token sampled
from step ``t - 1``'s logits. The model is any callable ``model(params, ids, t, n)`` giving the
logits at every point of ``ids``."""
from __future__ import annotations

import numpy as np

from ..errors import ShapeError
from ..frontend import api
from ..frontend.api import from_array, placeholder, take
from ..frontend.tensor import RecurrentTensor as RT
from ..frontend.tensor import as_tensor, constant
from ..ir.ops import shape_str
from ..symbolic import Dim
from ._params import spatial_shape
from .sampling import sample


def decode(model, params, prompt: RT, t: Dim, n: Dim, temperature: float = 0.0, seed: int = 0,
           me: str = "decode", lengths: RT | None = None,
           top_k: int | None = None, top_p: float | None = None,
           repetition_penalty: float = 1.0) -> tuple[RT, RT]:
    """``(ids, logits)`` over ``(prompt's dims, t)``: ``prompt`` holds ``P`` int token ids per
    point of its dims (shape ``(P,)``); ``ids[..., t]`` is the token fed at step ``t``;
    tokens are greedy at temperature 0, else sampled (``tl.nn.sample``).

    ``lengths`` (an int scalar per point of the prompt's dims) gives each row a prompt of its
    own length, aligned at the end of the ``P`` steps (padded at the start, as ``transformers``
    pads a batch for generation): row ``b``'s tokens start at step ``P - lengths[b]``, which
    the model takes as ``start`` (its positions count from there, and attention gives the
    padding weight 0), so each row decodes as it would alone, and every row's prompt ends at
    ``P``: the prompt's steps of all rows split off and batch (``passes/prefix.py``; padded at
    the end, rows had been split at the shortest prompt only, and a batch of 8 prompts of
    5-200 tokens ran at 0.45x the throughput of one row at a time).

    The prompt's steps are a branch of ``ids`` of their own, ``ids[t < P] = prompt[t]``, not a
    ``where`` that also names the sampled token: no step there reads a logit, so the compiler computes the logits, the output
    head and the sampling only at the points a later step reads (from the last prompt step
    on). At a 100-token prompt with a 32 000-token head, 4 rows: 0.51 -> 0.06 s a run, the same
    tokens.

    ``top_k`` and ``top_p`` restrict sampling (``tl.nn.sample``); ``repetition_penalty`` divides
    the positive logits (multiplies the negative ones) of every token the row has held so far,
    prompt included, before a token is picked, as ``transformers`` does; the tokens held are a
    recurrence over ``t`` (a vocabulary-sized mask per step), not a scan of the history."""
    if not isinstance(prompt, RT) or prompt.ndim != 1 or prompt.dtype.kind not in "iu":
        raise ShapeError(f"{me}: the prompt must be an int tensor of shape (P,) per point, "
                         f"got {getattr(prompt, 'type', type(prompt).__name__)}; lift "
                         f"(B, P) prompts with tl.from_array(prompts, domain=(b,))")
    if t in prompt.domain or n in prompt.domain:
        raise ShapeError(f"{me}: the prompt varies over ({', '.join(map(str, prompt.domain))})"
                         f" but must not vary over the step dim {t} or the layer dim {n}: "
                         f"give its P tokens as its shape (P,)")
    plen = spatial_shape(prompt)[0]
    if not isinstance(plen, int) or plen < 1:
        raise ShapeError(f"{me}: the prompt needs a static length >= 1, got "
                         f"{shape_str(spatial_shape(prompt))}")
    ctx = prompt.ctx
    with ctx:
        dom = ctx.order((*prompt.domain, t))
        ids = placeholder((), "int32", domain=dom, name="ids")
        start = None if lengths is None else plen - lengths
        logits = model(params, ids, t, n) if start is None else \
            model(params, ids, t, n, start=start)
        scores = logits
        if repetition_penalty != 1.0:
            vocab = spatial_shape(logits)[-1]
            hot = api.eq(constant(np.arange(vocab, dtype=np.int32), ctx, "int32"), ids)
            if start is not None:  # not the padding's ids
                hot = hot & (as_tensor(t, ctx) >= start)
            held = placeholder((vocab,), "bool", domain=dom, name="held")
            held[at(dom, {t: 0})] = hot
            held[at(dom, {})] = held[at(dom, {t: t - 1})] | hot
            p = float(repetition_penalty)
            scores = api.where(held, api.where(logits > 0, logits / p, logits * p), logits)
        nxt = sample(scores, temperature, seed, top_k, top_p)
        read = take(prompt, api.min(t, plen - 1)).astype("int32")
        ids[t < plen] = read
        ids[at(dom, {})] = nxt[at(dom, {t: t - 1})]
    return ids, logits


def at(domain, subs: dict) -> tuple:
    """An index of ``domain``: each dim at itself unless ``subs`` gives its expression."""
    return tuple(subs.get(d, d) for d in domain)


def over_layers(want: tuple, value, key: str, n: Dim, me: str, layout: str) -> RT:
    """A ``layers.*`` parameter as a tensor over the layer dim ``n``: an array stacked over
    layers (``want``: its shape) is lifted; a tensor is the caller's (say
    ``tl.from_array(w, domain=(n,))`` to differentiate), checked per layer. ``layout`` says
    how the model's matrices are laid out, for the errors."""
    if isinstance(value, RT):
        if spatial_shape(value) != want[1:]:
            raise ShapeError(f"{me}: parameter '{key}' has shape "
                             f"{shape_str(spatial_shape(value))} per layer but "
                             f"{shape_str(want[1:])} is needed (matrices {layout})")
        return value
    shape = np.shape(value)
    if shape != want:
        raise ShapeError(f"{me}: parameter '{key}' must stack the {want[0]} layers on its "
                         f"first axis as {shape_str(want)} (matrices {layout}), got shape "
                         f"{shape_str(shape)}")
    return from_array(value, domain=(n,), name=key.replace(".", "_"))
