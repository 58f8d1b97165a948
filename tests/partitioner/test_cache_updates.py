"""KV-cache reads and writes at per-row positions (Gemma's / MaxText's decode step):
``jax.vmap`` of ``dynamic_update_slice`` / ``dynamic_slice`` over the batch is a scatter / gather
with batching dims, indexed on every dim (the head and feature dims at start 0, whole). The
batch and the whole dims stay sharded as the cache is (jax.jit moves nothing); they were
gathered whole on every device (an all-gather of the cache per step). Equal to the
unpartitioned function over the test meshes, uneven dims, each mode of a gather / scatter
whose whole dims are indexed (a nonzero start there is out of bounds: clamped, dropped or
filled, as unpartitioned)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import assert_same, examples, mesh_of, rand

P = gp.P
MODES = (lax.GatherScatterMode.CLIP, lax.GatherScatterMode.FILL_OR_DROP, lax.GatherScatterMode.PROMISE_IN_BOUNDS)


def write(cache, new, pos):
    return jax.vmap(lambda c, u, i: lax.dynamic_update_slice(c, u, (i, 0, 0)))(cache, new, pos)


def read(cache, pos):
    return jax.vmap(lambda c, i: lax.dynamic_slice(c, (i, 0, 0), (3,) + c.shape[1:]))(cache, pos)


def _moves_nothing(plan):
    assert all(c.op == "boundary" for c in plan.collectives), plan.report()
    assert "needs replication" not in plan.report(), plan.report()


@pytest.mark.parametrize("fn", ["write", "read"])
def test_decode_cache_stays_sharded_on_batch_and_heads(fn):
    mesh = mesh_of(1)  # (2, 4): data x heads
    cache, new = rand((4, 16, 4, 8)), rand((4, 1, 4, 8), seed=1)
    pos = np.array([0, 5, 15, 9], np.int32)
    f, args = (write, (cache, new, pos)) if fn == "write" else (read, (cache, pos))
    specs = (P("x", None, "y", None),) * (len(args) - 1) + (P("x"),)
    sf = gp.spmd(f, mesh, in_shardings=specs, out_shardings=P("x", None, "y", None))
    _moves_nothing(sf.plan(*args))
    assert_same(sf(*args), jax.jit(f)(*args), rtol=0, atol=0)


@pytest.mark.slow
@examples(16)
@given(data=st.data())
def test_batched_cache_updates_over_meshes_and_uneven_dims(data):
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    b, c, h, d = (data.draw(st.sampled_from(s)) for s in ((2, 4, 3, 8), (5, 16), (1, 3, 4, 6), (2, 8)))
    names = list(mesh.axis_names)
    order = data.draw(st.permutations(names))
    spec = [None] * 4
    for a, dim in zip(order, data.draw(st.lists(st.sampled_from((0, 2, 3)), min_size=len(names), max_size=len(names)))):
        spec[dim] = a if spec[dim] is None else (spec[dim] if isinstance(spec[dim], tuple) else (spec[dim],)) + (a,)
    spec = P(*spec)
    cache, new = rand((b, c, h, d)), rand((b, 1, h, d), seed=2)
    pos = data.draw(st.lists(st.integers(-2, c + 2), min_size=b, max_size=b))
    pos = np.asarray(pos, np.int32)  # (out of range: clamped, as dynamic_update_slice does)
    w = gp.spmd(write, mesh, in_shardings=(spec, spec, P(spec[0])), out_shardings=spec)
    assert_same(w(cache, new, pos), jax.jit(write)(cache, new, pos), rtol=0, atol=0)
    r = gp.spmd(read, mesh, in_shardings=(spec, P(spec[0])))
    assert_same(r(cache, pos), jax.jit(read)(cache, pos), rtol=0, atol=0)
    for plan in (w.plan(cache, new, pos), r.plan(cache, pos)):
        assert "needs replication" not in plan.report(), plan.report()


@pytest.mark.slow
@examples(16)
@given(mode=st.sampled_from(MODES), start=st.sampled_from((0, 1, -1)), mesh_i=st.integers(0, 3),
       uneven=st.booleans())
def test_whole_dims_indexed_in_each_mode(mode, start, mesh_i, uneven):
    """A gather / scatter whose whole dim 1 is indexed: start 0 reads / writes it all; any
    other start is out of bounds (clip: clamped to 0; fill / drop: filled / dropped)."""
    mesh = mesh_of(mesh_i)
    if mode == lax.GatherScatterMode.PROMISE_IN_BOUNDS and start:
        start = 0  # (a broken promise has no defined result)
    n = 6 if uneven else 8
    x, upd = rand((5, n)), rand((2, 1, n), seed=3)
    idx = np.array([[1, start], [3, 0]], np.int32)
    gdn = lax.GatherDimensionNumbers(offset_dims=(1, 2), collapsed_slice_dims=(), start_index_map=(0, 1))
    sdn = lax.ScatterDimensionNumbers(update_window_dims=(1, 2), inserted_window_dims=(), scatter_dims_to_operand_dims=(0, 1))

    def f(x, idx, upd):
        got = lax.gather(x, idx, gdn, (1, n), mode=mode, fill_value=-7.0)
        put = lax.scatter(x, idx, upd, sdn, mode=mode)
        return got, put

    spec = P(None, mesh.axis_names[-1])
    sf = gp.spmd(f, mesh, in_shardings=(spec, None, P(None, None, mesh.axis_names[-1])))
    assert_same(sf(x, idx, upd), jax.jit(f)(x, idx, upd), rtol=0, atol=0)
    if not uneven:
        assert "needs replication" not in sf.plan(x, idx, upd).report()


@pytest.mark.parametrize("shape", [(4, 16, 4, 8), (3, 5, 3, 8)])
def test_cache_read_gradient_is_a_batched_scatter_add_kept_sharded(shape):
    """The read's gradient: a scatter-add with batching dims, into the sharded cache's rows."""
    g = jax.grad(lambda c, p: jnp.sum(jnp.sin(read(c, p))))
    cache, pos = rand(shape), np.array([0, 5, 15, 9][:shape[0]], np.int32)
    for mesh in (mesh_of(1), mesh_of(3)):
        spec = P("x", None, "y", "z" if "z" in mesh.axis_names else None)
        sf = gp.spmd(g, mesh, in_shardings=(spec, P("x")), out_shardings=spec)
        assert "needs replication" not in sf.plan(cache, pos).report()
        assert_same(sf(cache, pos), jax.jit(g)(cache, pos), rtol=0, atol=0)


@pytest.mark.parametrize("mesh_i", [1, 3])
def test_one_token_write_into_a_sequence_sharded_cache(mesh_i):
    """The position dim sharded (a one-row window of the scatter): each device writes the rows
    it holds, the others' updates going to a spare row (out-of-range positions clamped first,
    as dynamic_update_slice does); it gathered the cache whole along the sequence."""
    mesh = mesh_of(mesh_i)
    cache, new = rand((4, 16, 4, 8)), rand((4, 1, 4, 8), seed=4)
    spec = P("x", "y", None, None)
    for pos in ([0, 5, 15, 9], [-3, 20, 12, 1]):
        pos = np.asarray(pos, np.int32)
        sf = gp.spmd(write, mesh, in_shardings=(spec, P("x", None, None, None), P("x")), out_shardings=spec)
        _moves_nothing(sf.plan(cache, new, pos))
        assert_same(sf(cache, new, pos), jax.jit(write)(cache, new, pos), rtol=0, atol=0)
