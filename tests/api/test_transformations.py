"""A gp.spmd function is a JAX function: jax.jit, grad, value_and_grad, vjp, jvp, vmap, lax.scan,
jax.checkpoint and gp.spmd itself compose with it and give the plain function's results.

Under a transformation the function binds ``spmd_call`` (gspmd_py/api/primitive.py); JAX
transforms the user's jaxpr and gspmd_py partitions each derived program.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp
from gspmd_py.api.primitive import spmd_call_p
from partition_util import assert_same, examples, mesh_of, meshes, rand, spec_for

P = gp.P
TOL = dict(rtol=2e-5, atol=2e-5)


def mlp(x, w1, w2):
    h = gp.tag(jnp.tanh(x @ w1), "hidden")
    return h @ w2


def loss_of(fn):
    return lambda x, w1, w2: jnp.mean(fn(x, w1, w2) ** 2)


@pytest.fixture(scope="module")
def setup():
    mesh = mesh_of(1)  # (2, 4): x, y
    f = gp.spmd(mlp, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
    args = (rand((7, 12), seed=1), rand((12, 18), seed=2) / 4, rand((18, 5), seed=3) / 4)  # 7 / x, 18 / y: uneven
    return mesh, f, args


@pytest.mark.slow
def test_jit(setup):
    mesh, f, args = setup
    out = jax.jit(f)(*args)
    assert_same(out, mlp(*args), **TOL)
    # staged into the caller: one spmd_call inside the jit's program, nothing run eagerly
    jaxpr = jax.make_jaxpr(f)(*args)
    inner = jaxpr.eqns[0].params["jaxpr"]
    assert [e.primitive for e in inner.eqns] == [spmd_call_p]


@pytest.mark.slow
def test_grad_value_and_grad_vjp_jvp(setup):
    mesh, f, args = setup
    assert_same(jax.grad(loss_of(f), argnums=(0, 1, 2))(*args), jax.grad(loss_of(mlp), argnums=(0, 1, 2))(*args),
                **TOL)
    v, g = jax.value_and_grad(loss_of(f), argnums=1)(*args)
    v0, g0 = jax.value_and_grad(loss_of(mlp), argnums=1)(*args)
    assert_same((v, g), (v0, g0), **TOL)
    out, vjp = jax.vjp(f, *args)
    out0, vjp0 = jax.vjp(mlp, *args)
    ct = rand(out0.shape, seed=4)
    assert_same(vjp(ct), vjp0(ct), **TOL)
    tangents = tuple(rand(a.shape, seed=10 + i) for i, a in enumerate(args))
    assert_same(jax.jvp(f, args, tangents), jax.jvp(mlp, args, tangents), **TOL)
    # jit of grad: forward and backward programs are both partitioned by gspmd_py
    assert_same(jax.jit(jax.grad(loss_of(f), argnums=(1, 2)))(*args), jax.grad(loss_of(mlp), argnums=(1, 2))(*args),
                **TOL)


@pytest.mark.slow
def test_vmap_and_scan(setup):
    mesh, f, args = setup
    x, w1, w2 = args
    xs = np.stack([x, 2 * x, -x])
    assert_same(jax.vmap(f, in_axes=(0, None, None))(xs, w1, w2), jax.vmap(mlp, in_axes=(0, None, None))(xs, w1, w2),
                **TOL)
    assert_same(jax.vmap(f, in_axes=(1, None, None), out_axes=1)(xs, w1, w2),
                jax.vmap(mlp, in_axes=(1, None, None), out_axes=1)(xs, w1, w2), **TOL)

    def scanned(fn):
        def g(xs, w1, w2):
            return lax.scan(lambda c, xi: (c + fn(xi, w1, w2).sum(), fn(xi, w1, w2)), 0.0, xs)
        return g

    assert_same(jax.jit(scanned(f))(xs, w1, w2), scanned(mlp)(xs, w1, w2), **TOL)
    assert_same(jax.grad(lambda *a: scanned(f)(*a)[0], argnums=(1, 2))(xs, w1, w2),
                jax.grad(lambda *a: scanned(mlp)(*a)[0], argnums=(1, 2))(xs, w1, w2), **TOL)


@pytest.mark.slow
def test_vmap_spmd_axis_name_shards_the_batch_dim():
    """jax.vmap(..., spmd_axis_name="x") shards the new batch dim over x, as it does for
    jax.jit's sharding constraints; without it the batch dim is left to propagation."""
    mesh = mesh_of(1)
    f = gp.spmd(lambda a, w: gp.tag(jnp.tanh(a @ w), "h"), mesh, in_shardings=(P(None, None), P(None, "y")))
    xs, w = rand((4, 6, 5), seed=1), rand((5, 8), seed=2)
    want = jnp.tanh(xs @ w)
    for g in (jax.vmap(f, in_axes=(0, None), spmd_axis_name="x"),
              jax.jit(jax.vmap(f, in_axes=(0, None), spmd_axis_name="x"))):
        out = g(xs, w)
        assert_same(out, want, **TOL)
        assert out.sharding.spec == JP("x", None, "y")
    grad = jax.grad(lambda w: jax.vmap(f, in_axes=(0, None), spmd_axis_name="x")(xs, w).sum())(w)
    assert_same(grad, jax.grad(lambda w: jnp.tanh(xs @ w).sum())(w), **TOL)
    assert jax.vmap(f, in_axes=(0, None))(xs, w).sharding.spec[0] is None


