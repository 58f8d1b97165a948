"""Shardings: per tensor dim an ordered tuple of mesh (sub-)axes, major first.

The canonical form is axis based (as Shardy's); the GSPMD tile-assignment view is
derived from it. Worked example on ``Mesh((2, 4), ("x", "y"))``::

    >>> s = Sharding(mesh, P("y", None))
    >>> s.tile_assignment.shape          # 4 tiles on dim 0, 1 on dim 1, 2 replicas
    (4, 1, 2)
    >>> str(s)
    '{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}'
    >>> Sharding.from_tile_assignment(mesh, s.tile_assignment, replicate_last=True) == s
    True

Mesh axes that no dim uses are replicated over (partial tiling). A dim whose size
does not divide by its shard count is sharded unevenly: shards of ceil(n/k), the
tail padded.
"""
from __future__ import annotations

from typing import Any, Iterable, Sequence

import numpy as np

from .errors import SpecError, TileAssignmentError, short_repr
from .mesh import AxisRef, Mesh

DimAxes = tuple[AxisRef, ...]


class P(tuple):
    """A partition spec: per tensor dim an axis name, a tuple of names (major first), or None.

    ``P("x", None)`` splits dim 0 over mesh axis x; ``P(("x", "y"))`` splits dim 0 over
    x then y. Interchangeable with ``jax.sharding.PartitionSpec``.
    """

    __slots__ = ()

    def __new__(cls, *entries: Any) -> "P":
        return super().__new__(cls, entries)

    def __reduce__(self):
        """copy, deepcopy and pickle rebuild ``P(*entries)``: the tuple's own reduction would call
        ``P(entries)``, a one-entry spec."""
        return (type(self), tuple(self))

    def __repr__(self) -> str:
        return "P(" + ", ".join(repr(e) for e in self) + ")"


def entry_axes(entry) -> tuple:
    """The axes of one spec entry: None -> (), "x" -> ("x",), ("x", "y") -> ("x", "y")."""
    if entry is None:
        return ()
    if isinstance(entry, (str, AxisRef)):
        return (entry,)
    if isinstance(entry, (tuple, list)):
        for e in entry:
            if not isinstance(e, (str, AxisRef)):
                raise SpecError(f"spec entry {entry!r} must hold axis names, got {e!r}")
        return tuple(entry)
    raise SpecError(
        f"spec entry {entry!r} ({type(entry).__name__}) must be an axis name, a tuple of names, or None"
    )


def spec_of(spec) -> tuple:
    """Normalise a spec (P, jax PartitionSpec, tuple/list, NamedSharding) to a tuple of entries."""
    try:
        from jax.sharding import NamedSharding, PartitionSpec
    except ImportError:  # pragma: no cover
        NamedSharding = PartitionSpec = ()  # type: ignore
    if isinstance(spec, NamedSharding):
        spec = spec.spec
    if isinstance(spec, (P, PartitionSpec, tuple, list)):
        return tuple(spec)
    raise SpecError(f"expected a partition spec such as gp.P('x', None), got {spec!r}")


_OF_MEMO: dict = {}  # (mesh, dims, partial) -> Sharding (Sharding.of)
_OF_MEMO_SIZE = 4096


