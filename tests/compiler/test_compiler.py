"""The compiler's passes (gspmd_py/compiler.py), each run on its own: trace, fold_shifts, seed,
partition, combine, index; and plan_jaxpr, which runs them in order."""
from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.core.fine_mesh import FineMesh
from gspmd_py.core.sharding import Sharding

P = gp.P
MESH = gp.Mesh.abstract((2, 4), ("x", "y"))  # the passes need no devices
S = jax.ShapeDtypeStruct


def megatron_mlp(x, w1, w2):
    x = gp.annotate(x, P("x", None))
    w1 = gp.annotate(w1, P(None, "y"))
    w2 = gp.annotate(w2, P("y", None))
    h = gp.tag(jax.nn.relu(x @ w1), "hidden")
    return h @ w2


ARGS = (S((8, 16), jnp.float32), S((16, 32), jnp.float32), S((32, 16), jnp.float32))


def traced(fn=megatron_mlp, args=ARGS):
    return compiler.trace(jax.make_jaxpr(fn)(*args), MESH)


def spec_of(mesh, prop, v):
    return Sharding.of(mesh, prop.dims_of(v)).spec


def named(graph, name):
    return next(v for v in graph.values() if v.name == name)


def test_passes_are_named_in_order_and_each_is_a_function():
    names = [p.name for p in compiler.PASSES]
    assert names == ["trace", "fold_shifts", "seed", "apply_tactics", "propagate", "partition", "index", "combine",
                     "reindex", "choose_matmul"]
    for name in names:
        assert inspect.isfunction(getattr(compiler, name)), name


def test_trace_names_the_inputs():
    g = traced()
    assert [v.name for v in g.inputs] == ["arg0", "arg1", "arg2"]
    assert any(op.prim == "dot_general" for op in g.walk())


def test_seed_turns_annotations_and_in_dims_into_seeds():
    g = traced()
    s = compiler.seed(g, MESH)
    assert len(s.seeds) == 3 and s.tactics == ()
    # in_dims seed the inputs themselves, labelled as the caller says
    g2 = traced(lambda x: x * 2, ARGS[:1])
    dims = ((MESH.ref("x"),), ())
    s2 = compiler.seed(g2, MESH, in_dims=[dims], in_labels=["layout of x"])
    assert [(seed.value is g2.inputs[0], seed.origin) for seed in s2.seeds] == [(True, "layout of x")]


def test_propagation_alone_on_a_traced_graph():
    """Megatron MLP: the hidden activation is split over both axes, the output over x only
    (its y-sharded contraction leaves a partial sum)."""
    s = compiler.seed(traced(), MESH)
    prop = compiler.propagate(s.graph, MESH, s.seeds)
    g = s.graph
    assert spec_of(MESH, prop, named(g, "hidden")) == P("x", "y")
    assert spec_of(MESH, prop, g.outputs[0]) == P("x", None)
    dots = [op for op in g.walk() if op.prim == "dot_general"]
    assert len(dots) == 2 and all(op.id in prop.projections for op in dots)


def test_partition_on_given_projections_emits_their_collectives():
    """The same graph partitioned under two propagations: Megatron's (one all-reduce over y,
    for the second matmul's partial sum) and plain data parallelism (no collective)."""
    s = compiler.seed(traced(), MESH)
    megatron = compiler.partition(s.graph, MESH, compiler.propagate(s.graph, MESH, s.seeds))
    prims = [e.primitive.name for e in megatron.program.jaxpr.eqns]
    assert prims.count("psum") == 1 and "all_gather" not in prims
    assert megatron.diagnostics.fallbacks == () and megatron.in_dims[0] == (("x",), ())

    g = traced(lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2)
    x_only = compiler.seed(g, MESH, in_dims=[((MESH.ref("x"),), ()), ((), ()), ((), ())])
    dp = compiler.partition(g, MESH, compiler.propagate(g, MESH, x_only.seeds))
    assert not any(e.primitive.name in ("psum", "all_gather", "psum_scatter", "all_to_all", "ppermute")
                   for e in dp.program.jaxpr.eqns)
    assert compiler.index(dp.program, dp.fine, g).collectives == ()


