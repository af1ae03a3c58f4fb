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

import dataclasses
import sys

import numpy as np

from ..compile_config import CompileConfig
from ..errors import ArgumentError
from ..frontend.api import from_array, sink
from ..frontend.context import Context
from .decoding import decode
from .tokenizer import Tokenizer


def generate(model, params, prompts, max_new_tokens: int = 16, tokenizer: Tokenizer | None = None,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float = 1.0, seed: int = 0, eos=None, stream=None,
             config=None):
    """New tokens for each prompt, greedy unless ``temperature > 0`` (then sampled, keyed by
    ``seed``, among the ``top_k`` most likely tokens and the smallest set of probability
    ``top_p``); ``repetition_penalty`` makes tokens the row already holds less likely, as in
    ``transformers``.

    ``prompts``: a string or a list of strings (needs ``tokenizer``; gives new text, special
    tokens skipped), or a list of token-id lists of any lengths (gives a list of new id lists).
    ``eos``: an id or ids that end a row (default: the tokenizer's ``eos_token_ids``, its EOS
    and those of the checkpoint's ``generation_config.json``; none without a tokenizer).
    ``stream``: a function ``stream(row, piece)`` called while the program runs with each
    row's new text as it comes (its new token id without a tokenizer), in order, up to the
    row's end; ``tl.nn.TextStream()`` shows the text live in a notebook. ``config``: the
    ``tl.CompileConfig`` of the program (with ``stream``, the XLA executor unless it names
    another: its host callbacks run inside the compiled program)."""
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
        empty = next((k for k, r in enumerate(rows) if not r), None)
        if empty is not None:
            raise ArgumentError(f"tl.nn.generate: prompt {empty} ({texts[empty]!r}) encodes to "
                                "no tokens; give it some text")
    else:
        rows = _id_rows(prompts, model.vocab)
    stops = _eos(eos, tokenizer, model.vocab)
    steps = max(map(len, rows)) + int(max_new_tokens)
    if steps > getattr(model, "positions", steps):
        raise ArgumentError(f"tl.nn.generate: the longest prompt and max_new_tokens need "
                            f"{steps} positions but {type(model).__name__} has "
                            f"{model.positions}; shorten them")
    if isinstance(repetition_penalty, bool) or not isinstance(
            repetition_penalty, (int, float)) or not 0 < repetition_penalty < float("inf"):
        raise ArgumentError(f"tl.nn.generate: repetition_penalty must be a finite number > 0 "
                            f"(1: none), got {repetition_penalty!r}")
    if stream is not None and not callable(stream):
        raise ArgumentError(f"tl.nn.generate: stream must be a function stream(row, piece), got "
                            f"{type(stream).__name__}")
    if stream is not None:
        stream = _Stream(stream, rows, int(max_new_tokens), stops, tokenizer if is_text else None)
    sampling = dict(temperature=temperature, seed=seed, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition_penalty)
    out = _decode_batch(model, params, rows, int(max_new_tokens), sampling, config, stream)
    out = [_until_eos(r, stops) for r in out]
    if not is_text:
        return out
    new = [tokenizer.decode(r, skip_special_tokens=True) for r in out]
    return new[0] if single else new


def _decode_batch(model, params, rows, new: int, sampling: dict, config,
                  stream) -> list[list[int]]:
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
                        me="tl.nn.generate",
                        lengths=from_array(lengths, domain=(b,), name="prompt_length"),
                        shortest=int(lengths.min()), **sampling)
        if stream is not None:
            sink(ids, stream)
    config = config or CompileConfig()
    if stream is not None and config.executor == "auto":  # "auto" takes a sink to codegen
        config = dataclasses.replace(config, executor="xla")
    prog = ctx.compile(bounds={B: len(rows), T: int(lengths.max()) + new, N: model.layers},
                       outputs={"ids": ids}, config=config)
    got = prog.run()["ids"]
    return [[int(i) for i in got[k, p:p + new]] for k, p in enumerate(lengths)]


def _id_rows(prompts, vocab: int) -> list[list[int]]:
    """Prompts given as ids: a non-empty list of non-empty int sequences within the vocab."""
    bad = ArgumentError(f"tl.nn.generate: prompts must be a string, a list of strings or a list "
                        f"of token-id lists, got {type(prompts).__name__} {prompts!r}"[:300])
    if isinstance(prompts, np.ndarray) and prompts.ndim == 2:
        prompts = list(prompts)       # (B, P) ids: one prompt per row
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise bad
    if all(isinstance(p, (int, np.integer)) for p in prompts):
        raise ArgumentError(f"tl.nn.generate: prompts is one list of ids; give a list of "
                            f"prompts, [{list(prompts)[:8]}{'...' if len(prompts) > 8 else ''}]"
                            " for one")
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
        return frozenset(() if tokenizer is None else tokenizer.eos_token_ids)
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


class _Stream:
    """The ``tl.sink`` of a streamed generation: the user's ``stream(row, piece)`` with each
    row's new tokens, in order, up to its end. With a tokenizer a piece is the text the token
    adds (the row decoded anew each time, so that a character split over tokens comes whole)."""

    def __init__(self, fn, rows, new: int, stops: frozenset, tokenizer):
        self.fn, self.new, self.stops, self.tokenizer = fn, new, stops, tokenizer
        self.__name__ = f"{getattr(fn, '__name__', type(fn).__name__)} (tl.nn.generate's stream)"
        self.lengths = [len(r) for r in rows]
        self.tokens: list[list[int]] = [[] for _ in rows]
        self.text = [""] * len(rows)

    def __call__(self, point: dict, value) -> None:
        row = point["b"]
        got = self.tokens[row]
        if point["t"] - self.lengths[row] != len(got) or len(got) == self.new or (
                got and got[-1] in self.stops):
            return          # a prompt step, or past the row's end
        got.append(int(value))
        if self.tokenizer is None:
            self.fn(row, got[-1])
            return
        text = self.tokenizer.decode(got, skip_special_tokens=True)
        if text.endswith("\ufffd") and len(got) < self.new:
            return          # a character not yet complete
        piece, self.text[row] = text[len(self.text[row]):], text
        if piece:
            self.fn(row, piece)


class TextStream:
    """A ``stream=`` for ``tl.nn.generate`` that shows each row's new text as it comes: in a
    notebook one output that grows in place (every row on its own line), elsewhere printed as
    it comes. ``stream.text`` holds each row's text so far."""

    def __init__(self):
        self.text: dict[int, str] = {}
        self._shown = None
        self._row = None

    def __call__(self, row: int, piece) -> None:
        self.text[row] = self.text.get(row, "") + str(piece)
        display = _notebook_display()
        if display is not None:
            body = "\n".join(f"[{k}] {v}" if len(self.text) > 1 else v
                             for k, v in sorted(self.text.items()))
            if self._shown is None:
                self._shown = display.display(display.Pretty(body), display_id=True)
            else:
                self._shown.update(display.Pretty(body))
            return
        if row != self._row:
            print(f"\n[{row}] " if self._row is not None or row else "", end="")
            self._row = row
        print(piece, end="", flush=True)

    def __repr__(self) -> str:
        return f"TextStream(rows={len(self.text)})"


def _notebook_display():
    """IPython's display module when a notebook kernel runs this (never imported here)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None
    return sys.modules.get("IPython.display")
