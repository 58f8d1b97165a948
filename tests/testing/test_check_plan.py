"""gpt.check_plan: the static check of partial values, permutes and padding (issue 39).

Each defect is injected into a clean plan's per-device program (one equation removed, doubled
or changed; the index rebuilt), as a partitioner bug would leave it, and must be flagged with
the op, value and axis; the clean plans give [].
"""
import attrs
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend.core import ClosedJaxpr, Var

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py import compiler

MESH = gp.Mesh.abstract((2, 4), ("x", "y"))
f32 = np.float32


def sds(*shape):
    return jax.ShapeDtypeStruct(shape, f32)


def plan_of(fn, specs, *shapes, mesh=MESH):
    return gp.spmd(fn, mesh, in_shardings=specs).plan(*[sds(*s) for s in shapes])


def mlp(x, w):
    return jnp.tanh(x @ w).sum(1)


def grad_step(x, w):  # w used twice: the gradient adds a replicated term to a partial sum
    return jax.grad(lambda w: (jnp.tanh(x @ w)).sum() + (w * w).sum())(w)


def scan_sum(x, w):  # an uneven row dim masked before a reduction and a reverse cumsum
    return jax.lax.cumsum(jnp.exp(x @ w), axis=0, reverse=True).sum(0), jnp.exp(x).sum(0)


def halo(x):
    return x[1:] + x[:-1]


# -- injecting defects into a plan's program ---------------------------------------------
def edit(plan, change):
    """``plan`` with its top-level equations replaced by ``change(eqns)`` (a list of
    (eqn or None, {old var: new var})): the index rebuilt as the compiler builds it."""
    jaxpr = plan.program.jaxpr
    subst, eqns, done = {}, [], []
    for e in jaxpr.eqns:
        e = e.replace(invars=[subst.get(v, v) if not hasattr(v, "val") else v for v in e.invars])
        new, renames = change(e, done) if getattr(change, "once", False) else change(e)
        eqns.extend(new)
        subst.update(renames)
    outvars = [subst.get(v, v) if not hasattr(v, "val") else v for v in jaxpr.outvars]
    program = ClosedJaxpr(jaxpr.replace(eqns=eqns, outvars=outvars), plan.program.consts)
    return attrs.evolve(plan, program=program, index=compiler.index(program, plan.fine, plan.graph))


def first(prim):
    """A change that applies ``fn`` to the first equation of ``prim`` of each program edited."""
    def wrap(fn):
        def change(e, done):
            if e.primitive.name == prim and not done:
                done.append(e)
                return fn(e)
            return [e], {}
        change.once = True
        return change
    return wrap


@first("psum")
def drop(e):
    return [], {e.outvars[0]: e.invars[0]}


def kinds(findings):
    return sorted({f.kind for f in findings})


# -- clean plans -------------------------------------------------------------------------
@pytest.mark.parametrize("name, fn, specs, shapes", [
    ("mlp", mlp, (gp.P("x", "y"), gp.P("y", None)), [(8, 16), (16, 6)]),
    ("mlp uneven", mlp, (gp.P("x", "y"), gp.P("y", None)), [(7, 13), (13, 6)]),
    ("grad, weight used twice", grad_step, (gp.P("x", None), gp.P(None, "y")), [(8, 16), (16, 12)]),
    ("uneven reductions", scan_sum, (gp.P("x", None), None), [(7, 4), (4, 3)]),
    ("halo", halo, (gp.P(("x", "y")),), [(30,)]),
])
def test_clean_plans_have_no_findings(name, fn, specs, shapes):
    assert gpt.check_plan(plan_of(fn, specs, *shapes)) == []


# -- each injected defect is flagged --------------------------------------------------------
def test_a_skipped_reduction():
    plan = plan_of(mlp, (gp.P("x", "y"), gp.P("y", None)), (8, 16), (16, 6))
    found = gpt.check_plan(edit(plan, drop))
    assert kinds(found) == ["unreduced"]
    (f,) = found
    assert (f.axis, f.value) == ("y", "%2") and f.op.startswith("tanh")  # dot_general's %2 reaches tanh


def test_a_doubled_reduction():
    plan = plan_of(mlp, (gp.P("x", "y"), gp.P("y", None)), (8, 16), (16, 6))

    @first("psum")
    def twice(e):
        mid = Var(e.outvars[0].aval)
        return [e.replace(outvars=[mid]), e.replace(invars=[mid])], {}

    found = gpt.check_plan(edit(plan, twice))
    assert [(f.kind, f.axis) for f in found] == [("reduced-twice", "y")]
    assert "counted 4 times" in found[0].detail


