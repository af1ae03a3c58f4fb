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
import hashlib
import math
from collections.abc import Mapping

import jax
import numpy as np
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

    @property
    def multiprocess(self) -> bool:
        """The mesh spans devices of other processes (``jax.distributed``): every value of the
        run is then a global array, made from each process's own shards."""
        me = jax.process_index()
        return any(d.process_index != me for d in self.mesh.devices.flat)

    @property
    def leader(self) -> bool:
        """This process calls the program's ``tl.source`` and ``tl.sink`` functions: the one
        that holds the mesh's first device, where JAX runs a compiled program's host
        callbacks (a point's value is whole in every process, so it is delivered once)."""
        return jax.process_index() == self.mesh.devices.flat[0].process_index

    def from_leader(self, make, like: np.ndarray) -> np.ndarray:
        """``make()`` called in the leader and sent to every process (``like`` gives the
        shape and dtype the others contribute)."""
        from jax.experimental import multihost_utils

        v = make() if self.leader else np.zeros_like(like)
        out = multihost_utils.broadcast_one_to_all(
            v.astype(np.uint8) if v.dtype == np.bool_ else v, is_source=self.leader)
        return np.asarray(out).astype(v.dtype)

    def agree(self, program: str, loc=None) -> None:
        """Every process compiled the same ``program`` (its loop program and executor, as
        text): one SPMD program whose processes ran different schedules would wait forever
        in a collective or mix unrelated values. Otherwise a ``ShardingError``."""
        if not self.multiprocess:
            return
        from jax.experimental import multihost_utils

        digest = np.frombuffer(hashlib.sha256(program.encode()).digest(), np.uint8)
        every = np.asarray(multihost_utils.process_allgather(digest)).reshape(-1, digest.size)
        other = [k for k, d in enumerate(every) if not np.array_equal(d, every[0])]
        if other:
            raise ShardingError(
                f"processes {other} compiled another program than process 0 (a schedule or "
                "executor of their own): every process must compile the same program, with "
                "the same bounds, config and input shapes (compare prog.lowered.pretty() in "
                "each)", loc)

    def place(self, value, sharding):
        """``value`` on the mesh: split by ``sharding``, or where it goes without one (one
        device; over several processes, replicated on every device of the mesh, since a
        process's local array cannot meet the others' in one program)."""
        if not self.multiprocess:
            return value if sharding is None else jax.device_put(value, sharding)
        sharding = sharding or NamedSharding(self.mesh, PartitionSpec())
        if isinstance(value, jax.Array) and value.sharding == sharding:
            return value
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            return jax.jit(lambda x: x, out_shardings=sharding)(value)
        # every process holds the whole value (the same program, the same inputs): each puts
        # only the shards its own devices hold, with no exchange between processes
        host = np.asarray(value)
        return jax.make_array_from_callback(host.shape, sharding, lambda idx: host[idx])

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


def to_host(tree):
    """``tree``'s arrays as NumPy, whole in every process: an array split over devices of
    several processes is gathered from all of them (a collective every process makes in the
    same order, as every process runs the same program)."""
    leaves, tdef = jax.tree.flatten(tree)
    if not any(isinstance(x, jax.Array) for x in leaves):  # on the host already
        return tree
    if jax.process_count() > 1:  # only then can an array be split over processes
        for k, x in enumerate(leaves):
            if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
                from jax.experimental import multihost_utils
                leaves[k] = multihost_utils.process_allgather(x, tiled=True)
    arrays = [x for x in leaves if isinstance(x, jax.Array)]
    if len(arrays) > 1 and _platform(arrays[0]) != "cpu":
        for x in arrays:  # every transfer started before the first is waited for (on CPU
            x.copy_to_host_async()  # each start costs more than the copy)
    return jax.tree.unflatten(tdef, [np.asarray(x) for x in leaves])


def _platform(x: jax.Array) -> str:
    return next(iter(x.devices())).platform


def _why_looped(sdg: SDG, d, looped) -> str:
    """Why ``d`` is still a loop: a read across its points where there is one."""
    for e in sdg.edges:
        p, c = sdg.ops[e.src], sdg.ops[e.dst]
        if d in p.domain and d in c.domain:
            x = e.index[p.domain.index(d)]
            if x != d:
                return (f"{c.label} (made at {c.loc}) reads {p.label} at {d} = {x}, so the "
                        f"points of {d} depend on each other")
    calls = [op for op in looped if op.kind in ("source", "sink")]
    if calls:
        op = calls[0]
        return (f"{op.label} (made at {op.loc}) is a tl.{op.kind}: it calls Python at every "
                f"point of {d}, so {d} stays a loop; reduce over {d} before the tl.{op.kind} "
                "(its value at a point of the other dims is then whole on every device)")
    op = looped[0]
    return (f"{op.label} (made at {op.loc}) still runs one point of {d} at a time after the "
            f"passes (vectorisation is off, or over its memory budget)")
