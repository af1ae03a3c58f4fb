"""The function of a lifted op's cotangent (``tl.grad`` through ``tl.lift``): ``jax.vjp`` of the
lifted function, itself lifted as an op; the contraction pass sums it over stacked points."""
from __future__ import annotations


class Cotangent:
    """``(*primals, g) -> `` the cotangent of argument ``j`` of ``fn`` (its output ``out``):
    ``jax.vjp``, lifted as an op of its own.

    ``axes`` (from ``summed``) stacks points: ``fn`` is vmapped with those ``in_axes`` (the
    last entry is ``g``'s) and the result summed over the points. Argument ``j`` is the same at
    every point (a parameter), so this is one ``jax.vjp`` of the batched function, which
    contracts the points in matmuls instead of making one parameter-sized value per point
    (passes/contract.py)."""

    def __init__(self, fn, out, j: int, axes: tuple | None = None):
        self.fn, self.out, self.j, self.axes = fn, out, j, axes
        name = getattr(fn, "__name__", type(fn).__name__)
        self.__name__ = f"{'sum_' if axes else ''}vjp{j}_{name}"

    def summed(self, axes) -> Cotangent | None:
        """This cotangent summed over stacked points (``axes``: per argument, its stacked
        axis or None), or None where it is summed already or argument ``j`` varies."""
        axes = tuple(axes)
        if self.axes is not None or axes[self.j] is not None or axes[-1] is None:
            return None
        return Cotangent(self.fn, self.out, self.j, axes)

    def __call__(self, *args):
        import jax

        *primals, g = args

        def f(*p):
            return self.fn(*p) if self.out is None else self.fn(*p)[self.out]
        if self.axes is not None:
            f = jax.vmap(f, in_axes=self.axes[:-1])
            g = jax.numpy.moveaxis(g, self.axes[-1], 0)
        _, pullback = jax.vjp(f, *primals)
        return pullback(g)[self.j]
