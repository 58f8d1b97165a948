"""Primitives that newer JAX and real code emit (issue 24, item 4): ``polynomial`` (jax 0.12: erf's
gradient, so exact GELU's), ``lax.composite`` (its decomposition inlined) and ``jax.device_put``
inside the function (a NamedSharding: a layout annotation; no destination, a device or a memory
space: an identity), each equal to the unpartitioned function over the 8-device meshes."""
from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as PS

import gspmd_py as gp
from gspmd_py.frontend.trace import trace
from partition_util import check, examples, kinds, maybe, mesh_of, meshes, rand, spec_for

S = jax.ShapeDtypeStruct
SHAPES = [(8, 8), (7, 5), (13, 1), (1, 12)]


def _close(fn, mesh, args, specs, bf16: bool, tol=1e-5):
    """gp.spmd(fn) equals fn (bf16 compared in float32, to a bf16 tolerance)."""
    f = gp.spmd(fn, mesh, in_shardings=specs)
    got, want = f(*args), fn(*args)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        t = 2e-2 if bf16 else tol
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=t, atol=t)
    return f.plan(*args)


def prims(fn, *args) -> set[str]:
    return {op.prim for op in trace(fn, [S(a.shape, a.dtype) for a in args]).walk()}


# -- polynomial (newer JAX's erf gradient) -----------------------------------------------------------

def horner(x):
    coeffs = [1.0, -0.5, 0.25, 0.125]
    if hasattr(lax, "polynomial"):
        return lax.polynomial(x, coeffs)
    acc = jnp.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        acc = acc * x + c
    return acc


def exact_gelu_grad(x):
    return jax.grad(lambda v: jnp.sum(jax.nn.gelu(v, approximate=False)))(x)


@examples(10)
@given(mesh=meshes(), shape=st.sampled_from(SHAPES), bf16=st.booleans(), data=st.data())
def test_polynomial_and_exact_gelu_grad(mesh, shape, bf16, data):
    dtype = jnp.bfloat16 if bf16 else np.float32
    x = rand(shape, dtype, low=-1.5, high=1.5)
    spec = data.draw(maybe(spec_for(mesh, 2)))
    plan = _close(horner, mesh, (x,), (spec,), bf16)
    assert set(kinds(plan)) <= {"all-gather"}  # elementwise: only an uneven output's boundary gathers
    _close(exact_gelu_grad, mesh, (x,), (spec,), bf16, tol=1e-5)


def test_polynomial_is_elementwise_where_jax_emits_it():
    x = rand((8, 8))
    if hasattr(lax, "polynomial"):  # jax >= 0.12: the primitive itself, in erf's gradient too
        assert "polynomial" in prims(horner, x) and "polynomial" in prims(exact_gelu_grad, x)
    plan = check(horner, mesh_of(1), (x,), in_specs=(gp.P("x", "y"),))
    assert kinds(plan) == [] and plan.sharding_of("out0").shardy() == "[{x}, {y}]"


def test_polynomial_with_array_coefficients():
    """Coefficients of x's rank with size-1 dims broadcast, as lax's other binary ops do."""
    x, c = rand((7, 8)), rand((1, 8), seed=1)
    f = lambda x, c: lax.polynomial(x, [c, 2.0, c]) if hasattr(lax, "polynomial") else (c * x + 2.0) * x + c
    check(f, mesh_of(1), (x, c), in_specs=(gp.P("x", "y"), None))


# -- composite -----------------------------------------------------------------------------------------

SCALE = jnp.arange(8.0, dtype=jnp.float32)


def _my_gate(x, y, *, alpha=1.0):
    return jnp.tanh(x) * y + alpha * SCALE  # a closed-over constant (an operand of the call on jax 0.12)


gate = lax.composite(_my_gate, name="my.gate")


@examples(8)
@given(mesh=meshes(), bf16=st.booleans(), data=st.data())
def test_composite_is_its_decomposition(mesh, bf16, data):
    dtype = jnp.bfloat16 if bf16 else np.float32
    x, y = rand((13, 8), dtype), rand((13, 8), dtype, seed=1)
    specs = (data.draw(maybe(spec_for(mesh, 2))), data.draw(maybe(spec_for(mesh, 2))))
    fn = lambda x, y: gate(x, y, alpha=0.5) @ jnp.ones((8, 3), x.dtype)
    _close(fn, mesh, (x, y), specs, bf16)


def test_composite_inlined_not_an_op():
    x = rand((8, 8))
    assert "composite" not in prims(lambda x: gate(x, x), x)
    plan = check(lambda x: gate(x, x), mesh_of(0), (x,), in_specs=(gp.P("x", None),))
    assert kinds(plan) == []


# -- device_put inside the function ----------------------------------------------------------------------

def jmesh():
    return jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto,) * 2, devices=jax.devices()[:8])


