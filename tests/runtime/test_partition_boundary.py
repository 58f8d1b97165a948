"""The program boundary: outputs are global jax.Arrays laid out as planned, uneven outputs
keep their logical shape, inputs already in place are not moved, and an abstract mesh
plans and lowers without devices."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import NamedSharding
import pytest

import gspmd_py as gp
from partition_util import assert_same, check, examples, meshes, rand, shapes, spec_for

P = gp.P


def _mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def _assert_laid_out(plan, outs):
    outs = jax.tree_util.tree_leaves(outs)
    assert len(outs) == len(plan.out_specs)
    for o, spec, v in zip(outs, plan.out_specs, plan.graph.outputs):
        assert isinstance(o, jax.Array)
        assert tuple(o.shape) == tuple(v.shape)
        assert o.sharding.is_equivalent_to(NamedSharding(plan.jax_mesh, spec), o.ndim), (o.sharding, spec)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_outputs_are_laid_out_as_planned(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    s_in = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    s_out = data.draw(st.one_of(st.none(), spec_for(mesh, len(shape), sub_axes=True)))
    fn = lambda v: (jnp.tanh(v), v * 2.0)
    x = rand(shape)
    f = gp.spmd(fn, mesh, in_shardings=(s_in,), out_shardings=(s_out, None))
    outs = f(x)
    plan = f.plan(x)
    assert_same(outs, fn(x))
    _assert_laid_out(plan, outs)
    # an output sharding that divides evenly is returned exactly as asked
    if s_out is not None:
        want = gp.Sharding(mesh, s_out).with_rank(len(shape))
        assert plan.out_shardings[0] == want
        fd = plan.fine_dims(plan.graph.outputs[0])
        if all(not a or n % plan.shards(a) == 0 for n, a in zip(shape, fd)):
            assert plan.out_specs[0] == jax.sharding.PartitionSpec(
                *[tuple(a) if len(a) > 1 else (a[0] if a else None) for a in fd])


def test_uneven_output_keeps_logical_shape():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((7, 13))
    f = gp.spmd(lambda v: v + 1.0, mesh, in_shardings=(P("x", "y"),), out_shardings=P("x", "y"))
    out = f(x)
    plan = f.plan(x)
    assert out.shape == (7, 13)
    np.testing.assert_allclose(np.asarray(out), x + 1.0)
    _assert_laid_out(plan, out)
    # the plan still reports the sharding asked for; the jax.Array holds the nearest even one
    assert plan.out_shardings == gp.Sharding(mesh, P("x", "y"))
    # 8 rows over x=2 divide: kept; 13 over 4 does not: dropped
    x = rand((8, 13))
    out = f(x)
    assert out.sharding.is_equivalent_to(NamedSharding(f.plan(x).jax_mesh, jax.sharding.PartitionSpec("x", None)), 2)
    np.testing.assert_allclose(np.asarray(out), x + 1.0)


def test_placed_inputs_are_not_moved():
    """The output of one call, laid out as the next call's in_sharding, is passed as is."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(lambda v: jnp.sin(v) * 2.0, mesh, in_shardings=(P("x", "y"),), out_shardings=P("x", "y"))
    x = rand((8, 16))
    y = f(x)
    plan = f.plan(y)
    placed = plan.place([y])
    assert placed[0] is y  # already in place: not copied, not moved
    z = f(y)
    np.testing.assert_allclose(np.asarray(z), np.sin(np.sin(x) * 2.0) * 2.0, rtol=1e-5, atol=1e-6)
    assert z.sharding.is_equivalent_to(y.sharding, 2)
    # a differently placed jax.Array is moved, and still gives the right values
    g = gp.spmd(lambda v: v - 1.0, mesh, in_shardings=(P(None, "x"),))
    w = g(y)
    np.testing.assert_allclose(np.asarray(w), np.asarray(y) - 1.0)
    # an uneven input goes back in (its padding is added at the boundary)
    u = gp.spmd(lambda v: v * 3.0, mesh, in_shardings=(P("x", "y"),), out_shardings=P("x", "y"))
    a = rand((7, 13))
    b = u(u(a))
    np.testing.assert_allclose(np.asarray(b), a * 9.0, rtol=1e-6)


@pytest.mark.slow
def test_pytree_outputs_and_inputs():
    mesh = gp.Mesh((2, 2, 2), ("x", "y", "z"))

    def fn(d, t):
        a, b = t
        return {"s": d["u"] @ a, "t": (b * 2.0, jnp.sum(b))}

    d = {"u": rand((6, 5), seed=1)}
    t = (rand((5, 4), seed=2), rand((3, 7), seed=3))
    plan = check(fn, mesh, (d, t), ({"u": P("x", None)}, (P(None, "y"), P("z", None))),
                 rtol=1e-5, atol=1e-5)
    f = gp.spmd(fn, mesh, in_shardings=({"u": P("x", None)}, (P(None, "y"), P("z", None))))
    _assert_laid_out(plan, f(d, t))


def test_abstract_mesh_plans_and_lowers():
    big = gp.Mesh.abstract((64, 128), ("x", "y"))
    f = gp.spmd(_mlp, big, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
    sds = lambda *s: jax.ShapeDtypeStruct(s, jnp.float32)
    plan = f.plan(sds(1024, 512), sds(512, 4096), sds(4096, 512))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-reduce", ("y",))]
    text = plan.lower_text()
    assert "all_reduce" in text
    assert "tensor<16x512xf32>" in text  # x's local shard: 1024/64 rows
    assert "tensor<512x32xf32>" in text  # w1's local shard: 4096/128 columns


@examples(10)
@given(mesh=meshes(), n=st.sampled_from([3, 5, 8]), data=st.data())
def test_grad_of_a_zero_size_sharded_input_reads_back(mesh, n, data):
    """jax.grad w.r.t. a zero-size input whose dim is sharded: jit's transpose gives the
    cotangent the staged call's in_sharding as out_sharding, and JAX 0.10 returned a zero-size
    output whole on every device under that split sharding (np.asarray of the gradient raised
    'could not broadcast (8,0) into (1,0)'). Zero-size inputs are staged unspecified."""
    axes = data.draw(st.sampled_from([mesh.axis_names[0], tuple(mesh.axis_names)]))
    x = np.zeros((n, 0), np.float32)
    f = gp.spmd(lambda a: jnp.cumsum(jnp.sin(a), axis=1), mesh, in_shardings=(P(axes, None),))
    g = jax.grad(lambda a: f(a).sum())(x)
    assert np.asarray(g).shape == (n, 0)
    assert np.asarray(jax.jit(jax.grad(lambda a: f(a).sum()))(x)).shape == (n, 0)