class Sharding:
    """How a tensor is laid out on a mesh (see the module docstring).

    ``mesh`` is the gp.Mesh; ``dims`` holds per tensor dim the tuple of mesh (sub-)axes
    that split it, major first; ``partial`` lists mesh axes over which the local values are
    partial sums (used inside the partitioner; user shardings never have it).

    It prints as JAX writes a sharding (``repr``: ``Sharding(P('x', None))``, and ``.spec``
    is the ``P``); ``str(s)`` is GSPMD's tile form and ``s.shardy()`` Shardy's axis lists.
    """

    __slots__ = ("mesh", "dims", "partial", "_hash")

    def __init__(self, mesh: Mesh, spec=(), *, partial: Iterable = (), what: str = "tensor"):
        from jax.sharding import NamedSharding

        if not isinstance(mesh, Mesh):
            raise SpecError(f"gp.Sharding needs a gp.Mesh (gp.Mesh.from_jax for a jax.sharding.Mesh), got "
                            f"{type(mesh).__name__} {short_repr(mesh, 40)}")
        if isinstance(spec, NamedSharding):
            spec = named_spec(mesh, spec.mesh, spec_of(spec), what)
        dims: list[DimAxes] = []
        for e in spec_of(spec):
            # canonical: adjacent sub-axes of one axis (major then minor) merge, so that
            # ("y:(1)2", "y:(2)2") and "y" are the same (equal) sharding
            dims.append(tuple(mesh.merge([mesh.ref(a) for a in entry_axes(e)])))
        self.mesh = mesh
        self.dims = tuple(dims)
        self.partial = tuple(mesh.merge(sorted(mesh.ref(a) for a in partial)))
        self._check(what)
        self._hash = hash((mesh, self.dims, self.partial))

    @classmethod
    def of(cls, mesh: Mesh, dims: Sequence[Sequence[AxisRef]], partial: Iterable[AxisRef] = ()) -> "Sharding":
        """The sharding with these axes per dim. Shardings are immutable, so equal requests
        share one object (memoised): a plan asks for one per value, and most values of a
        program share a handful of layouts (parsing and checking each was ~5% of planning)."""
        key = (mesh, tuple(tuple(d) for d in dims), tuple(partial))
        hit = _OF_MEMO.get(key)
        if hit is None:
            hit = cls(mesh, P(*key[1]), partial=key[2])
            if len(_OF_MEMO) >= _OF_MEMO_SIZE:
                _OF_MEMO.clear()
            _OF_MEMO[key] = hit
        return hit

    @classmethod
    def replicated(cls, mesh: Mesh, rank: int) -> "Sharding":
        """The sharding of a ``rank``-d tensor replicated on every device of ``mesh``."""
        return cls(mesh, P(*([None] * rank)))

    def _check(self, what: str) -> None:
        used: list[tuple[AxisRef, int]] = []
        for d, axes in enumerate(self.dims):
            for a in axes:
                for b, e in used:
                    if a.overlaps(b):
                        where = f"dims {e} and {d}" if e != d else f"dim {d} twice"
                        raise SpecError(f"{what}: mesh axis {a.name!r} is used on {where}; an axis may shard one dim only")
                used.append((a, d))
        for p in self.partial:
            for b, e in used:
                if p.overlaps(b):
                    raise SpecError(f"{what}: mesh axis {p.name!r} is both partial-sum and sharding dim {e}")

    # -- views ---------------------------------------------------------------
    @property
    def rank(self) -> int:
        """The number of tensor dims."""
        return len(self.dims)

    @property
    def spec(self) -> P:
        """The ``gp.P`` of this sharding (a mesh axis name, a tuple of names or None per dim), as JAX writes it."""
        out = []
        for axes in self.dims:
            names = tuple(str(a) for a in axes)
            out.append(None if not names else names[0] if len(names) == 1 else names)
        return P(*out)

    @property
    def shards(self) -> tuple[int, ...]:
        """Number of shards of each dim."""
        return tuple(int(np.prod([a.size for a in axes], dtype=np.int64)) for axes in self.dims)

    @property
    def used_axes(self) -> tuple[AxisRef, ...]:
        """The mesh (sub-)axes that shard some dim, major first."""
        return tuple(a for axes in self.dims for a in axes)

    @property
    def num_tiles(self) -> int:
        """The number of distinct shards (the product of ``shards``)."""
        return int(np.prod(self.shards, dtype=np.int64))

    @property
    def is_replicated(self) -> bool:
        """Whether every device holds the whole tensor."""
        return self.num_tiles == 1 and not self.partial

    @property
    def is_partially_tiled(self) -> bool:
        """Whether the tensor is split over some mesh axes and replicated over the others (GSPMD's last_tile_dim_replicate)."""
        return 1 < self.num_tiles < self.mesh.size

    def with_rank(self, rank: int, what: str = "tensor") -> "Sharding":
        """This sharding for a tensor of ``rank`` dims (missing trailing dims replicated)."""
        if self.rank > rank:
            raise SpecError(f"{what}: spec {self.spec} has {self.rank} entries but the tensor has rank {rank}")
        if self.rank == rank:
            return self
        return Sharding.of(self.mesh, self.dims + ((),) * (rank - self.rank), self.partial)

    def shard_index(self) -> np.ndarray:
        """For every device (mesh order, flat): its shard index along each dim, shape [devices, rank]."""
        cols = []
        for axes in self.dims:
            idx = np.zeros(self.mesh.size, dtype=np.int64)
            for a in axes:
                idx = idx * a.size + self.mesh.ref_coords(a)
            cols.append(idx)
        return np.stack(cols, axis=1) if cols else np.zeros((self.mesh.size, 0), np.int64)

    @property
    def tile_assignment(self) -> np.ndarray:
        """GSPMD tile assignment: device ids shaped [shards..., (replicas if partially tiled)]."""
        ids = self.mesh.device_ids.reshape(-1)
        shards = self.shards
        repl = self.mesh.size // max(self.num_tiles, 1)
        idx = self.shard_index()
        flat_tile = np.ravel_multi_index(tuple(idx.T), shards) if shards else np.zeros(self.mesh.size, np.int64)
        order = np.lexsort((np.arange(self.mesh.size), flat_tile))  # by tile, then mesh order
        out = ids[order]
        if repl > 1:
            return out.reshape(tuple(shards) + (repl,))
        return out.reshape(tuple(shards))

    def __str__(self) -> str:
        if self.num_tiles == 1:
            text = "{replicated}"
        else:
            ta = self.tile_assignment
            dims = ",".join(str(s) for s in ta.shape)
            devs = ",".join(str(int(d)) for d in ta.reshape(-1))
            suffix = " last_tile_dim_replicate" if self.is_partially_tiled else ""
            text = f"{{devices=[{dims}]{devs}{suffix}}}"
        if self.partial:
            text += " partial={" + ",".join(str(a) for a in self.partial) + "}"
        return text

    def shardy(self) -> str:
        """Shardy's axis-list notation, e.g. ``[{x}, {y:(1)2}]``."""
        dims = ", ".join("{" + ",".join(str(a) for a in axes) + "}" for axes in self.dims)
        return f"[{dims}]"

    def __repr__(self) -> str:
        extra = f", partial={tuple(str(a) for a in self.partial)}" if self.partial else ""
        return f"Sharding({self.spec!r}{extra})"

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sharding):
            return NotImplemented
        return (self.mesh, self.dims, self.partial) == (other.mesh, other.dims, other.partial)

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self):
        """Rebuilt from its mesh and axes, so the hash is this process's (string hashes differ
        between processes) and the axes are the mesh's shared AxisRefs."""
        return (_rebuild_sharding, (self.mesh, self.dims, self.partial))

    # -- GSPMD interop ---------------------------------------------------------
    @classmethod
    def from_tile_assignment(cls, mesh: Mesh, tiles, replicate_last: bool = False) -> "Sharding":
        """The axis-based sharding whose tile assignment is ``tiles``.

        Accepts any tile assignment that is a transposed, reshaped iota of the mesh's
        device order (GSPMD's IotaTileAssignment), in particular every one this class
        produces. Raises TileAssignmentError for one the mesh cannot express.
        """
        if not isinstance(mesh, Mesh):
            raise TileAssignmentError(f"gp.Sharding.from_tile_assignment needs a gp.Mesh, got {type(mesh).__name__} "
                                      f"{short_repr(mesh, 40)}")
        return _from_tiles(mesh, np.asarray(tiles), replicate_last)


def _rebuild_sharding(mesh: Mesh, dims, partial) -> Sharding:
    """Unpickling (``Sharding.__reduce__``): through ``Sharding.of``, as the planner builds them."""
    return Sharding.of(mesh, dims, partial)


def named_spec(mesh: Mesh, jax_mesh, entries: Sequence, what: str = "tensor", open_entry: Any = None) -> P:
    """The spec over ``mesh`` of ``entries`` (a PartitionSpec's entries) named over ``jax_mesh``.

    The jax mesh must have ``mesh``'s axis names and sizes. When it holds the same devices in
    another order (or, for an AbstractMesh, when the concrete mesh of ``jax.set_mesh`` does),
    the layout is converted through its tile assignment, so a permuted axis becomes sub-axes
    of ``mesh``; a layout ``mesh`` cannot express is a SpecError. ``open_entry`` entries (an
    annotation's open dims) pass through unchanged::

        >>> jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2).T, ("x", "y"))
        >>> named_spec(Mesh((2, 4), ("x", "y")), jm, ("x",))   # x of jm = stride 1 of the gp mesh
        P('y:(2)2',)
    """
    names = tuple(jax_mesh.axis_names)
    sizes = tuple(int(s) for s in jax_mesh.axis_sizes)  # also on an AbstractMesh (which has no .devices)
    if names != mesh.axis_names or sizes != mesh.shape:
        raise SpecError(
            f"{what}: NamedSharding is over mesh axes {dict(zip(names, sizes))}, "
            f"not the gspmd_py mesh {dict(zip(mesh.axis_names, mesh.shape))}"
        )
    entries = tuple(entries)
    ids = _jax_mesh_ids(jax_mesh)
    if ids is None or mesh.is_abstract or np.array_equal(ids, mesh.device_ids):
        return P(*entries)
    mine = mesh.device_ids
    if sorted(ids.reshape(-1).tolist()) != sorted(mine.reshape(-1).tolist()):
        raise SpecError(f"{what}: NamedSharding's mesh holds devices {_ids_text(ids)}, the gspmd_py mesh "
                        f"{_ids_text(mine)}: they must be the same devices")
    is_open = [open_entry is not None and e == open_entry for e in entries]
    view = Mesh(mesh.shape, mesh.axis_names, devices=ids)
    there = Sharding(view, P(*[None if o else e for e, o in zip(entries, is_open)]), what=what)
    if there.num_tiles == 1:
        here = Sharding.replicated(mesh, there.rank)
    else:
        tiles, partial_tiles = there.tile_assignment, there.num_tiles < mesh.size
        if partial_tiles:  # the replicas of a tile in gspmd_py's mesh order, as its own tile assignments list them
            pos = {int(d): i for i, d in enumerate(mine.reshape(-1))}
            tiles = np.take_along_axis(tiles, np.argsort(np.vectorize(pos.get)(tiles), axis=-1), axis=-1)
        try:
            here = Sharding.from_tile_assignment(mesh, tiles, replicate_last=partial_tiles)
        except TileAssignmentError as e:
            raise SpecError(
                f"{what}: NamedSharding's mesh orders the devices {_ids_text(ids)}, the gspmd_py mesh "
                f"{_ids_text(mine)}, and its layout {P(*entries)} cannot be expressed over the gspmd_py "
                f"mesh ({e}); build the gp.Mesh with devices=<that jax mesh>.devices"
            ) from None
    return P(*[open_entry if o else e for e, o in zip(here.spec, is_open)])


def _jax_mesh_ids(jax_mesh) -> "np.ndarray | None":
    """Device ids of a concrete jax Mesh, in its shape; for an AbstractMesh those of the concrete
    mesh set by ``jax.set_mesh`` when it has the same axes, else None (order unknown)."""
    import jax

    if isinstance(jax_mesh, jax.sharding.Mesh):
        return np.vectorize(lambda d: d.id, otypes=[np.int64])(jax_mesh.devices)
    try:
        ctx = jax.sharding.get_mesh()  # only outside tracing; an empty mesh when none is set
    except Exception:
        return None
    if (isinstance(ctx, jax.sharding.Mesh) and not ctx.empty and tuple(ctx.axis_names) == tuple(jax_mesh.axis_names)
            and tuple(ctx.axis_sizes) == tuple(jax_mesh.axis_sizes)):
        return np.vectorize(lambda d: d.id, otypes=[np.int64])(ctx.devices)
    return None


def _ids_text(ids: np.ndarray, limit: int = 16) -> str:
    flat = [int(i) for i in ids.reshape(-1)]
    return str(flat) if len(flat) <= limit else str(flat[:limit])[:-1] + f", ... ({len(flat)} devices)]"


def _mesh_strides(mesh: Mesh) -> list[int]:
    strides, acc = [], 1
    for s in reversed(mesh.shape):
        strides.append(acc)
        acc *= s
    return list(reversed(strides))


