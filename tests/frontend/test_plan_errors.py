"""Bad input at the gp.spmd / plan level: a clear gp.ShardingError naming the culprit."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp

S = jax.ShapeDtypeStruct


@pytest.fixture(scope="module")
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


def x44():
    return S((4, 4), jnp.float32)


def test_unknown_axis_in_in_shardings(mesh):
    f = gp.spmd(lambda a: a * 2, mesh, in_shardings=(gp.P("z", None),))
    with pytest.raises(gp.SpecError, match=r"arg0.*'z'.*\('x', 'y'\)"):
        f.plan(x44())


def test_spec_longer_than_rank(mesh):
    f = gp.spmd(lambda a: a * 2, mesh, in_shardings=(gp.P("x", "y", None),))
    with pytest.raises(gp.SpecError, match=r"arg0.*3 entries.*rank 2"):
        f.plan(x44())


def test_one_axis_on_two_dims(mesh):
    f = gp.spmd(lambda a: a * 2, mesh, in_shardings=(gp.P("x", "x"),))
    with pytest.raises(gp.SpecError, match=r"arg0.*'x'.*dims 0 and 1"):
        f.plan(x44())


def test_unknown_axis_in_annotation_names_the_site(mesh):
    def fn(a):
        return gp.annotate(a * 2, gp.P("model", None))
    with pytest.raises(gp.SpecError, match=r"gp.annotate at .*test_plan_errors.py.*dim 0.*'model'"):
        gp.spmd(fn, mesh).plan(x44())


def test_out_shardings_wrong_rank(mesh):
    f = gp.spmd(lambda a: a.sum(0), mesh, out_shardings=gp.P("x", "y"))
    with pytest.raises(gp.SpecError, match=r"out_shardings.*out0 f32\[4\].*rank 1"):
        f.plan(x44())


def test_in_shardings_count_mismatch(mesh):
    f = gp.spmd(lambda a: a, mesh, in_shardings=(gp.P("x"), gp.P("y")))
    with pytest.raises(gp.SpecError, match=r"in_shardings: got 2 entries for 1 arguments"):
        f.plan(x44())


def test_in_shardings_conflicting_pytree_for_one_argument(mesh):
    f = gp.spmd(lambda d: d["a"] + d["b"], mesh, in_shardings=({"a": gp.P("x"), "c": gp.P("y")},))
    with pytest.raises(gp.SpecError, match=r"keys \['a', 'c'\] do not match.*\['a', 'b'\]"):
        f.plan({"a": x44(), "b": x44()})


def test_named_sharding_over_other_mesh(mesh):
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("a", "b"))
    f = gp.spmd(lambda a: a, mesh, in_shardings=(jax.sharding.NamedSharding(jm, jax.sharding.PartitionSpec("a")),))
    with pytest.raises(gp.SpecError, match=r"arg0"):
        f.plan(x44())


def test_non_array_argument(mesh):
    f = gp.spmd(lambda a, s: a, mesh)
    with pytest.raises(gp.AnnotationError, match=r"argument arg1 is str"):
        f.plan(x44(), "hello")


def test_unsupported_primitive_is_named(mesh):
    from jax.experimental import io_callback

    def fn(a):  # (pure_callback is supported: computed replicated, reported)
        return io_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
    with pytest.raises(gp.UnsupportedOpError, match=r"primitive 'io_callback'.*no sharding rule"):
        gp.spmd(fn, mesh).plan(x44())


def test_spmd_needs_a_mesh():
    with pytest.raises(gp.ShardingError, match="mesh"):
        gp.spmd(lambda a: a)


def test_abstract_mesh_cannot_run():
    f = gp.spmd(lambda a: a * 2, gp.Mesh.abstract((64, 128), ("x", "y")), in_shardings=(gp.P("x", "y"),))
    with pytest.raises(gp.ShardingError, match="abstract"):
        f(np.ones((128, 128), np.float32))


def test_replicated_fallback_is_loud(mesh):
    def fn(a):  # one (unbatched) matrix: no partitioned form
        return jnp.linalg.cholesky(a @ a.T + 8 * jnp.eye(8)) + a
    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", "y"),))
    with pytest.warns(gp.PartitionWarning, match="cholesky"):
        p = f.plan(S((8, 8), jnp.float32))
    assert "REPLICATED FALLBACK" in p.report()
    x = np.ones((8, 8), np.float32)
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(fn(x)), rtol=1e-5)
