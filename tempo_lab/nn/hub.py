"""Where a checkpoint is: a directory or file given by its path, or a Hugging Face Hub id
(``"meta-llama/Llama-3.2-1B"``) already in the local Hugging Face cache.

Nothing is downloaded: a run never reaches the network (a notebook on a cluster node often
cannot, and a download of gigabytes should be the user's decision). A Hub id resolves through
``huggingface_hub``'s cache (``snapshot_download(..., local_files_only=True)``, which works
offline), when that package is installed; otherwise the error says how to download it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import ArgumentError, CheckpointError

# owner/name as the Hub spells a repository id
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def resolve(path, me: str) -> Path:
    """``path`` as a local path: itself when it exists, else the cached snapshot of the Hub
    repository it names; a ``CheckpointError`` that says how to get it otherwise."""
    if not isinstance(path, (str, os.PathLike)) or isinstance(path, bytes):
        raise ArgumentError(f"{me}: give a checkpoint directory's path or a Hugging Face Hub id "
                            f"(str), got {type(path).__name__} {path!r}"[:200])
    text = os.fspath(path)
    if "\x00" in text:
        raise ArgumentError(f"{me}: the path {text!r} holds a NUL byte")
    local = Path(text).expanduser()
    try:
        if local.exists():
            return local
    except OSError as e:   # a name too long, a folder it may not read
        raise CheckpointError(f"{local}: cannot be read ({e.strerror})") from None
    if not isinstance(path, str) or not _REPO_ID.fullmatch(text):
        raise CheckpointError(f"{local}: no such checkpoint directory (nor a Hugging Face Hub "
                              "id of the form owner/name)")
    cached = cached_snapshot(text)
    if cached is not None:
        return cached
    raise CheckpointError(
        f"{text!r} is not a directory here and is not in the local Hugging Face cache "
        f"({cache_dir() or 'huggingface_hub is not installed'}); tempo_lab downloads nothing: "
        f"download it once with `hf download {text}` (pip install huggingface_hub), or "
        "give the path of a checkpoint directory")


def cache_dir() -> str | None:
    """The Hugging Face cache as ``huggingface_hub`` finds it, read at each call so that
    ``HF_HUB_CACHE`` or ``HF_HOME`` set after import count; None without the package."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return constants.HF_HUB_CACHE


def cached_snapshot(repo_id: str) -> Path | None:
    """The newest cached snapshot of ``repo_id`` (its ``main`` revision), or None."""
    where = cache_dir()
    if where is None:
        return None
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, cache_dir=where, local_files_only=True))
    except Exception:  # not in the cache, whatever the library calls that
        return None
