"""Op strategies as XLA has them (issue 27): random bits drawn per shard with scalar keys,
sort / top_k along a sharded dim by moving its axes to another dim (all-to-all), batched
linear algebra partitioned over its batch dims. Each: equal to the unpartitioned function
(bit-identical for bits), over the test meshes, uneven and empty dims, the dtypes users
train in, under grad where the op has one; and its collectives asserted."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax import lax

import gspmd_py as gp
from partition_util import assert_same, examples, kinds, mesh_of, rand

P = gp.P
M24 = mesh_of(1)


def _eqns(jaxpr):
    for e in jaxpr.eqns:
        yield e
        for v in e.params.values():
            for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                inner = getattr(sub, "jaxpr", None)
                if inner is not None:
                    yield from _eqns(getattr(inner, "jaxpr", inner))


def _prims(plan, name):
    return [e for e in _eqns(plan.program.jaxpr) if e.primitive.name == name]


def _no_fallback(f, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        plan = f.plan(*args)
    assert "REPLICATED FALLBACK" not in plan.report()
    return plan


def _spec_on(mesh, rank, dim, minor=False):
    """Every mesh axis on ``dim`` (or the first axis on dim 0 and the rest on ``dim``)."""
    names = mesh.axis_names
    if minor and len(names) > 1 and dim != 0:
        entries = [names[0]] + [None] * (rank - 1)
        entries[dim] = names[1:] if len(names) > 2 else names[1]
        return P(*entries)
    entries = [None] * rank
    entries[dim] = names if len(names) > 1 else names[0]
    return P(*entries)


# -- random bits ------------------------------------------------------------------------------

def test_random_key_words_enter_threefry_as_scalars():
    """Regression: both key words were broadcast to the draw's full local shape before threefry
    (two more full-size tensors through the hash: 2-5x jax.jit per call)."""
    def f(x, key):
        return jnp.where(jax.random.bernoulli(key, 0.9, x.shape), x / 0.9, 0.0)

    sf = gp.spmd(f, M24, in_shardings=(P("x", "y"), None))
    x, key = np.ones((8, 12), np.float32), jax.random.key(1)
    plan = _no_fallback(sf, x, key)
    (eqn,) = _prims(plan, "threefry2x32")
    assert [int(np.prod(v.aval.shape)) for v in eqn.invars[:2]] == [1, 1]
    assert eqn.outvars[0].aval.shape == (4, 3)
    assert plan.collectives == []
    np.testing.assert_array_equal(np.asarray(sf(x, key)), np.asarray(jax.jit(f)(x, key)))


DRAWS = {
    "uniform": lambda k, s, dt: jax.random.uniform(k, s, dt),
    "normal": lambda k, s, dt: jax.random.normal(k, s, dt),
    "bernoulli": lambda k, s, dt: jax.random.bernoulli(k, 0.3, s).astype(dt),
    "bits": lambda k, s, dt: jax.random.bits(k, s, jnp.uint32),
    "bits8": lambda k, s, dt: jax.random.bits(k, s, jnp.uint8),
}


@examples(14)
@given(data=st.data())
def test_random_draws_are_per_shard_and_bit_identical(data):
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    shape = tuple(data.draw(st.lists(st.sampled_from((0, 1, 3, 5, 8, 12)), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from([jnp.float32, jnp.bfloat16, jnp.float16]))
    name = data.draw(st.sampled_from(sorted(DRAWS)))
    dim = data.draw(st.integers(0, len(shape) - 1))
    spec = _spec_on(mesh, len(shape), dim, minor=data.draw(st.booleans()))

    def f(x, key):
        return x.astype(dtype) + DRAWS[name](jax.random.fold_in(key, 7), x.shape, dtype).astype(dtype)

    x, key = np.zeros(shape, np.float32), jax.random.key(3)
    sf = gp.spmd(f, mesh, in_shardings=(spec, None), out_shardings=spec)
    plan = _no_fallback(sf, x, key)
    assert all(c.op == "boundary" for c in plan.collectives), plan.report()  # (uneven outputs leave whole)
    got, want = sf(x, key), jax.jit(f)(x, key)
    if name == "normal":  # erf_inv may fuse differently: the bits are identical, the float within an ulp
        np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=1e-2, atol=1e-6)
    else:
        assert_same(got, want, rtol=0, atol=0)


@pytest.mark.parametrize("mesh_i", range(4))
def test_random_batched_keys_and_one_device(mesh_i):
    """vmap over a sharded batch of keys; a replicated draw; a 1-device mesh."""
    mesh = mesh_of(mesh_i)
    keys = jax.random.split(jax.random.key(5), 8)  # (an uneven key array cannot be padded: a key dtype has no zero)

    def f(ks, x, k):
        return jax.vmap(lambda kk: jax.random.uniform(kk, x.shape[1:]))(ks) + x, jax.random.bits(k, (5, 3))

    x, k = np.zeros((8, 4, 5), np.float32), jax.random.key(1)
    sf = gp.spmd(f, mesh, in_shardings=(P(mesh.axis_names[0]), P(mesh.axis_names[0]), None))
    plan = _no_fallback(sf, keys, x, k)
    assert all(c.op == "boundary" for c in plan.collectives), plan.report()
    assert_same(sf(keys, x, k), jax.jit(f)(keys, x, k), rtol=0, atol=0)
    one = gp.spmd(f, gp.Mesh((1,), ("x",)), in_shardings=(P("x"), P("x"), None))
    assert_same(one(keys, x, k), jax.jit(f)(keys, x, k), rtol=0, atol=0)


def test_random_original_threefry_is_drawn_whole_and_equal():
    """jax_threefry_partitionable=False (the default before jax 0.5): the original scheme's
    counters are not per element; computed whole (reported) with jax.jit's bits."""
    def f(x, key):
        return x + jax.random.uniform(key, x.shape)

    x, key = np.zeros((8, 12), np.float32), jax.random.key(9)
    sf = gp.spmd(f, M24, in_shardings=(P("x", "y"), None))
    default = sf(x, key)  # planned and cached under the default (partitionable) scheme
    with jax.threefry_partitionable(False):
        with pytest.warns(gp.PartitionWarning, match="partitionable"):
            got = sf(x, key)  # regression: the cached plan drew the other scheme's bits
        want = jax.jit(f)(x, key)
    assert_same(got, want, rtol=0, atol=0)
    assert_same(sf(x, key), default, rtol=0, atol=0)
    assert not np.array_equal(np.asarray(want), np.asarray(default))  # (the two schemes differ)


