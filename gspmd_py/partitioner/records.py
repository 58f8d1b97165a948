"""Collectives as data: read back from the per-device program itself, by the program index.

The partitioner emits each op under ``jax.named_scope("op<id>")`` (program.py) and the
combiner emits its merged collectives under ``"combined<id>,<id>,..."``; the program index
(program_index.py) walks the program's equations once, in order (into loop and branch
bodies), and keeps every collective with the op that caused it, deterministically, however
often JAX traces::

    psum[axes=('y',)] f32[8,16]   in scope op12   ->  Collective("all-reduce", ("y",), 512,
                                                                  "dot_general #12 (model.py:3)")

A collective's kind and reduce op are its primitive's ``OpFacts`` (ops/program.py).
"""
from __future__ import annotations

from typing import Callable

from .context import Collective
from .fine_mesh import FineMesh
from .program_index import ProgramIndex, sub_jaxprs

__all__ = ["collect", "sub_jaxprs"]


def collect(jaxpr, fine: FineMesh, label: Callable[[int], str]) -> list[Collective]:
    """Every collective of ``jaxpr`` (a Jaxpr or ClosedJaxpr) in program order, with the op that caused it."""
    program = jaxpr if hasattr(jaxpr, "jaxpr") else _Closed(jaxpr)
    return list(ProgramIndex.build(program, fine, label).collectives)


class _Closed:
    """A bare Jaxpr seen as a ClosedJaxpr (``.jaxpr``) for the index."""

    def __init__(self, jaxpr) -> None:
        self.jaxpr = jaxpr
