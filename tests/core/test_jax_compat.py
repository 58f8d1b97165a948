"""gspmd_py on every JAX it supports: the one compatibility module, and each thing that changed.

Each test names the JAX release whose change it covers; each fails on the code before
jax_compat.py under that release (CI runs the suite on the oldest and the newest JAX).
"""
from __future__ import annotations

import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from gspmd_py.core import jax_compat as compat

PACKAGE = pathlib.Path(gp.__file__).parent


def _close(out, ref, tol=1e-5):
    for o, r in zip(jax.tree.leaves(out), jax.tree.leaves(ref)):
        np.testing.assert_allclose(np.asarray(o, np.float32), np.asarray(r, np.float32), rtol=tol, atol=tol)


def test_every_private_name_gspmd_py_reads_exists():
    """A JAX release that moves one of the internals gspmd_py reads fails here, by name."""
    assert compat.missing_private() == []


def test_no_jax_src_import_outside_the_compat_module():
    pattern = re.compile(r"^\s*(from\s+jax\._src\b|import\s+jax\._src\b)|^\s*from\s+jax\s+import\s+_src\b", re.M)
    found = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if p.name != "jax_compat.py" and pattern.search(p.read_text())]
    assert found == []


def test_scan_counts_reads_this_jax():
    """0.11 packed scan's consts / carry / xs into ``ft_in``; ``num_consts`` / ``num_carry`` before."""
    def f(w, c, xs):
        return jax.lax.scan(lambda c, x: (c * w + x, c), c, xs)

    closed = jax.make_jaxpr(f)(1.0, jnp.ones(3), jnp.ones((4, 3)))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert compat.scan_counts(eqn.params) == (1, 1)


def test_scan_partitions(mesh):
    """ops/control.py and partitioner/control_handler.py read the counts through the compat module."""
    def f(c, xs):
        return jax.lax.scan(lambda c, r: (c + r, c * r), c, xs)

    c, xs = jnp.arange(4.0), jnp.arange(36.0).reshape(9, 4)
    out = gp.spmd(f, mesh, in_shardings=(gp.P("y"), gp.P(None, "y")))(c, xs)
    _close(out, f(c, xs))


def test_dce_rule_of_spmd_call(mesh):
    """0.12 calls DCE rules with the live inputs in between: jit / grad / vmap of a gp.spmd function."""
    f = gp.spmd(lambda x, y: (jnp.sin(x) * 2, y + 1), mesh, in_shardings=(gp.P("x", None), None))
    x, y = jnp.arange(32.0).reshape(8, 4), jnp.ones(3)
    np.testing.assert_allclose(jax.jit(lambda x, y: f(x, y)[0])(x, y), jnp.sin(x) * 2, rtol=1e-6)
    np.testing.assert_allclose(jax.grad(lambda x: f(x, y)[0].sum())(x), 2 * jnp.cos(x), rtol=1e-5)
    out = jax.vmap(lambda x: f(x, y)[0])(jnp.stack([x, x + 1]))
    np.testing.assert_allclose(out[1], jnp.sin(x + 1) * 2, rtol=1e-5)


@pytest.mark.parametrize("fn", [
    lambda x: jnp.searchsorted(jnp.linspace(0.0, 30.0, 11), x),
    lambda x: jnp.digitize(x, jnp.linspace(0.0, 30.0, 7)),
    lambda x: jnp.interp(x, jnp.linspace(0.0, 40.0, 5), jnp.arange(5.0) ** 2),
    lambda x: jnp.histogram(x, bins=5, range=(0.0, 32.0))[0],
], ids=["searchsorted", "digitize", "interp", "histogram"])
def test_hijax_primitives_expand(mesh, fn):
    """0.11's ``call_hi_primitive`` (jnp.searchsorted and what builds on it) expands into ordinary
    primitives through its own expansion."""
    x = jnp.arange(32.0).reshape(8, 4) + 0.5
    _close(gp.spmd(fn, mesh, in_shardings=(gp.P("x", "y"),))(x), fn(x))


def test_gradient_of_checkpointed_loop(mesh):
    """0.12 stages the differentiated body of a checkpointed loop as ``eval_jaxpr``."""
    def f(x):
        @jax.checkpoint
        def g(x):
            return jax.lax.scan(lambda c, r: (c * r, c), jnp.ones(4), x)[0].sum()
        return jax.grad(g)(x)

    x = jnp.linspace(0.5, 1.5, 32).reshape(8, 4)
    _close(gp.spmd(f, mesh, in_shardings=(gp.P("x", None),))(x), f(x))


def test_exact_gelu_gradient(mesh):
    """erf's gradient (exact GELU) is a ``polynomial`` primitive in 0.12."""
    f = lambda x: jax.grad(lambda x: jax.nn.gelu(x, approximate=False).sum())(x)
    x = jnp.linspace(-3, 3, 32).reshape(8, 4)
    _close(gp.spmd(f, mesh, in_shardings=(gp.P("x", "y"),))(x), f(x))


