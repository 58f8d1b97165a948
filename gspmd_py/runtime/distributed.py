"""Running one gspmd_py program on many processes (JAX's multi-controller runtime).

Every process runs the same script: it initialises JAX's distributed runtime, builds
the same ``gp.Mesh`` over the global ``jax.devices()`` (every process's devices, hosts
major), plans the same program and calls it; JAX/XLA run the collectives between
processes (gloo on CPU, NCCL on GPU, ICI/DCN on TPU). Nothing here moves data itself.

    import gspmd_py as gp
    gp.distributed.initialize()          # launcher env, cluster auto-detection, or single process
    mesh = gp.Mesh((2, 4), ("x", "y"))   # 2 processes x 4 devices: "x" spans processes, "y" stays inside
    f = gp.spmd(step, mesh, in_shardings=(gp.P("x", None), ...))
    out = f(x, w)                        # every process passes the full global x, w ...
    out = f.from_local(x_local, w)       # ... or only its own block of x (here: its half of the rows)
    loss = gp.to_host(out)               # numpy, the same on every process

Run locally with ``python -m gspmd_py.launch -n 2 --devices-per-process 4 script.py``
(see ``gspmd_py/launch.py``); on a cluster, under the cluster's launcher (SLURM, Open MPI,
Kubernetes, Cloud TPU: ``jax.distributed.initialize()`` auto-detection, or the
``GSPMD_PY_*`` variables of launch_env.py).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Optional, Sequence

import numpy as np

from ..core.errors import SpecError
from ..core.launch_env import (ENV_COORDINATOR, ENV_CPU_COLLECTIVES, ENV_HEARTBEAT_TIMEOUT, ENV_INIT_TIMEOUT,
                               ENV_LAUNCHER_PID, ENV_NUM_PROCESSES, ENV_PROCESS_ID)  # re-exported
from ..core.sharding import Sharding

_NO_CLUSTER = "coordinator_address should be defined"  # jax's message when nothing was detected


def initialize(coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
               process_id: Optional[int] = None, *, local_device_ids: Optional[Sequence[int]] = None,
               initialization_timeout: Optional[int] = None, exit_on_error: bool = True) -> bool:
    """Initialise JAX's distributed runtime for a multi-process run; call before any JAX work.

    Where the settings come from, first found wins: the arguments; the ``GSPMD_PY_*``
    variables that ``python -m gspmd_py.launch`` sets; ``jax.distributed.initialize()``'s
    own detection (``JAX_COORDINATOR_ADDRESS``, SLURM, Open MPI, Kubernetes, Cloud TPU).
    When none of them describes a cluster the script runs as one process and this returns
    False; it returns True once the runtime is up (and again on later calls).

    CPU collectives between processes use gloo (``GSPMD_PY_CPU_COLLECTIVES=mpi`` picks MPI).
    With ``exit_on_error`` (the default) an uncaught exception ends this process at once,
    after printing its traceback, instead of waiting at JAX's shutdown barrier for
    processes that may be blocked in a collective with it: a crash is reported, not a hang.

        >>> import gspmd_py as gp
        >>> gp.distributed.initialize()     # doctest: +SKIP
        True
    """
    import jax

    if jax.distributed.is_initialized():
        return True
    env = os.environ
    if env.get(ENV_LAUNCHER_PID):
        _die_with(int(env[ENV_LAUNCHER_PID]))
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR) or None
    if num_processes is None and env.get(ENV_NUM_PROCESSES):
        num_processes = int(env[ENV_NUM_PROCESSES])
    if process_id is None and env.get(ENV_PROCESS_ID):
        process_id = int(env[ENV_PROCESS_ID])
    if initialization_timeout is None:
        initialization_timeout = int(env.get(ENV_INIT_TIMEOUT, "300"))
    kw: dict[str, Any] = {"initialization_timeout": initialization_timeout}
    if env.get(ENV_HEARTBEAT_TIMEOUT):
        kw["heartbeat_timeout_seconds"] = int(env[ENV_HEARTBEAT_TIMEOUT])
    # must be set before the CPU backend starts; harmless on GPU/TPU
    jax.config.update("jax_cpu_collectives_implementation", env.get(ENV_CPU_COLLECTIVES, "gloo"))
    explicit = any(v is not None for v in (coordinator_address, num_processes, process_id))
    try:
        jax.distributed.initialize(coordinator_address, num_processes, process_id,
                                   local_device_ids=local_device_ids, **kw)
    except ValueError as e:
        if explicit or _NO_CLUSTER not in str(e):
            raise
        return False  # no launcher, no cluster: a single-process run
    if exit_on_error and jax.process_count() > 1:
        sys.excepthook = _exit_after(sys.excepthook)
    return True


def _die_with(parent: int) -> None:
    """Linux: get SIGKILL when the launcher goes (e.g. killed by a CI timeout), so that no
    process is left waiting in a collective; elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the launcher went before prctl took effect
        os._exit(1)


