"""Partitioner handlers, keyed by the ``handler`` name of an op's sharding rule.

A handler turns one op into local computation plus collectives::

    @handler("dot")
    def partition_dot(ctx, op, rule, args: list[PValue], want: list[FineDims]) -> list[PValue]: ...

``args`` are the operands as partitioned so far, ``want`` the shardings propagation
chose for the results. A handler returns results in any sharding it finds cheapest
(partial sums allowed); the driver reshards them to ``want``.
"""
from __future__ import annotations

from typing import Callable

HANDLERS: dict[str, Callable] = {}


def handler(*names: str):
    def deco(fn):
        for n in names:
            HANDLERS[n] = fn
        return fn

    return deco
