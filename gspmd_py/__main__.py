"""Command line: ``python -m gspmd_py --help`` lists the commands (JAX is not imported for it)."""
from __future__ import annotations

import argparse
import os
import sys

COMMANDS = {
    "demo": "partition a transformer block over a (2, 4) mesh of 8 CPU devices, check it against the "
            "unpartitioned function, and time it against jax.jit with the same shardings",
}
ELSEWHERE = """other entry points:
  python -m gspmd_py.launch -n 2 --devices-per-process 4 script.py   run a script on 2 local processes
  python -m benchmarks --quick                                        gspmd_py against jax.jit (a checkout)
docs: docs/index.md; API: docs/api.md"""


def parser() -> argparse.ArgumentParser:
    """The command line's parser (argparse; building it imports nothing of JAX)."""
    from . import __version__

    p = argparse.ArgumentParser(prog="python -m gspmd_py", epilog=ELSEWHERE,
                                description="gspmd_py: annotation-driven SPMD partitioning for JAX.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"gspmd_py {__version__}")
    sub = p.add_subparsers(dest="command", metavar="command", required=True)
    demo = sub.add_parser("demo", help=COMMANDS["demo"], description=COMMANDS["demo"] + ".")
    demo.add_argument("--runs", type=int, default=20, metavar="N",
                      help="timed calls of each side; the best is shown (default: 20)")
    return p


def _main(argv) -> int:
    args = parser().parse_args(argv)  # --help, --version and bad input exit here, before JAX
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        # read when the backend starts (first device query), so setting it here is in time
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    from .demo import main

    return main(runs=args.runs)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
