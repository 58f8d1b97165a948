"""The environment ``python -m gspmd_py.launch`` sets for the processes it starts, and what a
process started that way should be told when JAX's distributed runtime is not up.

Read by ``gp.distributed.initialize`` and by mesh errors (too few devices); no other state.
"""
from __future__ import annotations

import os
from typing import Optional

# Environment variables read by ``initialize`` (set by ``python -m gspmd_py.launch``).
ENV_COORDINATOR = "GSPMD_PY_COORDINATOR"          # "host:port" of process 0's coordinator
ENV_NUM_PROCESSES = "GSPMD_PY_NUM_PROCESSES"
ENV_PROCESS_ID = "GSPMD_PY_PROCESS_ID"
ENV_INIT_TIMEOUT = "GSPMD_PY_INIT_TIMEOUT"        # seconds to wait for every process to connect
ENV_HEARTBEAT_TIMEOUT = "GSPMD_PY_HEARTBEAT_TIMEOUT"  # seconds before a silent process counts as dead
ENV_CPU_COLLECTIVES = "GSPMD_PY_CPU_COLLECTIVES"  # "gloo" (default) or "mpi"
ENV_LAUNCHER_PID = "GSPMD_PY_LAUNCHER_PID"        # this process dies when that one does (Linux)


def launcher_hint() -> Optional[str]:
    """What to do when this process was started by ``python -m gspmd_py.launch`` with other
    processes but JAX's distributed runtime is not up (so it sees only its own devices); None
    otherwise. Mesh errors about too few devices say this instead of suggesting XLA_FLAGS."""
    n = os.environ.get(ENV_NUM_PROCESSES, "")
    if not n.isdigit() or int(n) <= 1:
        return None
    import jax

    if jax.distributed.is_initialized():
        return None
    rank = os.environ.get(ENV_PROCESS_ID, "?")
    return (f"this is process {rank} of {n} started by python -m gspmd_py.launch, but gp.distributed.initialize() "
            f"was not called, so it sees only its own {len(jax.local_devices())} devices: call "
            f"gp.distributed.initialize() at the start of the script, before any other JAX work")
