"""Files a user names: the path checked, and JSON read through one guarded reader.

Every JSON file the package reads (a checkpoint's ``config.json`` and shard index, a stage
``tl.save`` wrote) comes from outside and may be damaged or hostile. Python's ``json`` module
recurses once per level of nesting (a file nested 100 000 deep raises ``RecursionError``),
refuses integers past 4 300 digits with a bare ``ValueError``, keeps the last of two equal keys
without a word, and returns any top-level value. ``read_json`` bounds all of it and raises one
``JSONError`` (a ``ValueError``) that says what is wrong; each caller turns it into its own
located error naming the file (``CheckpointError``, ``ArgumentError``).

``NaN``, ``Infinity`` and numbers past a float's range (``1e999``) are read as the floats they
spell, so that the field's own check names the field, its value and its rule."""
from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from .errors import ArgumentError

MAX_DEPTH = 100     # arrays and objects inside each other; the files read nest fewer than 10
MAX_DIGITS = 400    # digits of an integer: past any float (309 digits), far below Python's 4300


class JSONError(ValueError):
    """JSON that ``read_json`` refuses; the message says what is wrong with it."""


def user_path(value, what: str) -> pathlib.Path:
    """``value`` as a path when it is one (a ``str`` or ``os.PathLike`` naming text, without a
    NUL byte, which no file system allows), else an ``ArgumentError`` at the user's line that
    says ``what`` takes (``tl.save(..., path=3)``)."""
    name = os.fspath(value) if isinstance(value, (str, os.PathLike)) else None
    if not isinstance(name, str) or "\0" in name:
        why = "has a NUL byte" if isinstance(name, str) else f"is a {type(value).__name__}"
        raise ArgumentError(f"{what}: the path {_short(value)} {why}; give a file path (a str "
                            "or pathlib.Path)")
    return pathlib.Path(name)


def read_json(file, top: type | None = dict):
    """The JSON value in ``file`` (UTF-8), of type ``top`` unless it is None. ``OSError``
    (a file that is not there) passes through; anything else wrong is a ``JSONError``."""
    try:
        text = pathlib.Path(file).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise JSONError(f"not UTF-8 text ({e.reason} at byte {e.start})") from None
    return parse_json(text, top)


def parse_json(text: str, top: type | None = dict):
    """``text`` as JSON, nested at most ``MAX_DEPTH`` deep, its integers at most
    ``MAX_DIGITS`` digits long, no key twice in an object, of type ``top`` unless None."""
    depth = nesting(text)
    if depth > MAX_DEPTH:
        raise JSONError(f"it is nested too deeply ({depth} levels; at most {MAX_DEPTH} are "
                        "read)")
    try:
        value = json.loads(text, parse_int=_int, object_pairs_hook=_object)
    except RecursionError:  # nesting() counts valid JSON exactly; this is for the rest
        raise JSONError("it is nested too deeply") from None
    except json.JSONDecodeError as e:
        raise JSONError(f"not JSON: {e}") from None
    if top is not None and not isinstance(value, top):
        raise JSONError(f"it holds a JSON {_KINDS.get(type(value), type(value).__name__)} "
                        f"where a JSON {_KINDS.get(top, top.__name__)} is needed")
    return value


def nesting(text: str) -> int:
    """How deep ``text``'s arrays and objects nest, counted without recursing (so any text
    can be measured): the running count of brackets outside strings, at its highest."""
    plain = text.replace("\\\\", "").replace('\\"', "")  # escapes occur only inside strings
    outside = "".join(plain.split('"')[::2]).encode("ascii", "replace")
    codes = _STEP[np.frombuffer(outside, np.uint8)]
    codes = codes[codes != 0]
    return int(np.cumsum(codes, dtype=np.int64).max(initial=0))


_STEP = np.zeros(256, np.int8)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1
_KINDS = {dict: "object", list: "array", str: "string", int: "number", float: "number",
          bool: "true/false", type(None): "null"}


def _int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise JSONError(f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_DIGITS} "
                        "are read)")
    return int(digits)


def _object(pairs: list) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise JSONError(f"an object names the key {_short(twice)} twice (which one holds?)")
    return out


def _short(value, at_most: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= at_most else f"{text[:at_most - 20]}...({len(text)} characters)"
