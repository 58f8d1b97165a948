"""Embedding lookups from a table sharded on its vocab dim (XLA's masked local gather) and
their gradients (each device scatters the rows it owns): equal to the unpartitioned function
bit for bit (a lookup moves values, it computes nothing), over the test meshes, uneven and
empty dims, dtypes, every gather mode with out-of-range indices, and under jax.grad; the
collectives move only the looked-up rows' partials, never the table."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import gspmd_py as gp
from gspmd_py.core import dtypes
from partition_util import SMALL_DIMS, assert_same, bitwise_diff, examples, maybe, meshes, rand, shapes, spec_for

P = gp.P
DTYPES = (np.float32, jnp.bfloat16, np.float16, np.int32, np.int8, np.uint8, np.bool_)
MODES = {
    "take": lambda t, i: jnp.take(t, i, axis=0),  # fill with NaN / the int minimum / True
    "take_clip": lambda t, i: jnp.take(t, i, axis=0, mode="clip"),
    "take_fill": lambda t, i: jnp.take(t, i, axis=0, mode="fill", fill_value=-0.0),
    "index": lambda t, i: jnp.asarray(t)[i],  # promise_in_bounds after jnp's negative-index wrap (XLA clamps)
    "at_get_fill": lambda t, i: jnp.asarray(t).at[i].get(mode="fill", fill_value=5),
}


def _table(vocab: int, dim: int, dtype, seed: int = 1):
    t = rand((vocab, dim), dtype, seed)
    if dtypes.is_float(np.dtype(dtype)) and t.size > 3:  # special values survive the lookup
        flat = t.reshape(-1)
        flat[:3] = np.array([-0.0, np.nan, np.inf]).astype(t.dtype)
    return t


def _ids(shape, vocab: int, seed: int = 4):
    """Indices in range, negative (jnp wraps them) and out of range (the mode decides)."""
    return rand(shape, np.int32, seed, low=-vocab - 3, high=2 * vocab).astype(np.int32)


def _same_bits(got, want):
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
    assert bitwise_diff(g, w) == "", bitwise_diff(g, w)


def _vocab_spec(mesh, data):
    """The table's vocab dim sharded over one or two mesh axes (the case under test), or a random spec."""
    names = list(mesh.axis_names)
    pick = data.draw(st.sampled_from(names + [tuple(names[:2])] if len(names) > 1 else names))
    return data.draw(st.one_of(st.just(P(pick, None)), spec_for(mesh, 2)))


@examples(25)
@given(st.data())
def test_lookup_from_vocab_sharded_table(data):
    mesh = data.draw(meshes())
    vocab = data.draw(st.sampled_from((5, 8, 13, 30)))
    dim = data.draw(st.sampled_from((1, 3, 8)))
    dtype = data.draw(st.sampled_from(DTYPES))
    mode = data.draw(st.sampled_from(sorted(MODES)))
    ids_shape = data.draw(shapes(1, 2, dims=SMALL_DIMS + (0,)))
    s_tab = _vocab_spec(mesh, data)
    s_ids = data.draw(maybe(spec_for(mesh, len(ids_shape))))
    out = data.draw(maybe(spec_for(mesh, len(ids_shape) + 1), 0.6))
    fn = MODES[mode]
    if mode == "at_get_fill" and dtype == np.bool_:
        fn = lambda t, i: jnp.asarray(t).at[i].get(mode="fill", fill_value=False)
    args = (_table(vocab, dim, dtype), _ids(ids_shape, vocab))
    f = gp.spmd(fn, mesh, in_shardings=(s_tab, s_ids), out_shardings=out)
    _same_bits(f(*args), fn(*args))


@examples(15)
@given(st.data())
def test_take_along_sharded_axis(data):
    mesh = data.draw(meshes())
    rows = data.draw(st.sampled_from((1, 3, 4, 8)))
    n = data.draw(st.sampled_from((5, 8, 13)))
    k = data.draw(st.sampled_from((0, 1, 3, 8)))
    dtype = data.draw(st.sampled_from(DTYPES))
    s_x = data.draw(st.one_of(st.just(P(None, mesh.axis_names[-1])), spec_for(mesh, 2)))
    s_i = data.draw(maybe(spec_for(mesh, 2)))
    fn = lambda x, i: jnp.take_along_axis(x, i, axis=1)
    args = (_table(rows, n, dtype), rand((rows, k), np.int32, 3, low=-n, high=n).astype(np.int32))
    f = gp.spmd(fn, mesh, in_shardings=(s_x, s_i))
    _same_bits(f(*args), fn(*args))


