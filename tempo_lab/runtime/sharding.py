"""Several devices: a vectorised dim laid out along an axis of a ``jax.sharding.Mesh``.

``CompileConfig(mesh=mesh, shard={"b": "data"})`` asks for the points of dim ``b`` to be split
over the devices of the mesh axis ``"data"``. Vectorisation has already turned ``b`` into a
leading axis of every value over it (``attrs["vdims"]``), so sharding is placement only: each
store over ``b`` and each array input over ``b`` gets a ``NamedSharding`` with the mesh axis on
``b``'s axis, and XLA's SPMD partitioner splits the kernels (or the one XLA program) that use
them and turns reductions over ``b`` into collectives. tempo_lab adds no runtime of its own.

A dim that is still a loop after the passes (it carries a recurrence, or a read crosses it) has
no axis to split: that is a ``ShardingError`` at compile time, not a silent replication.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..errors import ShardingError
from ..ir.sdg import SDG
from ..ir.vmap import vdims


def check_config(mesh, shard) -> dict[str, str]:
    """``shard`` as a dict from dim names to mesh axis names, checked against ``mesh``."""
    if mesh is None:
        if shard:
            raise ShardingError(f"shard={shard!r} needs a mesh: CompileConfig(mesh=jax.sharding."
                                "Mesh(jax.devices(), ('data',)), shard={'b': 'data'})")
        return {}
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ShardingError(f"mesh={mesh!r}: give a jax.sharding.Mesh, e.g. "
                            "jax.sharding.Mesh(jax.devices(), ('data',))")
    if not isinstance(shard, Mapping) or not shard:
        raise ShardingError(f"shard={shard!r}: give a dict from a dim name to a mesh axis, e.g. "
                            f"shard={{'b': {mesh.axis_names[0]!r}}}")
    out = {}
    for dim, axis in shard.items():
        if not isinstance(dim, str):
            dim = getattr(dim, "name", dim)
        if not isinstance(dim, str) or axis not in mesh.axis_names:
            raise ShardingError(f"shard={{{dim!r}: {axis!r}}}: map a dim name to one of the "
                                f"mesh's axes {tuple(mesh.axis_names)}")
        if axis in out.values():
            raise ShardingError(f"shard={dict(shard)!r}: the mesh axis {axis!r} is given to two "
                                "dims; give each dim its own axis")
        out[dim] = axis
    return out


class Layout:
    """Where each store and array input of a program lives on the mesh."""

    def __init__(self, sdg: SDG, mesh, shard: Mapping[str, str], bounds: Mapping[str, int],
                 loc=None):
        self.sdg, self.mesh, self.shard = sdg, mesh, dict(shard)
        dims = {d.name: d for d in sdg.dims}
        for name, axis in self.shard.items():
            d = dims.get(name)
            if d is None:
                raise ShardingError(f"shard: the program has no dim {name!r}; its dims are "
                                    f"{', '.join(dims)}", loc)
            looped = [op for op in sdg.ops.values() if d in op.domain]
            if looped:
                raise ShardingError(f"cannot shard {name!r}: {_why_looped(sdg, d, looped)}; "
                                    "shard a dim whose points are independent, such as a batch "
                                    "dim", loc)
            n, size = mesh.shape[axis], bounds[d.bound.name]
            if size % n:
                raise ShardingError(f"cannot shard {name!r} ({d.bound.name} = {size}) over "
                                    f"the {n} devices of mesh axis {axis!r}: give a bound that "
                                    f"{n} divides", loc)

    def _spec(self, op_id: int, lead: int, ndim: int) -> NamedSharding | None:
        moved = vdims(self.sdg.ops[op_id])
        spec = [None] * ndim
        for name, axis in self.shard.items():
            if name in moved:
                spec[lead + moved.index(name)] = axis
        if not any(spec):
            return None
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def store(self, op_id: int, ndim: int) -> NamedSharding | None:
        """A store's sharding: its slot axes first (one per remaining domain dim)."""
        return self._spec(op_id, len(self.sdg.ops[op_id].domain), ndim)

    def host(self, op_id: int, ndim: int) -> NamedSharding | None:
        """A ``from_array`` input's sharding: its remaining domain axes first."""
        op = self.sdg.ops[op_id]
        return self._spec(op_id, op.attrs.get("ndomain", 0), ndim) if op.kind == "from_array" \
            else None

    def place(self, value, sharding):
        return value if sharding is None else jax.device_put(value, sharding)

    def _local_spatial(self, i: int, s) -> tuple[int, ...] | None:
        """Store ``i``'s spatial shape on one device (None: not sharded)."""
        sh = self.store(i, len(s.slots) + len(s.spatial))
        return None if sh is None else sh.shard_shape((1,) * len(s.slots) + s.spatial)[
            len(s.slots):]

    def device_peak_bytes(self, ast, stores: Mapping, bounds: Mapping[str, int]) -> int:
        """The memory plan's peak of store bytes on one device: the plan simulated again with
        each sharded store cut to its share."""
        from ..memory.simulate import simulate

        cut = {i: s if (local := self._local_spatial(i, s)) is None else
               dataclasses.replace(s, spatial=tuple(local)) for i, s in stores.items()}
        return simulate(ast, cut, bounds)[4]

    def lines(self, stores: Mapping) -> list[str]:
        """The mesh, each sharded dim's axis, and the sharding of each store it splits."""
        out = self.describe()
        for i, s in stores.items():
            local = self._local_spatial(i, s)
            if local is not None:
                spec = self.store(i, len(s.slots) + len(s.spatial)).spec
                share = math.prod(s.spatial) // math.prod(local)
                out.append(f"{self.sdg.ops[i].label}: {spec}, 1/{share} per device")
        return out

    def key(self) -> tuple:
        return (self.mesh, tuple(sorted(self.shard.items())))

    def describe(self) -> list[str]:
        mesh = ", ".join(f"{a}={n}" for a, n in self.mesh.shape.items())
        return [f"mesh ({mesh}) over {self.mesh.size} {self.mesh.devices.flat[0].platform} "
                f"devices"] + [f"{d} -> mesh axis {a}" for d, a in self.shard.items()]


def _why_looped(sdg: SDG, d, looped) -> str:
    """Why ``d`` is still a loop: a read across its points where there is one."""
    for e in sdg.edges:
        p, c = sdg.ops[e.src], sdg.ops[e.dst]
        if d in p.domain and d in c.domain:
            x = e.index[p.domain.index(d)]
            if x != d:
                return (f"{c.label} (made at {c.loc}) reads {p.label} at {d} = {x}, so the "
                        f"points of {d} depend on each other")
    op = looped[0]
    return (f"{op.label} (made at {op.loc}) still runs one point of {d} at a time after the "
            f"passes (vectorisation is off, or over its memory budget)")
