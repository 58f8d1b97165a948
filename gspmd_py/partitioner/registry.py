"""Partitioner handlers, keyed by the handler name an op's rule registered with.

A handler turns one op into local computation (plus the halo exchanges and combines its
op needs)::

    @handler("dot")
    def partition_dot(ctx, op, rule, plan: OpPlan, args: list[PValue]) -> list[PValue]: ...

``args`` arrive resharded to the op's projection (``plan.operands``; see program.py), and
the handler returns results in ``plan.results``, partial over the axes of sharded
reduction factors. Every name in ``ops.rule.HANDLER_NAMES`` has exactly one handler:
``check_complete`` (run when the partitioner is imported) fails otherwise, naming it.
"""
from __future__ import annotations

from typing import Callable

from ..ops.rule import HANDLER_NAMES

HANDLERS: dict[str, Callable] = {}


def handler(*names: str):
    def deco(fn):
        for n in names:
            if n not in HANDLER_NAMES:
                raise ValueError(f"partitioner handler {n!r} is not a rule handler name (known: {sorted(HANDLER_NAMES)})")
            if n in HANDLERS:
                raise ValueError(f"duplicate partitioner handler {n!r}")
            HANDLERS[n] = fn
        return fn

    return deco


def check_complete() -> None:
    missing = sorted(HANDLER_NAMES - set(HANDLERS))
    if missing:
        raise ValueError(f"rule handler names without a partitioner handler: {missing}")
