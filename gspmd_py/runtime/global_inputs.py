"""Inputs of a multi-process run: global jax.Arrays built from what each process holds.

Two ways in, as ``jax.make_array_from_callback`` and ``jax.make_array_from_process_local_data``:

* ``f(x, w)``: every process passes the full global value (numpy, or any array it can
  address); only the shards of this process's devices are cut out and placed.
  A ``jax.Array`` that is already global (spread over processes) is used as it is, or
  re-laid out by a small jitted copy when its sharding or padding differs from the plan's.
* ``f.from_local(x_block, w)``: every process passes only its own block of each argument,
  the part of the global array that its devices hold under the argument's in_sharding
  (an argument not split across processes, or without an in_sharding, is passed whole).
  Global shapes are inferred
  as JAX does (blocks of equal size), or given with ``global_shapes=`` -- needed when a
  dim is uneven: a 7-row array split over 2 processes is 4 rows on process 0 and 3 on
  process 1 (shards of ceil(7/2) = 4, the tail padded).

    >>> import numpy as np, gspmd_py as gp
    >>> mesh = gp.Mesh((2, 4), ("x", "y"))
    >>> f = gp.spmd(lambda a: a * 2, mesh, in_shardings=gp.P("x", None))
    >>> f.from_local(np.ones((7, 3), np.float32)).shape      # one process holds every row
    (7, 3)
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding

from .distributed import held_shards
from ..core.errors import ShardingError, SpecError
from ..frontend.specs import leaf_aval, leaf_specs


def leaf_names(args: tuple) -> list[str]:
    """``arg0``, ``arg1['w']``... for the leaves of the positional arguments ``args``."""
    paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(tuple(args))[0]]
    out = []
    for p in paths:
        i, rest = p[0].idx, jax.tree_util.keystr(tuple(p[1:]))
        out.append(f"arg{i}{rest}")
    return out


def process_box(sharding: NamedSharding, shape: Sequence[int], what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The box ``[lo, hi)`` of a ``shape`` array that this process's shards cover.

    Raises SpecError when the shards are not one box (their union has holes), as
    ``jax.make_array_from_process_local_data`` requires of local data.
    """
    idx = list(sharding.addressable_devices_indices_map(tuple(shape)).values())
    if not idx:
        raise SpecError(f"{what}: this process holds no device of the mesh; every process must hold part of it")
    ranges = [[s.indices(n)[:2] for s, n in zip(i, shape)] for i in idx]
    lo, hi = [], []
    for d, n in enumerate(shape):
        spans = sorted({r[d] for r in ranges})
        a, b = spans[0][0], spans[-1][1]
        covered = sum(e - s for s, e in spans)
        if covered != b - a or any(spans[j][1] > spans[j + 1][0] for j in range(len(spans) - 1)):
            raise SpecError(f"{what}: this process's shards of dim {d} are not contiguous (rows {spans}); "
                            f"pass the full global array instead of local data")
        lo.append(a)
        hi.append(b)
    blocks = int(np.prod([len({r[d] for r in ranges}) for d in range(len(shape))], dtype=np.int64))
    if len({tuple(r) for r in ranges}) != blocks:
        raise SpecError(f"{what}: this process's shards do not form one block; pass the full global array instead")
    return tuple(lo), tuple(hi)


def block_to_global(block, lo: Sequence[int], logical: Sequence[int], padded: Sequence[int],
                    sharding: NamedSharding, dtype) -> jax.Array:
    """A global array of shape ``padded`` in ``sharding`` from ``block``, the part of the logical
    array (shape ``logical``) that starts at ``lo``; each addressable shard is cut from the
    block and zero-padded past the logical shape. Only this process's shards are placed."""
    xp = np if isinstance(block, np.ndarray) else jnp

    def shard(index):
        cut, pads = [], []
        for s, a, n, p in zip(index, lo, logical, padded):
            start, stop = s.indices(p)[:2]
            real_stop = min(stop, n)
            real_start = min(start, real_stop)
            cut.append(slice(real_start - a, real_stop - a))
            pads.append((0, (stop - start) - (real_stop - real_start)))
        piece = block[tuple(cut)]
        return xp.pad(piece, pads) if any(q for _, q in pads) else piece

    return jax.make_array_from_callback(tuple(padded), sharding, shard, dtype=dtype)


def _relayout(x: jax.Array, padded: tuple, sharding: NamedSharding, dtype, what: str) -> jax.Array:
    """A global array ``x`` padded to ``padded``, cast and laid out in ``sharding`` (one jitted copy)."""
    pads = tuple((0, p - n) for n, p in zip(x.shape, padded))
    try:
        return _pad_cast(x, pads, np.dtype(dtype), sharding)
    except ValueError as e:
        raise ShardingError(f"{what}: this global jax.Array cannot be moved onto the function's mesh "
                            f"({str(e).splitlines()[0][:200]})") from None


def _pad_cast_impl(x, pads, dtype, sharding):
    y = jnp.pad(x.astype(dtype), pads) if any(q for _, q in pads) else x.astype(dtype)
    return jax.lax.with_sharding_constraint(y, sharding)


_pad_cast = jax.jit(_pad_cast_impl, static_argnums=(1, 2, 3))


