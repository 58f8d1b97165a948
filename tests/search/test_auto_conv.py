"""Spatial plans for conv nets (issue 28, the zoo's U-Net): a conv's weight gradient, whose
contracted feature is the local batch, priced at its own class (cost/rates.py: a local batch
of 1 runs it several times slower than the forward conv on a CPU host); the one-axis spatial
start state (H over the axis) for NHWC data; and the search choosing spatial tiling where the
data-parallel local batch is small and data parallelism where it is large, on a fixed
(uncalibrated, deterministic) Hardware."""
import attrs
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.cost.rates import conv_class, conv_efficiency_of
from gspmd_py.propagation import Seed
from gspmd_py.search.price import Pricer
from gspmd_py.search.tables import CostTables

S = jax.ShapeDtypeStruct
f32 = jnp.float32
DN = ("NHWC", "HWIO", "NHWC")
# a 2-core CPU host as calibration measured it (per device, 8 devices), classes fixed: convs with
# few channels at a third of the matmul rate, a weight gradient at a local batch of 1 at 0.07
# (x f features, at most 0.3)
CLASSES = (("large-c/large-hw", 1.0), ("large-c/small-hw", 1.0), ("small-c/large-hw", 0.33),
           ("small-c/small-hw", 0.33), ("wgrad/large-f", 0.3), ("wgrad/small-f", 0.07))
CPU = attrs.evolve(gp.Hardware.preset("h100-node"), matmul_flops=(("float32", 25e9),), vector_flops=5e9,
                   mem_bandwidth=10e9, op_overhead=1e-5, step_overhead=1e-4, matmul_classes=(),
                   conv_classes=CLASSES, conv_efficiency=0.33)


def _conv(x, w, stride=1):
    return lax.conv_general_dilated(x, w, (stride, stride), "SAME", dimension_numbers=DN)


def unet_step(x, tgt, w1, w2, w3):
    """A small U-Net-like SGD step: conv, strided conv down, upsample, skip concat, conv."""
    def loss(w1, w2, w3):
        h1 = jax.nn.relu(_conv(x, w1))
        h2 = jax.nn.relu(_conv(h1, w2, 2))
        up = jnp.repeat(jnp.repeat(h2, 2, axis=1), 2, axis=2)
        return ((_conv(jnp.concatenate([up, h1], axis=-1), w3) - tgt) ** 2).mean()

    g = jax.grad(loss, argnums=(0, 1, 2))(w1, w2, w3)
    return tuple(w - 0.01 * gw for w, gw in zip((w1, w2, w3), g))


def _args(batch, hw=64, c=4, c1=16):
    return (S((batch, hw, hw, c), f32), S((batch, hw, hw, c), f32), S((3, 3, c, c1), f32),
            S((3, 3, c1, 2 * c1), f32), S((3, 3, 3 * c1, c), f32))


