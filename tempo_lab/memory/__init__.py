"""Memory planning: storage per tensor (point / ring / block), lifetimes and frees, predicted
bytes, offload to the host."""
from .liveness import with_frees
from .plan import MemoryPlan, Storage, pad, plan_memory

__all__ = ["MemoryPlan", "Storage", "pad", "plan_memory", "with_frees"]
