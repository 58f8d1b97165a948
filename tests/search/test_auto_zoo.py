"""The held-out model zoo (benchmarks/zoo.py, issue 28) at its "tiny" size: gp.auto_shard does
not crash on any (model, mesh); its plan computes what the model computes and replays as data
(in/out shardings + ``res.rules()`` -> the same per-device program); every hand plan the
benchmark measures computes what the model computes. Costs use the fixed h100-node preset and an
evaluation budget, so results do not depend on this machine."""
import jax
import numpy as np
import pytest

import gspmd_py as gp
from benchmarks import zoo
from partition_util import assert_same

HW = gp.Hardware.preset("h100-node")
EVALS = 60
TOL = dict(rtol=2e-4, atol=2e-5)  # float32 training steps: reductions regrouped across devices
CASES = [(name, shape, axes) for name in zoo.MODELS for shape, axes in zoo.MESHES]
FAST = {("mlp_wide", (8,)), ("dlrm", (2, 4))}  # the fast tier's sample; the rest is marked slow


def _marks(name, shape):
    return () if (name, shape) in FAST else (pytest.mark.slow,)


def _close(got, want):
    # the models' outputs are float32 pytrees (new params, optimizer state, loss)
    assert_same(got, want, **TOL)


@pytest.mark.parametrize("name,shape,axes", [pytest.param(*c, marks=_marks(*c[:2]), id=f"{c[0]}-{c[1]}")
                                             for c in CASES])
def test_auto_shard_runs_matches_and_replays(name, shape, axes):
    fn, args, info = zoo.make(name, "tiny")
    mesh = gp.Mesh(shape, axes)
    res = gp.auto_shard(fn, mesh, *args, hardware=HW, max_evaluations=EVALS, time_budget_s=600,
                        memory_limit=info.get("memory_limit"))
    want = jax.jit(fn)(*args)
    _close(res.spmd(*args), want)
    replay = gp.spmd(fn, mesh, in_shardings=res.in_shardings, out_shardings=res.out_shardings,
                     tactics=res.rules()).plan(*args)
    assert replay.spmd_text() == res.plan.spmd_text()
    if info.get("memory_limit") is not None:
        assert res.cost.peak_memory_bytes <= info["memory_limit"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_hand_plans_compute_the_model(name):
    fn, args, info = zoo.make(name, "tiny")
    want = jax.jit(fn)(*args)
    for shape, axes in zoo.MESHES:
        mesh = gp.Mesh(shape, axes)
        plans = zoo.hand_plans(name, mesh, args, info)
        assert "replicated" in plans and any(k.startswith("FSDP") for k in plans)
        for label, kw in plans.items():
            got = gp.spmd(fn, mesh, **kw)(*args)
            try:
                _close(got, want)
            except AssertionError as e:
                raise AssertionError(f"{name} on {shape}, hand plan {label!r}: {e}") from None


def test_memory_limit_rules_out_data_parallelism():
    """The wide MLP's limit (60% of params + Adam state per device) is below what a replicated
    or data-parallel plan keeps, and above what FSDP keeps: only sharded-weight plans fit."""
    fn, args, info = zoo.make("mlp_wide", "tiny")
    mesh = gp.Mesh((8,), ("x",))
    plans = zoo.hand_plans("mlp_wide", mesh, args, info)
    peak = {k: gp.spmd(fn, mesh, **kw).plan(*args).cost(HW).peak_memory_bytes for k, kw in plans.items()}
    state = sum(np.asarray(a).nbytes for a in jax.tree.leaves(args[:2]))
    assert info["memory_limit"] == int(0.6 * state)
    assert peak["data parallel (x)"] > info["memory_limit"]
    assert peak["FSDP / ZeRO-3 (x)"] <= info["memory_limit"]