@pytest.mark.slow
@examples(10)
@given(data=st.data())
def test_random_split_draws_its_block_of_new_keys(data):
    """jax.random.split(key, n) with the new keys sharded (per-row sampling keys, as a sampler
    splits one key over a data-sharded batch): each device draws its block of keys with
    threefry over its counters, bit-identical; it was computed whole and reported as a
    replicated fallback (no batch dim carries the sharding). Batches of keys too (vmap)."""
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    shape = tuple(data.draw(st.lists(st.sampled_from((1, 3, 5, 8, 12)), min_size=1, max_size=2)))
    batched = data.draw(st.booleans())
    dim = data.draw(st.integers(0, len(shape) - 1))
    spec = _spec_on(mesh, len(shape) + batched, dim + batched, minor=data.draw(st.booleans()))

    def f(x, key):
        split = jax.vmap(lambda k: jax.random.split(k, shape)) if batched else (lambda k: jax.random.split(k, shape))
        return x + jax.random.key_data(split(key))[..., 0]

    key = jax.random.split(jax.random.key(5), 2) if batched else jax.random.key(5)
    x = np.zeros(((2,) if batched else ()) + shape, np.uint32)
    sf = gp.spmd(f, mesh, in_shardings=(spec, None), out_shardings=spec)
    plan = _no_fallback(sf, x, key)
    assert all(c.op == "boundary" for c in plan.collectives), plan.report()
    assert_same(sf(x, key), jax.jit(f)(x, key), rtol=0, atol=0)


def test_random_split_for_per_row_sampling_keys():
    """A sampler's per-row keys: split over the data-sharded batch, then categorical per row."""
    def sample(logits, key):
        keys = jax.random.split(key, logits.shape[0])
        return jax.vmap(jax.random.categorical)(keys, logits)

    logits, key = rand((8, 16)), jax.random.key(4)
    sf = gp.spmd(sample, M24, in_shardings=(P("x", "y"), None))
    _no_fallback(sf, logits, key)
    assert_same(sf(logits, key), jax.jit(sample)(logits, key), rtol=0, atol=0)
    with jax.threefry_partitionable(False):  # the original scheme: split whole (reported), equal
        with pytest.warns(gp.PartitionWarning, match="partitionable"):
            got = sf(logits, key)
        assert_same(got, jax.jit(sample)(logits, key), rtol=0, atol=0)


# -- sort / top_k along a sharded dim ----------------------------------------------------------

SORTS = {
    "sort": lambda v, d: jnp.sort(v, axis=d),
    "argsort": lambda v, d: jnp.argsort(v, axis=d, stable=True),
    "two_operands": lambda v, d: lax.sort((v, -v), dimension=d, num_keys=1),
    "top_k": lambda v, d: lax.top_k(jnp.moveaxis(v, d, -1), min(3, v.shape[d])),
}


