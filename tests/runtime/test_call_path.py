"""The call path (boundary.py): one transfer into the input sharding, per-shard padding of
uneven inputs, placed arrays passed through, and nothing ever re-traced or re-planned."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding

import gspmd_py as gp
from gspmd_py.runtime import boundary

P = gp.P


@pytest.fixture(scope="module")
def mesh():
    return gp.Mesh((2, 4), ("x", "y"))


def _mlp(x, w, b):
    return jnp.tanh(x @ w + b)


def test_even_numpy_inputs_go_straight_to_the_executable(mesh, monkeypatch):
    """No device_put, no jnp.asarray: the compiled program places numpy arrays itself."""
    f = gp.spmd(_mlp, mesh, in_shardings=(P("x", None), P(None, "y"), None))
    x, w, b = np.ones((8, 16), np.float32), np.full((16, 8), 0.1, np.float32), np.float32(0.5)
    ref = np.tanh(x @ w + b)
    np.testing.assert_allclose(np.asarray(f(x, w, b)), ref, rtol=1e-6)
    calls = []
    real_put, real_asarray = jax.device_put, jnp.asarray
    monkeypatch.setattr(jax, "device_put", lambda *a, **k: calls.append("device_put") or real_put(*a, **k))
    monkeypatch.setattr(jnp, "asarray", lambda *a, **k: calls.append("asarray") or real_asarray(*a, **k))
    out = f(x, w, b)
    assert calls == []
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6)


def test_uneven_numpy_input_is_padded_per_shard(mesh, monkeypatch):
    plan = gp.spmd(lambda v: v * 2.0, mesh, in_shardings=(P("x", "y"),)).plan(np.zeros((7, 13), np.float32))
    x = np.arange(7 * 13, dtype=np.float64).reshape(7, 13)  # float64: converted per shard
    padded = []
    real_pad = np.pad
    monkeypatch.setattr(np, "pad", lambda a, *r, **k: padded.append(a.shape) or real_pad(a, *r, **k))
    (a,) = plan.place([x])
    assert a.shape == (8, 16) and a.dtype == np.float32
    assert a.sharding.is_equivalent_to(NamedSharding(plan.jax_mesh, plan.in_specs[0]), 2)
    want = np.zeros((8, 16), np.float32)
    want[:7, :13] = x
    np.testing.assert_array_equal(np.asarray(a), want)
    # only the blocks that hold padding were padded, each at its shard's size (4 x 4)
    assert padded and all(s[0] <= 4 and s[1] <= 4 for s in padded)


def test_inputs_of_every_kind_run_without_retracing(mesh):
    """Numpy, placed, wrongly placed and uneven jax.Arrays: same
    plan, same program (a re-trace would record the collectives again)."""
    f = gp.spmd(_mlp, mesh, in_shardings=(P("x", None), P(None, "y"), None), out_shardings=P("x", "y"))
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 16)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    plan = f.plan(x, w, np.float32(0.0))
    n_coll = len(plan.collectives)
    ref = lambda xx, ww, bb: np.tanh(np.asarray(xx, np.float32) @ np.asarray(ww, np.float32) + np.float32(bb))
    placed = plan.place([x, w, np.float32(0.0)])
    for args in [(x, w, np.float32(0.5)),
                 (placed[0], placed[1], np.float32(0.5)),
                 (jax.device_put(x, jax.devices()[3]), w, np.float32(0.5)),
                 (jax.device_put(x, NamedSharding(plan.jax_mesh, jax.sharding.PartitionSpec(None, "y"))), w,
                  np.float32(0.5))]:
        out = f(*args)
        np.testing.assert_allclose(np.asarray(out), ref(*args), rtol=1e-5, atol=1e-5)
        assert f.plan(*args) is plan
    assert len(plan.collectives) == n_coll
    # a Python float (weakly typed, as under jax.jit) and float64 numpy: plans of their own, same values
    np.testing.assert_allclose(np.asarray(f(x, w, 0.25)), ref(x, w, 0.25), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(f(x.astype(np.float64), w, 0.5)), ref(x, w, 0.5), rtol=1e-5, atol=1e-5)
    # uneven: a numpy input, then the (unpadded, evenly laid out) output fed back in
    u = gp.spmd(lambda v: v * 3.0, mesh, in_shardings=(P("x", "y"),), out_shardings=P("x", "y"))
    a = rng.standard_normal((7, 13)).astype(np.float32)
    pu = u.plan(a)
    n_coll = len(pu.collectives)
    b = u(a)
    assert b.shape == (7, 13)
    c = u(b)  # padded inside the program (one dispatch), not by a separate pad
    np.testing.assert_allclose(np.asarray(c), a * 9.0, rtol=1e-6)
    d = u(jax.device_put(a, jax.devices()[5]))  # on one device: any layout of the logical shape works
    np.testing.assert_allclose(np.asarray(d), a * 3.0, rtol=1e-6)
    assert d.sharding.is_equivalent_to(b.sharding, 2)
    assert u.plan(b) is pu and len(pu.collectives) == n_coll
    # an uneven jax.Array next to a wrongly placed even one
    v = gp.spmd(lambda s, t: s * 2.0 + t.sum(), mesh, in_shardings=(P("x", "y"), P("x", None)))
    t = jax.device_put(np.ones((8, 3), np.float32), NamedSharding(plan.jax_mesh, jax.sharding.PartitionSpec(("x", "y"))))
    np.testing.assert_allclose(np.asarray(v(b, t)), np.asarray(b) * 2.0 + 24.0, rtol=1e-6)


def test_host_pad_matches_numpy_pad():
    jm = jax.sharding.Mesh(np.asarray(jax.devices()).reshape(2, 4), ("a", "b"))
    for shape, padded, spec in [((5, 3), (6, 4), ("a", "b")), ((5, 3), (8, 3), (("a", "b"), None)),
                                ((1, 7), (2, 8), ("a", "b")), ((0, 3), (2, 4), ("a", "b"))]:
        x = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)
        target = NamedSharding(jm, jax.sharding.PartitionSpec(*spec))
        got = boundary.host_pad(x, padded, np.dtype(np.int32), target)
        want = np.pad(x, [(0, p - n) for n, p in zip(shape, padded)])
        np.testing.assert_array_equal(np.asarray(got), want)
        assert got.sharding == target


def test_plan_cache_is_a_bounded_lru(mesh):
    f = gp.spmd(lambda v: v * 2.0, mesh, in_shardings=(P("x", None),))
    f._entries.maxsize = f._fast.maxsize = 2
    plans = {n: f.plan(np.zeros((n, 4), np.float32)) for n in (2, 4, 6)}
    assert len(f._entries) == 2  # the (2, 4) plan was evicted, least recently used
    assert f.plan(np.zeros((6, 4), np.float32)) is plans[6]
    again = f.plan(np.zeros((2, 4), np.float32))
    assert again is not plans[2]  # planned again
    np.testing.assert_allclose(np.asarray(f(np.ones((2, 4), np.float32))), 2.0)
    assert f.plan(np.zeros((6, 4), np.float32)) is plans[6] and len(f._entries) == 2 and len(f._fast) == 1


def test_fast_path_keeps_statics_weak_types_and_tracers_apart(mesh):
    """The per-call key (boundary.call_key) never mixes up calls jax.jit would tell apart."""
    g = gp.spmd(lambda v, s: v * s, mesh, in_shardings=(P("x", None), None))
    x = np.ones((8, 4), np.float32)
    np.testing.assert_allclose(np.asarray(g(x, 2.0)), 2.0)  # Python float: weakly typed
    np.testing.assert_allclose(np.asarray(g(x, np.float32(3.0))), 3.0)
    np.testing.assert_allclose(np.asarray(g(x, jnp.asarray(4.0))), 4.0)
    assert len(g._fast) == 3 and len(g._entries) == 2  # np.float32 and the strong jax scalar: one plan
    h = gp.spmd(lambda v, n: v * n, mesh, in_shardings=(P("x", None),), static_argnums=(1,))
    np.testing.assert_allclose(np.asarray(h(x, 2)), 2.0)
    np.testing.assert_allclose(np.asarray(h(x, 5)), 5.0)  # a static value: never the fast path
    assert len(h._fast) == 0
    np.testing.assert_allclose(np.asarray(jax.jit(lambda v: g(v, 2.0))(x)), 2.0)  # traced: staged
    np.testing.assert_allclose(np.asarray(g(x, 2.0)), 2.0)


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")  # padded in, unpadded out: no alias
def test_donated_uneven_array_runs_through_the_fused_program(mesh):
    f = gp.spmd(lambda v: v + 1.0, mesh, in_shardings=(P("x", "y"),), out_shardings=P("x", "y"),
                donate_argnums=(0,))
    a = np.arange(7 * 13, dtype=np.float32).reshape(7, 13)
    b = f(a)
    c = f(b)  # an uneven jax.Array: padded inside the program, donated
    np.testing.assert_allclose(np.asarray(c), a + 2.0)


class _Compiles:
    """Counts XLA compilations (jax.monitoring's backend-compile event) while active."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.n = 0

    def _on(self, event, duration, **kw):
        if event == self.EVENT:
            self.n += 1

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._on)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._on)


@pytest.mark.parametrize("shape", [(7, 13), (300, 257)])  # padded whole (small), per shard (>= 256 KiB)
def test_uneven_numpy_inputs_are_padded_without_compiling(mesh, shape):
    """The first call compiles the program and nothing else: the boundary pads uneven numpy
    inputs on the host (no jitted pad, no second executable), so padding costs the first
    call what it costs every later call."""
    f = gp.spmd(lambda v, w: v * 2.0 + w, mesh, in_shardings=(P("x", "y"), P(None, "y")))
    rng = np.random.default_rng(1)
    a = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((1, shape[1])).astype(np.float32)
    with _Compiles() as first:
        out = f(a, w)
    np.testing.assert_allclose(np.asarray(out), a * 2.0 + w, rtol=1e-6)
    assert first.n == 1  # the program itself
    b = a[::-1].copy()
    with _Compiles() as later:
        out = f(b, w)
    np.testing.assert_allclose(np.asarray(out), b * 2.0 + w, rtol=1e-6)
    assert later.n == 0