def _exit_after(previous):
    """An excepthook that reports the exception as ``previous`` does, then exits with code 1
    at once (skipping atexit's distributed shutdown, which waits for every process)."""

    def hook(kind, value, tb):
        try:
            previous(kind, value, tb)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)

    return hook


def is_multiprocess() -> bool:
    """True when this program runs on more than one JAX process."""
    import jax

    return jax.process_count() > 1


def hosts_major(devices) -> list:
    """``devices`` ordered process index major, then device id (the default mesh order)."""
    return sorted(devices, key=lambda d: (d.process_index, d.id))


def process_of_devices(mesh) -> np.ndarray:
    """The process index of every device of ``mesh``, in the mesh's shape."""
    return np.vectorize(lambda d: d.process_index, otypes=[np.int64])(mesh.jax_devices())


def axes_spanning_processes(mesh) -> tuple[str, ...]:
    """Mesh axes whose device groups cross a process boundary (their collectives leave the host).

    With the default hosts-major order on 2 processes x 4 devices,
    ``gp.Mesh((2, 4), ("x", "y"))`` gives ``("x",)``: "y" stays inside a process.

        >>> import gspmd_py as gp
        >>> gp.distributed.axes_spanning_processes(gp.Mesh((2, 4), ("x", "y")))   # one process
        ()
    """
    procs = process_of_devices(mesh)
    out = []
    for i, name in enumerate(mesh.axis_names):
        rows = np.moveaxis(procs, i, -1).reshape(-1, mesh.shape[i])
        if np.any(rows != rows[:, :1]):
            out.append(name)
    return tuple(out)


def held_shards(mesh, spec, rank: int, what: str) -> list[tuple[int, int, int]]:
    """Per dim ``(a, b, k)``: this process's devices hold shards ``a..b-1`` of the ``k`` shards
    that ``spec`` cuts the dim into (SpecError when they are not one run of shards)."""
    import jax

    try:
        s = spec if isinstance(spec, Sharding) else Sharding(mesh, spec, what=what)
        s = s.with_rank(rank, what)
    except SpecError as e:
        msg = str(e)
        raise SpecError(msg if msg.startswith(what) else f"{what}: {msg}") from None
    mine = process_of_devices(mesh).reshape(-1) == jax.process_index()
    if not mine.any():
        raise SpecError(f"{what}: this process holds no device of {mesh}; every process must hold part of it")
    idx = s.shard_index()[mine]
    out = []
    for d in range(rank):
        held = sorted(set(idx[:, d].tolist()))
        if held != list(range(held[0], held[-1] + 1)):
            raise SpecError(f"{what}: this process holds shards {held} of dim {d}, not one block; "
                            f"pass the full global array instead of local data")
        out.append((held[0], held[-1] + 1, s.shards[d]))
    return out


def local_slices(mesh, spec, shape: Sequence[int]) -> tuple[slice, ...]:
    """The block of a global ``shape`` array sharded by ``spec`` over ``mesh`` that this process
    holds: index a global array with it to get what ``f.from_local`` expects.

        >>> import gspmd_py as gp
        >>> gp.distributed.local_slices(gp.Mesh((2, 4), ("x", "y")), gp.P("x", None), (7, 3))  # one process
        (slice(0, 7, None), slice(0, 3, None))
    """
    what = f"local_slices of {tuple(shape)} under {spec}"
    out = []
    for n, (a, b, k) in zip(shape, held_shards(mesh, spec, len(shape), what)):
        step = -(-n // k)
        out.append(slice(min(a * step, n), min(b * step, n)))
    return tuple(out)


def to_host(tree):
    """Every array of ``tree`` as a numpy array holding its global value, on every process.

    A global ``jax.Array`` spread over several processes is all-gathered through JAX
    (``jax.experimental.multihost_utils.process_allgather``): every process must call
    ``to_host`` on it, in the same order, like any collective. Other leaves are converted
    with ``np.asarray``.

        >>> import numpy as np, gspmd_py as gp
        >>> gp.to_host({"a": np.arange(3)})["a"].tolist()
        [0, 1, 2]
    """
    import jax
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            if x.is_fully_replicated:  # every shard is the whole value: no collective needed
                return np.asarray(x.addressable_data(0))
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(x)

    return jax.tree_util.tree_map(one, tree)
