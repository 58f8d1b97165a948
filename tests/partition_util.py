"""Shared helpers for the partitioner's correctness tests (tests/test_partition_*.py).

Every test compares a partitioned run (gp.spmd) with the same function run plainly:

    check(fn, mesh, args, in_specs=(P("x", None), None), out_specs=None)

Strategies draw meshes (the four 8-device meshes below), shapes with dims that do not
divide the shard counts, and random specs for a shape on a mesh.
"""
from __future__ import annotations

import functools

import jax
import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

import gspmd_py as gp

MESH_SHAPES = [((8,), ("x",)), ((2, 4), ("x", "y")), ((4, 2), ("x", "y")), ((2, 2, 2), ("x", "y", "z"))]

# dims that divide nothing (7, 13, 5), divide some meshes (6, 12, 30), size-1 dims, and even ones
DIMS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 13, 16, 30)
SMALL_DIMS = (1, 2, 3, 4, 5, 7, 8, 13)


@functools.lru_cache(maxsize=None)
def mesh_of(i: int) -> gp.Mesh:
    shape, names = MESH_SHAPES[i]
    return gp.Mesh(shape, names)


def meshes() -> st.SearchStrategy[gp.Mesh]:
    return st.integers(0, len(MESH_SHAPES) - 1).map(mesh_of)


def shapes(rank_min: int = 1, rank_max: int = 3, dims=DIMS) -> st.SearchStrategy[tuple[int, ...]]:
    return st.lists(st.sampled_from(dims), min_size=rank_min, max_size=rank_max).map(tuple)


_SPLITS = {1: [[1]], 2: [[2]], 4: [[4], [2, 2]], 8: [[8], [2, 4], [4, 2], [2, 2, 2]]}


@st.composite
def spec_for(draw, mesh: gp.Mesh, rank: int, *, sub_axes: bool = False, p_none: float = 0.35):
    """A random gp.P for a tensor of ``rank`` on ``mesh``: each mesh axis used at most once,
    a dim may take several axes (major first, any order). With ``sub_axes`` an axis may
    first be split into sub-axes (Shardy's ``y:(1)2``, ``y:(2)2``) which dims then take
    independently, e.g. ``P("y:(2)2", ("x", "y:(1)2"))``."""
    free = []
    for a, n in zip(mesh.axis_names, mesh.shape):
        parts = draw(st.sampled_from(_SPLITS[n])) if sub_axes and n in _SPLITS else [n]
        if len(parts) == 1:
            free.append(a)
            continue
        pre = 1
        for size in parts:
            free.append(f"{a}:({pre}){size}")
            pre *= size
    entries = []
    for _ in range(rank):
        if not free or draw(st.floats(0, 1)) < p_none:
            entries.append(None)
            continue
        n = draw(st.integers(1, min(2, len(free))))
        chosen = list(draw(st.permutations(free))[:n])
        for a in chosen:
            free.remove(a)
        entries.append(chosen[0] if len(chosen) == 1 else tuple(chosen))
    return gp.P(*entries)


def maybe(strategy, p_none: float = 0.3):
    """``strategy`` or None (leave the sharding to propagation)."""
    return st.one_of(st.just(None), strategy) if p_none else strategy


def rand(shape, dtype=np.float32, seed: int = 0, *, low=-2.0, high=2.0):
    rng = np.random.default_rng(seed + 7919 * len(shape) + int(np.prod(shape, dtype=np.int64)))
    if np.issubdtype(np.dtype(dtype), np.floating):
        return rng.uniform(low, high, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.integers(int(low) - 3, int(high) + 4, size=shape).astype(dtype)


def assert_same(got, want, *, rtol=1e-5, atol=1e-5, what="output"):
    got_l, tg = jax.tree_util.tree_flatten(got)
    want_l, tw = jax.tree_util.tree_flatten(want)
    assert tg == tw, f"{what}: tree {tg} != {tw}"
    for i, (g, w) in enumerate(zip(got_l, want_l)):
        w = np.asarray(w)
        assert isinstance(g, jax.Array), f"{what}[{i}] is {type(g).__name__}, not a jax.Array"
        g = np.asarray(g)
        assert g.shape == w.shape, f"{what}[{i}]: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{what}[{i}]: dtype {g.dtype} != {w.dtype}"
        if np.issubdtype(w.dtype, np.inexact):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{what}[{i}]")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"{what}[{i}]")


def check(fn, mesh, args, in_specs=None, out_specs=None, *, rtol=1e-5, atol=1e-5):
    """gp.spmd(fn) on ``mesh`` gives what ``fn`` gives plainly; returns the plan."""
    f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=out_specs)
    want = fn(*args)
    got = f(*args)
    assert_same(got, want, rtol=rtol, atol=atol)
    return f.plan(*args)


def examples(n: int):
    """``@settings`` with ``n`` examples under the CI profile; the fuzz profile keeps its own count."""
    cur = settings.default.max_examples
    return settings(max_examples=cur if cur > 100 else n)


def kinds(plan) -> list[str]:
    return [c.kind for c in plan.collectives]


def f32(*shape):
    """A float32 jax.ShapeDtypeStruct of ``shape`` (plan without arrays)."""
    return jax.ShapeDtypeStruct(shape, np.float32)
