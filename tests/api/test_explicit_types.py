"""A gp.spmd function over a mesh with Explicit axes, staged into an enclosing ``jax.jit`` under
``jax.set_mesh``: its outputs carry their layouts in their types (``jax.typeof(y).sharding``),
as a direct call returns them, so explicit-sharding code after it (``reshard``, typed ops,
``jax.grad`` whose cotangents JAX checks against their primals' types) works
(gspmd_py/api/explicit.py)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as JP

import gspmd_py as gp
from partition_util import MESH_SHAPES, assert_same, rand

TOL = dict(rtol=2e-5, atol=2e-5)


def explicit_mesh(i: int, types=None) -> jax.sharding.Mesh:
    shape, names = MESH_SHAPES[i]
    types = types or (AxisType.Explicit,) * len(names)
    return jax.make_mesh(shape, names, axis_types=types, devices=jax.devices()[:int(np.prod(shape))])


def typed_spec(jm, spec: JP, shape) -> JP:
    """``spec`` as JAX types it: per dim its Explicit axes, when they divide the dim."""
    explicit = {n for n, t in zip(jm.axis_names, jm.axis_types) if t == AxisType.Explicit}
    out = []
    for d, n in enumerate(shape):
        e = spec[d] if d < len(spec) else None
        axes = tuple(a for a in ((e,) if isinstance(e, str) else (e or ())) if a in explicit)
        k = int(np.prod([jm.shape[a] for a in axes], dtype=np.int64))
        out.append(None if not axes or n % k else axes[0] if len(axes) == 1 else axes)
    return JP(*out)


def put(jm, x, spec: JP):
    return jax.device_put(x, NamedSharding(jm, spec))


@st.composite
def specs(draw, jm, rank: int) -> JP:
    names = list(jm.axis_names)
    used: set = set()
    out = []
    for _ in range(rank):
        free = [n for n in names if n not in used]
        pick = draw(st.sampled_from([None] + free))
        if pick is not None:
            used.add(pick)
        out.append(pick)
    return JP(*out)


@given(data=st.data(), mi=st.integers(0, len(MESH_SHAPES) - 1),
       rows=st.sampled_from([8, 16, 6]), cols=st.sampled_from([4, 8, 3]))
def test_jit_around_spmd_types_outputs(data, mi, rows, cols):
    jm = explicit_mesh(mi)
    out_spec = data.draw(specs(jm, 2), "out_spec")
    fn = lambda x: jnp.sin(x) * 3.0 + 1.0
    f = gp.spmd(fn, jm, out_shardings=out_spec)
    x = rand((rows, cols))
    want_spec = typed_spec(jm, out_spec, (rows, cols))
    with jax.set_mesh(jm):
        seen = []

        def g(x):
            y = f(x)
            seen.append(jax.typeof(y).sharding.spec)
            return y * 2

        got = jax.jit(g)(x)
        grad = jax.jit(jax.grad(lambda x: (f(x) ** 2).sum()))(x)
    assert seen == [want_spec]
    assert jax.typeof(got).sharding.spec == want_spec
    assert_same(got, 2 * fn(x), **TOL)
    assert_same(grad, jax.grad(lambda x: (fn(x) ** 2).sum())(x), rtol=1e-4, atol=1e-4)


def test_typed_input_grad_and_reshard():
    """Inputs typed over the mesh: the cotangent takes its primal's type (JAX checks it), and
    ``reshard`` / typed ops after the call see the plan's layout."""
    jm = explicit_mesh(1)
    fn = lambda x: jnp.sin(x) @ jnp.ones((4, 4))
    f = gp.spmd(fn, jm, in_shardings=(JP("x", None),), out_shardings=JP("x", "y"))
    x0 = jnp.arange(32.0).reshape(8, 4)
    with jax.set_mesh(jm):
        x = put(jm, x0, JP("x", None))
        y = jax.jit(lambda x: jax.sharding.reshard(f(x), JP(None, "y")) + 1)(x)
        gx = jax.jit(jax.grad(lambda x: f(x).sum()))(x)
        jv = jax.jit(lambda x, t: jax.jvp(f, (x,), (t,)))(x, x)
    assert jax.typeof(y).sharding.spec == JP(None, "y")
    assert jax.typeof(gx).sharding.spec == JP("x", None)
    assert [jax.typeof(v).sharding.spec for v in jv] == [JP("x", "y")] * 2
    assert_same(y, fn(x0) + 1, **TOL)
    assert_same(gx, jax.grad(lambda x: fn(x).sum())(x0), **TOL)
    assert_same(jv[1], jax.jvp(fn, (x0,), (x0,))[1], **TOL)


def test_mixed_axis_types_type_only_explicit_axes():
    """x Explicit, y Auto: the type carries x only (Auto axes are not part of a type)."""
    jm = explicit_mesh(1, (AxisType.Explicit, AxisType.Auto))
    fn = lambda x: jnp.tanh(x) * 2
    f = gp.spmd(fn, jm, out_shardings=JP("x", "y"))
    x = rand((8, 8))
    with jax.set_mesh(jm):
        got = jax.jit(lambda x: f(x) + 1)(x)
        grad = jax.jit(jax.grad(lambda x: f(x).sum()))(x)
    assert jax.typeof(got).sharding.spec == JP("x", None)
    assert_same(got, fn(x) + 1, **TOL)
    assert_same(grad, jax.grad(lambda x: fn(x).sum())(x), **TOL)


