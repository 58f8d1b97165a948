"""Hypothesis strategies for meshes, shardings, shapes and values (gp.testing's building blocks).

    >>> import gspmd_py.testing as gpt
    >>> gpt.meshes(max_devices=8, max_axes=3)       # gp.Mesh: shapes, names, device orders
    >>> gpt.shardings((7, 16), mesh)                # gp.P: axes, sub-axes ("y:(2)2"), uneven dims
    >>> gpt.annotations((7, 16), mesh)              # gpt.Annotation: a spec with open dims and a priority
    >>> gpt.shapes_like((x, w))                     # the same ranks and dtypes, sizes 0, 1, primes, uneven
    >>> gpt.values(np.float32)                      # scalars: +-0, +-inf, NaN, near-max, ordinary
    >>> gpt.arrays((7, 16), np.float32)             # arrays of those (seeded: cheap to draw and shrink)

Every strategy shrinks towards the simple case: one mesh axis of 2 devices in device order,
replicated specs, the smallest sizes, plain values. A mesh and a spec take the same number of
draws whatever the mesh drawn, so a failing example shrinks its mesh (size-1 axes and sub-axes
drop away, (3, 1, 1) becomes (2,)) without the shapes and layouts drawn after it changing.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import strategies as st

from ..core import dtypes
from ..core.errors import ArgumentError, MeshError, SpecError
from ..frontend.annotate import OPEN, annotate
from ..core.mesh import Mesh

# mesh axis sizes, simplest first (shrinking moves towards the front)
AXIS_SIZES = (2, 4, 1, 8, 3, 16, 5, 6)
AXIS_NAMES = ("x", "y", "z", "w")
# sizes of array dims, smallest first: 0, 1, primes, sizes that divide some meshes and not others
DIM_SIZES = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 16)
MAX_ELEMS = 4096
DEVICE_ORDERS = ("identity", "reversed", "node split", "random")
_SPLITS = {4: [[4], [2, 2]], 8: [[8], [2, 4], [4, 2], [2, 2, 2]], 16: [[16], [4, 4], [2, 8]]}


def _n_devices() -> int:
    return len(jax.devices())


def _order(draw, kind: str, n: int) -> list[int]:
    ids = list(range(n))
    if kind == "reversed":
        return ids[::-1]
    if kind == "node split":  # two "nodes": even ids then odd ids, so every mesh axis crosses them
        return ids[0::2] + ids[1::2]
    if kind == "random":  # one draw whatever the size: a smaller mesh keeps the draws after it aligned
        seed = draw(st.integers(0, 2**16))
        return [int(i) for i in np.random.default_rng(seed).permutation(n)]
    return ids


@st.composite
def meshes(draw, max_devices: int = 8, max_axes: int = 3, *, axis_names: Optional[Sequence[str]] = None,
           min_devices: int = 2, abstract: bool = False, device_orders: Sequence[str] = DEVICE_ORDERS,
           sizes: Sequence[int] = AXIS_SIZES) -> Mesh:
    """A gp.Mesh of 1..``max_axes`` axes over at most ``max_devices`` devices.

    Axis sizes from ``sizes`` (2 and 4 first, then 1, 8, 3...), names ``axis_names`` (default
    x, y, z, w), device ids the first devices of ``jax.devices()`` in one of ``device_orders``:
    "identity", "reversed", "node split" (even ids then odd ids: every axis crosses two hosts'
    worth of devices) or a "random" permutation. ``abstract=True`` draws gp.Mesh.abstract
    meshes (no devices; ``max_devices`` may be thousands: plan-only checks). A quarter of the
    meshes have a size-1 axis. Shrinks towards one axis of 2 devices in device order.
    """
    names = tuple(axis_names) if axis_names is not None else AXIS_NAMES
    if not abstract:
        max_devices = min(max_devices, _n_devices())
    max_axes = min(max_axes, len(names))
    if max_devices < max(min_devices, 1) or max_axes < 1:
        few = not abstract and _n_devices() < max(min_devices, 1)
        raise MeshError(f"gpt.meshes: no mesh of {min_devices}..{max_devices} devices over {max_axes} axes " + (
            f"(jax has {_n_devices()} devices: set XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax is "
            f"imported, or use gpt.pytest_plugin)" if few else
            "(max_devices must be at least min_devices, and max_axes and the axis names at least 1)"))
    every = mesh_shapes(max_devices, max_axes, min_devices, tuple(sizes), abstract)
    # a quarter of the meshes have a size-1 axis (most shapes do: drawn uniformly they would
    # crowd out the rest); 0 first, so a failing example shrinks to a mesh without one
    ones = draw(st.integers(0, 3)) == 3
    pool = [t for t in every if (1 in t) == ones] or list(every)
    shape = draw(st.sampled_from(pool))
    total = math.prod(shape)
    n_axes = len(shape)
    axis_names_ = names[:n_axes]
    if abstract:
        return Mesh.abstract(tuple(shape), axis_names_)
    kind = draw(st.sampled_from(tuple(device_orders)))
    return Mesh(tuple(shape), axis_names_, devices=_order(draw, kind, total))


@functools.lru_cache(maxsize=64)
def mesh_shapes(max_devices: int, max_axes: int, min_devices: int = 2, sizes: Sequence[int] = AXIS_SIZES,
                big: bool = False) -> list[tuple[int, ...]]:
    """Every mesh shape of 1..max_axes axes with sizes from ``sizes`` (and 64..512 when ``big``)
    over min..max devices, simplest first: fewest devices, then fewest axes, then by ``sizes`` order."""
    pool = list(sizes) + ([s for s in (32, 64, 128, 256, 512) if s not in sizes] if big and max_devices >= 1024 else [])
    out = [()]
    found = []
    for _ in range(max_axes):
        out = [t + (n,) for t in out for n in pool if math.prod(t + (n,)) <= max_devices]
        found += [t for t in out if math.prod(t) >= min_devices]
    rank = {n: i for i, n in enumerate(pool)}
    found = sorted(set(found), key=lambda t: (math.prod(t), len(t), [rank[n] for n in t]))
    if not found:
        raise MeshError(f"gpt.meshes: no mesh shape of {min_devices}..{max_devices} devices over {max_axes} axes")
    return tuple(found)


def _free_axes(draw, mesh: Mesh, sub_axes: bool) -> list[str]:
    free = []
    # one draw per possible axis whatever the mesh, so that shrinking the mesh (an axis fewer, a
    # smaller size) keeps every later draw aligned: the shrunk example keeps its shapes and specs
    choices = [draw(st.integers(0, 3)) for _ in range(max(len(AXIS_NAMES), len(mesh.axis_names)))]
    for (a, n), choice in zip(zip(mesh.axis_names, mesh.shape), choices):
        options = _SPLITS.get(n, [[n]]) if sub_axes else [[n]]
        parts = options[choice % len(options)]
        pre = 1
        for size in parts:
            free.append(a if len(parts) == 1 else f"{a}:({pre}){size}")
            pre *= size
    return free


@st.composite
def shardings(draw, shape: Sequence[int], mesh: Mesh, *, sub_axes: bool = True, open_dims: bool = False,
              p_none: float = 0.35, max_axes_per_dim: int = 2):
    """A gp.P for a tensor of ``shape`` on ``mesh``: each mesh axis used at most once, a dim may
    take several axes (major first, any order), any dim may be sharded (size 1, uneven and
    empty dims included: they are padded). With ``sub_axes`` an axis of size 4 or 8 may first be
    split into sub-axes (``y:(1)2``, ``y:(2)2``) that dims take independently. With ``open_dims``
    a dim may be ``"?"`` (open: propagation chooses it; for gp.annotate, not for in_shardings).
    Shrinks towards the replicated spec."""
    if not isinstance(mesh, Mesh):
        raise SpecError(f"gpt.shardings(shape, mesh): mesh must be a gp.Mesh, got {type(mesh).__name__} {mesh!r:.40}")
    if any(isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0 for n in shape):
        raise SpecError(f"gpt.shardings(shape, mesh): shape must be non-negative ints, got {tuple(shape)!r}")
    free = _free_axes(draw, mesh, sub_axes)
    entries: list[Any] = []
    for _ in range(len(shape)):
        # the same draws per dim whatever the mesh (see _free_axes): open, replicated, how many
        # axes, per axis slot an index into the axes still free, and whether a multi-axis dim
        # takes them against mesh order (half the time; shrinks to mesh order)
        is_open = open_dims and draw(st.integers(0, 5)) == 5
        none = draw(st.integers(0, 99)) < int(p_none * 100)
        n = draw(st.integers(0, max_axes_per_dim))
        picks = [draw(st.integers(0, 7)) for _ in range(max_axes_per_dim)]
        against = draw(st.booleans())
        if is_open:
            entries.append(OPEN)
            continue
        n = min(n, len(free))
        if none or n == 0:
            entries.append(None)
            continue
        order = {a: i for i, a in enumerate(free)}  # free axes are in mesh order
        chosen = sorted((free.pop(k % len(free)) for k in picks[:n]), key=order.get, reverse=against)
        entries.append(chosen[0] if len(chosen) == 1 else tuple(chosen))
    from ..core.sharding import P

    return P(*entries)


@attrs.frozen
class Annotation:
    """A drawn annotation: ``spec`` (open dims allowed) at ``priority``; ``apply(x)`` is gp.annotate."""

    spec: Any
    priority: int = 0

    def apply(self, x):
        """``gp.annotate(x, spec, priority=priority)``."""
        return annotate(x, self.spec, priority=self.priority)

    def source(self, var: str) -> str:
        """The annotation as source text applied to variable ``var`` (for reproducer scripts)."""
        extra = f", priority={self.priority}" if self.priority else ""
        return f"gp.annotate({var}, {self.spec!r}{extra})"


@st.composite
def annotations(draw, shape: Sequence[int], mesh: Mesh, *, sub_axes: bool = True, max_priority: int = 2):
    """A gpt.Annotation for a value of ``shape``: a spec with open dims, and a priority 0..max."""
    spec = draw(shardings(shape, mesh, sub_axes=sub_axes, open_dims=True))
    return Annotation(spec, draw(st.integers(0, max_priority)))


def _leaf_struct(a) -> jax.ShapeDtypeStruct:
    if isinstance(a, jax.ShapeDtypeStruct):
        return a
    if hasattr(a, "shape") and hasattr(a, "dtype"):
        return jax.ShapeDtypeStruct(tuple(a.shape), a.dtype)
    x = np.asarray(a)
    return jax.ShapeDtypeStruct(x.shape, jnp.result_type(a))


@st.composite
def shapes_like(draw, args, *, sizes: Sequence[int] = DIM_SIZES, vary: Any = True, max_elems: int = MAX_ELEMS,
                min_size: int = 0):
    """jax.ShapeDtypeStructs with the ranks and dtypes of ``args`` (a pytree of arrays, numbers or
    ShapeDtypeStructs) and new sizes: 0, 1, primes, sizes that do not divide the mesh.

    Dims that have the same size in ``args`` get the same new size (so ``x @ w`` keeps its
    contraction dims equal); dims of size 1 stay 1 (they may be broadcasting), and so do sizes
    that an argument whose shape is kept (``vary``) also has. ``vary``: True,
    False, or the indices of the top-level arguments whose shapes are drawn (the others keep theirs).
    Shrinks towards the smallest sizes.
    """
    leaves, tree = jax.tree_util.tree_flatten(args)
    structs = [_leaf_struct(a) for a in leaves]
    varying = _varying_leaves(args, vary)
    fixed = {n for s, v in zip(structs, varying) if not v for n in s.shape}  # sizes a fixed argument ties
    symbols = sorted({n for s, v in zip(structs, varying) if v for n in s.shape if n != 1} - fixed)
    pool = [s for s in sizes if s >= min_size]
    new = {}
    for n in symbols:
        new[n] = draw(st.sampled_from(sorted(set(pool) | {n})))
    out = []
    for s, v in zip(structs, varying):
        shape = tuple(new.get(n, n) for n in s.shape) if v else s.shape
        out.append(jax.ShapeDtypeStruct(shape, s.dtype))
    total = sum(math.prod(s.shape) for s in out)
    if total > max_elems * max(1, len(out)):
        from hypothesis import reject

        reject()
    return jax.tree_util.tree_unflatten(tree, out)


def _varying_leaves(args, vary) -> list[bool]:
    if vary is True or vary is False:
        return [bool(vary)] * len(jax.tree_util.tree_leaves(args))
    if not isinstance(args, (tuple, list)):
        raise TypeError("gpt.shapes_like: vary=<indices> needs a tuple of arguments")
    keep = set(vary)
    return [i in keep for i, a in enumerate(args) for _ in jax.tree_util.tree_leaves(a)]


def special_values(dtype, near_max: bool = True) -> np.ndarray:
    """The values that break partitioners: 0, -0.0, +-inf, NaN, the smallest normal, and
    (``near_max``) finite values near the dtype's max; integers: 0, +-1, min, max; bools both."""
    d = np.dtype(dtype)
    if dtypes.is_bool(d):
        return np.array([False, True])
    if dtypes.is_int(d):
        ii = np.iinfo(d)
        return np.array([0, 1, ii.max, ii.min] + ([-1] if ii.min < 0 else []), d)
    fi = jnp.finfo(d)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, float(fi.tiny), -float(fi.tiny)]
    if near_max:
        vals += [float(fi.max), -float(fi.max), 0.75 * float(fi.max), -0.5 * float(fi.max)]
    with np.errstate(all="ignore"):
        return np.array(vals, np.float64).astype(d)


