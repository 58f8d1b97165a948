"""Per-shape-class compute rates (gspmd_py/cost/rates.py, issue 28 item 3): calibration
measures a rate per matmul size class, per conv class (channels x image size) and the
reductions' bandwidth; the cost model and the search's cost tables price an op at its class's
rate; the presets carry per-class defaults; the calibration cache is versioned."""
import pickle

import attrs
import jax
import jax.numpy as jnp
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.cost import calibrate, machine
from gspmd_py.cost.hardware import PRESETS
from gspmd_py.cost.rates import CONV_CLASSES, WGRAD_CLASSES, compute_seconds, conv_class
from gspmd_py.propagation import Seed
from gspmd_py.search.price import Pricer
from gspmd_py.search.tables import CostTables

S = jax.ShapeDtypeStruct
f32 = jnp.float32
DN = ("NHWC", "HWIO", "NHWC")
# compute-bound, no launch cost: an op's time is its FLOPs at its class's rate
BASE = attrs.evolve(gp.Hardware.preset("h100-node"), matmul_flops=(("float32", 1e12),), mem_bandwidth=1e18,
                    op_overhead=0.0, step_overhead=0.0)
CLASSES = (("large-c/large-hw", 1.0), ("large-c/small-hw", 0.5), ("small-c/large-hw", 0.25),
           ("small-c/small-hw", 0.125))


def convs(x, w_small, w_large):
    h = lax.conv_general_dilated(x, w_small, (1, 1), "SAME", dimension_numbers=DN)  # 8 -> 8 channels
    return lax.conv_general_dilated(jnp.tile(h, (1, 1, 1, 8)), w_large, (1, 1), "SAME", dimension_numbers=DN)


CONV_ARGS = (S((2, 64, 64, 8), f32), S((3, 3, 8, 8), f32), S((3, 3, 64, 64), f32))


def _conv_rows(hw, mesh, specs=(None, None, None)):
    plan = gp.spmd(convs, mesh, in_shardings=specs).plan(*CONV_ARGS)
    return [o for o in plan.cost(hw).ops if "conv_general_dilated" in o.label]


def test_conv_class_by_channels_and_image():
    assert conv_class((2, 64, 64, 8), (3, 3, 8, 8), lax.conv_dimension_numbers((2, 64, 64, 8), (3, 3, 8, 8), DN)) \
        == "small-c/large-hw"
    assert conv_class((2, 32, 16, 64), (3, 3, 64, 64),
                      lax.conv_dimension_numbers((2, 32, 16, 64), (3, 3, 64, 64), DN)) == "large-c/small-hw"
    assert conv_class((1, 64, 32, 32), (64, 64, 3, 3), None) == "large-c/large-hw"  # NCHW / OIHW


def test_model_prices_each_conv_at_its_class_rate():
    """Two convs of one program, one with 8 channels, one with 64, priced at their classes'
    rates; an H-tiled plan's smaller images at the small-hw rates."""
    hw = attrs.evolve(BASE, conv_classes=CLASSES, conv_efficiency=0.9)
    small, large = _conv_rows(hw, gp.Mesh.abstract((8,), ("m",)))
    assert small.compute_s == pytest.approx(small.flops / (1e12 * 0.25), rel=1e-9)
    assert large.compute_s == pytest.approx(large.flops / (1e12 * 1.0), rel=1e-9)
    tiled = _conv_rows(hw, gp.Mesh.abstract((8,), ("m",)), (gp.P(None, "m"), None, None))
    assert [o.compute_s * 1e12 / o.flops for o in tiled] == pytest.approx([1 / 0.125, 1 / 0.5], rel=1e-6)
    flat = _conv_rows(attrs.evolve(BASE, conv_classes=(), conv_efficiency=0.9), gp.Mesh.abstract((8,), ("m",)))
    assert [o.compute_s * 1e12 / o.flops for o in flat] == pytest.approx([1 / 0.9] * 2, rel=1e-6)


def test_model_prices_matmuls_by_size_class():
    hw = attrs.evolve(BASE, matmul_classes=((2.0 ** 20, 0.1), (2.0 ** 23, 0.5)))
    mesh = gp.Mesh.abstract((8,), ("m",))
    for n, eff in ((32, 0.1), (128, 0.5), (512, 1.0)):  # 2 n^3 FLOPs: 65 K, 4.2 M, 268 M
        plan = gp.spmd(lambda a, b: a @ b, mesh).plan(S((n, n), f32), S((n, n), f32))
        c = plan.cost(hw)
        assert c.compute_s == pytest.approx(2 * n ** 3 / (1e12 * eff), rel=1e-9), n


def test_reductions_at_their_bandwidth():
    hw = attrs.evolve(BASE, mem_bandwidth=1e9, reduce_bandwidth=2.5e8, vector_flops=1e18)
    assert compute_seconds(hw, "reduce_sum", 1.0, 0.0, 1e6, f32) == pytest.approx(4e-3)
    assert compute_seconds(hw, "add", 1.0, 0.0, 1e6, f32) == pytest.approx(1e-3)
    plan = gp.spmd(lambda x: jnp.sum(x, axis=1), gp.Mesh.abstract((8,), ("m",))).plan(S((256, 1024), f32))
    (row,) = [o for o in plan.cost(hw).ops if "reduce_sum" in o.label]
    assert row.compute_s == pytest.approx(row.bytes_accessed / 2.5e8, rel=1e-9)


