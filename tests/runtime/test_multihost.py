"""Multi-process runs (issue 12): 2 processes x 4 CPU devices on loopback, started with
``python -m gspmd_py.launch``, give the results of 1 process x 8 devices (this process);
a crash or a hang is reported, never waited on; processes that plan different programs
are stopped with an error naming the op. Every launch is bounded by the launcher's
``--timeout`` and by subprocess's timeout."""
from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

import gspmd_py as gp
from gspmd_py.runtime import launch
from gspmd_py.runtime.plancheck import digest, first_difference, mismatch_message, program_lines

import multihost_worker as worker

ROOT = Path(__file__).resolve().parents[2]
P = gp.P
LAUNCH_TIMEOUT_S = 100  # the launcher kills everything after this; subprocess gives it 20 s more


def run_launcher(*args: str, n: int = 2, devices: int = 4) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GSPMD_PY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-m", "gspmd_py.launch", "-n", str(n), "--devices-per-process", str(devices),
           "--timeout", str(LAUNCH_TIMEOUT_S), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S + 20)


_GLOO = re.compile(r"\[Gloo\] Rank \d+ is connected to \d+ peer ranks\. Expected number of connected peer ranks is : \d+")


def rank_lines(text: str, rank: int) -> list[str]:
    """A rank's lines, without gloo's connection message: gloo writes it to the same stdout
    from C++, so it may land on a line of its own or in the middle of one of ours (between a
    print's text and its newline), which then leaves an empty line."""
    tag = f"[rank {rank}] "
    lines = (_GLOO.sub("", l[len(tag):]) for l in text.splitlines() if l.startswith(tag))
    return [l for l in lines if l.strip()]


