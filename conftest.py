"""Repository-wide pytest setup: notebook kernels started by nbval inherit a fixed hash seed, so
set iteration order (and anything printed from it) is the same on every run."""
import os

os.environ.setdefault("PYTHONHASHSEED", "0")
