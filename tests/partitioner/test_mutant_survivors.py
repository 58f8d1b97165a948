"""Mutants of the partitioner that the fast tier let through (tools/mutate.py, issue 39), each
turned into a test that kills it; benchmarks/results/mutants.md lists them and explains the
equivalent ones."""
import numpy as np

import gspmd_py as gp
from partition_util import assert_same

P = gp.P


def test_a_max_partial_reduce_scattered_is_reduced():
    """partial.reduce_scatter's path for ops other than sum (all-reduce, then this device's
    block): a max over the sharded rows, returned sharded over the same axis. Dropping its
    all-reduce (partial.py, reduce_scatter: ``full = all_reduce(...)`` -> ``x``) left each
    device its own rows' max."""
    mesh = gp.Mesh((4,), ("data",))
    x = np.random.default_rng(0).normal(size=(16, 8)).astype(np.float32)

    def f(x):
        return gp.annotate(x.max(0), P("data"))

    plan = gp.spmd(f, mesh, in_shardings=(P("data", None),)).plan(x)
    got = gp.spmd(f, mesh, in_shardings=(P("data", None),))(x)
    assert_same(got, x.max(0))
    assert [(c.kind, c.reduce) for c in plan.collectives if c.kind in ("all-reduce", "reduce-scatter")] == \
        [("all-reduce", "max")]

