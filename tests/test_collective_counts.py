"""Collective counts users expect (REFERENCE.md, 'Collective counts users expect')."""
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from gspmd_py.demo import transformer_block

P = gp.P


def counts(plan, axes=None):
    return Counter(c.kind for c in plan.collectives if axes is None or c.axes == axes)


def close(a, b, tol=1e-4):
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def block_args():
    B, T, D, H, K, F = 4, 8, 16, 4, 4, 32
    rng = np.random.default_rng(0)
    shapes = [((B, T, D), 1.0), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5),
              ((H, K, D), (H * K) ** -0.5), ((D, F), D ** -0.5), ((F, D), F ** -0.5), ((D,), 1.0), ((D,), 1.0)]
    return [(rng.standard_normal(s) * sc).astype(np.float32) for s, sc in shapes]


BLOCK_IN = (P("x", None, None), P(None, "y", None), P(None, "y", None), P(None, "y", None), P("y", None, None),
            P(None, "y"), P("y", None), None, None)


def test_transformer_block_forward_two_all_reduces(block_args):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(transformer_block, mesh, in_shardings=BLOCK_IN)
    assert counts(f.plan(*block_args)) == {"all-reduce": 2}
    close(f(*block_args), transformer_block(*block_args))


def test_transformer_block_backward_sums_partials_before_reducing(block_args):
    # separate Wq, Wk, Wv: XLA emits 6 tensor-parallel all-reduces for forward + backward;
    # summing the input gradient's partial contributions before reducing gives 4
    mesh = gp.Mesh((2, 4), ("x", "y"))
    g = jax.grad(lambda *a: transformer_block(*a).sum(), argnums=tuple(range(9)))
    f = gp.spmd(g, mesh, in_shardings=BLOCK_IN)
    plan = f.plan(*block_args)
    assert counts(plan, ("y",)) == {"all-reduce": 4}
    # the rest is the data-parallel gradient sync of the 8 parameters (over x, or x and y
    # for the replicated layernorm scales)
    assert sum(1 for c in plan.collectives if "x" in c.axes) == 8
    close(f(*block_args), g(*block_args))


def test_megatron_mlp_backward_one_all_reduce_for_the_input_gradient():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    mlp = lambda x, w1, w2: (jax.nn.gelu(x @ w1) @ w2).sum()
    g = jax.grad(mlp, argnums=(0, 1, 2))
    f = gp.spmd(g, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
    rng = np.random.default_rng(1)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 16), (16, 32), (32, 16)]]
    plan = f.plan(*args)
    # the forward output is never needed reduced (d sum / d out is ones), so the one
    # tensor-parallel all-reduce is the backward one, of the input gradient
    assert counts(plan, ("y",)) == {"all-reduce": 1}
    close(f(*args), g(*args))


def test_gspmd_2d_ffn_three_all_gathers_one_reduce_scatter():
    mesh = gp.Mesh((2, 4), ("X", "Y"))

    def ffn(x, wi, wo):
        h = jax.nn.relu(jnp.einsum("bsm,mh->bsh", x, wi))
        return jnp.einsum("bsh,hm->bsm", h, wo)

    f = gp.spmd(ffn, mesh, in_shardings=(P("X", None, "Y"), P("X", "Y"), P("Y", "X")),
                out_shardings=P("X", None, "Y"))
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(8, 4, 16), (16, 32), (32, 16)]]
    assert counts(f.plan(*args)) == {"all-gather": 3, "reduce-scatter": 1}
    close(f(*args), ffn(*args))