@pytest.mark.slow
def test_second_order_and_checkpoint(setup):
    mesh, f, args = setup
    x, w1, w2 = args
    hvp = lambda fn: jax.jvp(jax.grad(lambda w: loss_of(fn)(x, w, w2)), (w1,), (w1,))
    assert_same(hvp(f), hvp(mlp), rtol=1e-4, atol=1e-4)
    assert_same(jax.grad(jax.checkpoint(loss_of(f)), argnums=1)(*args), jax.grad(loss_of(mlp), argnums=1)(*args), **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["jit", "grad", "value_and_grad", "vjp", "jvp", "vmap", "scan", "nested"])
@examples(2)
@given(st.data())
def test_transformations_match_plain_function(kind, data):
    """Random mesh, shapes (uneven included) and specs (sub-axes included), per transformation."""
    mesh = data.draw(meshes())
    m, k, n = (data.draw(st.sampled_from((3, 4, 6, 8, 13))) for _ in range(3))
    specs = tuple(data.draw(spec_for(mesh, 2, sub_axes=True)) for _ in range(2))
    fn = lambda x, w: jnp.sin(x @ w) * 2.0
    f = gp.spmd(fn, mesh, in_shardings=specs)
    x, w = rand((m, k), seed=m), rand((k, n), seed=n) / 2
    loss = lambda g: (lambda x, w: jnp.sum(g(x, w) ** 2))
    if kind == "jit":
        got, want = jax.jit(f)(x, w), fn(x, w)
    elif kind == "grad":
        got, want = jax.grad(loss(f), argnums=(0, 1))(x, w), jax.grad(loss(fn), argnums=(0, 1))(x, w)
    elif kind == "value_and_grad":
        got, want = jax.value_and_grad(loss(f))(x, w), jax.value_and_grad(loss(fn))(x, w)
    elif kind == "vjp":
        ct = rand((m, n), seed=5)
        got, want = jax.vjp(f, x, w)[1](ct), jax.vjp(fn, x, w)[1](ct)
    elif kind == "jvp":
        t = (rand((m, k), seed=6), rand((k, n), seed=7))
        got, want = jax.jvp(f, (x, w), t), jax.jvp(fn, (x, w), t)
    elif kind == "vmap":
        xs = np.stack([x, -x])
        got, want = jax.vmap(f, in_axes=(0, None))(xs, w), jax.vmap(fn, in_axes=(0, None))(xs, w)
    elif kind == "scan":
        step = lambda g: (lambda c, _: (g(c, w) @ w.T / k, None))
        got, want = lax.scan(step(f), x, None, length=2)[0], lax.scan(step(fn), x, None, length=2)[0]
    else:  # a gp.spmd function inside another: inlined, its in_shardings become annotations
        outer = gp.spmd(lambda x, w: f(x, w) + 1.0, mesh)
        got, want = outer(x, w), fn(x, w) + 1.0
    assert_same(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_jit_of_training_step():
    mesh = mesh_of(1)

    def loss(params, x, y):
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        return jnp.mean((h @ params["w2"] - y) ** 2)

    sloss = gp.spmd(loss, mesh, in_shardings=({"w1": P(None, "y"), "b1": P("y"), "w2": P("y", None)},
                                              P("x", None), P("x", None)))

    def step(lossfn):
        @jax.jit
        def update(params, x, y):
            l, g = jax.value_and_grad(lossfn)(params, x, y)
            return jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g), l
        return update

    params = {"w1": rand((8, 16), seed=1) / 3, "b1": rand((16,), seed=2) / 3, "w2": rand((16, 4), seed=3) / 3}
    x, y = rand((12, 8), seed=4), rand((12, 4), seed=5)
    p0, p1 = params, params
    for _ in range(3):
        p0, l0 = step(loss)(p0, x, y)
        p1, l1 = step(sloss)(p1, x, y)
        assert_same(l1, l0, **TOL)
    assert_same(p1, p0, **TOL)
    # the updated parameters come back laid out over the user's mesh, as planned
    assert p1["w1"].sharding.is_equivalent_to(NamedSharding(p1["w1"].sharding.mesh, JP(None, "y")), 2)
    assert p1["w1"].sharding.mesh.axis_names == ("x", "y")


