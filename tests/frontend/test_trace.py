"""Tracing into gspmd_py's IR: calls inlined, regions kept, pytrees as jax.jit takes them."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp
from gspmd_py.frontend.trace import trace

S = jax.ShapeDtypeStruct


def prims(graph):
    return [op.prim for op in graph.walk()]


def test_inlines_jit_remat_custom_jvp_and_vjp():
    @jax.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda _, g: (jnp.clip(g, -1, 1),))

    @jax.jit
    def inner(x):
        return jax.nn.relu(x) + jax.nn.softplus(x)  # softplus: custom_jvp in jax.nn (logaddexp)

    def f(x):
        y = jax.checkpoint(lambda t: jnp.sin(t) * 2)(inner(x))
        return clip_grad(y).sum()

    g = trace(jax.grad(f), [S((4, 8), jnp.float32)])
    names = prims(g)
    for call in ("jit", "pjit", "remat", "remat2", "checkpoint", "custom_jvp_call", "custom_vjp_call"):
        assert call not in names
    # the remat body's derivative, inlined (sin itself is dead code: grad discards the primal)
    assert "cos" in names and "sin" not in names


def test_regions_kept():
    def f(x):
        c, ys = lax.scan(lambda c, a: (c + a, c * 2), jnp.zeros(x.shape[1]), x)
        w = lax.while_loop(lambda v: v.sum() < 10, lambda v: v + 1, c)
        return lax.cond(w.sum() > 0, jnp.sin, jnp.cos, w), ys

    g = trace(f, [S((4, 8), jnp.float32)])
    top = [op.prim for op in g.ops]
    assert "scan" in top and "while" in top and "cond" in top
    scan = g.ops[top.index("scan")]
    assert len(scan.regions) == 1 and "add" in prims(scan.regions[0])
    assert len(g.ops[top.index("while")].regions) == 2
    assert len(g.ops[top.index("cond")].regions) == 2


def test_tag_names_value_and_literals_become_constants():
    g = trace(lambda x: gp.tag(x * 3.0, "h"), [S((2,), jnp.float32)])
    (mul,) = [op for op in g.ops if op.prim == "mul"]
    assert any(v.is_const and float(v.const) == 3.0 for v in mul.inputs)
    assert [v.name for v in g.values() if v.name] == ["h"]


def test_pytree_arguments_and_results():
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def f(params, batch):
        h = batch["x"] @ params["w"] + params["b"]
        return {"out": h, "norm": (h ** 2).sum()}, [h.mean()]

    params = {"w": np.ones((16, 8), np.float32), "b": np.zeros((8,), np.float32)}
    batch = {"x": np.arange(6 * 16, dtype=np.float32).reshape(6, 16) / 100}
    sf = gp.spmd(f, mesh, in_shardings=({"w": gp.P(None, "y"), "b": None}, {"x": gp.P("x", None)}))
    out = sf(params, batch)
    ref = f(params, batch)
    assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(ref)
    for a, b in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5)
    plan = sf.plan(params, batch)
    assert plan.in_shardings[0]["w"].shardy() == "[{}, {y}]"
    assert plan.out_shardings[0]["out"].shardy() == "[{x}, {y}]"


def test_decorator_form():
    mesh = gp.Mesh((8,), ("d",))

    @gp.spmd(mesh=mesh, in_shardings=gp.P("d"))
    def double(x):
        return x * 2

    np.testing.assert_allclose(np.asarray(double(np.arange(13.0, dtype=np.float32))), np.arange(13.0) * 2)
    assert double.plan(np.zeros(13, np.float32)).sharding_of("arg0").shardy() == "[{d}]"


def test_vmap_of_annotated_function_leaves_batch_dim_open():
    mesh = gp.Mesh((2, 4), ("x", "y"))

    def per_example(v):
        return gp.annotate(jnp.tanh(v), gp.P("y"))

    f = gp.spmd(jax.vmap(per_example), mesh, in_shardings=gp.P("x", None))
    x = np.linspace(-1, 1, 8 * 12, dtype=np.float32).reshape(8, 12)
    np.testing.assert_allclose(np.asarray(f(x)), np.tanh(x), rtol=1e-6)
    assert f.plan(x).out_shardings.shardy() == "[{x}, {y}]"