@pytest.mark.slow
def test_megatron_mlp_on_two_processes_matches_one_process_for_both_mesh_layouts(tmp_path):
    out = tmp_path / "mlp.npz"
    r = run_launcher("tests/multihost_worker.py", "mlp", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "process 0: done" in r.stdout and "process 1: done" in r.stdout
    got = np.load(out)
    ref = worker.mlp_results()  # the same calls on 1 process x 8 devices
    x, w1, w2 = worker.mlp_inputs()
    exact = np.asarray(worker.mlp(x, w1, w2))
    # the "x" axis spans the two processes on one mesh, "y" does on the other
    assert got["tp_inside/spanning"].tolist() == [True, False]
    assert got["tp_across/spanning"].tolist() == [False, True]
    for name in ("tp_inside", "tp_across"):
        for kind in ("global", "local", "local_open", "local_empty", "chained"):
            key = f"{name}/{kind}"
            assert got[key].shape == ref[key].shape
            np.testing.assert_allclose(got[key], ref[key], rtol=1e-5, atol=1e-5, err_msg=key)
        np.testing.assert_allclose(got[f"{name}/local"], exact, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(got[f"{name}/local_empty"], exact[:3], rtol=1e-5, atol=1e-5)


def _load_example():
    spec = importlib.util.spec_from_file_location("multihost_train", ROOT / "examples" / "multihost_train.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_training_step_on_two_processes_matches_one_process(tmp_path):
    out = tmp_path / "train.npz"
    r = run_launcher("examples/multihost_train.py", "--steps", "2", "--out", str(out))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    example = _load_example()
    printed = []
    losses, params = example.train(2, log=printed.append)  # 1 process x 8 devices
    got = np.load(out)
    np.testing.assert_allclose(got["losses"], losses, rtol=1e-5)
    for k, v in params.items():
        np.testing.assert_allclose(got[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    # both processes print the losses this process prints
    want = [l for l in printed if l.startswith("step")]
    for rank in (0, 1):
        assert [l for l in rank_lines(r.stdout, rank) if l.startswith("step")] == want
    assert "axes spanning processes: ('x',)" in r.stdout


@pytest.mark.slow
def test_a_crashed_process_is_reported_and_the_others_stopped():
    r = run_launcher("tests/multihost_worker.py", "crash")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]  # not 124: nothing waited for the timeout
    assert "gspmd_py.launch: rank 1 exited with code 1" in r.stderr
    assert "RuntimeError: process 1 fails on purpose" in r.stderr
    assert "[rank 1] Traceback" in r.stderr


@pytest.mark.slow
def test_processes_planning_different_programs_raise_naming_the_op():
    r = run_launcher("tests/multihost_worker.py", "mismatch")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    for rank in (0, 1):
        # Gloo's C++ log may share a line with the print (no newline between them): find it anywhere
        msg = [l[l.index("MISMATCH"):] for l in rank_lines(r.stdout, rank) if "MISMATCH" in l]
        assert len(msg) == 1, r.stdout[-3000:]
        assert "processes 0 and 1 planned different programs" in msg[0]
        assert "first difference at op 1 (" in msg[0] and "tanh" in msg[0]
    assert "multihost_worker.py" in rank_lines(r.stdout, 1)[-1]  # process 1 points at its own tanh line


# -- the launcher, on tiny scripts (no JAX) ------------------------------------------------------------

def _run_small(code: str, n: int = 2, timeout=None):
    out, err = io.StringIO(), io.StringIO()
    rc = launch.run([sys.executable, "-c", code], n, 1, timeout=timeout, stdout=out, stderr=err)
    return rc, out.getvalue(), err.getvalue()


def test_launcher_prefixes_output_and_sets_the_environment():
    code = ("import os, sys; print('hello', os.environ['GSPMD_PY_PROCESS_ID'], os.environ['GSPMD_PY_NUM_PROCESSES'], "
            "os.environ['XLA_FLAGS'], os.environ['GSPMD_PY_COORDINATOR']); print('oops', file=sys.stderr)")
    rc, out, err = _run_small(code)
    assert rc == 0, err
    for rank in (0, 1):
        (line,) = rank_lines(out, rank)
        hello, pid, n, flags, coord = line.split(" ")
        assert (pid, n, flags) == (str(rank), "2", "--xla_force_host_platform_device_count=1")
        assert coord.startswith("127.0.0.1:")
        assert rank_lines(err, rank) == ["oops"]


def test_launcher_returns_the_failing_rank_exit_code_with_its_output():
    code = ("import os, sys, time\nr = int(os.environ['GSPMD_PY_PROCESS_ID'])\n"
            "if r == 1:\n    print('bad input on rank 1', file=sys.stderr); sys.exit(3)\ntime.sleep(60)")
    rc, out, err = _run_small(code)
    assert rc == 3
    assert "rank 1 exited with code 3" in err and "bad input on rank 1" in err.split("Last lines")[-1]


def test_launcher_timeout_kills_hung_processes():
    rc, out, err = _run_small("import time; time.sleep(60)", timeout=1.0)
    assert rc == 124
    assert "timed out after 1 s" in err


def test_launcher_passes_script_arguments_through():
    ns = launch.parser().parse_args(["-n", "2", "script.py", "-n", "5", "--timeout", "x"])
    assert (ns.num_processes, ns.script, ns.args) == (2, "script.py", ["-n", "5", "--timeout", "x"])


def test_launcher_replaces_the_device_count_flag():
    env = launch.child_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --foo"}, 1, 2, 1234, 4, 30)
    assert env["XLA_FLAGS"] == "--foo --xla_force_host_platform_device_count=4"
    assert (env["GSPMD_PY_PROCESS_ID"], env["JAX_PLATFORMS"], env["GSPMD_PY_CPU_COLLECTIVES"]) == ("1", "cpu", "gloo")


@pytest.mark.slow
def test_initialize_without_launcher_or_cluster_is_a_single_process_run():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GSPMD_PY_", "JAX_COORDINATOR", "SLURM_", "OMPI_", "KUBERNETES_"))}
    env["PYTHONPATH"] = str(ROOT)
    code = "import gspmd_py as gp; print(gp.distributed.initialize()); import jax; print(jax.process_count())"
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["False", "1"]


# -- one process: the same entry points, and the pieces of the program check ------------------------------

class _FakeDevice:
    def __init__(self, id, process_index):
        self.id, self.process_index = id, process_index


def test_default_mesh_order_is_hosts_major(monkeypatch):
    # ids interleaved between processes (as on some TPU slices): the mesh still takes process 0's devices first
    fake = [_FakeDevice(i, i % 2) for i in range(8)]
    monkeypatch.setattr(jax, "devices", lambda *a: fake)
    mesh = gp.Mesh((2, 4), ("x", "y"))
    assert mesh.device_ids.tolist() == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [d.id for d in gp.distributed.hosts_major(fake)] == [0, 2, 4, 6, 1, 3, 5, 7]


def test_from_local_on_one_process_is_the_global_call():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    x, w1, w2 = worker.mlp_inputs()
    f = gp.spmd(worker.mlp, mesh, in_shardings=(P("x", None), P(None, "y"), P("y", None)))
    assert gp.distributed.local_slices(mesh, P("x", None), x.shape) == (slice(0, 7), slice(0, 16))
    np.testing.assert_allclose(gp.to_host(f.from_local(x, w1, w2)), gp.to_host(f(x, w1, w2)), rtol=1e-6)
    with pytest.raises(gp.SpecError, match=r"argument arg0 f32\[9,16\].*dim 0 \(in_sharding.*needs 9 there, got 7"):
        f.from_local(x, w1, w2, global_shapes=((9, 16), None, None))


def test_to_host_and_axes_spanning_processes_on_one_process():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    f = gp.spmd(lambda a: {"y": a * 2}, mesh, in_shardings=P("x", "y"))
    out = gp.to_host(f(np.ones((4, 8), np.float32)))
    assert isinstance(out["y"], np.ndarray) and out["y"].sum() == 64
    assert gp.distributed.axes_spanning_processes(mesh) == ()
    assert not gp.distributed.is_multiprocess()


def test_program_digest_is_stable_and_names_the_first_differing_op():
    mesh = gp.Mesh((2, 4), ("x", "y"))
    args = worker.mlp_inputs()
    specs = (P("x", None), P(None, "y"), P("y", None))

    def with_tanh(x, w1, w2):
        return jax.numpy.tanh(x @ w1) @ w2

    a, _ = program_lines(gp.spmd(worker.mlp, mesh, in_shardings=specs).plan(*args))
    a2, _ = program_lines(gp.spmd(worker.mlp, mesh, in_shardings=specs).plan(*args))
    b, where_b = program_lines(gp.spmd(with_tanh, mesh, in_shardings=specs).plan(*args))
    c, _ = program_lines(gp.spmd(worker.mlp, mesh, in_shardings=(P("x", None), P(None, "x"), None)).plan(*args))
    assert digest(a) == digest(a2) and len(digest(a)) == 32
    assert len({digest(a), digest(b), digest(c)}) == 3
    i = first_difference(b, a)
    assert b[i].startswith("op tanh") and "tanh" in where_b[i] and "test_multihost.py" in where_b[i]
    msg = mismatch_message("with_tanh", 1, 0, b, where_b, a)
    assert "processes 0 and 1 planned different programs" in msg and "process 1 has `op tanh" in msg
    assert "could not be fetched" in mismatch_message("f", 0, 1, a, where_b, None)