def _collectives(hlo: str) -> list[str]:
    pat = r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\("
    return sorted(m.group(1) for m in re.finditer(pat, hlo))


def test_jit_of_grad_moves_no_more_data_than_planning_the_gradient():
    """The backward program takes the forward program's residuals in the layout they come out in
    (no resharding between the two by XLA): jax.jit(jax.grad(f)) compiles to the collectives of
    gp.spmd(jax.grad(plain f))."""
    mesh = mesh_of(1)
    specs = (P("x", None), P(None, "y"), P("y", None))
    args = (rand((16, 32), seed=1), rand((32, 64), seed=2) / 4, rand((64, 32), seed=3) / 4)
    loss = lambda fn: (lambda *a: jnp.mean(fn(*a) ** 2))
    f = gp.spmd(mlp, mesh, in_shardings=specs)
    staged = jax.jit(jax.grad(loss(f), argnums=(1, 2))).lower(*args).compile().as_text()
    direct = gp.spmd(jax.grad(loss(mlp), argnums=(1, 2)), mesh, in_shardings=specs).plan(*args).lower().compile().as_text()
    assert _collectives(staged) == _collectives(direct)
    assert "all-gather" not in _collectives(staged)


def test_nested_gp_spmd_inlines_inner_annotations():
    mesh = mesh_of(1)
    inner = gp.spmd(mlp, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
    outer = gp.spmd(lambda x, w1, w2: inner(x, w1, w2) * 2.0, mesh)  # no shardings of its own
    args = (rand((8, 12), seed=1), rand((12, 16), seed=2), rand((16, 4), seed=3))
    assert_same(outer(*args), mlp(*args) * 2.0, **TOL)
    plan = outer.plan(*args)
    assert plan.sharding_of("hidden") == inner.plan(*args).sharding_of("hidden") == gp.Sharding(mesh, P("x", "y"))
    assert plan.in_shardings[1] == gp.Sharding(mesh, P(None, "y"))
    assert [c.kind for c in plan.collectives] == [c.kind for c in inner.plan(*args).collectives]
    other = gp.spmd(lambda x, w1, w2: inner(x, w1, w2), mesh_of(2))
    with pytest.raises(gp.ShardingError, match=r"same mesh"):
        other.plan(*args)


def test_closure_over_traced_value_and_shard_map_refusal():
    mesh = mesh_of(0)

    @jax.jit
    def scaled(s, x):
        return gp.spmd(lambda v: v * s, mesh, in_shardings=P("x"))(x)  # closes over the jit's tracer s

    x = rand((13,))
    assert_same(scaled(np.float32(3.0), x), x * 3.0)
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]), ("x",))
    sm = jax.shard_map(gp.spmd(lambda v: v * 2.0, mesh), mesh=jm, in_specs=JP("x"), out_specs=JP("x"))
    with pytest.raises(gp.ArgumentError, match="inside jax.shard_map"):
        sm(rand((16,)))


