"""The Trace stage: every recorded API call, in order, with the user's ``file:line``."""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import Location
from ..stage import Stage

SCHEMA = "tempo_lab.trace/1"


@dataclass(frozen=True)
class TraceEntry:
    seq: int
    api: str     # e.g. "placeholder", "add", "read", "define", "sink"
    text: str    # the call as readable RT code: "%4 = %2[b, t - 1]"
    node: int | None
    loc: Location


class Trace(Stage):
    """An immutable snapshot of the calls recorded by a context."""

    def __init__(self, dims, entries):
        self.dims = tuple(dims)
        self.entries: tuple[TraceEntry, ...] = tuple(entries)

    def __repr__(self) -> str:
        return f"Trace(calls={len(self.entries)}, dims=({', '.join(map(str, self.dims))}))"

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):
        return iter(self.entries)

    def _sections(self):
        return [("calls", [f"{e.seq:>3}  {e.text}  @ {e.loc}" for e in self.entries])]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "dims": [d.name for d in self.dims],
                "calls": [{"seq": e.seq, "api": e.api, "text": e.text, "node": e.node,
                           "file": e.loc.file, "line": e.loc.line} for e in self.entries]}