def test_a_replicated_term_joining_a_partial_sum():
    plan = plan_of(grad_step, (gp.P("x", None), gp.P(None, "y")), (8, 16), (16, 12))
    # the join: where(index(x) == 0, term, 0) inside a jit(_where) call: the term itself instead
    @first("jit")
    def unjoined(e):
        inner = e.params["jaxpr"].jaxpr
        sel = inner.eqns[-1]
        assert sel.primitive.name == "select_n"
        keep = [k for k, v in enumerate(inner.invars) if v in sel.invars[1:] and v is not sel.invars[1]]
        return [], {e.outvars[0]: e.invars[keep[0]]}

    found = gpt.check_plan(edit(plan, unjoined))
    assert ("replicated-joins-partial", "x") in [(f.kind, f.axis) for f in found]


def test_a_permute_that_is_not_a_permutation():
    plan = plan_of(halo, (gp.P(("x", "y")),), (30,))

    @first("ppermute")
    def collide(e):
        perm = tuple(e.params["perm"])
        return [e.replace(params={**e.params, "perm": perm[:-1] + ((perm[-1][0], perm[0][1]),)})], {}

    found = gpt.check_plan(edit(plan, collide))
    assert kinds(found) == ["not-a-permutation"]
    assert "receives 2 times" in found[0].detail and found[0].axis


def test_a_non_neutral_pad():
    plan = plan_of(scan_sum, (gp.P("x", None), None), (7, 4), (4, 3))
    # the mask before the sum: exp's padding rows hold exp(0) = 1 once it is gone

    def unmasked(e):
        if e.primitive.name == "jit" and e.params["jaxpr"].jaxpr.eqns[-1].primitive.name == "select_n":
            inner = e.params["jaxpr"].jaxpr
            data = inner.eqns[-1].invars[2]
            return [], {e.outvars[0]: e.invars[list(inner.invars).index(data)]}
        return [e], {}

    found = gpt.check_plan(edit(plan, unmasked))
    assert kinds(found) == ["non-neutral-pad"]
    assert {f.axis for f in found} == {"x"} and any("1.0" in f.detail for f in found)


def test_findings_are_values():
    plan = plan_of(mlp, (gp.P("x", "y"), gp.P("y", None)), (8, 16), (16, 6))
    f = gpt.check_plan(edit(plan, drop))[0]
    assert f == attrs.evolve(f) and hash(f) == hash(attrs.evolve(f)) and "unreduced" in str(f)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        f.axis = "x"


@pytest.mark.slow
def test_a_96_block_model_on_65536_devices_checks_in_seconds():
    """The walk is over the symbolic per-device program: its size, not the mesh's, sets the time."""
    import time

    mesh = gp.Mesh.abstract((256, 256), ("data", "model"))

    def model(x, ws):
        for w1, w2 in ws:
            x = x + jax.nn.gelu(x @ w1) @ w2
            x = x / jnp.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
        return x.sum()

    ws = [(sds(1024, 4096), sds(4096, 1024)) for _ in range(96)]
    specs = (gp.P("data", None), [(gp.P(None, "model"), gp.P("model", None))] * 96)
    plan = gp.spmd(jax.grad(model, argnums=1), mesh, in_shardings=specs).plan(sds(4095, 1024), ws)
    t = time.process_time()
    assert gpt.check_plan(plan) == []
    assert time.process_time() - t <= 10
    # a dropped reduction is still found at that scale (where the partial meets the residual too)
    found = gpt.check_plan(edit(plan, drop))
    assert "unreduced" in kinds(found) and {f.axis for f in found} == {"model"}


def test_partitioner_bugs_of_the_classes_that_escaped_running_tests(monkeypatch):
    """Issue 39's two escapes, injected into the partitioner: found without running anything
    (the replicated term's gradient being zero hid it from every value comparison)."""
    from gspmd_py.partitioner import program as pprogram

    monkeypatch.setenv("GSPMD_PY_VERIFY", "1")  # GSPMD_PY_VERIFY=plan would refuse these plans as they are made
    monkeypatch.setattr(pprogram, "join", lambda ctx, x, partial, acc, zero=False: x.astype(acc))  # counted on every device
    found = gpt.check_plan(plan_of(grad_step, (gp.P("x", None), gp.P(None, "y")), (8, 16), (16, 12)))
    assert [(f.kind, f.axis) for f in found] == [("replicated-joins-partial", "x")]
    monkeypatch.undo()
    monkeypatch.setenv("GSPMD_PY_VERIFY", "1")

    from gspmd_py.partitioner import context

    monkeypatch.setattr(context.Ctx, "mask", lambda self, pv, dims, fill: pv.x)  # padding never masked
    found = gpt.check_plan(plan_of(scan_sum, (gp.P("x", None), None), (7, 4), (4, 3)))
    assert found and {f.kind for f in found} == {"non-neutral-pad"} and {f.axis for f in found} == {"x"}
