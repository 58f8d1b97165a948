"""The cost model (issue 11): FLOPs, bytes, collective times, memory, hardware, determinism.

Every expected number is counted by hand in the comments; plans are made on abstract
meshes (no devices run anything) except for the calibration smoke test.
"""
from __future__ import annotations

import doctest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py.cost import Level, Link, collectives, counting, fusion, hardware, memory, model
from gspmd_py.cost.calibrate import fit_alpha_beta
from gspmd_py.cost.collectives import collective_time

P = gp.P
S = jax.ShapeDtypeStruct
F32 = jnp.float32
H100 = gp.Hardware.preset("h100-node")


def plan_of(fn, mesh, in_shardings, *shapes, out_shardings=None):
    f = gp.spmd(fn, mesh, in_shardings=in_shardings, out_shardings=out_shardings)
    return f.plan(*[S(s, F32) for s in shapes])


def megatron_mlp(x, w1, w2):
    return (x @ w1) @ w2


# -- exact counts ------------------------------------------------------------------------------

def test_megatron_mlp_flops_bytes_and_its_all_reduce():
    mesh = gp.Mesh.abstract((4,), ("m",))
    plan = plan_of(megatron_mlp, mesh, (None, P(None, "m"), P("m", None)), (8, 16), (16, 32), (32, 16))
    c = plan.cost(H100)
    # the two matmuls: 2*8*16*32 + 2*8*32*16 = 16384 FLOPs, a quarter on each of 4 devices
    assert c.flops == (2 * 8 * 16 * 32 + 2 * 8 * 32 * 16) // 4 == 4096
    # dot 1 reads x f32[8,16] (512 B) and w1's shard f32[16,8] (512 B), writes f32[8,8] (256 B);
    # dot 2 reads that (256 B) and w2's shard f32[8,16] (512 B), writes f32[8,16] (512 B)
    assert c.bytes_accessed == 512 + 512 + 256 + 256 + 512 + 512
    # one all-reduce of the partial f32[8,16] over m
    (ar,) = c.collectives
    assert (ar.collective.kind, ar.collective.axes, ar.collective.bytes_per_device, ar.count) == \
        ("all-reduce", ("m",), 512, 1)
    assert c.comm_bytes == 512 and c.comm_bytes_by_kind == {"all-reduce": 512}
    # ring all-reduce on NVLink (4 GPUs of one node): 2 * ((p-1) alpha + (p-1)/p * n / beta)
    nv = H100.topology.intra
    assert ar.seconds == pytest.approx(2 * (3 * nv.alpha + 3 / 4 * 512 / nv.beta))
    assert c.comm_s == pytest.approx(ar.seconds)
    # the replicated program does 4x the FLOPs
    rep = plan_of(megatron_mlp, mesh, (None, None, None), (8, 16), (16, 32), (32, 16)).cost(H100)
    assert rep.flops == 4 * c.flops and rep.comm_bytes == 0


def test_uneven_all_gather_bytes():
    mesh = gp.Mesh.abstract((4,), ("m",))
    plan = plan_of(lambda x: x + 1, mesh, (P("m", None),), (7, 16), out_shardings=P(None, None))
    c = plan.cost(H100)
    (ag,) = c.collectives
    # 7 rows over 4 devices: shards of ceil(7/4) = 2 rows (the last padded) of 16 f32 = 128 B each
    assert (ag.collective.kind, ag.collective.bytes_per_device) == ("all-gather", 2 * 16 * 4)
    assert c.comm_bytes == 128
    # the gathered buffer is 4 * 128 B: (p-1) alpha + (p-1)/p * 512 / beta
    nv = H100.topology.intra
    assert ag.seconds == pytest.approx(3 * nv.alpha + 3 / 4 * 512 / nv.beta)
    assert c.flops == 2 * 16  # the add on the local f32[2,16]