def test_tables_price_a_conv_as_the_model_does():
    """The search's cost tables time a conv by the cost model's function (rates.op_seconds) at
    the local shapes: the H-tiled conv at the small-hw rate."""
    hw = attrs.evolve(BASE, conv_classes=CLASSES)
    mesh = gp.Mesh.abstract((8,), ("m",))
    graph = compiler.seed(compiler.trace(jax.make_jaxpr(convs)(*CONV_ARGS), mesh), mesh).graph
    pricer = Pricer(graph, mesh, hw)
    x = graph.inputs[0]
    prop = pricer.propagate([Seed(x, ((), (mesh.ref("m"),), (), ()), 0, "test")])
    tables = CostTables(graph, mesh, hw)
    idx = tables.indices(prop)
    rows = [tables.table[idx[t]][0] for t, lay in enumerate(tables._layout)
            if lay[0] == "op" and lay[1].prim == "conv_general_dilated"]
    model = _conv_rows(hw, mesh, (gp.P(None, "m"), None, None))
    # the tables count the conv's FLOPs from its factors (the kernel window's halo not counted)
    for t, o in zip(rows, model):
        assert t == pytest.approx(o.compute_s, rel=0.2)
    assert rows[0] / rows[1] == pytest.approx((1 / 0.125) / (64 / 0.5), rel=0.05)  # 8 ch at 0.125; 64 ch: 64x the FLOPs at 0.5


def test_calibration_measures_every_class(monkeypatch):
    for name, v in (("MATMUL_FLOPS", 2 ** 20), ("ELEMS", 2 ** 12), ("MEM_ELEMS", 2 ** 12), ("SUSTAIN", 1),
                    ("MATMULS", calibrate.MATMULS[:1]), ("KINDS", calibrate.KINDS[:1]),
                    ("MATMUL_CLASSES", ((2 ** 16, (1, 16, 16, 16), 2 ** 16), (2 ** 18, (1, 32, 32, 64), 2 ** 19))),
                    ("CONV_FLOPS", 2 ** 16),
                    ("CONV_PROBES", (("small-c/small-hw", 8, 4), ("small-c/large-hw", 16, 4),
                                     ("large-c/small-hw", 8, 16), ("large-c/large-hw", 16, 16))),
                    ("WGRAD_PROBES", (("wgrad/small-f", 1, 16, 4), ("wgrad/large-f", 8, 8, 4)))):
        monkeypatch.setattr(calibrate, name, v)
    hw = gp.Hardware.calibrate(gp.Mesh((8,), ("m",)), sizes=(2 ** 12,), reps=1, large_budget_s=None)
    bounds = [b for b, _ in hw.matmul_classes]
    effs = [e for _, e in hw.matmul_classes]
    assert bounds == sorted(bounds) and len(bounds) == 2
    assert all(0 < e <= 1 for e in effs) and effs == sorted(effs)  # a smaller class is never faster
    assert sorted(c for c, _ in hw.conv_classes) == sorted(CONV_CLASSES + WGRAD_CLASSES)
    assert all(0 < e <= calibrate.MAX_EFFICIENCY for _, e in hw.conv_classes)
    assert hw.reduce_bandwidth > 0 and hw.mem_bandwidth > 0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_have_per_class_defaults(name):
    hw = gp.Hardware.preset(name)
    convs_ = dict(hw.conv_classes)
    assert sorted(convs_) == sorted(CONV_CLASSES) and all(0 < e <= 1 for e in convs_.values())
    for s in ("small-hw", "large-hw"):
        assert convs_[f"small-c/{s}"] <= convs_[f"large-c/{s}"]
    effs = [e for _, e in hw.matmul_classes]
    assert effs and effs == sorted(effs) and all(0 < e <= 1 for e in effs)


def test_calibration_cache_is_versioned(tmp_path, monkeypatch):
    """An entry cached by an older format is measured again (the key holds ``FORMAT``), as is
    one lacking a field this version has."""
    monkeypatch.setenv("GSPMD_PY_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(mesh, **kw):
        calls.append(kw)
        return attrs.evolve(gp.Hardware.preset("a100-node"), name=f"fake {len(calls)}")

    monkeypatch.setattr(gp.Hardware, "calibrate", staticmethod(fake))
    mesh = gp.Mesh((8,), ("m",))
    monkeypatch.setattr(machine, "FORMAT", machine.FORMAT - 1)
    machine.calibrated(mesh)
    assert machine.calibrated(mesh)[0].name == "fake 1" and len(calls) == 1
    monkeypatch.setattr(machine, "FORMAT", machine.FORMAT + 1)
    assert machine.calibrated(mesh)[0].name == "fake 2" and len(calls) == 2
    (path,) = [p for p in tmp_path.glob("hardware-*.pkl") if pickle.load(open(p, "rb")).name == "fake 2"]
    old = object.__new__(gp.Hardware)  # as an entry pickled before the per-class fields existed
    for f in attrs.fields(gp.Hardware):
        if f.name not in ("matmul_classes", "conv_classes", "reduce_bandwidth"):
            object.__setattr__(old, f.name, getattr(machine.calibrated(mesh)[0], f.name))
    assert not machine.current(old) and machine.current(gp.Hardware.preset("tpu-v3"))
