"""Windowed and offset ops along sharded dims (issue #4): reduce_window (pooling),
select_and_scatter_add (max-pool gradient), pad, slice, rev, concatenate, split,
dynamic_slice, dynamic_update_slice, and a small 3D U-Net trained for a step.

Every case compares the partitioned run with the plain one; the collective checks make
sure the common cases move halos (collective-permutes) instead of all-gathering.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import check, examples, rand

MESH = gp.Mesh((2, 4), ("x", "y"))
SPECS = [gp.P(None, "y"), gp.P("x", "y"), gp.P(None, "y", "x"), gp.P(None, ("x", "y"))]
SPEC_IDS = ["H:y", "N:x,H:y", "H:y,W:x", "H:xy"]


def op_colls(plan, *prims):
    return [c for c in plan.collectives if any(c.op.startswith(p + " ") for p in prims)]


def maxpool(x):
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")


def avgpool(x):
    return lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4


POOLS = {
    "maxpool": maxpool,
    "avgpool": avgpool,
    "maxpool-grad": lambda x: jax.grad(lambda x: (maxpool(x) ** 2).sum())(x),
    "avgpool-grad": lambda x: jax.grad(lambda x: (avgpool(x) ** 2).sum())(x),
    "dilated": lambda x: lax.reduce_window(x, 0.0, lax.add, (1, 3, 2, 1), (1, 1, 2, 1), ((0, 0), (2, 1), (1, 1), (0, 0)),
                                           base_dilation=(1, 2, 1, 1), window_dilation=(1, 1, 2, 1)),
    "variadic": lambda x: lax.reduce_window((x, x * 2), (-jnp.inf, 0.0),
                                            lambda a, b: (lax.max(a[0], b[0]), a[1] + b[1]),
                                            (1, 3, 3, 1), (1, 2, 2, 1), "SAME"),
    "int-min": lambda x: lax.reduce_window((x * 10).astype(jnp.int32), jnp.iinfo(jnp.int32).max, lax.min,
                                           (1, 3, 3, 1), (1, 1, 1, 1), "SAME"),
}


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("name", list(POOLS))
def test_pooling(name, spec):
    x = rand((2, 30, 13, 3))
    plan = check(POOLS[name], MESH, (x,), (spec,), rtol=1e-4, atol=1e-4)
    windowed = op_colls(plan, "reduce_window_max", "reduce_window_sum", "reduce_window_min", "reduce_window",
                        "select_and_scatter_add", "pad")
    assert all(c.kind == "collective-permute" for c in windowed), [str(c) for c in windowed]
    assert not plan.fallbacks


@pytest.mark.slow
def test_maxpool_gradient_moves_halos_both_ways():
    x = rand((2, 32, 8, 3))
    plan = check(POOLS["maxpool-grad"], MESH, (x,), (gp.P(None, "y"),))
    sas = op_colls(plan, "select_and_scatter_add")
    # window 3 stride 2 SAME (padding (0, 1)): a one-row right halo in, the same row's
    # contributions back to its owner
    assert [c.kind for c in sas] == ["collective-permute"] * 2
    assert {c.bytes_per_device for c in sas} == {2 * 1 * 8 * 3 * 4}


@pytest.mark.slow
@pytest.mark.parametrize("n", [8, 7])
def test_wide_window_falls_back_to_gathering_the_dim(n):
    # a 7-row window on 2-row shards: the halo would need 4 permutes moving as much as an
    # all-gather; the pool gathers the dim, its gradient reuses that all-gather and
    # reduce-scatters its result
    pool = lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (1, 7, 1, 1), (1, 1, 1, 1), "SAME")
    fn = lambda x: jax.grad(lambda x: (pool(x) ** 2).sum())(x)
    plan = check(fn, MESH, (rand((2, n, 3, 2)),), (gp.P(None, "y"),))
    assert [c.kind for c in op_colls(plan, "reduce_window_max")] == ["all-gather"]
    assert [c.kind for c in op_colls(plan, "select_and_scatter_add")] == ["reduce-scatter"]
    assert len([nt for nt in plan.diagnostics.notes if "gathered whole" in nt]) == 2


@pytest.mark.slow
def test_maxpool_gradient_ties_and_infinities():
    x = np.zeros((1, 16, 4, 1), np.float32)
    x[0, 3:9] = -np.inf
    x[0, 12:] = 5.0
    check(POOLS["maxpool-grad"], MESH, (x,), (gp.P(None, "y"),))


# ---------------------------------------------------------------------------------------
# pad / slice / rev / concatenate / split
# ---------------------------------------------------------------------------------------

SHAPE_OPS = {
    "pad-few-rows": lambda x: lax.pad(x, 1.5, ((0, 0, 0), (2, 3, 0), (1, -1, 0), (0, 0, 0))),
    "pad-interior": lambda x: lax.pad(x, -1.0, ((0, 0, 0), (1, 2, 1), (0, 0, 2), (0, 0, 0))),
    "pad-negative": lambda x: lax.pad(x, 0.0, ((0, 0, 0), (-3, 2, 0), (0, 0, 0), (0, 0, 0))),
    "slice-few-rows": lambda x: x[:, 3:27],
    "slice-strided": lambda x: x[:, 1:29:3, ::2],
    "slice-small": lambda x: x[:, 2:4],
    "rev": lambda x: lax.rev(x, (1, 2)),
    "concat-two": lambda x: jnp.concatenate([x, x[:, :7] * 2], axis=1),
    "concat-three": lambda x: jnp.concatenate([x[:, :5], x * 2, x[:, 3:9]], axis=1),
    "split": lambda x: jnp.split(x, [4, 17], axis=1),
    "dynamic-slice": lambda x: lax.dynamic_slice_in_dim(x, 11, 4, 1),
    "dynamic-slice-big": lambda x: lax.dynamic_slice_in_dim(x, 3, 25, 1),
    "dynamic-slice-clamped": lambda x: lax.dynamic_slice_in_dim(x, 29, 4, 1),
    "dynamic-update-slice": lambda x: lax.dynamic_update_slice_in_dim(x, x[:, :5] * 3, 13, 1),
    "dynamic-update-slice-clamped": lambda x: lax.dynamic_update_slice_in_dim(x, x[:, :5] * 3, 28, 1),
}


@pytest.mark.slow
@pytest.mark.parametrize("spec", SPECS, ids=SPEC_IDS)
@pytest.mark.parametrize("name", list(SHAPE_OPS))
def test_shape_ops(name, spec):
    x = rand((2, 30, 13, 3))
    plan = check(SHAPE_OPS[name], MESH, (x,), (spec,))
    assert not plan.fallbacks


@pytest.mark.slow
def test_dynamic_index_from_argument():
    def f(x, i):
        return lax.dynamic_slice_in_dim(x, i, 3, 1), lax.dynamic_update_slice_in_dim(x, x[:, :2] + 1, i, 1)

    for i in (0, 7, 29, -4):
        check(f, MESH, (rand((2, 30, 5)), np.int32(i)), (gp.P(None, "y"), None))


def _no_gather(plan, prim):
    cs = op_colls(plan, prim)
    assert all(c.kind == "collective-permute" for c in cs), [str(c) for c in cs]
    return cs


def test_pad_by_a_few_rows_is_a_halo():
    x = rand((2, 32, 4))
    plan = check(lambda x: jnp.pad(x, ((0, 0), (1, 2), (0, 0)), constant_values=7.0), MESH, (x,), (gp.P(None, "y"),))
    cs = _no_gather(plan, "pad")
    # 35 rows on 4 shards: 9 rows each; output shard i reads input rows [9i-1, 9i+8) and holds
    # [8i, 8i+8): at most 2 rows from the right neighbour, nothing from the left (row -1 is padding)
    assert len(cs) == 1 and cs[0].bytes_per_device == 2 * 2 * 4 * 4
    assert plan.sharding_of("out0").spec == gp.P(None, "y", None)


def test_slice_off_a_few_rows_is_a_halo():
    x = rand((2, 32, 4))
    plan = check(lambda x: x[:, 2:30], MESH, (x,), (gp.P(None, "y"),))
    cs = _no_gather(plan, "slice")
    assert 1 <= len(cs) <= 2
    row = 2 * 4 * 4
    assert all(c.bytes_per_device <= 6 * row for c in cs)


@pytest.mark.parametrize("n,expect", [(32, 1), (30, 2)])
def test_rev_is_a_permute_of_shard_i_to_k_minus_1_minus_i(n, expect):
    x = rand((2, n, 4))
    plan = check(lambda x: lax.rev(x, (1,)), MESH, (x,), (gp.P(None, "y"),))
    cs = _no_gather(plan, "rev")
    assert len(cs) == expect  # even: one permute; uneven: plus a shift by k*c - n rows
    if n == 32:
        assert cs[0].bytes_per_device == 2 * 8 * 4 * 4  # a whole shard


def test_concat_of_two_operands_moves_less_than_gathering():
    x, y = rand((2, 32, 4)), rand((2, 16, 4), seed=1)
    plan = check(lambda x, y: jnp.concatenate([x, y], axis=1), MESH, (x, y), (gp.P(None, "y"), gp.P(None, "y")))
    cs = _no_gather(plan, "concatenate")
    moved = sum(c.bytes_per_device for c in cs)
    gathered = 3 * (8 + 4) * 2 * 4 * 4  # all-gathering both operands over 4 shards
    assert moved < gathered


def test_small_dynamic_slice_does_not_gather_the_operand():
    x = rand((2, 32, 4))
    plan = check(lambda x: lax.dynamic_slice_in_dim(x, 9, 2, 1), MESH, (x,), (gp.P(None, "y"),))
    # each device contributes the rows it holds; only the 2-row result (padded to 4 rows for a
    # reduce-scatter over 4 shards) is reduced, never the operand's 8-row shards
    assert all(c.bytes_per_device <= 4 * 2 * 4 * 4 for c in plan.collectives), [str(c) for c in plan.collectives]
    assert "all-gather" not in [c.kind for c in op_colls(plan, "dynamic_slice")]
    assert any("partial sums" in n for n in plan.diagnostics.notes)


def test_dynamic_update_slice_gathers_only_the_update():
    x, u = rand((2, 32, 4)), rand((2, 3, 4), seed=1)
    plan = check(lambda x, u: lax.dynamic_update_slice_in_dim(x, u, 10, 1), MESH, (x, u),
                 (gp.P(None, "y"), gp.P(None, "y")))
    cs = op_colls(plan, "dynamic_update_slice")
    assert all(c.bytes_per_device <= 2 * 1 * 4 * 4 for c in cs), [str(c) for c in cs]


@st.composite
def offset_ops(draw):
    n = draw(st.sampled_from([5, 7, 13, 30, 31]))
    kind = draw(st.sampled_from(["pad", "slice", "rev", "concat"]))
    if kind == "pad":
        lo, hi = draw(st.integers(-2, 4)), draw(st.integers(-2, 4))
        interior = draw(st.integers(0, 2))
        if n + (n - 1) * interior + lo + hi < 1:
            lo, hi = 0, 0
        fn = lambda x: lax.pad(x, 2.5, ((lo, hi, interior), (0, 0, 0)))
    elif kind == "slice":
        a = draw(st.integers(0, n - 1))
        b = draw(st.integers(a + 1, n))
        s = draw(st.integers(1, 3))
        fn = lambda x: lax.slice_in_dim(x, a, b, s, axis=0)
    elif kind == "rev":
        fn = lambda x: lax.rev(x, (0,))
    else:
        m = draw(st.integers(1, n))
        fn = lambda x: jnp.concatenate([x[:m] * 2, x, x[n - m:]], axis=0)
    spec = draw(st.sampled_from([gp.P("y"), gp.P(("x", "y")), gp.P("x", "y")]))
    return fn, n, spec


@pytest.mark.slow
@examples(12)
@given(offset_ops())
def test_random_offset_ops(case):
    fn, n, spec = case
    check(fn, MESH, (rand((n, 3)),), (spec,))


# ---------------------------------------------------------------------------------------
# a 3D U-Net-like model, spatially partitioned, one training step
# ---------------------------------------------------------------------------------------

DN3 = ("NDHWC", "DHWIO", "NDHWC")


def _conv3(x, w):
    return lax.conv_general_dilated(x, w, (1, 1, 1), "SAME", dimension_numbers=DN3)


def _up(x, mode):
    if mode == "repeat":
        for ax in (1, 2, 3):
            x = jnp.repeat(x, 2, axis=ax)
        return x
    n, d, h, w, c = x.shape
    return jax.image.resize(x, (n, 2 * d, 2 * h, 2 * w, c), "nearest")


def unet(params, x, mode):
    w1, w2, w3, w4 = params
    h1 = jax.nn.relu(_conv3(x, w1))
    h2 = lax.reduce_window(h1, -jnp.inf, lax.max, (1, 2, 2, 2, 1), (1, 2, 2, 2, 1), "VALID")
    h2 = jax.nn.relu(_conv3(h2, w2))
    h3 = jax.nn.relu(_conv3(jnp.concatenate([h1, _up(h2, mode)], axis=-1), w3))
    out = _conv3(h3, w4)
    return jnp.mean((out - x[..., :1]) ** 2)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["repeat", "resize"])
def test_unet3d_train_step(mode):
    def step(params, x):
        g = jax.grad(unet)(params, x, mode)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, g), unet(params, x, mode)

    x = rand((1, 8, 12, 6, 2))
    params = (rand((3, 3, 3, 2, 4), seed=1) * 0.3, rand((3, 3, 3, 4, 4), seed=2) * 0.3,
              rand((3, 3, 3, 8, 4), seed=3) * 0.3, rand((1, 1, 1, 4, 1), seed=4) * 0.3)
    plan = check(step, MESH, (params, x), ((gp.P(),) * 4, gp.P(None, "x", "y")), rtol=1e-4, atol=1e-4)
    assert not plan.fallbacks
    convs = op_colls(plan, "conv_general_dilated", "reduce_window_max", "select_and_scatter_add")
    assert convs and all(c.kind != "all-gather" for c in convs), [str(c) for c in convs]
