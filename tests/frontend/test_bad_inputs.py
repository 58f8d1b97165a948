"""Bad inputs, third round: what used to crash the process, hang it,
be accepted silently or fail with JAX's raw error is now a clear error naming the culprit
(a gp.ShardingError subclass), or, for host callbacks, behaves as under jax.jit."""
from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import gspmd_py as gp

P = gp.P


@pytest.fixture(scope="module")
def m24():
    return gp.Mesh((2, 4), ("x", "y"))


def _raises(exc, *needles):
    """pytest.raises(exc) whose message must contain every needle."""
    assert issubclass(exc, gp.ShardingError)
    return pytest.raises(exc, match=".*".join(map(_escape, needles)))


def _escape(s: str) -> str:
    import re

    return re.escape(s)


# -- silently accepted: now errors naming the culprit ---------------------------------------------
def test_devices_array_of_another_shape_is_refused():
    ids = np.arange(8)
    with _raises(gp.MeshError, "devices has shape (4, 2)", "mesh shape is (2, 4)"):
        gp.Mesh((2, 4), ("x", "y"), devices=ids.reshape(4, 2))
    # flat or mesh-shaped ids stay accepted, and mean the same mesh
    assert gp.Mesh((2, 4), ("x", "y"), devices=ids) is gp.Mesh((2, 4), ("x", "y"), devices=ids.reshape(2, 4))


def test_float_device_id_is_refused():
    with _raises(gp.MeshError, "device 1.5", "float"):
        gp.Mesh((2, 4), ("x", "y"), devices=[0, 1.5, 2, 3, 4, 5, 6, 7])
    with _raises(gp.MeshError, "float"):
        gp.Mesh((2, 4), ("x", "y"), devices=np.arange(8.0))


def test_float_device_id_in_tile_assignment_is_refused(m24):
    tiles = np.arange(8).reshape(2, 4)
    assert gp.Sharding.from_tile_assignment(m24, tiles) == gp.Sharding(m24, P("x", "y"))
    with _raises(gp.TileAssignmentError, "device id", "0.5", "index (0, 0)", "ints"):
        gp.Sharding.from_tile_assignment(m24, tiles + 0.5)  # was truncated to the iota
    with _raises(gp.TileAssignmentError, "index (0, 0)", "ints"):
        gp.Sharding.from_tile_assignment(m24, tiles.astype(np.float32))
    with _raises(gp.TileAssignmentError, "1.0", "index (1, 2)"):
        gp.Sharding.from_tile_assignment(m24, np.array([[0, 1, 2, 3], [4, 5, 1.0, 7]], dtype=object))


def test_donate_argnums_out_of_range_is_refused(m24):
    with pytest.raises(ValueError, match="donate_argnums"):  # jax.jit's behaviour, matched
        jax.jit(lambda a: a, donate_argnums=(3,))
    with _raises(gp.ArgumentError, "donate_argnums [3] out of range", "1 positional"):
        gp.spmd(lambda a: a, m24, donate_argnums=(3,))
    with _raises(gp.ArgumentError, "donate_argnums [-3]"):
        gp.spmd(lambda a, b: a, m24, donate_argnums=(-3,))
    gp.spmd(lambda *xs: xs[0], m24, donate_argnums=(3,))  # *args: any position may come (as jax.jit)


def test_negative_donate_argnums_donates(m24):
    """donate_argnums=(-1,) names the last argument, as under jax.jit (it was ignored)."""
    f = gp.spmd(lambda a, b: a + b, m24, in_shardings=(P("x", "y"), P("x", "y")), donate_argnums=(-1,))
    a = np.ones((8, 8), np.float32)
    b = f(a, a)  # laid out as the plan wants: the next call may consume it
    f(a, b)
    assert b.is_deleted()


