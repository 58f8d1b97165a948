"""gp.auto_shard plans for the hardware it runs on by default: a GPU's / TPU's preset from
its device kind, CPU devices calibrated once and cached on disk (keyed by machine, mesh and
jax version), an abstract mesh on the h100-node preset; said in res.report(); hardware=
overrides. Calibration here is tiny and cached in a temporary folder."""
import attrs
import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py.cost import calibrate, machine
from models import mlp

S = jax.ShapeDtypeStruct
f32 = jnp.float32
ARGS = [S((32, 64), f32), S((64, 128), f32), S((128, 64), f32)]

TINY_CONVS = (("small-c/small-hw", 4, 4), ("small-c/large-hw", 8, 4), ("large-c/small-hw", 4, 8),
              ("large-c/large-hw", 8, 8))  # tiny images: labels only


@pytest.fixture
def tiny_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GSPMD_PY_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(machine, "CALIBRATION", {"reps": 1, "base_sizes": (2 ** 12, 2 ** 14), "max_bytes": 2 ** 16})
    calls = []
    real = gp.Hardware.calibrate

    def counting(mesh, **kw):
        calls.append(kw)
        return real(mesh, **kw)

    monkeypatch.setattr(gp.Hardware, "calibrate", staticmethod(counting))
    # tiny probes: this calibration measures little (the real one takes about 10 s)
    for name, v in (("MATMUL_FLOPS", 2 ** 20), ("ELEMS", 2 ** 12), ("MEM_ELEMS", 2 ** 12), ("SUSTAIN", 1),
                    ("MATMULS", calibrate.MATMULS[:1]), ("KINDS", calibrate.KINDS[:3]),
                    ("MATMUL_CLASSES", ((2 ** 20, (1, 16, 16, 16), 2 ** 16),)), ("CONV_FLOPS", 2 ** 14), ("CONV_PROBES", TINY_CONVS)):
        monkeypatch.setattr(calibrate, name, v)
    return tmp_path, calls


@pytest.fixture
def fake_calibration(tmp_path, monkeypatch):
    """Calibration replaced by a preset (counted): for what is asked of it, not what it measures."""
    monkeypatch.setenv("GSPMD_PY_CACHE_DIR", str(tmp_path))
    calls = []

    def fake(mesh, **kw):
        calls.append((mesh, kw))
        return attrs.evolve(gp.Hardware.preset("a100-node"), name="fake-calibrated")

    monkeypatch.setattr(gp.Hardware, "calibrate", staticmethod(fake))
    return calls


def test_cpu_mesh_is_calibrated_once_and_cached(tiny_cache):
    tmp, calls = tiny_cache
    mesh = gp.Mesh((8,), ("m",))
    res = gp.auto_shard(mlp, mesh, *ARGS, max_evaluations=20)
    assert res.search.hardware.startswith("calibrated")
    assert "cpu devices" in res.report() and "calibrated on this machine just now" in res.report()
    assert len(calls) == 1 and list(tmp.glob("hardware-*.pkl"))
    again = gp.auto_shard(mlp, mesh, *ARGS, max_evaluations=20)
    assert len(calls) == 1  # read from the cache
    assert "calibrated on this machine (cached" in again.report()
    assert again.in_shardings == res.in_shardings


def test_cache_is_per_mesh(fake_calibration):
    gp.auto_shard(mlp, gp.Mesh((8,), ("m",)), *ARGS, max_evaluations=10)
    gp.auto_shard(mlp, gp.Mesh((8,), ("m",)), *ARGS, max_evaluations=10)
    assert len(fake_calibration) == 1
    res = gp.auto_shard(mlp, gp.Mesh((2, 4), ("x", "y")), *ARGS, max_evaluations=10)
    assert len(fake_calibration) == 2  # another mesh: measured for it
    assert res.search.hardware == "fake-calibrated"


def test_collectives_calibrated_up_to_what_the_program_moves(fake_calibration):
    big = [S((32, 64), f32), S((64, 2 ** 16), f32), S((2 ** 16, 64), f32)]  # 16 MiB weights
    gp.auto_shard(mlp, gp.Mesh((8,), ("m",)), *big, max_evaluations=10)
    assert max(fake_calibration[-1][1]["sizes"]) == 2 ** 25  # 32 MiB: past what the program moves
    gp.auto_shard(mlp, gp.Mesh((8,), ("m",)), *ARGS, max_evaluations=10)
    assert fake_calibration[-1][1]["sizes"] == machine.BASE_SIZES  # small program: the base sizes


def test_collective_sizes_reach_tens_of_mib():
    assert machine.collective_sizes(1024) == machine.BASE_SIZES
    sizes = machine.collective_sizes(30 * 2 ** 20)
    assert sizes[:3] == machine.BASE_SIZES and max(sizes) == 2 ** 25
    assert max(machine.collective_sizes(2 ** 40)) == machine.MAX_COLLECTIVE_BYTES


def test_presets_by_device_kind():
    assert machine.preset_for("NVIDIA H100 80GB HBM3") == "h100-node"
    assert machine.preset_for("NVIDIA A100-SXM4-40GB") == "a100-node"
    assert machine.preset_for("TPU v4") == "tpu-v4"
    assert machine.preset_for("TPU v3") == "tpu-v3"
    assert machine.preset_for("cpu") is None


def test_abstract_mesh_and_given_hardware_are_said(fake_calibration):
    calls = fake_calibration
    res = gp.auto_shard(mlp, gp.Mesh.abstract((2, 4), ("x", "y")), *ARGS, max_evaluations=10)
    assert "h100-node preset (an abstract mesh" in res.report()
    hw = gp.Hardware.preset("tpu-v3")
    res = gp.auto_shard(mlp, gp.Mesh((2, 4), ("x", "y")), *ARGS, hardware=hw, max_evaluations=10)
    assert "hardware tpu-v3 (given)" in res.report()
    assert not calls


def test_tactics_auto_without_hardware_plans_for_the_mesh_devices(fake_calibration):
    """gp.tactics.auto with no hardware= prices on what gp.auto_shard would (the mesh's
    devices: here CPU devices, calibrated once and cached), not on the h100-node preset."""
    calls = fake_calibration
    mesh = gp.Mesh((2, 4), ("x", "y"))
    plan = gp.spmd(mlp, mesh, tactics=[gp.tactics.auto(max_evaluations=10)]).plan(*ARGS)
    assert plan.tactics[-1].result.hardware == "fake-calibrated"
    assert len(calls) == 1  # the search and the per-tactic steps share one calibration
    same = gp.auto_shard(mlp, mesh, *ARGS, max_evaluations=10, measure=0)  # (the tactic measures nothing)
    assert len(calls) == 1 and same.search.hardware == "fake-calibrated"  # from the disk cache
    assert plan.in_shardings == same.plan.in_shardings
    plan = gp.spmd(mlp, gp.Mesh.abstract((2, 4), ("x", "y")),
                   tactics=[gp.tactics.auto(max_evaluations=10)]).plan(*ARGS)
    assert plan.tactics[-1].result.hardware == "h100-node" and len(calls) == 1
