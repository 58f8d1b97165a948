"""Every primitive of the installed JAX's public surface is covered: it has a sharding rule
(``gp.ops.registered()``), or the tracer inlines or reads it (frontend/trace.py: calls, regions,
sharding constraints, device_put), or it is refused on purpose with a one-line reason
(``gspmd_py.ops.refused.REFUSED``) that the UnsupportedOpError carries. Runs on whatever JAX is
installed; on the newest it is what catches a primitive a new release adds.

Primitives are listed two ways: every ``*_p`` of ``jax.extend.core.primitives`` and ``jax.lax``,
and the primitives that a broad set of ``jax.lax`` / ``jax.numpy`` / ``jax.nn`` / ``jax.random``
functions (and their gradients) emit when gspmd_py traces them.
"""
from __future__ import annotations

import types

import jax
import jax.ad_checkpoint
import jax.extend.core.primitives as jex_prims
import jax.numpy as jnp
import jax.scipy as jsp
import numpy as np
import pytest
from jax import lax

import gspmd_py as gp
from gspmd_py.frontend import trace as tracer
from gspmd_py.frontend.constraints import CONSTRAINTS
from gspmd_py.ops import has_rule, rule_for
from gspmd_py.ops.refused import REFUSED


def _public_primitives() -> list[str]:
    names = set()
    for module in (jex_prims, lax):
        for attr in dir(module):
            p = getattr(module, attr)
            if attr.endswith("_p") and isinstance(getattr(p, "name", None), str):
                names.add(p.name)
    return sorted(names)


def _traced(name: str) -> bool:
    """Does the tracer consume ``name`` itself (no op of that primitive reaches the rules)?"""
    return (name in tracer.INLINE or name in tracer.REGION or name in CONSTRAINTS or name == tracer.PUT
            or name in tracer.IDENTITY or name == "optimization_barrier")


@pytest.mark.parametrize("name", _public_primitives())
def test_public_primitive_is_covered(name):
    assert has_rule(name) or _traced(name) or name in REFUSED, (
        f"primitive {name!r} of jax {jax.__version__} has no sharding rule, is not read by the tracer and is "
        f"not refused on purpose (gspmd_py/ops/refused.py)")


def test_refusals_are_one_line_reasons_and_no_refused_primitive_has_a_rule():
    for name, why in REFUSED.items():
        assert why and "\n" not in why and len(why) < 240, name
        assert not has_rule(name) and not _traced(name), f"{name} is refused and handled both"


def test_refused_primitive_error_says_why():
    """A refused primitive: an UnsupportedOpError with the refusal's reason (a jax.shard_map
    inside the function is supported: tests/partitioner/test_manual_regions.py)."""
    op = types.SimpleNamespace(prim="xla_pmap", scope="", source="f.py:3", regions=[])
    with pytest.raises(gp.UnsupportedOpError, match="'xla_pmap' .*at f.py:3.*jax.pmap inside the function"):
        rule_for(op)


def test_shard_map_inside_the_function_is_supported():
    mesh = gp.Mesh((8,), ("i",))
    jm = jax.make_mesh((8,), ("i",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:8])
    inner = jax.shard_map(lambda x: lax.psum(x, "i"), mesh=jm, in_specs=jax.sharding.PartitionSpec("i"),
                          out_specs=jax.sharding.PartitionSpec())
    x = jnp.arange(16.0)
    with jax.set_mesh(jm):
        got = gp.spmd(lambda x: inner(x) * 2, mesh)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x).reshape(8, 2).sum(0) * 2)


def test_shard_map_over_its_own_jax_mesh_without_a_mesh_context():
    """MaxText's form: a shard_map over a jax Mesh inside the function, no jax.set_mesh. JAX
    itself refused it while gp.spmd traced (its abstract mesh is not that Mesh's), with a raw
    ValueError. Over gp.spmd's mesh it runs as a manual region; over another mesh it is a
    ShardingError naming the line and the axis, never JAX's raw error."""
    mesh = gp.Mesh((2, 4), ("data", "model"))
    same = jax.sharding.Mesh(mesh.jax_devices(), mesh.axis_names)
    inner = jax.shard_map(lambda x: lax.psum(x, "model"), mesh=same,
                          in_specs=jax.sharding.PartitionSpec("model"), out_specs=jax.sharding.PartitionSpec())
    x = jnp.arange(8.0)
    got = gp.spmd(lambda x: inner(x) * 2, mesh)(x)
    np.testing.assert_allclose(np.asarray(got), np.asarray(x).reshape(4, 2).sum(0) * 2)

    other = jax.sharding.Mesh(mesh.jax_devices().reshape(8), ("other",))
    inner = jax.shard_map(lambda x: lax.psum(x, "other"), mesh=other,
                          in_specs=jax.sharding.PartitionSpec("other"), out_specs=jax.sharding.PartitionSpec())
    with pytest.raises(gp.ShardingError, match=r"test_primitive_coverage\.py:\d+") as e:
        gp.spmd(lambda x: inner(x) * 2, mesh).plan(jax.ShapeDtypeStruct((8,), jnp.float32))
    assert "mesh axis 'other'" in str(e.value)