@examples(15)
@given(st.data())
def test_lookup_gradient(data):
    mesh = data.draw(meshes())
    vocab = data.draw(st.sampled_from((5, 13, 30)))
    dim = data.draw(st.sampled_from((3, 8)))
    dtype = data.draw(st.sampled_from((np.float32, jnp.bfloat16)))
    mode = data.draw(st.sampled_from((None, "clip", "fill")))
    ids_shape = data.draw(shapes(1, 2, dims=SMALL_DIMS + (0,)))
    s_tab = _vocab_spec(mesh, data)
    s_ids = data.draw(maybe(spec_for(mesh, len(ids_shape))))
    s_grad = data.draw(maybe(spec_for(mesh, 2), 0.5))
    w = rand(ids_shape + (dim,), np.float32, 5)

    def loss(t, i):
        e = jnp.take(t, i, axis=0, mode=mode, fill_value=0 if mode == "fill" else None).astype(jnp.float32)
        return jnp.sum(e * e * w)

    args = (rand((vocab, dim), dtype, 1), _ids(ids_shape, vocab))
    g = jax.grad(loss)
    f = gp.spmd(g, mesh, in_shardings=(s_tab, s_ids), out_shardings=s_grad)
    tol = 1e-5 if dtype == np.float32 else 5e-2
    assert_same(f(*args), g(*args), rtol=tol, atol=tol)


# -- what moves -----------------------------------------------------------------------------------

TABLE, IDS = (1000, 64), (16, 32)


def _plan(fn, mesh, in_specs, out_spec):
    tab = rand(TABLE, np.float32, 1)
    ids = (rand(IDS, np.int32, 2, low=0, high=1000) % 1000).astype(np.int32)
    f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=out_spec)
    _same_bits(f(tab, ids), fn(tab, ids)) if out_spec is not None else None
    return f.plan(tab, ids), f, (tab, ids)


def _moved(plan):
    return [(c.kind, c.axes, c.bytes_per_device) for c in plan.collectives]


def test_vocab_sharded_lookup_moves_only_the_looked_up_rows():
    """table [1000,64]{y}, ids [16,32]{x}: a local masked lookup and one all-reduce of the
    device's [8,32,64] rows over y (64 KiB), not the 250 KB table shard."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    plan, _, _ = _plan(lambda t, i: jnp.take(t, i, axis=0), mesh, (P("y", None), P("x", None)), P("x", None, None))
    assert _moved(plan) == [("all-reduce", ("y",), 8 * 32 * 64 * 4)]


def test_vocab_sharded_lookup_reduce_scatters_onto_a_sharded_consumer():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    plan, _, _ = _plan(lambda t, i: jnp.asarray(t)[i], mesh, (P("y", None), P("x", None)), P("x", None, "y"))
    assert _moved(plan) == [("reduce-scatter", ("y",), 8 * 32 * 64 * 4)]


def test_lookup_gradient_scatters_own_rows_and_never_gathers_the_table():
    """(8,) mesh, table and ids both sharded over x: the forward all-gathers the ids
    (256 B) and reduce-scatters the looked-up rows onto the ids' batch; the gradient
    all-gathers the cotangent rows (16 KiB) and each device adds the rows it owns: no
    collective carries the table or its gradient (256 KB)."""
    mesh = gp.Mesh((8,), ("x",))
    loss = lambda t, i: jnp.sum(jnp.take(t, i, axis=0) ** 2)
    plan, f, args = _plan(jax.grad(loss), mesh, (P("x", None), P("x", None)), P("x", None))
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(jax.grad(loss)(*args)), rtol=1e-6)
    moved = _moved(plan)
    assert moved == [("all-gather", ("x",), 2 * 32 * 4), ("reduce-scatter", ("x",), 16 * 32 * 64 * 4),
                     ("all-gather", ("x",), 2 * 32 * 64 * 4)], moved


def test_lookup_gradient_on_data_and_model_axes_sums_the_data_axis_once():
    """table [1000,64]{y} (model), ids [16,32]{x} (data): each device scatters its own
    cotangent rows into the table rows it owns; the table gradient is partial over x and
    reduced once (all-reduce of the [250,64] shard), or reduce-scattered onto a gradient
    sharded over (y, x): never all-gathered."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    loss = lambda t, i: jnp.sum(jnp.take(t, i, axis=0, mode="clip") ** 2)
    plan, f, args = _plan(jax.grad(loss), mesh, (P("y", None), P("x", None)), P("y", None))
    np.testing.assert_allclose(np.asarray(f(*args)), np.asarray(jax.grad(loss)(*args)), rtol=1e-6)
    assert _moved(plan) == [("all-reduce", ("y",), 8 * 32 * 64 * 4), ("all-reduce", ("x",), 250 * 64 * 4)]


