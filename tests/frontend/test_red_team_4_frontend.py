"""Red team round 4 (issue 25), front end: errors that named nothing are ShardingErrors naming
the culprit: a gp.pipeline stage_fn that changes its microbatch, and jax.vmap with an
spmd_axis_name the gp.spmd function already shards over."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gspmd_py as gp
from partition_util import assert_same, rand

P = gp.P
D = 8


def _params(layers: int = 4):
    rng = np.random.default_rng(0)
    return {"w": (rng.normal(size=(layers, D, D)) * 0.3).astype(np.float32)}


@pytest.mark.parametrize("stage_fn,match", [
    (lambda p, h: jnp.concatenate([h @ p["w"], h], axis=-1), r"maps a microbatch f32\[4, 8\] to f32\[4, 16\]"),
    (lambda p, h: (h @ p["w"]).astype(jnp.bfloat16), r"f32\[4, 8\] to bf16\[4, 8\]"),
    (lambda p, h: (h @ p["w"], h), r"returns a tuple of 2 arrays"),
])
def test_pipeline_stage_fn_that_changes_its_microbatch_is_named(stage_fn, match):
    mesh = gp.Mesh((2, 4), ("data", "pipe"))
    params, x = _params(), rand((8, D))

    def f(params, x):
        return gp.pipeline(stage_fn, params, x, axis="pipe", microbatches=2)

    with pytest.raises(gp.ArgumentError, match=r"gp\.pipeline: stage_fn <lambda> .*" + match):
        gp.spmd(f, mesh, in_shardings=({"w": P("pipe")}, None))(params, x)
    with pytest.raises(gp.ArgumentError, match=match):  # outside gp.spmd too
        f(params, x)


def test_vmap_over_an_axis_the_function_shards_is_named():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    xs = rand((4, 4, 8))
    f = gp.spmd(lambda a: a * 2.0, mesh, in_shardings=(P("x", None),))
    with pytest.raises(gp.ShardingError, match=r"spmd_axis_name='x'\) puts the batch dim over mesh axis 'x', but "
                                               r"in_shardings of arg0 \(P\('x', None\)\) already uses it"):
        jax.vmap(f, spmd_axis_name="x")(xs)
    assert_same(jax.vmap(f, spmd_axis_name="y")(xs), xs * 2.0)  # another axis: fine
    # an annotation inside the function puts its value on y: the plan's input and output use y
    g = gp.spmd(lambda a: gp.annotate(a * 2.0, P(None, "y")), mesh)
    with pytest.raises(gp.ShardingError, match=r"spmd_axis_name='y'\) .*mesh axis 'y', but arg0 .*already use"):
        jax.vmap(g, spmd_axis_name="y")(xs)
    assert_same(jax.vmap(g, spmd_axis_name="x")(xs), xs * 2.0)