def test_conv_flops_count_only_taps_on_real_input():
    mesh = gp.Mesh.abstract((2,), ("m",))  # replicated (a size-1 mesh cannot be planned)
    dn = ("NHWC", "HWIO", "NHWC")
    conv = lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME", dimension_numbers=dn)
    c = plan_of(conv, mesh, (None, None), (2, 5, 4, 3), (3, 3, 3, 6)).cost(H100)
    # SAME 3x3: along a dim of n, the edge outputs see 2 taps, the others 3: H 2+3+3+3+2 = 13, W 2+3+3+2 = 10
    assert c.flops == 2 * 2 * 6 * 3 * 13 * 10
    assert counting.valid_taps(5, 3, 5, 1, 1, 1, 1) == 13
    # stride 2, lhs dilation 2 (a transposed conv): holes are not taps
    assert counting.valid_taps(3, 3, 5, 1, 1, 2, 1) == 7


def test_loop_trip_counts_multiply_the_body():
    mesh = gp.Mesh.abstract((2,), ("m",))  # replicated (a size-1 mesh cannot be planned)

    def scanned(x, w):
        return lax.scan(lambda h, _: (h @ w, None), x, None, length=5)[0]

    def counted(x, w):
        return lax.fori_loop(0, jnp.int32(6), lambda i, h: h @ w, x)

    def looped(x, w):  # while i < 7 with i from 0 by 1, written out
        return lax.while_loop(lambda s: s[0] < 7, lambda s: (s[0] + 1, s[1] @ w), (0, x))[1]

    dot = 2 * 4 * 8 * 8
    dots = lambda c: sum(o.flops for o in c.ops if o.label.startswith("dot_general"))
    for fn, trips in ((scanned, 5), (counted, 6), (looped, 7)):
        c = plan_of(fn, mesh, (None, None), (4, 8), (8, 8)).cost(H100)
        assert dots(c) == trips * dot, fn.__name__
        assert not c.notes
    # a trip count that depends on data: the documented assumption, said in the notes
    dyn = lambda x, w, n: lax.while_loop(lambda s: s[0] < n[0], lambda s: (s[0] + 1, s[1] @ w), (0, x))[1]
    f = gp.spmd(dyn, mesh, in_shardings=(None, None, None))
    p = f.plan(S((4, 8), F32), S((8, 8), F32), S((1,), jnp.int32))
    c1, c3 = p.cost(H100), p.cost(H100, while_trips=3)
    assert any("trip count" in n for n in c1.notes)
    assert (dots(c1), dots(c3)) == (dot, 3 * dot)


def test_cond_costs_its_costliest_branch():
    mesh = gp.Mesh.abstract((2,), ("m",))  # replicated (a size-1 mesh cannot be planned)
    fn = lambda p, x, w: lax.cond(p[0] > 0, lambda x: (x @ w) @ w, lambda x: x + 1.0, x)
    f = gp.spmd(fn, mesh, in_shardings=(None, None, None))
    c = f.plan(S((1,), F32), S((4, 8), F32), S((8, 8), F32)).cost(H100)
    assert sum(o.flops for o in c.ops if o.label.startswith("dot_general")) == 2 * (2 * 4 * 8 * 8)
    assert not any(o.label.startswith("add") for o in c.ops)  # the cheap branch is not counted
    assert any("costliest" in n for n in c.notes)


# -- memory -------------------------------------------------------------------------------------

def test_peak_memory_of_a_straight_line_program_and_donation():
    mesh = gp.Mesh.abstract((4,), ("m",))
    plan = plan_of(lambda x, w: (x @ w) @ w, mesh, (None, None), (8, 64), (64, 64))
    kib = 1024
    # x 2 KiB + w 16 KiB; y = x @ w: +2 KiB -> 20; z = y @ w: +2 KiB -> 22 KiB, then y is freed
    assert plan.cost(H100).peak_memory_bytes == 22 * kib
    c = plan.cost(H100, donate=(0,))
    # x donated: freed after y = x @ w (peak 20 KiB there), then w + y + z = 20 KiB
    assert c.peak_memory_bytes == 20 * kib
    assert (c.argument_bytes, c.output_bytes) == (18 * kib, 2 * kib)
    # an elementwise update writes over its donated operand: p - 0.1 g
    upd = plan_of(lambda p, g: p - 0.1 * g, mesh, (None, None), (32, 32), (32, 32))
    assert upd.cost(H100).peak_memory_bytes == 3 * 4 * kib  # p, g, new p
    assert upd.cost(H100, donate=(0,)).peak_memory_bytes == 2 * 4 * kib  # new p in p's buffer


