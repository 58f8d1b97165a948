"""The program boundary as seeds (gspmd_py/compiler.py): the trace pass gives every output a
value of its own (its port), in/out shardings reach the seed pass as explicit dims, and the
seed pass reads the graph without changing it."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.api.primitive import spmd_call_p
from gspmd_py.core.sharding import Sharding

P = gp.P
MESH = gp.Mesh.abstract((2, 4), ("x", "y"))
S = jax.ShapeDtypeStruct
X, Y = MESH.ref("x"), MESH.ref("y")
F32 = jnp.float32


def traced(fn, *shapes):
    return compiler.trace(jax.make_jaxpr(fn)(*[S(s, F32) for s in shapes]), MESH)


def snapshot(graph) -> tuple:
    """Everything the passes could edit: the graph's text, its ops and values, who produces what."""
    ops = [(op.id, op.prim, tuple(v.id for v in op.inputs), tuple(v.id for v in op.outputs), dict(op.params))
           for op in graph.walk()]
    values = [(v.id, v.shape, v.name, None if v.producer is None else v.producer.id) for v in graph.all_values()]
    return repr(graph), ops, values, [v.id for v in graph.inputs], [v.id for v in graph.outputs]


def spec(prop, v):
    return Sharding.of(MESH, prop.dims_of(v)).spec


def port_source(v):
    """The value an output port returns (the port: an unspecified annotate op)."""
    op = v.producer
    assert op is not None and op.prim == "gspmd_annotate" and op.params["unspecified"]
    return op.inputs[0]


def mlp(x, w):
    h = gp.tag(jnp.tanh(gp.annotate(x, P("x", None)) @ w), "h")
    return h


def test_seed_turns_explicit_in_and_out_dims_into_seeds_and_leaves_the_graph_unchanged():
    g = traced(mlp, (8, 16), (16, 32))
    before = snapshot(g)
    s = compiler.seed(g, MESH, in_dims=[None, ((), (Y,))], out_dims=[((X,), (Y,))],
                      in_labels=["in_shardings of x", "in_shardings of w"], out_labels=["out_shardings[0]"])
    assert snapshot(g) == before and s.graph is g
    got = [(seed.value.id, seed.dims, seed.priority, seed.origin) for seed in s.seeds]
    ann = next(op for op in g.walk() if op.prim == "gspmd_annotate" and not op.params["unspecified"])
    assert got[0] == (g.inputs[1].id, ((), (Y,)), 0, "in_shardings of w")
    assert got[1][:3] == (ann.outputs[0].id, ((X,), ()), 0) and got[1][3].startswith("gp.annotate at ")
    assert got[2] == (g.outputs[0].id, ((X,), (Y,)), 0, "out_shardings[0]")
    assert len(got) == 3
    # the same seeds again: the pass is a function of its arguments
    again = compiler.seed(g, MESH, in_dims=[None, ((), (Y,))], out_dims=[((X,), (Y,))],
                          in_labels=["in_shardings of x", "in_shardings of w"], out_labels=["out_shardings[0]"])
    assert [(t.value.id, t.dims, t.origin) for t in again.seeds] == [(t[0], t[1], t[3]) for t in got]
    assert snapshot(g) == before


def test_default_labels_and_open_entries():
    g = traced(lambda a, b: (a + b, a * b), (8, 8), (8, 8))
    s = compiler.seed(g, MESH, in_dims=[((X,), None), None], out_dims=[None, ((), (Y,))])
    assert [(t.value.id, t.dims, t.origin) for t in s.seeds] == [
        (g.inputs[0].id, ((X,), None), "in_shardings of arg0"),
        (g.outputs[1].id, ((), (Y,)), "out_shardings of output 1")]


def test_trace_gives_each_output_a_port_of_its_own():
    """An input returned as is, one value returned twice, a constant: four distinct outputs."""
    def fn(x, w):
        y = x @ w
        return x, y, y, jnp.float32(3.0)

    g = traced(fn, (8, 16), (16, 32))
    assert len({v.id for v in g.outputs}) == 4
    sources = [port_source(v) for v in g.outputs]
    assert sources[0] is g.inputs[0]
    assert sources[1] is sources[2] and sources[1].producer.prim == "dot_general"
    assert sources[3].is_const and float(sources[3].const) == 3.0
    # numbering is deterministic: the same function traces to the same graph
    assert repr(traced(fn, (8, 16), (16, 32))) == repr(g)


