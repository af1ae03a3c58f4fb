"""Process-wide settings (``tl.config``)."""
import os
from dataclasses import dataclass, field


def _default_compilation_cache() -> str:
    """``TEMPO_LAB_COMPILATION_CACHE`` when set ("" turns the cache off), else
    ``tempo_lab/xla`` in the user's cache directory (``XDG_CACHE_HOME``, else ``~/.cache``)."""
    if "TEMPO_LAB_COMPILATION_CACHE" in os.environ:
        return os.environ["TEMPO_LAB_COMPILATION_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tempo_lab", "xla")


@dataclass
class Config:
    progress: bool = True  # show tqdm progress bars for long work
    # JAX's persistent compilation cache for the XLA programs tempo_lab compiles, so that a new
    # process running the same program shape starts without compiling it again (see
    # runtime/compile_cache.py); "" or None: off. Read when the first XLA program compiles.
    compilation_cache: str | None = field(default_factory=_default_compilation_cache)


config = Config()
