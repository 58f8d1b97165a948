"""Per-op correctness of the SPMD partitioner: for random meshes, random shardings of the
inputs (and sometimes of the outputs or of an inner gp.annotate) and shapes that do not
divide the shard counts, the partitioned result equals the unpartitioned one."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax import lax
import pytest

import gspmd_py as gp
from partition_util import (DIMS, SMALL_DIMS, check, examples, maybe, meshes, rand, shapes,
                            spec_for)

F32 = dict(rtol=1e-5, atol=1e-5)
DOT_TOL = dict(rtol=1e-5, atol=1e-4)


def _annotated(fn, spec):
    """fn with its (first) argument annotated with ``spec`` inside the traced function."""
    if spec is None:
        return fn
    return lambda x, *rest: fn(gp.annotate(x, spec), *rest)


# -- elementwise --------------------------------------------------------------------------------

UNARY = {
    "neg": jnp.negative,
    "exp": jnp.exp,
    "tanh": jnp.tanh,
    "abs": jnp.abs,
    "sqrt_abs": lambda x: jnp.sqrt(jnp.abs(x)),
    "log1p_abs": lambda x: jnp.log1p(jnp.abs(x)),
    "logistic": jax.nn.sigmoid,
    "floor": jnp.floor,
    "sin": jnp.sin,
    "integer_pow3": lambda x: x ** 3,
    "integer_pow2": lambda x: lax.integer_pow(x, 2),
    "convert_i32": lambda x: (x * 3).astype(jnp.int32),
    "convert_bool": lambda x: (x > 0).astype(jnp.float32),
    "is_finite": lambda x: jnp.isfinite(x / (x - x)),
    "gelu": jax.nn.gelu,
    "erf_inv": lambda x: lax.erf_inv(jnp.clip(x / 3, -0.9, 0.9)),
    "stop_gradient": lax.stop_gradient,
}

BINARY = {
    "add": jnp.add,
    "sub": jnp.subtract,
    "mul": jnp.multiply,
    "div": lambda a, b: a / (jnp.abs(b) + 1.0),
    "max": jnp.maximum,
    "min": jnp.minimum,
    "atan2": jnp.arctan2,
    "pow": lambda a, b: jnp.abs(a) ** b,
    "eq": lambda a, b: jnp.round(a) == jnp.round(b),
    "ne": lambda a, b: jnp.round(a) != jnp.round(b),
    "lt": jnp.less,
    "ge": jnp.greater_equal,
    "gt_and": lambda a, b: (a > 0) & (b < 0),
    "or_xor": lambda a, b: (a > 0) | ((b > 0) ^ (a < 1)),
    "select": lambda a, b: jnp.where(a > b, a, b * 2),
    "clamp": lambda a, b: lax.clamp(-jnp.abs(b), a, jnp.abs(b)),
    "clamp_scalar": lambda a, b: lax.clamp(-0.5, a, 0.5) + b,
    "rem_int": lambda a, b: lax.rem((a * 4).astype(jnp.int32), jnp.where(jnp.abs(b) < .5, 3, (b * 4).astype(jnp.int32) | 1)),
    "shift": lambda a, b: lax.shift_right_logical(jnp.abs(a * 100).astype(jnp.int32), jnp.int32(2)) + b.astype(jnp.int32),
    "scalar_add": lambda a, b: a + 1.5 + b,
}


@pytest.mark.slow
@examples(16)
@given(st.data())
def test_unary(data):
    mesh = data.draw(meshes())
    name = data.draw(st.sampled_from(sorted(UNARY)))
    shape = data.draw(shapes(1, 3))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    mid = data.draw(maybe(spec_for(mesh, len(shape)), 0.7))
    fn = _annotated(UNARY[name], mid)
    check(fn, mesh, (rand(shape),), (spec,), out, **F32)


@pytest.mark.slow
@examples(16)
@given(st.data())
def test_binary(data):
    mesh = data.draw(meshes())
    name = data.draw(st.sampled_from(sorted(BINARY)))
    shape = data.draw(shapes(1, 3))
    s1 = data.draw(maybe(spec_for(mesh, len(shape))))
    s2 = data.draw(maybe(spec_for(mesh, len(shape))))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    mid = data.draw(maybe(spec_for(mesh, len(shape)), 0.7))
    fn = _annotated(BINARY[name], mid)
    check(fn, mesh, (rand(shape, seed=1), rand(shape, seed=2)), (s1, s2), out, **F32)


@pytest.mark.slow
@examples(10)
@given(st.data())
def test_binary_broadcasting(data):
    """An operand of lower rank / with size-1 dims is broadcast (broadcast_in_dim) first."""
    mesh = data.draw(meshes())
    shape = data.draw(shapes(2, 3))
    # the small operand keeps a suffix of the dims, some of them squashed to 1
    keep = data.draw(st.integers(1, len(shape)))
    small = tuple(n if data.draw(st.booleans()) else 1 for n in shape[len(shape) - keep:])
    s1 = data.draw(spec_for(mesh, len(shape)))
    s2 = data.draw(maybe(spec_for(mesh, len(small))))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    fn = lambda a, b: a * b + jnp.tanh(b)
    check(fn, mesh, (rand(shape, seed=1), rand(small, seed=2)), (s1, s2), out, **F32)


@pytest.mark.slow
@examples(10)
@given(st.data())
def test_integer_and_bool_ops(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    s1 = data.draw(spec_for(mesh, len(shape)))
    s2 = data.draw(maybe(spec_for(mesh, len(shape))))

    def fn(a, b):
        c = (a * b) ^ (a >> 1) | (b & 7)
        return jnp.where(c > a, c - b, -c), jnp.logical_not(a > b)

    check(fn, mesh, (rand(shape, np.int32, 1, low=-50, high=50), rand(shape, np.int32, 2, low=-50, high=50)),
          (s1, s2))


# -- broadcast / reshape / transpose --------------------------------------------------------------

@pytest.mark.slow
@examples(12)
@given(st.data())
def test_broadcast_in_dim(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 2))
    new = data.draw(st.sampled_from(DIMS))
    pos = data.draw(st.integers(0, len(shape)))
    out_shape = shape[:pos] + (new,) + shape[pos:]
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(out_shape)), 0.4))

    def fn(x):
        return jnp.broadcast_to(jnp.expand_dims(x, pos), out_shape) * 2.0

    check(fn, mesh, (rand(shape),), (spec,), out)


RESHAPES = [
    ((8,), (2, 4)), ((8,), (4, 2)), ((16,), (4, 4)), ((12,), (3, 4)), ((30,), (5, 6)), ((30,), (6, 5)),
    ((4, 4), (16,)), ((2, 4), (8,)), ((2, 3, 5), (6, 5)), ((6, 5), (30,)), ((7, 4), (28,)), ((4, 7), (28,)),
    ((28,), (4, 7)), ((28,), (7, 4)), ((6, 4), (4, 6)), ((8, 2, 3), (16, 3)), ((16, 3), (2, 8, 3)),
    ((14, 32), (7, 2, 2, 16)), ((8, 8), (4, 2, 8)), ((1, 8), (8,)), ((8,), (8, 1)), ((13, 1), (13,)),
    ((8, 6), (48,)), ((48,), (8, 6)), ((2, 2, 2), (8,)), ((4, 12), (2, 2, 3, 4)),
]


@pytest.mark.slow
@examples(20)
@given(st.data())
def test_reshape(data):
    mesh = data.draw(meshes())
    src, dst = data.draw(st.sampled_from(RESHAPES))
    spec = data.draw(spec_for(mesh, len(src), sub_axes=True))
    out = data.draw(maybe(spec_for(mesh, len(dst), sub_axes=True), 0.5))
    fn = lambda x: jnp.reshape(x * 1.5, dst) + 1.0
    check(fn, mesh, (rand(src),), (spec,), out)


def test_reshape_result_sharded_on_a_minor_factor():
    """[16,3] -> [2,8,3] with the 8 sharded: the operand dim cannot carry that factor's axis
    without the major one (2), so the operand is gathered, not reshaped to a wrong local shape."""
    mesh = gp.Mesh((8,), ("x",))
    check(lambda v: jnp.reshape(v * 1.5, (2, 8, 3)), mesh, (rand((16, 3)),), (None,), gp.P(None, "x", None))
    check(lambda v: jnp.reshape(v * 1.5, (2, 8, 3)), mesh, (rand((16, 3)),), (gp.P("x", None),),
          gp.P(None, "x", None))


def test_reshape_split_sharded_dim_stays_local():
    """[8] sharded x:4 -> [2,4]: the axis splits into sub-axes, no communication (Shardy: a reshape splits the axis into sub-axes)."""
    mesh = gp.Mesh((4, 2), ("x", "y"))
    fn = lambda v: jnp.reshape(v, (2, 4)) * 2.0
    plan = check(fn, mesh, (rand((8,)),), (gp.P("x"),))
    assert plan.collectives == []
    # Shardy reshape test: [{x},{y}] 4x4 -> 16 keeps only x: y is gathered, once
    mesh = gp.Mesh((2, 2), ("x", "y"), devices=[0, 1, 2, 3])
    plan = check(lambda v: jnp.reshape(v, (16,)) + 1.0, mesh, (rand((4, 4)),), (gp.P("x", "y"),))
    assert plan.out_specs[0] == jax.sharding.PartitionSpec("x")
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-gather", ("y",))]


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_transpose(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(2, 3))
    perm = tuple(data.draw(st.permutations(range(len(shape)))))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.5))
    fn = lambda x: jnp.transpose(jnp.sin(x), perm)
    check(fn, mesh, (rand(shape),), (spec,), out)


@pytest.mark.slow
@examples(10)
@given(st.data())
def test_squeeze_expand_dims(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3, dims=SMALL_DIMS))
    pos = data.draw(st.integers(0, len(shape)))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape) + 1), 0.5))

    def fn(x):
        y = jnp.expand_dims(x, pos)
        return y + 1.0, jnp.squeeze(y, pos) * 2.0

    check(fn, mesh, (rand(shape),), (spec,), (out, None))


# -- dot_general ----------------------------------------------------------------------------------

@pytest.mark.slow
@examples(16)
@given(st.data())
def test_matmul(data):
    mesh = data.draw(meshes())
    m, k, n = (data.draw(st.sampled_from(DIMS)) for _ in range(3))
    sa = data.draw(maybe(spec_for(mesh, 2)))
    sb = data.draw(maybe(spec_for(mesh, 2)))
    out = data.draw(maybe(spec_for(mesh, 2), 0.5))
    check(jnp.matmul, mesh, (rand((m, k), seed=1), rand((k, n), seed=2)), (sa, sb), out, **DOT_TOL)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_batch_matmul(data):
    mesh = data.draw(meshes())
    b, m, k, n = (data.draw(st.sampled_from(SMALL_DIMS)) for _ in range(4))
    sa = data.draw(maybe(spec_for(mesh, 3)))
    sb = data.draw(maybe(spec_for(mesh, 3)))
    out = data.draw(maybe(spec_for(mesh, 3), 0.5))
    fn = lambda a, c: jnp.einsum("bmk,bkn->bmn", a, c)
    check(fn, mesh, (rand((b, m, k), seed=1), rand((b, k, n), seed=2)), (sa, sb), out, **DOT_TOL)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_dot_contracting_sharded(data):
    """Contracting dims sharded alike on both sides (uneven too): partial sums, reduced later,
    with the result sometimes consumed by more math before it is reduced."""
    mesh = data.draw(meshes())
    m, n = (data.draw(st.sampled_from(SMALL_DIMS)) for _ in range(2))
    k = data.draw(st.sampled_from((5, 7, 8, 13, 16, 30)))
    ks = data.draw(spec_for(mesh, 1, p_none=0.0))
    kax = ks[0]
    lhs = gp.P(None, kax)
    rhs = gp.P(kax, None)
    out = data.draw(maybe(spec_for(mesh, 2), 0.4))
    tail = data.draw(st.sampled_from(["none", "scale", "add", "tanh", "sum"]))

    def fn(a, c):
        y = a @ c
        if tail == "scale":
            return -(y * 3.0) / 2.0
        if tail == "add":
            return y + y + 1.0
        if tail == "tanh":
            return jnp.tanh(y)
        if tail == "sum":
            return jnp.sum(y, axis=0)
        return y

    check(fn, mesh, (rand((m, k), seed=1), rand((k, n), seed=2)), (lhs, rhs),
          out if tail != "sum" else None, **DOT_TOL)


@pytest.mark.slow
@examples(10)
@given(st.data())
def test_dot_general_einsums(data):
    mesh = data.draw(meshes())
    eq, sa, sb = data.draw(st.sampled_from([
        ("bsd,dh->bsh", (3, 4, 5), (5, 6)),
        ("bd,hd->bh", (7, 8), (13, 8)),
        ("k,k->", (30,), (30,)),
        ("mk,k->m", (7, 13), (13,)),
        ("bqd,bkd->bqk", (2, 5, 8), (2, 7, 8)),
        ("abc,cbd->ad", (4, 3, 6), (6, 3, 5)),
    ]))
    s1 = data.draw(maybe(spec_for(mesh, len(sa))))
    s2 = data.draw(maybe(spec_for(mesh, len(sb))))
    fn = lambda a, c: jnp.einsum(eq, a, c)
    check(fn, mesh, (rand(sa, seed=1), rand(sb, seed=2)), (s1, s2), **DOT_TOL)


# -- reductions -----------------------------------------------------------------------------------

REDUCTIONS = {
    "sum": (jnp.sum, np.float32),
    "sum_i32": (jnp.sum, np.int32),
    "max": (jnp.max, np.float32),
    "min": (jnp.min, np.float32),
    "max_i32": (jnp.max, np.int32),
    "min_i32": (jnp.min, np.int32),
    "prod": (jnp.prod, np.float32),
    "prod_i32": (jnp.prod, np.int32),
    "all": (jnp.all, np.bool_),
    "any": (jnp.any, np.bool_),
    "mean": (jnp.mean, np.float32),
}


@pytest.mark.slow
@examples(20)
@given(st.data())
def test_reductions(data):
    mesh = data.draw(meshes())
    name = data.draw(st.sampled_from(sorted(REDUCTIONS)))
    red, dtype = REDUCTIONS[name]
    shape = data.draw(shapes(1, 3))
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    spec = data.draw(spec_for(mesh, len(shape)))
    out_rank = len(shape) - len(axes)
    out = data.draw(maybe(spec_for(mesh, out_rank), 0.5))
    if name.startswith("prod"):
        x = rand(shape, dtype, low=0.7, high=1.3) if dtype == np.float32 else \
            np.where(rand(shape, np.int32, 3) % 5 == 0, -1, 1).astype(np.int32)
    elif dtype == np.bool_:
        x = rand(shape, np.bool_) | (rand(shape, np.bool_, seed=5) & rand(shape, np.bool_, seed=6))
    else:
        x = rand(shape, dtype, low=-20, high=20)
    # a leading elementwise op, so that padding holds non-identity garbage
    pre = (lambda v: v * 1) if dtype != np.bool_ else (lambda v: ~(~v))
    fn = lambda v: red(pre(v), axis=axes)
    check(fn, mesh, (x,), (spec,), out if out_rank else None, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_argmax_argmin(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    axis = data.draw(st.integers(0, len(shape) - 1))
    spec = data.draw(spec_for(mesh, len(shape)))
    which = data.draw(st.sampled_from(["argmax", "argmin"]))
    values = data.draw(st.sampled_from(["ties", "neg_inf", "random", "all_inf"]))
    x = np.round(rand(shape, seed=3)).astype(np.float32)  # many ties
    if values == "random":
        x = rand(shape, seed=4)
    elif values == "neg_inf":
        x = np.where(rand(shape, seed=5) > 0, -np.inf, x).astype(np.float32)
    elif values == "all_inf":
        x = np.full(shape, -np.inf if which == "argmax" else np.inf, np.float32)
    f = jnp.argmax if which == "argmax" else jnp.argmin
    fn = lambda v: f(v + 0.0, axis=axis)
    check(fn, mesh, (x,), (spec,))


@pytest.mark.slow
@examples(16)
@given(st.data())
def test_cumulative(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    axis = data.draw(st.integers(0, len(shape) - 1))
    reverse = data.draw(st.booleans())
    which = data.draw(st.sampled_from(["cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp"]))
    # shard the scanned axis most of the time
    spec = list(data.draw(spec_for(mesh, len(shape))))
    if data.draw(st.integers(0, 3)) > 0:
        free = [a for a in mesh.axis_names if all(a != e and (not isinstance(e, tuple) or a not in e) for e in spec)]
        if free:
            spec[axis] = free[0]
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    fns = {"cumsum": lax.cumsum, "cumprod": lax.cumprod, "cummax": lax.cummax, "cummin": lax.cummin,
           "cumlogsumexp": lax.cumlogsumexp}
    x = rand(shape, low=0.8, high=1.2) if which == "cumprod" else rand(shape)
    fn = lambda v: fns[which](v * 1.0, axis=axis, reverse=reverse)
    check(fn, mesh, (x,), (gp.P(*spec),), out, rtol=1e-5, atol=1e-4)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_sort(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    axis = data.draw(st.integers(0, len(shape) - 1))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    kind = data.draw(st.sampled_from(["sort", "argsort", "two_operands"]))
    x = np.round(rand(shape, seed=3) * 3).astype(np.float32)

    def fn(v):
        if kind == "sort":
            return jnp.sort(v * 1.0, axis=axis)
        if kind == "argsort":
            return jnp.argsort(v, axis=axis, stable=True)
        return lax.sort((v, -v * 2.0), dimension=axis, num_keys=1, is_stable=True)[1]

    check(fn, mesh, (x,), (spec,), out)


@pytest.mark.slow
@examples(10)
@given(st.data())
def test_top_k(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    k = data.draw(st.integers(1, shape[-1]))
    spec = data.draw(spec_for(mesh, len(shape)))
    x = rand(shape, seed=9)  # distinct values: indices are well defined
    fn = lambda v: lax.top_k(v * 1.0, k)
    check(fn, mesh, (x,), (spec,))


@pytest.mark.slow
def test_sort_sharded_dim_moves_by_all_to_all():
    """GSPMD paper section 3.5: sort along a sharded dim: the sharding moves to another dim (all-to-all)."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((8, 16))
    plan = check(lambda v: jnp.sort(v, axis=1), mesh, (x,), (gp.P(None, "y"),), gp.P("y", None))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-to-all", ("y",))]
    plan = check(lambda v: jnp.sort(v, axis=1), mesh, (x,), (gp.P(None, "y"),), gp.P(None, "y"))
    assert [c.kind for c in plan.collectives] == ["all-to-all", "all-to-all"]