def test_donation_read_from_the_plan():
    mesh = gp.Mesh.abstract((4,), ("m",))
    f = gp.spmd(lambda p, g: p - 0.1 * g, mesh, in_shardings=(None, None), donate_argnums=(0,))
    plan = f.plan(S((32, 32), F32), S((32, 32), F32))
    assert plan.donate_argnums == (0,)  # flat input indices
    assert plan.cost(H100).peak_memory_bytes == 2 * 4 * 1024  # the plan's donation, by default
    assert plan.cost(H100, donate=()).peak_memory_bytes == 3 * 4 * 1024  # overridden
    with pytest.raises(IndexError):
        plan.cost(H100, donate=(5,))


def test_fused_intermediates_take_no_memory():
    mesh = gp.Mesh.abstract((2,), ("m",))  # replicated (a size-1 mesh cannot be planned)
    # tanh(x @ w).sum(): the tanh is fused into the reduction: only x, w, the dot's result and the sum
    plan = plan_of(lambda x, w: jnp.tanh(x @ w).sum(), mesh, (None, None), (16, 16), (16, 16))
    c = plan.cost(H100)
    assert c.peak_memory_bytes == 3 * 1024 + 4
    assert c.transcendentals == 256


# -- links and collective formulas ------------------------------------------------------------

