"""Red team round 5 (held-out programs): less common jax.numpy / lax ops as users write them,
partitioned over the meshes with batch, model, 2-D and uneven shardings, compared with the
unpartitioned function; each test here failed before the fix it names."""
import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import check, examples, meshes, rand

P = gp.P


@examples(12)
@given(mesh=meshes(), m=st.sampled_from([4, 5, 8]), n=st.sampled_from([6, 7, 12]), data=st.data())
def test_bitcast_to_and_from_narrower_dtype_keeps_its_shardings(mesh, m, n, data):
    """bitcast_convert_type f32[m,n] -> u8[m,n,4] (and back) changes the rank: the leading dims
    stay sharded (it used to gather the operand whole and bitcast it on every device, without
    a warning)."""
    a, b = mesh.axis_names[0], mesh.axis_names[-1]
    spec = data.draw(st.sampled_from([P(a, None), P(None, b), P(a, b) if a != b else P(a, None)]))

    def fn(x):
        u8 = gp.tag(lax.bitcast_convert_type(x, jnp.uint8), "u8")
        return u8, lax.bitcast_convert_type(u8 ^ jnp.uint8(1), jnp.float32)

    x = rand((m, n))
    plan = check(fn, mesh, (x,), in_specs=(spec,))
    # (uneven outputs are gathered at the boundary: jax.Arrays must divide evenly)
    assert all(c.op == "boundary" for c in plan.collectives), plan.report()
    assert tuple(plan.sharding_of("u8").spec)[:2] == tuple(spec) + (None,) * (2 - len(spec))


@examples(15)
@given(mesh=meshes(), n=st.sampled_from([5, 13, 24]), dtype=st.sampled_from(["float32", "int32", "bfloat16"]),
       kind=st.sampled_from(["max", "min"]), table=st.booleans(), data=st.data())
def test_segment_max_min_over_sharded_rows_is_a_partial_max(mesh, n, dtype, kind, table, data):
    """jax.ops.segment_max / segment_min (scatter-max / -min) with the data rows sharded: each
    device scatters its own rows and the results are combined with one all-reduce (max / min),
    as scatter-add's are summed; it used to gather the updates and indices whole. Uneven rows,
    NaN, and (``table``) an operand sharded over its one-row dim too."""
    table = table and len(mesh.axis_names) > 1  # the table over an axis the rows do not use
    axes = mesh.axis_names[0] if table else data.draw(st.sampled_from([mesh.axis_names[0], tuple(mesh.axis_names)]))
    rng = np.random.default_rng(n)
    d = rand((n, 3), np.dtype(dtype) if dtype != "bfloat16" else jnp.bfloat16, seed=n)
    if dtype != "int32":
        d[1, 0] = np.nan
    seg = rng.integers(0, 6, n).astype(np.int32)
    segment = jax.ops.segment_max if kind == "max" else jax.ops.segment_min

    def fn(d, s):
        out = segment(d, s, num_segments=6)
        return gp.annotate(out, P(mesh.axis_names[-1], None)) if table else out

    plan = check(fn, mesh, (d, seg), in_specs=(P(axes, None), P(axes)))
    moved = [c for c in plan.collectives if c.op != "boundary"]
    assert moved and all(c.kind in ("all-reduce", "reduce-scatter") for c in moved), plan.report()


def _newton_steps(row, target):
    """Per-row data-dependent trip count: halve until under the target (at most 30 steps)."""
    def body(c):
        n, y = c
        return n + 1, y * 0.5 + jnp.cumsum(row)[-1] * 0.0
    return lax.while_loop(lambda c: (jnp.abs(c[1]).max() > target) & (c[0] < 30), body, (0, row))


@examples(12)
@given(mesh=meshes(), b=st.sampled_from([5, 8, 13]), nested=st.booleans(), data=st.data())
def test_vmap_of_a_data_dependent_while_loop(mesh, b, nested, data):
    """jax.vmap of a lax.while_loop whose condition depends on the mapped row: JAX keeps one
    while with a batched predicate bool[b] (run while any row continues, finished rows kept by
    a select). With the batch sharded (even or not) it used to crash in the loop handler
    (IndexError resharding the predicate)."""
    axes = data.draw(st.sampled_from([mesh.axis_names[0], tuple(mesh.axis_names)]))
    x = rand((b, 3, 6)) * 40
    t = np.abs(rand((b,), seed=1)) + 0.5

    if nested:
        def fn(x, t):
            return jax.vmap(jax.vmap(_newton_steps, in_axes=(0, None)))(x, t)
    else:
        def fn(x, t):
            return jax.vmap(_newton_steps)(x[:, 0], t)

    spec = (P(axes, None, None), P(axes))
    check(fn, mesh, (x, t), in_specs=spec)


@examples(10)
@given(mesh=meshes(), shape=st.sampled_from([(1, 3, 4), (1, 8, 1), (1, 1, 5, 6), (2, 1, 8, 4)]),
       inverse=st.booleans(), data=st.data())
def test_fft_of_a_block_with_size_one_batch_dims(mesh, shape, inverse, data):
    """jnp.fft.fft over the last dim of x[1,n,m] with n sharded: XLA's CPU compiler gave the
    local [1,n/k,m] operand a layout that is not dim-0 major (the size-1 dim allows it) once the
    result is gathered, and its FFT failed a RET_CHECK (as jax.jit with the same shardings
    does); the handler drops size-1 batch dims around the FFT."""
    axes = data.draw(st.sampled_from([mesh.axis_names[0], tuple(mesh.axis_names)]))
    spec = P(*([None] * (len(shape) - 2) + [axes, None]))

    def fn(x):
        z = x.astype(jnp.complex64)
        return jnp.fft.ifft(z, axis=-1) if inverse else jnp.fft.fft(z, axis=-1)

    check(fn, mesh, (rand(shape),), in_specs=(spec,), rtol=1e-4, atol=1e-4)


@examples(8)
@given(mesh=meshes(), n=st.sampled_from([0, 3, 12]), data=st.data())
def test_complex_sum_over_a_sharded_maybe_empty_dim(mesh, n, data):
    """A complex sum over a sharded dim is partial and all-reduced; over an empty dim its local
    value is a constant, and XLA's CPU compiler aborted the whole process on the all-reduce
    of a complex constant ('Check failed: buffer != nullptr'). Reduced as float pairs."""
    a, b = mesh.axis_names[0], mesh.axis_names[-1]
    spec = P(b if a != b else None, a)

    def fn(x):
        z = lax.complex(x, -2 * x)
        return jnp.sum(z * z, axis=1), jnp.mean(z, axis=1)

    check(fn, mesh, (rand((6, n)),), in_specs=(spec,), rtol=1e-5, atol=1e-5)