def _wgrad_eqn(batch, hw, c, stride=1):
    jaxpr = jax.make_jaxpr(jax.grad(lambda w, x: _conv(x, w, stride).sum()))(S((3, 3, c, c), f32), S((batch, hw, hw, c), f32))
    return [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"][-1]  # after the forward conv


def test_weight_gradient_conv_has_its_class():
    """The kernel's gradient contracts the local batch: "wgrad/small-f/<f>" for a batch under 8 on a
    large image, "wgrad/large-f" otherwise; the forward conv keeps its channel x image class."""
    cls = lambda e: conv_class(e.invars[0].aval.shape, e.invars[1].aval.shape, e.params["dimension_numbers"],
                               e.params["rhs_dilation"])
    assert cls(_wgrad_eqn(1, 64, 16)) == "wgrad/small-f/1"
    assert cls(_wgrad_eqn(4, 64, 16)) == "wgrad/small-f/4"
    assert cls(_wgrad_eqn(8, 64, 16)) == "wgrad/large-f"
    assert cls(_wgrad_eqn(2, 64, 16, stride=2)) == "wgrad/small-f/2"  # the output gradient dilated by the stride
    assert cls(_wgrad_eqn(1, 16, 16)) == "wgrad/large-f"  # a small image: no penalty measured
    x, w = (2, 64, 64, 8), (3, 3, 8, 8)
    assert conv_class(x, w, lax.conv_dimension_numbers(x, w, DN)) == "small-c/large-hw"
    assert conv_efficiency_of(CPU, "wgrad/small-f/2") == pytest.approx(0.14)
    assert conv_efficiency_of(CPU, "wgrad/small-f/7") == pytest.approx(0.3)  # at most the large-f rate
    assert conv_efficiency_of(attrs.evolve(CPU, conv_classes=()), "wgrad/small-f/2") == pytest.approx(0.33)


def test_model_prices_a_weight_gradient_conv_by_its_class():
    """Data parallel over 8 devices leaves a local batch of 1: its kernel gradient is priced at
    the per-feature rate (0.07), the forward conv at its small-c class (0.33)."""
    mesh = gp.Mesh.abstract((8,), ("m",))
    fn = jax.grad(lambda w, x: _conv(x, w).sum())
    plan = gp.spmd(fn, mesh, in_shardings=(None, gp.P("m"))).plan(S((3, 3, 16, 16), f32), S((8, 64, 64, 16), f32))
    (row,) = [o for o in plan.cost(attrs.evolve(CPU, op_overhead=0.0)).ops if o.label.startswith("conv_general_dilated")]
    assert row.compute_s == pytest.approx(row.flops / (25e9 * 0.07), rel=1e-9)


def test_tables_price_a_weight_gradient_conv_as_the_model_does():
    """The search's cost tables class the kernel gradient at its local shapes as the model does:
    a batch split over 8 devices leaves f = 1 (the model's row, its FLOPs at 0.07)."""
    hw = attrs.evolve(CPU, op_overhead=0.0, mem_bandwidth=1e18)
    mesh = gp.Mesh.abstract((8,), ("m",))
    fn = jax.grad(lambda w, x: _conv(x, w).sum())
    args = (S((3, 3, 16, 16), f32), S((8, 64, 64, 16), f32))
    graph = compiler.seed(compiler.trace(jax.make_jaxpr(fn)(*args), mesh), mesh).graph
    x = graph.inputs[1]
    prop = Pricer(graph, mesh, hw).propagate([Seed(x, ((mesh.ref("m"),), (), (), ()), 0, "test")])
    tables = CostTables(graph, mesh, hw)
    idx = tables.indices(prop)
    (t,) = [tables.table[idx[i]][0] for i, lay in enumerate(tables._layout)
            if lay[0] == "op" and lay[1].prim == "conv_general_dilated"]
    plan = gp.spmd(fn, mesh, in_shardings=(None, gp.P("m"))).plan(*args)
    (row,) = [o for o in plan.cost(hw).ops if o.label.startswith("conv_general_dilated")]
    assert row.compute_s == pytest.approx(row.flops / (25e9 * 0.07), rel=1e-9)
    assert t == pytest.approx(row.compute_s, rel=0.05)


def test_one_axis_spatial_start_state_for_nhwc_data():
    res = gp.auto_shard(unet_step, gp.Mesh.abstract((8,), ("x",)), *_args(8), hardware=CPU, max_evaluations=40)
    base = dict(res.search.baselines)
    assert base["spatial (H x)"].text == "arg0 dim 1 on x; arg1 dim 1 on x", base["spatial (H x)"].text


@pytest.mark.parametrize("mesh_shape,names", [((8,), ("x",)), ((2, 4), ("x", "y"))])
def test_search_tiles_the_image_for_a_small_local_batch_and_splits_a_large_batch(mesh_shape, names):
    """Batch 8 on 8 devices: data parallel leaves one image per device (kernel gradients at a
    local batch of 1), so the plan tiles H; batch 128: data parallel (no halos, 16 images each)."""
    mesh = gp.Mesh.abstract(mesh_shape, names)
    small = gp.auto_shard(unet_step, mesh, *_args(8), hardware=CPU, max_evaluations=60)
    x_small = small.in_shardings[0]
    assert x_small[1] is not None, (x_small, small.search.best.text)  # H split
    dp = dict(small.search.baselines)[f"data parallel ({','.join(names)})"]
    assert small.cost.step_s < dp.price.step_s
    large = gp.auto_shard(unet_step, mesh, *_args(128), hardware=CPU, max_evaluations=60)
    x_large = large.in_shardings[0]
    assert x_large[1] is None and set(jax.tree.leaves(tuple(x_large[:1]))) == set(names), (
        x_large, large.search.best.text)
