"""A partial value that forks is reduced once, not once per branch (partitioner/fork.py).

Under data parallelism a weight's gradient is a partial sum. An Adam update uses it twice:
``m = b1*m + (1-b1)*g`` carries the partial through ``(1-b1)*g`` and reduces it at the add,
and ``v = b2*v + (1-b2)*g*g`` reduces ``g`` for the square and ``(1-b2)*g`` too: three
all-reduces of each gradient, where jax.jit moves one. The look-ahead reduces ``g`` where it
is made; deferral stays where it pays (one chain, AD's cotangent sums, smaller descendants).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import gspmd_py as gp
from benchmarks import hlo
from partition_util import assert_same, examples, jit_sharded, mesh_of

P = gp.P
REDUCING = ("all-reduce", "reduce-scatter")


def reductions(plan) -> int:
    """How many tensors the plan's reducing collectives carry (a combined one counts each)."""
    return sum(max(1, c.tensors) for c in plan.collectives if c.kind in REDUCING)


def reduced_bytes(plan) -> int:
    return sum(c.bytes_per_device for c in plan.collectives if c.kind in REDUCING)


def adam(w, m, v, g, lr=1e-3, b1=0.9, b2=0.999, eps=1e-8):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    return w - lr * m / (jnp.sqrt(v) + eps), m, v


def step(w1, w2, m1, m2, v1, v2, x, y):
    def loss(w1, w2):
        return jnp.sum((x @ w1) * y) + 0.5 * jnp.sum((x @ w2) ** 2)

    g1, g2 = jax.grad(loss, argnums=(0, 1))(w1, w2)
    a = adam(w1, m1, v1, g1)
    b = adam(w2, m2, v2, g2)
    return a[0], b[0], a[1], b[1], a[2], b[2]


def ints(rng, shape, dtype):
    return jnp.asarray(rng.integers(-2, 3, size=shape), dtype)


