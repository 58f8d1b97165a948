"""Partitioner: rewrites a sharded program into one per-device SPMD program."""
