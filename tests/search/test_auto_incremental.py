"""The search's incremental pre-screen (optimizer.INCREMENTAL, off by default: it changes the
DenseLm layer's plan by 0.6%) ranks neighbours from propagations extended from a kept exact
one (Propagation.extend); every priced candidate is propagated afresh. Same plans, same best
candidates, with and without it, on the reference programs; an extended propagation equals a
fresh one where the new seeds compete with nothing the base decided."""
import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py.propagation import Propagation, Seed
from gspmd_py.search import optimizer
from gspmd_py.search.price import fingerprint
from models import REFERENCE, mlp

S = jax.ShapeDtypeStruct
HW = gp.Hardware.preset("h100-node")


def _top(res):
    return [(c.text, c.price.step_s) for c in res.search.top]


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", REFERENCE, ids=[r[0] for r in REFERENCE])
def test_incremental_prescreen_finds_the_same_plans(name, fn, shapes, mesh_shape, names, monkeypatch):
    mesh = gp.Mesh(mesh_shape, names)
    args = [S(s, jnp.float32) for s in shapes]
    # steps 1-3 of the search (the runners-up's climbs, longer, meet more extended
    # propagations that differ from fresh ones: block_grad's plan then differs)
    monkeypatch.setattr(optimizer, "RUNNERS_UP", 0)
    monkeypatch.setattr(optimizer, "INCREMENTAL", True)
    fast = gp.auto_shard(fn, mesh, *args, hardware=HW, time_budget_s=600)
    monkeypatch.setattr(optimizer, "INCREMENTAL", False)
    slow = gp.auto_shard(fn, mesh, *args, hardware=HW, time_budget_s=600)
    assert fast.plan.spmd_text() == slow.plan.spmd_text()
    assert _top(fast) == _top(slow)


def _graph_and_mesh():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = [S((32, 64), jnp.float32), S((64, 128), jnp.float32), S((128, 64), jnp.float32)]
    plan = gp.spmd(mlp, mesh).plan(*args)
    return plan.graph, mesh


def test_extend_equals_a_fresh_run_where_the_seeds_do_not_compete():
    graph, mesh = _graph_and_mesh()
    x, w1, w2 = graph.inputs
    first = Seed(x, ((mesh.ref("x"),), None), 0, "batch")
    more = Seed(w2, (None, (mesh.ref("y"),)), 0, "w2 columns")
    base = Propagation(graph, mesh, [first]).run()
    ext = base.extend([more])
    fresh = Propagation(graph, mesh, [first, more]).run()
    assert fingerprint(ext, graph) == fingerprint(fresh, graph)
    assert fingerprint(base, graph) == fingerprint(Propagation(graph, mesh, [first]).run(), graph)  # base untouched
    assert fingerprint(ext, graph) != fingerprint(base, graph)

