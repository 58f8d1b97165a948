"""Red team 5, the boundary with JAX's state: a gp.spmd function re-plans when any option of JAX's
trace context changes (as jax.jit re-traces), returns its outputs with their traced types (weak
types), takes donated arguments under AD as jax.jit does, honours memory kinds, and says clearly
what it cannot take (a deleted buffer, a non-native byte order)."""
from __future__ import annotations

import enum

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gspmd_py as gp
import gspmd_py.testing as gpt
from gspmd_py.core import jax_compat as compat

MESH = gp.Mesh((2, 4), ("x", "y"))
JAX_MESH = jax.sharding.Mesh(MESH.jax_devices().reshape(2, 4), ("x", "y"))

# a second value for the trace-context options that are neither bool, enum nor int
# (jax_error_checking_behavior_*="raise" traces error-check state, which gspmd_py does not take)
_OTHER = {"jax_numpy_rank_promotion": "raise", "jax_default_matmul_precision": "highest"}


def _type(x) -> str:
    """dtype, weak type and shape, as JAX prints a type (``~float32[]``), without its sharding."""
    a = jax.typeof(x)
    return ("~" if a.weak_type else "") + f"{a.dtype.name}{list(a.shape)}"


def _other(value, name):
    """Another legal value of a trace-context option (None: none is known to be safe here)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, enum.Enum):
        return next(m for m in type(value) if m != value)
    if name in _OTHER:
        return _OTHER[name]
    return None


def test_every_trace_context_option_replans():
    """Each boolean / enum option JAX keys its trace cache on (listed by the running JAX), flipped
    between two plans, traces and plans the function again; set back, the first plan is reused."""
    traced = []

    def fn(a):
        traced.append(1)
        return jnp.sin(a) * 2

    f, a = gp.spmd(fn, MESH), np.ones((8, 4), np.float32)
    f.plan(a)
    options = compat.trace_context_options()
    assert {"jax_enable_x64", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion"} <= set(options)
    flipped = []
    for name, value in options.items():
        other = _other(value, name)
        if other is None:
            continue
        n = len(traced)
        with compat.trace_option(name, other):
            f.plan(a)
        assert len(traced) == n + 1, f"{name} = {other!r} did not re-plan"
        f.plan(a)
        assert len(traced) == n + 1, f"{name} back to {value!r} planned again"
        flipped.append(name)
    assert all(n in flipped for n, v in options.items() if isinstance(v, (bool, enum.Enum))), flipped


def test_x64_between_calls_as_jax_jit():
    fn = lambda a: (a * 2, jnp.arange(4), a.astype(float))
    f, a = gp.spmd(fn, MESH), np.ones((8, 4), np.float32)
    f(a)
    with compat.trace_option("jax_enable_x64", True):
        got, want = f(a), jax.jit(fn)(a)
        assert [_type(g) for g in got] == [_type(w) for w in want]
        assert want[1].dtype == jnp.int64
        b = np.ones((8, 4), np.float64)  # a float64 argument: planned as float64, as jax.jit takes it
        assert _type(f(b)[0]) == _type(jax.jit(fn)(b)[0]) == "float64[8, 4]"
    assert [g.dtype for g in f(a)] == [jnp.float32, jnp.int32, jnp.float32]


@pytest.mark.parametrize("name, value", [("jax_numpy_dtype_promotion", "strict"),
                                         ("jax_numpy_rank_promotion", "raise")])
def test_promotion_set_after_a_call_raises_as_jax_jit(name, value):
    fn = lambda a, b: a + b
    f = gp.spmd(fn, MESH)
    a = np.ones((8, 4), np.float32)
    b = np.ones((8, 4), np.int32) if "dtype" in name else np.ones((4,), np.float32)
    f(a, b)
    with compat.trace_option(name, value):
        with pytest.raises(Exception) as want:
            jax.jit(fn)(a, b)
        with pytest.raises(type(want.value)):
            f(a, b)
        with pytest.raises(type(want.value)):
            jax.jit(f)(a, b)


def test_results_keep_weak_types_direct_and_staged():
    """A learning rate from a Python scalar and a step is weakly typed (~float32[]) as under jax.jit,
    so ``p_bf16 - lr * g_bf16`` stays bfloat16 on the direct and the staged path alike."""
    sched = lambda step: 1e-3 * jnp.minimum(step, 100)  # linear warm-up
    f = gp.spmd(sched, MESH)
    step = jnp.int32(2)
    want = jax.jit(sched)(step)
    assert _type(want) == "~float32[]"
    p = jnp.ones((8, 4), jnp.bfloat16)
    for got in (f(step), f(step), jax.jit(f)(step)):  # planned, cached (fast path), staged
        assert _type(got) == "~float32[]"
        assert (p - got * p).dtype == jnp.bfloat16
    fn = lambda x, n: (x.sum() * 0 + 2.0, x * 2, n + 1, jnp.zeros((0, 3)) + x)  # (an empty output too)
    for args in [(3.0, 2), (np.float32(3.0), np.int32(2))]:
        assert [_type(o) for o in gp.spmd(fn, MESH)(*args)] == [_type(o) for o in jax.jit(fn)(*args)]
    assert _type(gp.spmd(lambda x: x * 2, MESH)(np.float32(3.0))) == "float32[]"


def test_non_native_byte_order_refused_clearly():
    a = np.arange(8, dtype=">f4")
    with pytest.raises(TypeError):
        jax.jit(lambda x: x * 2)(a)
    with pytest.raises(gp.ShardingError, match=r"argument arg0 is a numpy array of dtype >f4 \(big-endian.*newbyteorder"):
        gp.spmd(lambda x: x * 2, MESH)(a)
    np.testing.assert_array_equal(gp.spmd(lambda x: x * 2, MESH)(a.astype(a.dtype.newbyteorder("="))), np.arange(8) * 2)


def _donating(spec):
    from jax.sharding import NamedSharding, PartitionSpec

    fn = lambda w, x: jnp.sum(jnp.tanh(x @ w) ** 2)
    f = gp.spmd(fn, MESH, in_shardings=(gp.P(*spec), gp.P("x", None)), donate_argnums=(0,))
    w = jax.device_put(jnp.full((16, 4), 0.1), NamedSharding(JAX_MESH, PartitionSpec(*spec)))
    return fn, f, w, jnp.linspace(-1, 1, 128).reshape(8, 16)


@pytest.mark.parametrize("spec", [(), (None, "y")], ids=["replicated", "split"])
def test_donation_dropped_for_residuals_under_ad(spec):
    """jax.grad / value_and_grad / vjp of a function donating its weights: the weights are a residual
    of the backward program, so (as under jax.jit) the donation is dropped and they stay alive; a
    second call computes the same."""
    fn, f, w, x = _donating(spec)
    want = jax.grad(fn)(w, x)
    for run in (lambda: jax.grad(f)(w, x), lambda: jax.value_and_grad(f)(w, x)[1],
                lambda: jax.vjp(f, w, x)[1](1.0)[0]):
        for _ in range(2):
            np.testing.assert_allclose(run(), want, rtol=1e-5, atol=1e-6)
            assert not w.is_deleted()


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")  # (a scalar loss: nothing to alias)
def test_deleted_buffer_is_a_clear_error_on_every_path():
    fn, f, w, x = _donating(())
    w.delete()
    for run in (lambda: f(w, x), lambda: jax.grad(f)(w, x), lambda: jax.jvp(f, (w, x), (x.T[:, :4], x)),
                lambda: jax.vmap(f, in_axes=(None, 0))(w, x[None])):
        with pytest.raises(gp.ShardingError, match=r"argument arg0 float32\[16, 4\] has been deleted"):
            run()


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_memory_kinds_of_outputs_as_jax_jit(kind):
    """out_shardings with a memory kind, and a jax.device_put to one inside (whose traced type says
    where the value lives: f32<host>), return each output in the memory jax.jit returns it in."""
    from jax.sharding import NamedSharding, PartitionSpec

    s = NamedSharding(JAX_MESH, PartitionSpec("x"), memory_kind=kind)
    a = np.arange(16.0, dtype=np.float32).reshape(8, 2)
    cases = [(lambda x: (x * 2, x + 1), dict(out_shardings=(s, None))),
             (lambda x: (jax.device_put(x * 2, s) * 3, x + 1), {})]
    for fn, kw in cases:
        want, got = jax.jit(fn, **kw)(a), gp.spmd(fn, JAX_MESH, **kw)(a)
        assert [g.sharding.memory_kind for g in got] == [w.sharding.memory_kind for w in want]
        np.testing.assert_array_equal(got[0], want[0])
        nested, staged = jax.jit(jax.jit(fn, **kw))(a), jax.jit(gp.spmd(fn, JAX_MESH, **kw))(a)
        assert [g.sharding.memory_kind for g in staged] == [w.sharding.memory_kind for w in nested]
    assert want[0].sharding.memory_kind == ("pinned_host" if kind == "pinned_host" else "device")  # (device_put)


@pytest.mark.parametrize("kind", ["pinned_host", "unpinned_host"])
def test_memory_kinds_of_inputs_as_jax_jit(kind):
    """in_shardings with a memory kind: the program takes the input in that memory (its compiled
    input sharding says so, as jax.jit's does) and computes what jax.jit computes, direct and staged."""
    from jax.sharding import NamedSharding, PartitionSpec

    s = NamedSharding(JAX_MESH, PartitionSpec("x"), memory_kind=kind)
    fn = lambda x, w: jnp.tanh(x @ w)
    a, w = np.arange(32, dtype=np.float32).reshape(8, 4) / 10, np.ones((4, 3), np.float32)
    f = gp.spmd(fn, JAX_MESH, in_shardings=(s, None))
    want = jax.jit(fn, in_shardings=(s, None))(a, w)
    assert jax.jit(fn, in_shardings=(s, None)).lower(a, w).compile().input_shardings[0][0].memory_kind == kind
    assert f.lower(a, w).compile().compiled.input_shardings[0][0].memory_kind == kind
    for got in (f(a, w), f(jax.device_put(a, s), w), jax.jit(f)(a, w)):
        assert got.sharding.memory_kind == want.sharding.memory_kind
        np.testing.assert_allclose(got, want, rtol=1e-6)


def _typed_put(jm, x, spec):
    """``x`` placed over ``jm`` in ``spec``, each dim keeping only axes that divide it (a jax.Array
    must divide evenly)."""
    from jax.sharding import NamedSharding, PartitionSpec

    sizes = dict(zip(jm.axis_names, jm.axis_sizes))
    entries = []
    for n, e in zip(x.shape, tuple(spec or ()) + (None,) * (x.ndim - len(spec or ()))):
        axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
        k = int(np.prod([sizes[a] for a in axes], dtype=np.int64))
        entries.append(None if not axes or n % k else e)
    return jax.device_put(x, NamedSharding(jm, PartitionSpec(*entries)))


@settings(max_examples=4, deadline=None)
@given(prog=gpt.programs(dtypes=("float32", "bfloat16", "int32")), s=st.sampled_from([0.5, 3]),
       explicit=st.booleans())
def test_avals_as_jax_jit_for_random_programs(prog, s, explicit):
    """gp.spmd returns what jax.jit returns, called directly and inside jax.jit: per output the same
    dtype, weak type, shape and, over a mesh with Explicit axes (inputs typed by their layouts),
    the same sharding in the type."""
    from jax.sharding import AxisType

    shape, names, ids = prog.mesh
    types = (AxisType.Explicit if explicit else AxisType.Auto,) * len(names)
    jm = jax.sharding.Mesh(np.asarray(jax.devices())[list(ids)].reshape(shape), names, axis_types=types)
    args = prog.args()
    if explicit:
        args = tuple(_typed_put(jm, np.asarray(a), spec) for a, (_, spec, *_) in zip(args, prog.inputs))
    fn = lambda scale, *xs: (*prog(*xs), scale * 2, jnp.asarray(xs[0]).sum() * 0 + scale)  # (weak outputs too)
    try:
        want = jax.jit(fn)(s, *args)
    except Exception as e:  # noqa: BLE001 - a type error over explicit axes: gp.spmd raises one too
        with pytest.raises(type(e)):
            gp.spmd(fn, jm)(s, *args)
        return
    f = gp.spmd(fn, jm)
    view = (lambda x: str(jax.typeof(x))) if explicit else _type
    for got in (f(s, *args), jax.jit(f)(s, *args)):  # direct and staged
        assert [view(g) for g in got] == [view(w) for w in want]


def test_grad_with_an_input_over_a_sub_axis():
    """jax.grad of a gp.spmd function whose input is split over a sub-axis ('x:(1)2' of an (8,)
    mesh): the forwarded residual (the input itself, see the donation test) enters the backward
    program in the layout the forward program takes it in over the user's mesh. Its in_sharding
    as a hint made jax.jit's transpose fail with JAX's raw IndivisibleError (found by gp.testing's
    strategies, which draw sub-axes more often now)."""
    mesh = gp.Mesh((8,), ("x",))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 16), dtype=np.float32)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    fn = lambda w, x: jnp.tanh(x @ w)
    f = gp.spmd(fn, mesh, in_shardings=(None, gp.P(None, "x:(1)2")))
    got = jax.grad(lambda w, x: jnp.sum(f(w, x)), argnums=(0, 1))(w, x)
    want = jax.grad(lambda w, x: jnp.sum(fn(w, x)), argnums=(0, 1))(w, x)
    for g, v in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(v), rtol=1e-5, atol=1e-5)
