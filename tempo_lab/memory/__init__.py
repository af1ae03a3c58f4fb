"""Memory planning: storage per tensor (point / ring / block), lifetimes and frees, predicted
bytes, the schedule chosen by its plan, offload to the host under a budget."""
from .liveness import with_frees
from .offload import meet_budget
from .plan import MemoryPlan, Storage, pad, plan_memory
from .search import best_schedule

__all__ = ["MemoryPlan", "Storage", "best_schedule", "meet_budget", "pad", "plan_memory",
           "with_frees"]
