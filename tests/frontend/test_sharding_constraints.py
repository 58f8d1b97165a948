"""jax.lax.with_sharding_constraint (and Flax's logical constraints built on it) inside a gp.spmd
function is an annotation with gp.annotate's priority (issue 10.2)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as PS

import gspmd_py as gp

P = gp.P
S = jax.ShapeDtypeStruct


@pytest.fixture(scope="module")
def jmesh():
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])


def arr(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def mlp(constrain):
    def fn(x, w1, w2):
        h = constrain(jax.nn.relu(x @ w1))
        return gp.tag(h, "hidden") @ w2
    return fn


def test_named_sharding_constraint_is_an_annotation(mesh, jmesh):
    fn = mlp(lambda h: jax.lax.with_sharding_constraint(h, NamedSharding(jmesh, PS("x", "y"))))
    args = (arr(8, 16), arr(16, 32, seed=1), arr(32, 16, seed=2))
    f = gp.spmd(fn, mesh)
    p = f.plan(*args)
    assert p.sharding_of("hidden").shardy() == "[{x}, {y}]"
    assert "jax.lax.with_sharding_constraint at" in p.explain("hidden")
    np.testing.assert_allclose(np.asarray(f(*args)), fn(*args), rtol=1e-5, atol=1e-5)


def test_partition_spec_under_set_mesh(mesh, jmesh):
    fn = mlp(lambda h: jax.lax.with_sharding_constraint(h, PS(None, "y")))
    args = (arr(8, 16), arr(16, 32, seed=1), arr(32, 16, seed=2))
    f = gp.spmd(fn, mesh, in_shardings=(P("x", None), None, None))
    with jax.set_mesh(jmesh):
        p = f.plan(*args)
        got, want = f(*args), fn(*args)
    assert p.sharding_of("hidden").shardy() == "[{}, {y}]"  # None: replicated, as in JAX
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # an unconstrained dim is left open, a None dim is replicated (closed)
    fn2 = mlp(lambda h: jax.lax.with_sharding_constraint(h, PS(PS.UNCONSTRAINED, None)))
    with jax.set_mesh(jmesh):
        p2 = gp.spmd(fn2, mesh, in_shardings=(P("x", None), P(None, "y"), None)).plan(*args)
    assert p2.sharding_of("hidden").shardy() == "[{x}, {}]"


def test_bare_partition_spec_refers_to_the_function_mesh(mesh):
    """gp.spmd traces with its mesh as JAX's abstract mesh when none is set."""
    fn = mlp(lambda h: jax.lax.with_sharding_constraint(h, PS("x", "y")))
    p = gp.spmd(fn, mesh).plan(S((8, 16), jnp.float32), S((16, 32), jnp.float32), S((32, 16), jnp.float32))
    assert p.sharding_of("hidden").shardy() == "[{x}, {y}]"


def test_constraint_priority_equals_annotate(mesh, jmesh):
    """A constraint plans exactly as gp.annotate (priority 0) in its place, against annotations of
    other priorities."""
    def fn(constrain):
        def f(x):
            a = gp.tag(constrain(x * 2), "a")
            b = gp.annotate(a + 1, P(None, "y"), priority=1)
            c = gp.annotate(jnp.tanh(b), P("x", None), priority=0)
            return gp.tag(b, "b") * c
        return f
    wsc = fn(lambda v: jax.lax.with_sharding_constraint(v, NamedSharding(jmesh, PS("y", None))))
    ann = fn(lambda v: gp.annotate(v, P("y", None)))
    p1, p2 = (gp.spmd(g, mesh).plan(S((8, 8), jnp.float32)) for g in (wsc, ann))
    assert [p1.sharding_of(n) for n in ("a", "b", "out0")] == [p2.sharding_of(n) for n in ("a", "b", "out0")]
    assert p1.sharding_of("a").shardy() == "[{y}, {}]"
    assert [(c.kind, c.axes) for c in p1.collectives] == [(c.kind, c.axes) for c in p2.collectives]
    assert any(op.prim == "gspmd_annotate" and op.params.get("origin") == "jax.lax.with_sharding_constraint"
               for op in p1.graph.walk())


def test_mesh_mismatch_names_the_source_line(mesh):
    other = jax.make_mesh((4, 2), ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])
    def fn(x):
        return jax.lax.with_sharding_constraint(x * 2, NamedSharding(other, PS("x", None)))
    with pytest.raises(gp.SpecError, match=r"with_sharding_constraint at .*test_sharding_constraints.py:\d+.*"
                                           r"mesh axes \{'x': 4, 'y': 2\}"):
        gp.spmd(fn, mesh).plan(S((8, 8), jnp.float32))
    named = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])
    with jax.set_mesh(named):
        with pytest.raises(gp.SpecError, match=r"with_sharding_constraint at .*\{'data': 2, 'model': 4\}"):
            gp.spmd(lambda x: jax.lax.with_sharding_constraint(x, PS("data")), mesh).plan(S((8, 8), jnp.float32))


