"""Index math (partitioner/index_math.py, partitioner/halo_tables.py, core/fine_mesh.py's device
groups): each table == an independent brute-force
reference (per-row / per-device loops or a transpose of the device grid), on hypothesis
shapes that do not divide evenly, empty dims, size-1 shards and meshes, the meshes (8,),
(2, 4), (4, 2), (2, 2, 2) and abstract ones of 8,192 and 65,536 devices."""
from __future__ import annotations

import doctest
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, strategies as st

from gspmd_py.core import fine_mesh
from gspmd_py.partitioner import halo_tables
from gspmd_py.partitioner import index_math as im

# ----------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------


def _eq_dict(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == np.int64 and b[key].dtype == np.int64, key
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        else:
            assert type(a[key]) is int and type(b[key]) is int and a[key] == b[key], key


def _brute_n_out(n_in, window, stride, dilation, pad_lo, pad_hi, ld) -> int:
    """Count output rows o >= 0 whose whole window fits in the padded dilated input."""
    dilated = 0 if n_in == 0 else (n_in - 1) * ld + 1
    total = pad_lo + dilated + pad_hi
    o = 0
    while o * stride + (window - 1) * dilation <= total - 1:
        o += 1
    return o


def _rows_read(o, n_in, window, stride, dilation, pad_lo, ld) -> list[int]:
    rows = []
    for j in range(window):
        q = o * stride + j * dilation - pad_lo
        if q % ld == 0 and 0 <= q // ld < n_in:
            rows.append(q // ld)
    return rows


window_args = st.tuples(
    st.integers(0, 40),   # n_in
    st.integers(1, 12),   # k
    st.integers(1, 9),    # window (often > n_in)
    st.integers(1, 4),    # stride
    st.integers(1, 3),    # dilation
    st.integers(-3, 6),   # pad_lo
    st.integers(-3, 6),   # pad_hi
    st.integers(1, 3),    # lhs_dilation
)


# ----------------------------------------------------------------------------------------
# shard_bounds
# ----------------------------------------------------------------------------------------

@given(st.integers(0, 10_000), st.integers(1, 3000))
def test_shard_bounds_formula(n, k):
    start, stop = im.shard_bounds(n, k)
    c = -(-n // k)
    assert start.dtype == stop.dtype == np.int64 and start.shape == stop.shape == (k,)
    assert start.tolist() == [min(i * c, n) for i in range(k)]
    assert stop.tolist() == [min((i + 1) * c, n) for i in range(k)]


@given(st.integers(0, 60), st.integers(1, 70))
def test_shard_bounds_brute(n, k):
    c = -(-n // k)
    start, stop = im.shard_bounds(n, k)
    owner = np.full(n, -1)
    for i in range(k):
        assert start[i] <= stop[i] and stop[i] - start[i] <= c
        owner[start[i]:stop[i]] += i + 1
    np.testing.assert_array_equal(owner, np.arange(n) // max(c, 1))  # each row owned exactly once


# ----------------------------------------------------------------------------------------
# window_halos
# ----------------------------------------------------------------------------------------

@given(window_args)
def test_window_halos_blocking_does_not_change_the_result(args):
    _eq_dict(im.window_halos(*args), im.window_halos(*args, block_elems=1))
    _eq_dict(im.window_halos(*args), im.window_halos(*args, block_elems=7))


def _brute_read_ranges(n_in, k, window, stride, dilation, pad_lo, pad_hi, ld):
    """Per shard (in_lo, in_hi) by enumerating every (output row, window element) pair."""
    n_out = _brute_n_out(n_in, window, stride, dilation, pad_lo, pad_hi, ld)
    c_out, c_in = -(-n_out // k), -(-n_in // k)
    o = np.arange(n_out)[:, None]
    q = o * stride + np.arange(window)[None, :] * dilation - pad_lo
    real = (q % ld == 0) & (q >= 0) & (q // ld < n_in)
    row = np.where(real, q // ld, -1)
    lo, hi = [], []
    for i in range(k):
        o0, o1 = min(i * c_out, n_out), min((i + 1) * c_out, n_out)
        rows = row[o0:o1][real[o0:o1]]
        s0 = min(i * c_in, n_in)
        lo.append(int(rows.min()) if rows.size else s0)
        hi.append(int(rows.max()) + 1 if rows.size else s0)
    return n_out, lo, hi


@pytest.mark.slow
@pytest.mark.parametrize("k", [8192, 65536])
@pytest.mark.parametrize("geom", [dict(window=5, pad_lo=2, pad_hi=2),  # SAME conv: every shard fast
                                  dict(window=7, stride=2, dilation=2, pad_lo=3, pad_hi=2, lhs_dilation=2),
                                  dict(window=3, stride=3, pad_lo=-1, pad_hi=5, lhs_dilation=3)])
def test_window_halos_large_meshes(k, geom):
    """All devices of an abstract 8,192- / 65,536-device mesh on one dim (uneven: +3 rows)."""
    n_in = 2 * k + 3
    args = (n_in, k, geom["window"], geom.get("stride", 1), geom.get("dilation", 1), geom["pad_lo"],
            geom["pad_hi"], geom.get("lhs_dilation", 1))
    h = im.window_halos(*args)
    n_out, lo, hi = _brute_read_ranges(*args)
    assert h["n_out"] == n_out
    assert h["in_lo"].tolist() == lo and h["in_hi"].tolist() == hi


@given(window_args)
def test_window_halos_brute_force(args):
    n_in, k, window, stride, dilation, pad_lo, pad_hi, ld = args
    h = im.window_halos(*args)
    n_out = _brute_n_out(n_in, window, stride, dilation, pad_lo, pad_hi, ld)
    assert h["n_out"] == n_out
    c_out, c_in = -(-n_out // k), -(-n_in // k)
    for i in range(k):
        o0, o1 = min(i * c_out, n_out), min((i + 1) * c_out, n_out)
        s0, s1 = min(i * c_in, n_in), min((i + 1) * c_in, n_in)
        assert (h["out_start"][i], h["out_stop"][i]) == (o0, o1)
        assert (h["shard_in_start"][i], h["shard_in_stop"][i]) == (s0, s1)
        assert h["window_start"][i] == o0 * stride - pad_lo
        rows = [r for o in range(o0, o1) for r in _rows_read(o, n_in, window, stride, dilation,
                                                             pad_lo, ld)]
        lo, hi = (min(rows), max(rows) + 1) if rows else (s0, s0)
        assert (h["in_lo"][i], h["in_hi"][i]) == (lo, hi), (i, rows)
        assert h["left_halo"][i] == max(0, s0 - lo)
        assert h["right_halo"][i] == max(0, hi - s1)
    assert h["max_left"] == int(h["left_halo"].max())
    assert h["max_right"] == int(h["right_halo"].max())


@given(window_args, st.integers(0, 2**31 - 1))
def test_window_halos_local_compute(args, seed):
    """A shard holding rows [own - left_halo, own + right_halo) computes its outputs locally
    with the padding derived from window_start (as documented); compare to the global op."""
    n_in, k, window, stride, dilation, pad_lo, pad_hi, ld = args
    x = np.random.default_rng(seed).integers(1, 100, size=n_in)

    def windowed_sum(xs, n_out, plo):
        out = np.zeros(n_out, dtype=np.int64)
        for o in range(n_out):
            for r in _rows_read(o, xs.size, window, stride, dilation, plo, ld):
                out[o] += xs[r]
        return out

    h = im.window_halos(*args)
    full = windowed_sum(x, h["n_out"], pad_lo)
    for i in range(k):
        o0, o1 = int(h["out_start"][i]), int(h["out_stop"][i])
        s = int(h["shard_in_start"][i] - h["left_halo"][i])
        e = int(h["shard_in_stop"][i] + h["right_halo"][i])
        local_pad_lo = s * ld - int(h["window_start"][i])
        np.testing.assert_array_equal(windowed_sum(x[s:e], o1 - o0, local_pad_lo), full[o0:o1])


@given(st.integers(1, 30), st.integers(1, 6), st.integers(1, 3), st.integers(1, 3),
       st.integers(0, 4), st.integers(0, 4), st.integers(1, 3))
def test_window_halos_n_out_matches_jax(n_in, window, stride, dilation, pad_lo, pad_hi, ld):
    import jax
    import jax.numpy as jnp
    from jax import lax

    x = jax.ShapeDtypeStruct((1, 1, n_in), jnp.float32)
    w = jax.ShapeDtypeStruct((1, 1, window), jnp.float32)
    try:
        shape = jax.eval_shape(lambda a, b: lax.conv_general_dilated(
            a, b, (stride,), [(pad_lo, pad_hi)], lhs_dilation=(ld,), rhs_dilation=(dilation,)),
            x, w).shape
    except Exception:  # window larger than the padded input: jax rejects; we say n_out = 0
        assert im.window_halos(n_in, 1, window, stride, dilation, pad_lo, pad_hi, ld)["n_out"] == 0
        return
    assert im.window_halos(n_in, 3, window, stride, dilation, pad_lo, pad_hi, ld)["n_out"] == shape[2]


def test_window_halos_examples():
    h = im.window_halos(10, 2, window=3, pad_lo=1, pad_hi=1)
    assert h["in_lo"].tolist() == [0, 4] and h["in_hi"].tolist() == [6, 10]
    # k > n: trailing shards empty, no halos there
    h = im.window_halos(3, 8, window=2)
    assert h["n_out"] == 2 and h["out_stop"].tolist() == [1, 2, 2, 2, 2, 2, 2, 2]
    assert h["shard_in_start"].tolist() == [0, 1, 2, 3, 3, 3, 3, 3]
    assert h["in_lo"].tolist() == [0, 1, 2, 3, 3, 3, 3, 3]   # empty: in_lo = in_hi = shard_in_start
    assert h["in_hi"].tolist() == [2, 3, 2, 3, 3, 3, 3, 3]
    assert h["right_halo"].tolist() == [1, 1, 0, 0, 0, 0, 0, 0] and h["max_left"] == 0
    # window larger than the input: no outputs
    h = im.window_halos(4, 2, window=7)
    assert h["n_out"] == 0 and h["max_left"] == h["max_right"] == 0
    with pytest.raises(ValueError):
        im.window_halos(4, 2, window=0)
    with pytest.raises(ValueError):
        im.window_halos(4, 0, window=1)


# ----------------------------------------------------------------------------------------
# device_groups
# ----------------------------------------------------------------------------------------

@st.composite
def mesh_and_axes(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    axes = tuple(draw(st.permutations(range(len(shape))))[: draw(st.integers(0, len(shape)))])
    return shape, axes


def _brute_groups(shape, axes):
    nd = len(shape)
    if nd == 0:
        return np.zeros((1, 1), dtype=np.int64)
    coords = np.indices(shape).reshape(nd, -1)  # column t = coordinates of device t
    rest = [d for d in range(nd) if d not in axes]
    n_dev = int(np.prod(shape, dtype=np.int64))
    gsize = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    out = np.full((n_dev // gsize, gsize), -1, dtype=np.int64)
    for dev in range(n_dev):
        g = np.ravel_multi_index(tuple(coords[d, dev] for d in rest), tuple(shape[d] for d in rest))
        h = np.ravel_multi_index(tuple(coords[a, dev] for a in axes), tuple(shape[a] for a in axes))
        out[g, h] = dev
    return out


def _transposed_groups(shape, axes):
    """The groups as a transpose of the row-major device grid (other dims first, then axes)."""
    rest = [d for d in range(len(shape)) if d not in axes]
    grid = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)
    gsize = int(np.prod([shape[a] for a in axes], dtype=np.int64))
    return grid.transpose(rest + list(axes)).reshape(-1, gsize)


@given(mesh_and_axes())
def test_device_groups(ma):
    shape, axes = ma
    g = fine_mesh.device_groups(shape, axes)
    assert g.dtype == np.int64
    np.testing.assert_array_equal(g, _brute_groups(shape, axes))


MESHES = [(8,), (2, 4), (4, 2), (2, 2, 2)]


@pytest.mark.slow
@pytest.mark.parametrize("shape", MESHES + [(64, 128), (256, 256), (16, 64, 64)])
def test_device_groups_every_axis_subset(shape):
    """Every ordered subset of axes of the test meshes and of abstract 8,192- / 65,536-device ones."""
    import itertools

    for r in range(len(shape) + 1):
        for axes in itertools.permutations(range(len(shape)), r):
            g = fine_mesh.device_groups(shape, axes)
            np.testing.assert_array_equal(g, _transposed_groups(shape, list(axes)), err_msg=str(axes))
            if len(shape) < 3 or max(shape) <= 2:
                np.testing.assert_array_equal(g, _brute_groups(shape, axes), err_msg=str(axes))


def test_device_groups_errors_and_negative_axes():
    np.testing.assert_array_equal(fine_mesh.device_groups((2, 4), (-1,)), fine_mesh.device_groups((2, 4), (1,)))
    with pytest.raises(ValueError):
        fine_mesh.device_groups((2, 4), (1, 1))
    with pytest.raises(ValueError):
        fine_mesh.device_groups((2, 4), (2,))
    with pytest.raises(ValueError):
        fine_mesh.device_groups((2, 0), (0,))


# ----------------------------------------------------------------------------------------
# module-level properties
# ----------------------------------------------------------------------------------------

def test_docstring_examples():
    results = [doctest.testmod(m, raise_on_error=False) for m in (im, halo_tables, fine_mesh)]
    assert all(r.failed == 0 for r in results) and sum(r.attempted for r in results) > 6


@pytest.mark.slow
def test_import_and_index_math_do_not_load_numba():
    """The tables are NumPy only (Numba's 0.5 s load never paid back: index_math's header)."""
    code = ("import sys, numpy as np, gspmd_py; from gspmd_py.partitioner import index_math as m, halo_tables as h; "
            "from gspmd_py.core.fine_mesh import device_groups; "
            "m.shard_bounds(5, 65536); m.window_halos(2 * 65536 + 3, 65536, 7, 2, 2, 3, 2, 2); "
            "device_groups((256, 256), (1,)); a = np.arange(65536) * 4 - 2; "
            "h.fetch_rounds(np.maximum(a, 0), np.minimum(a + 8, 4 * 65536), a, 4); "
            "assert 'numba' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_planning_a_spatial_conv_on_8_devices_does_not_load_numba():
    code = ("import os; os.environ['XLA_FLAGS'] = '--xla_force_host_platform_device_count=8'; "
            "import sys, numpy as np, jax, gspmd_py as gp; from jax import lax; "
            "f = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), 'SAME', dimension_numbers=('NHWC', 'HWIO', 'NHWC')); "
            "S = jax.ShapeDtypeStruct; "
            "p = gp.spmd(f, gp.Mesh((2, 4), ('x', 'y')), in_shardings=(gp.P('x', 'y', None, None), None))"
            ".plan(S((4, 32, 32, 8), np.float32), S((3, 3, 8, 8), np.float32)); "
            "assert any(c.kind == 'collective-permute' for c in p.collectives), p.collectives; "
            "assert 'numba' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


# ----------------------------------------------------------------------------------------
# fetch_rounds (the halo planner's transfers)
# ----------------------------------------------------------------------------------------

def _brute_rounds(lo, hi, a, c, holder):
    """The halo planner's former per-shard loops: one piece per (device, shard) overlap."""
    k = len(lo)
    own = np.zeros((3, k), np.int64)
    by_shift: dict[int, list] = {}
    for i in range(k):
        if hi[i] <= lo[i]:
            continue
        for m in range(lo[i] // c, (hi[i] - 1) // c + 1):
            r0, r1 = max(lo[i], m * c), min(hi[i], m * c + c)
            src = holder[m]
            if src == i:
                own[:, i] = (r0 - m * c, r0 - a[i], r1 - r0)
            else:
                by_shift.setdefault(m - i, []).append((i, src, r0 - m * c, r0 - a[i], r1 - r0))
    shifts = sorted(by_shift)
    tabs = np.zeros((3, len(shifts), k), np.int64)
    source = np.full((len(shifts), k), -1, np.int64)
    for r, sh in enumerate(shifts):
        for i, src, so, do, ln in by_shift[sh]:
            tabs[0, r, src], tabs[1, r, i], tabs[2, r, i], source[r, i] = so, do, ln, src
    return halo_tables.FetchRounds(own[0], own[1], own[2], np.asarray(shifts, np.int64).reshape(-1), tabs[0], tabs[1],
                          tabs[2], source)


@st.composite
def fetch_case(draw):
    k = draw(st.integers(1, 12))
    c = draw(st.integers(1, 6))
    S = draw(st.integers(1, 3 * c + 2))
    a = np.asarray([i * c - draw(st.integers(0, c + 1)) for i in range(k)], np.int64)
    n = draw(st.integers(max(0, k * c - c + 1), k * c))
    lo = np.maximum(a, 0)
    hi = np.maximum(np.minimum(a + S, n), lo)
    cut = np.asarray(draw(st.lists(st.booleans(), min_size=k, max_size=k)))
    hi = np.where(cut, lo + (hi - lo) // 2, hi)  # some devices need less (or nothing)
    holder = np.asarray(draw(st.permutations(range(k))) if draw(st.booleans()) else range(k), np.int64)
    return lo, hi, a, c, holder


def _eq_rounds(x, y):
    for f in halo_tables.FetchRounds._fields:
        u, v = getattr(x, f), getattr(y, f)
        assert u.dtype == v.dtype == np.int64, f
        np.testing.assert_array_equal(u, v, err_msg=f)


@given(fetch_case())
def test_fetch_rounds_brute(case):
    _eq_rounds(halo_tables.fetch_rounds(*case), _brute_rounds(*case))


@pytest.mark.slow
@pytest.mark.parametrize("k", [8192, 65536])
def test_fetch_rounds_large_meshes_and_errors(k):
    c = 4
    a = np.arange(k, dtype=np.int64) * c - 2  # a 5-row window, SAME: 2 rows each side
    lo, hi = np.maximum(a, 0), np.minimum(a + c + 4, k * c - 1)  # uneven: the last row is padding
    holder = np.roll(np.arange(k, dtype=np.int64), 3)  # shards held by another device
    for hold in (None, holder):
        r = halo_tables.fetch_rounds(lo, hi, a, c, hold)
        _eq_rounds(r, _brute_rounds(lo, hi, a, c, np.arange(k) if hold is None else hold))
    assert halo_tables.fetch_rounds(lo, hi, a, c).shift.tolist() == [-1, 1]
    with pytest.raises(ValueError, match="one entry per device"):
        halo_tables.fetch_rounds([0, 1], [1], [0, 0], 1)
    with pytest.raises(ValueError, match=r"\[0, k\*c\)"):
        halo_tables.fetch_rounds([0], [5], [0], 4)
