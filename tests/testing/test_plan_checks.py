"""gpt.assert_plan: plan properties on abstract meshes of thousands of devices, nothing executed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.runtime import stages

BIG = gp.Mesh.abstract((64, 64), ("x", "y"))
X = jax.ShapeDtypeStruct((4096, 8192), np.float32)
W = jax.ShapeDtypeStruct((8192, 1024), np.float32)


def mlp(x, w):
    return jnp.tanh(x @ w)


@pytest.fixture(autouse=True)
def _nothing_runs(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("assert_plan ran the program")

    monkeypatch.setattr(stages.Compiled, "run", refuse)


def test_properties_hold():
    plan = gpt.assert_plan(mlp, X, W, mesh=BIG, in_shardings=(gp.P("x", "y"), gp.P("y", None)),
                           max_collective_bytes=2**30, no_fallback=True, max_peak_bytes=2**32,
                           collectives_at_most={"all-reduce": 1, "all-to-all": 0})
    assert [c.kind for c in plan.collectives] == ["all-reduce"]


def test_each_property_fails_with_the_culprit():
    specs = (gp.P("x", "y"), gp.P("y", None))
    with pytest.raises(AssertionError, match=r"all-reduce\(y\) sends .* per device \(limit 1.0 KiB\), caused by tanh"):
        gpt.assert_plan(mlp, X, W, mesh=BIG, in_shardings=specs, max_collective_bytes=1024)
    with pytest.raises(AssertionError, match=r"1 collectives \(all kinds\) > 0"):
        gpt.assert_plan(mlp, X, W, mesh=BIG, in_shardings=specs, collectives_at_most=0)
    with pytest.raises(AssertionError, match=r"predicted peak memory"):
        gpt.assert_plan(mlp, X, W, mesh=BIG, in_shardings=specs, max_peak_bytes=1024)
    with pytest.raises(ValueError, match="unknown kinds"):
        gpt.assert_plan(mlp, X, W, mesh=BIG, in_shardings=specs, collectives_at_most={"allreduce": 0})


def test_no_fallback_names_the_op():
    def f(a):  # one (unbatched) matrix: no partitioned form, computed whole (ops/linalg.py)
        return jnp.linalg.cholesky(a @ a.T + 8 * jnp.eye(a.shape[0])) + a

    with pytest.warns(gp.PartitionWarning, match="cholesky"):
        with pytest.raises(AssertionError, match="replicated fallback: cholesky"):
            gpt.assert_plan(f, jax.ShapeDtypeStruct((4096, 4096), np.float32), mesh=BIG,
                            in_shardings=(gp.P("x", "y"),), no_fallback=True)
