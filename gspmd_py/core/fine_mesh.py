"""The execution mesh: every mesh axis split at the sub-axis boundaries the plan uses.

Collectives in shard_map name whole JAX mesh axes, so a plan that shards on ``y:(1)2``
and ``y:(2)2`` (y of size 4) runs on a JAX mesh where "y" is two axes ``y:0`` (major,
size 2) and ``y:1`` (minor, size 2); ``y`` itself becomes the tuple ``("y:0", "y:1")``.
The device order is unchanged: splitting an axis row-major keeps every device where it was.
A user's axis name cannot contain ':' (Mesh refuses it), so the fine names never collide
with the user's. ``device_groups`` lists the devices of each group of a collective over some
axes of a mesh shape (the cost model's group ids; one NumPy definition, vectorised).

    >>> fm = FineMesh.build(Mesh((2, 4), ("x", "y")), [AxisRef("y", 1, 2)])
    >>> fm.names, fm.sizes
    (('x', 'y:0', 'y:1'), (2, 2, 2))
    >>> fm.fine(AxisRef("y", 1, 4))
    ('y:0', 'y:1')
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from .errors import SpecError, as_int
from .mesh import AxisRef, Mesh


class FineMesh:
    def __init__(self, mesh: Mesh, splits: dict[str, list[int]]):
        self.mesh = mesh
        self.splits = splits  # axis -> boundaries [1, b1, ..., n]
        names, sizes = [], []
        self._ranges: dict[str, list[tuple[str, int, int]]] = {}
        for a, n in zip(mesh.axis_names, mesh.shape):
            bounds = splits[a]
            parts = []
            for i in range(len(bounds) - 1):
                nm = a if len(bounds) == 2 else f"{a}:{i}"
                parts.append((nm, bounds[i], bounds[i + 1]))
                names.append(nm)
                sizes.append(bounds[i + 1] // bounds[i])
            self._ranges[a] = parts
        self.names = tuple(names)
        self.sizes = tuple(sizes)
        self.size_of = dict(zip(self.names, self.sizes))
        self.owner = {nm: (a, lo, hi) for a, parts in self._ranges.items() for nm, lo, hi in parts}
        self._fine: dict[AxisRef, tuple[str, ...]] = {}  # memo of fine()
        self._fine_dims: dict[tuple, tuple[tuple[str, ...], ...]] = {}  # memo of fine_dims()

    @classmethod
    def build(cls, mesh: Mesh, refs: Iterable[AxisRef]) -> "FineMesh":
        bounds: dict[str, set[int]] = {a: {1, n} for a, n in zip(mesh.axis_names, mesh.shape)}
        for r in refs:
            bounds[r.name] |= {r.pre, r.pre * r.size}
        splits = {}
        for a, bs in bounds.items():
            bs_sorted = sorted(bs)
            for lo, hi in zip(bs_sorted, bs_sorted[1:]):
                if hi % lo:
                    raise SpecError(
                        f"mesh axis {a!r} is split into incompatible sub-axes (boundaries {bs_sorted}); "
                        f"sub-axes of one axis must nest"
                    )
            splits[a] = bs_sorted
        return cls(mesh, splits)

    def fine(self, ref: AxisRef) -> tuple[str, ...]:
        hit = self._fine.get(ref)
        if hit is None:
            hit = self._fine[ref] = tuple(nm for nm, lo, hi in self._ranges[ref.name] if lo >= ref.pre and hi <= ref.stop)
        return hit

    def fine_dims(self, dims: Sequence[Sequence[AxisRef]]) -> tuple[tuple[str, ...], ...]:
        key = tuple(tuple(axes) for axes in dims)
        hit = self._fine_dims.get(key)  # a plan asks for every value and op: few distinct layouts
        if hit is None:
            hit = self._fine_dims[key] = tuple(tuple(f for r in axes for f in self.fine(r)) for axes in key)
        return hit

    def coarse(self, names: Sequence[str]) -> tuple[AxisRef, ...]:
        """Fine axis names back to (merged) mesh sub-axes."""
        refs = []
        for nm in names:
            a, lo, hi = self.owner[nm]
            refs.append(self.mesh.sub(a, lo, hi // lo))
        return self.mesh.merge(refs)

    def label(self, names: Sequence[str]) -> str:
        return ",".join(str(r) for r in self.coarse(names))

    def jax_mesh(self):
        import jax
        from jax.sharding import AbstractMesh, AxisType

        sizes, names = tuple(self.sizes), tuple(self.names)
        if not names:  # every mesh axis has size 1 (one device): shard_map needs a non-empty mesh
            sizes, names = (1,), (self.mesh.axis_names[0],)
        if self.mesh.is_abstract:
            return AbstractMesh(sizes, names, axis_types=(AxisType.Auto,) * len(names))
        return jax.sharding.Mesh(self.mesh.jax_devices().reshape(sizes), names)


# -- the device groups of a collective -----------------------------------------------------

def _mesh_args(mesh_shape: Sequence[int], axes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    shape = [as_int(s, "mesh_shape entry", 1) for s in mesh_shape]
    nd = len(shape)
    ax = []
    for a in axes:
        a = as_int(a, "axis")
        if not -nd <= a < nd:
            raise ValueError(f"axis {a} out of range for a {nd}-d mesh {tuple(shape)}")
        ax.append(a % nd)
    if len(set(ax)) != len(ax):
        raise ValueError(f"duplicate mesh axes in {tuple(axes)}")
    return np.asarray(shape, dtype=np.int64).reshape(-1), np.asarray(ax, dtype=np.int64).reshape(-1)


def device_groups(mesh_shape: Sequence[int], axes: Sequence[int]) -> np.ndarray:
    """int64[num_groups, group_size]: the device groups of a collective over mesh ``axes``.

    Devices are the row-major positions ``0 .. prod(mesh_shape)-1``. Row ``g`` lists the
    devices sharing every coordinate outside ``axes``, ordered by their linear index over
    ``axes`` taken in the order given (first = major); rows are ordered by the row-major
    linear index of the remaining coordinates. ``axes=()`` gives one device per group.

    >>> device_groups((2, 3), (1,)).tolist()          # along the minor axis
    [[0, 1, 2], [3, 4, 5]]
    >>> device_groups((2, 3), (0,)).tolist()
    [[0, 3], [1, 4], [2, 5]]
    >>> device_groups((2, 3), (1, 0)).tolist()        # axis 1 major within the group
    [[0, 3, 1, 4, 2, 5]]
    """
    shape, ax = _mesh_args(mesh_shape, axes)
    nd = shape.size
    strides = np.ones(nd, dtype=np.int64)
    if nd:
        strides[:-1] = np.cumprod(shape[::-1])[::-1][1:]
    grp = set(ax.tolist())
    rest = [d for d in range(nd) if d not in grp]

    def lin(dims: Sequence[int]) -> np.ndarray:
        pos = np.zeros(1, dtype=np.int64)
        for d in dims:
            pos = (pos[:, None] + np.arange(shape[d], dtype=np.int64)[None, :] * strides[d]).reshape(-1)
        return pos

    return lin(rest)[:, None] + lin(ax.tolist())[None, :]
