"""JAX's persistent compilation cache for the XLA programs tempo_lab compiles.

A decode of a real model compiled again in every new process (0.45 s of XLA compile for two
layers at Llama-3.2-1B widths here, seconds for larger programs); JAX can keep compiled executables on disk, keyed by the program, its argument shapes,
the compile options and the jax/jaxlib versions, so a second process with the same program
shape loads it instead. tempo_lab turns that cache on at its first XLA compile, in
``tl.config.compilation_cache`` (a directory in the user's cache by default), unless the user
has set JAX's own ``jax_compilation_cache_dir``, which then wins. With its own directory it
also writes programs that compiled in ``MIN_COMPILE_SECONDS`` or more (JAX's default, 1 s,
leaves out a decode that compiles in 0.6 s, which a notebook restart compiles again), unless
the user has changed that JAX setting, and keeps it to ``MAX_BYTES`` (JAX evicts the least
recently used; an entry is 0.1-1 MB). The limit also makes JAX lock the directory around each
read and write, so two processes compiling the same program never read a half-written
entry; it needs the ``filelock`` package (``huggingface_hub``'s dependency, so there with the
``tokenizers`` package), without which the directory is left unbounded and unlocked, as JAX
leaves it by default. A directory that JAX once wrote without a limit fails every write with
a warning once one is set (its entries lack the access times): give tempo_lab a directory of
its own.

The setting is JAX's, so it is process-wide: the user's own ``jax.jit`` programs share the
cache once tempo_lab has compiled. ``tl.config.compilation_cache = ""`` before the first compile
keeps tempo_lab from turning it on.

JAX's cache saves the XLA compile but not what comes before it: tracing tempo_lab's program
into a jaxpr and lowering it to HLO, 0.7 s of a second process's 1.5 s to a small decode's first
token. So in the same directory (``executables/``) tempo_lab also keeps each compiled program
itself, serialized (``jax.experimental.serialize_executable``), keyed by what the program is
made from (its SDG, schedule and store layout: the key of ``xla._PROGRAMS``, with the argument
shapes, the jax/jaxlib versions and the device): a second process loads it without tracing.
Only programs whose key names nothing by its address (a lifted function, a callback: their repr
holds ``at 0x...``, which another process could reuse for another function) are kept; the
directory is kept to ``MAX_BYTES`` too, the least recently written left out first.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import pathlib
import pickle
import tempfile

import jax

from ..config import config
from ..errors import ArgumentError

_done = False
MIN_COMPILE_SECONDS = 0.2
MAX_BYTES = 2 * 2**30
# packages whose functions a kept program is keyed by name (their versions are in the key);
# any other function by its code, closure and globals
LIBRARIES = frozenset({"jax", "jaxlib", "numpy", "ml_dtypes", "tempo_lab", "functools",
                       "operator", "math"})


def use_persistent_cache() -> None:
    """Point JAX's persistent cache at ``tl.config.compilation_cache``, once per process, if
    the user has not chosen a directory for it."""
    global _done
    if _done:
        return
    where = config.compilation_cache
    if where and jax.config.jax_compilation_cache_dir is None:
        if not isinstance(where, (str, os.PathLike)):
            raise ArgumentError(f"tl.config.compilation_cache must be a directory (str) or None, "
                                f"got {type(where).__name__} {where!r}"[:200])
        jax.config.update("jax_compilation_cache_dir", os.fspath(where))
        if jax.config.jax_persistent_cache_min_compile_time_secs == 1.0:   # JAX's default
            jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECONDS)
        if jax.config.jax_compilation_cache_max_size == -1 and importlib.util.find_spec(
                "filelock") is not None:                                   # unbounded
            jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    _done = True


def load_or_compile(key, compile_fn, functions=(), keep: bool = True):
    """The compiled program for ``key`` (a tuple whose repr says what the program is made
    from; ``functions``: the Python functions it calls, whose reprs in it name them by address
    and are replaced by a digest of their code): loaded from the directory of serialized
    executables where tempo_lab's cache is on and holds it, else ``compile_fn()`` (then
    written there). ``keep``: False for a program that calls back into this process (a
    ``tl.sink`` or ``tl.source``), whose executable names its callbacks."""
    use_persistent_cache()
    where = _executables() if keep else None
    if where is None:
        return compile_fn()
    import importlib.metadata

    import numpy

    try:
        ours = importlib.metadata.version("tempo_lab"), _source_digest()
    except importlib.metadata.PackageNotFoundError:  # run from a source tree: not kept
        return compile_fn()
    text = repr((key, jax.__version__, jax.lib.__version__, numpy.__version__, ours,
                 jax.devices()[0].device_kind))
    try:
        for fn in functions:
            text = text.replace(repr(fn), _code_digest(fn))
    except Exception:  # what a function is made of, unreadable: not kept
        return compile_fn()
    if " at 0x" in text:
        return compile_fn()
    path = os.path.join(where, hashlib.sha256(text.encode()).hexdigest() + ".executable")
    try:
        with open(path, "rb") as f:
            payload, in_tree, out_tree = pickle.load(f)
        from jax.experimental.serialize_executable import deserialize_and_load

        return deserialize_and_load(payload, in_tree, out_tree)
    except FileNotFoundError:
        pass
    except Exception:  # written by another version, or half-written: compiled again
        _remove(path)
    hits = _jax_cache_hits()
    compiled = compile_fn()
    if _jax_cache_hits() != hits:  # an executable JAX loaded from its own cache, serialized
        return compiled  # again, lacked kernels on XLA:CPU (jax 0.10: "Function
    try:  # slice_bitcast_fusion not found" at its first run in the next process): not kept
        from jax.experimental.serialize_executable import serialize

        data = pickle.dumps(serialize(compiled))
        os.makedirs(where, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, delete=False) as f:
            f.write(data)
        os.replace(f.name, path)  # whole or not at all, for a process reading it meanwhile
        _trim(where)
    except Exception:  # a program JAX cannot serialize, or a directory that is not writable
        pass
    return compiled


_HITS = [0]  # JAX persistent-cache hits in this process, counted from the first compile kept


def _count_hit(event: str, **_) -> None:
    if event.endswith("/compilation_cache/cache_hits"):
        _HITS[0] += 1


@functools.lru_cache(maxsize=1)
def _listening() -> bool:
    jax.monitoring.register_event_listener(_count_hit)
    return True


def _jax_cache_hits() -> int:
    """How many programs JAX has loaded from its persistent cache so far (a public event)."""
    _listening()
    return _HITS[0]


@functools.lru_cache(maxsize=1)
def _source_digest() -> str:
    """A digest of tempo_lab's own source files: an installed copy edited in place (a
    developer's) keeps its version number, and an executable traced by other code than this
    must not be loaded (about 10 ms, once a process)."""
    root = pathlib.Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _code_digest(fn, depth: int = 3) -> str:
    """What a function computes, as far as its code says: the code objects (nested ones too)
    of it and of what it wraps or partially applies, its bound arguments, closure values and
    the globals it names (functions among them digested the same way, ``depth`` calls deep).
    Where any of those is only known by its address, its repr keeps the address, and the
    program is not kept."""
    import functools
    import inspect
    import types

    parts = []
    while isinstance(fn, functools.partial):
        parts += [_value_text(x) for x in (*fn.args, *sorted(fn.keywords.items()))]
        fn = fn.func
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    module, name = getattr(fn, "__module__", None) or "", getattr(fn, "__qualname__", None)
    if name and module.split(".")[0] in LIBRARIES:  # changes with their versions (the key's)
        return "<" + "; ".join([*parts, f"{module}.{name}"]) + ">"
    if code is None:  # an object called: known by its address
        return repr(fn)

    def code_text(c) -> str:
        consts = [code_text(x) if inspect.iscode(x) else repr(x) for x in c.co_consts]
        return repr((c.co_name, c.co_code, c.co_names, consts))

    values = [c.cell_contents for c in (fn.__closure__ or ())] + list(fn.__defaults__ or ())
    parts += [fn.__module__, fn.__qualname__, code_text(code), *map(_value_text, values)]

    def names(c) -> set:
        return set(c.co_names).union(*(names(x) for x in c.co_consts if inspect.iscode(x)))

    for name in sorted(names(code) & set(getattr(fn, "__globals__", {}))):
        v = fn.__globals__[name]
        if isinstance(v, types.ModuleType):
            parts.append(f"{name}=module {v.__name__}")
        elif callable(v) and not isinstance(v, type):
            parts.append(f"{name}=" + (_code_digest(v, depth - 1) if depth else repr(v)))
        else:
            parts.append(f"{name}={_value_text(v)}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()
    addressed = any(" at 0x" in p for p in parts)
    return repr(fn) if addressed else f"<code {digest}>"


def _value_text(v) -> str:
    """A value a function closes over, binds or defaults to, as text: an array by its bytes
    (its repr elides the middle of a large one)."""
    import numpy as np

    if isinstance(v, tuple):
        return "(" + ", ".join(map(_value_text, v)) + ")"
    if isinstance(v, (np.ndarray, jax.Array)):
        a = np.asarray(v)
        return f"array({a.dtype}, {a.shape}, {hashlib.sha256(a.tobytes()).hexdigest()})"
    return repr(v)


def _executables() -> str | None:
    """The directory of serialized executables: in tempo_lab's cache directory, where JAX's
    persistent cache is that directory (a user's own JAX setting wins, and tempo_lab then
    writes nothing of its own)."""
    where = config.compilation_cache
    if not where or jax.config.jax_compilation_cache_dir != os.fspath(where):
        return None
    return os.path.join(os.fspath(where), "executables")


def _trim(where: str) -> None:
    files = [os.path.join(where, n) for n in os.listdir(where) if n.endswith(".executable")]
    stats = sorted((os.stat(f).st_mtime, os.stat(f).st_size, f) for f in files)
    total = sum(size for _, size, _ in stats)
    for _, size, f in stats:
        if total <= MAX_BYTES:
            return
        _remove(f)
        total -= size


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass
