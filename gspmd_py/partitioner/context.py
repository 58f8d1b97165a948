"""What every handler uses while the SPMD program is built: device positions, masks of
padding, and the collectives.

All device-dependent quantities come from ``lax.axis_index`` inside the one SPMD program,
so the program is the same whatever the number of devices. Collectives are only emitted
here; what the program communicates is read back from the program itself (program_index.py),
so re-tracing can never duplicate or lose a record.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs
import jax.numpy as jnp
import numpy as np
from jax import lax

from .fine_mesh import FineMesh
from .pvalue import FineDims, Partial, PValue, ceil_div, local_shape, shards
from .shaping import Shaped, Shaping


@attrs.frozen
class Collective:
    """One collective of the SPMD program, in program order.

    ``bytes_per_device``: size of the buffer each device sends into the collective
    (all-gather: its shard; reduce-scatter, all-reduce, all-to-all, permute: its buffer).
    ``op``: the label of the op that caused it ("dot_general #12 (model.py:40)", or
    "boundary"); ``op_id`` its IR op id (-1 at the boundary). ``reduce``: the reduction of an
    all-reduce / reduce-scatter. ``tensors``: how many tensors a combined collective carries.
    ``group_size``: devices in each group. ``shape``/``dtype``: the local buffer sent.
    """

    kind: str
    axes: tuple[str, ...]
    bytes_per_device: int
    op: str
    op_id: int = attrs.field(default=-1, eq=False)
    dtype: str = attrs.field(default="", eq=False)
    shape: tuple[int, ...] = attrs.field(default=(), eq=False)
    reduce: str = attrs.field(default="", eq=False)
    tensors: int = attrs.field(default=1, eq=False)
    group_size: int = attrs.field(default=1, eq=False)
    in_loop: bool = attrs.field(default=False, eq=False)

    def __str__(self) -> str:
        extra = f" x{self.tensors}" if self.tensors > 1 else ""
        return f"{self.kind}({','.join(self.axes)}) {self.bytes_per_device}B{extra}  <- {self.op}"


@attrs.frozen
class Held:
    """What the traced per-device program holds for one IR value."""

    local_shape: tuple[int, ...]  # the tracer's shape (uneven dims padded to whole shards)
    dims: FineDims  # per dim its fine mesh axes
    partial: Optional[Partial] = None  # not yet reduced over these axes (a deferred all-reduce)


@attrs.define
class Fallback:
    op: str
    reason: str


class Ctx:
    def __init__(self, fine: FineMesh, shaping: Shaping = Shaping()):
        self.fine = fine
        self.shaping = shaping  # collectives shaped for a hardware (shaping.py); Shaping(): today's program
        self.shaped: list[Shaped] = []  # the collectives it shaped, for plan.report()
        self.prices: dict = {}  # hierarchy.py's memo of collective prices
        self.sizes = fine.size_of
        self.fallbacks: list[Fallback] = []
        self.notes: list[str] = []
        self.current_op = "boundary"
        self._next_key = 0
        self.reshard_cache: dict[tuple, PValue] = {}
        self.want: dict[int, FineDims] = {}  # value id -> the fine sharding propagation chose
        self.rules: dict = {}  # op id -> OpRule
        self.plans: dict = {}  # op id -> OpPlan (the op's projection in fine axes)
        self.seen_operands: dict[int, tuple[FineDims, ...]] = {}  # op id -> operand shardings the handler got
        self.incoming: list[PValue] = []  # the current op's operands before they were resharded
        self.host_calls: list = []  # host_calls.HostCall of each jax.pure_callback: failures, re-raised by Plan.run
        # value id -> what the traced per-device program holds for it (local shape, dims, partial
        # axes), loop and branch bodies included: what plan.report() must agree with
        self.held: dict[int, Held] = {}

    # -- values ------------------------------------------------------------------
    def pv(self, x, shape, dims: FineDims, partial: Optional[Partial] = None, dtype=None) -> PValue:
        self._next_key += 1
        return PValue(x, tuple(shape), tuple(tuple(d) for d in dims), partial, dtype, self._next_key)

    def hold(self, vid: int, pv: PValue) -> PValue:
        """Note what the program holds for value ``vid`` (its tracer's shape is the local shape)."""
        self.held[vid] = Held(tuple(int(n) for n in pv.x.shape), pv.dims, pv.partial)
        return pv

    def local_shape(self, shape, dims) -> tuple[int, ...]:
        return local_shape(shape, dims, self.sizes)

    def k(self, axes: Sequence[str]) -> int:
        return shards(self.sizes, axes)

    # -- device positions ----------------------------------------------------------
    def index(self, axes: Sequence[str]):
        """This device's linear index over ``axes`` (major first); 0 for no axes."""
        if not axes:
            return jnp.int32(0)
        key = ("axis_index", tuple(axes))  # computed once per trace scope (lives with the reshard cache)
        hit = self.reshard_cache.get(key)
        if hit is None:
            hit = self.reshard_cache[key] = lax.axis_index(tuple(axes)).astype(jnp.int32)
        return hit

    def offset(self, n: int, axes: Sequence[str]):
        """Global index of this device's first row of a dim of size n sharded over ``axes``."""
        if not axes:
            return jnp.int32(0)
        return self.index(axes) * jnp.int32(ceil_div(n, self.k(axes)))

    def valid(self, pv: PValue, d: int):
        """Bool vector over pv's local dim d: True for real (non-padding) rows."""
        n, axes = pv.shape[d], pv.dims[d]
        c = ceil_div(n, self.k(axes)) if axes else n
        return (lax.iota(jnp.int32, c) + self.offset(n, axes)) < n

    def has_padding(self, pv: PValue, d: int) -> bool:
        k = self.k(pv.dims[d])
        return k > 1 and pv.shape[d] % k != 0

    def mask(self, pv: PValue, dims: Sequence[int], fill) -> Any:
        """pv's local array with padding rows along ``dims`` replaced by ``fill``."""
        x = pv.x
        for d in dims:
            if not self.has_padding(pv, d):
                continue
            v = self.valid(pv, d)
            shape = [1] * x.ndim
            shape[d] = x.shape[d]
            x = jnp.where(v.reshape(shape), x, jnp.asarray(fill, dtype=x.dtype))
        return x

    def fallback(self, reason: str) -> None:
        self.fallbacks.append(Fallback(self.current_op, reason))

    # -- collectives -----------------------------------------------------------------
    def _memo(self, key: tuple, x, make):
        """One collective per (kind, operand, parameters): a second handler gathering the
        same value (a pool and its gradient) reuses the first's result. The cache lives with
        the reshard cache, so a loop body's tracers never leak out of it."""
        key = (key, id(x))
        hit = self.reshard_cache.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        out = make()
        self.reshard_cache[key] = (x, out)
        return out

    def all_gather(self, x, axes: Sequence[str], dim: int):
        return self._memo(("all-gather", tuple(axes), dim), x,
                          lambda: lax.all_gather(x, tuple(axes), axis=dim, tiled=True))

    def all_reduce(self, x, axes: Sequence[str], kind: str = "sum"):
        fn = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[kind]
        return fn(x, tuple(axes))

    def reduce_scatter(self, x, axes: Sequence[str], dim: int):
        return lax.psum_scatter(x, tuple(axes), scatter_dimension=dim, tiled=True)

    def all_to_all(self, x, axes: Sequence[str], split: int, concat: int):
        return lax.all_to_all(x, tuple(axes), split, concat, tiled=True)

    def permute(self, x, axes: Sequence[str], perm: Sequence[tuple[int, int]]):
        """Send shard ``src`` to ``dst`` for each (src, dst) in ``perm``; both are linear
        indices over ``axes`` in the order given (major first), as ``index(axes)`` counts.

        jax's ppermute linearises several axes in *mesh* order whatever order they are
        named in (unlike axis_index and all_gather), so indices are converted to it.
        """
        axes = tuple(axes)
        mesh_order = tuple(a for a in self.fine.names if a in axes)
        pairs = [(int(a), int(b)) for a, b in perm]
        if mesh_order != axes:
            given = [self.sizes[a] for a in axes]
            to_mesh = np.arange(int(np.prod(given, dtype=np.int64))).reshape(given)
            to_mesh = to_mesh.transpose([axes.index(a) for a in mesh_order])  # mesh-ordered view
            inv = np.empty(to_mesh.size, np.int64)
            inv[to_mesh.reshape(-1)] = np.arange(to_mesh.size)
            pairs = [(int(inv[a]), int(inv[b])) for a, b in pairs]
        return lax.ppermute(x, mesh_order, perm=tuple(pairs))


def pad_dim(x, d: int, size: int):
    """Pad (with zeros) or cut local dim d of x to ``size``."""
    cur = x.shape[d]
    if cur == size:
        return x
    if cur > size:
        return lax.slice_in_dim(x, 0, size, axis=d)
    cfg = [(0, 0)] * x.ndim
    cfg[d] = (0, size - cur)
    return jnp.pad(x, cfg)


def dyn_slice_dim(x, d: int, start, size: int):
    return lax.dynamic_slice_in_dim(x, start, size, axis=d)