# -- the primitives a broad public surface emits -----------------------------------------------------------

def A(*shape, dtype=jnp.float32):
    return jax.ShapeDtypeStruct(shape, dtype)


X, I, B, SQ, C = A(4, 6), A(4, 6, dtype=jnp.int32), A(4, 6, dtype=jnp.bool_), A(4, 4), A(4, 6, dtype=jnp.complex64)
KEY = A(2, dtype=jnp.uint32)


def grad(f):
    return lambda x, *rest: jax.grad(lambda v: jnp.sum(f(v, *rest)))(x)


def _lax_cases() -> dict:
    cases = {}
    for n in ("abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e", "cbrt", "ceil",
              "cos", "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2", "expm1", "floor", "is_finite",
              "lgamma", "log", "log1p", "logistic", "neg", "round", "rsqrt", "sign", "sin", "sinh", "sqrt", "square",
              "tan", "tanh"):
        if hasattr(lax, n):
            cases["lax." + n] = (getattr(lax, n), X)
    for n in ("real", "imag", "conj"):
        cases["lax." + n] = (getattr(lax, n), C)
    for n in ("add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2", "nextafter", "eq", "ne", "lt", "le",
              "gt", "ge", "igamma", "igammac", "zeta", "polygamma", "complex"):
        if hasattr(lax, n):
            cases["lax." + n] = (getattr(lax, n), X, X)
    for n in ("bitwise_and", "bitwise_or", "bitwise_xor", "shift_left", "shift_right_logical",
              "shift_right_arithmetic", "mulhi"):
        if hasattr(lax, n):
            cases["lax." + n] = (getattr(lax, n), I, I)
    cases.update({
        "lax.bitwise_not": (lax.bitwise_not, I), "lax.population_count": (lax.population_count, I),
        "lax.clz": (lax.clz, I),
        "lax.integer_pow": (lambda x: lax.integer_pow(x, 3), X),
        "lax.clamp": (lambda x: lax.clamp(-1.0, x, 1.0), X),
        "lax.select": (lambda b, x: lax.select(b, x, -x), B, X),
        "lax.reduce_precision": (lambda x: lax.reduce_precision(x, 5, 10), X),
        "lax.bitcast_convert_type": (lambda x: lax.bitcast_convert_type(x, jnp.int32), X),
        "lax.convert_element_type": (lambda x: lax.convert_element_type(x, jnp.bfloat16), X),
        "lax.betainc": (lambda x: lax.betainc(x, x, x * 0.1), X),
        "lax.random_gamma_grad": (lambda x: lax.random_gamma_grad(x, x), X),
        "lax.igamma.grad": (grad(lambda x: lax.igamma(x, 1.0)), X),
        "lax.reductions": (lambda x, b, i: (lax.reduce_max(x, (0,)), lax.reduce_min(x, (1,)), jnp.prod(x, 0),
                                            jnp.all(b, 0), jnp.any(b, 1), lax.reduce_xor(i, (0,)),
                                            lax.reduce(x, 0.0, lax.add, (0,))), X, B, I),
        "lax.argmax": (lambda x: (lax.argmax(x, 0, jnp.int32), lax.argmin(x, 1, jnp.int32)), X),
        "lax.cumulative": (lambda x: (lax.cumsum(x, 0), lax.cumprod(x, 1), lax.cummax(x, 0), lax.cummin(x, 1),
                                      lax.cumlogsumexp(x, 0)), X),
        "lax.shape": (lambda x: (lax.broadcast_in_dim(x, (2, 4, 6), (1, 2)), lax.reshape(x, (6, 4)),
                                 lax.transpose(x, (1, 0)), lax.rev(x, (0,)), lax.pad(x, 0.0, [(1, 2, 1), (0, 0, 0)]),
                                 lax.slice(x, (0, 1), (3, 5)), lax.concatenate([x, x], 0), lax.squeeze(x[None], (0,)),
                                 lax.expand_dims(x, (0,)), lax.iota(jnp.int32, 5), lax.dynamic_slice(x, (1, 2), (2, 2)),
                                 lax.dynamic_update_slice(x, x[:2, :2], (1, 1))), X),
        "lax.dot_general": (lambda x, y: lax.dot_general(x, y, (((1,), (1,)), ((), ()))), X, X),
        "lax.conv.grad": (lambda x, w: jax.grad(lambda x, w: lax.conv_general_dilated(x, w, (2, 2), "SAME").sum(),
                                                (0, 1))(x, w), A(1, 2, 8, 8), A(3, 2, 3, 3)),
        "lax.reduce_window": (lambda x: (lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "SAME"),
                                         lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), "VALID"),
                                         lax.reduce_window(x, jnp.inf, lax.min, (2, 2), (2, 2), "VALID"),
                                         lax.reduce_window(x, 1.0, lax.mul, (2, 1), (1, 1), "VALID")), X),
        "lax.reduce_window.grad": (grad(lambda x: lax.reduce_window(x, -jnp.inf, lax.max, (2, 2), (1, 1), "SAME")),
                                   X),
        "lax.sort": (lambda x: (lax.sort(x, dimension=1), lax.sort_key_val(x, x, 0), lax.top_k(x, 3),
                                jnp.argsort(x)), X),
        "lax.approx_max_k": (lambda x: lax.approx_max_k(x, 2), X),
        "lax.control": (lambda x: (lax.cond(x.sum() > 0, jnp.sin, jnp.cos, x),
                                   lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] * 2), (0, x)),
                                   lax.scan(lambda c, r: (c + r, c * r), x[0], x), lax.fori_loop(0, 3, lambda i, c: c + i, x),
                                   lax.map(jnp.sin, x), lax.switch(1, [jnp.sin, jnp.cos], x)), X),
        "lax.associative_scan": (lambda x: lax.associative_scan(jnp.add, x), X),
        "lax.optimization_barrier": (lax.optimization_barrier, X),
        "lax.stop_gradient": (lax.stop_gradient, X),
        "lax.split": (lambda x: lax.split(x, (2, 2), 0) if hasattr(lax, "split") else x, X),
        "lax.ragged_dot": (lambda x, w: lax.ragged_dot(x, w, jnp.array([1, 3], jnp.int32)), X, A(2, 6, 3)),
        "lax.ragged_dot.grad": (lambda x, w: jax.grad(lambda x, w: lax.ragged_dot(x, w, jnp.array([1, 3], jnp.int32))
                                                      .sum(), (0, 1))(x, w), X, A(2, 6, 3)),
        "lax.composite": (lax.composite(lambda x: jnp.sin(x) * 2, name="test.sin2"), X),
        "lax.platform_dependent": (lambda x: lax.platform_dependent(x, cpu=jnp.sin, default=jnp.cos), X),
        "lax.dce_sink": (lambda x: (lax.dce_sink(jnp.sin(x)), x * 2)[1] if hasattr(lax, "dce_sink") else x, X),
        "lax.gather_scatter": (lambda x, i: (x[i[0, :3] % 4], x.at[i[0, :2] % 4].set(1.0), x.at[i[0, :2] % 4].add(1.0),
                                             x.at[i[0, :2] % 4].mul(2.0), x.at[i[0, :2] % 4].min(0.0),
                                             x.at[i[0, :2] % 4].max(0.0), jnp.take_along_axis(x, i % 6, 1)), X, I),
        "lax.gather.grad": (grad(lambda x: x[jnp.array([0, 2, 2])]), X),
        "lax.linalg": (lambda s: (jnp.linalg.cholesky(s @ s.T + 4 * jnp.eye(4)), jnp.linalg.eigh(s), jnp.linalg.qr(s),
                                  jnp.linalg.svd(s), jnp.linalg.inv(s), jnp.linalg.det(s), jnp.linalg.solve(s, s),
                                  lax.linalg.triangular_solve(s, s)), SQ),
    })
    if hasattr(lax, "polynomial"):
        cases["lax.polynomial"] = (lambda x: lax.polynomial(x, [1.0, 2.0, 3.0]), X)
    return cases


