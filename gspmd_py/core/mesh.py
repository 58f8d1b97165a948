"""Device meshes and mesh (sub-)axes.

A mesh is an n-d array of device ids with a name per axis::

    >>> m = Mesh((2, 4), ("x", "y"))            # devices 0..7, row-major
    >>> m.device_ids.tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> m.axis_size("y")
    4

A sharding may use part of an axis: ``AxisRef("y", pre=2, size=2)`` (printed
``y:(2)2``, Shardy's notation) is the minor half of "y": view "y" (size 4) as
``[2, 2]`` major-to-minor; the sub-axis has the major sizes' product ``pre`` = 2
before it and size 2. A reshape that splits a dim sharded on "y" over two dims
uses ``y:(1)2`` and ``y:(2)2``.
"""
from __future__ import annotations

import re
import weakref
from typing import Sequence

import attrs
import numpy as np

from .errors import MeshError, SpecError, short_repr
from .launch_env import launcher_hint


@attrs.frozen(order=True, cache_hash=True)
class AxisRef:
    """A mesh axis or a sub-axis of one: ``name:(pre)size``.

    ``name`` is the mesh axis; ``pre`` the product of the sizes of the sub-axes major to this
    one; ``size`` its size; ``whole`` is True when it is the entire axis (it prints as the name).

    ``Mesh.sub`` (and so ``Mesh.ref``) returns one shared object per sub-axis of a mesh, so
    comparing the AxisRefs of one mesh is mostly an identity check (the hash is cached).
    """

    name: str
    pre: int
    size: int
    whole: bool = attrs.field(default=False, eq=False, order=False)  # the entire axis: prints as its name

    def __str__(self) -> str:
        return self.name if self.whole else f"{self.name}:({self.pre}){self.size}"

    @property
    def stop(self) -> int:
        """The first position past this sub-axis in its axis's mixed radix (``pre * size``)."""
        return self.pre * self.size

    def overlaps(self, other: "AxisRef") -> bool:
        """Whether the two (sub-)axes share part of one mesh axis."""
        return self.name == other.name and max(self.pre, other.pre) < min(self.stop, other.stop)


_SUB_RE = re.compile(r"^\s*([^:()\s]+)\s*:\s*\(\s*(\d+)\s*\)\s*(\d+)\s*$")


