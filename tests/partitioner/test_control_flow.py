"""scan / while / cond: propagated into their bodies and partitioned inside one loop."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import gspmd_py as gp

P = gp.P


@pytest.fixture(scope="module")
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


def close(a, b, tol=1e-5):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


def scanned_mlp(x, ws):
    def layer(h, w):
        h = jnp.tanh(h @ w[0]) @ w[1]
        return h, h.sum()
    return lax.scan(layer, x, ws)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [8, 7])
def test_scan_forward_and_grad(mesh, batch):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, 16)).astype(np.float32)
    ws = (rng.standard_normal((3, 2, 16, 16)) * 0.2).astype(np.float32)
    ins = (gp.P("x", None), gp.P(None, None, None, "y"))
    f = gp.spmd(scanned_mlp, mesh, in_shardings=ins)
    close(f(x, ws), scanned_mlp(x, ws))
    g = jax.grad(lambda x, ws: scanned_mlp(x, ws)[0].sum(), argnums=(0, 1))
    close(gp.spmd(g, mesh, in_shardings=ins)(x, ws), g(x, ws), 1e-4)


def test_scan_body_is_partitioned_not_replicated(mesh):
    x = jax.ShapeDtypeStruct((8, 16), jnp.float32)
    ws = jax.ShapeDtypeStruct((3, 2, 16, 16), jnp.float32)
    p = gp.spmd(scanned_mlp, mesh, in_shardings=(gp.P("x", None), gp.P(None, None, None, "y"))).plan(x, ws)
    assert not p.fallbacks
    # the carry keeps the data-parallel sharding inside the body (GSPMD paper section 3.4: carry, body parameter and body result share one sharding)
    body = p.graph.ops[[op.prim for op in p.graph.ops].index("scan")].regions[0]
    assert p.sharding(body.inputs[0]).dims[0] == p.sharding(p.graph.inputs[0]).dims[0]
    assert "scan" in p.report() and "dot_general" in p.report()


def test_annotation_inside_scan_body(mesh):
    def f(x, ws):
        def layer(h, w):
            h = gp.annotate(h @ w, gp.P("x", "y"))
            return jnp.sin(h), None
        return lax.scan(layer, x, ws)[0]
    x = np.ones((8, 16), np.float32)
    ws = np.full((2, 16, 16), 0.1, np.float32)
    fs = gp.spmd(f, mesh)
    close(fs(x, ws), f(x, ws))
    assert fs.plan(x, ws).out_shardings.shardy() == "[{x}, {y}]"


def test_while_loop(mesh):
    def f(x):
        return lax.while_loop(lambda c: c[1] < 5, lambda c: (c[0] * 1.5 + 1, c[1] + 1), (x, 0))[0]
    x = np.arange(7 * 13, dtype=np.float32).reshape(7, 13)
    fs = gp.spmd(f, mesh, in_shardings=(gp.P("x", "y"),))
    close(fs(x), f(x))
    assert fs.plan(x).sharding_of("arg0") == fs.plan(x).out_shardings


@pytest.mark.parametrize("pred", [1.0, -1.0])
def test_cond(mesh, pred):
    def f(x, p):
        return lax.cond(p > 0, lambda a: jnp.sin(a) @ a.T, lambda a: a @ a.T, x)
    x = np.random.default_rng(1).standard_normal((8, 12)).astype(np.float32)
    fs = gp.spmd(f, mesh, in_shardings=(gp.P("x", "y"), None))
    close(fs(x, pred), f(x, pred))


@pytest.mark.slow
def test_a_carry_saved_as_a_residual_keeps_its_sharding_in_the_stack():
    """jax.grad of a scan over checkpointed layers: the forward scan returns every layer's
    input (the carry, saved as a residual) stacked; the body result IS the body parameter, so
    the two occurrences share one set of factors and the stack stays sharded [T, {x}, {y}]."""
    def loss(ws, x):
        body = jax.checkpoint(lambda h, w: (jnp.tanh(gp.annotate(h, P("x", "y")) @ w), None))
        return lax.scan(body, x, ws)[0].sum()

    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(jax.grad(loss), mesh, in_shardings=(P(None, "y", None), P("x", "y")))
    ws, x = np.random.default_rng(0).standard_normal((2, 4, 16, 16)).astype(np.float32) * 0.3
    x = x[0, :8]
    plan = f.plan(ws, x)
    stacks = [o for op in plan.graph.walk() if op.prim == "scan" for o in op.outputs if o.shape == (4, 8, 16)]
    assert stacks and all(plan.sharding(v).spec == P(None, "x", "y") for v in stacks)
    np.testing.assert_allclose(np.asarray(f(ws, x)), np.asarray(jax.grad(loss)(ws, x)), rtol=1e-5, atol=1e-5)
