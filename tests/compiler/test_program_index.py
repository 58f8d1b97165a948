"""The program index (partitioner/program_index.py, the compiler's ``index`` pass): the
per-device program read once, per equation its op, its loops' trip counts and its
collectives; the collective records and the cost model read it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.partitioner.fine_mesh import FineMesh
from gspmd_py.partitioner.program_index import ProgramIndex, Trips

MESH = gp.Mesh.abstract((2, 4), ("x", "y"))
FINE = FineMesh.build(MESH, [MESH.ref("x"), MESH.ref("y")])
ENV = [("x", 2), ("y", 4)]
S = jax.ShapeDtypeStruct
F32 = jnp.float32


def small_program():
    """op1: a psum outside any loop; op2: a scan of 3 whose body all-gathers; op3: a while
    counting 0..5 whose body psums (max)."""

    def fn(a, b):
        with jax.named_scope("op1"):
            a = lax.psum(a, "y")
        with jax.named_scope("op2"):
            def step(c, _):
                return c + lax.all_gather(b, "x", tiled=True).sum(), None
            c, _ = lax.scan(step, a, None, length=3)
        with jax.named_scope("op3"):
            _, c = lax.while_loop(lambda s: s[0] < 5, lambda s: (s[0] + 1, lax.pmax(s[1], "x")), (0, c))
        return c

    return jax.make_jaxpr(fn, axis_env=ENV)(S((4,), F32), S((2, 3), F32))


def label(i: int) -> str:
    return f"op {i}"


def test_index_per_equation_op_trips_and_collectives():
    idx = ProgramIndex.build(small_program(), FINE, label)
    colls = [(e.key, e.op_ids, e.trips(), e.loops, [(c.kind, c.axes, c.in_loop) for c in e.collectives])
             for e in idx.entries if e.collectives]
    assert colls == [
        ("op1", (1,), 1, (), [("all-reduce", ("y",), False)]),
        ("op2", (2,), 3, (Trips(3),), [("all-gather", ("x",), True)]),
        ("op3", (3,), 5, (Trips(5),), [("all-reduce", ("x",), True)]),
    ]
    loops = {e.prim: e.trip_count for e in idx.entries if e.prim in ("scan", "while")}
    assert loops == {"scan": 3, "while": 5}
    # a while's condition runs once more than its body
    cond = [e for e in idx.entries if e.prim == "lt" and e.key == "op3"]
    assert cond and all(e.loops == (Trips(5, 1),) and e.trips() == 6 for e in cond)
    # every equation is indexed, by path; the top-level ones have paths of length 1
    top = [e for e in idx.entries if len(e.path) == 1]
    assert len(top) == len(small_program().jaxpr.eqns)
    assert idx.at(top[0].path) is top[0]
    assert [c.kind for c in idx.collectives] == ["all-reduce", "all-gather", "all-reduce"]


def test_an_underivable_while_count_is_none_and_resolved_by_the_caller():
    def fn(a, n):
        return lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, lax.psum(s[1], "y")), (0, a))[1]

    idx = ProgramIndex.build(jax.make_jaxpr(fn, axis_env=ENV)(S((4,), F32), S((), jnp.int32)), FINE, label)
    (w,) = [e for e in idx.entries if e.prim == "while"]
    assert w.trip_count is None
    (p,) = [e for e in idx.entries if e.collectives]
    assert p.loops == (Trips(None),) and p.trips(while_trips=7) == 7 and p.key == "boundary"


def test_plan_collectives_and_cost_read_the_index():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))

    def mlp(x, w1, w2):
        return jax.nn.relu(x @ w1) @ w2

    f = gp.spmd(mlp, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y"), gp.P("y", None)))
    plan = f.plan(S((8, 16), F32), S((16, 32), F32), S((32, 16), F32))
    assert isinstance(plan.index, ProgramIndex)
    assert tuple(plan.collectives) == plan.index.collectives
    (c,) = plan.collectives
    (e,) = [e for e in plan.index.entries if e.collectives]
    assert e.op_ids == (c.op_id,) and e.key == f"op{c.op_id}" and e.label == c.op and e.trips() == 1
    cost = plan.cost(gp.Hardware.preset("h100-node"))
    (cc,) = cost.collectives
    assert cc.collective == c and cc.count == 1
    assert [o.key for o in cost.ops if o.collectives] == [e.key]


def test_the_index_pass_is_the_plans_index():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))
    closed = jax.make_jaxpr(lambda x, w: x @ w)(S((8, 16), F32), S((16, 4), F32))
    s = compiler.seed(compiler.trace(closed, mesh), mesh, in_dims=[((), (mesh.ref("y"),)), ((mesh.ref("y"),), ())])
    part = compiler.partition(s.graph, mesh, compiler.propagate(s.graph, mesh, s.seeds))
    idx = compiler.index(part.program, part.fine, s.graph)
    assert [c.kind for c in idx.collectives] == ["all-reduce"]
    assert [e.key for e in idx.entries if e.collectives] == [f"op{idx.collectives[0].op_id}"]