def test_cumsum_sharded_axis_moves_only_totals():
    """cumsum along a sharded dim: local scans plus the k shard totals, never the tensor."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((8, 16))
    plan = check(lambda v: jnp.cumsum(v, axis=1), mesh, (x,), (gp.P(None, "y"),), gp.P(None, "y"), atol=1e-5)
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-gather", ("y",))]
    assert plan.collectives[0].bytes_per_device == 8 * 4  # one total per row



def test_generic_reduce_keeps_its_rows_sharded():
    """lax.reduce with a body of its own (no all-reduce combines it): the kept dims stay sharded,
    each device reduces its own rows, as XLA's partitioner does (ops/replicated.py); only a
    sharded reduced dim is gathered. Variadic ((value, index) max) and uneven rows too."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((16, 24))
    f = lambda v: lax.reduce(v, 0.0, lambda a, b: a * 0.5 + b, (1,))  # noqa: E731
    plan = check(f, mesh, (x,), (gp.P(("x", "y"), None),), gp.P(("x", "y")))
    assert plan.collectives == [] and not plan.fallbacks
    plan = check(f, mesh, (x,), (gp.P("x", "y"),), gp.P("x"))
    assert [(c.kind, c.axes) for c in plan.collectives] == [("all-gather", ("y",))] and not plan.fallbacks
    check(f, mesh, (rand((17, 24)),), (gp.P(("x", "y"), None),))

    def argmax(v, i):
        return lax.reduce((v, i), (np.float32(-np.inf), np.int32(0)),
                          lambda a, b: (lax.max(a[0], b[0]), lax.select(a[0] >= b[0], a[1], b[1])), (1,))

    i = np.broadcast_to(np.arange(24, dtype=np.int32), (16, 24)).copy()
    plan = check(argmax, mesh, (x, i), (gp.P("x", None), gp.P("x", None)), (gp.P("x"), gp.P("x")))
    assert plan.collectives == [] and not plan.fallbacks

