"""Collectives as data: read back from the per-device program itself, by the program index.

The partitioner emits each op under ``jax.named_scope("op<id>")`` (partitioner/program.py) and the
combiner emits its merged collectives under ``"combined<id>,<id>,..."``; the program index
(program_index.py) walks the program's equations once, in order (into loop and branch
bodies), and keeps every collective with the op that caused it, deterministically, however
often JAX traces::

    psum[axes=('y',)] f32[8,16]   in scope op12   ->  Collective("all-reduce", ("y",), 512,
                                                                  "dot_general #12 (model.py:3)")

A collective's kind and reduce op are its primitive's ``OpFacts`` (ops/program.py). The
records are the index's: ``plan.collectives`` is ``plan.index.collectives``; nothing here
reads the program again.
"""
from __future__ import annotations

from .collective import Collective
from .program_index import ProgramIndex

__all__ = ["collect"]


def collect(index: ProgramIndex) -> list[Collective]:
    """Every collective of the program ``index`` indexes, in program order, with the op that caused it."""
    return list(index.collectives)