@examples(15)
@given(st.data())
def test_scatter_add_of_uneven_sharded_updates(data):
    """Each device adds its own update rows: the padding rows of an uneven update dim must
    add nothing (bincount: every update is 1, padding included)."""
    mesh = data.draw(meshes())
    n = data.draw(st.sampled_from((5, 13)))
    b = data.draw(st.sampled_from((3, 5, 7, 13)))
    dtype = data.draw(st.sampled_from((np.float32, np.int32)))
    s_ids = data.draw(st.one_of(st.just(P(mesh.axis_names[0])), spec_for(mesh, 1)))
    s_out = data.draw(maybe(spec_for(mesh, 1), 0.5))
    fn = lambda i: jnp.zeros((n,), dtype).at[i].add(jnp.ones(i.shape, dtype))
    ids = (rand((b,), np.int32, 2, low=0, high=n) % n).astype(np.int32)
    f = gp.spmd(fn, mesh, in_shardings=(s_ids,), out_shardings=s_out)
    _same_bits(f(ids), fn(ids))


SCATTER_MODES = {
    "drop": lambda t, i, u: jnp.asarray(t).at[i].add(u),  # jnp's default: out-of-range updates dropped
    "clip": lambda t, i, u: jnp.asarray(t).at[i].add(u, mode="clip"),
    "promise": lambda t, i, u: jnp.asarray(t).at[i].add(u, mode="promise_in_bounds"),
    "sub": lambda t, i, u: jax.lax.scatter_sub(jnp.asarray(t), i[:, None], u, jax.lax.ScatterDimensionNumbers(
        (1,), (0,), (0,)), mode="drop"),
}


@examples(25)
@given(st.data())
def test_scatter_add_into_vocab_sharded_table_with_replicated_updates(data):
    """table.at[ids].add(u), the table sharded on its (possibly uneven) vocab dim, ids and
    updates replicated: each device adds the updates of its own rows, bit for bit as the
    unpartitioned scatter (duplicate ids, negative and out-of-range ids as the mode says)."""
    mesh = data.draw(meshes())
    vocab = data.draw(st.sampled_from((3, 8, 13, 30)))
    dim = data.draw(st.sampled_from((1, 4)))
    n = data.draw(st.sampled_from((0, 1, 7, 20)))
    dtype = data.draw(st.sampled_from((np.float32, jnp.bfloat16, np.float16, np.int32, np.int8)))
    mode = data.draw(st.sampled_from(sorted(SCATTER_MODES)))
    names = list(mesh.axis_names)
    pick = data.draw(st.sampled_from(names + ([tuple(names[:2])] if len(names) > 1 else [])))
    t = _table(vocab, dim, dtype)
    if mode == "promise":  # in range (after jnp's negative wrap) or the result is undefined
        ids = rand((n,), np.int32, 4, low=-vocab, high=vocab - 1).astype(np.int32) % vocab
    else:  # duplicates, negative and out of range
        ids = np.concatenate([_ids((n,), vocab), np.zeros((n > 0) * 2, np.int32)]).astype(np.int32)
    u = rand((len(ids), dim), dtype, 5)
    fn = SCATTER_MODES[mode]
    f = gp.spmd(fn, mesh, in_shardings=(P(pick, None), None, None))
    _same_bits(f(t, ids, u), fn(t, ids, u))


def test_scatter_add_into_own_rows_drops_the_others_in_the_scatter():
    """The vocab-sharded scatter-add shifts the ids by the device's first row and lets the
    scatter drop the rows other devices hold (as jax.jit does): no pass over the updates
    (a select masking them), no clamp of the local ids."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    fn = lambda t, i, u: t.at[i].add(u)
    plan = gp.spmd(fn, mesh, in_shardings=(P(("x", "y"), None), None, None)).plan(
        np.zeros((64, 8), np.float32), np.zeros((16,), np.int32), np.zeros((16, 8), np.float32))
    text = plan.spmd_text()
    assert "mode=GatherScatterMode.FILL_OR_DROP" in text, text
    assert "f32[16,8] = select_n" not in text and "clamp" not in text, text  # (jnp's negative-id wrap stays)
    assert plan.collectives == [] or all(c.bytes_per_device == 0 for c in plan.collectives), plan.collectives
