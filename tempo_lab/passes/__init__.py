"""Transformations on the SDG, each recorded in a PassTrace."""
from . import basic, contract, fuse, prefix, ragged, remat, stream, tile, vectorise  # noqa: F401  (registers the passes)
from .manager import REGISTRY, Editor, PassRecord, PassTrace, check_invariants, register, run_passes

__all__ = ["REGISTRY", "Editor", "PassRecord", "PassTrace", "check_invariants", "register",
           "run_passes"]
