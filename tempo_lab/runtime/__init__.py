"""Execution: the reference interpreter (ground truth), the ``Lowered`` stage, the host side
every executor shares, and the back ends (interpreter, generated code, XLA loops)."""
from .executable import Backend, Executable
from .lowered import Lowered
from .profile import KernelEvent, Profile
from .reference import Reference, run_reference

__all__ = ["Backend", "Executable", "KernelEvent", "Lowered", "Profile", "Reference",
           "run_reference"]