@examples(16)
@given(data=st.data())
def test_sort_along_a_sharded_dim(data):
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    shape = tuple(data.draw(st.lists(st.sampled_from((0, 1, 3, 5, 8, 12, 16)), min_size=2, max_size=3)))
    dim = data.draw(st.integers(0, len(shape) - 1))
    name = data.draw(st.sampled_from(sorted(SORTS)))
    dtype = data.draw(st.sampled_from([np.float32, jnp.bfloat16, np.int32]))
    spec = _spec_on(mesh, len(shape), dim, minor=data.draw(st.booleans()))
    x = rand(shape, np.float32, seed=len(shape), low=-3, high=3).astype(dtype)
    fn = lambda v: SORTS[name](v, dim)  # noqa: E731
    got = gp.spmd(fn, mesh, in_shardings=(spec,))(x)
    assert_same(got, jax.jit(fn)(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["sort", "argsort", "two_operands"])
@pytest.mark.parametrize("spec", [P(None, "y"), P("x", "y"), P(None, ("x", "y"))], ids=str)
def test_sort_along_a_sharded_dim_moves_its_axes_by_all_to_all(name, spec):
    """Regression: the sorted dim was all-gathered and every device sorted the same rows; now
    its axes move to dim 0 (one all-to-all per operand that is not an iota) and back."""
    fn = lambda v: SORTS[name](v, 1)  # noqa: E731
    x = rand((16, 32), np.float32)
    f = gp.spmd(fn, M24, in_shardings=(spec,))
    plan = f.plan(x)
    # argsort: the values in, the indices and the (unused: XLA drops it) sorted keys back; its
    # iota operand is made in the moved layout
    want = {"sort": 2, "argsort": 3, "two_operands": 4}[name]
    assert kinds(plan) == ["all-to-all"] * want, plan.report()
    (eqn,) = _prims(plan, "sort")
    assert eqn.invars[0].aval.shape == (16 // (8 if "x" in str(spec) else 4), 32)  # the local sort: its rows only
    assert_same(f(x), jax.jit(fn)(x), rtol=0, atol=0)
    outs = jax.tree_util.tree_leaves(plan.out_shardings, is_leaf=lambda s: isinstance(s, gp.Sharding))
    assert outs and all(s == gp.Sharding(M24, spec) for s in outs)  # the result keeps the operand's, as XLA's


def test_top_k_along_a_sharded_dim_gathers_only_its_results():
    fn = lambda v: lax.top_k(v, 4)  # noqa: E731
    x = rand((16, 32), np.float32)
    f = gp.spmd(fn, M24, in_shardings=(P(None, "y"),))
    plan = f.plan(x)
    assert kinds(plan)[0] == "all-to-all" and "all-gather" in kinds(plan)
    assert all(c.bytes_per_device <= 16 * 4 * 4 for c in plan.collectives if c.kind == "all-gather")
    assert_same(f(x), jax.jit(fn)(x), rtol=0, atol=0)


@pytest.mark.parametrize("mesh_i", range(4))
def test_sort_and_top_k_gradients(mesh_i):
    mesh = mesh_of(mesh_i)
    x = rand((12, 10), np.float32)

    def loss(v):
        s = jnp.sort(v, axis=1)
        t, _ = lax.top_k(v, 3)
        return (s * jnp.arange(10.0)).sum() + (t ** 2).sum()

    spec = _spec_on(mesh, 2, 1, minor=True)
    g = gp.spmd(jax.grad(loss), mesh, in_shardings=(spec,))
    np.testing.assert_allclose(np.asarray(g(x)), np.asarray(jax.jit(jax.grad(loss))(x)), rtol=1e-5, atol=1e-5)


# -- batched linear algebra ---------------------------------------------------------------------

def _spd(b, n, seed=0):
    a = rand((b, n, n), np.float32, seed=seed)
    return (a @ np.swapaxes(a, -1, -2) + n * np.eye(n, dtype=np.float32)).astype(np.float32)


LINALG = {
    "cholesky": (lambda a, r: jnp.linalg.cholesky(a), "cholesky"),
    "eigh": (lambda a, r: jnp.linalg.eigh(a)[0], "eigh"),
    "svd": (lambda a, r: jnp.linalg.svd(a, compute_uv=False), "svd"),
    "qr": (lambda a, r: jnp.abs(jnp.linalg.qr(a)[1]), None),
    "lu": (lambda a, r: lax.linalg.lu(a)[0], "lu"),
    "det": (lambda a, r: jnp.linalg.det(a), "lu"),
    "slogdet": (lambda a, r: jnp.linalg.slogdet(a)[1], "lu"),
    "solve": (lambda a, r: jnp.linalg.solve(a, r), "lu"),
    "inv": (lambda a, r: jnp.linalg.inv(a), "lu"),
    "triangular_solve": (lambda a, r: jax.scipy.linalg.solve_triangular(jnp.tril(a), r, lower=True),
                         "triangular_solve"),
    "eigvals": (lambda a, r: jnp.sort(jnp.abs(jnp.linalg.eigvals(a)), axis=-1), "eig"),
    "schur": (lambda a, r: jnp.abs(jnp.diagonal(jax.scipy.linalg.schur(a)[0], axis1=-2, axis2=-1)), "schur"),
    "fft2": (lambda a, r: jnp.abs(jnp.fft.fft2(a)), "fft"),
}


@examples(16)
@given(data=st.data())
def test_batched_linalg_over_sharded_batch_dims(data):
    mesh = mesh_of(data.draw(st.integers(0, 3)))
    name = data.draw(st.sampled_from(sorted(LINALG)))
    b = data.draw(st.sampled_from((0, 3, 5, 8, 16)))
    lead = data.draw(st.sampled_from(((), (2,))))
    fn = LINALG[name][0]
    a = _spd(int(np.prod(lead, dtype=int)) * b, 4).reshape(lead + (b, 4, 4))
    r = rand(lead + (b, 4, 2), np.float32)
    names = mesh.axis_names
    spec = P(*([None] * len(lead)), names if data.draw(st.booleans()) else names[0])
    got = gp.spmd(fn, mesh, in_shardings=(spec, spec))(a, r)
    assert_same(got, jax.jit(fn)(a, r), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(LINALG))
def test_batched_linalg_with_the_batch_sharded_moves_nothing(name):
    """Regression: each device factored every matrix (replicated, all-gathered and reported)."""
    fn, prim = LINALG[name]
    a, r = _spd(16, 4), rand((16, 4, 2), np.float32)
    f = gp.spmd(fn, M24, in_shardings=(P(("x", "y")), P(("x", "y"))))
    plan = _no_fallback(f, a, r)
    assert plan.collectives == [], plan.report()
    if prim is not None:
        assert all(e.invars[0].aval.shape[0] == 2 for e in _prims(plan, prim)), plan.spmd_text()
    assert_same(f(a, r), jax.jit(fn)(a, r), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mesh_i", range(4))
def test_batched_linalg_gradients(mesh_i):
    mesh = mesh_of(mesh_i)
    a, r = _spd(6, 4), rand((6, 4, 3), np.float32)

    def loss(m, v):
        c = jnp.linalg.cholesky(m)
        return (c.sum() + jnp.linalg.solve(m, v).sum() + jnp.linalg.slogdet(m)[1].sum()
                + jnp.linalg.eigh(m)[0].sum() + jax.scipy.linalg.solve_triangular(c, v, lower=True).sum())

    spec = P(mesh.axis_names[0])
    g = gp.spmd(jax.grad(loss, argnums=(0, 1)), mesh, in_shardings=(spec, spec))
    assert_same(g(a, r), jax.jit(jax.grad(loss, argnums=(0, 1)))(a, r), rtol=1e-4, atol=1e-4)


def test_linalg_with_only_matrix_dims_sharded_moves_them_to_the_batch():
    """A batch held whole and a matrix dim sharded: the axis moves to the batch (all-to-all),
    where the result is wanted (no all-gather)."""
    a = _spd(8, 4)
    f = gp.spmd(jnp.linalg.cholesky, M24, in_shardings=(P(None, "y"),), out_shardings=P("y"))
    plan = _no_fallback(f, a)
    assert set(kinds(plan)) == {"all-to-all"}, plan.report()
    assert_same(f(a), jax.jit(jnp.linalg.cholesky)(a), rtol=1e-5, atol=1e-5)


def test_the_cost_model_prices_batched_linalg_per_device():
    """A factorization counts m*n*min(m,n) FLOPs per matrix (was 1 per output element), and a
    device holding 1/8 of the batch is priced for 1/8 of them, with no traffic."""
    hw = gp.Hardware.preset("h100-node")
    a = _spd(16, 32)
    split = gp.spmd(jnp.linalg.cholesky, M24, in_shardings=P(("x", "y")), out_shardings=P(("x", "y"))).plan(a)
    whole = gp.spmd(jnp.linalg.cholesky, M24, in_shardings=P(), out_shardings=P()).plan(a)
    cs, cw = split.cost(hw), whole.cost(hw)
    assert cw.flops >= 16 * 32 ** 3
    assert cs.flops * 8 <= cw.flops * 1.05 and cs.comm_bytes == 0  # (masks built per device: a few %)
