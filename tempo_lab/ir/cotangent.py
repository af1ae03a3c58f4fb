"""The function of a lifted op's cotangent (``tl.grad`` through ``tl.lift``): ``jax.vjp`` of the
lifted function, itself lifted as an op; the contraction pass sums it over stacked points."""
from __future__ import annotations


class Cotangent:
    """``(*primals, *gs) -> `` the cotangent of argument ``j`` of ``fn``: ``jax.vjp``, lifted as
    an op of its own. ``out`` says which of ``fn``'s outputs the trailing cotangents ``gs``
    belong to: None (``fn`` has one), an index (one of a tuple) or a tuple of indices (several
    outputs of one call, pulled back together in one ``vjp`` rather than one each).

    ``axes`` (from ``summed``) stacks points: ``fn`` is vmapped with those ``in_axes`` (the
    last entries are the ``gs``'). Argument ``j`` is the same at every point (a parameter), so
    this is one ``jax.vjp`` of the batched function, which contracts the points in matmuls
    instead of making one parameter-sized value per point (passes/contract.py)."""

    def __init__(self, fn, out, j: int, axes: tuple | None = None):
        self.fn, self.out, self.j, self.axes = fn, out, j, axes
        self.n_cts = len(out) if isinstance(out, tuple) else 1
        name = getattr(fn, "__name__", type(fn).__name__)
        self.__name__ = f"{'sum_' if axes else ''}vjp{j}_{name}"

    def summed(self, axes) -> Cotangent | None:
        """This cotangent summed over stacked points (``axes``: per argument, its stacked
        axis or None), or None where it is summed already, argument ``j`` varies or a
        cotangent does not."""
        axes = tuple(axes)
        if self.axes is not None or axes[self.j] is not None \
                or any(a is None for a in axes[-self.n_cts:]):
            return None
        return Cotangent(self.fn, self.out, self.j, axes)

    def _outputs(self, *p):
        y = self.fn(*p)
        if self.out is None:
            return y
        return tuple(y[k] for k in self.out) if isinstance(self.out, tuple) else y[self.out]

    def __call__(self, *args):
        import jax

        primals, gs = args[:-self.n_cts], args[-self.n_cts:]
        f = self._outputs
        if self.axes is not None:
            primals, gs = _common_points(primals, gs, self.axes)
            f = jax.vmap(f, in_axes=self.axes[:len(primals)])
            gs = tuple(jax.numpy.moveaxis(g, a, 0) for g, a in zip(gs, self.axes[len(primals):]))
        _, pullback = jax.vjp(f, *primals)
        return pullback(tuple(gs) if isinstance(self.out, tuple) else gs[0])[self.j]


def _common_points(primals, gs, axes):
    """The stacked arguments cut to their fewest points. A range read comes padded to its size
    class (its points past the range's end are padding), a value batched over the range has
    exactly its points: a cotangent batched by group vectorisation met primals read as a
    padded range (a vjp of 8 points given 1 cotangent)."""
    from jax import lax

    args = (*primals, *gs)
    sizes = [x.shape[a] for x, a in zip(args, axes) if a is not None]
    if len(set(sizes)) < 2:
        return primals, gs
    n = min(sizes)
    args = tuple(x if a is None or x.shape[a] == n else lax.slice_in_dim(x, 0, n, axis=a)
                 for x, a in zip(args, axes))
    return args[:len(primals)], args[len(primals):]