def test_mesh_split_with_another_mesh_is_refused(m24):
    x = np.ones((8, 8), np.float32)
    other_sizes = gp.Mesh((4, 2), ("x", "y"))
    with _raises(gp.SpecError, "gp.mesh_split at", "test_bad_inputs.py", "{'x': 4, 'y': 2}",
                 "{'x': 2, 'y': 4}"):
        gp.spmd(lambda a: gp.mesh_split(a, other_sizes, [0, -1]) * 2, m24).plan(x)
    reversed_ids = gp.Mesh((2, 4), ("x", "y"), devices=np.arange(8)[::-1])
    with _raises(gp.SpecError, "gp.mesh_split", "orders the devices [7, 6, 5"):
        gp.spmd(lambda a: gp.mesh_split(a, reversed_ids, [0, -1]) * 2, m24).plan(x)
    with _raises(gp.SpecError, "gp.mesh_split", "gp.Mesh"):
        gp.spmd(lambda a: gp.mesh_split(a, ("x", "y"), [0, -1]), m24).plan(x)
    # the function's own mesh, or an abstract mesh of its axes, is what mesh_split means
    plan = gp.spmd(lambda a: gp.tag(gp.mesh_split(a, m24, [1, 0]) * 2, "h"), m24).plan(x)
    assert plan.sharding_of("h") == gp.Sharding(m24, P("y", "x"))
    ab = gp.Mesh.abstract((2, 4), ("x", "y"))
    plan = gp.spmd(lambda a: gp.tag(gp.mesh_split(a, ab, [1, 0]) * 2, "h"), m24).plan(x)
    assert plan.sharding_of("h").spec == P("y", "x")


# -- a donated array passed again: an error, not a SIGSEGV ------------------------------------------
def test_donated_array_passed_again_is_an_error(m24):
    f = gp.spmd(lambda p: p["w"] * 2, m24, in_shardings=({"w": P("x", "y")},), donate_argnums=(0,))
    w = f({"w": np.ones((8, 8), np.float32)})  # laid out as the plan wants: the next call consumes it
    f({"w": w})
    assert w.is_deleted()
    for _ in range(2):  # and again: the error leaves the function as it was
        with pytest.raises(gp.DeletedArrayError, match=r"argument arg0\['w'\] float32\[8, 8\] has been deleted.*"
                                                       r"donate_argnums") as info:
            f({"w": w})
        assert isinstance(info.value, RuntimeError) and isinstance(info.value, gp.ArgumentError)  # as jax.jit
    g = gp.spmd(lambda a: a + 1, m24, in_shardings=(P("x", "y"),))  # not donating: deleted elsewhere
    x = g(np.ones((8, 8), np.float32))
    x.delete()
    with pytest.raises(gp.DeletedArrayError, match=r"arg0 float32\[8, 8\] has been deleted.*deleted"):
        g(x)


# -- host callbacks: once per call, and a failure is a Python exception -----------------------------
def _counting_callback(calls: list, fail: list):
    def host(v):
        calls.append(np.shape(v))
        if fail:
            raise ValueError(f"callback failed on {np.shape(v)}")
        return np.asarray(v) * 2, np.asarray(v).sum(1).astype(np.int32), np.asarray(v)[:, 0] > 10

    def fn(a):
        out = (jax.ShapeDtypeStruct(a.shape, a.dtype), jax.ShapeDtypeStruct(a.shape[:1], jnp.int32),
               jax.ShapeDtypeStruct(a.shape[:1], jnp.bool_))
        y, s, b = jax.pure_callback(host, out, jnp.sin(a) * 0 + a)
        return y + 1, s * 2, b
    return fn


def test_pure_callback_runs_once_per_call_with_whole_values(m24):
    calls, fail = [], []
    fn = _counting_callback(calls, fail)
    x = np.arange(64, dtype=np.float32).reshape(8, 8) - 20
    want = jax.jit(fn)(x)
    calls.clear()
    with pytest.warns(gp.PartitionWarning, match="pure_callback"):
        f = gp.spmd(fn, m24, in_shardings=(P("x", "y"),), out_shardings=(P("x", "y"), P("y"), P("x")))
        got = f(x)
    assert calls == [(8, 8)]  # once, with the whole value (it ran on all 8 devices before)
    got = f(x)
    assert calls == [(8, 8)] * 2
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
    assert [c.kind for c in f.plan(x).collectives].count("all-reduce") >= 1  # the broadcast of the results


