"""``tl.nn.generate``: prompts in, new tokens (or text) out, as ``transformers``' ``generate``.

It writes the recurrent-tensor program a user would write with ``model.generate`` (a context
over a batch dim ``b``, the step ``t`` and the layer dim ``n``), compiles it for the prompts'
shape and runs it. Prompts of different lengths are decoded in one program: each is padded at
its end and reads its own length, so each row's positions, attention and tokens are those it
gets decoded alone (``decoding.decode``). A row ends at its first end-of-sequence token (kept in
the ids, dropped from the text), or after ``max_new_tokens``; the program runs every row
until the longest prompt's row has ``max_new_tokens``.
"""
from __future__ import annotations

import numpy as np

from ..compile_config import CompileConfig
from ..errors import ArgumentError
from ..frontend.api import from_array
from ..frontend.context import Context
from .decoding import decode
from .tokenizer import Tokenizer


def generate(model, params, prompts, max_new_tokens: int = 16, tokenizer: Tokenizer | None = None,
             temperature: float = 0.0, seed: int = 0, eos=None, config=None):
    """New tokens for each prompt, greedy unless ``temperature > 0`` (then sampled, keyed by
    ``seed``).

    ``prompts``: a string or a list of strings (needs ``tokenizer``; gives new text, special
    tokens skipped), or a list of token-id lists of any lengths (gives a list of new id lists).
    ``eos``: an id or ids that end a row (default: the tokenizer's ``eos_token_id``; none
    without a tokenizer). ``config``: the ``tl.CompileConfig`` of the programs."""
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "vocab"):
        raise ArgumentError(f"tl.nn.generate: model must be a tl.nn decoder such as tl.nn.Llama, "
                            f"got {type(model).__name__}")
    if not isinstance(max_new_tokens, (int, np.integer)) or isinstance(max_new_tokens, bool) \
            or max_new_tokens < 1:
        raise ArgumentError(f"tl.nn.generate: max_new_tokens must be an int >= 1, got "
                            f"{max_new_tokens!r}")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ArgumentError(f"tl.nn.generate: tokenizer must be a tl.nn.Tokenizer, got "
                            f"{type(tokenizer).__name__}")
    single = isinstance(prompts, str)
    texts = [prompts] if single else prompts
    is_text = single or (isinstance(texts, (list, tuple)) and texts
                         and all(isinstance(p, str) for p in texts))
    if is_text:
        if tokenizer is None:
            raise ArgumentError("tl.nn.generate: text prompts need tokenizer=tl.nn.Tokenizer."
                                "from_pretrained(path); or give token ids (a list of int lists)")
        rows = tokenizer.encode_batch(list(texts))
    else:
        rows = _id_rows(prompts, model.vocab)
    stops = _eos(eos, tokenizer, model.vocab)
    steps = max(map(len, rows)) + int(max_new_tokens)
    if steps > getattr(model, "positions", steps):
        raise ArgumentError(f"tl.nn.generate: the longest prompt and max_new_tokens need "
                            f"{steps} positions but {type(model).__name__} has "
                            f"{model.positions}; shorten them")
    out = _decode_batch(model, params, rows, int(max_new_tokens), temperature, seed, config)
    out = [_until_eos(r, stops) for r in out]
    if not is_text:
        return out
    new = [tokenizer.decode(r, skip_special_tokens=True) for r in out]
    return new[0] if single else new


def _decode_batch(model, params, rows, new: int, temperature, seed, config) -> list[list[int]]:
    """Each row's ``new`` tokens, all rows in one program: prompts padded at the end to the
    longest, each row reading its own length (see ``decoding.decode``)."""
    lengths = np.array([len(r) for r in rows], dtype=np.int32)
    prompt = np.zeros((len(rows), lengths.max()), dtype=np.int32)
    for k, r in enumerate(rows):
        prompt[k, :len(r)] = r
    ctx = Context(dims=("b", "t", "n"))
    b, t, n = ctx.dims
    B, T, N = ctx.bounds
    with ctx:
        ids, _ = decode(model, params, from_array(prompt, domain=(b,), name="prompt"), t, n,
                        temperature, seed, "tl.nn.generate",
                        from_array(lengths, domain=(b,), name="prompt_length"))
    prog = ctx.compile(bounds={B: len(rows), T: int(lengths.max()) + new, N: model.layers},
                       outputs={"ids": ids}, config=config or CompileConfig())
    got = prog.run()["ids"]
    return [[int(i) for i in got[k, p:p + new]] for k, p in enumerate(lengths)]


def _id_rows(prompts, vocab: int) -> list[list[int]]:
    """Prompts given as ids: a non-empty list of non-empty int sequences within the vocab."""
    bad = ArgumentError(f"tl.nn.generate: prompts must be a string, a list of strings or a list "
                        f"of token-id lists, got {type(prompts).__name__} {prompts!r}"[:300])
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise bad
    rows = []
    for k, p in enumerate(prompts):
        arr = np.asarray(p) if isinstance(p, (list, tuple, np.ndarray)) else None
        if arr is None or arr.ndim != 1 or arr.size == 0 or arr.dtype.kind not in "iu":
            raise ArgumentError(f"tl.nn.generate: prompt {k} must be a non-empty list of int "
                                f"token ids, got {p!r}"[:300])
        out = arr[(arr < 0) | (arr >= vocab)]
        if out.size:
            raise ArgumentError(f"tl.nn.generate: prompt {k} holds id {int(out[0])}, outside "
                                f"the model's vocabulary [0, {vocab})")
        rows.append([int(i) for i in arr])
    return rows


def _eos(eos, tokenizer, vocab: int) -> frozenset[int]:
    """The ids that end a row: ``eos`` (an id or ids), else the tokenizer's EOS, else none."""
    if eos is None:
        eos = None if tokenizer is None else tokenizer.eos_token_id
        if eos is None:
            return frozenset()
    ids = [eos] if isinstance(eos, (int, np.integer)) else eos
    if not isinstance(ids, (list, tuple, set, frozenset)) or not all(
            isinstance(i, (int, np.integer)) and not isinstance(i, bool) and 0 <= i < vocab
            for i in ids):
        raise ArgumentError(f"tl.nn.generate: eos must be a token id or a list of ids in "
                            f"[0, {vocab}), got {eos!r}"[:200])
    return frozenset(int(i) for i in ids)


def _until_eos(row: list[int], stops: frozenset[int]) -> list[int]:
    """``row`` up to and including its first end-of-sequence id."""
    for k, i in enumerate(row):
        if i in stops:
            return row[:k + 1]
    return row
