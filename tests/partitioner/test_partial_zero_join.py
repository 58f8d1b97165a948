"""A value that is zero everywhere (jnp.zeros, AD's zero cotangents, broadcast / converted /
reshaped from a constant zero) joins a partial sum as it is: every device holding a zero is
already a partial sum of that zero (n zeros sum to it), so no "itself on the first device,
-0.0 elsewhere" select and no device index is emitted for it. Seen in generated models
(benchmarks/modelgen.py): the weight-gradient accumulator of a recurrence's backward scan and
the zeros table that segment_sum / an embedding's gradient scatter-adds into; jax.jit's
partitioning of the same plans issues neither."""
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp
from partition_util import assert_same

P = gp.P
MESH = gp.Mesh((8,), ("x",))


def _rnn_grad(wh, xs):
    """jax.grad of a recurrence over time: the backward scan sums dW_h over the steps in a
    carry that starts as zeros; with the batch split over x each step's term is partial."""
    def loss(wh):
        def step(h, xt):
            h = jnp.tanh(xt + h @ wh)
            return h, h
        _, hs = lax.scan(step, jnp.zeros_like(xs[0]), xs)
        return (hs ** 2).sum()
    return jax.grad(loss)(wh)


def _segment_sums(x, w, ids):
    """Rows split over x (data parallel) scatter-added into a zeros table: each device adds
    its own rows, the table a partial sum over x (an embedding's gradient is this)."""
    return jax.ops.segment_sum(jnp.tanh(x @ w), ids, num_segments=8)


def _has_device_index(plan) -> bool:
    return "axis_index[" in plan.spmd_text()


def test_recurrence_weight_gradient_carry_needs_no_device_index():
    rng = np.random.default_rng(0)
    wh = jnp.asarray(rng.standard_normal((16, 16)).astype(np.float32) * 0.2)
    xs = jnp.asarray(rng.standard_normal((6, 8, 16)).astype(np.float32))
    f = gp.spmd(_rnn_grad, MESH, in_shardings=(None, P(None, "x", None)))
    plan = f.plan(wh, xs)
    assert not _has_device_index(plan)
    assert [c.kind for c in plan.collectives] == ["all-reduce"]  # one reduction, after the loop
    assert_same(f(wh, xs), jax.jit(_rnn_grad)(wh, xs), rtol=1e-5, atol=1e-5)


def test_scatter_add_into_zeros_needs_no_device_index():
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 8, (32,)), jnp.int32)
    f = gp.spmd(_segment_sums, MESH, in_shardings=(P("x", None), None, P("x")))
    plan = f.plan(x, w, ids)
    assert not _has_device_index(plan)
    assert [c.kind for c in plan.collectives] == ["all-reduce"]
    assert_same(f(x, w, ids), jax.jit(_segment_sums)(x, w, ids), rtol=1e-5, atol=1e-5)


def test_a_nonzero_initial_value_still_joins_on_one_device():
    """The carry starts at a value that is not zero: it must be counted once, not once per device."""
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal((32, 16)).astype(np.float32))
    w = jnp.asarray(rng.standard_normal((16, 8)).astype(np.float32))
    ids = jnp.asarray(rng.integers(0, 8, (32,)), jnp.int32)

    def fn(x, w, ids):
        return jnp.ones((8, 8), jnp.float32).at[ids].add(jnp.tanh(x @ w))

    f = gp.spmd(fn, MESH, in_shardings=(P("x", None), None, P("x")))
    assert _has_device_index(f.plan(x, w, ids))  # the ones join on the first device only
    assert_same(f(x, w, ids), jax.jit(fn)(x, w, ids), rtol=1e-5, atol=1e-5)
