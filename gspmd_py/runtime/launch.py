"""``python -m gspmd_py.launch -n 2 --devices-per-process 4 script.py [args]``: a local
multi-process run on JAX's distributed runtime.

Starts N copies of the script, process i with the environment that
``gp.distributed.initialize()`` reads (coordinator on 127.0.0.1 at a free port, the process
count and index), JAX on CPU with ``--devices-per-process`` devices each
(``XLA_FLAGS=--xla_force_host_platform_device_count``) and gloo collectives between the
processes. Each line a process prints comes out prefixed ``[rank i]`` (stdout to stdout,
stderr to stderr). If a process fails, the others are killed and the launcher exits with
that process's exit code after repeating the end of its error output; ``--timeout`` bounds
the whole run (exit code 124). Exit code 0 means every process exited 0.

    $ python -m gspmd_py.launch -n 2 --devices-per-process 4 examples/multihost_train.py
    [rank 0] step 0 loss 1.234567
    [rank 1] step 0 loss 1.234567
"""
from __future__ import annotations

import argparse
import collections
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Optional, Sequence

from ..core.launch_env import (ENV_COORDINATOR, ENV_CPU_COLLECTIVES, ENV_HEARTBEAT_TIMEOUT, ENV_INIT_TIMEOUT,
                               ENV_LAUNCHER_PID, ENV_NUM_PROCESSES, ENV_PROCESS_ID)

_TAIL_LINES = 25     # lines of a failed process's output repeated in the summary
_KILL_GRACE_S = 1.0  # SIGTERM, then SIGKILL after this long (JAX traps SIGTERM for preemption)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(base: dict, rank: int, n: int, port: int, devices: int, init_timeout: int) -> dict:
    """The environment of process ``rank``: ``base`` plus what ``gp.distributed.initialize`` reads."""
    env = dict(base)
    flags = re.sub(r"--xla_force_host_platform_device_count=\S*", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env[ENV_COORDINATOR] = f"127.0.0.1:{port}"
    env["JAX_COORDINATOR_BIND_ADDRESS"] = f"127.0.0.1:{port}"  # loopback only, not every interface
    env[ENV_NUM_PROCESSES] = str(n)
    env[ENV_PROCESS_ID] = str(rank)
    env[ENV_INIT_TIMEOUT] = str(init_timeout)
    env.setdefault(ENV_HEARTBEAT_TIMEOUT, "20")
    env.setdefault(ENV_CPU_COLLECTIVES, "gloo")
    env[ENV_LAUNCHER_PID] = str(os.getpid())  # initialize() makes the process die with the launcher
    env["PYTHONUNBUFFERED"] = "1"
    return env


class _Printer:
    """Writes ``[rank i] line`` to stdout/stderr, one whole line at a time."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def write(self, out: IO[str], text: str) -> None:
        with self.lock:
            out.write(text)
            out.flush()


def _pump(stream: IO[bytes], rank: int, out: IO[str], printer: _Printer, tail: collections.deque) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", "replace").rstrip("\n")
        tail.append(line)
        printer.write(out, f"[rank {rank}] {line}\n")
    stream.close()


def _kill(procs: Sequence[subprocess.Popen]) -> None:
    """SIGTERM every live process group, then SIGKILL what is left after a grace period."""
    live = [p for p in procs if p.poll() is None]
    for sig, wait in ((signal.SIGTERM, _KILL_GRACE_S), (signal.SIGKILL, 5.0)):
        for p in live:
            try:
                os.killpg(p.pid, sig)  # each child leads its own group (setsid)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        live = [p for p in live if p.poll() is None]
        if not live:
            return


def _exit_code(rc: int) -> int:
    return rc if rc > 0 else 128 - rc  # killed by signal s: 128 + s, as a shell reports it


def run(command: Sequence[str], n: int, devices_per_process: int, timeout: Optional[float] = None,
        init_timeout: int = 60, stdout: IO[str] = None, stderr: IO[str] = None) -> int:
    """Run ``command`` as ``n`` processes (see the module docstring); returns the exit code."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr
    port = free_port()
    printer = _Printer()
    procs: list[subprocess.Popen] = []
    tails = [collections.deque(maxlen=_TAIL_LINES) for _ in range(n)]
    done: "queue.Queue[tuple[int, int]]" = queue.Queue()
    threads = []
    try:
        for rank in range(n):
            env = child_env(os.environ, rank, n, port, devices_per_process, init_timeout)
            procs.append(subprocess.Popen(list(command), env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, start_new_session=True))
        for rank, p in enumerate(procs):
            for stream, out in ((p.stdout, stdout), (p.stderr, stderr)):
                t = threading.Thread(target=_pump, args=(stream, rank, out, printer, tails[rank]), daemon=True)
                t.start()
                threads.append(t)
            w = threading.Thread(target=lambda r=rank, q=p: done.put((r, q.wait())), daemon=True)
            w.start()
        deadline = None if not timeout else time.monotonic() + timeout
        failed: Optional[tuple[int, int]] = None
        finished = 0
        while finished < n:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            try:
                rank, rc = done.get(timeout=left)
            except queue.Empty:
                break
            finished += 1
            if rc != 0:
                failed = (rank, rc)
                break
        timed_out = finished < n and failed is None
    except KeyboardInterrupt:
        _kill(procs)
        printer.write(stderr, "gspmd_py.launch: interrupted; every process was stopped\n")
        return 130
    finally:
        _kill(procs)
        for t in threads:
            t.join(timeout=5.0)
    if failed is not None:
        rank, rc = failed
        why = f"exited with code {rc}" if rc > 0 else f"was killed by signal {-rc}"
        others = [str(r) for r in range(n) if r != rank]
        lines = "\n".join(f"  [rank {rank}] {l}" for l in tails[rank])
        printer.write(stderr, f"gspmd_py.launch: rank {rank} {why}; stopped the other process(es) "
                              f"{', '.join(others) or '-'}. Last lines of rank {rank}:\n{lines}\n")
        return _exit_code(rc)
    if timed_out:
        running = [str(r) for r, p in enumerate(procs) if p.returncode is None or p.returncode < 0]
        printer.write(stderr, f"gspmd_py.launch: timed out after {timeout:g} s; killed rank(s) "
                              f"{', '.join(running)}\n")
        return 124
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m gspmd_py.launch",
        description="Run a script as N local JAX processes (jax.distributed on 127.0.0.1, CPU devices, gloo).")
    ap.add_argument("-n", "--num-processes", type=int, required=True, help="number of processes")
    ap.add_argument("--devices-per-process", type=int, default=1, help="CPU devices of each process (default 1)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="kill every process and exit 124 after this many seconds (default: no limit)")
    ap.add_argument("--init-timeout", type=int, default=60,
                    help="seconds a process waits for the others to connect (default 60)")
    ap.add_argument("script", help="the Python script every process runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    ns = parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    command = [sys.executable, ns.script, *ns.args]
    if ns.num_processes < 1 or ns.devices_per_process < 1:
        parser().error("-n and --devices-per-process must be positive")
    return run(command, ns.num_processes, ns.devices_per_process, ns.timeout, ns.init_timeout)


if __name__ == "__main__":
    sys.exit(main())
