"""``python -m gspmd_py.launch -n 2 --devices-per-process 4 script.py [args]``: the entry point
of the local multi-process launcher (the launcher itself is ``runtime/launch.py``)."""
from __future__ import annotations

import sys

from .runtime.launch import main

if __name__ == "__main__":
    sys.exit(main())
