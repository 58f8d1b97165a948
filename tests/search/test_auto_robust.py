"""gp.auto_shard is robust and reproducible: a candidate the partitioner cannot build is
skipped and counted; the result depends only on the inputs and the seed (an evaluation
budget, not the clock; the same plan in another process); the result replays as data
(``res.in_shardings`` / ``res.out_shardings`` / ``res.rules()`` give gp.spmd the same program)."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
import gspmd_py.search.price as price_mod
from gspmd_py.search import optimizer
from search_util import favour_intermediates
from models import REFERENCE, mlp

S = jax.ShapeDtypeStruct
P = gp.P
HW = gp.Hardware.preset("h100-node")
f32 = jnp.float32
EVALS = 60  # a small deterministic budget keeps these searches short


def _search(fn, mesh, args, **kw):
    kw.setdefault("hardware", HW)
    kw.setdefault("max_evaluations", EVALS)
    kw.setdefault("time_budget_s", 600)
    return gp.auto_shard(fn, mesh, *args, **kw)


def _same_program(res, fn, mesh, args):
    want = res.plan.spmd_text()
    for f in (gp.spmd(fn, mesh, tactics=res.rules()),
              gp.spmd(fn, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings,
                      tactics=res.rules())):
        plan = f.plan(*args)
        assert plan.spmd_text() == want
        assert plan.lower_text() == res.plan.lower_text()


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_replay_as_data_gives_the_same_program(name, fn, shapes, mesh_shape, names):
    mesh = gp.Mesh(mesh_shape, names)
    args = [S(s, f32) for s in shapes]
    res = _search(fn, mesh, args)
    _same_program(res, fn, mesh, args)
    assert res.search.stopped_by in ("", "evaluations")


def test_replay_keeps_intermediate_annotations(monkeypatch):
    """A plan with intermediate annotations (made attractive by a patched price) replays as
    data: in/out shardings alone would lose them, ``res.rules()`` keeps them."""
    real = price_mod.Pricer.price

    def price(self, seeds, prop=None):
        got, prop = real(self, seeds, prop)
        if any(s.value.producer is not None for s in seeds):  # an intermediate annotation
            got = type(got)(got.step_s * 0.25, got.peak_memory_bytes, got.comm_bytes, got.collectives)
        return got, prop

    monkeypatch.setattr(price_mod.Pricer, "price", price)
    monkeypatch.setattr(optimizer, "SCREEN", False)  # the tables would not rank the patched price
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = [S((32, 64), f32), S((64, 128), f32), S((128, 64), f32)]
    res = _search(mlp, mesh, args)
    inter = [a for a in res.search.best.actions if not res.search.classes[a[0]].is_input]
    assert inter, res.search.best.text
    monkeypatch.setattr(price_mod.Pricer, "price", real)
    _same_program(res, mlp, mesh, args)


def test_unbuildable_candidate_is_skipped_and_counted(monkeypatch):
    """The partitioner failing on some candidates (here: any that splits w1's columns) is not
    fatal: the search skips them, returns a plan it could build and says how many it skipped."""
    real = price_mod.per_device_program

    def flaky(graph, mesh, prop, *a, **k):
        if prop.dims_of(graph.inputs[1])[1]:
            raise RuntimeError("injected: cannot build this candidate")
        return real(graph, mesh, prop, *a, **k)

    monkeypatch.setattr(price_mod, "per_device_program", flaky)
    mesh = gp.Mesh((8,), ("m",))
    args = [S((16, 1024), f32), S((1024, 4096), f32), S((4096, 1024), f32)]  # Megatron would win
    res = _search(mlp, mesh, args)
    assert not res.plan.sharding_of("arg1").dims[1]
    assert sum(n for _, n in res.search.skipped) >= 1
    text = res.report()
    assert "could not build" in text and "RuntimeError: injected: cannot build this candidate" in text


def test_unpropagatable_candidate_is_skipped(monkeypatch):
    real = price_mod.Pricer.propagate
    calls = []

    def flaky(self, seeds):
        calls.append(1)
        if len(calls) % 3 == 0:
            raise ValueError("injected propagation failure")
        return real(self, seeds)

    monkeypatch.setattr(price_mod.Pricer, "propagate", flaky)
    mesh = gp.Mesh((8,), ("m",))
    args = [S((64, 128), f32), S((128, 256), f32), S((256, 128), f32)]
    res = _search(mlp, mesh, args)
    assert any("injected propagation failure" in r for r, _ in res.search.skipped)
    assert "could not build" in res.report()


def test_every_candidate_unbuildable_is_a_clear_error(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("injected: nothing builds")

    monkeypatch.setattr(price_mod, "per_device_program", broken)
    with pytest.raises(gp.ShardingError, match="could not build any .* injected: nothing builds"):
        _search(mlp, gp.Mesh((8,), ("m",)), [S((8, 16), f32), S((16, 32), f32), S((32, 16), f32)])


def test_evaluation_budget_and_time_cap_are_reported():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = [S((32, 64), f32), S((64, 128), f32), S((128, 64), f32)]
    res = _search(mlp, mesh, args, max_evaluations=4)
    assert res.search.stopped_by == "evaluations"
    assert "max_evaluations=4" in res.report()
    again = _search(mlp, mesh, args, max_evaluations=4)
    assert again.search.best.actions == res.search.best.actions
    cut = _search(mlp, mesh, args, time_budget_s=1e-9)
    assert cut.search.stopped_by == "time"
    assert "time cap" in cut.report() and "depends on the machine's speed" in cut.report()


def test_max_evaluations_is_checked():
    with pytest.raises(gp.TacticError, match="max_evaluations"):
        gp.tactics.auto(max_evaluations=0)


_SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import jax, jax.numpy as jnp
    import gspmd_py as gp
    from models import block_grad, block_shapes
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in block_shapes()]
    res = gp.auto_shard(block_grad, mesh, *args, hardware=gp.Hardware.preset("h100-node"),
                        max_evaluations=80, time_budget_s=600, seed=5)
    print(res.in_shardings)
    print(res.search.best.text)
    print(res.plan.spmd_text())
""")