def place_global(plan, leaves: list) -> list:
    """Multi-process ``Boundary.place``: each leaf as a global array in the plan's input sharding.

    A leaf this process can address fully (numpy, a scalar, a local jax.Array) is the full
    global value, the same on every process; a jax.Array spread over processes is global.
    """
    from ..core.errors import MeshError

    if not plan.jax_mesh.local_devices:
        raise MeshError(f"process {jax.process_index()} holds no device of {plan.mesh}: on a multi-process run "
                        f"every process must hold devices of the mesh")
    out = []
    names = plan.in_names
    for x, v, shp, spec, name in zip(leaves, plan.graph.inputs, plan.padded_in_shapes, plan.in_specs, names):
        target = NamedSharding(plan.jax_mesh, spec)
        what = f"argument {name} {v.type_str}"
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if tuple(x.shape) == tuple(shp) and x.dtype == v.dtype and x.sharding.is_equivalent_to(target, x.ndim):
                out.append(x)
            else:
                out.append(_relayout(x, tuple(shp), target, v.dtype, what))
            continue
        block = x if isinstance(x, jax.Array) else np.asarray(x, dtype=np.dtype(v.dtype))
        if isinstance(block, jax.Array) and block.dtype != v.dtype:
            block = block.astype(v.dtype)
        out.append(block_to_global(block, (0,) * len(shp), v.shape, shp, target, v.dtype))
    return out


def _global_shape_guess(mesh, spec, local_shape: tuple, what: str) -> tuple:
    """The global shape of a local block under ``spec``, assuming equal blocks (as JAX infers)."""
    if spec is None:
        return local_shape
    return tuple(n * k // (b - a) for n, (a, b, k) in zip(local_shape, held_shards(mesh, spec, len(local_shape), what)))


def _global_shapes(global_shapes, args: tuple, n: int) -> list:
    """One global shape (or None: infer) per leaf of ``args``."""
    if global_shapes is None:
        return [None] * n
    is_leaf = lambda s: s is None or isinstance(s, jax.ShapeDtypeStruct) or (
        isinstance(s, tuple) and all(isinstance(i, (int, np.integer)) for i in s))
    leaves, tree = jax.tree_util.tree_flatten(global_shapes, is_leaf=is_leaf)
    if tree.num_leaves != n:
        raise SpecError(f"from_local: global_shapes has {tree.num_leaves} entries for {n} argument leaves "
                        f"(give a shape tuple, a jax.ShapeDtypeStruct or None per leaf, shaped like the arguments)")
    return [None if s is None else tuple(int(i) for i in getattr(s, "shape", s)) for s in leaves]


def from_local(spmd, local_args: tuple, global_shapes=None):
    """Run ``spmd`` on arguments given as this process's blocks (see the module docstring)."""
    leaves, tree = jax.tree_util.tree_flatten(tuple(local_args))
    names = leaf_names(tuple(local_args))
    specs = [ls.spec for ls in leaf_specs(spmd.in_shardings, tuple(local_args), "in_shardings")]
    given = _global_shapes(global_shapes, tuple(local_args), len(leaves))
    avals = []
    for i, x in enumerate(leaves):
        a = leaf_aval(x, i)
        what = f"from_local: argument {names[i]}"
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            avals.append(a)  # already global (e.g. the previous step's output): used as it is
            continue
        if specs[i] is None:  # layout left to propagation: the argument is passed whole
            if given[i] is not None and tuple(given[i]) != tuple(a.shape):
                raise SpecError(f"{what} has no in_sharding, so every process passes it whole: its global "
                                f"shape is {tuple(a.shape)}, not {tuple(given[i])}")
            avals.append(a)
            continue
        shape = given[i] if given[i] is not None else _global_shape_guess(spmd.mesh, specs[i], tuple(a.shape), what)
        if len(shape) != len(a.shape):
            raise SpecError(f"{what}: global shape {shape} has rank {len(shape)}, its local data rank {len(a.shape)}")
        avals.append(jax.ShapeDtypeStruct(shape, a.dtype))
    plan = spmd.plan(*jax.tree_util.tree_unflatten(tree, avals))
    plan.lower().check_same_program()
    arrays = []
    for i, (x, v, shp, spec) in enumerate(zip(leaves, plan.graph.inputs, plan.padded_in_shapes, plan.in_specs)):
        what = f"from_local: argument {names[i]} {v.type_str}"
        target = NamedSharding(plan.jax_mesh, spec)
        if (isinstance(x, jax.Array) and not x.is_fully_addressable) or specs[i] is None:
            arrays.append(x)  # global, or whole: plan.run places it like f(...) does
            continue
        lo, hi = process_box(target, shp, what)
        expect = tuple(max(0, min(h, n) - l) for l, h, n in zip(lo, hi, v.shape))
        got = tuple(np.shape(x))
        if got != expect:
            d = next(j for j in range(len(got)) if got[j] != expect[j])
            raise SpecError(f"{what}: this process (index {jax.process_index()}) holds indices [{lo[d]}, "
                            f"{min(hi[d], v.shape[d])}) of dim {d} (in_sharding {specs[i]}), so its local data needs "
                            f"{expect[d]} there, got {got[d]} (gp.distributed.local_slices gives the block; "
                            f"pass global_shapes= for uneven dims)")
        block = x if isinstance(x, jax.Array) else np.asarray(x, dtype=np.dtype(v.dtype))
        arrays.append(block_to_global(block, lo, v.shape, shp, target, v.dtype))
    return plan.run(arrays)