def _counts(hlo: str) -> tuple[int, int]:
    return len(re.findall(r"\bdot\(", hlo)), len(re.findall(r"\btanh\(", hlo))


@pytest.mark.slow
def test_remat_recomputation_survives():
    """jax.checkpoint's recomputation stays in the compiled program, as under jax.jit."""
    mesh = mesh_of(1)

    def loss(ws, x, remat):
        h = x
        for w in ws:
            layer = lambda h, w: jnp.tanh(h @ w)
            h = (jax.checkpoint(layer) if remat else layer)(h, w)
        return jnp.mean(h ** 2)

    ws = [rand((16, 16), seed=i) / 4 for i in range(3)]
    x = rand((8, 16), seed=9)
    counts = {}
    for remat in (False, True):
        g = jax.grad(lambda ws, x: loss(ws, x, remat))
        f = gp.spmd(g, mesh, in_shardings=(None, P("x", None)))
        assert_same(f(ws, x), g(ws, x), **TOL)
        ours = _counts(f.plan(ws, x).lower().compile().as_text())
        ref = _counts(jax.jit(g).lower(ws, x).compile().as_text())
        assert ours == ref, (remat, ours, ref)
        counts[remat] = ours
    # the recomputed tanh are there (XLA would merge them without the barriers)
    assert counts[True][1] > counts[False][1]
    # the barriers are per input of the recomputed region, and kept local (no collective added)
    f = gp.spmd(jax.grad(lambda ws, x: loss(ws, x, True)), mesh, in_shardings=(None, P("x", None)))
    plan = f.plan(ws, x)
    barriers = [op for op in plan.graph.walk() if op.prim == "optimization_barrier_elementwise"]
    assert barriers and not plan.fallbacks


def test_outputs_over_the_users_mesh():
    mesh = mesh_of(1)  # x=2, y=4
    user = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))

    def fn(v):
        h = jnp.sin(v.reshape(2, 4, 8))  # dim 0 over y:(1)2, dim 1 over y:(2)2: sub-axes of y
        return h, h.reshape(8, 8) * 2.0

    f = gp.spmd(fn, mesh, in_shardings=P("y", None), out_shardings=(None, P("y", None)))
    v = rand((8, 8))
    plan = f.plan(v)
    assert plan.fine.names != mesh.axis_names  # the plan runs on a finer mesh ...
    outs = f(v)
    assert_same(outs, fn(v))
    # ... the merged-back output is over the user's mesh, same layout (no data moved)
    assert outs[1].sharding.mesh == user and outs[1].sharding.spec == JP("y", None)
    # the sub-axis layout cannot be said over the user's mesh: kept as is, and the report says why
    assert outs[0].sharding.mesh.axis_names == plan.fine.names
    assert "output 0 f32[2,4,8] is returned over the execution mesh" in plan.report()
    # under jax.jit every output is over the user's mesh (JAX needs that); the report says so
    jouts = jax.jit(f)(v)
    assert_same(jouts, fn(v))
    assert all(o.sharding.mesh == user for o in jouts)
    assert "under a JAX transformation, output 0" in plan.report()
    # an array laid out on the user's mesh is taken as is
    placed = jax.device_put(v, NamedSharding(user, JP("y", None)))
    assert plan.place([placed])[0] is placed