def test_device_put_named_sharding_is_an_annotation():
    jm, mesh = jmesh(), mesh_of(1)

    def fn(a, w):
        h = jax.device_put(a @ w, NamedSharding(jm, PS(None, "y")))
        return gp.tag(h, "h") * 2

    args = (rand((8, 16)), rand((16, 12), seed=1))
    plan = check(fn, mesh, args, in_specs=(gp.P("x", None), None))
    assert plan.sharding_of("h").shardy() == "[{}, {y}]"
    assert "jax.device_put at" in plan.explain("h")


@examples(8)
@given(mesh=meshes(), shape=st.sampled_from([(8, 8), (16, 4), (8, 2), (7, 8)]), data=st.data())
def test_device_put_layouts_any_mesh(mesh, shape, data):
    """device_put to a NamedSharding over the function's mesh, for any spec JAX accepts (it refuses
    uneven ones while tracing), the operand sharded any way (uneven too)."""
    jax_mesh = jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names)
    spec = data.draw(spec_for(mesh, 2))
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    for n, e in zip(shape, spec):
        assume(n % int(np.prod([sizes[a] for a in ((e,) if isinstance(e, str) else e or ())])) == 0)
    in_spec = data.draw(maybe(spec_for(mesh, 2)))
    fn = lambda a: jnp.sin(jax.device_put(a, NamedSharding(jax_mesh, PS(*spec)))) + 1
    x = rand(shape)
    check(fn, mesh, (x,), in_specs=(in_spec,))
    got = gp.spmd(lambda a: gp.tag(jax.device_put(a, NamedSharding(jax_mesh, PS(*spec))), "put"), mesh).plan(x)
    assert got.sharding_of("put") == gp.spmd(lambda a: gp.tag(gp.annotate(a, spec), "put"), mesh).plan(
        x).sharding_of("put")


def test_device_put_identities():
    """No destination (several operands, as cg emits) and a device are identities; a NamedSharding
    with a memory kind is its layout (the memory kind not honoured): nothing moved."""
    jm = jmesh()
    mesh = mesh_of(1)

    def fn(a, b):
        c, d = jax.device_put((a, b))  # multi-operand, devices=(None, None)
        e = jax.device_put(c, jax.devices()[0])
        host = jax.device_put(e * 2, NamedSharding(jm, PS("x", None), memory_kind="pinned_host"))
        back = jax.device_put(host, NamedSharding(jm, PS("x", None), memory_kind="device"))
        return back + d

    args = (rand((8, 8)), rand((8, 8), seed=1))
    plan = check(fn, mesh, args, in_specs=(gp.P("x", None), gp.P("x", None)))
    assert kinds(plan) == []  # the memory-kind puts' layout P("x", None) is the operands' own
    assert "device_put" not in prims(fn, *args)


def test_host_offload_remat_policy_grad():
    """A remat policy that offloads residuals to host memory: its device_puts are identities
    (memory kinds are not honoured), the gradient exact."""
    policy = jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host")

    def loss(w, a):
        g = jax.checkpoint(lambda w, a: jnp.tanh(jnp.tanh(a @ w) @ w), policy=policy)
        return g(w, a).sum()

    x = rand((8, 8))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        check(jax.grad(loss), mesh_of(1), (x, x), in_specs=(gp.P(None, "y"), gp.P("x", None)), rtol=1e-4,
              atol=1e-4)


def test_device_put_other_mesh_is_refused_clearly():
    """A NamedSharding over a mesh with other axes is refused as with_sharding_constraint's is."""
    import pytest

    other = jax.make_mesh((8,), ("z",), axis_types=(AxisType.Auto,), devices=jax.devices()[:8])
    fn = lambda a: jax.device_put(a, NamedSharding(other, PS("z"))) * 2
    with pytest.raises(gp.ShardingError, match="jax.device_put"):
        gp.spmd(fn, mesh_of(1)).plan(S((8, 8), jnp.float32))


_HIJAX_FNS = {  # jax >= 0.11 emits jnp.searchsorted (under jnp.interp, expm's scaling) as a hijax primitive
    "interp": lambda x: jnp.interp(x, jnp.linspace(-2.0, 2.0, 9), jnp.sin(jnp.linspace(-2.0, 2.0, 9))),
    "expm": lambda x: jax.scipy.linalg.expm(0.1 * x[:4, :4]),
    "searchsorted": lambda x: jnp.searchsorted(jnp.linspace(-2.0, 2.0, 7), x).astype(x.dtype) * x,
}


@examples(6)
@given(mesh=meshes(), fn=st.sampled_from(sorted(_HIJAX_FNS)), data=st.data())
def test_grad_of_a_function_holding_a_hijax_primitive(mesh, fn, data):
    """jax.grad of a gp.spmd function whose jaxpr holds a hijax primitive: jit's linearization
    lowers hijax primitives (jax 0.12) and took spmd_call for one (its jaxpr holds one) with no
    to_lojax rule (NotImplementedError); the call is an ordinary primitive."""
    f = _HIJAX_FNS[fn]
    x = rand((8, 6))
    spec = data.draw(spec_for(mesh, 2))
    g = gp.spmd(f, mesh, in_shardings=(spec,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gp.PartitionWarning)
        got = jax.grad(lambda x: g(x).sum())(x)
    want = jax.grad(lambda x: f(x).sum())(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