# -- iota, gather, scatter ---------------------------------------------------------------------------

@pytest.mark.slow
@examples(10)
@given(st.data())
def test_iota(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    d = data.draw(st.integers(0, len(shape) - 1))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.5))

    def fn(x):
        a = lax.broadcasted_iota(jnp.float32, shape, d)
        b = jnp.arange(shape[-1], dtype=jnp.float32)
        return x * a + b

    check(fn, mesh, (rand(shape),), (spec,), out)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_embedding_gather(data):
    mesh = data.draw(meshes())
    vocab = data.draw(st.sampled_from((5, 8, 13, 30)))
    dim = data.draw(st.sampled_from((3, 4, 8)))
    ids_shape = data.draw(shapes(1, 2, dims=SMALL_DIMS))
    s_ids = data.draw(spec_for(mesh, len(ids_shape)))
    s_tab = data.draw(maybe(spec_for(mesh, 2)))
    out = data.draw(maybe(spec_for(mesh, len(ids_shape) + 1), 0.6))
    ids = (rand(ids_shape, np.int32, 4, low=0, high=vocab) % vocab).astype(np.int32)
    fn = lambda table, i: jnp.take(table, i, axis=0) * 2.0
    check(fn, mesh, (rand((vocab, dim), seed=1), ids), (s_tab, s_ids), out)


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_scatter_add(data):
    mesh = data.draw(meshes())
    n = data.draw(st.sampled_from((5, 8, 13)))
    d = data.draw(st.sampled_from((3, 4, 8)))
    b = data.draw(st.sampled_from(SMALL_DIMS))
    s_x = data.draw(maybe(spec_for(mesh, 2)))
    s_i = data.draw(maybe(spec_for(mesh, 1)))
    s_v = data.draw(maybe(spec_for(mesh, 2)))
    idx = (rand((b,), np.int32, 4, low=0, high=n) % n).astype(np.int32)  # with repeats
    fn = lambda x, i, v: jnp.asarray(x).at[i].add(v)
    check(fn, mesh, (rand((n, d), seed=1), idx, rand((b, d), seed=2)), (s_x, s_i, s_v), **F32)