def _jnp_nn_cases() -> dict:
    cases = {
        "checkpoint_name": (lambda x: jax.ad_checkpoint.checkpoint_name(jnp.sin(x), "h") * 2, X),
        "jnp.fft": (lambda x: (jnp.fft.fft(x), jnp.fft.rfft(x), jnp.fft.irfft(jnp.fft.rfft(x))), X),
        "jnp.reductions": (lambda x: (jnp.sum(x), jnp.mean(x, 0), jnp.var(x), jnp.std(x, 1), jnp.max(x), jnp.argmax(x),
                                      jnp.median(x), jnp.percentile(x, 30.0), jnp.linalg.norm(x), jnp.logaddexp(x, x),
                                      jsp.special.logsumexp(x)), X),
        "jnp.common": (lambda x: (jnp.where(x > 0, x, 0), jnp.clip(x, -1, 1), jnp.einsum("ij,kj->ik", x, x), x @ x.T,
                                  jnp.roll(x, 2, 1), jnp.flip(x), jnp.tril(x), jnp.triu(x), jnp.pad(x, 1),
                                  jnp.stack([x, x]), jnp.split(x, 2), jnp.repeat(x, 2, 0), jnp.tile(x, (2, 1)),
                                  jnp.outer(x[0], x[1]), jnp.kron(x[:2, :2], x[:2, :2]), jnp.convolve(x[0], x[1]),
                                  jnp.isnan(x), jnp.nan_to_num(x), jnp.round(x, 2), jnp.diff(x), jnp.cumsum(x),
                                  jnp.cross(x[:, :3], x[:, :3]), jnp.meshgrid(x[0], x[1]), jnp.sinc(x), jnp.hypot(x, x),
                                  jnp.float_power(x, 2), jnp.mod(x, 2),
                                  jnp.floor_divide(x, 2), jnp.trace(x), jnp.diag(x[0])), X),
        "jnp.int": (lambda i: (i // 3, i % 3, jnp.left_shift(i, 1), jnp.right_shift(i, 1), i ** 2, jnp.abs(i),
                               jnp.gcd(i, 6), jnp.bitwise_count(i) if hasattr(jnp, "bitwise_count") else i), I),
        "nn.gelu": (lambda x: (jax.nn.gelu(x), jax.nn.gelu(x, approximate=False)), X),
        "nn.gelu.grad": (lambda x: (grad(jax.nn.gelu)(x), grad(lambda x: jax.nn.gelu(x, approximate=False))(x)), X),
        "nn.one_hot": (lambda i: jax.nn.one_hot(i, 5), I),
        "nn.dot_product_attention": (lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True), A(2, 4, 2, 8)),
        "nn.dot_product_attention.grad": (grad(lambda q: jax.nn.dot_product_attention(q, q, q, is_causal=True)),
                                          A(2, 4, 2, 8)),
        "random": (lambda k: (jax.random.normal(jax.random.key(0), (4, 6)),
                              jax.random.uniform(jax.random.fold_in(jax.random.key(1), 3), (4,)),
                              jax.random.bernoulli(jax.random.key(2), 0.3, (5,)),
                              jax.random.categorical(jax.random.key(3), jnp.zeros((4, 6))),
                              jax.random.permutation(jax.random.key(4), 6), jax.random.gamma(jax.random.key(5), 2.0, (3,)),
                              jax.random.split(jax.random.key(6), 3), jax.random.normal(k, (3,))), KEY),
        "checkpoint.grad": (grad(jax.checkpoint(lambda x: jnp.sin(jnp.sin(x)))), X),
        "device_put": (lambda x: jax.device_put(x) * 2, X),
        "debug_print": (lambda x: (jax.debug.print("{}", x[0, 0]), x)[1], X),
        "pure_callback": (lambda x: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x), X),
        "vmap": (jax.vmap(jnp.dot), X, X),
        "jvp": (lambda x: jax.jvp(jnp.sin, (x,), (x,)), X),
    }
    for n in ("relu", "relu6", "sigmoid", "softplus", "soft_sign", "silu", "log_sigmoid", "leaky_relu", "hard_tanh",
              "hard_sigmoid", "hard_silu", "elu", "celu", "selu", "glu", "softmax", "log_softmax", "logsumexp",
              "standardize", "sparse_plus", "sparse_sigmoid", "squareplus", "mish"):
        if hasattr(jax.nn, n):
            cases["nn." + n] = (getattr(jax.nn, n), X)
            cases["nn." + n + ".grad"] = (grad(getattr(jax.nn, n)), X)
    return cases


