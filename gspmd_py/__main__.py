"""Command line: ``python -m gspmd_py demo``."""
import os
import sys


def _main(argv) -> int:
    if not argv or argv[0] not in ("demo",):
        print("usage: python -m gspmd_py demo", file=sys.stderr)
        return 2
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        # read when the backend starts (first device query), so setting it here is in time
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
    from .demo import main

    return main(argv[1:])


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
