"""What client libraries' programs emit, reproduced in plain JAX (no library imported):

- a collective over a ``jax.vmap`` axis name (``lax.pmean(x, "batch")`` inside
  ``jax.vmap(..., axis_name="batch")``: Equinox's ``BatchNorm``, per-example code normalised over
  its batch). JAX leaves ``psum`` / ``pmax`` / ``pmin`` over *positional* axes in the jaxpr (and a
  ``psum`` over no axes in the gradient); gspmd_py refused them as named-axis collectives. They
  are reductions of those dims (frontend/trace.py: ``POSITIONAL``).
- a pure primitive of the library's own that gspmd_py has no rule for (Equinox's ``unvmap_any``
  in ``eqx.error_if``): computed whole on every device with a PartitionWarning (ops/registry.py),
  no longer an UnsupportedOpError. An effectful one (io_callback) stays an error
  (test_plan_errors.py).

Each program equals the unpartitioned function over the 8-device meshes.
"""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

import gspmd_py as gp
from gspmd_py.frontend.trace import trace
from partition_util import assert_same, check, examples, maybe, mesh_of, meshes, rand, spec_for

P = gp.P
S = jax.ShapeDtypeStruct
DTYPES = (np.float32, jnp.bfloat16, np.int32)
BATCH = (8, 5, 12, 1)


def normalise(r):
    """Per example: minus the batch mean, plus the batch max and min (ints: the batch sum)."""
    if jnp.issubdtype(r.dtype, jnp.integer):
        return r * 2 - lax.psum(r, "batch")
    return r - lax.pmean(r, "batch") + lax.pmax(r, "batch") * 0.5 - lax.pmin(r, "batch")


def vmapped(x):
    return jax.vmap(normalise, axis_name="batch")(x)


def test_vmap_collectives_trace_as_reductions():
    x = rand((8, 4))
    prims = {op.prim for op in trace(vmapped, [S(x.shape, x.dtype)]).walk()}
    assert {"reduce_sum", "reduce_max", "reduce_min"} <= prims and not prims & {"psum", "pmax", "pmin"}


@examples(12)
@given(mesh=meshes(), batch=st.sampled_from(BATCH), feat=st.sampled_from((4, 3, 16)),
       dtype=st.sampled_from(DTYPES), data=st.data())
def test_collectives_over_a_vmap_axis(mesh, batch, feat, dtype, data):
    x = rand((batch, feat), dtype)
    spec = data.draw(maybe(spec_for(mesh, 2)))
    tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
    check(vmapped, mesh, (x,), in_specs=(spec,), rtol=tol, atol=tol)


def test_psum_of_several_operands_and_nested_vmap_axes():
    """``lax.psum((a, b), name)`` is one psum of two operands; nested vmaps reduce over two
    positional axes at once (``axes=(1, 0)``)."""
    a, b = rand((8, 6)), rand((8, 6), seed=1)

    def pair(a, b):
        return jax.vmap(lambda u, v: lax.psum((u, v * 2), "b"), axis_name="b")(a, b)

    def nested(a):
        inner = jax.vmap(lambda r: r - lax.pmean(r, ("i", "o")), axis_name="i")
        return jax.vmap(inner, axis_name="o")(a)

    for mesh, spec in ((mesh_of(0), P("x")), (mesh_of(1), P("x", "y"))):
        check(pair, mesh, (a, b), in_specs=(spec, None))
        check(nested, mesh, (a,), in_specs=(spec,))


def batch_norm_loss(w, x):
    """Equinox's BatchNorm in training mode: statistics by pmean over the vmapped batch; its
    gradient holds a psum over no axes."""
    def per_example(xi):
        h = xi @ w
        mean = lax.pmean(h, "batch")
        var = lax.pmean(jnp.square(h - mean), "batch")
        return (h - mean) * lax.rsqrt(var + 1e-5)
    return jnp.sum(jnp.tanh(jax.vmap(per_example, axis_name="batch")(x)) ** 2)


@pytest.mark.parametrize("i, specs", [(0, (None, P("x"))), (1, (P(None, "y"), P("x"))), (1, (None, P(("x", "y"))))])
def test_batch_norm_over_a_vmap_axis_gradient(i, specs):
    w, x = rand((6, 16), seed=2), rand((16, 6), seed=3)
    step = jax.value_and_grad(batch_norm_loss)
    assert "psum" in str(jax.make_jaxpr(step)(w, x))  # what JAX emits: the rule is needed
    check(step, mesh_of(i), (w, x), in_specs=specs, rtol=1e-4, atol=1e-4)


# -- a library's own pure primitive (Equinox's unvmap_any in eqx.error_if) -----------------------------------

any_p = Primitive("library_any")
any_p.def_impl(lambda x: jnp.any(x))
any_p.def_abstract_eval(lambda x: jax.core.ShapedArray((), np.bool_))
mlir.register_lowering(any_p, mlir.lower_fun(lambda x: jnp.any(x), multiple_results=False))


def checked(x):
    """``eqx.error_if``'s shape: a predicate reduced by the library's primitive, then a select."""
    bad = any_p.bind(x > 1.5)
    return jnp.where(bad, jnp.zeros_like(x), x * 2) + jnp.sum(x, axis=0)


@examples(10)
@given(mesh=meshes(), shape=st.sampled_from([(8, 4), (7, 5), (16, 3)]), data=st.data())
def test_unruled_pure_primitive_is_computed_whole(mesh, shape, data):
    x = rand(shape)
    spec = data.draw(spec_for(mesh, 2))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        plan = check(checked, mesh, (x,), in_specs=(spec,))
    if any(spec):
        assert any("library_any" in str(w.message) and issubclass(w.category, gp.PartitionWarning) for w in seen)
        assert "REPLICATED FALLBACK" in plan.report()


def test_unruled_pure_primitive_under_auto_shard_and_grad():
    x = rand((16, 8))
    loss = lambda x: jnp.sum(checked(x) ** 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gp.PartitionWarning)
        res = gp.auto_shard(jax.value_and_grad(loss), mesh_of(1), x, hardware=gp.Hardware.preset("h100-node"),
                            max_evaluations=10)
        assert_same(res.spmd(x), jax.jit(jax.value_and_grad(loss))(x), rtol=1e-5, atol=1e-5)
