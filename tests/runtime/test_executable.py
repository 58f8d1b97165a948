"""A Plan is an immutable value; its stages (runtime/stages.py: Plan -> Lowered -> Compiled)
are the one run-time object, each built once, so a plan compiles once however it runs; the
partition pass's diagnostics are a value, and a note added after the build makes a new one."""
from __future__ import annotations

import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from gspmd_py import compiler
from gspmd_py.partitioner.context import Ctx
from gspmd_py.partitioner.diagnostics import Diagnostics
from gspmd_py.runtime import stages
from gspmd_py.runtime.layout import layout_notes

P = gp.P


@pytest.fixture(scope="module")
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


def _mlp(x, w):
    return jnp.tanh(x @ w)


def _args():
    rng = np.random.default_rng(0)
    return rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)


def test_a_plan_is_immutable(mesh):
    plan = gp.spmd(_mlp, mesh, in_shardings=(P("x", None), P(None, "y"))).plan(*_args())
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.fn_name = "other"
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.diagnostics = Diagnostics()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plan.anything_new = 1
    with pytest.raises(TypeError):  # its maps are read-only views too
        plan.diagnostics.held[0] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        plan.op_plans[0] = None  # type: ignore[index]
    assert isinstance(plan.diagnostics.notes, tuple)


def test_a_plan_compiles_once_however_it_runs(mesh, monkeypatch):
    """plan.run twice, gp.spmd's call and the Compiled stage's call: one XLA compile, one
    trace of the program's jit (the plan holds its Lowered stage, which holds its Compiled)."""
    compiles, traces = [], []
    real_compile, real_trace = jax.stages.Lowered.compile, stages.trace_program
    monkeypatch.setattr(jax.stages.Lowered, "compile", lambda *a, **k: compiles.append(1) or real_compile(*a, **k))
    monkeypatch.setattr(stages, "trace_program", lambda *a: traces.append(1) or real_trace(*a))
    x, w = _args()
    f = gp.spmd(_mlp, mesh, in_shardings=(P("x", None), P(None, "y")))
    plan = f.plan(x, w)
    first = plan.run([x, w])
    np.testing.assert_allclose(np.asarray(first), _mlp(x, w), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(plan.run([x, w])), np.asarray(first))
    np.testing.assert_array_equal(np.asarray(f(x, w)), np.asarray(first))
    assert f.lower(x, w) is plan.lower() and plan.lower().compile() is plan.lower().compile()
    np.testing.assert_array_equal(np.asarray(plan.lower().compile()(x, w)), np.asarray(first))
    assert (len(compiles), len(traces)) == (1, 1)
    # the call equals the jit of the program on the placed inputs
    direct = plan.lower().jitted(*plan.place([x, w]))[0]
    np.testing.assert_array_equal(np.asarray(direct), np.asarray(first))
    assert plan.lower(("cpu",)) is not plan.lower() and plan.lower_text() == plan.lower(("cpu",)).as_text()


def test_stages_are_values_and_a_run_changes_no_field_of_the_plan(mesh):
    """Plan -> Lowered -> Compiled (runtime/stages.py, as jax's stages): frozen values, each
    built once from the one before; running them leaves the plan's fields as they were."""
    from gspmd_py.runtime.stages import Compiled, Lowered

    x, w = _args()
    f = gp.spmd(_mlp, mesh, in_shardings=(P("x", None), P(None, "y")))
    plan = f.plan(x, w)
    before = {a.name: getattr(plan, a.name) for a in attrs.fields(type(plan))}
    lowered = plan.lower()
    assert isinstance(lowered, Lowered) and lowered.plan is plan and plan.lower() is lowered
    assert "stablehlo" in lowered.as_text() or "func.func" in lowered.as_text()
    compiled = lowered.compile()
    assert isinstance(compiled, Compiled) and compiled.lowered is lowered and lowered.compile() is compiled
    assert "all-gather" in compiled.as_text() or "all-reduce" in compiled.as_text() or "dot" in compiled.as_text()
    np.testing.assert_allclose(np.asarray(compiled(x, w)), _mlp(x, w), rtol=1e-5, atol=1e-5)
    f(x, w)
    assert {a.name: getattr(plan, a.name) for a in attrs.fields(type(plan))} == before
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        lowered.jitted = None
    with pytest.raises(gp.ShardingError, match="abstract"):
        gp.spmd(_mlp, gp.Mesh.abstract((2, 4), ("x", "y")), in_shardings=(P("x", None), None)).plan(
            jax.ShapeDtypeStruct((8, 16), jnp.float32), jax.ShapeDtypeStruct((16, 8), jnp.float32)).lower().compile()
    with pytest.raises(gp.ArgumentError, match="structure"):
        compiled(x)


def test_the_partition_pass_returns_its_diagnostics_as_a_value():
    mesh = gp.Mesh.abstract((2, 4), ("x", "y"))

    def fn(x):
        return jnp.sort(gp.annotate(x, P("x", None)), axis=0)  # sorting a sharded dim: its axis moves to dim 1

    closed = jax.make_jaxpr(fn)(jax.ShapeDtypeStruct((8, 4), jnp.float32))
    s = compiler.seed(compiler.trace(closed, mesh), mesh)
    part = compiler.partition(s.graph, mesh, compiler.propagate(s.graph, mesh, s.seeds))
    assert isinstance(part.diagnostics, Diagnostics)
    assert not any(isinstance(getattr(part, a.name), Ctx) for a in attrs.fields(type(part)))  # no Ctx escapes
    assert part.diagnostics.held and part.diagnostics.seen_operands
    before = part.diagnostics
    after = before.with_notes("a note added later")
    assert after.notes == before.notes + ("a note added later",)
    assert "a note added later" not in before.notes  # the old value is unchanged
    assert after.held == before.held and after.fallbacks == before.fallbacks


def test_layout_notes_make_a_new_value(mesh):
    """A layout the user's mesh cannot say is noted by the compiler as a new diagnostics value:
    the partition pass's is unchanged, the plan's is it plus the layout notes; the report is the
    same before and after the plan runs or is staged."""
    def fn(v):
        h = jnp.sin(v.reshape(2, 4, 8))  # dim 0 over y:(1)2, dim 1 over y:(2)2: sub-axes of y
        return h, h.reshape(8, 8) * 2.0

    f = gp.spmd(fn, mesh, in_shardings=P("y", None), out_shardings=(None, P("y", None)))
    v = np.arange(64, dtype=np.float32).reshape(8, 8)
    plan = f.plan(v)
    notes = layout_notes(plan)
    assert any("returned over the execution mesh" in n for n in notes)
    assert any(n.startswith("under a JAX transformation, output 0") for n in notes)
    assert plan.diagnostics.notes[-len(notes):] == notes
    text = plan.report()
    f(v)
    jax.jit(f)(v)
    assert plan.report() == text
    noted = plan.with_notes("one more")
    assert noted is not plan and noted.diagnostics.notes == plan.diagnostics.notes + ("one more",)
    assert "note: one more" in noted.report() and "one more" not in plan.report()
