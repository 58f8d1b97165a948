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
from gspmd_py.core import dtypes

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
    if dtypes.is_float(dtype):
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
        if dtypes.is_inexact(w.dtype):  # bfloat16 / float8 too (NumPy does not call them inexact)
            np.testing.assert_allclose(g.astype(np.float64) if dtypes.is_float(w.dtype) else g,
                                       w.astype(np.float64) if dtypes.is_float(w.dtype) else w,
                                       rtol=rtol, atol=atol, err_msg=f"{what}[{i}]")
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


# -- jax.jit with the same shardings, and bitwise comparison ---------------------------------------

def _bits_mesh(mesh: gp.Mesh):
    """A jax Mesh with every axis of size 2^k split into k axes of size 2 ("y" of size 4 ->
    "y#0", "y#1", major first), so any sub-axis of gp's (``y:(2)2`` -> "y#1") has a name;
    the device order is the gp mesh's (row-major splitting keeps every device in place)."""
    names, sizes = [], []
    for a, n in zip(mesh.axis_names, mesh.shape):
        k = int(n).bit_length() - 1
        assert 1 << k == n, f"mesh axis {a} of size {n} is not a power of 2"
        names += [f"{a}#{i}" for i in range(k)]
        sizes += [2] * k
    return jax.sharding.Mesh(mesh.jax_devices().reshape(sizes), tuple(names))


def jax_spec(mesh: gp.Mesh, spec, rank: int):
    """gp.P (sub-axes allowed) -> jax PartitionSpec over ``_bits_mesh(mesh)``."""
    from jax.sharding import PartitionSpec as JP

    if spec is None:
        return JP(*([None] * rank))
    out = []
    for e in list(spec) + [None] * (rank - len(spec)):
        if e is None:
            out.append(None)
            continue
        names = []
        for a in (e if isinstance(e, tuple) else (e,)):
            r = mesh.ref(a)
            start = r.pre.bit_length() - 1
            names += [f"{r.name}#{start + i}" for i in range(r.size.bit_length() - 1)]
        out.append(tuple(names) if names else None)
    return JP(*out)


def jit_sharded(fn, mesh: gp.Mesh, args, in_specs=None, out_specs=None):
    """``fn`` under jax.jit with the same input (and output) shardings, placed by
    with_sharding_constraint so that uneven dims are allowed: XLA's own partitioned result."""
    from jax.sharding import NamedSharding

    jm = _bits_mesh(mesh)
    leaves = list(args)
    ins = list(in_specs) if isinstance(in_specs, (tuple, list)) else [in_specs] * len(leaves)

    def constrained(*xs):
        xs = [x if s is None else jax.lax.with_sharding_constraint(x, NamedSharding(jm, jax_spec(mesh, s, x.ndim)))
              for x, s in zip(xs, ins)]
        out = fn(*xs)
        if out_specs is None:
            return out
        flat, tree = jax.tree_util.tree_flatten(out)
        outs = list(out_specs) if isinstance(out_specs, (tuple, list)) else [out_specs] * len(flat)
        flat = [y if s is None else jax.lax.with_sharding_constraint(y, NamedSharding(jm, jax_spec(mesh, s, y.ndim)))
                for y, s in zip(flat, outs)]
        return jax.tree_util.tree_unflatten(tree, flat)

    return jax.jit(constrained)(*leaves)


def bitwise_diff(got, want) -> str:
    """'' if got and want are the same bits as values: same dtype and shape, NaN where NaN,
    the same sign on zeros and infinities; else a short description of the first difference."""
    g, w = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}"
    if not dtypes.is_float(w.dtype):
        bad = g != w
    else:
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        bad = ~((g64 == w64) & (np.signbit(g64) == np.signbit(w64)) | (np.isnan(g64) & np.isnan(w64)))
    if not bad.any():
        return ""
    i = tuple(int(v[0]) for v in np.nonzero(bad))
    return f"{int(bad.sum())} of {bad.size} differ, first at {i}: {g[i]!r} != {w[i]!r}"


def assert_bitwise(got, want, what="output"):
    gl, gt = jax.tree_util.tree_flatten(got)
    wl, wt = jax.tree_util.tree_flatten(want)
    assert gt == wt, f"{what}: tree {gt} != {wt}"
    for i, (g, w) in enumerate(zip(gl, wl)):
        d = bitwise_diff(g, w)
        assert not d, f"{what}[{i}]: {d}"


# -- dtypes and special values for the random-program fuzz ------------------------------------------

FUZZ_DTYPES = ("float32", "bfloat16", "float16", "int32", "int8", "bool")


def np_dtype(name: str) -> np.dtype:
    return np.dtype(jax.numpy.bfloat16) if name == "bfloat16" else np.dtype(name)


