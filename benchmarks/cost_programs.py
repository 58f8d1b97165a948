"""The programs and shardings that benchmarks/cost_validation.py measures (8 CPU devices).

Three reference programs, as the repo's tests use them (a Megatron MLP, a transformer
layer's training step, a conv net's gradient), each under several shardings: data
parallel, Megatron tensor parallel, 2D, sequence-sharded, spatial, replicated, and badly
chosen ones that reshard a lot. Sizes are picked so that one step takes 5-500 ms on a
loaded 2-core host: large enough to time, small enough to repeat.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import gspmd_py as gp

P = gp.P
XY = ("x", "y")


class Config(NamedTuple):
    name: str
    fn: Callable
    mesh: tuple  # (shape, names)
    in_shardings: tuple
    args: Callable  # rng -> tuple of numpy arrays
    out_shardings: Optional[object] = None


# -- programs -------------------------------------------------------------------------------
B, D, F = 256, 512, 1024


def mlp(x, w1, w2):
    return jax.nn.gelu(x @ w1) @ w2


def mlp_args(rng):
    return (rng.standard_normal((B, D), np.float32), rng.standard_normal((D, F), np.float32) * D ** -0.5,
            rng.standard_normal((F, D), np.float32) * F ** -0.5)


TB, TT, TD, TH, TF = 4, 128, 256, 8, 512


def layer(params, x):
    wq, wk, wv, wo, w1, w2 = params
    q = jnp.einsum("btd,dhk->bthk", x, wq)
    k = jnp.einsum("btd,dhk->bthk", x, wk)
    v = jnp.einsum("btd,dhk->bthk", x, wv)
    a = jax.nn.softmax(jnp.einsum("bthk,bshk->bhts", q, k) * (TD // TH) ** -0.5, -1)
    x = x + jnp.einsum("bhts,bshk,hkd->btd", a, v, wo)
    return x + jax.nn.gelu(x @ w1) @ w2


def train_step(params, x):
    loss = lambda p: jnp.mean(layer(p, x) ** 2)
    return jax.grad(loss)(params)


def layer_args(rng):
    hk = TD // TH
    shapes = [(TD, TH, hk)] * 3 + [(TH, hk, TD), (TD, TF), (TF, TD)]
    params = tuple(rng.standard_normal(s, np.float32) * s[0] ** -0.5 for s in shapes)
    return params, rng.standard_normal((TB, TT, TD), np.float32)


CN, CH, CC = 8, 64, 16


def conv_net(w1, w2, x):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    h = lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn)
    return jnp.mean(h ** 2)


def conv_grad(w1, w2, x):
    return jax.grad(conv_net, argnums=(0, 1))(w1, w2, x)


def conv_args(rng):
    return (rng.standard_normal((3, 3, CC, 32), np.float32) * 0.1, rng.standard_normal((3, 3, 32, 32), np.float32) * 0.1,
            rng.standard_normal((CN, CH, CH, CC), np.float32))


# -- shardings ------------------------------------------------------------------------------
M24 = ((2, 4), XY)
M8 = M24  # conv configs shard over both axes of the same mesh
_rep6 = (None,) * 6
_megatron = (P(None, "y", None), P(None, "y", None), P(None, "y", None), P("y", None, None), P(None, "y"), P("y", None))
_megatron8 = tuple(P(*[XY if s == "y" else s for s in spec]) for spec in _megatron)

CONFIGS = [
    Config("mlp data-parallel", mlp, M24, (P(XY, None), None, None), mlp_args),
    Config("mlp megatron (8-way)", mlp, M24, (None, P(None, XY), P(XY, None)), mlp_args),
    Config("mlp 2D (dp x, mp y)", mlp, M24, (P("x", None), P(None, "y"), P("y", None)), mlp_args),
    Config("mlp replicated", mlp, M24, (None, None, None), mlp_args),
    Config("mlp bad: contracting dim sharded", mlp, M24, (P(None, XY), P(XY, None), P(None, XY)), mlp_args),
    Config("mlp bad: weights on rows, batch out", mlp, M24, (P(XY, None), P(XY, None), P(XY, None)), mlp_args,
           P(None, XY)),
    Config("layer step data-parallel", train_step, M24, (_rep6, P(XY, None, None)), layer_args),
    Config("layer step megatron 2D", train_step, M24, (_megatron, P("x", None, None)), layer_args),
    Config("layer step megatron (8-way)", train_step, M24, (_megatron8, None), layer_args),
    Config("layer step sequence-sharded", train_step, M24, (_rep6, P(None, XY, None)), layer_args),
    Config("layer step bad: model dim sharded", train_step, M24,
           (tuple(P(XY, *([None] * (len(s) - 1))) for s in [(1, 1, 1)] * 3 + [(1, 1, 1), (1, 1), (1, 1)]),
            P(None, None, XY)), layer_args),
    Config("conv grad batch-parallel", conv_grad, M8, (None, None, P(XY, None, None, None)), conv_args),
    Config("conv grad spatial H (8)", conv_grad, M8, (None, None, P(None, XY, None, None)), conv_args),
    Config("conv grad spatial H x W", conv_grad, M24, (None, None, P(None, "x", "y", None)), conv_args),
    Config("conv grad bad: channels + H", conv_grad, M24,
           (P(None, None, None, XY), P(None, None, XY, None), P(None, XY, None, None)), conv_args),
]


def build(cfg: Config, abstract: bool = False):
    """(plan, numpy args) of a config."""
    shape, names = cfg.mesh
    mesh = gp.Mesh.abstract(shape, names) if abstract else gp.Mesh(shape, names)
    f = gp.spmd(cfg.fn, mesh, in_shardings=cfg.in_shardings, out_shardings=cfg.out_shardings)
    args = cfg.args(np.random.default_rng(0))
    return f.plan(*args), args
