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
"""
from __future__ import annotations

import importlib.util
import os

import jax

from ..config import config
from ..errors import ArgumentError

_done = False
MIN_COMPILE_SECONDS = 0.2
MAX_BYTES = 2 * 2**30


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
