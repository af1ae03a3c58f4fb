"""User-facing errors. Every message starts with the user's ``file:line`` so that a notebook or a
terminal shows where the mistake is, and ends with how to fix it."""
from __future__ import annotations

import dis
import functools
import inspect
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Location:
    """Where the user wrote a call: the first stack frame outside the tempo_lab package.

    ``stack`` is the user's code that led there, outermost first, as ``(file, line, function)``
    (frames of tempo_lab folded; it starts below the first standard-library or installed frame,
    which is what ran the user's code: IPython, pytest, a test worker); ``call`` the
    tempo_lab function the user's line called when that function is a library one
    (``tempo_lab.nn.llama.Llama.__call__``), empty for an op the user made directly."""

    file: str
    line: int
    stack: tuple[tuple[str, int, str], ...] = field(default=(), compare=False)
    call: str = field(default="", compare=False)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    @property
    def source(self) -> str:
        return linecache.getline(self.file, self.line).strip()

    @property
    def place(self) -> str:
        """Where it is, for a reader: ``cell [12], line 3`` for a notebook cell (IPython's own
        name for it, not its temporary file), else ``file.py:3``. Error messages keep the
        full ``file:line``, which editors and terminals link."""
        cell = cell_name(self.file)
        return f"{cell}, line {self.line}" if cell else f"{os.path.basename(self.file)}:{self.line}"


UNKNOWN = Location("<unknown>", 0)


