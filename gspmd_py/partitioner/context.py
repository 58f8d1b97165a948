"""What every handler uses while the SPMD program is built: device positions, masks of
padding, the collectives, and the build's state, in typed parts.

All device-dependent quantities come from ``lax.axis_index`` inside the one SPMD program,
so the program is the same whatever the number of devices. Collectives are only emitted
here; what the program communicates is read back from the program itself
(program/program_index.py), so re-tracing can never duplicate or lose a record.

A ``Ctx`` lives for one partition pass (``compiler.partition``) and never leaves it:

* what it is given, fixed for the build: the fine mesh, the ``Shaping``, and propagation's
  decisions (``want``: value id -> fine dims; ``rules``: op id -> OpRule; ``plans``: op id
  -> OpPlan), all constructor arguments;
* ``cache`` (``TraceCache``): what one trace scope computes once, in one typed dict per
  kind (reshard results, all-reduced values, axis indices, collective results); a loop or
  branch body gets a fresh one (``ctx.body_scope()``), so its tracers never leak out;
* ``prices`` (``PriceMemo``): hierarchy.py's memo of collective prices (no tracers: kept
  for the whole build);
* ``op`` (``OpVisit``): the op being partitioned, its label (notes, fallbacks and shaped
  collectives are attributed to it) and its operands before they were resharded (what a
  replicated fallback judges by); set by the driver (``ctx.visit``, ``ctx.hand_over``);
* ``found`` (``Findings``): notes, fallbacks, shaped collectives, host calls, what the
  program holds per value, the operand shardings each handler got; appended to only
  through Ctx's methods (``note``, ``fallback``, ``record_shaped``, ``host_call``, ``hold``,
  ``hand_over``) and
  frozen at the end into the pass's ``Diagnostics`` value (``ctx.diagnostics()``).
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterator, Mapping, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..ops.collectives import ALL_GATHER
from ..core.dtypes import is_key
from .diagnostics import Diagnostics, Fallback, Held
from ..core.fine_mesh import FineMesh
from .pvalue import FineDims, Partial, PValue, ceil_div, local_shape, shards
from .shaping import Shaped, Shaping


#: (value key, target dims, keep_partial) -> the resharded value
ReshardKey = tuple[int, FineDims, bool]
#: (kind, axes, dim, id of the operand) -> (the operand, the collective's result)
CollectiveKey = tuple[str, tuple[str, ...], int, int]


@attrs.define
class TraceCache:
    """What one trace scope computes once (its values are tracers of that scope)."""

    reshards: dict[ReshardKey, PValue] = attrs.Factory(dict)  # reshard.py: one reshard per (value, target)
    reduced: dict[int, PValue] = attrs.Factory(dict)  # value key -> the value all-reduced whole
    axis_index: dict[tuple[str, ...], Any] = attrs.Factory(dict)  # axes -> this device's linear index
    collectives: dict[CollectiveKey, tuple[Any, Any]] = attrs.Factory(dict)  # see Ctx.all_gather


@attrs.define
class PriceMemo:
    """hierarchy.py's memo of the hardware's answers, per fine axes (no tracers)."""

    seconds: dict[tuple[str, tuple[str, ...], int], float] = attrs.Factory(dict)  # (kind, axes, bytes) -> s
    spans_levels: dict[tuple[str, ...], bool] = attrs.Factory(dict)  # axes -> whether they cross a link level


@attrs.frozen
class OpVisit:
    """The op being partitioned: its label, and its operands as they arrived (before resharding)."""

    label: str = "boundary"
    incoming: tuple[PValue, ...] = ()


@attrs.define
class Findings:
    """The build's diagnostics while it runs (``freeze`` makes the pass's Diagnostics value)."""

    notes: list[str] = attrs.Factory(list)
    fallbacks: list[Fallback] = attrs.Factory(list)
    shaped: list[Shaped] = attrs.Factory(list)
    host_calls: list = attrs.Factory(list)  # host_calls.HostCall
    held: dict[int, Held] = attrs.Factory(dict)
    seen_operands: dict[int, tuple[FineDims, ...]] = attrs.Factory(dict)

    def freeze(self) -> Diagnostics:
        return Diagnostics(self.notes, self.fallbacks, self.shaped, self.host_calls, self.held, self.seen_operands)


class Ctx:
    """The partitioner's state for one build (see the module doc)."""

    def __init__(self, fine: FineMesh, shaping: Shaping = Shaping(), *, want: Optional[Mapping[int, FineDims]] = None,
                 rules: Optional[Mapping] = None, plans: Optional[Mapping] = None):
        self.fine = fine
        self.shaping = shaping  # collectives shaped for a hardware (shaping.py); Shaping(): today's program
        self.sizes = fine.size_of
        self.want: Mapping[int, FineDims] = want or {}  # value id -> the fine sharding propagation chose
        self.rules: Mapping = rules or {}  # op id -> OpRule
        self.plans: Mapping = plans or {}  # op id -> OpPlan (the op's projection in fine axes)
        self.cache = TraceCache()
        self.prices = PriceMemo()
        self.op = OpVisit()
        self.found = Findings()
        self._next_key = 0

    # -- the build's state -----------------------------------------------------------
    @property
    def current_op(self) -> str:
        """The label of the op being partitioned ("boundary" outside every op)."""
        return self.op.label

    @contextlib.contextmanager
    def visit(self, label: str) -> Iterator[None]:
        """Partition the op labelled ``label`` inside this block (the outer op's visit resumes after)."""
        outer, self.op = self.op, OpVisit(label)
        try:
            yield
        finally:
            self.op = outer

    def hand_over(self, op_id: int, incoming: Sequence[PValue], got: Sequence[FineDims]) -> None:
        """The driver hands op ``op_id``'s operands to its handler: ``got`` their shardings after
        resharding (recorded), ``incoming`` the operands before (``op.incoming``)."""
        self.found.seen_operands[op_id] = tuple(got)
        self.op = attrs.evolve(self.op, incoming=tuple(incoming))

    @contextlib.contextmanager
    def body_scope(self) -> Iterator[None]:
        """A fresh trace cache while a loop or branch body is traced: its tracers must not leak out."""
        saved, self.cache = self.cache, TraceCache()
        try:
            yield
        finally:
            self.cache = saved

    def diagnostics(self) -> Diagnostics:
        """What the build found so far, as a value."""
        return self.found.freeze()

    def note(self, text: str) -> None:
        """A note on the current op in ``plan.report()``: "<op label>: <text>"."""
        self.found.notes.append(f"{self.op.label}: {text}")

    def fallback(self, reason: str) -> None:
        self.found.fallbacks.append(Fallback(self.op.label, reason))

    def record_shaped(self, rec: Shaped) -> None:
        """A collective shaped for the hardware (recorded once)."""
        if rec not in self.found.shaped:
            self.found.shaped.append(rec)

    def host_call(self, call) -> None:
        """A host callback of the program (host_calls.HostCall): its failures are re-raised after a run."""
        self.found.host_calls.append(call)

    # -- values ------------------------------------------------------------------
    def pv(self, x, shape, dims: FineDims, partial: Optional[Partial] = None, dtype=None) -> PValue:
        self._next_key += 1
        return PValue(x, tuple(shape), tuple(tuple(d) for d in dims), partial, dtype, self._next_key)

    def hold(self, vid: int, pv: PValue) -> PValue:
        """Note what the program holds for value ``vid`` (its tracer's shape is the local shape)."""
        self.found.held[vid] = Held(tuple(int(n) for n in pv.x.shape), pv.dims, pv.partial)
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
        key = tuple(axes)  # computed once per trace scope
        hit = self.cache.axis_index.get(key)
        if hit is None:
            hit = self.cache.axis_index[key] = lax.axis_index(key).astype(jnp.int32)
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
            x = on_words(lambda w: jnp.where(v.reshape(shape + [1] * (w.ndim - len(shape))), w,
                                             jnp.asarray(fill if w is x else 0, dtype=w.dtype)), x)
        return x

    # -- collectives -----------------------------------------------------------------
    def all_gather(self, x, axes: Sequence[str], dim: int):
        """One all-gather per (operand, axes, dim) in a trace scope: a second handler gathering
        the same value (a pool and its gradient) reuses the first's result."""
        key = (ALL_GATHER, tuple(axes), dim, id(x))
        hit = self.cache.collectives.get(key)
        if hit is not None and hit[0] is x:
            return hit[1]
        out = on_words(_all_gather_major, x, tuple(axes), dim)
        self.cache.collectives[key] = (x, out)
        return out

    def all_reduce(self, x, axes: Sequence[str], kind: str = "sum"):
        if kind == "sum" and jnp.iscomplexobj(x):
            # as (real, imag) float pairs, one all-reduce of the same bytes: XLA's CPU compiler
            # aborts the process on an all-reduce of a complex constant (a sum over an empty dim)
            y = lax.psum(jnp.stack([jnp.real(x), jnp.imag(x)], -1), tuple(axes))
            return lax.complex(y[..., 0], y[..., 1])
        fn = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[kind]
        return fn(x, tuple(axes))

    def reduce_scatter(self, x, axes: Sequence[str], dim: int):
        return _reduce_scatter_major(x, tuple(axes), dim, self.k(tuple(axes)))

    def all_to_all(self, x, axes: Sequence[str], split: int, concat: int):
        return on_words(lax.all_to_all, x, tuple(axes), split, concat, tiled=True)

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
        return on_words(lax.ppermute, x, mesh_order, perm=tuple(pairs))


