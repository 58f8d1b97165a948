"""Resharding: each path emits exactly the collective it is named after (cases from XLA's spmd_partitioner_test.cc and Shardy's reshard_to_collectives tests,
28) and moves the right values; random (source, target) pairs on every mesh, uneven
dims included, always give the right values; partial sums are reduced once."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp
from partition_util import check, examples, meshes, rand, shapes, spec_for

P = gp.P


def _ident(x):
    return x


def _reshard(mesh, shape, src, dst, dtype=np.float32):
    """Run the identity with in_shardings=src, out_shardings=dst; returns (plan, collectives
    inside the program, i.e. not at the boundary)."""
    x = rand(shape, dtype)
    plan = check(_ident, mesh, (x,), (src,), dst)
    inner = [c for c in plan.collectives if c.op != "boundary"]
    return plan, inner


def _local_shape(plan, v):
    return plan.local_shape(v.shape, plan.fine_dims(v))


MESH_2x4 = lambda: gp.Mesh((2, 4), ("x", "y"))
MESH_2x2x2 = lambda: gp.Mesh((2, 2, 2), ("x", "y", "z"))


def test_all_to_all_ref19():
    """[2,1] -> [1,2] on s32[8,2]: one all-to-all, local s32[8,1]."""
    mesh = MESH_2x4()
    plan, cs = _reshard(mesh, (8, 2), P("x", None), P(None, "x"), np.int32)
    assert [(c.kind, c.axes) for c in cs] == [("all-to-all", ("x",))]
    assert _local_shape(plan, plan.graph.outputs[0]) == (8, 1)
    assert plan.collectives == cs


@pytest.mark.slow
def test_uneven_all_to_all_ref20():
    """Uneven f32[7,31,12] P(None,x,None) -> P(x,None,None): pad, one all-to-all, slice."""
    for mesh in (gp.Mesh((2, 4), ("x", "y")), gp.Mesh((8,), ("x",))):
        plan, cs = _reshard(mesh, (7, 31, 12), P(None, "x", None), P("x", None, None))
        assert [c.kind for c in cs] == ["all-to-all"], plan.report()


def test_partial_replication_all_gather_ref21():
    """[2,2] -> {[2,1,2] repl}: all-gather within sub-groups only; the reverse: a local slice."""
    mesh = MESH_2x2x2()
    plan, cs = _reshard(mesh, (8, 8), P("x", "y"), P("x", None))
    assert [(c.kind, c.axes) for c in cs] == [("all-gather", ("y",))]
    assert plan.collectives == cs
    plan, cs = _reshard(mesh, (8, 8), P("x", None), P("x", "y"))
    assert plan.collectives == []


def test_all_gather_over_minor_axes_ref22():
    """16x8 [{x,y,z},{}] -> [{x},{}]: one all-gather over {y,z}."""
    mesh = MESH_2x2x2()
    plan, cs = _reshard(mesh, (16, 8), P(("x", "y", "z"), None), P("x", None))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-gather", ("y", "z"))]


def test_all_to_all_keeps_other_dims_ref23():
    """16x8x8 [{x},{y},{}] -> [{},{y},{x}]: one all-to-all over x."""
    mesh = MESH_2x2x2()
    plan, cs = _reshard(mesh, (16, 8, 8), P("x", "y", None), P(None, "y", "x"))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-to-all", ("x",))]


def test_replicated_to_tiled_is_local_ref24():
    """[{},{}] -> [{x},{y,z}]: local slice, no communication."""
    mesh = MESH_2x2x2()
    plan, cs = _reshard(mesh, (16, 8), P(None, None), P("x", ("y", "z")))
    assert plan.collectives == []
    # uneven too: nothing to exchange
    plan, cs = _reshard(mesh, (6, 13), P(None, None), P("x", ("y", "z")))
    assert cs == []


def test_swap_axes_collective_permute_ref25():
    """Mesh {x:2,y:2}: [{x},{y}] -> [{y},{x}]: one collective-permute."""
    mesh = gp.Mesh((2, 2), ("x", "y"), devices=[0, 1, 2, 3])
    plan, cs = _reshard(mesh, (8, 8), P("x", "y"), P("y", "x"))
    assert [(c.kind, set(c.axes)) for c in plan.collectives] == [("collective-permute", {"x", "y"})]
    # on the 8-device meshes too
    plan, cs = _reshard(MESH_2x2x2(), (8, 6, 4), P("x", "y", "z"), P("z", "x", "y"))
    assert [c.kind for c in plan.collectives] == ["collective-permute"]


@pytest.mark.slow
@pytest.mark.parametrize("src,dst,shape,expect", [
    (P("y", None), P(None, "y"), (8, 8), ["all-to-all"]),
    (P(("x", "y"), None), P(None, ("x", "y")), (8, 16), ["all-to-all"]),
    (P(("x", "y"), None), P("x", "y"), (8, 8), ["all-to-all"]),
    (P("x", "y"), P(None, ("y", "x")), (8, 8), None),
    (P(None, "y"), P(None, None), (5, 7), ["all-gather"]),
    # x must go anyway; gathering it first turns y's move into an all-to-all
    (P("x", "y"), P("y", None), (8, 8), ["all-gather", "all-to-all"]),
    (P("x", "y"), P("y", "x"), (8, 8), ["all-gather", "all-to-all"]),
    (P("x", "y"), P("y", None), (7, 13), None),
])
def test_more_named_paths(src, dst, shape, expect):
    plan, cs = _reshard(MESH_2x4(), shape, src, dst)
    if expect is not None:
        assert [c.kind for c in cs] == expect, plan.report()


@pytest.mark.slow
@examples(40)
@given(st.data())
def test_random_reshard(data):
    """Any source sharding to any target sharding (sub-axes, uneven dims) keeps the values."""
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    src = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    dst = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    dtype = data.draw(st.sampled_from([np.float32, np.int32]))
    plan, _ = _reshard(mesh, shape, src, dst, dtype)
    assert plan.sharding_of("out0") == gp.Sharding(mesh, dst).with_rank(len(shape))


@pytest.mark.slow
@examples(16)
@given(st.data())
def test_random_reshard_inside(data):
    """An inner gp.annotate forces a reshard in the middle of a computation."""
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    src = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    mid = data.draw(spec_for(mesh, len(shape), sub_axes=True))
    dst = data.draw(spec_for(mesh, len(shape)))
    fn = lambda v: jnp.cos(gp.annotate(jnp.sin(v), mid)) * 2.0
    check(fn, mesh, (rand(shape),), (src,), dst)


# -- partial sums ----------------------------------------------------------------------------------

def _dot_plan(mesh, a_spec, b_spec, out_spec, m=8, k=16, n=8):
    a, b = rand((m, k), seed=1), rand((k, n), seed=2)
    return check(jnp.matmul, mesh, (a, b), (a_spec, b_spec), out_spec, rtol=1e-5, atol=1e-4)


def test_contracting_sharded_replicated_output_all_reduce():
    """XLA spmd_partitioner_test (dot, contracting dims sharded): contracting dims sharded, replicated output: local dot + one all-reduce."""
    mesh = MESH_2x4()
    plan = _dot_plan(mesh, P(None, "y"), P("y", None), P(None, None))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-reduce", ("y",))]
    # uneven contracting dim: padding masked on both sides
    plan = _dot_plan(mesh, P(None, "y"), P("y", None), P(None, None), m=5, k=13, n=3)
    assert [c.kind for c in plan.collectives] == ["all-reduce"]


def test_contracting_sharded_tiled_output_reduce_scatter():
    """XLA spmd_partitioner_test (dot, contracting dims sharded): with the output tiled on the contracting axis: one reduce-scatter, no all-reduce."""
    mesh = MESH_2x4()
    for out in (P("y", None), P(None, "y")):
        plan = _dot_plan(mesh, P(None, "y"), P("y", None), out)
        assert [(c.kind, c.axes) for c in plan.collectives] == [("reduce-scatter", ("y",))], plan.report()
    plan = _dot_plan(mesh, P("x", "y"), P("y", None), P("x", "y"))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("reduce-scatter", ("y",))], plan.report()
    # uneven output dim: still right
    plan = _dot_plan(mesh, P(None, "y"), P("y", None), P("y", None), m=7, k=12, n=3)
    assert "all-reduce" not in [c.kind for c in plan.collectives if c.op != "boundary"]


def test_partial_sum_stays_partial_through_linear_ops():
    """y*2 - y/4 - y for y = a@b: the partial sums flow through linear ops and are reduced once."""
    mesh = MESH_2x4()
    def fn(a, b):
        y = a @ b
        return y * 2.0 - y / 4.0 + (-y)

    plan = check(fn, mesh, (rand((8, 16), seed=1), rand((16, 8), seed=2)), (P(None, "y"), P("y", None)),
                 P(None, None), rtol=1e-5, atol=1e-4)
    assert [c.kind for c in plan.collectives] == ["all-reduce"]


def test_nonlinear_consumer_reduces_first():
    """tanh of a partial sum must see the reduced value."""
    mesh = MESH_2x4()
    def fn(a, b):
        y = a @ b
        return jnp.tanh(y) + jnp.exp(y)

    plan = check(fn, mesh, (rand((8, 16), seed=1), rand((16, 8), seed=2)), (P(None, "y"), P("y", None)),
                 P(None, None), rtol=1e-5, atol=1e-4)
    assert [c.kind for c in plan.collectives] == ["all-reduce"]


def _mlp(x, w1, w2):
    return jax.nn.relu(x @ w1) @ w2


def test_megatron_mlp_one_all_reduce():
    mesh = MESH_2x4()
    args = (rand((8, 16), seed=1), rand((16, 32), seed=2), rand((32, 16), seed=3))
    plan = check(_mlp, mesh, args, (P("x", None), P(None, "y"), P("y", None)), rtol=1e-5, atol=1e-4)
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-reduce", ("y",))]
    # uneven batch: the same one all-reduce inside the program
    args = (rand((7, 16), seed=1), rand((16, 32), seed=2), rand((32, 16), seed=3))
    plan = check(_mlp, mesh, args, (P("x", None), P(None, "y"), P("y", None)), rtol=1e-5, atol=1e-4)
    assert [c.kind for c in plan.collectives if c.op != "boundary"] == ["all-reduce"]


def test_data_parallel_matmul_no_collectives():
    mesh = MESH_2x4()
    plan = check(jnp.matmul, mesh, (rand((16, 8), seed=1), rand((8, 4), seed=2)), (P("x", None), None),
                 rtol=1e-5, atol=1e-4)
    assert plan.collectives == []
    plan = check(jnp.matmul, mesh, (rand((16, 8), seed=1), rand((8, 4), seed=2)), (P(("x", "y"), None), None),
                 rtol=1e-5, atol=1e-4)
    assert plan.collectives == []


def test_ctx_permute_counts_axes_in_the_order_given():
    """Ctx.permute's pairs index devices over ``axes`` in the order given (as Ctx.index does),
    although jax's ppermute linearises several axes in mesh order."""
    from gspmd_py.partitioner.context import Ctx
    from gspmd_py.core.fine_mesh import FineMesh

    mesh = gp.Mesh((2, 4), ("x", "y"))
    fine = FineMesh.build(mesh, [])
    ctx = Ctx(fine)
    jmesh = fine.jax_mesh()
    for axes in (("x", "y"), ("y", "x")):
        perm = [(i, (i + 3) % 8) for i in range(8)]

        def body(_):
            me = ctx.index(axes)
            got = ctx.permute(me[None], axes, perm)
            return jnp.stack([me, got[0]])[None]

        f = jax.jit(jax.shard_map(body, mesh=jmesh, in_specs=JP(), out_specs=JP(("x", "y")), check_vma=False))
        out = np.asarray(f(jnp.zeros(())))
        for me, got in out:
            assert got == (me - 3) % 8, (axes, out)