# jnp functions that newer JAX writes with "hijax" primitives (call_hi_primitive: jnp.searchsorted,
# and what builds on it), which the tracer expands into ordinary ones
HIJAX = {
    "jnp.search": (lambda x: (jnp.searchsorted(jnp.sort(x[0]), x[1]), jnp.digitize(x[0], jnp.sort(x[1])),
                              jnp.interp(x[0], jnp.sort(x[1]), x[1]), jnp.histogram(x, 4)), X),
    "jnp.unique_nonzero": (lambda x: (jnp.unique(x, size=3), jnp.nonzero(x > 0, size=4)), X),
    "jsp.linalg.expm": (jsp.linalg.expm, SQ),
    "jnp.ldexp_frexp": (lambda x: (jnp.ldexp(x, 2), jnp.frexp(x)), X),
}


def _uncovered(cases: dict) -> dict:
    out = {}
    for name, (fn, *args) in cases.items():
        graph = tracer.trace(fn, list(args))
        missing = sorted({op.prim for op in graph.walk() if not has_rule(op.prim) and op.prim not in REFUSED})
        if missing:
            out[name] = missing
    return out


def test_lax_surface_has_rules():
    assert _uncovered(_lax_cases()) == {}


def test_numpy_nn_random_surface_has_rules():
    assert _uncovered(_jnp_nn_cases()) == {}


def test_hijax_surface_has_rules():
    assert _uncovered(HIJAX) == {}