def test_failing_pure_callback_is_its_own_exception(m24):
    import time

    calls, fail = [], [True]
    f = gp.spmd(_counting_callback(calls, fail), m24, in_shardings=(P("x", "y"),))
    x = np.ones((8, 8), np.float32)
    with pytest.warns(gp.PartitionWarning):
        f.plan(x)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"callback failed on \(8, 8\)") as info:
        f(x)
    assert time.perf_counter() - t0 < 30  # no device left waiting in a collective (XLA aborts after 40 s)
    assert calls == [(8, 8)]
    assert any("jax.pure_callback at" in n and "test_bad_inputs.py" in n
               for n in getattr(info.value, "__notes__", []))
    fail.clear()  # the failure is not kept: the next call runs as usual
    y, _, _ = f(x)
    np.testing.assert_array_equal(np.asarray(y), np.full((8, 8), 3, np.float32))
    fail.append(True)  # staged into jax.jit: JAX's runtime error, naming the callback and its error
    with pytest.raises(RuntimeError, match=r"jax.pure_callback at .* raised ValueError: callback failed"):
        jax.block_until_ready(jax.jit(f)(x))
    fail.clear()
    for g in (f, jax.jit(f)):  # and neither that failure nor its JAX runtime tokens are kept
        np.testing.assert_array_equal(np.asarray(g(x)[0]), np.full((8, 8), 3, np.float32))


def test_failing_debug_callback_is_its_own_exception(m24):
    calls = []

    def host(v):
        calls.append(v.shape)
        raise ZeroDivisionError("debug callback failed")

    def fn(a):
        jax.debug.callback(host, a)
        return (a * 2).sum(0)

    f = gp.spmd(fn, m24, in_shardings=(P("x", "y"),))
    x = np.ones((8, 8), np.float32)
    with pytest.raises(ZeroDivisionError, match="debug callback failed") as info:
        jax.block_until_ready(f(x))
    assert calls == [(8, 8)]  # once, by the first device, with the whole value
    assert any("jax.debug.callback at" in n for n in getattr(info.value, "__notes__", []))
    calls.clear()
    with pytest.raises(ZeroDivisionError):  # the failure is not kept: the next call fails afresh
        jax.block_until_ready(f(x))
    assert calls == [(8, 8)]