def _runs(v: np.ndarray, t: int, what: str) -> list[tuple[int, int]]:
    """Minor-first (stride, length) runs of a 1-D index sequence v of length t."""
    runs: list[tuple[int, int]] = []
    step, left = 1, t
    while left > 1:
        s = int(v[step])
        best = None
        for r in range(left, 1, -1):
            if left % r == 0 and all(int(v[step * i]) == i * s for i in range(r)):
                best = r
                break
        if best is None:
            raise TileAssignmentError(f"{what}: device order along a tile dim is not expressible over the mesh axes")
        runs.append((s, best))
        step *= best
        left //= best
    return runs


def _int_ids(tiles: np.ndarray) -> np.ndarray:
    """The device ids of a tile assignment, flat, as int64; a non-integer id (a float, even 1.0,
    which astype would truncate) is a TileAssignmentError naming it and where it is."""
    if tiles.dtype.kind in "iu":
        return tiles.reshape(-1).astype(np.int64)
    for pos in np.ndindex(tiles.shape):
        d = tiles[pos]
        if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
            shown = d.item() if isinstance(d, np.generic) else d
            raise TileAssignmentError(f"tile assignment holds device id {shown!r} ({type(d).__name__}) at index "
                                      f"{pos}: device ids must be ints")
    return tiles.reshape(-1).astype(np.int64)


def _from_tiles(mesh: Mesh, tiles: np.ndarray, replicate_last: bool) -> Sharding:
    ids = mesh.device_ids.reshape(-1)
    if tiles.size != mesh.size:
        raise TileAssignmentError(f"tile assignment has {tiles.size} devices but the mesh has {mesh.size}")
    flat = _int_ids(tiles)
    if sorted(flat.tolist()) != sorted(ids.tolist()):
        bad = sorted(set(flat.tolist()) ^ set(ids.tolist()))
        raise TileAssignmentError(f"tile assignment devices differ from the mesh's devices (mismatch: {bad[:8]})")
    pos_of = {int(d): i for i, d in enumerate(ids)}
    L = np.vectorize(lambda d: pos_of[int(d)])(tiles.astype(np.int64)) if tiles.size else tiles
    L = L - L.reshape(-1)[0]
    strides = _mesh_strides(mesh)
    digits: list[list[tuple[int, int]]] = []  # per tile dim: minor-first (mesh-stride, size)
    for d, t in enumerate(tiles.shape):
        sel = [0] * tiles.ndim
        sel[d] = slice(None)
        v = L[tuple(sel)]
        digits.append(_runs(v, t, f"tile dim {d}"))
    # reconstruct and verify
    recon = np.zeros(tiles.shape, dtype=np.int64)
    for d, runs in enumerate(digits):
        i = np.arange(tiles.shape[d])
        contrib = np.zeros_like(i)
        q = i.copy()
        for s, r in runs:
            contrib += (q % r) * s
            q //= r
        shape = [1] * tiles.ndim
        shape[d] = -1
        recon = recon + contrib.reshape(shape)
    if not np.array_equal(recon, L) or L.reshape(-1)[0] != 0 or int(L.min()) != 0:
        raise TileAssignmentError("tile assignment is not a transposed iota of the mesh's device order")
    # map runs to (sub-)axes
    ndims = tiles.ndim - (1 if replicate_last else 0)
    dims: list[list[AxisRef]] = []
    for d in range(ndims):
        refs: list[AxisRef] = []  # minor first
        for s, r in digits[d]:
            while r > 1:
                a = min(k for k in range(len(strides)) if strides[k] <= s)
                if s % strides[a]:
                    raise TileAssignmentError(f"tile dim {d}: device stride {s} falls inside mesh axis {mesh.axis_names[a]!r}")
                local = s // strides[a]
                n = mesh.shape[a]
                room = n // local if n % local == 0 else 0
                seg = np.gcd(room, r) if room else 0
                if seg <= 1 or (r > room and seg != room):
                    raise TileAssignmentError(
                        f"tile dim {d}: {r} tiles do not fit mesh axis {mesh.axis_names[a]!r} of size {n}"
                    )
                refs.append(mesh.sub(mesh.axis_names[a], n // (local * seg), seg))
                s *= seg
                r //= seg
        dims.append(mesh.merge(list(reversed(refs))))
    try:
        return Sharding.of(mesh, dims)
    except SpecError as e:
        raise TileAssignmentError(f"tile assignment reuses a mesh axis: {e}") from None
