"""What users bring: every dtype, non-finite values, empty shapes, clear errors (first found in
issue 7). Each case runs three ways on the same shardings and compares bit for bit
(NaN == NaN, signs of zeros and infinities compared):

    ours = gp.spmd(fn, mesh, in_shardings=...)(*args)
    ref  = jax.jit(fn)(*args)                     # unpartitioned (compiled, as ours is)
    xla  = jax.jit(fn with the same shardings)    # XLA's own partitioner

``ours`` must equal ``ref``; it must equal ``xla`` too, except where XLA is known to be wrong
(``xla_ok=False``, said at the case: XLA's CPU all-reduce max/min drops NaN).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import mlir

import gspmd_py as gp
from partition_util import assert_bitwise, jit_sharded, mesh_of

P = gp.P
M8, M24 = mesh_of(0), mesh_of(1)  # (8,) "x";  (2, 4) "x", "y"


def compare(fn, mesh, args, in_specs, out_specs=None, *, xla_ok=True, tol=None):
    """ours == unpartitioned bitwise, and == jax.jit's (unless ``xla_ok`` is False); with
    ``tol`` (where sums are rounded in another order), within ``tol`` epsilons of the dtype."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)  # none of these may fall back replicated
        f = gp.spmd(fn, mesh, in_shardings=in_specs, out_shardings=out_specs)
        ours = f(*args)
    ref = jax.jit(fn)(*args)  # compiled: XLA's fusion (FMA) rounds like the partitioned program
    if tol is None:
        assert_bitwise(ours, ref, "gspmd_py vs unpartitioned")
    else:
        for o, r in zip(jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(ref)):
            o, r = np.asarray(o), np.asarray(r)
            assert o.dtype == r.dtype and o.shape == r.shape
            eps = tol * float(jnp.finfo(r.dtype).eps)
            np.testing.assert_allclose(o.astype(np.float32), r.astype(np.float32), rtol=eps, atol=eps)
    xla = None
    if xla_ok:
        xla = jit_sharded(fn, mesh, args, in_specs, out_specs)
        if tol is None:
            assert_bitwise(ours, xla, "gspmd_py vs jax.jit")
    return f.plan(*args), ours, xla


# -- bf16 / float8: max-type reductions ------------------------------------------------------------