def test_checkpoint_name_is_an_identity_the_policy_still_sees(mesh):
    """MaxText names every layer's activations (primitive ``name``); a save_only_these_names policy
    reads them when JAX differentiates, and the program keeps only the named residual."""
    from jax.ad_checkpoint import checkpoint_name

    def layer(w, x):
        h = checkpoint_name(jnp.tanh(x @ w), "hidden")
        return jnp.sin(h) @ w.T

    policy = jax.checkpoint_policies.save_only_these_names("hidden")
    loss = lambda w, x: jax.checkpoint(layer, policy=policy)(w, x).sum()
    w, x = jnp.linspace(-1, 1, 32).reshape(4, 8), jnp.linspace(-1, 1, 32).reshape(8, 4)
    f = gp.spmd(jax.grad(loss), mesh, in_shardings=(gp.P(None, "y"), gp.P("x", None)))
    _close(f(w, x), jax.grad(loss)(w, x))
    # the policy saved the named value: the backward pass does not recompute tanh's matmul
    assert "name" not in {op.prim for op in f.plan(w, x).graph.walk()}


def test_closed_over_typed_key_is_a_constant(mesh):
    """A model holding its PRNG key (Flax NNX's Rngs) closes over a typed key array."""
    key = jax.random.key(3)
    keys = jax.random.split(jax.random.key(4), 8)
    f = lambda x: x + jax.random.normal(key, x.shape) + jax.vmap(lambda k: jax.random.uniform(k))(keys)[:, None]
    x = jnp.zeros((8, 4))
    _close(gp.spmd(f, mesh, in_shardings=(gp.P("x", None),))(x), f(x))


def test_float0_values_are_constants(mesh):
    """jax.grad(..., allow_int=True) / jax.vjp with an integer input give float0 cotangents."""
    def f(x):
        gx, gi = jax.grad(lambda a, i: (a * i).sum(), argnums=(0, 1), allow_int=True)(x, jnp.arange(4))
        _, vjp = jax.vjp(lambda a, i: a * i, x, jnp.arange(4))
        vx, vi = vjp(jnp.ones_like(x))
        return gx + vx, gi, vi

    x = jnp.ones((8, 4))
    out, ref = gp.spmd(f, mesh, in_shardings=(gp.P("x", None),))(x), f(x)
    _close(out[0], ref[0])
    assert out[1].dtype == ref[1].dtype and out[1].shape == ref[1].shape


def test_composite_inlines_its_decomposition(mesh):
    f = lambda x: jax.lax.composite(lambda x: jnp.sin(x) * 2, name="my.sin2")(x)
    x = jnp.arange(32.0).reshape(8, 4)
    _close(gp.spmd(f, mesh, in_shardings=(gp.P("x", "y"),))(x), f(x))


@pytest.mark.parametrize("flag", ["jax_remat3", "jax_custom_vjp3"])
def test_coming_defaults(mesh, flag):
    """Under jax_remat3 / jax_custom_vjp3 (upgrades that become the default), checkpoint and custom_vjp
    are hijax primitives, and a differentiated checkpoint's inputs go through one optimization barrier."""
    @jax.custom_vjp
    def h(x):
        return jnp.sin(x)

    h.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * jnp.cos(r),))

    def f(x):
        g = jax.checkpoint(lambda x: (h(x) * jnp.sin(x)).sum())
        return jax.grad(g)(x)

    x = jnp.linspace(-2, 2, 32).reshape(8, 4)
    old = getattr(jax.config, flag)
    jax.config.update(flag, True)
    try:
        with _no_fallback():
            out = gp.spmd(f, mesh, in_shardings=(gp.P("x", None),))(x)
        _close(out, f(x))
    finally:
        jax.config.update(flag, old)


class _no_fallback:
    """No replicated-fallback warning while the block runs."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("error", gp.PartitionWarning)

    def __exit__(self, *exc):
        return self._ctx.__exit__(*exc)


def test_explicit_mesh_round_trip():
    """jax.make_mesh(..., axis_types=Explicit) in; NamedShardings over it; outputs typed on it."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec as JP

    jm = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2)
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(jm, JP("x", None)))
    fn = lambda x: jnp.sin(x) @ jnp.ones((4, 4))
    f = gp.spmd(fn, jm, in_shardings=(NamedSharding(jm, JP("x", None)),), out_shardings=NamedSharding(jm, JP(None, "y")))
    out = f(x)
    _close(out, fn(x))
    assert out.sharding.mesh.axis_types == (AxisType.Explicit,) * 2
    assert out.sharding.spec == JP(None, "y")
    assert f.mesh == gp.Mesh.from_jax(jm) and f.mesh.explicit_axes == ("x", "y")
    # a gp.Mesh with the same devices reads the same specs
    g = gp.spmd(fn, jm, in_shardings=(gp.Sharding(gp.Mesh((2, 4), ("x", "y")), gp.P("x", None)),))
    _close(g(x), fn(x))
