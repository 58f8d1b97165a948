"""The line every results file opens with: this machine, its Python and jax, the devices.

No package-relative imports: the standalone scripts (``python benchmarks/cost_validation.py``)
import it as ``machine`` and ``python -m benchmarks`` as ``benchmarks.machine``.
"""
from __future__ import annotations

import os
import platform

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def describe() -> str:
    import jax

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"jax {jax.__version__}, 8 CPU devices (--xla_force_host_platform_device_count=8)")


def write(name: str, text: str, out: str = RESULTS) -> str:
    """Write ``text`` to ``out/name``; returns the path."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w") as fh:
        fh.write(text)
    return path