def test_propagation_alone_from_boundary_seeds():
    """Each output laid out as its out_shardings say, unlike the value it returns."""
    def fn(x, w):
        y = x @ w
        return x, y, y, jnp.float32(3.0)

    g = traced(fn, (8, 16), (16, 32))
    before = snapshot(g)
    s = compiler.seed(g, MESH, in_dims=[((X,), ()), ((), (Y,))],
                      out_dims=[((), (Y,)), ((X,), ()), ((), (Y,)), None])
    prop = compiler.propagate(g, MESH, s.seeds)
    assert [spec(prop, v) for v in g.outputs] == [P(None, "y"), P("x", None), P(None, "y"), P()]
    assert spec(prop, g.inputs[0]) == P("x", None)  # out0 returns arg0, laid out otherwise
    assert spec(prop, port_source(g.outputs[1])) == P("x", "y")  # the dot itself: both axes
    assert snapshot(g) == before
    assert "out_shardings of output 1" in prop.explain(g.outputs[1], "out1")


def test_out_shardings_onto_a_partial_sum_reduce_it_once():
    """x @ w contracted over y: a partial sum over y; out_shardings (x, -) sum it once, at the port."""
    g = traced(lambda x, w: x @ w, (8, 16), (16, 32))
    s = compiler.seed(g, MESH, in_dims=[((X,), (Y,)), ((Y,), ())], out_dims=[((X,), ())])
    part = compiler.partition(g, MESH, compiler.propagate(g, MESH, s.seeds))
    colls = compiler.index(part.program, part.fine, g).collectives
    assert [(c.kind, c.axes) for c in colls] == [("all-reduce", ("y",))]


def test_gp_spmd_stages_the_function_as_written():
    """Under a JAX transformation gp.spmd binds spmd_call on the user's jaxpr (no annotate op for
    in/out shardings), its in/out shardings in the call's parameters."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(lambda x, w: x @ w, mesh, in_shardings=(P("x", None), None), out_shardings=P(None, "y"))
    jaxpr = jax.make_jaxpr(f)(S((8, 16), F32), S((16, 32), F32))
    [call] = [e for e in jaxpr.jaxpr.eqns if e.primitive is spmd_call_p] or [
        e for j in jaxpr.jaxpr.eqns for e in j.params["jaxpr"].jaxpr.eqns if e.primitive is spmd_call_p]
    assert [e.primitive.name for e in call.params["jaxpr"].jaxpr.eqns] == ["dot_general"]
    spmd = call.params["spmd"]
    assert [None if g is None else (g.dims, g.label) for g in spmd.in_shardings] == [
        (((mesh.ref("x"),), ()), "in_shardings of arg0"), None]
    assert [(g.dims, g.label) for g in spmd.out_shardings] == [(((), (mesh.ref("y"),)), "out_shardings of output 0")]


def test_gp_spmd_boundary_cases_run():
    """An output equal to an input, one value returned twice with different out_shardings, a
    constant, and a partial sum returned sharded: results equal the unpartitioned function's."""
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def fn(x, w):
        y = x @ w
        return x, y, y, jnp.float32(3.0)

    f = gp.spmd(fn, mesh, in_shardings=(P("x", "y"), P("y", None)),
                out_shardings=(P(None, "y"), P("x", None), P(None, "y"), None))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 32)).astype(np.float32)
    outs = f(x, w)
    for got, want in zip(outs, fn(x, w)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    plan = f.plan(x, w)
    assert [str(s.spec) for s in plan.out_shardings] == [str(P(None, "y")), str(P("x", None)),
                                                         str(P(None, "y")), str(P())]
    # the dot's partial sum over y, reduced once for both outputs that return it
    assert sum(c.kind in ("all-reduce", "reduce-scatter") for c in plan.collectives) == 1
    assert "out_shardings of output 1" in plan.explain("out1")
