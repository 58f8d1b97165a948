"""The program index (program/program_index.py, the compiler's ``index`` pass): the
per-device program read once, per equation its op, its loops' trip counts and its
collectives; the collective records and the cost model read it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
import pytest

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.core.fine_mesh import FineMesh
from gspmd_py.program.program_index import ProgramIndex, Trips

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


# -- one reader: the combiner, the records, the cost model and the memory walk read the index --

def _grads_plan(threshold=None):
    """Data-parallel gradients of three weights: the combiner merges their all-reduces."""
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))

    def grads(x, w1, w2, b):
        return jax.grad(lambda p: jnp.mean(jnp.tanh(jnp.tanh(x @ p[0]) @ p[1] + p[2]) ** 2))((w1, w2, b))

    kw = {} if threshold is None else {"combine_threshold_bytes": threshold}
    f = gp.spmd(grads, mesh, in_shardings=(gp.P("x", None), None, None, None), **kw)
    return f.plan(S((16, 8), F32), S((8, 8), F32), S((8, 4), F32), S((4,), F32))


def _scan_plan():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))

    def fn(x, ws):
        def step(h, w):
            h = jnp.tanh(h @ w)
            return h, h.sum()
        return lax.scan(step, x, ws)

    f = gp.spmd(fn, mesh, in_shardings=(gp.P("x", None), gp.P(None, None, "y")))
    return f.plan(S((8, 16), F32), S((3, 16, 16), F32))


_PRIMS = {"psum": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce", "all_gather": "all-gather",
          "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all", "ppermute": "collective-permute",
          "psum_combined": "all-reduce", "pmax_combined": "all-reduce", "pmin_combined": "all-reduce"}


def _collectives_seen_by_walking(jaxpr) -> list[str]:
    """The collectives of a jaxpr in program order, read independently of the index."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in _PRIMS:
            out.append(_PRIMS[eqn.primitive.name])
        for v in eqn.params.values():
            for j in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(j, "jaxpr", j)
                if hasattr(inner, "eqns"):
                    out += _collectives_seen_by_walking(inner)
    return out


def test_the_plans_index_is_the_index_of_the_program_it_runs():
    """After the combiner the program is indexed again: the plan's index is the index of the
    combined program (every collective the program issues, none of the merged-away ones), and
    the records, the cost model and the memory walk read that one index."""
    from gspmd_py.cost.memory import peak_memory
    from gspmd_py.program.records import collect

    hw = gp.Hardware.preset("h100-node")
    plans = (_grads_plan(), _grads_plan(threshold=0), _scan_plan())
    assert all(p.collectives for p in plans)
    for plan in plans:
        assert plan.index.program is plan.program
        fresh = compiler.index(plan.program, plan.fine, plan.graph)
        assert fresh.entries == plan.index.entries
        assert [c.kind for c in plan.collectives] == _collectives_seen_by_walking(plan.program.jaxpr)
        assert collect(plan.index) == list(plan.collectives)
        cost = plan.cost(hw)
        assert sorted(str(c.collective) for c in cost.collectives) == sorted(str(c) for c in plan.collectives)
        assert peak_memory(plan.index, (False,) * len(plan.program.jaxpr.invars)).peak == cost.peak_memory_bytes
    merged, separate = _grads_plan(), _grads_plan(threshold=0)
    assert len(merged.collectives) < len(separate.collectives)
    assert any(c.op.startswith("combined:") for c in merged.collectives)


def test_the_combiner_reads_the_index_it_is_given():
    """The merged collective is named from the index's op ids, its bytes and axes are the
    index's; the combiner of an index with nothing to merge gives the program back."""
    fine = FineMesh.build(MESH, [MESH.ref("y")])

    def fn(a, b):
        with jax.named_scope("op4"):
            a = lax.psum(a, "y")
        with jax.named_scope("op9"):
            b = lax.psum(b, "y")
        return a, b

    program = jax.make_jaxpr(fn, axis_env=ENV)(S((4,), F32), S((8,), F32))
    graph = compiler.trace(jax.make_jaxpr(lambda a, b: (a, b))(S((4,), F32), S((8,), F32)))
    raw = compiler.index(program, fine, graph)
    assert [e.emitted.nbytes for e in raw.entries if e.emitted] == [16, 32]
    assert [e.deps for e in raw.entries] == [(), ()]
    combined = compiler.combine(raw, compiler.DEFAULT_THRESHOLD_BYTES, fine)
    idx = compiler.reindex(raw, combined, fine, graph)
    (e,) = [e for e in idx.entries if e.collectives]
    assert e.key == "combined:4,9" and e.op_ids == (4, 9) and e.collectives[0].bytes_per_device == 48
    assert compiler.combine(raw, 8, fine) is program  # over the threshold: nothing merges
    looped = small_program()  # loop bodies, one collective in each: nothing merges, nothing is retraced
    assert compiler.combine(ProgramIndex.build(looped, FINE, label), compiler.DEFAULT_THRESHOLD_BYTES, FINE) is looped


@pytest.mark.slow
def test_only_the_index_walks_the_equations_of_a_program():
    """No module but program_index.py enumerates a jaxpr's equations (``.eqns``); the
    others read the index. frontend/trace.py reads the user's jaxpr (into the IR), partitioner/manual_body.py
    the body of a user's shard_map region (replayed per device), runtime/stages.py one
    template equation of a jit of the identity, gp.testing the user's jaxpr (its reductions for a
    tolerance, its intermediates to annotate): never a partitioned program."""
    import ast
    import pathlib

    root = pathlib.Path(gp.__file__).parent
    allowed = {"program/program_index.py", "frontend/trace.py", "partitioner/manual_body.py", "runtime/stages.py",
               "testing/compare.py", "testing/metamorphic.py"}
    readers = set()
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text())
        if any(isinstance(n, ast.Attribute) and n.attr == "eqns" for n in ast.walk(tree)):
            readers.add(path.relative_to(root).as_posix())
    assert readers <= allowed, sorted(readers - allowed)
    assert "program/program_index.py" in readers
