"""One record of partial values: the projection (propagation/projection.py) says which axes an
op's results are partial over and how they combine; the partitioner's handlers read it."""
from __future__ import annotations

import jax
import jax.numpy as jnp

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.partitioner.program import fine_plan
from gspmd_py.core.fine_mesh import FineMesh
from gspmd_py.propagation.projection import PartialResult

MESH = gp.Mesh.abstract((2, 4), ("x", "y"))
S = jax.ShapeDtypeStruct


def projections(fn, args, in_dims):
    g = compiler.trace(jax.make_jaxpr(fn)(*args), MESH)
    s = compiler.seed(g, MESH, in_dims=in_dims)
    prop = compiler.propagate(s.graph, MESH, s.seeds)
    return {op.prim: prop.projections[op.id] for op in s.graph.walk() if op.prim != "gspmd_annotate"}, prop


Y = (MESH.ref("y"),)


def test_a_dot_over_a_sharded_contracting_dim_is_partial_sum():
    projs, _ = projections(lambda a, b: a @ b, (S((8, 16), jnp.float32), S((16, 4), jnp.float32)),
                           [((), Y), (Y, ())])
    assert projs["dot_general"].partial == PartialResult(Y, "sum")


def test_a_bool_dot_is_partial_or_and_a_max_partial_max():
    projs, _ = projections(lambda a, b: a @ b, (S((8, 16), jnp.bool_), S((16, 4), jnp.bool_)), [((), Y), (Y, ())])
    assert projs["dot_general"].partial == PartialResult(Y, "or")
    projs, _ = projections(lambda a: a.max(axis=1), (S((8, 16), jnp.float32),), [((), Y)])
    assert projs["reduce_max"].partial == PartialResult(Y, "max")


def test_no_sharded_reduction_no_partial():
    projs, _ = projections(lambda a, b: a @ b, (S((8, 16), jnp.float32), S((16, 4), jnp.float32)),
                           [(Y, ()), ((), ())])
    assert projs["dot_general"].partial is None
    projs, _ = projections(jnp.tanh, (S((8, 16), jnp.float32),), [((), Y)])
    assert projs["tanh"].partial is None


def test_the_partitioners_op_plan_carries_it_in_fine_axes():
    projs, _ = projections(lambda a, b: a @ b, (S((8, 16), jnp.float32), S((16, 4), jnp.float32)),
                           [((), Y), (Y, ())])
    fine = FineMesh.build(MESH, list(Y))
    plan = fine_plan(fine, projs["dot_general"])
    assert plan.partial_axes == ("y",) and plan.partial_op == "sum"
    assert plan.partial.axes == ("y",) and plan.partial.op == "sum"


def test_a_lookup_from_a_vocab_sharded_table_is_partial_pick_and_its_transpose_partial_sum():
    """An embedding gather's vocab dim is a "pick" reduction (one device holds each row);
    the scatter-add of its gradient adds each device's own update rows (partial sum)."""
    X = (MESH.ref("x"),)
    table, ids = S((64, 8), jnp.float32), S((4, 6), jnp.int32)
    projs, _ = projections(lambda t, i: jnp.take(t, i, axis=0), (table, ids), [(Y, ()), (X, ())])
    assert projs["gather"].partial == PartialResult(Y, "pick")
    assert projs["gather"].result_dims[0] == (X, (), ())
    loss = lambda t, i: jnp.sum(jnp.take(t, i, axis=0) ** 2)
    projs, _ = projections(jax.grad(loss), (table, ids), [(Y, ()), (X, ())])
    assert projs["scatter-add"].partial == PartialResult(X, "sum")
