"""jax.grad of an annotated function is an ordinary function: partitioning it gives the
same gradients as running it plainly (uneven batch sizes included)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import assert_same, examples, meshes, rand

P = gp.P
TOL = dict(rtol=1e-4, atol=1e-5)


def _mlp_loss(params, x, y):
    h = x @ params["w1"] + params["b1"]
    h = gp.annotate(h, P("x", "y"))
    h = jax.nn.gelu(h)
    out = h @ params["w2"]
    out = gp.annotate(out, P("x", None))
    return jnp.mean((out - y) ** 2)


def _mlp_params(d=16, h=32, o=8):
    return {"w1": rand((d, h), seed=1) * 0.3, "b1": rand((h,), seed=2) * 0.1, "w2": rand((h, o), seed=3) * 0.3}


def _check_grad(loss, mesh, args, in_shardings, argnums=0, **tol):
    g = jax.grad(loss, argnums=argnums)
    want = g(*args)
    f = gp.spmd(g, mesh, in_shardings=in_shardings)
    got = f(*args)
    assert_same(got, want, **(tol or TOL), what="grad")
    return f.plan(*args)


@pytest.mark.slow
@pytest.mark.parametrize("batch", [8, 7, 13])
def test_megatron_mlp_grad(batch):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    params = _mlp_params()
    x, y = rand((batch, 16), seed=4), rand((batch, 8), seed=5)
    specs = ({"w1": P(None, "y"), "b1": P("y"), "w2": P("y", None)}, P("x", None), P("x", None))
    plan = _check_grad(_mlp_loss, mesh, (params, x, y), specs)
    if batch == 8:
        # backward of a Megatron MLP: the weight grads are local, one all-reduce for the loss's
        # reduction over the batch; no all-gather of any weight
        gathered = [c for c in plan.collectives if c.kind == "all-gather"]
        assert not gathered, plan.report()


@pytest.mark.slow
def test_mlp_grad_wrt_inputs_and_params():
    mesh = gp.Mesh((2, 2, 2), ("x", "y", "z"))
    params = _mlp_params(d=12, h=20, o=6)
    x, y = rand((10, 12), seed=4), rand((10, 6), seed=5)
    specs = ({"w1": P("z", "y"), "b1": None, "w2": P("y", "z")}, P("x", "z"), None)
    _check_grad(_mlp_loss, mesh, (params, x, y), specs, argnums=(0, 1))


def _layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


def _classifier_loss(params, x, labels):
    """layernorm -> dense -> softmax cross-entropy, annotated in the middle."""
    h = _layernorm(x, params["g"], params["b"])
    h = gp.annotate(h, P("x", None))
    logits = h @ params["w"]
    logits = gp.annotate(logits, P("x", "y"))
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1])
    return -jnp.mean(jnp.sum(onehot * logp, axis=-1))


def _classifier_args(batch, d=12, c=10):
    params = {"g": 1.0 + rand((d,), seed=1) * 0.1, "b": rand((d,), seed=2) * 0.1, "w": rand((d, c), seed=3) * 0.3}
    x = rand((batch, d), seed=4)
    labels = (np.arange(batch) * 7 % c).astype(np.int32)
    return params, x, labels


@pytest.mark.slow
@pytest.mark.parametrize("batch", [16, 7, 13])
def test_softmax_layernorm_grad(batch):
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = _classifier_args(batch)
    specs = ({"g": None, "b": None, "w": P(None, "y")}, P("x", None), P("x"))
    _check_grad(_classifier_loss, mesh, args, specs)


def _attention_loss(params, x):
    q = gp.annotate(x @ params["wq"], P("x", None, "y"))
    k = x @ params["wk"]
    v = x @ params["wv"]
    s = jnp.einsum("bqd,bkd->bqk", q, k) / jnp.sqrt(q.shape[-1])
    a = jax.nn.softmax(s, axis=-1)
    o = jnp.einsum("bqk,bkd->bqd", a, v) @ params["wo"]
    return jnp.sum(_layernorm(o + x, 1.0, 0.0) ** 2)


@pytest.mark.slow
def test_attention_block_grad():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    d = 8
    params = {n: rand((d, d), seed=i) * 0.3 for i, n in enumerate(["wq", "wk", "wv", "wo"])}
    x = rand((3, 5, d), seed=9)
    specs = ({"wq": P(None, "y"), "wk": P(None, "y"), "wv": P(None, "y"), "wo": P("y", None)}, P("x", None, None))
    _check_grad(_attention_loss, mesh, (params, x), specs, argnums=(0, 1))


@pytest.mark.slow
@examples(6)
@given(meshes(), st.sampled_from([1, 3, 5, 8, 13]), st.sampled_from([4, 6, 12]), st.booleans())
def test_random_mesh_mlp_grad(mesh, batch, hidden, shard_inputs):
    """The annotated MLP's gradient on every mesh, batch sizes that do not divide."""
    names = mesh.axis_names
    a, b = names[0], names[-1]

    def loss(params, x, y):
        h = jnp.tanh(x @ params["w1"])
        h = gp.annotate(h, P(a, b) if a != b else P(a, None))
        return jnp.sum((h @ params["w2"] - y) ** 2)

    params = {"w1": rand((6, hidden), seed=1) * 0.5, "w2": rand((hidden, 5), seed=2) * 0.5}
    x, y = rand((batch, 6), seed=3), rand((batch, 5), seed=4)
    specs = ({"w1": P(None, b), "w2": P(b, None)}, P(a, None), None) if shard_inputs else None
    _check_grad(loss, mesh, (params, x, y), specs)