# -- composite ops ---------------------------------------------------------------------------------

@pytest.mark.slow
@examples(12)
@given(st.data())
def test_softmax(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(1, 3))
    axis = data.draw(st.integers(-len(shape), -1))
    spec = data.draw(spec_for(mesh, len(shape)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    fn = lambda v: jax.nn.softmax(v * 3.0, axis=axis)
    check(fn, mesh, (rand(shape),), (spec,), out, **F32)


def _layernorm(x, g, b):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g + b


@pytest.mark.slow
@examples(12)
@given(st.data())
def test_layernorm(data):
    mesh = data.draw(meshes())
    shape = data.draw(shapes(2, 3))
    spec = data.draw(spec_for(mesh, len(shape)))
    sg = data.draw(maybe(spec_for(mesh, 1)))
    out = data.draw(maybe(spec_for(mesh, len(shape)), 0.6))
    d = shape[-1]
    args = (rand(shape), rand((d,), seed=2), rand((d,), seed=3))
    check(_layernorm, mesh, args, (spec, sg, None), out, rtol=1e-4, atol=1e-4)


def test_uneven_elementwise_is_local():
    """XLA spmd_partitioner_test (uneven elementwise): f32[3,3] [2,1] elementwise: local [2,3], no collectives."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    plan = check(lambda v: jnp.exp(v) * 2.0, mesh, (rand((3, 3)),), (gp.P("x", None),), gp.P("x", None))
    assert plan.local_shape((3, 3), plan.fine_dims(plan.graph.outputs[0])) == (2, 3)
    # the only collective is at the boundary: a jax.Array cannot hold the uneven [2,1] layout
    assert [c.op for c in plan.collectives] in ([], ["boundary"])


@pytest.mark.slow
def test_uneven_reduce_all_reduce():
    """XLA spmd_partitioner_test (uneven reduce): reduce of f32[3,3] [2,1] over dim 0 -> replicated: mask, local reduce, one all-reduce."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x = rand((3, 3)) + 5.0
    for red in (jnp.sum, jnp.max, jnp.min):
        plan = check(lambda v: red(v * 1.0, axis=0), mesh, (x,), (gp.P("x", None),), gp.P(None))
        assert [c.kind for c in plan.collectives] == ["all-reduce"]