LOW_FLOATS = [jnp.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2]
MAX_LIKE = {
    "max": (lambda a: jnp.max(a, axis=1), None),
    "argmax": (lambda a: jnp.argmax(a, axis=1), None),
    "cummax": (lambda a: lax.cummax(a, axis=1), None),
    "max_pool": (lambda a: lax.reduce_window(a, -jnp.inf, lax.max, (1, 3), (1, 2), "SAME"), None),
    "softmax": (lambda a: jax.nn.softmax(a, axis=1), 2),  # sums: rounded in another order (2 eps)
    "logsumexp": (lambda a: jax.nn.logsumexp(a, axis=1), 2),
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype", LOW_FLOATS, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", sorted(MAX_LIKE))
def test_low_precision_max_reductions(dtype, name):
    """bf16/float8 max/min-type reductions crashed ('Invalid integer data type V') on the
    reduction identity; 13 columns over 8 shards make the identity pad real rows."""
    if dtype == ml_dtypes.float8_e4m3fn and name == "softmax":
        pytest.skip("float8_e4m3fn has no inf: jax.nn.softmax's -inf initial is NaN, so the unpartitioned "
                    "softmax is NaN everywhere, and XLA's CPU programs (jax.jit's too) return garbage for it")
    fn, tol = MAX_LIKE[name]
    x = (np.random.default_rng(0).normal(size=(3, 13)) * 4).astype(dtype)
    x[1, 5] = -x[1, 5]
    compare(fn, M8, (x,), (P(None, "x"),), tol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("mesh,spec", [(M24, P("x", "y")), (M8, P(None, "x"))])
def test_complex_max_min_over_sharded_dims(mesh, spec):
    """lax.max orders complex numbers lexicographically; no all-reduce does, so the reduced
    dim is gathered (uneven shards padded with the lexicographic extreme)."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((7, 13)) + 1j * rng.standard_normal((7, 13))).astype(np.complex64)
    x[2, 3] = x[2, 5].real + 9j  # a tie on the real part, broken by the imaginary part
    compare(lambda a: (a.max(1), a.min(0), a.max()), mesh, (x,), (spec,), xla_ok=False)


# -- partial values -----------------------------------------------------------------------------------

@pytest.mark.slow
def test_partial_times_inf():
    """A partial sum multiplied by inf before its all-reduce gave NaN (0 * inf on the shards
    holding zeros) where the function gives inf; by a constant and by a run-time value."""
    a = np.ones((4, 8), np.float32)
    a[:, :4] = 0  # the shards of columns 0..3 hold partial sums of 0
    b = np.ones((8, 3), np.float32)
    compare(lambda a, b: (a @ b) * jnp.inf, M8, (a, b), (P(None, "x"), P("x", None)))
    c = np.full((4, 3), np.inf, np.float32)
    c[0, 0] = -np.inf
    compare(lambda a, b, c: (a @ b) * c, M8, (a, b, c), (P(None, "x"), P("x", None), None))
    compare(lambda a, b: (a @ b) / 0.0, M8, (a, b), (P(None, "x"), P("x", None)))


@pytest.mark.slow
def test_float16_partial_sums_accumulate_in_float32():
    """[35000, 35000, -35000, -35000, 1, 2, 3, 4] summed over 8 shards gave NaN (partials
    cast to float16 before the all-reduce overflow); it is 10, as XLA's own unpartitioned
    f16 sum (which accumulates in float32). jax.jit's partitioned sum all-reduces in
    float16 and gives inf: not the reference (xla_ok=False)."""
    v = np.array([35000, 35000, -35000, -35000, 1, 2, 3, 4], np.float16)
    compare(jnp.sum, M8, (v,), (P("x"),), xla_ok=False)
    compare(jnp.sum, M24, (v,), (P(("y", "x")),), xla_ok=False)
    compare(lambda a, b: a @ b, M8, (v[None], np.ones((8, 2), np.float16)), (P(None, "x"), P("x", None)), xla_ok=False)
    _, ours, _ = compare(jnp.sum, M8, (v,), (P("x"),), xla_ok=False)
    assert float(ours) == 10.0
    # a float16 partial kept (in float32) through ops before its all-reduce: a division by a
    # constant runs in float32, a convert keeps the wide form (it crashed on float32 / float16)
    for fn in (lambda a: jnp.sum(a) / 2.0 * 3.0, lambda a: (jnp.sum(a) / 2.0).astype(jnp.float32),
               lambda a: jnp.sum(a).astype(jnp.float16) - 1):
        _, ours, _ = compare(fn, M8, (v,), (P("x"),), xla_ok=False)


def test_reduce_precision_is_not_linear():
    """reduce_precision of a partial sum was applied to the partials: 4 partials of 1 + 2^-10
    and 4 of 1 sum to 8 + 2^-8, which rounds (10 mantissa bits, ties to even) to 8."""
    a = np.ones((1, 8), np.float32)
    b = np.where(np.arange(8) % 2 == 0, 1 + 2.0 ** -10, 1.0).astype(np.float32)[:, None]
    plan, ours, _ = compare(lambda a, b: lax.reduce_precision(a @ b, 5, 10), M8, (a, b), (P(None, "x"), P("x", None)))
    assert float(np.asarray(ours)[0, 0]) == 8.0


def test_bool_matmul_contracts_with_or():
    """A bool matmul with a sharded contracting dim returned int32 counts, not bool."""
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2, (5, 13)).astype(bool)
    b = rng.integers(0, 2, (13, 3)).astype(bool)
    b[:, 2] = False
    compare(lambda a, b: a @ b, M24, (a, b), (P("x", "y"), P("y", None)))


# -- other wrong answers ------------------------------------------------------------------------------

def test_weak_typed_python_scalars():
    """int8 * 3 gave int32 300 (the literal lost its weak type); jax.jit gives int8 44."""
    x = np.full((13,), 100, np.int8)
    _, ours, _ = compare(lambda a: a * 3 + 1, M8, (x,), (P("x"),))
    assert ours.dtype == np.int8 and int(ours[0]) == 45


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
def test_bitwise_and_over_an_uneven_dim(dtype):
    """reduce_and over 13 elements on 8 shards padded with 1, not all ones."""
    """(XLA's CPU all-reduce cannot 'and' integers: jax.jit raises UNIMPLEMENTED, no reference.)"""
    x = np.array([-1, -3, -5, -9, -1, -1, -17, -1, -1, -1, -1, -33, -1]).astype(dtype)
    if dtype == np.bool_:
        x = np.ones(13, bool)
    xla_ok = dtype == np.bool_
    compare(lambda a: lax.reduce_and(a, (0,)), M8, (x,), (P("x"),), xla_ok=xla_ok)
    compare(lambda a: lax.reduce_and(a.reshape(1, 13), (1,)), M24, (x,), (P(("x", "y")),), xla_ok=xla_ok)


def test_dynamic_slice_keeps_negative_zero():
    """A dynamic slice of a sharded dim (each device contributes the rows it holds, summed)
    turned -0.0 into +0.0."""
    z = np.full((16, 3), -0.0, np.float32)
    z[3, 1] = np.inf
    z[9, 0] = -np.inf
    for start in (np.int32(2), np.int32(7), np.int32(15)):
        compare(lambda a, i: lax.dynamic_slice_in_dim(a, i, 3, axis=0), M8, (z, start), (P("x", None), None))


@pytest.mark.slow
@pytest.mark.parametrize("op", ["max", "min", "argmax", "cummax"])
def test_nan_over_a_sharded_dim(op):
    """max/min over a sharded dim dropped NaN. XLA's CPU all-reduce max/min drops it too,
    so jax.jit is not the reference here (xla_ok=False): the unpartitioned function is."""
    x = np.arange(26, dtype=np.float32).reshape(2, 13) - 6
    x[0, 3] = np.nan
    x[1, 12] = np.nan
    fn = {"max": lambda a: jnp.max(a, axis=1), "min": lambda a: jnp.min(a, axis=1),
          "argmax": lambda a: jnp.argmax(a, axis=1), "cummax": lambda a: lax.cummax(a, axis=1)}[op]
    compare(fn, M8, (x,), (P(None, "x"),), xla_ok=False)


# -- crashes ------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_axis_names_like_internal_sub_axes():
    """("y", "y_1"): the execution mesh splits y into sub-axes; their names (with ':', which a
    user's name cannot contain) no longer collide with the user's (a segfault in XLA)."""
    for names in [("y", "y_1"), ("y_0", "y"), ("y_1", "y_0")]:
        mesh = gp.Mesh((2, 4), names)
        a, b = names
        x = np.arange(2 * 8 * 3, dtype=np.float32).reshape(2, 8, 3)
        fn = lambda v: jnp.sum(v.reshape(2, 2, 4, 3) * 2, axis=2)  # splits the dim sharded on the size-4 axis
        plan, _, _ = compare(fn, mesh, (x,), (P(a, b, None),))
        assert len(plan.fine.names) == 3, plan.fine.names  # b was split into sub-axes
    with pytest.raises(gp.MeshError, match="':'"):
        gp.Mesh((2, 4), ("y", "y:0"))


@pytest.mark.slow
def test_colliding_axis_names_cannot_crash_the_interpreter():
    """In a fresh interpreter (a crash would kill this one): meshes whose names look like the
    fine mesh's sub-axes plan and run a program that splits an axis, or are refused clearly."""
    code = textwrap.dedent("""
        import os
        os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
        os.environ["JAX_PLATFORMS"] = "cpu"
        import jax.numpy as jnp, numpy as np
        import gspmd_py as gp
        x = np.arange(64, dtype=np.float32).reshape(8, 8)
        fn = lambda v: (v.reshape(2, 4, 8) * 2).sum(axis=1)
        for names in [("y", "y_1"), ("y_1", "y"), ("y", "y_0"), ("y_0", "y_1")]:
            mesh = gp.Mesh((4, 2), names)
            got = gp.spmd(fn, mesh, in_shardings=gp.P(names[0], names[1]),
                          out_shardings=gp.P(names[1], names[0]))(x)
            assert np.array_equal(np.asarray(got), np.asarray(fn(x))), names
        for names in [("y", "y:0"), ("y", "y:(1)2")]:
            try:
                gp.Mesh((2, 4), names)
                raise SystemExit("accepted " + repr(names))
            except gp.MeshError:
                pass
        print("survived")
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [_repo_root(), os.environ.get("PYTHONPATH")] if p))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "survived" in r.stdout, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(gp.__file__)))


ZERO = {
    "elementwise": (lambda a: a * 2 + 1, [(0, 4)], [P("x", None)], None),
    "sum_over_empty": (lambda a: jnp.sum(a, axis=0), [(0, 4)], [P("x", None)], None),
    "max_over_empty": (lambda a: lax.reduce_max(a, (0,)), [(0, 4)], [P("x", None)], None),
    "sum_of_empty": (lambda a: jnp.sum(a, axis=1), [(0, 4)], [P("x", None)], None),
    "dot_k0": (lambda a, b: a @ b, [(3, 0), (0, 5)], [P(None, "x"), P("x", None)], P("x", None)),
    "dot_m0": (lambda a, b: a @ b, [(0, 3), (3, 5)], [P("x", None), P(None, "x")], None),
    "concat": (lambda a, b: jnp.concatenate([b, a, b]), [(0,), (13,)], [P("x"), P("x")], P("x")),
    "pad": (lambda a: lax.pad(a, 1.5, [(3, 2, 1)]), [(0,)], [P("x")], P("x")),
    "reshape": (lambda a: a.reshape(0, 2, 2), [(0, 4)], [P("x", None)], None),
    "cumsum_sort": (lambda a: jnp.sort(jnp.cumsum(a, axis=0), axis=0), [(0, 4)], [P("x", None)], None),
    "mixed": (lambda a, b: (a.sum() + b, a * 2, b[:, :0]), [(0, 4), (5, 3)], [P("x", "y"), P("y", "x")], None),
    "scan_length_0": (lambda c, xs: lax.scan(lambda c, x: (c + x.sum(), x * 2), c, xs), [(8,), (0, 8, 3)],
                      [P("x"), P(None, "x")], None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ZERO))
def test_zero_size_dims(name):
    """Sharded zero-size dims failed at run time with raw JAX/XLA errors; jax.jit runs them."""
    fn, shapes, specs, out = ZERO[name]
    args = [np.full(s, 1.25, np.float32) for s in shapes]
    compare(fn, M24 if name == "mixed" else M8, args, specs, out)


@pytest.mark.slow
def test_empty_result_of_a_strided_slice_and_associative_scan():
    """A strided slice yielding an empty dim from a sharded dim raised a negative-shape
    TypeError in the halo code; lax.associative_scan on a sharded axis makes such slices."""
    x = np.arange(16, dtype=np.float32) - 3.5
    compare(lambda a: (a[9:9:2], a[15:15], a[::3][6:]), M8, (x,), (P("x"),))
    compare(lambda a: lax.associative_scan(jnp.add, a), M8, (x,), (P("x"),), tol=4)
    y = np.random.default_rng(2).normal(size=(6, 32)).astype(np.float32)
    compare(lambda a: lax.associative_scan(jnp.maximum, a, axis=1), M24, (y,), (P("x", "y"),))


# -- clear errors ---------------------------------------------------------------------------------------

def test_one_tag_name_per_value():
    """Two values tagged with one name: the second was silently ignored. Two gp.tag calls
    -> AnnotationError naming both lines; one call site tagging several values (a layer in a
    loop) -> sharding_of refuses if they are sharded differently; jax.checkpoint's
    recomputation and jvp's tangent (the same value, the same line) are fine."""
    x = np.ones((4, 4), np.float32)

    def two(v):
        a = gp.tag(v * 2, "h")
        return gp.tag(a.T + 1, "h")

    with pytest.raises(gp.AnnotationError, match=r"'h' is used twice .*test_user_values.py:\d+.* and at "):
        gp.spmd(two, M24, in_shardings=P("x", "y")).plan(x)

    layer = lambda v: gp.tag(v * 2, "h")
    plan = gp.spmd(lambda v: layer(gp.annotate(layer(v).T, P("x", None))), M24, in_shardings=P("y", "x")).plan(x)
    with pytest.raises(gp.AnnotationError, match="2 values .* tagged 'h' .* sharded differently"):
        plan.sharding_of("h")

    def loss(v):
        h = gp.tag(jnp.tanh(v), "h")
        return jnp.sum(h * h)

    for g in (jax.grad(jax.checkpoint(loss)), lambda v: jax.jvp(loss, (v,), (v,))):
        assert gp.spmd(g, M8, in_shardings=P("x")).plan(x[0]).sharding_of("h") == gp.Sharding(M8, P("x"))


_opaque_p = Primitive("opaque_test_op")
_opaque_p.def_impl(lambda x: x)
_opaque_p.def_abstract_eval(lambda x: x)
mlir.register_lowering(_opaque_p, mlir.lower_fun(lambda x: x, multiple_results=False))


@jax.jit
def library_helper(x):
    return _opaque_p.bind(jnp.sin(x)) * 2


def test_unruled_op_warning_names_the_library_call_and_the_users_line():
    """A pure primitive gspmd_py has no rule for (a library's own) is computed whole on every
    device: the fallback's warning names the user-level function that emitted it and the
    user's line (it named internal primitives the user never wrote, without the line), inside
    loop bodies too; the values are the unpartitioned function's."""
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    scanned = lambda v: lax.scan(lambda c, r: (c + library_helper(r), None), v[0], v)[0]
    for fn in (lambda v: library_helper(v) + 1, scanned):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = gp.spmd(fn, M8, in_shardings=P(None, "x"))(x)
        np.testing.assert_allclose(np.asarray(got), np.asarray(fn(x)), rtol=1e-6)
        text = " ".join(str(w.message) for w in seen)
        assert "opaque_test_op" in text and "emitted by 'library_helper'" in text, text
        assert re.search(r"test_user_values.py:\d+", text), text


# -- coverage: jnp functions that lower to primitives that were missing -----------------------------------

R = np.random.default_rng(3)
F = lambda *s: R.normal(size=s).astype(np.float32)
COVERAGE = {
    # name: (fn, args, in_specs, out_specs, tol)
    "stack": (lambda a, b: jnp.stack([a, b * 2, a], axis=1), (F(5, 7), F(5, 7)), (P("x", "y"), None), P(None, "y", "x")),
    "stack_grad": (jax.grad(lambda a, b: jnp.sum(jnp.stack([a, b]) ** 2)), (F(5, 8), F(5, 8)), (P(None, "y"), P("x")), None),
    "tile": (lambda a: jnp.tile(a, (2, 3)), (F(5, 8),), (P("x", "y"),), P("x", "y")),
    "tile_sharded_repeats": (lambda a: jnp.tile(a, (4, 1)), (F(2, 7),), (P(None, "x"),), P(("x", "y"), None)),
    "searchsorted": (lambda a, v: (jnp.searchsorted(a, v), jnp.searchsorted(a, v, side="right")),
                     (np.sort(F(16)), np.array([-0.0, 0.0, np.inf, -np.inf, 0.3, 5.0] * 2, np.float32)), (P("x"), P("x")), None),
    "histogram": (lambda a: jnp.histogram(a, bins=5, range=(-2, 2)), (F(37),), (P("x"),), None),
    "interp": (lambda q, xp, fp: jnp.interp(q, xp, fp), (F(5, 7) * 3, np.arange(16, dtype=np.float32) - 8, F(16)),
               (P("x", "y"), P("x"), P("y")), None),
    "diag": (lambda a: (jnp.diag(a), jnp.diag(a, 2), jnp.diag(a[0])), (F(7, 9),), (P("x", "y"),), None),
    "trace": (lambda a: (jnp.trace(a), jnp.trace(a, -1)), (F(8, 8),), (P("x", None),), None),
    # (jax.jit's partitioned bincount of 13 indices over 2 shards counts a padding row: not compared)
    "digitize_bincount": (lambda a: jnp.bincount(jnp.digitize(a, jnp.array([-1.0, 0.0, 1.0])), length=4), (F(13),), (P("x"),), None),
    "approx_max_k": (lambda a: lax.approx_max_k(a, 3), (F(8, 16),), (P("x", "y"),), None),
    "unstack": (lambda a: lax.unstack(a, axis=1), (F(4, 8),), (P(None, ("x", "y")),), None),
    "scatter_sub": (lambda a, i: jnp.asarray(a).at[i].subtract(1.5), (F(13, 3), np.array([1, 3, 1], np.int32)), (P("x", "y"), None), None),
    "empty": (lambda a: lax.empty((5, 3), jnp.float32) * 0 + a, (F(5, 3),), (P("x", "y"),), None),
    # select_and_gather_add: the max pool's jvp (forward-mode AD, Hessian-vector products)
    "jvp_max_pool": (lambda a, t: jax.jvp(lambda v: lax.reduce_window(v, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1),
                                                                          "SAME"), (a,), (t,)),
                     (F(2, 13, 8, 3), F(2, 13, 8, 3)), (P("x", "y"), P("x", "y")), None),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(COVERAGE))
def test_coverage(name):
    fn, args, ins, outs = COVERAGE[name]
    plan, _, _ = compare(fn, M24, args, ins, outs, xla_ok=name != "digitize_bincount")
    assert not plan.fallbacks


def test_debug_print_once_with_the_whole_value(capfd):
    """jax.debug.print / jax.debug.callback in a partitioned function: called once, by one
    device, with the whole value (as jax.jit does), not once per device with its shard."""
    x = np.arange(96, dtype=np.float32).reshape(8, 12)

    def f(a):
        jax.debug.print("total {t} row0 {r}", t=a.sum(), r=a[0, :3])
        jax.debug.callback(lambda v: print("callback shape", v.shape), a)
        return a * 2

    jax.block_until_ready(gp.spmd(f, M24, in_shardings=P("x", "y"))(x))
    out = capfd.readouterr().out
    assert out.count("total 4560.0 row0 [0. 1. 2.]") == 1, out
    assert out.count("callback shape (8, 12)") == 1, out


@pytest.mark.slow
def test_no_partitioned_form_falls_back_loudly():
    """Ops with no partitioned form (linear algebra, host callbacks with results, random bits)
    are computed whole on every device: correct, with a PartitionWarning and a report line."""
    a = F(8, 8)
    spd = (a @ a.T + 8 * np.eye(8)).astype(np.float32)
    cases = [(lambda m: jnp.linalg.cholesky(m) * 2, "cholesky"),
             (lambda m: jax.pure_callback(lambda v: np.asarray(v) * 2, jax.ShapeDtypeStruct(m.shape, m.dtype), m) + 1,
              "pure_callback"),
             (lambda m: m + jax.random.gamma(jax.random.key(0), 2.0, m.shape), "random_gamma")]
    for fn, prim in cases:
        with pytest.warns(gp.PartitionWarning, match=prim):
            f = gp.spmd(fn, M24, in_shardings=P("x", "y"), out_shardings=P("x", "y"))
            got = f(spd)
        np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(fn)(spd)), rtol=1e-5, atol=1e-5)
        assert "REPLICATED FALLBACK" in f.plan(spd).report() and prim in f.plan(spd).report()


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.bfloat16], ids=["bfloat16"])
def test_low_precision_training_step(dtype):
    """The scanned transformer of test_programs.py in bfloat16 (its Adam step; float16 gives
    the same with ``jax.value_and_grad(loss_fn)``, not run in CI: float16 Adam with eps 1e-8
    is NaN unpartitioned too), Megatron over y, data over x, 3 rows over 2 shards: every
    result as the unpartitioned one's, to a few roundings of the dtype."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).parents[1] / "programs" / "test_programs.py"  # found whether or not collected
    spec = importlib.util.spec_from_file_location("_programs_for_user_values", path)
    programs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(programs)
    T, V, adam_step, init, loss_fn = programs.T, programs.V, programs.adam_step, programs.init, programs.loss_fn

    params = jax.tree_util.tree_map(lambda a: a.astype(dtype), init(jax.random.PRNGKey(0)))
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, V, (3, T)).astype(np.int32)
    labels = rng.integers(0, V, (3, T)).astype(np.int32)
    pspec = {"emb": P(None, None), "w1": P(None, None, "y"), "w2": P(None, "y", None), "wqkv": P(None, None, None, "y")}
    if dtype == jnp.bfloat16:
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        fn, args, specs = adam_step, (params, zeros, zeros, tokens, labels), (pspec, pspec, pspec, P("x", None), P("x", None))
    else:
        fn, args, specs = jax.value_and_grad(loss_fn), (params, tokens, labels), (pspec, P("x", None), P("x", None))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gp.PartitionWarning)
        got = gp.spmd(fn, M24, in_shardings=specs)(*args)
    want = jax.jit(fn)(*args)
    eps = float(jnp.finfo(dtype).eps)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert g.dtype == w.dtype and g.shape == w.shape
        g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
        np.testing.assert_allclose(g, w, rtol=4 * eps, atol=4 * eps * max(1.0, float(np.abs(w).max())))
