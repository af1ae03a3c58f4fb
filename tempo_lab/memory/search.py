"""Choosing the schedule by its memory plan: the fusion scheduler's loop nest unless it declines
(then isl's scheduler, under each option set in turn), or its plan makes a window reader's ring
grow in a program small enough for isl to be quick (then the plan with the lowest predicted
peak). It sits with the memory planner because the plans decide between the schedules."""
from __future__ import annotations

import time

from ..errors import ScheduleError
from ..ir.sdg import SDG
from ..schedule import FALLBACK_OPTION_SETS, OPTION_SETS, IncompleteSchedule, Schedule, schedule_sdg
from .liveness import with_frees
from .plan import MemoryPlan, plan_memory

ISL_RETRY_OPS = 150  # a program this small also tries isl's scheduler when fusion grows a ring


def best_schedule(sdg: SDG, bounds: dict[str, int], block: int = 64,
                  budget: int | None = None) -> tuple[Schedule, MemoryPlan, float]:
    """(the schedule, with its frees; its memory plan; the seconds spent planning memory):
    the fusion scheduler's schedule, unless it declines (then isl's, under each option set in
    turn) or its memory plan makes a window reader's ring grow in a program small enough for
    isl to be quick (then the plan with the lowest predicted peak, the first on ties).
    ``block`` and ``budget`` go to ``plan_memory``."""
    best = None
    seconds = 0.0
    for options in OPTION_SETS + FALLBACK_OPTION_SETS:
        if best is not None and (options in FALLBACK_OPTION_SETS or not best[1].grown
                                 or len(sdg.ops) > ISL_RETRY_OPS):
            break
        try:
            schedule = with_frees(sdg, schedule_sdg(sdg, options))
        except IncompleteSchedule:
            continue
        t1 = time.perf_counter()
        memory = plan_memory(sdg, schedule, bounds, block, budget)
        seconds += time.perf_counter() - t1
        if best is None or memory.peak_bytes < best[1].peak_bytes:
            best = (schedule, memory)
    if best is None:
        raise ScheduleError("no scheduler found a complete schedule for this program (the "
                            "fusion scheduler and isl's under every option set tried); please "
                            "report it with the program", sdg.ops[sdg.roots[0]].loc)
    return (*best, seconds)
