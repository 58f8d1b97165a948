"""Spatially partitioned convolutions (issue #4): halo exchange, not all-gathers.

Every case compares the partitioned run with the plain one; the collective tests check
that a sharded spatial dim costs a halo (collective-permutes of a few rows), not the image.
Shapes do not divide the mesh (height 30 on 4 shards, width 13 on 2).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import check, examples, kinds, rand

MESH = gp.Mesh((2, 4), ("x", "y"))
NHWC = ("NHWC", "HWIO", "NHWC")
NCHW = ("NCHW", "OIHW", "NCHW")


def conv_fn(strides, padding, dn=NHWC, lhs_dil=None, rhs_dil=None, fgc=1):
    def f(x, w):
        return lax.conv_general_dilated(x, w, strides, padding, lhs_dilation=lhs_dil, rhs_dilation=rhs_dil,
                                        dimension_numbers=dn, feature_group_count=fgc)
    return f


def op_collectives(plan, prim="conv_general_dilated"):
    return [c for c in plan.collectives if c.op.startswith(prim)]


# (name, x shape, w shape, strides, padding, extra kwargs, x spec)
CASES = [
    ("3x3-same-H", (2, 30, 13, 3), (3, 3, 3, 4), (1, 1), "SAME", {}, gp.P(None, "y", None, None)),
    ("3x3-same-HW", (2, 30, 13, 3), (3, 3, 3, 4), (1, 1), "SAME", {}, gp.P(None, "y", "x", None)),
    ("3x3-s2-same", (2, 30, 13, 3), (3, 3, 3, 4), (2, 2), "SAME", {}, gp.P(None, "y", "x", None)),
    ("3x3-valid", (2, 30, 13, 3), (3, 3, 3, 4), (1, 1), "VALID", {}, gp.P("x", "y", None, None)),
    ("3x3-asym", (2, 30, 13, 3), (3, 3, 3, 4), (1, 1), ((2, 0), (1, 3)), {}, gp.P(None, "y", "x", None)),
    ("7x7-s2-pad3", (2, 30, 13, 3), (7, 7, 3, 4), (2, 2), ((3, 3), (3, 3)), {}, gp.P(None, "y", None, None)),
    ("7x7-s1-valid", (2, 30, 13, 3), (7, 7, 3, 4), (1, 1), "VALID", {}, gp.P(None, "y", None, None)),
    ("3x3-dilation2", (2, 30, 13, 3), (3, 3, 3, 4), (1, 1), "SAME", dict(rhs_dil=(2, 2)),
     gp.P(None, "y", "x", None)),
    ("3x3-lhs-dilation", (2, 30, 13, 3), (3, 3, 3, 4), (2, 1), ((2, 1), (1, 1)), dict(lhs_dil=(3, 2)),
     gp.P(None, "y", "x", None)),
    ("nchw-3x3", (2, 3, 30, 13), (4, 3, 3, 3), (1, 1), "SAME", dict(dn=NCHW), gp.P(None, None, "y", "x")),
    ("nchw-7x7-s2", (2, 3, 30, 13), (4, 3, 7, 7), (2, 2), ((3, 3), (3, 3)), dict(dn=NCHW),
     gp.P("x", None, "y", None)),
    ("depthwise", (2, 30, 13, 8), (3, 3, 1, 8), (1, 1), "SAME", dict(fgc=8), gp.P(None, "y", None, "x")),
    ("depthwise-mult2-s2", (2, 30, 13, 8), (3, 3, 1, 16), (2, 2), "SAME", dict(fgc=8),
     gp.P(None, "y", None, "x")),
    ("feature-sharded", (2, 30, 13, 4), (3, 3, 4, 5), (1, 1), "SAME", {}, gp.P(None, "y", None, "x")),
    ("halo-wider-than-shard", (2, 9, 5, 3), (7, 7, 3, 4), (1, 1), "SAME", {}, gp.P(None, "y", None, None)),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,xs,ws,strides,padding,kw,spec", CASES, ids=[c[0] for c in CASES])
def test_conv_matches_unpartitioned(name, xs, ws, strides, padding, kw, spec):
    f = conv_fn(strides, padding, **kw)
    plan = check(f, MESH, (rand(xs), rand(ws, seed=1)), (spec, None), rtol=1e-4, atol=1e-4)
    conv = op_collectives(plan)
    assert all(c.kind == "collective-permute" for c in conv), [str(c) for c in conv]
    assert not plan.fallbacks


def test_same_3x3_H_sharded_4_ways_two_permutes_of_one_row():
    x, w = rand((2, 32, 16, 3)), rand((3, 3, 3, 8), seed=1)
    plan = check(conv_fn((1, 1), "SAME"), MESH, (x, w), (gp.P(None, "y", None, None), None))
    assert kinds(plan) == ["collective-permute", "collective-permute"]
    row = 2 * 1 * 16 * 3 * 4  # one row of the local image: [batch, 1, W, C] f32
    assert [c.bytes_per_device for c in plan.collectives] == [row, row]
    assert all(c.axes == ("y",) for c in plan.collectives)
    assert plan.sharding_of("out0").spec == gp.P(None, "y", None, None)


@pytest.mark.slow
@pytest.mark.parametrize("axes", ["y", ("x", "y"), ("y", "x")])
@pytest.mark.parametrize("op", ["conv", "maxpool", "minpool_bf16"])
def test_plain_halo_is_one_concatenate_of_neighbour_rows(op, axes):
    """H divides evenly: the segment is (left neighbour's last rows, own rows, right
    neighbour's first rows), no masks; the edge devices see the op's padding value
    (0 for a conv, -inf / +inf for max / min pooling)."""
    x = rand((2, 32, 6, 3))
    spec = gp.P(None, axes, None, None)
    if op == "conv":
        plan = check(conv_fn((1, 1), "SAME"), MESH, (x, rand((3, 3, 3, 4), seed=1)), (spec, None))
    else:
        big, init, fn = (jnp.float32, -jnp.inf, lax.max) if op == "maxpool" else (jnp.bfloat16, jnp.inf, lax.min)
        pool = lambda v: lax.reduce_window(v.astype(big), jnp.asarray(init, big), fn, (1, 3, 3, 1), (1, 1, 1, 1), "SAME")
        plan = check(pool, MESH, (-jnp.abs(x) if op == "maxpool" else jnp.abs(x),), (spec,))
    assert kinds(plan) == ["collective-permute"] * 2
    text = plan.spmd_text()
    assert "concatenate" in text and "dynamic_slice" not in text


def test_same_3x3_H_and_W_sharded_four_permutes():
    x, w = rand((2, 16, 32, 3)), rand((3, 3, 3, 8), seed=1)
    plan = check(conv_fn((1, 1), "SAME"), MESH, (x, w), (gp.P(None, "x", "y", None), None))
    assert kinds(plan) == ["collective-permute"] * 4
    # H halo: one row of the local block [2, 1, 8, 3]; W halo on the H-extended block [2, 10, 1, 3]
    sizes = sorted(c.bytes_per_device for c in plan.collectives)
    assert sizes == sorted([2 * 1 * 8 * 3 * 4] * 2 + [2 * 10 * 1 * 3 * 4] * 2)


def test_reference_29_conv_7x7_stride2_pad3_halos_3_and_2_rows():
    # XLA spmd_partitioner_test's strided conv with halo exchange, with a batch of 2: f32[2,224,224,3] [1,2,1,1], 7x7, stride 2, padding 3, 64 features
    mesh = gp.Mesh((2,), ("x",), devices=[0, 1])
    x, w = rand((2, 224, 224, 3)), rand((7, 7, 3, 64), seed=1) * 0.1
    plan = check(conv_fn((2, 2), ((3, 3), (3, 3))), mesh, (x, w), (gp.P(None, "x"), None), rtol=1e-4, atol=1e-4)
    row = 2 * 224 * 3 * 4
    perms = plan.collectives
    assert [c.kind for c in perms] == ["collective-permute", "collective-permute"]
    # left halo: device 1 gets the last 3 rows of device 0; right halo: device 0 gets 2 rows of device 1
    assert sorted(c.bytes_per_device for c in perms) == [2 * row, 3 * row]
    assert plan.local_shape((2, 112, 112, 64), plan.fine.fine_dims(plan.sharding_of("out0").dims)) == \
        (2, 56, 112, 64)


def test_halo_wider_than_a_shard_takes_more_hops():
    # H=16 on 8 shards (2 rows each), 7x7 SAME: halos of 3 rows = two shards to each side,
    # 4 permutes moving 6 rows (an all-gather would move 14)
    x, w = rand((1, 16, 4, 2)), rand((7, 1, 2, 3), seed=1)
    plan = check(conv_fn((1, 1), "SAME"), MESH, (x, w), (gp.P(None, ("x", "y")), None))
    assert kinds(plan) == ["collective-permute"] * 4
    row = 1 * 1 * 4 * 2 * 4
    assert sorted(c.bytes_per_device for c in plan.collectives) == [row, row, 2 * row, 2 * row]
    assert not plan.diagnostics.notes


def test_huge_halo_falls_back_to_gather_whole_dim():
    # 7-row window on 2 rows per 4 shards: 4 permutes of 6 rows would move what one all-gather moves
    x, w = rand((1, 8, 4, 2)), rand((7, 1, 2, 3), seed=1)
    plan = check(conv_fn((1, 1), "SAME"), MESH, (x, w), (gp.P(None, "y"), None))
    assert kinds(plan) == ["all-gather"]
    assert any("gathered whole" in n for n in plan.diagnostics.notes)
    assert plan.sharding_of("out0").spec == gp.P(None, "y", None, None)  # the output stays sharded


def test_kernel_sharded_on_spatial_dims_is_made_whole():
    """The kernel's sharded spatial dim must be whole for the conv: its axis moves to the kernel's
    output channels (one all-to-all, dim 3 divides), and the note says where it went."""
    x, w = rand((2, 30, 13, 3)), rand((5, 5, 3, 4), seed=1)
    plan = check(conv_fn((1, 1), "SAME"), MESH, (x, w), (gp.P(None, "y"), gp.P("x")), rtol=1e-4, atol=1e-4)
    assert any("operand 1 dim 0" in n and "needs replication" in n and "moved to dim 3" in n
               for n in plan.diagnostics.notes)


def test_conv3d_volume_sharded_over_two_spatial_dims():
    dn = ("NDHWC", "DHWIO", "NDHWC")
    x, w = rand((1, 10, 13, 6, 2)), rand((3, 3, 3, 2, 4), seed=1)
    f = conv_fn((1, 2, 1), "SAME", dn=dn)
    plan = check(f, MESH, (x, w), (gp.P(None, "x", "y"), None), rtol=1e-4, atol=1e-4)
    conv = op_collectives(plan)
    assert conv and all(c.kind == "collective-permute" for c in conv)
    assert {c.axes for c in conv} == {("x",), ("y",)}


def small_net(params, x):
    w1, w2, w3 = params
    h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=NHWC))
    h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), "SAME")
    h = jax.nn.relu(lax.conv_general_dilated(h, w2, (2, 2), ((1, 1), (1, 1)), dimension_numbers=NHWC))
    h = lax.conv_general_dilated(h, w3, (1, 1), "SAME", dimension_numbers=NHWC, feature_group_count=4)
    return jnp.mean(h ** 2)


@pytest.mark.slow
def test_grad_of_conv_net_with_spatially_sharded_input():
    params = (rand((3, 3, 3, 4), seed=1) * 0.5, rand((3, 3, 4, 4), seed=2) * 0.5, rand((3, 3, 1, 4), seed=3) * 0.5)
    x = rand((2, 30, 13, 3))
    grad = jax.grad(small_net)
    plan = check(grad, MESH, (params, x), ((gp.P(),) * 3, gp.P("x", "y")), rtol=1e-4, atol=1e-4)
    assert not plan.fallbacks
    # no conv (forward, input gradient, weight gradient) gathers the activations
    assert all(c.kind != "all-gather" for c in op_collectives(plan)), [str(c) for c in op_collectives(plan)]


@st.composite
def conv_configs(draw):
    nchw = draw(st.booleans())
    H, W = draw(st.integers(5, 31)), draw(st.integers(3, 13))
    kh, kw = draw(st.integers(1, 5)), draw(st.integers(1, 3))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    rdh, rdw = draw(st.sampled_from([1, 1, 2])), draw(st.sampled_from([1, 2]))
    ldh, ldw = draw(st.sampled_from([1, 1, 2, 3])), draw(st.sampled_from([1, 2]))
    C = draw(st.sampled_from([2, 3, 4]))
    depthwise = draw(st.booleans()) and draw(st.booleans())
    O = C if depthwise else draw(st.integers(1, 4))
    pad = draw(st.sampled_from(["SAME", "VALID", "explicit"]))
    if pad == "explicit":
        pad = ((draw(st.integers(-1, 3)), draw(st.integers(-1, 3))), (draw(st.integers(0, 2)), draw(st.integers(0, 2))))
    hs, ws_ = draw(st.sampled_from([("y", "x"), ("y", None), (("x", "y"), None), (None, "y"), ("x", "y")]))
    dn = NCHW if nchw else NHWC
    xs = (2, C, H, W) if nchw else (2, H, W, C)
    wsh = (O, 1 if depthwise else C, kh, kw) if nchw else (kh, kw, 1 if depthwise else C, O)
    spec = gp.P(None, None, hs, ws_) if nchw else gp.P(None, hs, ws_, None)
    f = conv_fn((sh, sw), pad, dn=dn, lhs_dil=(ldh, ldw), rhs_dil=(rdh, rdw), fgc=C if depthwise else 1)
    return f, xs, wsh, spec


def _out_shape(f, xs, ws):
    try:
        return jax.eval_shape(f, jax.ShapeDtypeStruct(xs, jnp.float32), jax.ShapeDtypeStruct(ws, jnp.float32)).shape
    except Exception:  # noqa: BLE001  (the window does not fit: not a conv)
        return None


@pytest.mark.slow
@examples(10)
@given(conv_configs(), st.booleans())
def test_random_convs_and_their_gradients(cfg, grad):
    f, xs, ws, spec = cfg
    out = _out_shape(f, xs, ws)
    if out is None or 0 in out:
        return
    g = f
    if grad:
        g = jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))
    plan = check(g, MESH, (rand(xs), rand(ws, seed=1)), (spec, None), rtol=1e-4, atol=1e-4)
    assert not plan.fallbacks


@pytest.mark.parametrize("mesh,axis", [(MESH, "y"), (MESH, "x"), (gp.Mesh((8,), ("a",)), "a")])
def test_grouped_conv_weight_gradient_with_spatial_dim_and_out_channels_on_one_axis(mesh, axis):
    """Issue 25: the weight gradient of a feature_group_count=4 conv (a batch_group_count=4
    conv in JAX's transpose) with the input's H and the kernel's output channels on the same
    axis: the kernel-form conv met the cotangent's rows held whole and crashed."""
    f = conv_fn((1, 1), "SAME", fgc=4)
    x, w = rand((2, 12, 6, 8)), rand((3, 3, 2, 8), seed=1)
    grads = jax.grad(lambda x, w: (f(x, w) ** 2).sum(), argnums=(0, 1))
    plan = check(grads, mesh, (x, w), (gp.P(None, axis), gp.P(None, None, None, axis)), rtol=1e-3, atol=1e-3)
    assert not plan.fallbacks


def test_stride2_conv_weight_gradient_input_H_and_result_W_sharded():
    """Issue 25: the weight gradient of a stride-2 conv, the input's H over y and the result's
    W over x (a U-Net layer the search meets): the kernel-form dims must read the kernel rows
    each device holds, not the whole cotangent (was an assertion in conv_handler)."""
    def loss(x, w):
        y = lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=NHWC)
        return jnp.sum(gp.annotate(y, gp.P(None, None, "x", None)) ** 2)
    x, w = rand((2, 16, 16, 3)), rand((3, 3, 3, 4), seed=1)
    plan = check(jax.grad(loss, argnums=(0, 1)), MESH, (x, w), (gp.P(None, "y"), None), rtol=1e-4, atol=1e-4)
    assert not plan.fallbacks