class Mesh:
    """An n-d mesh of devices with named axes.

    ``Mesh((2, 4), ("x", "y"))`` takes the first 8 jax devices row-major, ordered hosts
    major (process index, then device id): on a multi-process run (``jax.distributed``
    initialised) the leading axes span processes and the trailing axes stay inside one;
    ``devices=`` gives explicit device ids (any permutation, flat or mesh-shaped);
    ``Mesh.abstract(shape, names)`` needs no devices (planning at scale). ``shape`` and
    ``axis_names`` are tuples; ``axis_types`` holds a jax AxisType per axis (or None).
    ``Mesh.from_jax(jax_mesh)`` takes a ``jax.sharding.Mesh`` as it is (``jax.make_mesh``'s):
    its device order and its axis types; over ``Explicit`` axes (``axis_types``) the arrays a
    gp.spmd function returns are typed Explicit, as jax.jit returns them. Planning reads only
    shapes, names and devices: the axis types change nothing else.

    Meshes are hash-consed: equal meshes are one object (while any is alive), so
    ``==`` is an identity check in practice and a compare of a precomputed key otherwise::

        >>> Mesh.abstract((2, 4), ("x", "y")) is Mesh.abstract((2, 4), ("x", "y"))
        True
    """

    __slots__ = ("shape", "axis_names", "axis_types", "_ids", "_hash", "_key", "_subs", "__weakref__")
    # the intern table (a registry: weak, so unused meshes are freed)
    _interned: "weakref.WeakValueDictionary[tuple, Mesh]" = weakref.WeakValueDictionary()

    def __new__(cls, shape: Sequence[int], axis_names: Sequence[str], devices=None, *, axis_types=None,
                _abstract: bool = False):
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
        if len(shape) != len(axis_names):
            raise MeshError(f"mesh shape {shape} has {len(shape)} axes but {len(axis_names)} names {axis_names}")
        for n, s in zip(axis_names, shape):
            if not isinstance(n, str) or not n or ":" in n or "(" in n:
                raise MeshError(f"mesh axis name {n!r} must be a non-empty string without ':' or '('")
            if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 1:
                raise MeshError(f"mesh axis {n!r} has size {s!r}: sizes must be positive integers")
        if len(set(axis_names)) != len(axis_names):
            raise MeshError(f"mesh axis names {axis_names} repeat a name")
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(shape, dtype=np.int64))
        ids = None if _abstract else _device_ids(devices, shape, size)
        types = _axis_types(axis_types, axis_names)
        key = (shape, axis_names, None if ids is None else ids.tobytes(), types)
        self = cls._interned.get(key)
        if self is None:
            self = object.__new__(cls)
            self.shape, self.axis_names, self._ids, self._key = shape, axis_names, ids, key
            self.axis_types = types
            if ids is not None:
                ids.setflags(write=False)
            self._hash = hash(key)
            self._subs = {}
            self = cls._interned.setdefault(key, self)
        return self

    def __reduce__(self):
        return (_rebuild, (self.shape, self.axis_names, None if self._ids is None else self._ids.tolist(),
                           self.axis_types))

    @classmethod
    def from_jax(cls, mesh) -> "Mesh":
        """The gp.Mesh of a ``jax.sharding.Mesh``: its axis names and sizes, its devices in its
        order, its axis types (Auto or Explicit; a Manual axis belongs to a shard_map, where a
        gp.spmd program cannot run)."""
        import jax

        if not isinstance(mesh, jax.sharding.Mesh):
            raise MeshError(f"gp.Mesh.from_jax needs a jax.sharding.Mesh (gp.Mesh.abstract for a mesh without "
                            f"devices), got {type(mesh).__name__} {short_repr(mesh, 40)}")
        names, shape = tuple(mesh.axis_names), tuple(int(s) for s in mesh.devices.shape)
        types = tuple(str(getattr(t, "name", t)).lower() for t in getattr(mesh, "axis_types", ()) or ())
        if "manual" in types:
            raise MeshError(f"jax mesh {dict(zip(names, shape))} has Manual axes "
                            f"{[n for n, t in zip(names, types) if t == 'manual']}: that is a shard_map's body, "
                            f"where gp.spmd cannot partition; pass a mesh with Auto or Explicit axes")
        return cls(shape, names, devices=[d.id for d in mesh.devices.reshape(-1)], axis_types=types or None)

    @property
    def explicit_axes(self) -> tuple[str, ...]:
        """The axes of type Explicit (``jax.sharding.AxisType``)."""
        return tuple(n for n, t in zip(self.axis_names, self.axis_types) if t == "explicit")

    @classmethod
    def abstract(cls, shape: Sequence[int], axis_names: Sequence[str]) -> "Mesh":
        """A mesh with no devices: plans and lowers, but cannot run."""
        return cls(shape, axis_names, _abstract=True)

    # -- basic facts -------------------------------------------------------
    @property
    def size(self) -> int:
        """The number of devices of the mesh (the product of its shape)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def is_abstract(self) -> bool:
        """Whether the mesh has no devices (``Mesh.abstract``): it plans and lowers, it does not run."""
        return self._ids is None

    @property
    def device_ids(self) -> np.ndarray:
        """Device ids laid out in the mesh shape (iota for an abstract mesh)."""
        if self._ids is None:
            return np.arange(self.size, dtype=np.int64).reshape(self.shape)
        return self._ids.copy()

    def axis_size(self, name: str) -> int:
        """The size of mesh axis ``name`` (a gp.MeshError names the axes when there is none)."""
        return self.shape[self.axis_index(name)]

    def axis_index(self, name: str) -> int:
        """The position of mesh axis ``name`` in ``axis_names``."""
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise SpecError(f"unknown mesh axis {name!r}: the mesh has axes {self.axis_names}") from None

    def ref(self, entry) -> AxisRef:
        """Parse an axis entry ("x", "x:(2)2" or an AxisRef) into an AxisRef, checked against the mesh."""
        if isinstance(entry, AxisRef):
            ref = entry
        elif isinstance(entry, str):
            m = _SUB_RE.match(entry)
            if m:
                ref = AxisRef(m.group(1), int(m.group(2)), int(m.group(3)))
            else:
                ref = AxisRef(entry, 1, self.axis_size(entry))
        else:
            raise SpecError(f"mesh axis entry {entry!r} must be an axis name (str), got {type(entry).__name__}")
        return self.sub(ref.name, ref.pre, ref.size)

    def sub(self, name: str, pre: int, size: int) -> AxisRef:
        """The sub-axis ``name:(pre)size`` (the whole axis when pre == 1 and size == its size).

        One shared AxisRef per sub-axis (memoised), so later comparisons are identity checks.
        """
        key = (name, pre, size)
        ref = self._subs.get(key)
        if ref is None:
            n = self.axis_size(name)
            if size < 1 or pre < 1 or n % (pre * size) != 0:
                raise SpecError(f"sub-axis {name}:({pre}){size} does not divide mesh axis {name!r} of size {n}")
            ref = self._subs.setdefault(key, AxisRef(name, int(pre), int(size), whole=(pre == 1 and size == n)))
        return ref

    def merge(self, refs) -> tuple[AxisRef, ...]:
        """Merge adjacent sub-axes of one axis, major first (``y:(1)2, y:(2)2`` -> ``y``)."""
        out: list[AxisRef] = []
        for r in refs:
            if out and out[-1].name == r.name and out[-1].stop == r.pre:
                prev = out.pop()
                r = self.sub(r.name, prev.pre, prev.size * r.size)
            out.append(r)
        return tuple(out)

    def ref_coords(self, ref: AxisRef) -> np.ndarray:
        """Coordinate of every device (mesh order, flat) along the (sub-)axis ``ref``."""
        n = self.axis_size(ref.name)
        full = np.indices(self.shape)[self.axis_index(ref.name)].reshape(-1)
        minor = n // ref.stop
        return (full // minor) % ref.size

    def jax_devices(self) -> np.ndarray:
        """The mesh's jax devices as an array of the mesh's shape (a gp.MeshError on an abstract mesh)."""
        import jax

        if self._ids is None:
            raise MeshError("an abstract mesh has no devices: use plan() / lower_text(), not a call")
        by_id = {d.id: d for d in jax.devices()}
        return np.vectorize(lambda i: by_id[int(i)], otypes=[object])(self._ids)

    def same_layout(self, other: "Mesh") -> bool:
        """Same axis names, sizes and devices in the same order (axis types aside): a spec means
        the same tiling over both."""
        return self is other or self._key[:3] == other._key[:3]

    def __eq__(self, other) -> bool:
        if self is other:
            return True
        if not isinstance(other, Mesh):
            return NotImplemented
        return self._hash == other._hash and self._key == other._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        axes = ", ".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))
        kind = "abstract " if self.is_abstract else ""
        explicit = f", explicit={self.explicit_axes}" if self.explicit_axes else ""
        return f"Mesh({kind}{axes}{explicit})"


def _rebuild(shape, axis_names, ids, axis_types=None) -> Mesh:
    """Unpickling goes through the intern table (``Mesh.__reduce__``)."""
    return Mesh(shape, axis_names, ids, axis_types=axis_types, _abstract=ids is None)


AXIS_TYPES = ("auto", "explicit")


def _axis_types(given, names: tuple[str, ...]) -> tuple[str, ...]:
    """Per axis "auto" or "explicit" (default: every axis auto); ``jax.sharding.AxisType`` values
    and their names are accepted."""
    if given is None:
        return ("auto",) * len(names)
    if isinstance(given, str) or not hasattr(given, "__len__"):
        given = (given,) * len(names)
    types = tuple(str(getattr(t, "name", t)).lower() for t in given)
    if len(types) != len(names) or any(t not in AXIS_TYPES for t in types):
        raise MeshError(f"axis_types {tuple(given)!r} must give one of Auto / Explicit per mesh axis {names}")
    return types


def _device_ids(devices, shape: tuple[int, ...], size: int) -> np.ndarray:
    import jax

    devs = jax.devices()  # every process's devices once jax.distributed is initialised
    available = sorted(d.id for d in devs)
    if devices is None:
        if size > len(available):
            hint = launcher_hint()
            if hint:
                raise MeshError(f"mesh shape {shape} needs {size} devices but only {len(available)} are available: "
                                f"{hint}")
            raise MeshError(
                f"mesh shape {shape} needs {size} devices but only {len(available)} are available "
                f"(use Mesh.abstract for planning at scale, or set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count={size} before importing jax)"
            )
        # hosts major: process index, then device id (one process: plain id order)
        order = [d.id for d in sorted(devs, key=lambda d: (d.process_index, d.id))]
        return np.asarray(order[:size], dtype=np.int64).reshape(shape)
    arr = np.asarray(devices, dtype=object)
    if arr.ndim > 1 and arr.shape != shape:  # a 2-d layout of other sizes would be re-laid out silently
        raise MeshError(f"devices has shape {arr.shape} but the mesh shape is {shape}: pass the device ids "
                        f"flat or shaped {shape}")
    flat = []
    for d in arr.reshape(-1):
        if hasattr(d, "id") and not isinstance(d, (int, np.integer)):
            flat.append(int(d.id))
        elif isinstance(d, (int, np.integer)) and not isinstance(d, bool):
            flat.append(int(d))
        else:
            kind = f" ({type(d).__name__}: device ids are ints)" if isinstance(d, (float, np.floating)) else ""
            raise MeshError(f"device {d!r}{kind} is neither a device id (int) nor a jax Device")
    if len(flat) != size:
        raise MeshError(f"mesh shape {shape} needs {size} device ids, got {len(flat)}")
    seen: set[int] = set()
    dups = sorted({i for i in flat if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if dups:
        raise MeshError(f"device ids {dups} appear more than once in the mesh")
    missing = sorted(set(flat) - set(available))
    if missing:
        hint = launcher_hint()
        raise MeshError(f"device ids {missing} do not exist (available ids: {available[0]}..{available[-1]})"
                        + (f": {hint}" if hint else ""))
    return np.asarray(flat, dtype=np.int64).reshape(shape)
