"""``tl.nn.generate``: prompts in, new tokens (or text) out, as ``transformers``' ``generate``.

It writes the recurrent-tensor program a user would write with ``model.generate`` (a context
over a batch dim ``b``, the step ``t`` and the layer dim ``n``), compiles it for the prompts'
shape and runs it. Prompts of different lengths are decoded in one program: each is padded at
its start to the longest, its positions counted from its first token and its padding given no
attention, so each row's tokens are those it gets decoded alone (``decoding.decode``), and all
the prompts' steps run as one batch. A row ends at its first end-of-sequence token (kept in
the ids, dropped from the text), or after its ``max_new_tokens``; the program's steps end
where every row has ended (``tl.until``, see ``generate``'s ``early_stop``), else where the
longest row's limit is. Settings the call leaves out come from the checkpoint's
``generation_config.json`` as ``transformers`` applies them; chat messages go through the
tokenizer's chat template.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from ..compile_config import CompileConfig
from ..errors import ArgumentError, CheckpointError
from ..frontend.api import eq, from_array, placeholder, sink
from ..frontend.bounds import until
from ..frontend.context import Context
from ..frontend.tensor import as_tensor
from .decoding import decode
from .hub import resolve
from .tokenizer import GENERATION, Tokenizer, check_generation_config, read_generation_config


def generate(model, params, prompts, max_new_tokens: int | None = None,
             tokenizer: Tokenizer | None = None, temperature: float | None = None,
             top_k: int | None = None, top_p: float | None = None,
             repetition_penalty: float | None = None, seed: int = 0, eos=None, stream=None,
             config=None, *, do_sample: bool | None = None, generation_config=None,
             chat: bool | None = None, early_stop: bool | None = None):
    """New tokens for each prompt: greedy, or sampled (keyed by ``seed``) at ``temperature``
    among the ``top_k`` most likely tokens and the smallest set of probability ``top_p``;
    ``repetition_penalty`` makes tokens the row already holds less likely, as in
    ``transformers``.

    Settings the call leaves out (None) come from the checkpoint's ``generation_config.json``
    as ``transformers`` takes them: ``do_sample`` (false: greedy, whatever the temperature),
    ``temperature``, ``top_k``, ``top_p``, ``repetition_penalty``, ``max_new_tokens`` (else
    ``max_length``, prompt included, each row's own), ``eos_token_id``; what neither gives is
    transformers' default (20 new tokens, ``top_k`` 50 when sampling). The file is the
    tokenizer's (``tok.generation_config``) or ``generation_config`` (a checkpoint directory,
    its ``generation_config.json``, a cached Hub id or a dict of its fields: ``{}`` sets none).
    With no such file: greedy unless ``temperature > 0`` or ``do_sample``, 16 new tokens,
    no top-k. ``temperature > 0`` asks for sampling, ``0`` for greedy; ``top_k=0`` and
    ``top_p=1`` turn those filters off.

    ``prompts``: a string or a list of strings (needs ``tokenizer``; gives new text, special
    tokens skipped), or a list of token-id lists of any lengths (gives a list of new id lists).
    Chat: a conversation (a list of ``{"role": ..., "content": ...}`` dicts) or a list of
    them, or strings with ``chat=True`` (each a user's message), is rendered by the
    tokenizer's chat template with the assistant's turn opened
    (``tok.apply_chat_template(messages)``) and gives the assistant's new text.
    ``eos``: an id or ids that end a row (default: the tokenizer's ``eos_token_ids``, its EOS
    and those of the generation config; none without either).
    ``stream``: a function ``stream(row, piece)`` called while the program runs with each
    row's new text as it comes (its new token id without a tokenizer), in order, up to the
    row's end; ``tl.nn.TextStream()`` shows the text live in a notebook. ``config``: the
    ``tl.CompileConfig`` of the program (with ``stream``, the XLA executor unless it names
    another: its host callbacks run inside the compiled program).

    ``early_stop``: with ids that end a row, the program stops at the step where every row
    has ended (a ``tl.until`` over the steps), not at the longest row's limit (the default,
    None, and True); False: never. The compiler still batches the prompt steps every row
    shares (the prefix split of ``tempo_lab.passes.prefix``)."""
    if not callable(getattr(model, "generate", None)) or not hasattr(model, "vocab"):
        raise ArgumentError(f"tl.nn.generate: model must be a tl.nn decoder such as tl.nn.Llama, "
                            f"got {type(model).__name__}")
    if max_new_tokens is not None and (
            not isinstance(max_new_tokens, (int, np.integer))
            or isinstance(max_new_tokens, bool) or max_new_tokens < 1):
        raise ArgumentError(f"tl.nn.generate: max_new_tokens must be an int >= 1, got "
                            f"{max_new_tokens!r}")
    if tokenizer is not None and not isinstance(tokenizer, Tokenizer):
        raise ArgumentError(f"tl.nn.generate: tokenizer must be a tl.nn.Tokenizer, got "
                            f"{type(tokenizer).__name__}")
    single = isinstance(prompts, str) or _is_conversation(prompts)
    texts = [prompts] if single else prompts
    chats = _conversations(texts, chat)
    is_text = chats is not None or (isinstance(texts, (list, tuple)) and texts
                                    and all(isinstance(p, str) for p in texts))
    if chats is not None:
        if tokenizer is None:
            raise ArgumentError("tl.nn.generate: a chat needs tokenizer=tl.nn.Tokenizer."
                                "from_pretrained(path), whose chat template renders it")
        rows = [tokenizer.apply_chat_template(c) for c in chats]
    elif is_text:
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
    gen, where = _generation_config(generation_config, tokenizer, model.vocab)
    sampling, limits = _settings(
        dict(do_sample=do_sample, temperature=temperature, top_k=top_k, top_p=top_p,
             repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens),
        gen, where, [len(r) for r in rows], model.vocab)
    stops = _eos(eos, tokenizer, model.vocab, gen)
    steps = max(len(r) + n for r, n in zip(rows, limits))
    if steps > getattr(model, "positions", steps):
        raise ArgumentError(f"tl.nn.generate: the prompts and their new tokens need {steps} "
                            f"positions but {type(model).__name__} has {model.positions}; "
                            "shorten them or lower max_new_tokens")
    if stream is not None and not callable(stream):
        raise ArgumentError(f"tl.nn.generate: stream must be a function stream(row, piece), got "
                            f"{type(stream).__name__}")
    if stream is not None:
        stream = _Stream(stream, rows, limits, stops, tokenizer if is_text else None)
    if early_stop is not None and not isinstance(early_stop, (bool, np.bool_)):
        raise ArgumentError(f"tl.nn.generate: early_stop must be True, False or None, got "
                            f"{early_stop!r}"[:200])
    out = _decode_batch(model, params, rows, limits, dict(sampling, seed=seed), config, stream,
                        stops, early_stop)
    out = [_until_eos(r, stops) for r in out]
    if not is_text:
        return out
    new = [tokenizer.decode(r, skip_special_tokens=True) for r in out]
    return new[0] if single else new


def _is_conversation(x) -> bool:
    """A list of chat messages: a non-empty list of dicts."""
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(m, dict) for m in x)


def _conversations(prompts, chat) -> list | None:
    """The conversations to render with the chat template (``prompts`` as a list), or None
    when the prompts are not a chat."""
    if chat is not None and not isinstance(chat, (bool, np.bool_)):
        raise ArgumentError(f"tl.nn.generate: chat must be True, False or None, got {chat!r}"
                            [:200])
    given = isinstance(prompts, (list, tuple)) and bool(prompts) and all(
        _is_conversation(c) for c in prompts)
    if given and chat is False:
        raise ArgumentError("tl.nn.generate: the prompts are chat messages but chat=False; "
                            "drop chat=False, or give the text or ids of the prompts")
    if given:
        return list(prompts)
    if not chat:
        return None
    if isinstance(prompts, (list, tuple)) and prompts and all(isinstance(p, str) for p in prompts):
        return [[{"role": "user", "content": p}] for p in prompts]
    raise ArgumentError(f"tl.nn.generate: chat=True takes a string, a list of strings (each a "
                        f"user's message) or conversations (lists of {{'role', 'content'}} "
                        f"dicts), got {type(prompts).__name__} {prompts!r}"[:300])


# transformers' defaults for what neither the call nor generation_config.json sets
HF_DEFAULTS = dict(do_sample=False, temperature=1.0, top_k=50, top_p=1.0, repetition_penalty=1.0,
                   max_new_tokens=20)
# tl.nn.generate's own, with no generation config in effect
OWN_DEFAULTS = dict(do_sample=False, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                    max_new_tokens=16)
# generation_config.json fields tl.nn.generate cannot honour: name -> (neutral, what it asks,
# whether it matters only when sampling)
UNHONOURED = {
    "num_beams": ((None, 1), "beam search", False),
    "num_return_sequences": ((None, 1), "several sequences per prompt", False),
    "penalty_alpha": ((None, 0, 0.0), "contrastive search", False),
    "min_length": ((None, 0), "a minimum length", False),
    "min_new_tokens": ((None, 0), "a minimum length", False),
    "no_repeat_ngram_size": ((None, 0), "a ban on repeated n-grams", False),
    "bad_words_ids": ((None, []), "banned words", False),
    "suppress_tokens": ((None, []), "suppressed tokens", False),
    "begin_suppress_tokens": ((None, []), "suppressed tokens", False),
    "forced_bos_token_id": ((None,), "a forced first token", False),
    "forced_eos_token_id": ((None,), "a forced last token", False),
    "sequence_bias": ((None, {}), "biased sequences", False),
    "stop_strings": ((None, [], ""), "stop strings", False),
    "exponential_decay_length_penalty": ((None,), "a length penalty", False),
    "guidance_scale": ((None, 1, 1.0), "classifier-free guidance", False),
    "dola_layers": ((None,), "DoLa decoding", False),
    "min_p": ((None, 0, 0.0), "min-p sampling", True),
    "typical_p": ((None, 1, 1.0), "typical sampling", True),
    "epsilon_cutoff": ((None, 0, 0.0), "epsilon sampling", True),
    "eta_cutoff": ((None, 0, 0.0), "eta sampling", True),
    "top_h": ((None,), "top-h sampling", True),
}


def _generation_config(given, tokenizer, vocab: int) -> tuple[dict | None, str]:
    """The generation config in effect (None: none) and where it comes from, for errors."""
    if given is None:
        if tokenizer is None or tokenizer.generation is None:
            return None, ""
        return tokenizer.generation, str(Path(tokenizer.source).parent / GENERATION)
    if isinstance(given, dict):
        if not all(isinstance(k, str) for k in given):
            raise ArgumentError(f"tl.nn.generate: generation_config's keys must be field names "
                                f"(str), got {list(given)[:6]!r}")
        return check_generation_config(given, vocab, "tl.nn.generate: generation_config",
                                       ArgumentError), "generation_config"
    if isinstance(given, (str, os.PathLike)) and not isinstance(given, bytes):
        path = resolve(given, "tl.nn.generate: generation_config")
        file = path / GENERATION if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"{file}: no {GENERATION}; give generation_config as a "
                                  "checkpoint directory that holds one, or as a dict")
        return read_generation_config(file, vocab), str(file)
    raise ArgumentError(f"tl.nn.generate: generation_config must be a checkpoint directory, a "
                        f"generation_config.json path, a Hub id or a dict, got "
                        f"{type(given).__name__}")


def _settings(call: dict, gen: dict | None, where: str, lengths: list[int],
              vocab: int) -> tuple[dict, list[int]]:
    """The sampling settings of ``decode`` and each row's count of new tokens: the call's,
    else the generation config's (``gen``, from ``where``), else the defaults
    (transformers' with a generation config, ``OWN_DEFAULTS`` without)."""
    _check_call(call)
    defaults = OWN_DEFAULTS if gen is None else HF_DEFAULTS
    gen = gen or {}

    def pick(name):
        return call[name] if call[name] is not None else gen.get(name, defaults[name])

    if call["do_sample"] is not None:
        sampling = call["do_sample"]
    elif call["temperature"] is not None:
        sampling = call["temperature"] > 0
    else:
        sampling = gen.get("do_sample", False)
    for name, (neutral, what, only_sampling) in UNHONOURED.items():
        value = gen.get(name)
        if (sampling or not only_sampling) and value not in neutral:
            raise CheckpointError(f"{where}: {name} is {str(value)[:60]}, which asks for {what}; "
                                  "tl.nn.generate cannot honour it: give the settings with "
                                  "generation_config={...} ({} for none)")
    temperature = float(pick("temperature"))
    if sampling and temperature == 0:
        source = "the call" if call["temperature"] is not None else where
        raise ArgumentError(f"tl.nn.generate: sampling (do_sample) at temperature 0 (from "
                            f"{source}); give temperature > 0, or do_sample=False for greedy")
    top_k, top_p = int(pick("top_k")), float(pick("top_p"))
    if top_p == 0:             # transformers keeps the most likely token
        top_k, top_p = 1, 1.0
    sample = dict(temperature=temperature if sampling else 0.0,
                  top_k=top_k if sampling and 0 < top_k < vocab else None,
                  top_p=top_p if sampling and top_p < 1 else None,
                  repetition_penalty=float(pick("repetition_penalty")))
    if call["max_new_tokens"] is not None or "max_new_tokens" in gen or "max_length" not in gen:
        return sample, [int(pick("max_new_tokens"))] * len(lengths)
    most = gen["max_length"]
    short = next((k for k, n in enumerate(lengths) if n >= most), None)
    if short is not None:
        raise ArgumentError(f"tl.nn.generate: prompt {short} has {lengths[short]} tokens, not "
                            f"fewer than max_length {most} ({where}); give max_new_tokens")
    return sample, [most - n for n in lengths]


def _check_call(call: dict) -> None:
    """The sampling arguments of a call, each None or of its kind."""
    def bad(name, what):
        raise ArgumentError(f"tl.nn.generate: {name} must be {what}, got {call[name]!r}")

    v = call["do_sample"]
    if v is not None and not isinstance(v, (bool, np.bool_)):
        bad("do_sample", "True, False or None")
    v = call["temperature"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0 <= v < float("inf")):
        bad("temperature", "a finite number >= 0 (0: greedy)")
    v = call["top_k"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0):
        bad("top_k", "an int >= 1, 0 for no top-k, or None")
    v = call["top_p"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0 < v <= 1):
        bad("top_p", "a number in (0, 1] (1: no top-p) or None")
    v = call["repetition_penalty"]
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                          or not 0 < v < float("inf")):
        bad("repetition_penalty", "a finite number > 0 (1: none)")


