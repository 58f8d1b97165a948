"""The collective kinds' table (gspmd_py/ops/collectives.py): checked against the primitives'
facts at import, and the partitioner, the program index, the combiner, the cost model and the
views agree with it on every kind."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py.cost.collectives import collective_time, sent_bytes
from gspmd_py.cost.topology import Level, Link
from gspmd_py.core.fine_mesh import FineMesh
from gspmd_py.ops import collectives as K
from gspmd_py.ops import declared, facts_of
from gspmd_py.program.combine import combine
from gspmd_py.program.program_index import ProgramIndex
from gspmd_py.views.pass_text import program_text

MESH = gp.Mesh((8,), ("x",))
ABSTRACT = gp.Mesh.abstract((8,), ("x",))
FINE = FineMesh.build(ABSTRACT, [ABSTRACT.ref("x")])
S = jax.ShapeDtypeStruct
F32 = jnp.float32


def test_the_table_is_checked_against_the_facts():
    real = {p: facts_of(p).collective for p in declared()}
    K.check(real)  # what importing gspmd_py.ops ran
    with pytest.raises(ValueError, match="psum .*declared 'all-gather', listed under 'all-reduce'"):
        K.check({**real, "psum": K.ALL_GATHER})
    with pytest.raises(ValueError, match="my_gather .*declares 'all-gather', not listed there"):
        K.check({**real, "my_gather": K.ALL_GATHER})
    with pytest.raises(ValueError, match="CollectiveKind.merge='glue'"):
        K.CollectiveKind("x", "psum", ("psum",), "glue", K.RING)
    assert tuple(K.KINDS) == ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


# per kind: a gp.spmd program whose partitioned program has that collective, (fn, shapes, in, out)
def _roll(x):
    return jnp.roll(x, 1, axis=0)


PLANS = {
    K.ALL_GATHER: (lambda x: x * 2, [(16, 4)], (gp.P("x", None),), gp.P(None, None)),
    K.ALL_REDUCE: (lambda a, b: a @ b, [(4, 16), (16, 4)], (gp.P(None, "x"), gp.P("x", None)), gp.P(None, None)),
    K.REDUCE_SCATTER: (lambda a, b: a @ b, [(16, 16), (16, 4)], (gp.P(None, "x"), gp.P("x", None)),
                       gp.P("x", None)),
    K.ALL_TO_ALL: (lambda x: x * 2, [(16, 16)], (gp.P("x", None),), gp.P(None, "x")),
    K.COLLECTIVE_PERMUTE: (_roll, [(16, 4)], (gp.P("x", None),), gp.P("x", None)),
}


@pytest.mark.parametrize("kind", list(K.KINDS))
def test_partitioner_index_cost_and_views_agree_on_each_kind(kind):
    row = K.KINDS[kind]
    fn, shapes, ins, out = PLANS[kind]
    plan = gp.spmd(fn, MESH, in_shardings=ins, out_shardings=out).plan(*[S(s, F32) for s in shapes])
    # the partitioner emitted it, as one of the row's primitives, and the index read it as this kind
    mine = [e for e in plan.index.entries if facts_of(e.prim).collective == kind]
    assert mine and all(e.prim in row.primitives for e in mine)
    assert [c.kind for c in plan.collectives if c.kind == kind] == [kind] * len(mine)
    emitted = jax.make_jaxpr(lambda x: _lax_call(row, x), axis_env=[("x", 8)])(S((8, 8), F32))
    assert emitted.jaxpr.eqns[0].primitive.name in row.primitives  # what ``emits`` binds
    # the cost model prices it by the row's formula; the views print it (with its reduction)
    c = next(c for c in plan.collectives if c.kind == kind)
    assert bool(c.reduce) == row.reduces
    link = Link(1e-6, 1e11)
    t = collective_time(kind, c.bytes_per_device, [Level(8, link)])
    assert t > 0 and sent_bytes(kind, c.bytes_per_device, 8) > 0
    if row.formula == K.RING_TWICE:
        assert t == pytest.approx(2 * collective_time(K.REDUCE_SCATTER, c.bytes_per_device, [Level(8, link)]))
    assert plan.cost(gp.Hardware.preset("h100-node")).comm_bytes > 0
    assert f"{kind}(x)" in plan.report() and f"{kind}(x)" in program_text(plan.index)


def _lax_call(row: K.CollectiveKind, x):
    fn = getattr(lax, row.emits)
    if row.emits == "all_to_all":
        return fn(x, "x", 0, 0, tiled=True)
    if row.emits == "ppermute":
        return fn(x, "x", [(i, (i + 1) % 8) for i in range(8)])
    if row.emits in ("all_gather", "psum_scatter"):
        return fn(x, "x", tiled=True)
    return fn(x, "x")


@pytest.mark.parametrize("kind", list(K.KINDS))
def test_the_combiner_merges_a_kind_as_its_row_says(kind):
    row = K.KINDS[kind]

    def two(a, b):
        with jax.named_scope("op1"):
            a = _lax_call(row, a)
        with jax.named_scope("op2"):
            b = _lax_call(row, b)
        return a, b

    program = jax.make_jaxpr(two, axis_env=[("x", 8)])(S((8, 8), F32), S((8, 8), F32))
    idx = ProgramIndex.build(program, FINE, lambda i: f"op {i}")
    assert [c.kind for c in idx.collectives] == [kind, kind]
    merged = ProgramIndex.build(combine(idx, 2**20, [("x", 8)]), FINE, lambda i: f"op {i}")
    assert len(merged.collectives) == (1 if row.merge != K.NO_MERGE else 2)
    assert [c.kind for c in merged.collectives] == [kind] * len(merged.collectives)
