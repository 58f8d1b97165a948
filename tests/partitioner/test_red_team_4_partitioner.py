"""Red team round 4 (issue 25), partitioner layer: typed PRNG key arrays through collectives,
pads and selects (they cross as their uint32 words), and linear solves (a NamedTuple of
jaxprs in custom_linear_solve's parameters) in a program whose collectives are combined."""
import jax
import jax.numpy as jnp
import warnings

import numpy as np
import pytest
from hypothesis import given, strategies as st

import gspmd_py as gp
from partition_util import assert_same, examples, meshes, rand

P = gp.P

_KEY_FNS = {
    "vmap split": lambda k: jax.vmap(lambda kk: jax.random.split(kk, 3))(k),
    "first key": lambda k: k[0],
    "roll": lambda k: jnp.roll(k, 1),
    "reverse and concat": lambda k: jnp.concatenate([k[::-1], k[:2]]),
    "draws": lambda k: jax.vmap(lambda kk: jax.random.uniform(kk, (3,)))(k),
}


@pytest.mark.filterwarnings("ignore::gspmd_py.PartitionWarning")
@examples(10)
@given(mesh=meshes(), n=st.sampled_from([3, 5, 8, 12]), fn=st.sampled_from(sorted(_KEY_FNS)),
       impl=st.sampled_from(["threefry2x32", "rbg"]), data=st.data())
def test_typed_keys_sharded_cross_collectives(mesh, n, fn, impl, data):
    """Keys sharded over any axes, even or not, through ops that gather, shift or slice them:
    the keys (as their words) and the draws equal the unpartitioned function's."""
    axis = data.draw(st.sampled_from([mesh.axis_names[0], tuple(mesh.axis_names)]))
    keys = jax.random.split(jax.random.key(7, impl=impl), n)
    f = _KEY_FNS[fn]
    want = f(keys)
    got = gp.spmd(f, mesh, in_shardings=(P(axis),))(keys)
    if jax.dtypes.issubdtype(want.dtype, jax.dtypes.extended):
        assert got.dtype == want.dtype
        want, got = jax.random.key_data(want), jax.random.key_data(got)
    assert_same(got, want)


@pytest.mark.filterwarnings("ignore::gspmd_py.PartitionWarning")
def test_auto_shard_of_a_function_taking_keys():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    keys = jax.random.split(jax.random.key(0), 8)
    x = rand((16, 8))

    def fn(k, x):
        return x * jax.random.uniform(k[0], x.shape) + jax.vmap(lambda kk: jax.random.normal(kk, (8,)))(k).sum(0)

    res = gp.auto_shard(fn, mesh, keys, x, time_budget_s=5)
    assert_same(res.spmd(keys, x), fn(keys, x))


_SOLVES = {
    "solve": lambda a, b: jnp.linalg.solve(a, b),
    "inv": lambda a, b: jnp.linalg.inv(a) @ b,
    "expm": lambda a, b: jax.scipy.linalg.expm(a * 0.05) @ b,
    "custom_linear_solve": lambda a, b: jax.lax.custom_linear_solve(
        lambda v: a @ v, b, lambda mv, v: jnp.linalg.solve(a, v)),
}


@pytest.mark.filterwarnings("ignore::gspmd_py.PartitionWarning")
@pytest.mark.parametrize("name", sorted(_SOLVES))
def test_linear_solves_in_a_combined_program(name):
    """Two independent all-reduces around the solve are combined into one: the combiner rebuilds
    custom_linear_solve's jaxprs (a NamedTuple parameter) field by field."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    a = rand((8, 8), seed=1) + 8.0 * np.eye(8, dtype=np.float32)
    b = rand((8, 4), seed=2)

    def fn(a, b):
        return _SOLVES[name](a, b) + a.sum() + b.sum()

    f = gp.spmd(fn, mesh, in_shardings=(P("x", "y"), P("y", "x")))
    assert_same(f(a, b), fn(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.filterwarnings("ignore::gspmd_py.PartitionWarning")
def test_closed_over_key_constants():
    """A typed key closed over (a constant of the program, no NumPy form) is kept as the jax array."""
    mesh = gp.Mesh((2, 4), ("x", "y"))
    k = jax.random.key(3)
    ks = jax.random.split(k, 8)
    x = rand((8, 4))
    for fn in [lambda a: a + jax.random.uniform(k, a.shape),
               lambda a: a + jax.vmap(lambda kk: jax.random.uniform(kk, (4,)))(ks),
               lambda a: jax.random.key_data(jax.random.split(k, 8)) + (a > 0).sum().astype(jnp.uint32)]:
        assert_same(gp.spmd(fn, mesh, in_shardings=(P("x", "y"),))(x), fn(x))


@pytest.mark.parametrize("mesh_i", [0, 1, 3])
def test_key_array_ops_run_on_each_devices_keys(mesh_i):
    """split / fold_in / wrap / unwrap of a sharded key array: each device works on its own keys
    (ops/keys.py), no collective and no replicated fallback; the bits equal the unpartitioned draw."""
    from partition_util import mesh_of

    mesh = mesh_of(mesh_i)
    axis = mesh.axis_names[0]

    def f(keys, x):
        ks = jax.vmap(lambda k: jax.random.split(k, 3))(keys)
        ks = jax.vmap(lambda k: jax.random.fold_in(k, 7))(ks[:, 1])
        data = jax.random.key_data(ks)
        again = jax.random.wrap_key_data(data)
        return x + jax.vmap(lambda k: jax.random.uniform(k, (5,)))(again)

    keys = jax.random.split(jax.random.key(0), 16)
    x = jnp.zeros((16, 5))
    g = gp.spmd(f, mesh, in_shardings=(gp.P(axis), gp.P(axis, None)), out_shardings=gp.P(axis, None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        out = g(keys, x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(f(keys, x)))
    plan = g.plan(keys, x)
    assert [c.kind for c in plan.collectives] == []
