"""User-facing errors. Every message starts with the user's ``file:line`` so that a notebook or a
terminal shows where the mistake is, and ends with how to fix it."""
from __future__ import annotations

import linecache
import os
import sys
from dataclasses import dataclass

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Location:
    """Where the user wrote a call: the first stack frame outside the tempo_lab package."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()


UNKNOWN = Location("<unknown>", 0)


def user_location() -> Location:
    frame = sys._getframe(1)
    while frame is not None:
        fname = os.path.abspath(frame.f_code.co_filename)
        if not fname.startswith(_PACKAGE_DIR + os.sep) and "importlib" not in fname \
                and not _generated_method(frame):
            return Location(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back
    return UNKNOWN


def _generated_method(frame) -> bool:
    """A method of one of our classes that Python generated (a dataclass ``__init__``)."""
    if not frame.f_code.co_filename.startswith("<") or frame.f_code.co_name != "__init__":
        return False
    return type(frame.f_locals.get("self")).__module__.startswith("tempo_lab")


class TempoLabError(Exception):
    """Base of every error a user can cause. ``loc`` is where; the message says how to fix it."""

    def __init__(self, message: str, loc: Location | None = None):
        self.loc = loc if loc is not None else user_location()
        self.reason = message
        text = f"{self.loc}: {message}"
        src = self.loc.source
        if src:
            text += f"\n    {src}"
        super().__init__(text)


class ShapeError(TempoLabError):
    """Spatial shapes that do not fit (found at trace time, or a non-static output)."""


class DTypeError(TempoLabError):
    """Dtypes that an op does not accept."""


class ExprError(TempoLabError):
    """An index expression or condition that is not of the supported (quasi-affine) form."""


class DefinitionError(TempoLabError):
    """Placeholder branches that overlap, leave points undefined, or have an unsupported key."""


class BoundsError(TempoLabError):
    """A read outside a producer's domain, or bounds that are missing or invalid."""


class ScheduleError(TempoLabError):
    """No legal execution order: a value depends on itself at the same point."""


class GradientError(TempoLabError):
    """A gradient that tl.grad cannot build (an unsupported read or op, or a second order)."""
