"""The sharding algebra: specs over meshes, the GSPMD tile-assignment view, and back.

Meshes: (8,), (2,4), (4,2), (2,2,2), also with permuted device ids. Specs are drawn
at random (mesh axes and sub-axes over random dims of rank 1-4 tensors) and checked
against a brute-force model of what a spec means: device d holds, along tensor dim
i, the shard whose index is the mixed-radix number of d's coordinates on the
(sub-)axes of dim i, major first.
"""
from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest
from hypothesis import given, strategies as st

import gspmd_py as gp

MESHES = [
    ((8,), ("x",), None),
    ((2, 4), ("x", "y"), None),
    ((4, 2), ("x", "y"), None),
    ((2, 2, 2), ("x", "y", "z"), None),
    ((8,), ("x",), [3, 1, 6, 0, 7, 2, 5, 4]),
    ((2, 4), ("x", "y"), [7, 6, 5, 4, 3, 2, 1, 0]),
    ((4, 2), ("x", "y"), [1, 0, 3, 2, 5, 4, 7, 6]),
    ((2, 2, 2), ("x", "y", "z"), [3, 1, 6, 0, 7, 2, 5, 4]),
]


def _compositions(n: int) -> list[list[int]]:
    """All ordered factorizations of n into factors > 1 (major first)."""
    if n == 1:
        return [[]]
    out = []
    for f in range(2, n + 1):
        if n % f == 0:
            out += [[f] + rest for rest in _compositions(n // f)]
    return out


@st.composite
def mesh_and_spec(draw, max_rank: int = 4):
    shape, names, devs = draw(st.sampled_from(MESHES))
    mesh = gp.Mesh(shape, names, devices=devs)
    rank = draw(st.integers(1, max_rank))
    items: list[str] = []  # disjoint (sub-)axes, each usable once
    for n, size in zip(names, shape):
        parts = draw(st.sampled_from(_compositions(size)))
        if len(parts) == 1:
            items.append(n)
            continue
        pre = 1
        for p in parts:
            items.append(f"{n}:({pre}){p}")
            pre *= p
    dims: list[list[str]] = [[] for _ in range(rank)]
    for it in draw(st.permutations(items)):
        d = draw(st.integers(-1, rank - 1))
        if d >= 0:
            dims[d].append(it)
    entries = []
    for axes in dims:
        if not axes:
            entries.append(None)
        elif len(axes) == 1 and draw(st.booleans()):
            entries.append(axes[0])
        else:
            entries.append(tuple(axes))
    return mesh, gp.P(*entries)


# -- brute-force model ---------------------------------------------------------------------------
def _parse(mesh: gp.Mesh, entry: str) -> tuple[str, int, int]:
    if ":" in entry:
        name, rest = entry.split(":")
        pre, size = rest[1:].split(")")
        return name, int(pre), int(size)
    return entry, 1, mesh.axis_size(entry)


def _entries(e) -> tuple:
    return () if e is None else (e,) if isinstance(e, str) else tuple(e)


def model_shard_index(mesh: gp.Mesh, spec) -> dict[int, tuple[int, ...]]:
    """device id -> shard index per dim, from the spec alone (independent of gspmd_py)."""
    ids = mesh.device_ids
    out = {}
    for coords in itertools.product(*[range(s) for s in mesh.shape]):
        idx = []
        for e in spec:
            k = 0
            for a in _entries(e):
                name, pre, size = _parse(mesh, str(a))
                ax = mesh.axis_names.index(name)
                n = mesh.shape[ax]
                minor = n // (pre * size)
                k = k * size + (coords[ax] // minor) % size
            idx.append(k)
        out[int(ids[coords])] = tuple(idx)
    return out


def model_shards(mesh: gp.Mesh, spec) -> tuple[int, ...]:
    return tuple(int(np.prod([_parse(mesh, str(a))[2] for a in _entries(e)], dtype=np.int64)) for e in spec)


# -- properties ------------------------------------------------------------------------------------
@given(mesh_and_spec())
def test_tile_assignment_round_trip(ms):
    mesh, spec = ms
    s = gp.Sharding(mesh, spec)
    if s.is_replicated:
        assert str(s) == "{replicated}"
        return
    t = gp.Sharding.from_tile_assignment(mesh, s.tile_assignment, replicate_last=s.is_partially_tiled)
    assert t == s, (spec, str(s), t.spec)
    assert hash(t) == hash(s)
    assert str(t) == str(s)
    np.testing.assert_array_equal(t.tile_assignment, s.tile_assignment)
    # the spec text prints back to an equal sharding
    assert gp.Sharding(mesh, s.spec) == s


@given(mesh_and_spec())
def test_tile_assignment_matches_brute_force(ms):
    mesh, spec = ms
    s = gp.Sharding(mesh, spec)
    ta = s.tile_assignment
    shards = model_shards(mesh, spec)
    assert s.shards == shards
    assert s.rank == len(spec)
    n_tiles = int(np.prod(shards))
    repl = mesh.size // n_tiles
    assert ta.shape == (shards + (repl,) if repl > 1 else shards)
    assert sorted(ta.reshape(-1).tolist()) == sorted(mesh.device_ids.reshape(-1).tolist())
    model = model_shard_index(mesh, spec)
    for pos in np.ndindex(ta.shape):
        dev = int(ta[pos])
        assert tuple(pos[: len(shards)]) == model[dev], (spec, dev, pos)
    # replicas within a tile are listed in mesh order
    if repl > 1:
        flat_pos = {int(d): i for i, d in enumerate(mesh.device_ids.reshape(-1))}
        for tile in np.ndindex(shards):
            order = [flat_pos[int(d)] for d in ta[tile]]
            assert order == sorted(order)
    # shard_index agrees too (mesh order)
    si = s.shard_index()
    for i, d in enumerate(mesh.device_ids.reshape(-1)):
        assert tuple(si[i]) == model[int(d)]
    # flags
    assert s.is_replicated == (n_tiles == 1)
    assert s.is_partially_tiled == (1 < n_tiles < mesh.size)


@given(mesh_and_spec(max_rank=3), st.integers(0, 3))
def test_with_rank_pads_replicated_dims(ms, extra):
    mesh, spec = ms
    s = gp.Sharding(mesh, spec)
    w = s.with_rank(s.rank + extra)
    assert w.rank == s.rank + extra
    assert w.dims[: s.rank] == s.dims
    assert all(d == () for d in w.dims[s.rank:])
    assert w.shards == s.shards + (1,) * extra
    if extra == 0:
        assert w is s
    if s.rank > 0:
        with pytest.raises(gp.SpecError, match=f"rank {s.rank - 1}"):
            s.with_rank(s.rank - 1)


# -- known text forms (derived by hand; device d at mesh coords (x, y) of (2,4) is 4x+y) ---------
M24 = [
    (("x", None), "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    (("y", None), "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    (("x", "y"), "{devices=[2,4]0,1,2,3,4,5,6,7}"),
    (("y", "x"), "{devices=[4,2]0,4,1,5,2,6,3,7}"),
    ((None, "x"), "{devices=[1,2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ((None, "y"), "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"),
    ((("x", "y"), None), "{devices=[8,1]0,1,2,3,4,5,6,7}"),
    ((("y", "x"), None), "{devices=[8,1]0,4,1,5,2,6,3,7}"),
    (("x",), "{devices=[2,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}"),
    ((None, None), "{replicated}"),
    ((), "{replicated}"),
    # minor half of y: tile j holds y % 2 == j
    (("y:(2)2", None), "{devices=[2,1,4]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"),
    # major half of y on dim 0, x on dim 1
    (("y:(1)2", "x"), "{devices=[2,2,2]0,1,4,5,2,3,6,7 last_tile_dim_replicate}"),
]


@pytest.mark.parametrize("spec,text", M24, ids=[str(s) for s, _ in M24])
def test_text_form_on_2x4(spec, text):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    s = gp.Sharding(mesh, gp.P(*spec))
    assert str(s) == text
    if not s.is_replicated:
        assert gp.Sharding.from_tile_assignment(mesh, s.tile_assignment, replicate_last=s.is_partially_tiled) == s


def test_text_form_permuted_devices_and_3d():
    rev = gp.Mesh((2, 4), ("x", "y"), devices=[7, 6, 5, 4, 3, 2, 1, 0])
    assert str(gp.Sharding(rev, gp.P("x", None))) == "{devices=[2,1,4]7,6,5,4,3,2,1,0 last_tile_dim_replicate}"
    assert str(gp.Sharding(rev, gp.P("y", "x"))) == "{devices=[4,2]7,3,6,2,5,1,4,0}"
    # (2,2,2): device 4x+2y+z; z on dim 0, x on dim 1, replicas over y
    m3 = gp.Mesh((2, 2, 2), ("x", "y", "z"))
    assert str(gp.Sharding(m3, gp.P("z", "x"))) == "{devices=[2,2,2]0,2,4,6,1,3,5,7 last_tile_dim_replicate}"
    assert str(gp.Sharding(m3, gp.P(("z", "y", "x")))) == "{devices=[8]0,4,2,6,1,5,3,7}"


def test_design_doc_example():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    s = gp.Sharding(mesh, gp.P("y", None))
    assert s.tile_assignment.shape == (4, 1, 2)
    assert gp.Sharding.from_tile_assignment(mesh, s.tile_assignment, replicate_last=True) == s


def test_from_tile_assignment_known():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    s = gp.Sharding.from_tile_assignment(mesh, np.arange(8).reshape(2, 4))
    assert s.spec == gp.P("x", "y")
    s = gp.Sharding.from_tile_assignment(mesh, np.arange(8).reshape(4, 2).T.reshape(2, 4))
    # tiles[i, j] = 2j + i: dim 0 over the minor half of y, dim 1 over x then the major half of y
    assert s.spec == gp.P("y:(2)2", ("x", "y:(1)2"))
    s = gp.Sharding.from_tile_assignment(mesh, [[[0, 1, 2, 3]], [[4, 5, 6, 7]]], replicate_last=True)
    assert s == gp.Sharding(mesh, gp.P("x", None))
    # replicas in another order are the same sharding
    s = gp.Sharding.from_tile_assignment(mesh, [[[0, 2, 1, 3]], [[4, 6, 5, 7]]], replicate_last=True)
    assert s == gp.Sharding(mesh, gp.P("x", None))
    # permuted mesh: tiles are device ids, not positions
    rev = gp.Mesh((2, 4), ("x", "y"), devices=[7, 6, 5, 4, 3, 2, 1, 0])
    s = gp.Sharding.from_tile_assignment(rev, [[7, 6, 5, 4], [3, 2, 1, 0]])
    assert s.spec == gp.P("x", "y")


# -- sub-axes --------------------------------------------------------------------------------------
def test_sub_axes_valid_and_printed():
    mesh = gp.Mesh((4, 2), ("a", "b"))
    s = gp.Sharding(mesh, gp.P("a:(1)2", "a:(2)2"))
    assert s.spec == gp.P("a:(1)2", "a:(2)2")
    assert s.shardy() == "[{a:(1)2}, {a:(2)2}]"
    assert s.shards == (2, 2)
    assert s.is_partially_tiled
    assert gp.Sharding.from_tile_assignment(mesh, s.tile_assignment, replicate_last=True) == s
    # a whole axis written as a sub-axis is the axis
    assert gp.Sharding(mesh, gp.P("a:(1)4")) == gp.Sharding(mesh, gp.P("a"))
    assert gp.Sharding(mesh, gp.P("a:(1)4")).spec == gp.P("a")
    # adjacent sub-axes of one axis on one dim (major then minor) are the whole axis
    merged = gp.Sharding(mesh, gp.P(("a:(1)2", "a:(2)2"), "b"))
    assert merged == gp.Sharding(mesh, gp.P("a", "b"))
    assert merged.spec == gp.P("a", "b")
    # in the other order they are a different layout
    swapped = gp.Sharding(mesh, gp.P(("a:(2)2", "a:(1)2"), "b"))
    assert swapped != gp.Sharding(mesh, gp.P("a", "b"))
    assert swapped.shardy() == "[{a:(2)2,a:(1)2}, {b}]"
    assert gp.Sharding.from_tile_assignment(mesh, swapped.tile_assignment) == swapped


@pytest.mark.parametrize("spec", [gp.P("a:(1)2", "a"), gp.P("a", "a:(2)2"), gp.P(("a", "a:(1)2")), gp.P("a", "a")])
def test_sub_axis_overlap_is_error(spec):
    mesh = gp.Mesh((4, 2), ("a", "b"))
    with pytest.raises(gp.SpecError, match="'a'"):
        gp.Sharding(mesh, spec)


@pytest.mark.parametrize("entry", ["a:(2)4", "a:(3)1", "a:(1)3", "a:(0)2"])
def test_sub_axis_not_dividing_is_error(entry):
    mesh = gp.Mesh((4, 2), ("a", "b"))
    with pytest.raises(gp.SpecError, match="a"):
        gp.Sharding(mesh, gp.P(entry))


# -- jax interop -------------------------------------------------------------------------------------
def test_jax_partition_spec_equals_gp_p():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    PS = jax.sharding.PartitionSpec
    assert gp.Sharding(mesh, PS("x", None)) == gp.Sharding(mesh, gp.P("x", None))
    assert gp.Sharding(mesh, PS(("x", "y"))) == gp.Sharding(mesh, gp.P(("x", "y")))
    assert gp.Sharding(mesh, PS()) == gp.Sharding(mesh, gp.P())


def test_named_sharding_accepted_and_rejected():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    PS = jax.sharding.PartitionSpec
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    ns = jax.sharding.NamedSharding(jm, PS("x", None))
    assert gp.Sharding(mesh, ns) == gp.Sharding(mesh, gp.P("x", None))
    other = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))
    with pytest.raises(gp.SpecError, match="'a'"):
        gp.Sharding(mesh, jax.sharding.NamedSharding(other, PS("a", None)))
    other_shape = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("x", "y"))
    with pytest.raises(gp.SpecError):
        gp.Sharding(mesh, jax.sharding.NamedSharding(other_shape, PS("x", None)))


def test_named_sharding_over_abstract_mesh():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    PS = jax.sharding.PartitionSpec
    am = jax.sharding.AbstractMesh((2, 4), ("x", "y"))
    assert gp.Sharding(mesh, jax.sharding.NamedSharding(am, PS("y"))) == gp.Sharding(mesh, gp.P("y"))
    bad = jax.sharding.AbstractMesh((2, 4), ("a", "b"))
    with pytest.raises(gp.SpecError):
        gp.Sharding(mesh, jax.sharding.NamedSharding(bad, PS("a")))


# -- flags ---------------------------------------------------------------------------------------------
def test_flags_and_shards():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    r = gp.Sharding(mesh, gp.P(None, None))
    assert r.is_replicated and not r.is_partially_tiled and r.shards == (1, 1)
    assert gp.Sharding.replicated(mesh, 3) == gp.Sharding(mesh, gp.P(None, None, None))
    p = gp.Sharding(mesh, gp.P("y", None))
    assert not p.is_replicated and p.is_partially_tiled and p.shards == (4, 1)
    f = gp.Sharding(mesh, gp.P("x", "y"))
    assert not f.is_replicated and not f.is_partially_tiled and f.shards == (2, 4)
    g = gp.Sharding(mesh, gp.P(("y", "x"), None, None))
    assert not g.is_partially_tiled and g.shards == (8, 1, 1)
    # partial sums are not replication
    ps = gp.Sharding(mesh, gp.P(None), partial=("x",))
    assert not ps.is_replicated and "partial={x}" in str(ps)
    with pytest.raises(gp.SpecError, match="'x'"):
        gp.Sharding(mesh, gp.P("x"), partial=("x",))


def test_equality_depends_on_mesh_devices():
    a = gp.Mesh((2, 4), ("x", "y"))
    b = gp.Mesh((2, 4), ("x", "y"), devices=[7, 6, 5, 4, 3, 2, 1, 0])
    assert gp.Sharding(a, gp.P("x")) != gp.Sharding(b, gp.P("x"))
    assert gp.Sharding(a, gp.P("x")) == gp.Sharding(gp.Mesh((2, 4), ("x", "y")), gp.P("x"))


# -- tile assignments the mesh cannot express -----------------------------------------------------------
@pytest.mark.parametrize(
    "tiles,repl",
    [
        ([[0, 3], [1, 2], [4, 7], [5, 6]], False),  # not a transposed iota
        ([[0, 1, 2, 3], [4, 5, 6, 7]][::-1], False),  # starts at device 4
        ([[1, 0, 2, 3], [4, 5, 6, 7]], False),
        (np.arange(8).reshape(2, 2, 2)[:, :, ::-1], True),
        ([0, 1, 2, 3], False),  # too few devices
        (list(range(16)), False),  # too many
        ([0, 1, 2, 3, 4, 5, 6, 99], False),  # unknown id
        ([0, 1, 2, 3, 4, 5, 6, 6], False),  # duplicate id
    ],
)
def test_from_tile_assignment_rejects(tiles, repl):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    with pytest.raises(gp.TileAssignmentError) as ei:
        gp.Sharding.from_tile_assignment(mesh, tiles, replicate_last=repl)
    assert str(ei.value)


def test_from_tile_assignment_wrong_count_message():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    with pytest.raises(gp.TileAssignmentError, match="4 devices.*8"):
        gp.Sharding.from_tile_assignment(mesh, [0, 1, 2, 3])
    with pytest.raises(gp.TileAssignmentError, match="99"):
        gp.Sharding.from_tile_assignment(mesh, [0, 1, 2, 3, 4, 5, 6, 99])


def test_from_tile_assignment_straddling_axes_rejected():
    # (4,2) mesh, device 2x+y: 4 tiles of stride 1 run over y and then x's minor half (expressible);
    # swapping the last two devices of a row is not a transposed iota.
    mesh = gp.Mesh((4, 2), ("x", "y"))
    s = gp.Sharding.from_tile_assignment(mesh, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert s.spec == gp.P("x:(1)2", ("x:(2)2", "y"))
    with pytest.raises(gp.TileAssignmentError):
        gp.Sharding.from_tile_assignment(mesh, [[0, 1, 4, 5], [2, 3, 7, 6]])
