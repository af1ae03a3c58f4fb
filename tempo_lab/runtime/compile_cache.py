"""JAX's persistent compilation cache for the XLA programs tempo_lab compiles.

A decode of a real model compiles for seconds in every new process (3.7-5.2 s at Llama-3.2-1B
widths); JAX can keep compiled executables on disk, keyed by the program, its argument shapes,
the compile options and the jax/jaxlib versions, so a second process with the same program
shape loads it instead. tempo_lab turns that cache on at its first XLA compile, in
``tl.config.compilation_cache`` (a directory in the user's cache by default), unless the user
has set JAX's own ``jax_compilation_cache_dir``, which then wins. With its own directory it
also writes programs that compiled in ``MIN_COMPILE_SECONDS`` or more (JAX's default, 1 s,
leaves out a decode that compiles in 0.6 s, which a notebook restart compiles again), unless
the user has changed that JAX setting. The directory is not bounded (JAX's default; an entry
is 0.1-1 MB): a size limit makes JAX keep an access-time file beside each entry, and a
directory written without them then fails every write with a warning. Delete it to clear it.

The setting is JAX's, so it is process-wide: the user's own ``jax.jit`` programs share the
cache once tempo_lab has compiled. ``tl.config.compilation_cache = ""`` before the first compile
keeps tempo_lab from turning it on.
"""
from __future__ import annotations

import os

import jax

from ..config import config
from ..errors import ArgumentError

_done = False
MIN_COMPILE_SECONDS = 0.2


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
    _done = True