def test_same_plan_in_processes_with_other_hash_seeds():
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = os.path.dirname(tests)
    outs = []
    for hs in ("1", "4242"):
        env = dict(os.environ, PYTHONHASHSEED=hs, JAX_PLATFORMS="cpu")
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        r = subprocess.run([sys.executable, "-c", _SCRIPT.format(tests=tests)], capture_output=True, text=True,
                           env=env, cwd=root, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        outs.append(r.stdout)
    assert outs[0] == outs[1]
    assert "P(" in outs[0]


def test_found_plan_runs_and_matches():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(32, 64), (64, 128), (128, 64)]]
    res = _search(mlp, mesh, args)
    f = gp.spmd(mlp, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings, tactics=res.rules())
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(mlp(*args)), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("name", ["mlp", "train_step", "block_grad", "conv_net", "scan_stack"])
def test_jax_shardings_run_under_jax_jit_and_match(name):
    _, fn, shapes, mesh_shape, names = next(r for r in REFERENCE if r[0] == name)
    mesh = gp.Mesh(mesh_shape, names)
    rng = np.random.default_rng(2)
    args = [(rng.standard_normal(s) * 0.3).astype(np.float32) for s in shapes]
    res = _search(fn, mesh, args)
    js = res.jax_shardings()
    got = js.jit()(*args)
    want = fn(*args)
    for a, b, s in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want),
                       jax.tree_util.tree_leaves(js.out_shardings)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-4)
        assert a.sharding.is_equivalent_to(s, a.ndim)
    assert all(isinstance(s, jax.sharding.NamedSharding) for s in jax.tree_util.tree_leaves(js.in_shardings))


def test_jax_shardings_carry_intermediate_constraints(monkeypatch):
    favour_intermediates(monkeypatch)
    mesh = gp.Mesh((2, 4), ("x", "y"))
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(s).astype(np.float32) for s in [(32, 64), (64, 128), (128, 64)]]
    res = _search(mlp, mesh, args)
    js = res.jax_shardings()
    assert js.constraints and "dot_general" in js.constraints[0][0]
    hlo = js.jit().lower(*args).as_text()
    assert hlo.count("sharding_constraint") + hlo.count("Sharding") >= len(js.constraints)
    np.testing.assert_allclose(np.asarray(js.jit()(*args)), np.asarray(mlp(*args)), rtol=2e-5, atol=2e-5)


def test_failing_tables_and_start_states_are_not_fatal(monkeypatch):
    from gspmd_py.search import optimizer as opt

    def broken(*a, **k):
        raise IndexError("injected: no tables")

    monkeypatch.setattr(opt, "CostTables", broken)
    monkeypatch.setattr(opt, "baseline_states", broken)
    mesh = gp.Mesh((8,), ("m",))
    res = _search(mlp, mesh, [S((16, 1024), f32), S((1024, 4096), f32), S((4096, 1024), f32)])
    assert dict(res.search.baselines).keys() == {"replicated"}  # searched from nothing
    assert res.cost.step_s <= res.search.baselines[0][1].price.step_s * (1 + 1e-9)
    assert "IndexError: injected: no tables" in res.report()
