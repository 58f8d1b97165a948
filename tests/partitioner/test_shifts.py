"""Shifts and rotations written as slices + concatenate or pad + slice fold into one op
(gspmd_py/frontend/shifts.py) and partition as collective-permutes of whole blocks; equal to the
plain function over meshes, uneven dims, every shift, dtypes."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gspmd_py as gp
from gspmd_py.frontend.trace import trace
from partition_util import check, examples, meshes, rand, spec_for

P = gp.P

FORMS = {
    "roll": lambda x, s, d: jnp.roll(x, s, axis=d),
    "concat": lambda x, s, d: jnp.concatenate([jax.lax.slice_in_dim(x, x.shape[d] - s % x.shape[d], x.shape[d], axis=d),
                                               jax.lax.slice_in_dim(x, 0, x.shape[d] - s % x.shape[d], axis=d)], axis=d),
    "pad_slice": lambda x, s, d: jax.lax.slice_in_dim(
        jnp.pad(x, [(abs(s), 0) if i == d else (0, 0) for i in range(x.ndim)]), 0, x.shape[d], axis=d),
    "slice_pad": lambda x, s, d: jnp.pad(jax.lax.slice_in_dim(x, 0, x.shape[d] - abs(s), axis=d),
                                         [(abs(s), 0) if i == d else (0, 0) for i in range(x.ndim)]),
    "shift_left": lambda x, s, d: jax.lax.slice_in_dim(
        jnp.pad(x, [(0, abs(s)) if i == d else (0, 0) for i in range(x.ndim)]), abs(s), x.shape[d] + abs(s), axis=d),
}


@pytest.mark.parametrize("form,prim", [("roll", "gspmd_rotate"), ("concat", "gspmd_rotate"), ("pad_slice", "pad"),
                                       ("slice_pad", "pad"), ("shift_left", "pad")])
def test_forms_fold_into_one_op(form, prim):
    g = trace(lambda x: FORMS[form](x, 1, 0), [jax.ShapeDtypeStruct((4, 3), np.float32)])
    assert [op.prim for op in g.ops if op.outputs[0].rank] == [prim]  # (and the fill value's convert)


@pytest.mark.slow
@examples(20)
@given(mesh=meshes(), n=st.sampled_from([1, 3, 4, 7, 8, 13, 16]), m=st.sampled_from([1, 5]),
       s=st.integers(-17, 17), form=st.sampled_from(sorted(FORMS)), dtype=st.sampled_from(["float32", "int32", "bfloat16"]),
       data=st.data())
def test_shift_forms_equal_the_plain_function(mesh, n, m, s, form, dtype, data):
    if form != "roll" and not 0 < abs(s) < n:
        s = 1 if n > 1 else 0
        if form != "roll" and s == 0:
            return
    spec = data.draw(spec_for(mesh, 2))
    x = rand((n, m), np.dtype(jnp.dtype(dtype)), seed=n)
    check(lambda x: FORMS[form](x, s, 0), mesh, (x,), (spec,))


def test_rotate_by_a_whole_shard_is_one_permute():
    mesh = gp.Mesh((8,), ("x",))
    x = rand((16, 4))
    for s, nbytes in ((2, 32), (1, 16), (5, None)):  # a whole shard; less than a shard; 2 shards + 1 row
        plan = check(lambda x: jnp.roll(x, s, 0), mesh, (x,), (P("x", None),), P("x", None))
        kinds = [c.kind for c in plan.collectives]
        if nbytes is not None:
            assert kinds == ["collective-permute"] and plan.collectives[0].bytes_per_device == nbytes, plan.report()
        else:
            assert kinds == ["collective-permute"] * 2, plan.report()


def test_rotate_gradient():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((8, 6))
    f = gp.spmd(jax.grad(lambda x: (jnp.roll(x, 3, 0) * jnp.arange(6.0)).sum()), mesh, in_shardings=(P("y", None),))
    np.testing.assert_allclose(f(x), jax.grad(lambda x: (jnp.roll(x, 3, 0) * jnp.arange(6.0)).sum())(x))


def test_a_partial_sum_passes_a_rotation_and_is_reduced_once():
    """roll is data movement: a partial sum rolled (even or uneven rows) is reduced once, after."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    for n in (8, 7):
        x = np.random.default_rng(n).integers(-4, 5, size=(8, n, 3)).astype(np.float32)

        def f(x):
            s = x.sum(0)  # partial over x
            return gp.annotate(jnp.roll(gp.annotate(s, P("y", None)), 3, 0), P("y", None))

        plan = check(f, mesh, (x,), (P("x", None, None),))
        sums = [c for c in plan.collectives if c.kind in ("all-reduce", "reduce-scatter")]
        assert len(sums) == 1, plan.report()


def test_rotation_by_the_last_shard_and_a_row_keeps_one_piece_home():
    """A shift of (k-1) shards and r rows: the r rows come from the device itself (no permute of
    them), the rest from one neighbour: one collective-permute."""
    mesh = gp.Mesh((2, 4), ("a", "x"))
    x = rand((8, 3))
    plan = check(lambda x: jnp.roll(x, 7, 0), mesh, (x,), (P("x", None),), P("x", None))
    assert [c.kind for c in plan.collectives] == ["collective-permute"], plan.report()
