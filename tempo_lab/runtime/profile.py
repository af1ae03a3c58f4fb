"""What a run measured (``run.profile``), and the stream of kernel events it can record."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.sdg import SDG
from ..stage import Stage

SCHEMA = "tempo_lab.profile/1"


@dataclass(frozen=True)
class KernelEvent:
    """One statement instance: its op and point, when it started and ended (seconds from the
    start of the run: host dispatch times, or device times when the run waits for every
    kernel), and the bytes held by stores after it."""

    op: int
    point: tuple[int, ...]
    start: float
    end: float
    bytes: int


@dataclass(repr=False)
class Profile(Stage):
    """What one run measured: kernel calls and seconds per op, and the bytes held by tensor
    stores after every executed statement (``timeline``; its maximum is ``peak_bytes``).
    Seconds are host-side dispatch times unless ``synced`` (CompileConfig(sync_profile=True)).
    ``events``: every statement instance, when the run was asked to record them."""

    sdg: SDG
    calls: dict[int, int] = field(default_factory=dict)
    seconds: dict[int, float] = field(default_factory=dict)
    timeline: list[int] = field(default_factory=list)
    wall_s: float = 0.0
    synced: bool = False
    measured: str = ("store bytes: the store buffers after every statement; calls: statement "
                     "instances dispatched")
    executor: str = ""
    events: list[KernelEvent] = field(default_factory=list)
    offloaded_bytes: int = 0  # the most store bytes copied to the host at once (offload)
    xla_memory: dict[str, int] = field(default_factory=dict)  # XLA's memory_analysis, if asked
    # ops XLA fused into a kernel whose time is counted under another op: op -> (kernel, op)
    fused: dict[int, tuple[str, int]] = field(default_factory=dict)
    # per profiled run, its seconds per op (``seconds`` is their median), when several
    sessions: list[dict[int, float]] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max(self.timeline, default=0)

    def by_kind(self) -> dict[str, tuple[int, float]]:
        """(calls, seconds) summed per op kind."""
        out: dict[str, tuple[int, float]] = {}
        for i, n in self.calls.items():
            c, sec = out.get(self.sdg.ops[i].kind, (0, 0.0))
            out[self.sdg.ops[i].kind] = (c + n, sec + self.seconds.get(i, 0.0))
        return out

    def __repr__(self) -> str:
        return (f"Profile(kernel_calls={sum(self.calls.values())}, ops={len(self.calls)}, "
                f"peak_bytes={self.peak_bytes})")

    def _sections(self):
        calls = [f"{self.sdg.ops[i].label} ({self.sdg.ops[i].kind}): {n} calls"
                 for i, n in sorted(self.calls.items())]
        return [("kernel calls", calls),
                ("store bytes", [f"peak {self.peak_bytes} over {len(self.timeline)} steps"]
                 + ([f"offloaded: up to {self.offloaded_bytes} bytes on the host at once"]
                    if self.offloaded_bytes else [])
                 + [f"XLA {k}: {v} B" for k, v in self.xla_memory.items()]),
                ("what is measured", [self.measured])]

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "executor": self.executor,
                "calls": {str(k): v for k, v in self.calls.items()},
                "seconds": {str(k): v for k, v in self.seconds.items()},
                "peak_bytes": self.peak_bytes, "timeline": list(self.timeline),
                "offloaded_bytes": self.offloaded_bytes, "xla_memory": dict(self.xla_memory),
                "fused": {str(k): list(v) for k, v in self.fused.items()},
                "sessions": [{str(k): v for k, v in s.items()} for s in self.sessions],
                "wall_s": self.wall_s, "synced": self.synced, "measured": self.measured,
                "events": [[e.op, list(e.point), e.start, e.end, e.bytes]
                           for e in self.events]}
