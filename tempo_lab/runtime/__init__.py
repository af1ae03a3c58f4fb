"""Execution: the reference interpreter (ground truth)."""
from .reference import Reference, run_reference

__all__ = ["Reference", "run_reference"]
