"""One path to the program: the search prices a candidate by running the slice of the
compiler's pass list (``compiler.PASSES``) from partition to reindex, so a pass added to the
list is run by both, and the program the search priced for the candidate it chose is the
program the compiler built for it."""
import jax
import jax.numpy as jnp
import pytest

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.partitioner.passes import Pass, program_passes
from gspmd_py.search import price
from models import REFERENCE, mlp

S = jax.ShapeDtypeStruct
HW = gp.Hardware.preset("h100-node")


def test_a_pass_added_to_the_list_is_run_by_the_compiler_and_the_search(monkeypatch):
    seen = []
    dummy = Pass("dummy", lambda s: seen.append(len(s["raw"].collectives)), ("raw",), "dummy")
    passes = compiler.PASSES
    at = [p.name for p in passes].index("combine")
    monkeypatch.setattr(compiler, "PASSES", passes[:at] + (dummy,) + passes[at:])
    assert "dummy" in [p.name for p in program_passes(compiler.PASSES)]
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = [S((32, 64), jnp.float32), S((64, 128), jnp.float32), S((128, 64), jnp.float32)]
    searched = []
    real = price.per_device_program
    monkeypatch.setattr(price, "per_device_program", lambda *a, **k: searched.append(1) or real(*a, **k))
    gp.spmd(mlp, mesh, tactics=[gp.tactics.auto(hardware=HW, max_evaluations=20)]).plan(*args)
    assert len(searched) > 1 and len(seen) == len(searched) + 1  # each program the search built, and the plan's
    monkeypatch.setattr(compiler, "PASSES", (dummy,) + passes)  # before anything wrote its input
    with pytest.raises(ValueError, match=r"'dummy' reads \['raw'\], which no pass before it wrote"):
        compiler.plan_jaxpr(jax.make_jaxpr(mlp)(*args), mesh, name="mlp")


# block_grad's two searches take seconds: the slow tier
PROGRAMS = [pytest.param(*r, id=r[0], marks=[pytest.mark.slow] if r[0] == "block_grad" else []) for r in REFERENCE]


@pytest.mark.parametrize("name,fn,shapes,mesh_shape,names", PROGRAMS)
def test_the_search_priced_the_program_the_compiler_built(monkeypatch, name, fn, shapes, mesh_shape, names):
    """Every program the search priced, by its propagation's fingerprint; the plan the compiler
    built for the chosen candidate has the same program text and collective records. Two
    searches: all of the program, and with every input's first dim sharded over the first
    axis (gradients to all-reduce, merged)."""
    built = {}
    real = price.per_device_program

    def record(graph, mesh, prop, *a, **k):
        got = real(graph, mesh, prop, *a, **k)
        built[price.fingerprint(prop, graph)] = got.index
        return got

    monkeypatch.setattr(price, "per_device_program", record)
    mesh = gp.Mesh(mesh_shape, names)
    args = [S(s, jnp.float32) for s in shapes]
    merged = 0
    for ins in (None, tuple(gp.P(names[0], *[None] * (len(s) - 1)) for s in shapes)):
        plan = gp.auto_shard(fn, mesh, *args, in_shardings=ins, hardware=HW, max_evaluations=16).plan
        idx = built[price.fingerprint(plan.prop, plan.graph)]
        assert str(idx.program) == str(plan.program)
        assert list(idx.collectives) == plan.collectives
        merged += any(e.key.startswith("combined") for e in plan.index.entries)
    if name in ("train_step", "block_grad"):
        assert merged  # the combiner merged collectives in a program both built