def args_of(b, d, e, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ws = [ints(rng, (d, e), dtype) for _ in range(2)]
    ms = [ints(rng, (d, e), dtype) for _ in range(2)]
    vs = [jnp.abs(ints(rng, (d, e), dtype)) for _ in range(2)]
    return (*ws, *ms, *vs, ints(rng, (b, d), dtype), ints(rng, (b, e), dtype))


def specs(batch_axes):
    return (P(None, None),) * 6 + (P(batch_axes, None),) * 2


def xla_reduced_bytes(fn, mesh, args, in_specs) -> int:
    from jax.sharding import NamedSharding
    from partition_util import _bits_mesh, jax_spec  # the test mesh as jax sees it

    jm = _bits_mesh(mesh)
    sh = tuple(NamedSharding(jm, jax_spec(mesh, s, a.ndim)) for s, a in zip(in_specs, args))
    text = jax.jit(fn, in_shardings=sh).lower(*args).compile().as_text()
    return sum(b for k, b in hlo.hlo_collectives(text) if k in REDUCING)


def test_adam_step_reduces_each_gradient_once_as_jax_jit_does():
    mesh = gp.Mesh((8,), ("x",))
    args = args_of(16, 24, 40, jnp.float32)
    f = gp.spmd(step, mesh, in_shardings=specs("x"))
    assert_same(f(*args), step(*args), rtol=1e-6, atol=1e-6)
    plan = f.plan(*args)
    grads = 2 * 24 * 40 * 4
    assert reductions(plan) == 2  # one all-reduce per weight gradient (was 6)
    assert reduced_bytes(plan) == grads == xla_reduced_bytes(step, mesh, args, specs("x"))


@examples(12)
@given(mesh_i=st.integers(0, 3), b=st.integers(1, 19), d=st.integers(1, 9), e=st.integers(1, 9),
       dtype=st.sampled_from([jnp.float32, jnp.bfloat16]), all_axes=st.booleans())
def test_adam_step_over_meshes(mesh_i, b, d, e, dtype, all_axes):
    mesh = mesh_of(mesh_i)
    axes = tuple(mesh.axis_names) if all_axes else mesh.axis_names[0]
    args = args_of(b, d, e, dtype, seed=b * 100 + d * 10 + e)
    f = gp.spmd(step, mesh, in_shardings=specs(axes))
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    assert_same(f(*args), step(*args), rtol=tol, atol=tol)
    plan = f.plan(*args)
    assert reductions(plan) <= 2  # each gradient reduced at most once (none where b fits one device)
    assert reduced_bytes(plan) <= 2 * d * e * np.dtype(dtype).itemsize


def test_a_fork_that_matches_jax_jit_in_value():
    """The sum reduced at the fork equals XLA's partitioned step (same order of operations)."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = args_of(13, 5, 7, jnp.float32, seed=3)
    f = gp.spmd(step, mesh, in_shardings=specs(("x", "y")))
    assert_same(f(*args), jit_sharded(step, mesh, args, specs(("x", "y"))), rtol=1e-6, atol=1e-6)


# -- deferral that pays stays -------------------------------------------------------------------

def test_a_single_chain_stays_deferred_to_its_smaller_end():
    """A partial whose one use carries it to a smaller value is reduced there, once."""
    mesh = gp.Mesh((8,), ("x",))

    def f(x, y):
        g = x.T @ y  # [64, 64], partial over x
        return jnp.sum(0.5 * g, axis=0)

    rng = np.random.default_rng(1)
    args = (ints(rng, (16, 64), jnp.float32), ints(rng, (16, 64), jnp.float32))
    sf = gp.spmd(f, mesh, in_shardings=(P("x", None), P("x", None)))
    assert_same(sf(*args), f(*args))
    assert reduced_bytes(sf.plan(*args)) == 64 * 4


def test_two_small_ends_of_a_big_fork_stay_deferred():
    """Reducing two [64] sums costs less than reducing their [64, 64] source once."""
    mesh = gp.Mesh((8,), ("x",))

    def f(x, y):
        g = x.T @ y
        return jnp.sum(g, axis=0), jnp.sum(2.0 * g, axis=1)

    rng = np.random.default_rng(2)
    args = (ints(rng, (16, 64), jnp.float32), ints(rng, (16, 64), jnp.float32))
    sf = gp.spmd(f, mesh, in_shardings=(P("x", None), P("x", None)))
    assert_same(sf(*args), f(*args))
    assert reduced_bytes(sf.plan(*args)) == 2 * 64 * 4


def test_cotangent_sums_stay_partial_until_one_reduction():
    """A weight used twice: AD adds two partial cotangents (add_any), reduced once after."""
    mesh = gp.Mesh((8,), ("x",))

    def f(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w) @ w.T))(w)
        return w - 0.1 * g

    rng = np.random.default_rng(3)
    args = (jnp.asarray(rng.standard_normal((8, 8)), jnp.float32), jnp.asarray(rng.standard_normal((16, 8)), jnp.float32))
    sf = gp.spmd(f, mesh, in_shardings=(P(None, None), P("x", None)))
    assert_same(sf(*args), f(*args), rtol=1e-5, atol=1e-5)
    assert reductions(sf.plan(*args)) == 1


def test_a_lone_chain_to_an_equal_all_reduce_is_reduced_where_made():
    """An SGD step ``w - lr * g.T``: deferring the weight gradient's reduction through the
    transpose and the scale to the subtraction moves the same bytes and puts a pass over the
    partial before the all-reduce (one more pass over every weight per step, measured 17-20%
    of an embedding-table step on 8 CPU devices); the gradient is reduced where the dot makes
    it, as jax.jit's partitioner does, and the chain fuses with the update. Found by diffing
    generated models' HLO (benchmarks/modelgen.py)."""
    def sgd(w, x):
        g = jax.grad(lambda w: jnp.tanh(x @ w).sum())(w)
        return w - 0.1 * g

    def emb_sgd(e, tok):
        g = jax.grad(lambda e: jnp.tanh(jnp.take(e, tok, axis=0)).sum())(e)
        return e - 0.1 * g

    mesh = gp.Mesh((8,), ("x",))
    rng = np.random.default_rng(3)
    w = jnp.asarray(rng.standard_normal((16, 32)).astype(np.float32))
    x = jnp.asarray(rng.standard_normal((64, 16)).astype(np.float32))
    f = gp.spmd(sgd, mesh, in_shardings=(None, P("x", None)))
    (c,) = f.plan(w, x).collectives
    assert c.kind == "all-reduce" and c.op.startswith("dot_general"), c
    assert_same(f(w, x), jax.jit(sgd)(w, x), rtol=1e-5, atol=1e-5)
    e = jnp.asarray(rng.standard_normal((64, 8)).astype(np.float32))
    tok = jnp.asarray(rng.integers(0, 64, (16, 4)), jnp.int32)
    f = gp.spmd(emb_sgd, mesh, in_shardings=(None, P("x", None)))
    (c,) = f.plan(e, tok).collectives
    assert c.kind == "all-reduce" and c.op.startswith("scatter"), c
    assert_same(f(e, tok), jax.jit(emb_sgd)(e, tok), rtol=1e-5, atol=1e-5)
