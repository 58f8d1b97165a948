"""What a report calls things is what the user wrote: shardings in JAX's ``P(...)`` notation
(``str`` stays GSPMD's tile form), ops by the API that made them (``with_sharding_constraint``
at its file and line, ``gp.annotate``, ``gp.tag``), outputs by pytree path, and the output
boundary named as such, in the report, the collectives, ``explain`` and ``sharding_of``."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import gspmd_py as gp

MESH = gp.Mesh((2, 4), ("x", "y"))
JMESH = jax.sharding.Mesh(np.asarray(MESH.jax_devices()), MESH.axis_names)


def fn(params, x):
    h = jax.nn.relu(x @ params["w1"])
    h = jax.lax.with_sharding_constraint(h, NamedSharding(JMESH, PartitionSpec("x", None)))
    h = gp.tag(gp.annotate(h, gp.P("x", "y")), "hidden")
    return {"out": h @ params["w2"], "mean": jnp.mean(h)}


@pytest.fixture(scope="module")
def plan():
    params = {"w1": np.ones((16, 32), np.float32), "w2": np.ones((32, 16), np.float32)}
    f = gp.spmd(fn, MESH, in_shardings=({"w1": gp.P(None, "y"), "w2": gp.P("y", None)}, gp.P("x", None)))
    return f.plan(params, np.ones((8, 16), np.float32))


def test_the_report_speaks_the_users_names(plan):
    text = plan.report()
    rows = {line.split()[0] + " " + line.split()[1]: line for line in text.splitlines()[2:] if line.startswith("  ")}
    assert "P(None, 'y')" in rows["input arg0['w1']"] and "P('x', None)" in rows["input arg1"]
    assert "(test_report_names.py:21)" in rows["with_sharding_constraint #9"] and "all-gather(y)" in \
        rows["with_sharding_constraint #9"]
    assert "(test_report_names.py:22)" in rows["gp.annotate #11"] and "P('x', 'y')" in rows["gp.annotate #11"]
    assert "all-reduce(x,y)" in rows["output out['mean']"] and "all-reduce(y)" in rows["output out['out']"]
    assert "gspmd_annotate" not in text and "gspmd_tag" not in text and "[{" not in text
    assert [c.op.split(" (")[0] for c in plan.collectives] == ["with_sharding_constraint #9", "output boundary #22",
                                                               "output boundary #24"]


def test_shardings_print_as_jax_writes_them(plan):
    s = plan.sharding_of("hidden")
    assert repr(s) == "Sharding(P('x', 'y'))" and s.spec == gp.P("x", "y")
    assert str(s) == "{devices=[2,4]0,1,2,3,4,5,6,7}"  # the GSPMD tile form, where asked
    text = plan.explain("hidden")
    assert text.startswith("hidden: f32[8,32] sharded P('x', 'y')") and "dim 0: 'x'" in text
    assert "<- gp.tag (op 13" in text and "gspmd_" not in text


def test_outputs_are_named_by_pytree_path(plan):
    assert plan.out_names == ("out['mean']", "out['out']")
    assert plan.sharding_of("out['out']") == plan.sharding_of("out1") == gp.Sharding(MESH, gp.P("x", None))
    with pytest.raises(gp.ShardingError, match=r"out\['mean'\]"):
        plan.sharding_of("nothing")
    single = gp.spmd(lambda a: a * 2, MESH, in_shardings=(gp.P("x"),)).plan(np.ones(8, np.float32))
    assert single.out_names == ("out",) and "output out " in single.report()
