"""Memory planning: storage per tensor (point / ring / block), lifetimes, predicted bytes."""
from .plan import MemoryPlan, Storage, pad, plan_memory

__all__ = ["MemoryPlan", "Storage", "pad", "plan_memory"]