# -- unclear errors: now gp.ShardingErrors naming the culprit ----------------------------------------
@pytest.mark.parametrize("spec, needles", [
    (jax.sharding.PartitionSpec("z"), ("names mesh axis 'z'", "('x', 'y')")),
    (jax.sharding.PartitionSpec("x", "y", None), ("3 entries for a tensor of rank 2",)),
    (jax.sharding.PartitionSpec("x", "x"), ("mesh axis 'x' on two dims",)),
], ids=["unknown-axis", "longer-than-rank", "axis-twice"])
def test_bare_partition_spec_errors_name_the_constraint_and_line(m24, spec, needles):
    x = np.ones((8, 8), np.float32)

    def wsc(a):
        return jax.lax.with_sharding_constraint(a, spec) * 2

    def reshard(a):
        return jax.sharding.reshard(a, spec) * 2

    with _raises(gp.SpecError, "jax.lax.with_sharding_constraint at", "test_bad_inputs.py", "wsc)",
                 *needles):
        gp.spmd(wsc, m24).plan(x)
    explicit = jax.make_mesh((2, 4), ("x", "y"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.set_mesh(explicit):
        with _raises(gp.SpecError, "jax.sharding.reshard at", "test_bad_inputs.py", "reshard)", *needles):
            gp.spmd(reshard, m24).plan(x)


def test_reshard_over_auto_axes_says_what_it_needs(m24):
    with _raises(gp.SpecError, "jax.sharding.reshard at", "test_bad_inputs.py", "Explicit",
                 "with_sharding_constraint or gp.annotate"):
        gp.spmd(lambda a: jax.sharding.reshard(a, jax.sharding.PartitionSpec("x", None)), m24).plan(
            np.ones((8, 8), np.float32))


@pytest.mark.parametrize("bad", [np.array([1, "a"], dtype=object), np.array(["a", "b"]), np.array([b"a", b"b"]),
                                 np.zeros(2, dtype=[("a", np.int32)]), np.str_("a")],
                         ids=["object", "str", "bytes", "structured", "str-scalar"])
def test_object_and_string_arrays_are_argument_errors(m24, bad):
    f = gp.spmd(lambda p: p["w"] * 2, m24)
    with _raises(gp.ArgumentError, "argument arg0['b'] is a numpy array of dtype", "numeric dtype"):
        f({"w": np.ones(4, np.float32), "b": bad})
    with _raises(gp.ArgumentError, "argument opts['b'] is a numpy array"):
        gp.spmd(lambda x, opts: x, m24).plan(np.ones(4, np.float32), opts={"b": bad})
    # low-precision dtypes (numpy kind "V", as structured arrays) stay arrays
    y = f({"w": np.ones(4, jnp.bfloat16), "b": np.ones(2, np.float32)})
    assert y.dtype == jnp.bfloat16


def test_launched_script_without_initialize_is_told_to_call_it(m24, monkeypatch):
    from gspmd_py.runtime import distributed

    monkeypatch.setenv(distributed.ENV_NUM_PROCESSES, "2")
    monkeypatch.setenv(distributed.ENV_PROCESS_ID, "1")
    with _raises(gp.MeshError, "16 devices", "process 1 of 2", "gspmd_py.launch",
                 "call gp.distributed.initialize()") as info:
        gp.Mesh((4, 4), ("x", "y"))
    assert "XLA_FLAGS" not in str(info.value)
    with _raises(gp.MeshError, "do not exist", "gp.distributed.initialize()"):
        gp.Mesh((2,), ("x",), devices=[0, 12])
    monkeypatch.delenv(distributed.ENV_NUM_PROCESSES)
    with _raises(gp.MeshError, "XLA_FLAGS"):  # not launched: the device-count hint stays
        gp.Mesh((4, 4), ("x", "y"))


# -- end to end, in a fresh process: a Python exception within seconds, no signal, no 40 s wait ----
_PRELUDE = """
import numpy as np, jax, jax.numpy as jnp
import gspmd_py as gp
mesh = gp.Mesh((2, 4), ("x", "y"))
"""
_DONATED_AGAIN = _PRELUDE + """
f = gp.spmd(lambda a: a * 2, mesh, in_shardings=(gp.P("x", "y"),), donate_argnums=(0,))
y = f(np.ones((8, 8), np.float32))
f(y)
f(y)  # y was donated: used to crash the process (SIGSEGV)
"""
_FAILING_CALLBACK = _PRELUDE + """
def host(v):
    raise KeyError("no such row")

def fn(a):
    y = jax.pure_callback(host, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
    return (y * 2).sum(0)   # a collective follows the callback: the devices used to wait there

print(gp.spmd(fn, mesh, in_shardings=(gp.P("x", "y"),))(np.ones((8, 8), np.float32)))
"""
_FAILING_DEBUG_CALLBACK = _PRELUDE + """
def host(v):
    raise ZeroDivisionError("debug callback failed")

def fn(a):
    jax.debug.callback(host, a)
    return (a * 2).sum(0)   # a collective follows the callback

print(gp.spmd(fn, mesh, in_shardings=(gp.P("x", "y"),))(np.ones((8, 8), np.float32)))
"""
_LAUNCHED_WITHOUT_INITIALIZE = _PRELUDE  # gp.Mesh((2, 4)) on one of 2 processes with 4 devices each


def _run_script(tmp_path, text: str, *launcher: str):
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSPMD_PY_")}
    env.update(XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(root), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, *launcher, str(script)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    return done, time.perf_counter() - t0


@pytest.mark.slow
@pytest.mark.parametrize("text, error", [
    (_DONATED_AGAIN, "gspmd_py.core.errors.DeletedArrayError: <lambda>: argument arg0 float32[8, 8] has been deleted"),
    (_FAILING_CALLBACK, "KeyError: 'no such row'"),
    (_FAILING_DEBUG_CALLBACK, "ZeroDivisionError: debug callback failed"),
], ids=["donated-again", "failing-callback", "failing-debug-callback"])
def test_crashes_and_hangs_end_as_python_exceptions(tmp_path, text, error):
    done, elapsed = _run_script(tmp_path, text)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])  # < 0: killed by a signal
    assert "Traceback (most recent call last)" in done.stderr and error in done.stderr, done.stderr[-3000:]
    assert elapsed < 30, elapsed  # XLA's abort of a device left in a collective comes after 40 s
    assert "Exception ignored" not in done.stderr, done.stderr[-3000:]


@pytest.mark.slow
def test_launched_script_without_initialize_fails_saying_so(tmp_path):
    done, elapsed = _run_script(tmp_path, _LAUNCHED_WITHOUT_INITIALIZE, "-m", "gspmd_py.launch", "-n", "2",
                                "--devices-per-process", "4", "--timeout", "50")
    assert done.returncode == 1, (done.returncode, done.stdout[-2000:], done.stderr[-3000:])
    assert "MeshError" in done.stderr and "call gp.distributed.initialize()" in done.stderr, done.stderr[-3000:]
    assert "XLA_FLAGS" not in done.stderr.split("MeshError")[-1]
