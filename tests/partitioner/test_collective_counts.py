"""Collective counts users expect: Megatron (Shoeybi et al. 2019, one all-reduce per MLP forward
and backward), GSPMD's 2D FFN (Xu et al. 2021, section 3.3), and no more than XLA's own
partitioner issues for the same annotations (counted from its compiled HLO)."""
import re
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from gspmd_py.demo import transformer_block

P = gp.P


def counts(plan, axes=None):
    """Collective ops by kind (a combined collective counts once)."""
    return Counter(c.kind for c in plan.collectives if axes is None or c.axes == axes)


def tensors(plan):
    """Tensors moved by kind (a combined collective counts every tensor it carries)."""
    out = Counter()
    for c in plan.collectives:
        out[c.kind] += c.tensors
    return out


def close(a, b, tol=1e-4):
    """Equal up to f32 summation order: the absolute tolerance scales with the values' magnitude
    (another XLA may add a dot's partial sums in another order)."""
    for u, v in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        v = np.asarray(v)
        scale = max(1.0, float(np.max(np.abs(v)))) if v.size else 1.0
        np.testing.assert_allclose(np.asarray(u), v, rtol=tol, atol=tol * scale)


@pytest.fixture(scope="module")
def block_args():
    B, T, D, H, K, F = 4, 8, 16, 4, 4, 32
    rng = np.random.default_rng(0)
    shapes = [((B, T, D), 1.0), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5), ((D, H, K), D ** -0.5),
              ((H, K, D), (H * K) ** -0.5), ((D, F), D ** -0.5), ((F, D), F ** -0.5), ((D,), 1.0), ((D,), 1.0)]
    return [(rng.standard_normal(s) * sc).astype(np.float32) for s, sc in shapes]


BLOCK_IN = (P("x", None, None), P(None, "y", None), P(None, "y", None), P(None, "y", None), P("y", None, None),
            P(None, "y"), P("y", None), None, None)


@pytest.mark.slow
def test_transformer_block_forward_two_all_reduces(block_args):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(transformer_block, mesh, in_shardings=BLOCK_IN)
    assert counts(f.plan(*block_args)) == {"all-reduce": 2}
    close(f(*block_args), transformer_block(*block_args))


@pytest.mark.slow
def test_transformer_block_gradient_issues_no_more_collectives_than_xla(block_args):
    """Separate Wq, Wk, Wv, batch over x and Megatron over y. Tensor parallel: the attention
    output's forward all-reduce, and in the backward pass one all-reduce for the MLP input
    gradient and ONE for the three q/k/v input-gradient partials, summed before they are
    reduced (XLA reduces the three separately and combines them into one tuple all-reduce).
    Data parallel: the eight parameter gradients' all-reduces over x are combined into one.
    The forward output that jax.grad discards is dead code and costs nothing."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    g = jax.grad(lambda *a: transformer_block(*a).sum(), argnums=tuple(range(9)))
    f = gp.spmd(g, mesh, in_shardings=BLOCK_IN)
    plan = f.plan(*block_args)
    assert counts(plan, ("y",)) == {"all-reduce": 3}
    dp = [c for c in plan.collectives if c.axes == ("x",)]
    assert [(c.kind, c.tensors) for c in dp] == [("all-reduce", 8)]
    assert dp[0].op.startswith("combined:")
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    named = lambda spec: jax.sharding.NamedSharding(jm, jax.sharding.PartitionSpec(*(spec or ())))
    hlo = jax.jit(g, in_shardings=tuple(named(s) for s in BLOCK_IN),
                  out_shardings=tuple(named(s.spec) for s in plan.out_shardings)).lower(*block_args).compile().as_text()
    xla = xla_collectives(hlo)
    assert len(plan.collectives) <= len(xla), (plan.report(), xla)
    assert sum(c.bytes_per_device for c in plan.collectives) <= sum(b for _, b in xla)
    close(f(*block_args), g(*block_args))


_HLO_COLL = re.compile(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                       r"(?:-start)?\(")
_HLO_TYPE = re.compile(r"(pred|[fsuc]\d+|bf16)\[([\d,]*)\]")
_BYTES = {"pred": 1, "bf16": 2}


def xla_collectives(hlo: str) -> list[tuple[str, int]]:
    """(kind, bytes of the result buffers) of every collective op of compiled HLO text; a
    combined (tuple) collective counts once."""
    out = []
    for m in _HLO_COLL.finditer(hlo):
        nbytes = 0
        for dt, dims in _HLO_TYPE.findall(m.group(1)):
            n = int(np.prod([int(d) for d in dims.split(",") if d] or [1]))
            nbytes += n * _BYTES.get(dt, max(1, int(dt[1:]) // 8))
        out.append((m.group(2), nbytes))
    return out


@pytest.mark.slow
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
    plan = f.plan(*args)
    assert tensors(plan) == {"all-gather": 3, "reduce-scatter": 1}
    # wi's and wo's all-gathers over X are independent: the combiner issues them as one
    assert counts(plan) == {"all-gather": 2, "reduce-scatter": 1}
    close(f(*args), ffn(*args))
