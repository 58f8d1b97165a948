"""gp.pipeline: the GSPMD paper's pipelining (§3.3) written for the user.

Forward and gradient equal the layers applied in sequence (circular_repeats 1 and 2); it
composes with data parallelism (a batch sharded over another axis), with tensor
parallelism inside a stage, and with jax.grad; the report shows the schedule and bubble;
bad arguments are clear errors.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import assert_same

P = gp.P
MESH = gp.Mesh((2, 4), ("data", "pipe"))
D = 16


def stage_fn(p, h):
    return jnp.tanh(h @ p["w"] + p["b"])


def sequential(params, x):
    for l in range(params["w"].shape[0]):
        x = stage_fn(jax.tree_util.tree_map(lambda a: a[l], params), x)
    return x


def weights(layers: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return {"w": (rng.normal(size=(layers, D, D)) * 0.3).astype(np.float32),
            "b": rng.normal(size=(layers, D)).astype(np.float32)}


def batch(n: int, seed: int = 1):
    return np.random.default_rng(seed).normal(size=(n, D)).astype(np.float32)


PARAM_SPECS = {"w": P("pipe"), "b": P("pipe")}


def piped(microbatches: int, repeats: int):
    def f(params, x):
        return gp.pipeline(stage_fn, params, x, axis="pipe", microbatches=microbatches, circular_repeats=repeats)
    return f


@pytest.mark.slow
@pytest.mark.parametrize("repeats,microbatches", [(1, 4), (1, 2), (2, 4), (2, 6)])
def test_forward_equals_the_sequential_model(repeats, microbatches):
    params, x = weights(4 * repeats), batch(4 * microbatches)
    f = gp.spmd(piped(microbatches, repeats), MESH, in_shardings=(PARAM_SPECS, P("data", None)))
    out = f(params, x)
    assert_same(out, jnp.asarray(sequential(params, x)), rtol=2e-5, atol=2e-5)
    plan = f.plan(params, x)
    sched = gp.Schedule(4, microbatches, repeats)
    assert sched.iterations == microbatches * repeats + 3
    assert f"{sched}" in plan.report()
    assert "bubble" in plan.report()
    assert out.sharding.spec[0] in ("data", ("data",))  # the batch stays data-sharded


@pytest.mark.slow
@pytest.mark.parametrize("repeats", [1, 2])
def test_gradient_equals_the_sequential_model(repeats):
    params, x = weights(4 * repeats, 2), batch(16, 3)

    def loss(params, x):
        return jnp.sum(piped(4, repeats)(params, x) ** 2)

    f = gp.spmd(jax.grad(loss), MESH, in_shardings=(PARAM_SPECS, P("data", None)))
    got = f(params, x)
    want = jax.grad(lambda p, x: jnp.sum(sequential(p, x) ** 2))(params, x)
    assert_same(got, jax.tree_util.tree_map(jnp.asarray, want), rtol=1e-4, atol=1e-4)
    if repeats == 1:  # gradients come back sharded like the weights (a circular stack's layers
        # l = r * S + s lie on stage l % S: no tiled layout of the layer dim says that)
        for leaf in jax.tree_util.tree_leaves(got):
            assert leaf.sharding.spec[0] in ("pipe", ("pipe",))


@pytest.mark.slow
def test_tensor_parallel_inside_a_stage():
    mesh = gp.Mesh((2, 4), ("model", "pipe"))

    def mlp_stage(p, h):
        u = gp.annotate(jnp.tanh(h @ p["w1"]), P(None, "model"))
        return h + u @ p["w2"]

    rng = np.random.default_rng(4)
    params = {"w1": (rng.normal(size=(4, D, 32)) * 0.2).astype(np.float32),
              "w2": (rng.normal(size=(4, 32, D)) * 0.2).astype(np.float32)}
    x = batch(8, 5)

    def f(params, x):
        return gp.pipeline(mlp_stage, params, x, axis="pipe", microbatches=4)

    want = x
    for l in range(4):
        want = mlp_stage({k: v[l] for k, v in params.items()}, want)
    g = gp.spmd(f, mesh, in_shardings=({"w1": P("pipe", None, "model"), "w2": P("pipe", "model", None)}, None))
    assert_same(g(params, x), jnp.asarray(want), rtol=2e-5, atol=2e-5)


@pytest.mark.slow
def test_outside_gp_spmd_it_is_the_sequential_model():
    params, x = weights(8), batch(8)
    np.testing.assert_allclose(piped(4, 2)(params, x), sequential(params, x), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("kwargs,match", [
    (dict(microbatches=3), "does not split into microbatches=3"),
    (dict(microbatches=2, circular_repeats=2), "needs microbatches >= stages"),
    (dict(microbatches=4, circular_repeats=3), "do not split into circular_repeats=3"),
    (dict(microbatches=0), "microbatches must be a positive int"),
])
def test_bad_arguments_are_clear_errors(kwargs, match):
    params, x = weights(8), batch(8)
    with pytest.raises(gp.ArgumentError, match=match):
        gp.pipeline(stage_fn, params, x, axis="pipe", **kwargs)


def _in_loop(plan):
    return [(c.kind, c.axes) for c in plan.collectives if c.in_loop]


@pytest.mark.parametrize("repeats", [1, 2])
def test_inside_the_loop_only_collective_permutes_over_pipe(repeats):
    params, x = weights(4 * repeats), batch(16)
    f = gp.spmd(piped(4, repeats), MESH, in_shardings=(PARAM_SPECS, P("data", None)))
    plan = f.plan(params, x)
    assert _in_loop(plan) == [("collective-permute", ("pipe",))], plan.report()
    shift = next(c for c in plan.collectives if c.in_loop)
    assert shift.bytes_per_device == (16 // 4 // 2) * D * 4  # one microbatch shard: one stage, half the batch
    if repeats == 1:  # nothing else but the extraction of the last stage's rows: one pick all-reduce
        assert [(c.kind, c.in_loop) for c in plan.collectives] == [("collective-permute", True),
                                                                   ("all-reduce", False)], plan.report()
    assert not [c for c in plan.collectives if c.kind == "all-gather" and "pipe" in c.axes and c.in_loop]

    def loss(params, x):
        return jnp.sum(piped(4, repeats)(params, x) ** 2)

    # the backward pipeline: only permutes over pipe in the loop; the weight gradients are
    # accumulated as partial sums over data through the loop and reduced once after it
    # (with circular repeats each repeat's weight gradient is assembled by zero pads, which
    # carry the partial sum too)
    g = gp.spmd(jax.grad(loss), MESH, in_shardings=(PARAM_SPECS, P("data", None))).plan(params, x)
    assert {k for k, _ in _in_loop(g)} == {"collective-permute"}, g.report()
    assert {a for _, a in _in_loop(g)} == {("pipe",)}, g.report()
    assert [c.kind for c in g.collectives if c.axes == ("data",)] == ["all-reduce"], g.report()


@pytest.mark.parametrize("mesh_shape,repeats", [((2, 4), 2), ((2, 4), 5), ((1, 8), 2)])
def test_circular_weights_given_as_pipe_move_by_one_all_to_all_per_leaf(mesh_shape, repeats):
    """Issue 25: with circular_repeats > 1 the stacked weights given as P("pipe") were re-laid
    out by an all-gather over a sub-axis plus all-to-alls (or an all-gather of the whole stack):
    now one all-to-all per leaf, once, outside the loop, named by the report; values and
    gradients equal the sequential model."""
    mesh = gp.Mesh(mesh_shape, ("data", "pipe"))
    S = mesh_shape[1]
    params, x = weights(S * repeats, 6), batch(2 * S, 7)
    f = gp.spmd(piped(S, repeats), mesh, in_shardings=(PARAM_SPECS, P("data", None)))
    plan = f.plan(params, x)
    outside = [(c.kind, c.axes) for c in plan.collectives if not c.in_loop and c.kind != "all-reduce"]
    assert outside == [("all-to-all", ("pipe",))] * 2, plan.report()  # "w" and "b"
    assert _in_loop(plan) == [("collective-permute", ("pipe",))]
    assert "re-laid out once per call, before the loop, by one all-to-all per leaf" in plan.report()
    assert_same(f(params, x), jnp.asarray(sequential(params, x)), rtol=2e-5, atol=2e-5)
    if repeats != 5:
        return

    def loss(params, x):
        return jnp.sum(piped(S, repeats)(params, x) ** 2)

    g = gp.spmd(jax.grad(loss), mesh, in_shardings=(PARAM_SPECS, P("data", None)))
    want = jax.grad(lambda p, x: jnp.sum(sequential(p, x) ** 2))(params, x)
    assert_same(g(params, x), jax.tree_util.tree_map(jnp.asarray, want), rtol=1e-4, atol=1e-4)
    assert not [c for c in g.plan(params, x).collectives if c.kind == "all-gather" and "pipe" in c.axes]
