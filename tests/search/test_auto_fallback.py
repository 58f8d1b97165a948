"""gp.auto_shard when the search's chosen plan fails to build as a plan (after the search
priced it): the next candidate that builds is kept, and res.report() says so; none builds: a
ShardingError naming them. ``res.constraints()``: the intermediate annotations as
(value, NamedSharding) pairs for jax.lax.with_sharding_constraint."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
import gspmd_py.compiler as compiler
from search_util import favour_intermediates
from models import mlp

S = jax.ShapeDtypeStruct
HW = gp.Hardware.preset("h100-node")
SHAPES = [(32, 64), (64, 128), (128, 64)]
MESH = gp.Mesh((2, 4), ("x", "y"))


def _search(args, **kw):
    return gp.auto_shard(mlp, MESH, *args, hardware=HW, max_evaluations=60, time_budget_s=600, **kw)


def _fail_builds(monkeypatch, n):
    """compiler.assemble (the plan made of the passes' results: the compiler's step, not the
    search's pricer, which runs the same passes) raises on its first n calls."""
    real, calls = compiler.assemble, []

    def assemble(*a, **k):
        calls.append(1)
        if n is None or len(calls) <= n:
            raise RuntimeError("injected: this plan does not build")
        return real(*a, **k)

    monkeypatch.setattr(compiler, "assemble", assemble)
    return calls


def test_best_plan_failing_to_build_falls_back_to_the_next_candidate(monkeypatch):
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
    clean = _search(args)
    assert not clean.fallback and "fell back" not in clean.report()
    _fail_builds(monkeypatch, 1)
    res = _search(args)
    want = next(c for c in clean.search.top[1:] if c.built and c.fits)
    assert res.search.best.text == want.text != clean.search.best.text
    assert "failed to build" in res.fallback and "injected" in res.fallback and "candidate 2" in res.fallback
    assert res.fallback in res.report()
    np.testing.assert_allclose(np.asarray(res.spmd(*args)), np.asarray(mlp(*args)), rtol=2e-5, atol=2e-5)
    again = gp.spmd(mlp, MESH, tactics=res.rules()).plan(*args)  # the fallback replays as data
    assert again.spmd_text() == res.plan.spmd_text()


def test_no_candidate_builds_is_a_clear_error(monkeypatch):
    _fail_builds(monkeypatch, None)
    with pytest.raises(gp.ShardingError, match="no candidate the search found builds"):
        _search([S(s, jnp.float32) for s in SHAPES])


def test_constraints_are_the_intermediate_annotations(monkeypatch):
    args = [S(s, jnp.float32) for s in SHAPES]
    plain = _search(args)
    inter = [a for a in plain.search.best.actions if not plain.search.classes[a[0]].is_input]
    assert (plain.constraints() == []) == (not inter)  # (the exact search may annotate a matmul result)
    favour_intermediates(monkeypatch)
    res = _search(args)
    cons = res.constraints()
    assert cons and cons == list(res.jax_shardings().constraints)
    for what, s in cons:
        assert "dot_general" in what and isinstance(s, jax.sharding.NamedSharding)
        assert any(s.spec)