def special_values(dtype, huge: bool = False) -> np.ndarray:
    """The values that break partitioners: 0, -0.0, +-inf, NaN, the smallest normal, and
    (``huge``) finite values near the dtype's max; integers: 0, +-1, min, max."""
    d = np.dtype(dtype)
    if dtypes.is_bool(d):
        return np.array([False, True])
    if dtypes.is_int(d):
        ii = np.iinfo(d)
        return np.array([0, 1, ii.max, ii.min] + ([-1] if ii.min < 0 else []), d)
    fi = jax.numpy.finfo(d)
    vals = [0.0, -0.0, np.inf, -np.inf, np.nan, float(fi.tiny), -float(fi.tiny)]
    if huge:
        vals += [float(fi.max), -float(fi.max), 0.75 * float(fi.max), -0.5 * float(fi.max)]
    with np.errstate(all="ignore"):
        return np.array(vals, np.float64).astype(d)


EXACT, EXACT_UP_TO_ZERO_SIGN, INEXACT = 2, 1, 0


def fuzz_diff(got, want, exactness: int, tol: float, scale: float) -> tuple[str, float]:
    """('' or what differs, the worst finite error in units of tol * (|want| + scale)).

    EXACT: the same bits as values (NaN == NaN, the signs of zeros and infinities).
    EXACT_UP_TO_ZERO_SIGN: the same, except that a zero may have either sign: max/min over
    -0.0 and +0.0 (IEEE 754 leaves that choice open and XLA's CPU max returns the operand
    by position, so a reduction in another order picks the other zero).
    INEXACT (float arithmetic rounded in another order): NaN where NaN, infinities equal
    with their signs, finite values within tol * (|want| + scale), ``scale`` the magnitude
    of the values the output was computed from (the bound of a reordered sum); the sign
    of a zero is not compared (a zero from arithmetic is +0.0 or -0.0 by the order of
    the operations that cancelled or underflowed to it).
    """
    g, w = np.atleast_1d(np.asarray(got)), np.atleast_1d(np.asarray(want))
    if g.dtype != w.dtype or g.shape != w.shape:
        return f"{g.dtype}{list(g.shape)} != {w.dtype}{list(w.shape)}", 0.0
    if not dtypes.is_float(w.dtype) or exactness == EXACT:
        return bitwise_diff(g, w), 0.0
    g64, w64 = g.astype(np.float64), w.astype(np.float64)
    gn, wn = np.isnan(g64), np.isnan(w64)
    fin = np.isfinite(g64) & np.isfinite(w64)
    bad = (gn != wn) | (~fin & ~gn & ~wn & (g64 != w64))
    worst = 0.0
    with np.errstate(all="ignore"):
        if exactness == EXACT_UP_TO_ZERO_SIGN:
            bad |= fin & (g64 != w64)
        elif fin.any():
            err = np.abs(g64 - w64) / (tol * (np.abs(w64) + scale))
            err = np.where(fin, err, 0.0)
            worst = float(err.max())
            bad |= err > 1
    if not bad.any():
        return "", worst
    i = tuple(int(v[0]) for v in np.nonzero(bad))
    return f"{int(bad.sum())} of {bad.size} differ, first at {i}: {g[i]!r} != {w[i]!r}", worst


def report_problems(plan) -> list[str]:
    """Where ``plan.report()`` (its source data: every value's recorded sharding) claims a
    layout the traced per-device program does not hold, loop and branch bodies included:
    the local shape of the program's buffer, its mesh axes per dim, and its partial state."""
    from gspmd_py.views import report

    problems = []
    held = plan.diagnostics.held
    walked = list(plan.graph.inputs)
    for op in plan.graph.walk():
        walked += op.outputs
        for region in op.regions:
            walked += region.inputs
    for v in walked:
        h = held.get(v.id)
        if h is None:
            problems.append(f"%{v.id} {v.type_str}: the program never held it")
            continue
        dims = plan.fine_dims(v)
        local = tuple(plan.local_shape(v.shape, dims))
        if h.local_shape != local or h.dims != dims:
            problems.append(f"%{v.id} {v.type_str}: recorded {plan.sharding(v).shardy()} (local {list(local)}), "
                            f"the program holds {h.dims} (local {list(h.local_shape)})")
    for r in report.rows(plan):
        h = held.get(r.value_id)
        if h is None:
            continue
        if r.local != "[" + ",".join(map(str, h.local_shape)) + "]":
            problems.append(f"report row {r.label}: local {r.local}, held {list(h.local_shape)}")
        if ("partial-" in r.sharding) != (h.partial is not None):
            problems.append(f"report row {r.label}: {r.sharding}, held partial {h.partial}")
    return problems