def test_collective_formulas_on_one_level():
    lk = Link(1e-6, 1e9)
    n, p = 8 * 2 ** 20, 8
    lv = [Level(p, lk)]
    ring = (p - 1) * 1e-6 + (p - 1) / p * n / 1e9
    assert collective_time("reduce-scatter", n, lv) == pytest.approx(ring)
    assert collective_time("all-gather", n // p, lv) == pytest.approx(ring)  # record holds the shard
    assert collective_time("all-reduce", n, lv) == pytest.approx(2 * ring)
    assert collective_time("all-to-all", n // p, lv) == pytest.approx((p - 1) * 1e-6 + (p - 1) / p ** 2 * n / 1e9)
    assert collective_time("collective-permute", n, lv) == pytest.approx(1e-6 + n / 1e9)
    # hierarchical all-reduce over 4 x 2: reduce-scatter inside (n), all-reduce of n/4 across, all-gather inside
    fast, slow = Link(1e-6, 1e10), Link(1e-5, 1e9)
    t = collective_time("all-reduce", n, [Level(4, fast), Level(2, slow)])
    rs_in = 3 * 1e-6 + 3 / 4 * n / 1e10
    ar_out = 2 * (1e-5 + 1 / 2 * (n / 4) / 1e9)
    assert t == pytest.approx(2 * rs_in + ar_out)


def test_hierarchical_preset_in_node_axis_is_faster():
    mesh = gp.Mesh.abstract((8, 8), ("data", "model"))  # 64 GPUs: 8 nodes of 8
    fn = lambda x, w: x @ w
    over_model = plan_of(fn, mesh, (P(None, "model"), P("model", None)), (64, 256), (256, 64)).cost(H100)
    over_data = plan_of(fn, mesh, (P(None, "data"), P("data", None)), (64, 256), (256, 64)).cost(H100)
    (a,), (b,) = over_model.collectives, over_data.collectives
    assert a.collective.kind == b.collective.kind == "all-reduce"
    assert a.collective.bytes_per_device == b.collective.bytes_per_device
    assert a.seconds < b.seconds
    assert [(lv.p, lv.link.name) for lv in H100.levels(mesh, ("model",))] == [(8, "nvlink")]
    assert [(lv.p, lv.link.name) for lv in H100.levels(mesh, ("data",))] == [(8, "network")]
    # both axes: NVLink inside each node, then the network across the 8 nodes
    assert [(lv.p, lv.link.name) for lv in H100.levels(mesh, ("data", "model"))] == [(8, "nvlink"), (8, "network")]


def test_tpu_torus_levels():
    v3 = gp.Hardware.preset("tpu-v3")
    mesh = gp.Mesh.abstract((8, 16), ("x", "y"))  # 128 cores = 64 chips on an 8x8 torus
    assert [(lv.p, lv.link.name) for lv in v3.levels(mesh, ("y",))] == [(2, "on-chip"), (8, "ici")]
    assert [(lv.p, lv.link.name) for lv in v3.levels(mesh, ("x",))] == [(8, "ici")]
    assert v3.topology.shape(1024) == (32, 32) and gp.Hardware.preset("tpu-v4").topology.shape(4096) == (16, 16, 16)
    with pytest.raises(gp.ShardingError, match="unknown hardware preset"):
        gp.Hardware.preset("tpu-v9")


def test_fit_recovers_alpha_and_beta():
    rows = np.array([[p - 1, (p - 1) / p * n] for p in (2, 4) for n in (1e4, 1e5, 1e6)])
    ts = rows @ np.array([5e-6, 1 / 2e9])
    a, inv_b = fit_alpha_beta(rows, ts)
    assert a == pytest.approx(5e-6) and 1 / inv_b == pytest.approx(2e9)


# -- scale and determinism -----------------------------------------------------------------------

def test_abstract_2048_devices_deterministic():
    def build():
        mesh = gp.Mesh.abstract((32, 64), ("x", "y"))
        f = gp.spmd(lambda x, w1, w2: jax.nn.relu(x @ w1) @ w2, mesh,
                    in_shardings=(P("x", None), P(None, "y"), P("y", None)))
        return f.plan(S((256, 512), jnp.bfloat16), S((512, 4096), jnp.bfloat16), S((4096, 512), jnp.bfloat16))

    hw = gp.Hardware.preset("tpu-v3")
    c1, c2 = build().cost(hw), build().cost(hw)
    assert c1 == c2 and c1.table() == c2.table()
    # per device: 256/32 = 8 rows, 4096/64 = 64 hidden: two matmuls of 2 * 8 * 512 * 64, the relu on bf16[8,64]
    assert c1.flops == 2 * (2 * 8 * 512 * 64) + 8 * 64
    assert c1.devices == 2048 and c1.fits and c1.step_s > 0
    (ar,) = c1.collectives
    assert ar.collective.kind == "all-reduce" and ar.collective.bytes_per_device == 8 * 512 * 2


def test_table_lists_top_ops_with_collectives():
    mesh = gp.Mesh.abstract((4,), ("m",))
    c = plan_of(megatron_mlp, mesh, (None, P(None, "m"), P("m", None)), (8, 16), (16, 32), (32, 16)).cost(H100)
    text = c.table(top=3)
    assert "all-reduce(m) 512 B" in text and "dot_general" in text and "step" in text
    assert c.step_s == c.step_serial_s >= c.step_overlap_s
    assert c.step_s == pytest.approx(c.compute_s + c.comm_s)


def test_doctests():
    for mod in (hardware, collectives, counting, fusion, memory, model):
        res = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert res.failed == 0, mod.__name__


@pytest.mark.slow
def test_calibrate_smoke():
    hw = gp.Hardware.calibrate(gp.Mesh((2, 4), ("x", "y")), sizes=(2 ** 12, 2 ** 16), reps=1)
    assert hw.peak("float32") > 0 and hw.mem_bandwidth > 0 and hw.vector_flops > 0
    for axis in ("x", "y"):
        lk = hw.topology.link(axis)
        assert lk.alpha >= 0 and lk.beta > 0
        assert {k for k, _, _ in lk.per_kind} == set(gp.cost.calibrate.KINDS)
    mesh = gp.Mesh((2, 4), ("x", "y"))
    c = plan_of(megatron_mlp, mesh, (P("x", None), P(None, "y"), P("y", None)), (8, 16), (16, 32), (32, 16)).cost(hw)
    assert c.comm_s > 0 and c.step_s > c.comm_s


def test_combined_collective_is_priced_as_one():
    """The combiner's merged all-reduce (one psum under "combined<ids>") pays one alpha."""
    from gspmd_py.core.fine_mesh import FineMesh
    from gspmd_py.program.program_index import ProgramIndex

    mesh = gp.Mesh.abstract((4,), ("m",))
    fine = FineMesh.build(mesh, [])

    def combined(a, b):  # as the combiner emits it: one flat buffer
        with jax.named_scope("combined1,2"):
            flat = lax.psum(jnp.concatenate([a, b]), "m")
            return flat[:8], flat[8:]

    def separate(a, b):
        with jax.named_scope("op1"):
            a = lax.psum(a, "m")
        with jax.named_scope("op2"):
            b = lax.psum(b, "m")
        return a, b

    def cost_input(fn):  # the cost model's typed input: no plan needed
        program = jax.make_jaxpr(fn, axis_env=[("m", 4)])(S((8,), F32), S((8,), F32))
        return model.CostInput(ProgramIndex.build(program, fine, lambda i: f"op {i}"), mesh)

    one, two = cost_input(combined), cost_input(separate)
    (rec,) = one.index.collectives
    assert (rec.kind, rec.bytes_per_device, rec.tensors, rec.op_id) == ("all-reduce", 64, 2, -1)
    c1, c2 = model.cost(one, H100), model.cost(two, H100)
    nv = H100.topology.intra
    (cc,) = c1.collectives
    assert cc.seconds == pytest.approx(2 * (3 * nv.alpha + 3 / 4 * 64 / nv.beta))
    assert c2.comm_s - c1.comm_s == pytest.approx(2 * 3 * nv.alpha)  # one alpha term fewer
    assert c1.comm_bytes == c2.comm_bytes == 64
    assert [o.label for o in c1.ops] == ["combined: op 1; op 2"]


def test_combiner_output_is_priced_as_one_collective():
    """Data-parallel gradients of two weights: the combiner issues one all-reduce for both."""
    mesh = gp.Mesh.abstract((4,), ("d",))

    def step(w1, w2, x):
        return jax.grad(lambda w1, w2: jnp.sum(jnp.tanh(x @ w1) @ w2), argnums=(0, 1))(w1, w2)

    plan = plan_of(step, mesh, (None, None, P("d", None)), (16, 32), (32, 8), (64, 16))
    (cc,) = plan.cost(H100).collectives
    # f32[16,32] + f32[32,8] = 2048 + 1024 B in one buffer, one alpha term
    assert (cc.collective.kind, cc.collective.tensors, cc.collective.bytes_per_device) == ("all-reduce", 2, 3072)
    nv = H100.topology.intra
    assert cc.seconds == pytest.approx(2 * (3 * nv.alpha + 3 / 4 * 3072 / nv.beta))


def test_the_cost_model_takes_a_typed_input():
    """cost() reads a CostInput (index, mesh, donations), not whatever object has an ``index``."""
    mesh = gp.Mesh.abstract((4,), ("m",))
    f = gp.spmd(lambda x, w: x @ w, mesh, in_shardings=(None, gp.P(None, "m")), donate_argnums=0)
    plan = f.plan(S((8, 16), F32), S((16, 32), F32))
    inp = plan.cost_input()
    assert isinstance(inp, model.CostInput) and inp.donate == (0,) and inp.mesh == mesh
    assert model.cost(inp, H100) == plan.cost(H100)
    with pytest.raises(TypeError, match="CostInput"):
        model.cost(plan, H100)