def cell_name(file: str) -> str | None:
    """``cell [12]`` when ``file`` is the code of a cell this IPython kernel ran, else None
    (IPython is looked up, never imported)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    name = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(file)
    return f"cell {name[1][2:]}" if name and name[1].startswith("In[") else None


def user_frame():
    """The innermost stack frame outside the tempo_lab package (the user's code), or None."""
    return _call_site()[0]


def _is_user(frame) -> bool:
    return _file_kind(frame.f_code.co_filename) == "user" and not _generated_method(frame)


_LIBRARY_DIRS = tuple({sysconfig.get_paths()[k] + os.sep
                       for k in ("stdlib", "platstdlib", "purelib", "platlib")})
STACK_DEPTH = 16    # user frames kept per op (the innermost ones)


@functools.lru_cache(maxsize=4096)
def _file_kind(filename: str) -> str:
    """"package" (tempo_lab), "library" (standard library, installed packages, importlib and
    other generated code) or "user"."""
    fname = os.path.abspath(filename)
    if fname.startswith(_PACKAGE_DIR + os.sep):
        return "package"
    if fname.startswith(_LIBRARY_DIRS) or filename.startswith("<frozen") or "importlib" in fname:
        return "library"
    return "user"


def user_location() -> Location:
    """The user's line, with the user frames that called it and the library function it
    called (see ``Location``)."""
    frame, entry = _call_site()
    if frame is None:
        return UNKNOWN
    stack, f = [], frame
    while f is not None and len(stack) < STACK_DEPTH:
        kind = _file_kind(f.f_code.co_filename)
        if kind == "library":  # what ran the user's code (IPython, pytest, a worker) ends it
            break
        if kind == "user":
            stack.append((f.f_code.co_filename, f.f_lineno, f.f_code.co_qualname))
        f = f.f_back
    return Location(frame.f_code.co_filename, frame.f_lineno, tuple(reversed(stack)),
                    _library_call(entry))


def _call_site():
    """(the innermost user frame, the outermost tempo_lab frame it called) of the call being
    made; either may be None."""
    frame, entry = sys._getframe(1), None
    while frame is not None and not _is_user(frame):
        if _file_kind(frame.f_code.co_filename) == "package":
            entry = frame
        frame = frame.f_back
    return frame, entry


def _library_call(entry) -> str:
    """``tempo_lab.<module>.<function>`` of the package frame the user called, or "" when it is
    one of the modules whose functions make one op each (``tl.exp``, ``x + y``)."""
    if entry is None:
        return ""
    fname = os.path.abspath(entry.f_code.co_filename)
    if fname.startswith(_DIRECT) or fname == os.path.join(_PACKAGE_DIR, "errors.py"):
        return ""
    module = os.path.relpath(fname, os.path.dirname(_PACKAGE_DIR))[:-3].replace(os.sep, ".")
    return f"{module.removesuffix('.__init__')}.{entry.f_code.co_qualname}"


_STORES = {"STORE_NAME", "STORE_FAST", "STORE_GLOBAL", "STORE_DEREF"}


# Modules whose functions a user calls to make one op (tl.exp, x * y, tl.placeholder): the
# value made there is what the user's line assigns. Library code (tl.nn, tl.grad, ...) makes
# many ops per call, and the user's variable names only the last of them.
_DIRECT = tuple(os.path.join(_PACKAGE_DIR, *p) for p in (("frontend", "api.py"),
                                                        ("frontend", "tensor.py"), ("random.py",)))


def assigned_name() -> str | None:
    """The variable the user's current line assigns the value being made to (``x`` in
    ``x = a * b``), when the call being evaluated is the last thing before the store and the
    user called the op directly; None for a value used inside a larger expression, a tuple
    target, an attribute, or an op made inside a library function."""
    frame = sys._getframe(1)
    while frame is not None:
        fname = os.path.abspath(frame.f_code.co_filename)
        if not fname.startswith(_PACKAGE_DIR + os.sep):
            break
        if fname != os.path.join(_PACKAGE_DIR, "errors.py") and not fname.startswith(_DIRECT):
            return None
        frame = frame.f_back
    return None if frame is None else _stored_after_call(frame)


def library_target():
    """``(variable, call frame)`` when the op being made comes from a library function (say
    ``tl.nn.attention``) whose result the user's line assigns to ``variable``; None otherwise.
    The call frame tells one call from the next: the last op made in a call is its result and
    takes the name (``Context`` keeps the frame alive while it compares, so ids do not repeat)."""
    frame, entry = _call_site()
    if frame is None or entry is None or not _library_call(entry):
        return None
    target = _stored_after_call(frame)
    return None if target is None else (target, entry)


def _stored_after_call(frame) -> str | None:
    """The variable the instruction after ``frame``'s current call stores to, if any."""
    if frame.f_code.co_name == "<listcomp>":
        return None
    ins = _instructions(frame.f_code)
    k = max((j for j, x in enumerate(ins) if x.offset <= frame.f_lasti), default=None)
    if k is None or k + 1 >= len(ins):  # f_lasti may point into the call's inline caches
        return None
    nxt = ins[k + 1]
    return str(nxt.argval) if nxt.opname in _STORES else None


@functools.lru_cache(maxsize=512)
def _instructions(code) -> list:
    return list(dis.get_instructions(code))


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

    def __str__(self) -> str:  # the text as given, also where a base (KeyError) would quote it
        return self.args[0]


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


class ArgumentError(TempoLabError):
    """An argument of the wrong type or value: a config switch, a seed, bounds, a name."""


class OutputError(ArgumentError, KeyError):
    """``run[name]`` for a name that is not an output (also a ``KeyError``)."""


class CallbackError(TempoLabError):
    """A function given to ``tl.sink`` or ``tl.source`` raised; the user's exception is the
    ``__cause__`` and the location is the ``tl.sink``/``tl.source`` line."""


class ShardingError(TempoLabError):
    """A ``CompileConfig(mesh=..., shard=...)`` that cannot lay the program out: a dim that is
    still a loop (it carries a recurrence), a mesh axis that does not divide the bound."""


class CheckpointError(TempoLabError):
    """A checkpoint (``tl.nn.Llama.from_pretrained``, ``tl.nn.load_llama``) that cannot be read
    or does not fit the model: the message names the file and the field or tensor."""


class OutOfMemoryError(TempoLabError, MemoryError):
    """A run whose stores do not fit in the memory there is: refused before it allocates when
    the memory plan's peak is above what is free, or what the runtime reported when it ran out
    (XLA's ``RESOURCE_EXHAUSTED``, NumPy's ``MemoryError``). The message names the program's
    largest stores and the bounds that make them large; ``except MemoryError`` catches it too.
    The process and its other programs stay usable."""


class InternalError(TempoLabError):
    """A bug in tempo_lab itself, reported at the user's line with the original exception as
    its ``__cause__``: please report it with the program."""


class MissingExtraError(TempoLabError, ImportError):
    """A feature whose packages, an extra of tempo_lab's (``pip install "tempo_lab[viz]"``),
    are not installed; ``except ImportError`` catches it too."""


def user_api(fn):
    """Run a public entry point so that nothing but a ``TempoLabError`` leaves it: any other
    exception from inside the package becomes an ``InternalError`` at the user's line."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TempoLabError:
            raise
        except Exception as e:
            misfit = _misfit(fn, args, kwargs, e, fn.__qualname__)
            if misfit is not None:
                raise misfit from None
            raise InternalError(f"internal error in tempo_lab ({type(e).__name__}: {e}); please "
                                "report it with the program") from e
    return wrapper


def checked_signature(fn, where: str = "tl"):
    """``fn`` as the package exports it (as ``where.name``): a call that does not fit its
    signature (an argument missing, unknown or given twice) is an ``ArgumentError`` at the
    user's line, not Python's bare ``TypeError``. Anything else ``fn`` raises comes through."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            misfit = _misfit(fn, args, kwargs, e, f"{where}.{fn.__name__}")
            if misfit is None:
                raise
            raise misfit from None
    return wrapper


def _misfit(fn, args: tuple, kwargs: dict, e: Exception, name: str) -> ArgumentError | None:
    """The ``ArgumentError`` for ``e`` if it is the ``TypeError`` of a call that does not fit
    ``fn``'s signature (it is then the user's, and the error shows the signature); else None."""
    if not isinstance(e, TypeError):
        return None
    sig = inspect.signature(fn)
    try:
        sig.bind(*args, **kwargs)
    except TypeError:
        return ArgumentError(f"{e}: the signature is {fn.__name__}{sig}; see help({name})")
    return None


def run_callback(fn, args: tuple, what: str, loc: Location, point: dict):
    """Call a user's ``tl.sink``/``tl.source`` function; what it raises becomes a
    ``CallbackError`` at the line that registered it (the original is the ``__cause__``)."""
    try:
        return fn(*args)
    except Exception as e:
        name = getattr(fn, "__name__", type(fn).__name__)
        raise CallbackError(f"the function {name} given to {what} raised {type(e).__name__} at "
                            f"{point}: {e}", loc) from e