def test_constraint_over_permuted_devices(mesh):
    devs = np.array(jax.devices()[:8])
    jm = jax.sharding.Mesh(devs.reshape(4, 2).T, ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    fn = lambda x: gp.tag(jax.lax.with_sharding_constraint(x * 2, NamedSharding(jm, PS("x", None))), "c")
    p = gp.spmd(fn, mesh).plan(S((8, 8), jnp.float32))
    assert p.sharding_of("c").shardy() == "[{y:(2)2}, {}]"
    # the same through gp.annotate with that NamedSharding, and a PartitionSpec under jax.set_mesh(jm):
    # the order of the concrete mesh set there counts
    fa = lambda x: gp.tag(gp.annotate(x * 2, NamedSharding(jm, PS("x", None))), "c")
    assert gp.spmd(fa, mesh).plan(S((8, 8), jnp.float32)).sharding_of("c").shardy() == "[{y:(2)2}, {}]"
    fp = lambda x: gp.tag(jax.lax.with_sharding_constraint(x * 2, PS("x", None)), "c")
    with jax.set_mesh(jm):
        assert gp.spmd(fp, mesh).plan(S((8, 8), jnp.float32)).sharding_of("c").shardy() == "[{y:(2)2}, {}]"
    bad = jax.sharding.Mesh(devs[[1, 0, 2, 3, 4, 5, 6, 7]].reshape(2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2)
    fn2 = lambda x: jax.lax.with_sharding_constraint(x * 2, NamedSharding(bad, PS(None, "y")))
    with pytest.raises(gp.SpecError, match=r"with_sharding_constraint at .*cannot be expressed"):
        gp.spmd(fn2, mesh).plan(S((8, 8), jnp.float32))


@pytest.mark.slow
def test_constraint_in_grad_and_scan(mesh, jmesh):
    ns = NamedSharding(jmesh, PS("x", "y"))

    def loss(w, x):
        def body(c, _):
            return jax.lax.with_sharding_constraint(jnp.tanh(c @ w), ns), None
        h, _ = jax.lax.scan(body, x, None, length=2)
        return (h ** 2).sum()
    g = jax.grad(loss)
    w, x = arr(16, 16, seed=1) * 0.3, arr(8, 16)
    f = gp.spmd(g, mesh)
    np.testing.assert_allclose(np.asarray(f(w, x)), g(w, x), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_flax_logical_constraints(mesh, jmesh):
    nn = pytest.importorskip("flax.linen")

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.with_logical_constraint(x, ("batch", "embed"))
            h = nn.Dense(32, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                        ("embed", "mlp")))(x)
            h = gp.tag(nn.with_logical_constraint(nn.gelu(h), ("batch", "mlp")), "hidden")
            return nn.Dense(16, kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                                           ("mlp", "embed")))(h)

    model = Block()
    x = arr(8, 16, seed=3)
    params = nn.unbox(model.init(jax.random.PRNGKey(0), x))
    rules = [("batch", "x"), ("embed", None), ("mlp", "y")]
    f = gp.spmd(model.apply, mesh)
    want = model.apply(params, x)
    with nn.logical_axis_rules(rules), jax.set_mesh(jmesh):
        p = f.plan(params, x)
        got = f(params, x)
    assert p.sharding_of("hidden").shardy() == "[{x}, {y}]"
    assert p.sharding_of("arg1").shardy() == "[{x}, {}]"
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    # without jax.set_mesh: the function's mesh is the abstract mesh while tracing
    with nn.logical_axis_rules(rules):
        p2 = gp.spmd(model.apply, mesh).plan(params, x)
    assert p2.sharding_of("hidden").shardy() == "[{x}, {y}]"


def test_explicit_axes_mesh_reshard(mesh):
    """Under a mesh with Explicit axes (jax.make_mesh's default) Flax and JAX emit ``reshard``: an
    annotation too; the program runs and matches."""
    em = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Explicit,) * 2, devices=jax.devices()[:8])

    def fn(x, w):
        r = gp.tag(jax.sharding.reshard(x * 2, PS("x", None)), "r")
        return jnp.tanh(r @ w).sum(0)
    x, w = arr(8, 16), arr(16, 8, seed=1)
    f = gp.spmd(fn, mesh)
    with jax.set_mesh(em):
        p = f.plan(x, w)
        got, want = f(x, w), fn(x, w)
    assert p.sharding_of("r").shardy() == "[{x}, {}]"
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
