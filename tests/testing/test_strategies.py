"""gp.testing's strategies draw what they promise: valid meshes with device orders, valid specs
with sub-axes and open dims, shapes with 0, 1, primes and uneven sizes, special values."""
import math

import jax
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.frontend.annotate import OPEN


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_meshes_and_shardings_are_valid(data):
    mesh = data.draw(gpt.meshes(max_devices=8, max_axes=3))
    assert 2 <= mesh.size <= 8 and len(mesh.shape) <= 3
    assert sorted(mesh.device_ids.reshape(-1).tolist()) == list(range(mesh.size))
    shape = data.draw(st.lists(st.integers(0, 13), min_size=0, max_size=3).map(tuple))
    spec = data.draw(gpt.shardings(shape, mesh))
    gp.Sharding(mesh, spec)  # a valid layout of the mesh (raises otherwise)
    ann = data.draw(gpt.annotations(shape, mesh))
    assert len(ann.spec) == len(shape) and 0 <= ann.priority <= 2


def test_meshes_cover_device_orders_sub_axes_and_abstract_meshes():
    seen_orders, subs, opens = set(), 0, 0

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(gpt.meshes(), st.data())
    def draw(mesh, data):
        nonlocal subs, opens
        ids = mesh.device_ids.reshape(-1).tolist()
        seen_orders.add("identity" if ids == sorted(ids) else "reversed" if ids == sorted(ids)[::-1] else "other")
        spec = data.draw(gpt.shardings((8, 8), mesh, open_dims=True))
        subs += any(":" in str(a) for e in spec if e is not None for a in (e if isinstance(e, tuple) else (e,)))
        opens += OPEN in spec

    draw()
    assert seen_orders == {"identity", "reversed", "other"} and subs and opens
    big = gpt.meshes(max_devices=8192, abstract=True)

    @settings(max_examples=20, deadline=None, database=None, derandomize=True)
    @given(big)
    def abstract(mesh):
        assert mesh.is_abstract and mesh.size <= 8192

    abstract()


def test_shapes_like_keeps_ranks_dtypes_and_tied_dims():
    x = np.zeros((8, 16), np.float32)
    w = np.zeros((16, 4), np.int8)
    sizes = set()

    @settings(max_examples=80, deadline=None, database=None, derandomize=True)
    @given(gpt.shapes_like((x, w)))
    def draw(structs):
        a, b = structs
        assert (a.ndim, b.ndim, a.dtype, b.dtype) == (2, 2, np.float32, np.int8)
        assert a.shape[1] == b.shape[0]  # 16 in both: one symbol
        sizes.update(a.shape + b.shape)

    draw()
    assert {0, 1} <= sizes and {7, 13} & sizes and any(n % 2 for n in sizes if n > 1)


def test_values_and_arrays_hold_special_values():
    sv = gpt.special_values(np.float32)
    assert np.isnan(sv).any() and np.isposinf(sv).any() and np.isneginf(sv).any()
    assert any(v == 0 and np.signbit(v) for v in sv) and (np.abs(sv[np.isfinite(sv)]) > 1e38).any()
    got = []

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(gpt.values(jax.numpy.bfloat16))
    def draw(v):
        got.append(np.float64(v))

    draw()
    got = np.array(got)
    assert np.isnan(got).any() and np.isinf(got).any() and (np.abs(got[np.isfinite(got)]) > 1e37).any()
    a = gpt.fill((50, 3), np.float16, seed=3, mode="special")
    assert a.dtype == np.float16 and np.isnan(a).any() and math.prod(a.shape) == 150
    assert np.array_equal(gpt.fill((4,), np.int8, 1), gpt.fill((4,), np.int8, 1))


def _entry_axes(e):
    return () if e is None else (e if isinstance(e, tuple) else (e,))


def test_meshes_and_specs_draw_where_bugs_live():
    """Over 300 draws: size-1 axes in about a quarter of the meshes (not three quarters, as a
    uniform pick of shapes gives), multi-axis dims in either order, sub-axes, uneven dims."""
    n = dict(meshes=0, size1=0, sharded=0, uneven=0, multi=0, reversed=0, sub=0)

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(gpt.meshes(), st.data())
    def draw(mesh, data):
        spec = data.draw(gpt.shardings((7, 12), mesh))
        n["meshes"] += 1
        n["size1"] += 1 in mesh.shape
        for size, e in zip((7, 12), spec):
            refs = [mesh.ref(a) for a in _entry_axes(e)]
            if not refs:
                continue
            n["sharded"] += 1
            n["uneven"] += size % math.prod(r.size for r in refs) != 0
            n["sub"] += any(":" in str(a) for a in _entry_axes(e))
            if len(refs) > 1:
                n["multi"] += 1
                place = [(mesh.axis_names.index(r.name), r.pre) for r in refs]
                n["reversed"] += place != sorted(place)

    draw()
    assert 0.15 <= n["size1"] / n["meshes"] <= 0.4, n
    assert n["uneven"] >= 0.3 * n["sharded"] and n["sub"] >= 0.1 * n["sharded"], n
    assert n["multi"] >= 0.15 * n["sharded"] and 0.3 <= n["reversed"] / n["multi"] <= 0.7, n


def test_a_failing_layout_shrinks_to_two_devices():
    """The mesh shrinks under a condition on the spec drawn after it: the spec's draws do not
    depend on the mesh drawn, so a smaller mesh keeps the failing layout's shape."""
    from hypothesis import find

    def uneven_over_several(t):  # a dim split over two mesh axes, unevenly
        mesh, spec = t
        return any(len(_entry_axes(e)) > 1 and size % math.prod(mesh.ref(a).size for a in _entry_axes(e))
                   for size, e in zip((7, 12), spec))

    def uneven(t):
        mesh, spec = t
        return any(_entry_axes(e) and size % math.prod(mesh.ref(a).size for a in _entry_axes(e))
                   for size, e in zip((7, 12), spec))

    pairs = gpt.meshes().flatmap(lambda m: st.tuples(st.just(m), gpt.shardings((7, 12), m)))
    conf = settings(database=None, max_examples=2000, derandomize=True)
    mesh, spec = find(pairs, uneven, settings=conf)
    assert mesh.shape == (2,) and spec == gp.P("x", None)
    mesh, spec = find(pairs, uneven_over_several, settings=conf)
    assert 1 not in mesh.shape and len(mesh.shape) <= 2, (mesh, spec)  # size-1 axes shrink away