def pad_dim(x, d: int, size: int):
    """Pad (with zeros) or cut local dim d of x to ``size``."""
    cur = x.shape[d]
    if cur == size:
        return x
    if cur > size:
        return lax.slice_in_dim(x, 0, size, axis=d)
    return on_words(lambda w: jnp.pad(w, [(0, size - cur) if i == d else (0, 0) for i in range(w.ndim)]), x)


def on_words(fn, x, *args, **kwargs):
    """``fn(x, *args, **kwargs)``; a typed PRNG key array (``key<fry>``) goes through as its
    uint32 words (``jax.random.key_data``: a trailing dim) and is wrapped back after, since
    collectives, pads and selects take no key dtype. ``fn`` works on x's leading dims only."""
    if not is_key(x.dtype):
        return fn(x, *args, **kwargs)
    impl = jax.random.key_impl(x)
    return jax.random.wrap_key_data(fn(jax.random.key_data(x), *args, **kwargs), impl=impl)


def dyn_slice_dim(x, d: int, start, size: int):
    return lax.dynamic_slice_in_dim(x, start, size, axis=d)


# -- collectives on the major dim ----------------------------------------------------------
# An all-gather or reduce-scatter on a dim with non-trivial dims before it makes XLA lay the
# buffer out with that dim major (a transpose) and, on CPU, runs ~4-6x slower than the same
# collective on dim 0 plus the transpose written out (f32[16,128,2048] reduce-scattered on
# dim 2 over 4 devices: 11 ms, vs 2.1 ms moved and scattered on dim 0; all-gather of
# f32[16,128,128] on dim 2: 5.9 ms vs 1.9 ms). So the blocks are put on a new leading dim
# and the collective runs there (still tiled, so the combiner merges it):
#
#     all_gather(x, dim=d)      ->  g = all_gather(x[None], 0)   # [k, ...]: block j from device j
#                                   reshape(moveaxis(g, 0, d))   # the blocks back in place along d
#     psum_scatter(x, dim=d)    ->  y = moveaxis(x.reshape(.., k, c, ..), d, 0)   # [k, .., c, ..]
#                                   psum_scatter(y, 0)[0]        # [.., c, ..]: no transpose after

def _all_gather_major(x, axes: tuple, dim: int):
    if dim == 0 or math.prod(x.shape[:dim]) == 1:
        return lax.all_gather(x, axes, axis=dim, tiled=True)
    g = lax.all_gather(x[None], axes, axis=0, tiled=True)
    k = g.shape[0]
    return jnp.moveaxis(g, 0, dim).reshape(x.shape[:dim] + (k * x.shape[dim],) + x.shape[dim + 1:])


def _reduce_scatter_major(x, axes: tuple, dim: int, k: int):
    if dim == 0 or math.prod(x.shape[:dim]) == 1 or k == 1:
        return lax.psum_scatter(x, axes, scatter_dimension=dim, tiled=True)
    c = x.shape[dim] // k
    y = jnp.moveaxis(x.reshape(x.shape[:dim] + (k, c) + x.shape[dim + 1:]), dim, 0)
    return lax.psum_scatter(y, axes, scatter_dimension=0, tiled=True).reshape(y.shape[1:])

