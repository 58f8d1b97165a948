"""Bad inputs, red team 5: user mistakes that used to end in an internal traceback (AttributeError,
TypeError, a raw re/ValueError), a crash of the process, or silence, are now a gp.ShardingError
subclass naming the culprit. One table: (mistake, the error class, words its message must hold)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import jax

import gspmd_py as gp

P = gp.P
M24 = gp.Mesh((2, 4), ("x", "y"))
X = np.ones((8, 8), np.float32)
CASES = []


def case(mistake: str, error: type, *needles: str):
    """Add the decorated function (the mistake, made) to the table."""
    def deco(fn):
        CASES.append(pytest.param(fn, error, needles, id=mistake))
        return fn
    return deco


# -- gp.spmd's arguments and results ----------------------------------------------------------------
@case("static_argnames naming no parameter", gp.ArgumentError, "static_argnames ['nn']", "name no parameter",
      "['a', 'n']")
def _():
    gp.spmd(lambda a, n: a * n, M24, static_argnames=("nn",))


@case("returning a string", gp.ArgumentError, "<lambda> returned str 'done'", "output[1]['msg'] (out1)",
      "not a valid JAX type")
def _():
    gp.spmd(lambda a: (a, {"msg": "done"}), M24)(X)


@case("one array passed twice, donated", gp.ArgumentError, "arguments arg0 and arg1['b'] are one array",
      "float32[8, 8]", "donates arg0", "x.copy()")
def _():
    # jax 0.10's XLA crashes the process (SIGSEGV) on it, jax 0.12's raises its own runtime error
    f = gp.spmd(lambda a, d: a + d["b"], M24, in_shardings=(P("x", "y"), {"b": P("x", "y")}), donate_argnums=(0,))
    a = f(X, {"b": X})  # laid out as the plan takes it: the call would pass its buffer as is
    f(a, {"b": a})


@case("gp.annotate with a gp.Sharding of another mesh", gp.SpecError, "gp.annotate at",
      "its mesh has axes {'x': 4, 'y': 2} but the gp.spmd function's mesh has {'x': 2, 'y': 4}")
def _():
    s = gp.Sharding(gp.Mesh((4, 2), ("x", "y")), P("x", "y"))
    gp.spmd(lambda a: gp.annotate(a, s) + 1, M24).plan(X)


@case("gp.annotate inside a jax.shard_map region", gp.AnnotationError, "jax.shard_map region at",
      "gp.annotate at", "inside it", "per-device blocks over its manual mesh axes ('x', 'y')", "outside it")
def _():
    jm = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y"))
    body = lambda b: jax.lax.cond(b.sum() > 0, lambda c: gp.annotate(c, P("x")) * 2, lambda c: c, b)  # noqa: E731
    region = jax.shard_map(body, mesh=jm, in_specs=jax.sharding.PartitionSpec("x"),
                           out_specs=jax.sharding.PartitionSpec("x"))
    gp.spmd(region, M24).plan(X)  # was planned with the annotation silently dropped


# -- values: gp.Sharding, plan lookups ---------------------------------------------------------------
@case("Mesh.from_jax of a shape", gp.MeshError, "gp.Mesh.from_jax needs a jax.sharding.Mesh", "got tuple (2, 4)")
def _():
    gp.Mesh.from_jax((2, 4))  # was "'tuple' object has no attribute 'axis_names'"


@case("gp.Sharding over None", gp.SpecError, "gp.Sharding needs a gp.Mesh", "got NoneType None")
def _():
    gp.Sharding(None, P("x"))


@case("gp.Sharding over a jax mesh", gp.SpecError, "gp.Mesh.from_jax", "got Mesh")
def _():
    gp.Sharding(jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("x", "y")), P("x"))


@case("from_tile_assignment over a mesh shape", gp.TileAssignmentError, "needs a gp.Mesh", "got tuple (2, 4)")
def _():
    gp.Sharding.from_tile_assignment((2, 4), np.arange(8).reshape(2, 4))


@case("plan.sharding_of(an int)", gp.ShardingError, "named by a string", "got int 3")
def _():
    gp.spmd(lambda a: a + 1, M24).plan(X).sharding_of(3)


@case("plan.cost with a preset name", gp.HardwareError, "plan.cost needs a gp.Hardware",
      "gp.Hardware.preset('h100-node')", "got str")
def _():
    gp.spmd(lambda a: a @ a, M24).plan(X).cost("h100-node")


@case("Hardware.calibrate over a mesh shape", gp.HardwareError, "gp.Hardware.calibrate needs the gp.Mesh",
      "got tuple (2, 4)")
def _():
    gp.Hardware.calibrate((2, 4))


@case("Hardware.calibrate with reps=0", gp.HardwareError, "reps must be a positive int", "got 0")
def _():
    gp.Hardware.calibrate(M24, reps=0)  # was numpy's LinAlgError from a fit over no samples


@case("plan.save_html with an int path", gp.ArgumentError, "plan.save_html: path must be a file name", "got int 3")
def _():
    gp.spmd(lambda a: a + 1, M24).plan(X).save_html(3)  # open(3) writes into file descriptor 3


@case("planning with a dtype for an argument", gp.ArgumentError, "argument arg1 is type <class 'numpy.float32'>",
      "not an array", "a dtype?")
def _():
    gp.spmd(lambda a, b: a * b, M24).plan(X, np.float32)  # was "'getset_descriptor' object is not iterable"


# -- gp.auto_shard and gp.tactics --------------------------------------------------------------------
@case("auto_shard over a tuple as mesh", gp.ShardingError, "gp.auto_shard needs a gp.Mesh", "got tuple (2, 4)")
def _():
    gp.auto_shard(lambda a: a @ a, (2, 4), X, max_evaluations=2)


@case("auto_shard with a preset name as hardware", gp.HardwareError, "gp.auto_shard: hardware must be a gp.Hardware",
      "gp.Hardware.preset('h100-node')", "got str 'h100-node'")
def _():
    gp.auto_shard(lambda a: a @ a, M24, X, hardware="h100-node", max_evaluations=2)


@case("res.rules() given as in_shardings", gp.SpecError, "in_shardings got gp.tactics entries", "auto()",
      "tactics=res.rules()")
def _():
    res = gp.auto_shard(lambda d: d["a"] @ d["a"], M24, {"a": X}, max_evaluations=2)
    gp.spmd(lambda d: d["a"] @ d["a"], M24, in_shardings=res.rules())


@case("a tactic given as out_shardings", gp.SpecError, "out_shardings got gp.tactics entries", "batch('x')")
def _():
    gp.spmd(lambda a: a, M24, out_shardings=gp.tactics.batch("x"))


@case("auto_shard with a string seed", gp.TacticError, "seed must be an int", "'abc'")
def _():
    gp.auto_shard(lambda a: a @ a, M24, X, seed="abc", max_evaluations=2)


@case("tactics.auto with a float seed", gp.TacticError, "seed must be an int", "1.5")
def _():
    gp.tactics.auto("x", seed=1.5)


@case("auto_shard with memory_limit=True", gp.TacticError, "memory_limit must be a positive number", "True")
def _():
    gp.auto_shard(lambda a: a @ a, M24, X, memory_limit=True, max_evaluations=2)  # was a limit of 1 byte


@case("tactics.auto with max_evaluations=True", gp.TacticError, "max_evaluations must be a positive int", "True")
def _():
    gp.tactics.auto(max_evaluations=True)


@case("tactics.auto naming an axis twice", gp.TacticError, "axes ('x', 'x') name an axis twice")
def _():
    gp.tactics.auto("x", "x")


# -- gp.pipeline ---------------------------------------------------------------------------------------
@case("gp.pipeline with the params first", gp.ArgumentError, "gp.pipeline: stage_fn must be a function",
      "got an array of shape (2, 8, 8)", "gp.pipeline(stage_fn, stage_params, x")
def _():
    w = np.ones((2, 8, 8), np.float32)
    gp.spmd(lambda w, x: gp.pipeline(w, lambda p, h: h @ p, x, axis="x", microbatches=2), M24)(w, X)


@case("gp.pipeline over a list", gp.ArgumentError, "gp.pipeline: x must be an array", "got list [1.0, 2.0]")
def _():
    gp.spmd(lambda w: gp.pipeline(lambda p, h: h @ p, w, [1.0, 2.0], axis="x", microbatches=2), M24)(
        np.ones((2, 8, 8), np.float32))  # was "'list' object has no attribute 'shape'"


@case("gp.pipeline with 0 stacked layers", gp.ArgumentError, "stage_params have 0 stacked layers", "(0, 8, 8)")
def _():
    gp.spmd(lambda w, x: gp.pipeline(lambda p, h: h @ p, w, x, axis="x", microbatches=2), M24)(
        np.ones((0, 8, 8), np.float32), X)  # was lax's "slice_sizes must be less than or equal to operand shape"


# -- gp.testing ----------------------------------------------------------------------------------------
@case("assert_spmd_equivalent with an axis the mesh lacks", gp.SpecError, "in_shardings[0]", "float32[8, 8]",
      "unknown mesh axis 'z'")
def _():
    gp.testing.assert_spmd_equivalent(lambda a: a * 2, X, mesh=M24, in_shardings=(P("z"),), max_examples=2)


@case("assert_spmd_equivalent with a spec longer than the rank", gp.SpecError, "in_shardings[0]['b']", "arg0['b'] float32[8]",
      "has 2 entries but the tensor has rank 1")
def _():
    gp.testing.assert_spmd_equivalent(lambda d: d["a"].sum() + d["b"], {"a": X, "b": X[0]}, mesh=M24,
                                      in_shardings=({"a": None, "b": P("x", "y")},), max_examples=2)


def _draw(strategy):
    from hypothesis import given, settings

    @settings(max_examples=1, deadline=None, database=None)
    @given(strategy)
    def draw(_):
        pass

    draw()


@case("gpt.meshes(max_devices=0)", gp.MeshError, "no mesh of 2..0 devices", "max_devices must be at least min_devices")
def _():
    _draw(gp.testing.meshes(max_devices=0))  # said "jax has 8 devices: set XLA_FLAGS" (it has them)


@case("gpt.shardings over a mesh shape", gp.SpecError, "mesh must be a gp.Mesh", "got tuple (2, 4)")
def _():
    _draw(gp.testing.shardings((8, 8), (2, 4)))


@case("gpt.shardings of a negative shape", gp.SpecError, "shape must be non-negative ints", "(-1, 8)")
def _():
    _draw(gp.testing.shardings((-1, 8), M24))


@case("gpt.values(object)", gp.ArgumentError, "gpt.values: dtype object", "bool, int, float or complex")
def _():
    gp.testing.values(object)


@case("assert_plan over a mesh shape", gp.ArgumentError, "assert_plan: mesh must be a gp.Mesh", "got (2, 4)")
def _():
    gp.testing.assert_plan(lambda a: a * 2, X, mesh=(2, 4), in_shardings=(P("x"),))


@case("assert_plan with a negative byte limit", gp.ArgumentError, "max_collective_bytes must be a non-negative",
      "got -1")
def _():
    gp.testing.assert_plan(lambda a: a @ a, X, mesh=M24, in_shardings=(P("x", "y"),), max_collective_bytes=-1)


@case("assert_spmd_equivalent with tol='fast'", gp.ArgumentError, "tol must be 'auto' or a number", "'fast'")
def _():
    gp.testing.assert_spmd_equivalent(lambda a: a * 2, X, mesh=M24, tol="fast", max_examples=2)


# -- the table's test ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fn, error, needles", CASES)
def test_mistake_is_a_clear_error(fn, error, needles):
    assert issubclass(error, gp.ShardingError)
    with pytest.raises(error, match=".*".join(map(re.escape, needles))):
        fn()


# -- what stays accepted ----------------------------------------------------------------------------
def test_static_argnames_of_a_keyword_only_or_var_keyword_function_are_taken():
    """Names the function takes (keyword-only ones), and any name where it has **kwargs, stay accepted."""
    f = gp.spmd(lambda a, *, act: a * act, M24, static_argnames=("act",))
    np.testing.assert_allclose(f(X, act=2.0), X * 2)
    g = gp.spmd(lambda a, **kw: a * kw["k"], M24, static_argnames=("k",))
    np.testing.assert_allclose(g(X, k=3.0), X * 3)


def test_python_scalar_outputs_stay_arrays():
    out = gp.spmd(lambda a: (a + 1, 3, 2.5, True), M24)(X)
    assert [np.asarray(o).item() for o in out[1:]] == [3, 2.5, True]


def test_donated_array_with_a_copy_runs():
    f = gp.spmd(lambda a, d: a + d["b"], M24, in_shardings=(P("x", "y"), {"b": P("x", "y")}), donate_argnums=(0,))
    a = f(X, {"b": X})
    out = f(a, {"b": a.copy()})
    np.testing.assert_allclose(out, 4 * X)
    assert a.is_deleted()
    b = f(X, {"b": X})
    np.testing.assert_allclose(f(X, {"b": b}), 3 * X)  # the same array twice, neither donated: fine


def test_annotate_takes_a_gp_sharding_of_the_function_mesh():
    """gp.annotate takes a gp.Sharding, as in_shardings does (it was 'expected a partition spec')."""
    def f(a):
        return gp.tag(gp.annotate(a * 2, gp.Sharding(M24, P("y", "x"))), "h") + 1

    plan = gp.spmd(f, M24).plan(X)
    assert plan.sharding_of("h") == gp.Sharding(M24, P("y", "x"))
    np.testing.assert_allclose(gp.spmd(f, M24)(X), X * 2 + 1)
    np.testing.assert_allclose(f(X), X * 2 + 1)  # outside gp.spmd: the identity


def test_testing_helpers_wrong_types_are_type_errors_too():
    """The ArgumentErrors for a wrong type stay TypeErrors, as they were (and as Python's own)."""
    with pytest.raises(TypeError, match="mesh must be a gp.Mesh"):
        gp.testing.assert_plan(lambda a: a * 2, X, mesh=(2, 4))
    with pytest.raises(TypeError, match="fn must be callable"):
        gp.testing.assert_spmd_equivalent(3, X, mesh=M24, max_examples=2)


@pytest.mark.parametrize("fn, args, why", [
    (lambda a: a * 2, (X,), "only positional argument is arg0, which batch() takes as the parameters"),
    (lambda p, s: p * s, (X, np.float32(2)), "all scalars (rank 0)"),
], ids=["one argument", "scalar data"])
def test_batch_tactic_with_nothing_to_shard_warns(fn, args, why):
    """gp.tactics.batch that finds no data argument says so (it was a silent no-op: all replicated)."""
    with pytest.warns(UserWarning, match=re.escape("gp.tactics.batch('x'): no argument to shard: ") + ".*"
                      + re.escape(why)):
        gp.spmd(fn, M24, tactics=[gp.tactics.batch("x")]).plan(*args)
