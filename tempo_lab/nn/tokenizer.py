"""Text in and out: a checkpoint's tokenizer.

``Tokenizer.from_pretrained(path)`` reads the ``tokenizer.json`` that ``transformers`` saves
beside a checkpoint with the ``tokenizers`` package, the library behind transformers' own fast
tokenizers, so that text becomes exactly the ids the checkpoint was trained on: the same
normaliser, pre-tokeniser, merges and post-processor (a Llama 3 tokenizer prepends
``<|begin_of_text|>`` through its post-processor, as ``AutoTokenizer`` does). From
``tokenizer_config.json`` it takes the special tokens, ``clean_up_tokenization_spaces`` and the
chat template (also read from ``chat_template.jinja``, where newer transformers save it), which
``apply_chat_template`` renders with jinja2 in a sandbox with the globals transformers gives a
template (``raise_exception``, ``strftime_now``, the ``tojson`` filter). From
``generation_config.json`` beside them it takes the ids that end a generation and the
checkpoint's sampling defaults (``do_sample``, ``temperature``, ``top_k``, ...), which
``tl.nn.generate`` applies when given this tokenizer (``generation_settings``).

Both packages are imported when a tokenizer is made, never when ``tempo_lab`` is imported.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import ArgumentError, CheckpointError
from ..files import MAX_DEPTH, nesting
from .checkpoint import read_object

FILE = "tokenizer.json"
CONFIG = "tokenizer_config.json"
TEMPLATE = "chat_template.jinja"
GENERATION = "generation_config.json"
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")

# transformers' ``clean_up_tokenization``: spaces a word-level tokenizer put before punctuation
# and English contractions, taken out when decoding if the checkpoint asks for it.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
            (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@dataclass(frozen=True, eq=False)
class Tokenizer:
    """A checkpoint's tokenizer: ``encode(text) -> list[int]``, ``decode(ids) -> str``, the
    special tokens by name (``bos_token``, ``eos_token``, ... and their ids) and
    ``apply_chat_template(messages)``. Made by ``Tokenizer.from_pretrained(path)``."""

    backend: object                       # a tokenizers.Tokenizer
    specials: dict = field(default_factory=dict)    # "bos_token" -> "<s>" (those set)
    chat_template: str | None = None
    clean_up_spaces: bool = False
    source: str = ""
    generation_eos: tuple[int, ...] = ()   # generation_config.json's eos_token_id(s)
    generation: dict | None = None        # its fields, checked; None without the file

    @classmethod
    def from_pretrained(cls, path) -> Tokenizer:
        """The tokenizer of a checkpoint directory (or of its ``tokenizer.json`` given itself):
        see the module."""
        from .hub import resolve

        path = resolve(path, "tl.nn.Tokenizer.from_pretrained")
        folder = path if path.is_dir() else path.parent
        file = folder / FILE if path.is_dir() else path
        if not file.is_file():
            raise CheckpointError(f"{file}: no {FILE}; a checkpoint saved by transformers holds "
                                  f"it beside config.json (tokenizer.save_pretrained(dir) "
                                  "writes it)")
        try:
            from tokenizers import Tokenizer as Backend
        except ImportError:
            raise ArgumentError("tl.nn.Tokenizer needs the tokenizers package: pip install "
                                "tokenizers") from None
        try:   # its depth bounded first, as every JSON the package reads; parsed once, in Rust
            text = file.read_text(encoding="utf-8")
            if nesting(text) > MAX_DEPTH:
                raise CheckpointError(f"{file}: nested deeper than {MAX_DEPTH} levels; not a "
                                      "tokenizer")
            backend = Backend.from_str(text)
        except CheckpointError:
            raise
        except Exception as e:  # tokenizers raises plain Exception; OSError, UnicodeError
            raise CheckpointError(f"{file}: not a tokenizer the tokenizers package can read "
                                  f"({type(e).__name__}: {e})") from None
        cfg = _read_object(folder / CONFIG)
        specials = {k: v for k in SPECIAL if (v := _token_text(cfg.get(k), k, folder))}
        for name, text in specials.items():
            if backend.token_to_id(text) is None:
                raise CheckpointError(f"{folder / CONFIG}: {name} {text!r} is not a token of "
                                      f"{file.name}")
        template = _template(cfg, folder)
        clean = cfg.get("clean_up_tokenization_spaces", False)
        if not isinstance(clean, bool):
            raise CheckpointError(f"{folder / CONFIG}: clean_up_tokenization_spaces is "
                                  f"{clean!r}; give true or false")
        generation = None if not (folder / GENERATION).is_file() else read_generation_config(
            folder / GENERATION, backend.get_vocab_size(with_added_tokens=True))
        eos = (generation or {}).get("eos_token_id", ())
        return cls(backend, specials, template, clean, str(file),
                   (eos,) if isinstance(eos, int) else tuple(eos), generation)

    # -- ids --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Ids run over ``range(vocab_size)`` (added tokens included)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, token: str) -> int | None:
        """The id of ``token`` (a token's text, ``"</s>"``), or None when it has none."""
        return self.backend.token_to_id(token)

    def special_id(self, name: str) -> int | None:
        """The id of a special token by its role (``"eos_token"``), None when the checkpoint
        sets none."""
        text = self.specials.get(name)
        return None if text is None else self.backend.token_to_id(text)

    @property
    def bos_token_id(self) -> int | None:
        return self.special_id("bos_token")

    @property
    def eos_token_id(self) -> int | None:
        return self.special_id("eos_token")

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends a generation: the tokenizer's EOS token and the ids
        ``generation_config.json`` lists (Llama 3 Instruct ends a turn at ``<|eot_id|>`` as
        well as at ``<|end_of_text|>``); what ``tl.nn.generate`` stops at by default."""
        own = () if self.eos_token_id is None else (self.eos_token_id,)
        return tuple(dict.fromkeys(own + self.generation_eos))

    @property
    def generation_config(self) -> dict:
        """The fields of the checkpoint's ``generation_config.json`` (``{}`` without one), as
        ``tl.nn.generate(..., tokenizer=tok)`` applies them: ``do_sample``, ``temperature``,
        ``top_k``, ``top_p``, ``repetition_penalty``, ``max_new_tokens``, ``max_length``,
        ``eos_token_id``, ``pad_token_id`` and any other field it holds."""
        return dict(self.generation or {})

    @property
    def pad_token_id(self) -> int | None:
        return self.special_id("pad_token")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``, with the special tokens the tokenizer's post-processor adds
        (a BOS token for Llama) unless ``add_special_tokens=False``."""
        return self.encode_batch([text], add_special_tokens)[0]

    def encode_batch(self, texts, add_special_tokens: bool = True) -> list[list[int]]:
        """``encode`` of each string of ``texts`` (encoded in parallel by the library)."""
        if isinstance(texts, str) or not all(isinstance(s, str) for s in texts):
            raise ArgumentError(f"Tokenizer.encode_batch takes a list of strings, got "
                                f"{_kind(texts)}")
        return [e.ids for e in self.backend.encode_batch(
            list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a list of ints or an int array), special tokens kept unless
        ``skip_special_tokens``, as ``transformers``' ``decode`` gives it."""
        ids = _ids(ids, self.vocab_size)
        text = self.backend.decode(ids, skip_special_tokens=skip_special_tokens)
        if self.clean_up_spaces:
            for a, b in _CLEANUP:
                text = text.replace(a, b)
        return text

    # -- chat -------------------------------------------------------------------------------------
    def apply_chat_template(self, messages, add_generation_prompt: bool = True,
                            tokenize: bool = True, **variables):
        """``messages`` (a list of ``{"role": ..., "content": ...}``) rendered by the
        checkpoint's chat template: the prompt text, or its ids when ``tokenize`` (special
        tokens come from the template, so none are added again). ``variables`` reach the
        template as they do in transformers (``tools=``, ``documents=``, ...)."""
        if self.chat_template is None:
            raise ArgumentError(f"the tokenizer of {self.source} has no chat template "
                                f"({CONFIG} sets none and there is no {TEMPLATE}); "
                                "encode the prompt text with tok.encode(text)")
        if not isinstance(messages, (list, tuple)) or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise ArgumentError(f"apply_chat_template takes a list of messages, each a dict "
                                f"with 'role' and 'content', got {_kind(messages)}")
        text = _render(self.chat_template, self.source,
                       dict(variables, messages=list(messages),
                            add_generation_prompt=add_generation_prompt, **self.specials))
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def __repr__(self) -> str:
        tokens = ", ".join(f"{k.removesuffix('_token')}={v!r}" for k, v in self.specials.items())
        return (f"Tokenizer(vocab={self.vocab_size}{', ' + tokens if tokens else ''}, "
                f"chat_template={'yes' if self.chat_template else 'no'})")


# -- reading ----------------------------------------------------------------------------------------
def _read_object(file: Path) -> dict:
    """A JSON object file through the package's guarded reader, {} when it is not there."""
    return read_object(file) if file.is_file() else {}


# generation_config.json's fields tl.nn.generate reads: name -> (check, what to give)
GENERATION_FIELDS = {
    "do_sample": (lambda v, n: isinstance(v, bool), "true or false"),
    "temperature": (lambda v, n: _num(v) and 0 <= v < math.inf, "a finite number >= 0"),
    "top_k": (lambda v, n: _int(v) and v >= 0, "an int >= 0 (0: no top-k)"),
    "top_p": (lambda v, n: _num(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "repetition_penalty": (lambda v, n: _num(v) and 0 < v < math.inf,
                           "a finite number > 0 (1: none)"),
    "max_new_tokens": (lambda v, n: _int(v) and v >= 1, "an int >= 1"),
    "max_length": (lambda v, n: _int(v) and v >= 1, "an int >= 1"),
    "eos_token_id": (lambda v, n: _id(v, n) or isinstance(v, list) and all(_id(i, n) for i in v),
                     None),
    "pad_token_id": (lambda v, n: _id(v, n), None),
    "bos_token_id": (lambda v, n: _id(v, n), None),
}


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _id(v, vocab: int | None) -> bool:
    return _int(v) and 0 <= v and (vocab is None or v < vocab)


def check_generation_config(cfg: dict, vocab: int | None, where: str, error) -> dict:
    """``cfg`` (a ``generation_config.json``'s object) with its null fields dropped, each field
    ``tl.nn.generate`` reads checked (``GENERATION_FIELDS``): a field of the wrong kind is
    ``error`` (a ``TempoLabError`` class) naming it, its value and what to give. Fields it
    does not read are kept, for ``tl.nn.generate`` to refuse those it cannot honour."""
    out = {}
    for name, value in cfg.items():
        if value is None:
            continue
        check = GENERATION_FIELDS.get(name)
        if check is not None and not check[0](value, vocab):
            what = check[1] or (f"an id in [0, {vocab})" if name != "eos_token_id" else
                                f"an id or a list of ids in [0, {vocab})")
            raise error(f"{where}: {name} is {str(value)[:60]}; give {what}")
        out[name] = value
    return out


def read_generation_config(file: Path, vocab: int | None) -> dict:
    """The checked fields of a ``generation_config.json`` (``check_generation_config``),
    ``{}`` when there is none."""
    return check_generation_config(_read_object(file), vocab, str(file), CheckpointError)


def _token_text(value, name: str, folder: Path) -> str | None:
    """A special token as ``tokenizer_config.json`` writes it: a string, or transformers'
    ``AddedToken`` as an object with its ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    if value is None or isinstance(value, str):
        return value or None
    raise CheckpointError(f"{folder / CONFIG}: {name} is {value!r}; give the token's text")


def _template(cfg: dict, folder: Path) -> str | None:
    """The default chat template: ``chat_template.jinja``, else the config's ``chat_template``
    (a string, or a list of named templates of which "default" is taken)."""
    if (folder / TEMPLATE).is_file():
        return (folder / TEMPLATE).read_text(encoding="utf-8")
    tpl = cfg.get("chat_template")
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default")
    if tpl is None or isinstance(tpl, str):
        return tpl
    raise CheckpointError(f"{folder / CONFIG}: chat_template must be a string or a list of "
                          f"{{name, template}} objects, got {_kind(tpl)}")


def _render(template: str, source: str, variables: dict) -> str:
    """``template`` rendered as transformers renders a chat template (a jinja2 sandbox: a
    template cannot reach Python attributes or the file system)."""
    import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class TemplateRaised(Exception):
        pass

    def raise_exception(message):
        raise TemplateRaised(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, sort_keys=False: \
        json.dumps(x, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template)
    except jinja2.TemplateError as e:
        raise CheckpointError(f"{source}: the chat template is not valid jinja2 ({e})") from None
    try:
        return compiled.render(**variables)
    except TemplateRaised as e:
        raise ArgumentError(f"the chat template of {source} refused the messages: {e}") from None
    except jinja2.TemplateError as e:
        raise ArgumentError(f"the chat template of {source} failed on the messages "
                            f"({type(e).__name__}: {e})") from None


def _ids(ids, vocab: int) -> list[int]:
    """``ids`` as a list of Python ints in ``[0, vocab)``."""
    import numpy as np

    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise ArgumentError(f"Tokenizer.decode takes a sequence of int ids, got {_kind(ids)}")
    bad = arr[(arr < 0) | (arr >= vocab)] if arr.size else arr
    if bad.size:
        raise ArgumentError(f"Tokenizer.decode: id {int(bad[0])} is outside the vocabulary "
                            f"[0, {vocab})")
    return [int(i) for i in arr]


def _kind(x) -> str:
    return f"{type(x).__name__} {x!r}"[:80]