def _stops_early(early_stop, stops) -> bool:
    """Whether the program ends when every row has ended (``early_stop``, see ``generate``)."""
    return bool(stops) and early_stop is not False


def _decode_batch(model, params, rows, limits: list[int], sampling: dict, config,
                  stream, stops: frozenset = frozenset(),
                  early_stop: bool | None = None) -> list[list[int]]:
    """Each row's ``limits[row]`` new tokens, all rows in one program: prompts padded at the
    start to the longest, each row's positions and attention its own (``decoding.decode``).

    With ``stops`` (ids that end a row) the step dim's bound is ``tl.until(all rows ended)``:
    row ``b`` ends at step ``t`` when it is past its prompt and feeds a stop id there, or at
    its last step; the loop ends at the step where the last row has ended, not at the
    longest row's limit. (A ``tl.until`` per row, over ``(b, t)``, gives the same tokens but
    ran no faster: the rows of the batch step together until the last has ended, and it
    cannot stream, as a ``tl.sink`` over a ragged domain is refused.)"""
    lengths = np.array([len(r) for r in rows], dtype=np.int32)
    P = int(lengths.max())  # every row's prompt ends there: its new tokens from P on
    steps = P + max(limits)
    config = config or CompileConfig()
    if stream is not None and config.executor == "auto":  # "auto" takes a sink to codegen
        config = dataclasses.replace(config, executor="xla")
    prompt = np.zeros((len(rows), P), dtype=np.int32)
    for k, r in enumerate(rows):
        prompt[k, P - len(r):] = r
    ctx = Context(dims=("b", "t", "n"))
    b, t, n = ctx.dims
    B, T, N = ctx.bounds
    bound = steps
    with ctx:
        plen = from_array(lengths, domain=(b,), name="prompt_length")
        ids, _ = decode(model, params, from_array(prompt, domain=(b,), name="prompt"), t, n,
                        me="tl.nn.generate", lengths=plen, **sampling)
        if stream is not None:
            sink(ids, stream)
        if _stops_early(early_stop, stops):
            step = as_tensor(t, ctx)
            last = from_array(P + np.asarray(limits, np.int32) - 1, domain=(b,),
                              name="last_step")
            hit = None
            for i in sorted(stops):
                hit = eq(ids, i) if hit is None else hit | eq(ids, i)
            done = (step >= last) | (hit & (step >= P))
            ended = placeholder((), "bool", domain=(b, t), name="row_ended")
            ended[b, 0] = done[b, 0]
            ended[b, t] = ended[b, t - 1] | done
            bound = until(ended.astype("int32")[0:B, t].min(axis=0) > 0, max=steps)
    prog = ctx.compile(bounds={B: len(rows), T: bound, N: model.layers},
                       outputs={"ids": ids}, config=config)
    got = prog.run()["ids"]
    return [[int(i) for i in got[k, P:P + n]] for k, n in enumerate(limits)]


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


