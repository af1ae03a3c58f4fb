"""``Run``: the outputs of one execution, as NumPy arrays by output name or tensor, with each
ragged bound's lengths (``run.lengths``), masks and per-instance views; every executor's
``Executable.run`` and the reference interpreter return one."""
from __future__ import annotations

import numpy as np

from ..errors import BoundsError, OutputError
from ..frontend.tensor import RecurrentTensor
from ..passes.ragged import lengths_output
from ..stage import Stage
from ..symbolic import Bound, Dim


def ragged_mask(dims: list[str], shape: tuple, lengths) -> np.ndarray:
    """Over domain axes ``dims`` of sizes ``shape``: false at points past an instance's own
    length under a ragged bound (``lengths``: ragged dim -> (outer dim, lengths))."""
    mask = np.ones(shape, bool)
    for dim, (over, n) in lengths.items():
        if dim not in dims or over not in dims:
            continue
        t, b = dims.index(dim), dims.index(over)
        pos = np.arange(shape[t]).reshape([-1 if k == t else 1 for k in range(len(dims))])
        mask &= pos < n.reshape([-1 if k == b else 1 for k in range(len(dims))])
    return mask


class ByBound(dict):
    """A dict keyed by bound name that a ``Bound`` or its ``Dim`` also indexes
    (``run.lengths[T]``, ``run.lengths["T"]``, ``run.lengths[t]``)."""

    @staticmethod
    def _name(key):
        return key.bound.name if isinstance(key, Dim) else (
            key.name if isinstance(key, Bound) else key)

    def __getitem__(self, key):
        name = self._name(key)
        if not dict.__contains__(self, name):
            have = ", ".join(self) or "none"
            raise BoundsError(f"{key!r} is not a ragged or data-dependent bound of this run "
                              f"(those with lengths: {have})")
        return dict.__getitem__(self, name)

    def __contains__(self, key) -> bool:
        return dict.__contains__(self, self._name(key))

    def get(self, key, default=None):
        return dict.get(self, self._name(key), default)


class Run(Stage):
    """Outputs of one execution: ``run["y"]`` or ``run[y]`` is a NumPy array over the output's
    whole domain (domain axes in universe order, then the spatial axes)."""

    def __init__(self, program, values: dict[str, np.ndarray], seconds: float,
                 profile=None, bounds=None, lengths=None):
        """``profile``: a ``Profile``, a function that makes one (when first read), or None
        (the reference interpreter measures nothing)."""
        self.program, self._values, self.seconds = program, values, seconds
        self._profile = profile
        self.bounds: dict[str, int] = dict(bounds or program.bounds)
        # each ragged bound's outer dim and lengths (a per-instance tl.until's, as reached)
        self.lengths: dict[str, tuple[str, np.ndarray]] = ByBound(lengths or {})

    @property
    def profile(self):
        """What the run measured (``Profile``), or None for the reference interpreter."""
        if callable(self._profile):
            self._profile = self._profile()
        return self._profile

    @property
    def executor(self) -> str:
        return self.profile.executor if self.profile is not None else self.program.executor

    def __getitem__(self, key) -> np.ndarray:
        if isinstance(key, RecurrentTensor) and self.program is None:
            raise OutputError("this run has no program to look tensors up in; index it by "
                              "output name")
        name = self.program.name_of(key) if isinstance(key, RecurrentTensor) else key
        if not isinstance(name, str) or name not in self._values:
            have = ", ".join(repr(k) for k in self._values) or "none"
            raise OutputError(f"{key!r} is not an output of this run (outputs: {have}); "
                              "index the run by an output name or tensor")
        return self._values[name]

    def mask(self, key) -> np.ndarray:
        """Which entries of ``run[key]``'s domain axes are real: false past each instance's own
        length under a ragged bound (``tl.lengths``), true everywhere else."""
        value, dims = self[key], self._dims(key)
        return ragged_mask(dims, value.shape[:len(dims)], self._ragged())

    def instances(self, key) -> list[np.ndarray]:
        """``run[key]`` as one array per instance of a ragged bound's outer dim (first axis
        dropped), each cut to that instance's own length."""
        value, dims = self[key], self._dims(key)
        for dim, (over, lengths) in self._ragged().items():
            if dim in dims and over in dims:
                b, t = dims.index(over), dims.index(dim)
                per = np.moveaxis(value, b, 0)
                t -= t > b
                return [np.take(per[k], np.arange(n), axis=t) for k, n in enumerate(lengths)]
        raise OutputError(f"{key!r} has no ragged dims (no tl.lengths bound over its domain); "
                          "read it as run[name]")

    def _ragged(self) -> dict[str, tuple[str, np.ndarray]]:
        """``lengths`` by the name of the ragged dim rather than of its bound."""
        return _by_dim(self.program, self.lengths)

    def _dims(self, key) -> list[str]:
        self[key]  # an OutputError for a key that is not an output
        name = self.program.name_of(key) if isinstance(key, RecurrentTensor) else key
        return [d.name for d in self.program._outputs[name].domain]

    def keys(self):
        return self._values.keys()

    def items(self):
        return self._values.items()

    def __repr__(self) -> str:
        outs = ", ".join(f"{k}: {v.dtype.name}{list(v.shape)}" for k, v in self._values.items())
        return f"Run(outputs=({outs}), executor={self.executor})"

    def _sections(self):
        return [("outputs", [f"{k}: {v.dtype.name}{list(v.shape)} min={v.min():.4g} "
                             f"max={v.max():.4g} mean={v.mean():.4g}" if v.size else
                             f"{k}: {v.dtype.name}{list(v.shape)} (empty)"
                             for k, v in self._values.items()])]

    def to_dict(self) -> dict:
        return {"schema": "tempo_lab.run/1", "executor": self.executor,
                "outputs": {k: {"shape": list(v.shape), "dtype": v.dtype.name}
                            for k, v in self._values.items()}}