def test_training_step_under_explicit_mesh():
    """A small training step (no Flax): jax.jit around jax.value_and_grad of a gp.spmd loss,
    parameters typed over the explicit mesh, SGD; matches the unpartitioned step and keeps the
    parameters' types. The loss is traced as jax.jit traces it (its inputs typed), so the matmul
    that contracts the y-sharded dim says its out_sharding, as it must under jax.jit."""
    jm = explicit_mesh(1)
    specs_ = {"w1": JP(None, "y"), "b1": JP("y"), "w2": JP("y", None)}

    def loss(params, x, t):
        h = jax.nn.relu(x @ params["w1"] + params["b1"])
        return jnp.mean((jnp.matmul(h, params["w2"], out_sharding=JP("x", None)) - t) ** 2)

    f = gp.spmd(loss, jm, in_shardings=(specs_, JP("x", None), JP("x", None)))

    def step(lossf):
        def run(params, x, t):
            v, g = jax.value_and_grad(lossf)(params, x, t)
            return v, jax.tree_util.tree_map(lambda p, d: p - 0.1 * d, params, g)
        return run

    p0 = {"w1": rand((16, 32), seed=1) * 0.3, "b1": rand((32,), seed=2) * 0.1, "w2": rand((32, 4), seed=3) * 0.3}
    x, t = rand((8, 16), seed=4), rand((8, 4), seed=5)
    with jax.set_mesh(jm):
        params = {k: put(jm, v, specs_[k]) for k, v in p0.items()}
        xs, ts = put(jm, x, JP("x", None)), put(jm, t, JP("x", None))
        jstep = jax.jit(step(f))
        losses = []
        for _ in range(3):
            v, params = jstep(params, xs, ts)
            losses.append(float(v))
    ref, want = p0, []
    with jax.set_mesh(jm):  # (the out_sharding names the mesh's axes)
        for _ in range(3):
            v, ref = step(loss)(ref, x, t)
            want.append(float(v))
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    for k in p0:
        assert jax.typeof(params[k]).sharding.spec == specs_[k], k
        assert_same(params[k], ref[k], rtol=1e-5, atol=1e-5)


def test_transformations_inside_jit_under_explicit_mesh():
    """vmap, scan, checkpoint and jacrev of a gp.spmd function inside jax.jit under
    set_mesh(explicit), its argument a numpy array (untyped): each matches the plain function,
    and a gradient is typed as its primal (replicated here), as JAX types it."""
    jm = explicit_mesh(1)
    fn = lambda x: jnp.sin(x) @ jnp.ones((4, 4))
    f = gp.spmd(fn, jm, out_shardings=JP("x", None))
    x, xb = rand((8, 4)), rand((3, 8, 4), seed=2)
    loop = lambda h: (lambda x: jax.lax.scan(lambda c, _: (h(c) * 0.5 + c, None), x, None, length=2)[0])
    cases = {
        "vmap": (lambda h: jax.vmap(h), xb),
        "vmap grad": (lambda h: jax.grad(lambda x: jax.vmap(h)(x).sum()), xb),
        "scan": (loop, x),
        "checkpoint grad": (lambda h: jax.grad(lambda x: jax.checkpoint(h)(x).sum()), x),
        "jacrev": (lambda h: jax.jacrev(lambda x: h(x).sum(0)), x),
    }
    for name, (t, arg) in cases.items():
        with jax.set_mesh(jm):
            got = jax.jit(t(f))(arg)
        assert_same(got, t(fn)(arg), rtol=1e-4, atol=1e-4, what=name)
        if "grad" in name or name == "jacrev":
            assert jax.typeof(got).sharding.spec == JP(*[None] * got.ndim), (name, jax.typeof(got))


def test_traced_as_jax_jit_traces_it():
    """Red team 5: over an Explicit mesh the function is traced with its inputs typed by their
    layouts (``jax.typeof(a)`` is ``float32[8@x,16]`` inside, as under jax.jit), so code that reads
    its input's sharding computes what it computes under jax.jit, and an op's ``out_sharding=``
    is the result's type, direct and staged, with and without ``jax.set_mesh``."""
    import contextlib

    jm = explicit_mesh(1)
    a = put(jm, jnp.arange(128.0).reshape(8, 16), JP("x", None))
    b = put(jm, jnp.ones((16, 12)) * 0.5, JP(None, "y"))
    seen: list = []

    def reads_type(a, b):
        seen.append(str(jax.typeof(a)))
        scale = 2.0 if jax.typeof(a).sharding.spec[0] == "x" else 1.0
        return (a * scale) @ b

    def typed_op(a, b):
        return jnp.einsum("ij,jk->ik", a, b, out_sharding=JP(None, "y"))

    for fn, ctx in [(reads_type, contextlib.nullcontext), (typed_op, lambda: jax.set_mesh(jm))]:
        with ctx():
            seen.clear()
            want = jax.jit(fn)(a, b)
            jit_seen = list(seen)
            f = gp.spmd(fn, jm)
            for got in (f(a, b), jax.jit(f)(a, b)):
                assert str(jax.typeof(got)) == str(jax.typeof(want))
                assert_same(got, want, **TOL)
            assert set(seen) == set(jit_seen)  # what the function saw of its input's type
        if fn is reads_type:
            assert jit_seen == ["float32[8@x,16]"]
            host = np.asarray(a)  # typed replicated: traced (and cached) apart from the typed call
            assert_same(f(host, b), jax.jit(fn)(host, b), **TOL)
        else:
            assert str(jax.typeof(want)) == "float32[8,12@y]"
