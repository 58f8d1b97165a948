"""Bad input gives a gp.ShardingError subclass whose message names the culprit;
plus the mesh basics (abstract meshes, permuted devices) and the annotations being
identities outside gp.spmd."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp


@pytest.fixture
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


@pytest.fixture
def x():
    return jnp.arange(32.0).reshape(4, 8)


def _raises(exc, *needles):
    """pytest.raises(exc) that also checks the message contains every needle."""
    assert issubclass(exc, gp.ShardingError)

    class _Ctx:
        def __enter__(self):
            self.cm = pytest.raises(exc)
            self.info = self.cm.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.cm.__exit__(*a)
            msg = str(self.info.value)
            for n in needles:
                assert n in msg, f"{n!r} not in error message {msg!r}"
            return out

    return _Ctx()


# -- specs ------------------------------------------------------------------------------------------
def test_unknown_axis_in_spec(mesh):
    with _raises(gp.SpecError, "'z'", "'x'", "'y'"):
        gp.Sharding(mesh, gp.P("z", None))


def test_unknown_axis_in_tuple_entry(mesh):
    with _raises(gp.SpecError, "'w'", "'x'", "'y'"):
        gp.Sharding(mesh, gp.P(("x", "w")))


def test_unknown_axis_in_sub_axis(mesh):
    with _raises(gp.SpecError, "'q'"):
        gp.Sharding(mesh, gp.P("q:(1)2"))


def test_bad_spec_entry_type(mesh):
    with _raises(gp.SpecError, "3"):
        gp.Sharding(mesh, gp.P(3, None))


def test_not_a_spec(mesh):
    with _raises(gp.SpecError, "'x'"):
        gp.Sharding(mesh, "x")


def test_spec_longer_than_rank_with_rank(mesh):
    s = gp.Sharding(mesh, gp.P("x", "y"))
    with _raises(gp.SpecError, "tensor 'w'", "rank 1"):
        s.with_rank(1, "tensor 'w'")


def test_spec_longer_than_rank_annotate():
    with _raises(gp.SpecError, "rank 1"):
        gp.annotate(jnp.ones(4), gp.P("x", "y"))


def test_axis_on_two_dims(mesh):
    with _raises(gp.SpecError, "'x'", "dims 0 and 1"):
        gp.Sharding(mesh, gp.P("x", "x"))


def test_axis_twice_on_one_dim(mesh):
    with _raises(gp.SpecError, "'y'", "dim 0"):
        gp.Sharding(mesh, gp.P(("y", "y")))


def test_sub_axis_overlapping_axis(mesh):
    with _raises(gp.SpecError, "'y'"):
        gp.Sharding(mesh, gp.P("y:(1)2", "y"))


def test_sub_axis_does_not_divide(mesh):
    with _raises(gp.SpecError, "y:(3)2", "4"):
        gp.Sharding(mesh, gp.P("y:(3)2"))


# -- meshes ---------------------------------------------------------------------------------------------
def test_mesh_larger_than_devices():
    with _raises(gp.MeshError, "16", "8"):
        gp.Mesh((4, 4), ("x", "y"))


def test_mesh_duplicate_device_ids():
    with _raises(gp.MeshError, "[3]"):
        gp.Mesh((2, 4), ("x", "y"), devices=[0, 1, 2, 3, 3, 5, 6, 7])


def test_mesh_unknown_device_id():
    with _raises(gp.MeshError, "99"):
        gp.Mesh((2, 4), ("x", "y"), devices=[0, 1, 2, 3, 4, 5, 6, 99])


def test_mesh_missing_device_ids():
    # 4 ids for 8 slots
    with _raises(gp.MeshError, "8", "4"):
        gp.Mesh((2, 4), ("x", "y"), devices=[0, 1, 2, 3])


def test_mesh_wrong_count_of_device_ids():
    with _raises(gp.MeshError, "8", "9"):
        gp.Mesh((2, 4), ("x", "y"), devices=list(range(8)) + [0])
    with _raises(gp.MeshError, "4", "8"):
        gp.Mesh((2, 2), ("x", "y"), devices=list(range(8)))


def test_mesh_bad_device_entry():
    with _raises(gp.MeshError, "'a'"):
        gp.Mesh((2,), ("x",), devices=[0, "a"])


def test_mesh_shape_names_mismatch():
    with _raises(gp.MeshError, "('x',)"):
        gp.Mesh((2, 4), ("x",))


def test_mesh_repeated_axis_name():
    with _raises(gp.MeshError, "repeat"):
        gp.Mesh((2, 4), ("x", "x"))


@pytest.mark.parametrize("name", ["", "a:b", "a(1"])
def test_mesh_bad_axis_name(name):
    with _raises(gp.MeshError, repr(name)):
        gp.Mesh((2, 4), ("x", name))


@pytest.mark.parametrize("size", [0, -2, 2.0, True])
def test_mesh_bad_axis_size(size):
    with _raises(gp.MeshError, "'y'", repr(size)):
        gp.Mesh.abstract((2, size), ("x", "y"))


def test_abstract_mesh_has_no_devices_to_run_on():
    with _raises(gp.MeshError, "abstract"):
        gp.Mesh.abstract((2, 4), ("x", "y")).jax_devices()


def test_abstract_mesh_at_scale():
    big = gp.Mesh.abstract((64, 128), ("x", "y"))
    assert big.is_abstract
    assert big.size == 64 * 128
    assert big.shape == (64, 128) and big.axis_names == ("x", "y")
    np.testing.assert_array_equal(big.device_ids, np.arange(64 * 128).reshape(64, 128))
    assert big.axis_size("y") == 128
    s = gp.Sharding(big, gp.P("x", "y"))
    assert s.shards == (64, 128) and not s.is_partially_tiled
    assert gp.Sharding(big, gp.P("y:(2)64")).shards == (64,)
    # an abstract mesh is not the concrete one of the same shape
    assert gp.Mesh.abstract((2, 4), ("x", "y")) != gp.Mesh((2, 4), ("x", "y"))


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_a_one_device_mesh_plans_and_runs(shape):
    """Every axis of size 1: nothing is split, and the program still lowers (abstract) and runs."""
    names = ("x", "y")[:len(shape)]
    a, b = np.arange(24, dtype=np.float32).reshape(6, 4), np.ones((4, 3), np.float32)
    spec = (gp.P(names[0], None), gp.P(None, names[-1]))
    abstract = gp.spmd(lambda u, v: u @ v, gp.Mesh.abstract(shape, names), in_shardings=spec)
    assert "dot_general" in abstract.plan(a, b).lower_text()
    f = gp.spmd(lambda u, v: u @ v, gp.Mesh(shape, names), in_shardings=spec)
    np.testing.assert_array_equal(np.asarray(f(a, b)), a @ b)


def test_mesh_permuted_devices_kept():
    ids = [7, 6, 5, 4, 3, 2, 1, 0]
    m = gp.Mesh((2, 4), ("x", "y"), devices=ids)
    assert m.device_ids.tolist() == [[7, 6, 5, 4], [3, 2, 1, 0]]
    assert [d.id for d in m.jax_devices().reshape(-1)] == ids
    assert m != gp.Mesh((2, 4), ("x", "y"))
    assert m == gp.Mesh((2, 4), ("x", "y"), devices=np.array(ids).reshape(2, 4))
    assert m == gp.Mesh((2, 4), ("x", "y"), devices=[jax.devices()[i] for i in ids])
    # device_ids is a copy
    m.device_ids[0, 0] = 99
    assert m.device_ids[0, 0] == 7


def test_default_mesh_is_first_devices_row_major():
    m = gp.Mesh((2, 4), ("x", "y"))
    assert m.device_ids.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gp.Mesh((4,), ("x",)).device_ids.tolist() == [0, 1, 2, 3]


# -- annotations ---------------------------------------------------------------------------------------
def test_mesh_split_two_dims_on_one_axis(mesh, x):
    with _raises(gp.SpecError, "[0, 0]"):
        gp.mesh_split(x, mesh, [0, 0])


def test_mesh_split_non_integer(mesh, x):
    with _raises(gp.SpecError, "dims_mapping[0]", "0.5"):
        gp.mesh_split(x, mesh, [0.5, -1])


def test_mesh_split_out_of_range(mesh, x):
    with _raises(gp.SpecError, "dims_mapping[0]", "5"):
        gp.mesh_split(x, mesh, [5, -1])
    with _raises(gp.SpecError, "dims_mapping[1]", "-2"):
        gp.mesh_split(x, mesh, [0, -2])


def test_mesh_split_too_short(mesh, x):
    with _raises(gp.SpecError, "rank 2", "[0]"):
        gp.mesh_split(x, mesh, [0])


def test_mesh_split_too_long(mesh, x):
    with _raises(gp.SpecError, "rank 2"):
        gp.mesh_split(x, mesh, [0, 1, -1])


def test_annotate_non_array():
    with _raises(gp.AnnotationError, "str", "hello"):
        gp.annotate("hello", gp.P())


def test_annotate_negative_priority(x):
    with _raises(gp.AnnotationError, "priority", "-1"):
        gp.annotate(x, gp.P(), priority=-1)


def test_annotate_bad_spec(x):
    with _raises(gp.AnnotationError, "'x'"):
        gp.annotate(x, "x")


def test_tag_empty_name(x):
    with _raises(gp.AnnotationError, "''"):
        gp.tag(x, "")


def test_tag_non_array():
    with _raises(gp.AnnotationError, "dict"):
        gp.tag({"a": 1}, "h")


# -- identities outside gp.spmd -------------------------------------------------------------------------
def _f(mesh):
    def f(a):
        b = gp.annotate(a * 2.0, gp.P("x", "y"))
        c = gp.mesh_split(jnp.sin(b), mesh, [-1, 1], priority=1)
        d = gp.tag(c + a, "hidden")
        return gp.annotate(d, gp.P(None, "y"), priority=2)

    def ref(a):
        return jnp.sin(a * 2.0) + a

    return f, ref


def test_identities_eager(mesh, x):
    f, ref = _f(mesh)
    np.testing.assert_allclose(f(x), ref(x), rtol=1e-6)
    np.testing.assert_array_equal(gp.annotate(x, gp.P("x")), x)
    np.testing.assert_array_equal(gp.mesh_split(x, mesh, [0, 1]), x)
    np.testing.assert_array_equal(gp.tag(x, "t"), x)
    # numpy in, array out, values unchanged
    np.testing.assert_array_equal(gp.annotate(np.arange(6).reshape(2, 3), gp.P("x")), np.arange(6).reshape(2, 3))


def test_identities_under_jit(mesh, x):
    f, ref = _f(mesh)
    np.testing.assert_allclose(jax.jit(f)(x), ref(x), rtol=1e-6)


@pytest.mark.slow
def test_identities_under_grad(mesh, x):
    f, ref = _f(mesh)
    g = jax.grad(lambda a: jnp.sum(f(a) ** 2))(x)
    g_ref = jax.grad(lambda a: jnp.sum(ref(a) ** 2))(x)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5)
    gj = jax.jit(jax.grad(lambda a: jnp.sum(f(a) ** 2)))(x)
    np.testing.assert_allclose(gj, g_ref, rtol=1e-5)


@pytest.mark.slow
def test_identities_under_vmap(mesh):
    f, ref = _f(mesh)
    xs = jnp.arange(3 * 32.0).reshape(3, 4, 8) / 10.0
    np.testing.assert_allclose(jax.vmap(f)(xs), jax.vmap(ref)(xs), rtol=1e-6)
    np.testing.assert_allclose(jax.vmap(f, in_axes=2, out_axes=2)(xs.transpose(1, 2, 0)),
                               ref(xs).transpose(1, 2, 0), rtol=1e-6)
    np.testing.assert_allclose(jax.jit(jax.vmap(jax.grad(lambda a: jnp.sum(f(a)))))(xs),
                               jax.vmap(jax.grad(lambda a: jnp.sum(ref(a))))(xs), rtol=1e-5)