def _by_dim(program, lengths) -> dict[str, tuple[str, np.ndarray]]:
    """``lengths`` (by bound name) by the name of the ragged dim of ``program``'s SDG."""
    return {next(d.name for d in program.sdg.dims if d.bound.name == bound): v
            for bound, v in lengths.items()}


def put_back_recipe(orders, ragged, dims, domains) -> tuple[list, list[str]]:
    """What ``put_back`` does to a program's runs, worked out once: per output (``domains``:
    name -> its domain's dims), each dim whose instances a pass reordered (``orders``: dim ->
    the order it put them in) with the order that puts them back, and the outputs over a
    ragged dim and the dim it is ragged over (``ragged``: bound name -> ``ir.sdg.Ragged``;
    ``dims``: the SDG's; the other outputs have no point past an instance's end, so masking
    them would cost a run the time of a small program)."""
    back = {dim: np.argsort(order) for dim, order in orders.items()}
    reorder, masked = [], []
    over = {d.name: r.over for name, r in ragged.items() for d in dims if d.bound.name == name}
    for k, domain in domains.items():
        names = [d.name for d in domain]
        reorder += [(k, names.index(dim), b) for dim, b in back.items() if dim in names]
        if any(d in names and o in names for d, o in over.items()):
            masked.append(k)
    return reorder, masked


def put_back(run: Run, reorder, masked, ragged) -> Run:
    """``run`` in the user's terms, as a new ``Run``: each output's instances that a pass
    reordered back in their order (``reorder``: (output, axis, the order that puts them back)),
    and under a ragged bound (``ragged``: bound name -> ``ir.sdg.Ragged``) the lengths each
    instance reached and the points past them zeroed in the outputs ``masked``."""
    values = dict(run._values)
    for k, axis, back in reorder:  # instances back in their order
        values[k] = np.take(values[k], back, axis=axis)
    lengths = {}
    if ragged:  # the box's points past each instance's end hold no values
        for name, r in ragged.items():
            found = values.pop(lengths_output(name), None)
            lengths[name] = (r.over, r.lengths if found is None else found.astype(np.int64))
        by_dim = _by_dim(run.program, lengths)
        for k in masked:
            v = values[k]
            dims = [d.name for d in run.program._outputs[k].domain]
            m = ragged_mask(dims, v.shape[:len(dims)], by_dim)
            values[k] = np.where(m.reshape(m.shape + (1,) * (v.ndim - m.ndim)), v,
                                 np.zeros((), v.dtype))
    return Run(run.program, values, run.seconds, run._profile, run.bounds, lengths)