def test_index_over_a_program():
    """Collective records read back from any per-device program: kind, axes, bytes, order."""
    fine = FineMesh.build(MESH, [MESH.ref("x"), MESH.ref("y")])

    def body(a, b):
        s = lax.psum(a, "y")
        t = lax.all_gather(b, "x", tiled=True)
        return s, t

    program = jax.make_jaxpr(body, axis_env=[("x", 2), ("y", 4)])(S((4, 8), jnp.float32), S((2, 3), jnp.float32))
    records = compiler.index(program, fine, traced()).collectives
    assert [(c.kind, c.axes, c.bytes_per_device) for c in records] == [
        ("all-reduce", ("y",), 4 * 8 * 4), ("all-gather", ("x",), 2 * 3 * 4)]


def test_combine_merges_independent_collectives():
    fine = FineMesh.build(MESH, [MESH.ref("y")])
    program = jax.make_jaxpr(lambda a, b: (lax.psum(a, "y"), lax.psum(b, "y")), axis_env=[("x", 2), ("y", 4)])(
        S((4,), jnp.float32), S((8,), jnp.float32))
    raw = compiler.index(program, fine, traced())
    assert len(raw.collectives) == 2
    combined = compiler.combine(raw, compiler.DEFAULT_THRESHOLD_BYTES, fine)  # reads the program through its index
    [c] = compiler.index(combined, fine, traced()).collectives  # one all-reduce of both buffers, flattened
    assert c.kind == "all-reduce" and c.shape == (12,) and c.bytes_per_device == 4 * 12
    assert compiler.combine(raw, 0, fine) is program  # threshold 0: off, the program as it was
    assert compiler.reindex(raw, program, fine, traced()) is raw  # nothing changed: not indexed again


def test_plan_jaxpr_is_the_passes_in_order():
    closed = jax.make_jaxpr(megatron_mlp)(*ARGS)
    plan = compiler.plan_jaxpr(closed, MESH, name="mlp")
    s = compiler.seed(compiler.trace(closed, MESH), MESH)
    part = compiler.partition(s.graph, MESH, compiler.propagate(s.graph, MESH, s.seeds))
    raw = compiler.index(part.program, part.fine, s.graph)
    program = compiler.combine(raw, compiler.DEFAULT_THRESHOLD_BYTES, part.fine)
    assert str(program) == plan.spmd_text()
    idx = compiler.reindex(raw, program, part.fine, s.graph)
    assert [str(c) for c in idx.collectives] == [str(c) for c in plan.collectives]
    assert plan.sharding_of("hidden").spec == P("x", "y")
    assert plan.in_names == ("arg0", "arg1", "arg2") and plan.tactics == ()


def test_the_passes_agree_with_running_it():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(a.shape).astype(np.float32) for a in ARGS]
    out = gp.spmd(megatron_mlp, mesh)(*args)
    np.testing.assert_allclose(np.asarray(out), megatron_mlp(*args), rtol=1e-5, atol=1e-5)


def test_planning_pauses_the_cyclic_gc_and_restores_it():
    """The collector is off while a plan is built (the user's trace included), back on after;
    a collector the caller turned off stays off; a plan with tactics (the search traces a
    program per candidate) keeps it on."""
    import gc

    seen = []

    def fn(x):
        seen.append(gc.isenabled())
        return x * 2

    assert gc.isenabled()
    gp.spmd(fn, MESH, in_shardings=(P("x"),)).plan(S((8,), jnp.float32))
    assert seen == [False] and gc.isenabled()
    with compiler.gc_paused():
        assert not gc.isenabled()
        with compiler.gc_paused():  # nested: left to the outermost
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gp.spmd(fn, MESH, tactics=[gp.tactics.batch("x", argnums=0)]).plan(S((8,), jnp.float32))
    assert seen[-1] is True and gc.isenabled()
    gc.disable()
    try:
        gp.spmd(fn, MESH, in_shardings=(P("x"),)).plan(S((8,), jnp.float32))
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_sharding_of_and_op_rules_are_shared():
    """Equal requests give one object: Sharding.of is memoised, and propagation builds one
    rule per distinct (primitive, params, shapes) (the ops of a repeated layer share it)."""
    s = Sharding.of(MESH, ((MESH.ref("x"),), ()))
    assert s is Sharding.of(MESH, [[MESH.ref("x")], []]) and s.spec == P("x", None)

    def two_layers(x, w):
        return jnp.tanh(jnp.tanh(x @ w) @ w)

    g = traced(two_layers, (S((8, 8), jnp.float32), S((8, 8), jnp.float32)))
    prop = compiler.propagate(g, MESH, [])
    tanh = [prop.rules[op.id] for op in g.ops if op.prim == "tanh"]
    assert len(tanh) == 2 and tanh[0] is tanh[1]