def _eos(eos, tokenizer, vocab: int, gen: dict | None) -> frozenset[int]:
    """The ids that end a row: ``eos`` (an id or ids), else the tokenizer's EOS and the
    generation config's ``eos_token_id``, else none."""
    if eos is None:
        own = gen.get("eos_token_id", ()) if gen else ()
        own = (own,) if isinstance(own, int) else tuple(own)
        return frozenset(own + (() if tokenizer is None else tokenizer.eos_token_ids))
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

    def __init__(self, fn, rows, limits: list[int], stops: frozenset, tokenizer):
        self.fn, self.limits, self.stops, self.tokenizer = fn, limits, stops, tokenizer
        self.__name__ = f"{getattr(fn, '__name__', type(fn).__name__)} (tl.nn.generate's stream)"
        self.P = max(len(r) for r in rows)  # where every row's new tokens start
        self.tokens: list[list[int]] = [[] for _ in rows]
        self.text = [""] * len(rows)

    def __call__(self, point: dict, value) -> None:
        row = point["b"]
        got = self.tokens[row]
        if point["t"] - self.P != len(got) or len(got) == self.limits[row] or (
                got and got[-1] in self.stops):
            return          # a prompt step, or past the row's end
        got.append(int(value))
        if self.tokenizer is None:
            self.fn(row, got[-1])
            return
        text = self.tokenizer.decode(got, skip_special_tokens=True)
        if text.endswith("\ufffd") and len(got) < self.limits[row]:
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
