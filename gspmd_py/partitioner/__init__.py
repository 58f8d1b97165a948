"""Partitioner: executes the recorded sharding projections as one per-device SPMD program.

Importing it registers one handler per rule handler name and checks that none is missing.
"""
from . import (control_handler, conv_handler, dot_handler, fallback, gather_handler, generic, host_calls,  # noqa: F401
               manual_handler, ragged_handler, random_handler, reduce_handler, rotate_handler, scatter_handler,
               windowed_handler)
from .registry import check_complete

check_complete()