def values(dtype, *, specials: bool = True, near_max: bool = True):
    """Scalars of ``dtype`` (a numpy scalar each): ordinary values first (small integers, floats
    in [-2, 2]), then the special ones (``special_values``). Shrinks towards 0."""
    d = np.dtype(dtype)
    if not (dtypes.is_bool(d) or jnp.issubdtype(d, jnp.number)):
        raise ArgumentError(f"gpt.values: dtype {d} is not one JAX arrays hold (a bool, int, float or complex dtype)")
    if dtypes.is_bool(d):
        ordinary = st.booleans()
    elif dtypes.is_int(d):
        ii = np.iinfo(d)
        ordinary = st.integers(max(ii.min, -5), min(ii.max, 5))
    else:
        ordinary = st.floats(-2.0, 2.0, allow_nan=False, width=32)
    ordinary = ordinary.map(lambda v: np.asarray(v).astype(d)[()])
    if not specials:
        return ordinary
    sv = special_values(d, near_max)
    return st.one_of(ordinary, st.sampled_from(range(len(sv))).map(lambda i: sv[i]))


VALUE_MODES = ("plain", "special", "near_max")


def fill(shape, dtype, seed: int, mode: str = "plain") -> np.ndarray:
    """A deterministic array: uniform in [-2, 2] (integers in [-5, 5], bools at random) from
    ``seed``; mode "special" (or "near_max") replaces about 30% of it by ``special_values``
    (bit patterns kept: -0.0 stays -0.0)."""
    d = np.dtype(dtype)
    shape = tuple(int(n) for n in shape)
    rng = np.random.default_rng([seed, len(shape), math.prod(shape)])
    if dtypes.is_float(d):
        x = rng.uniform(-2.0, 2.0, size=shape).astype(d)
    elif dtypes.is_bool(d):
        x = rng.integers(0, 2, size=shape).astype(np.bool_)
    elif dtypes.is_int(d):
        x = rng.integers(-5 if not dtypes.is_unsigned(d) else 0, 6, size=shape).astype(d)
    else:
        raise TypeError(f"gpt.arrays: no values for dtype {d}")
    if mode == "plain" or x.size == 0:
        return x
    sv = special_values(d, near_max=mode == "near_max")
    mask = rng.random(x.shape) < 0.3
    x[mask] = sv[rng.integers(0, len(sv), int(mask.sum()))]
    return x


@st.composite
def arrays(draw, shape, dtype, *, modes: Sequence[str] = VALUE_MODES):
    """A numpy array of ``shape`` and ``dtype``: seeded values (``fill``), plain or with special
    values mixed in. Drawing a seed instead of every element keeps large arrays cheap; shrinks
    towards seed 0 and plain values."""
    d = np.dtype(dtype)
    mode = draw(st.sampled_from(tuple(modes) if not dtypes.is_bool(d) else ("plain",)))
    seed = draw(st.integers(0, 2**16))
    return fill(shape, d, seed, mode)
