"""Collectives as data: read back from the per-device program itself.

The partitioner emits each op under ``jax.named_scope("op<id>")`` (program.py) and the
combiner emits its merged collectives under ``"combined<id>,<id>,..."``; walking the
program's equations in order (into loop and branch bodies) therefore gives every
collective with the op that caused it, deterministically, however often JAX traces::

    psum[axes=('y',)] f32[8,16]   in scope op12   ->  Collective("all-reduce", ("y",), 512,
                                                                  "dot_general #12 (model.py:3)")
"""
from __future__ import annotations

import re
from typing import Callable, Iterator

import numpy as np

from ..ops import facts as F
from ..ops import facts_of
from .context import Collective
from .fine_mesh import FineMesh

_SCOPE = re.compile(r"(?:^|/)(op(\d+)|combined([\d,]+)|boundary)(?:/|$)")


def sub_jaxprs(eqn) -> Iterator:
    for v in eqn.params.values():
        for j in (v if isinstance(v, (tuple, list)) else (v,)):
            inner = getattr(j, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                yield inner
            elif hasattr(j, "eqns"):
                yield j


def _axes(eqn) -> tuple[str, ...]:
    a = eqn.params.get("axes", eqn.params.get("axis_name"))
    return tuple(a) if isinstance(a, (tuple, list)) else (a,)


def collect(jaxpr, fine: FineMesh, label: Callable[[int], str]) -> list[Collective]:
    """Every collective of ``jaxpr`` (a Jaxpr) in program order, with the op that caused it."""
    out: list[Collective] = []

    def walk(j, in_loop: bool, scope: tuple[int, ...], scope_label: str) -> None:
        for eqn in j.eqns:
            ids, text = _scope_of(str(eqn.source_info.name_stack), scope, scope_label, label)
            facts = facts_of(eqn.primitive.name)
            if facts.collective:  # its kind and reduce op: ops/program.py
                axes = _axes(eqn)
                aval = eqn.invars[0].aval
                nbytes = sum(int(np.prod(v.aval.shape, dtype=np.int64)) * np.dtype(v.aval.dtype).itemsize
                             for v in eqn.invars)
                group = int(np.prod([fine.size_of[a] for a in axes], dtype=np.int64))
                out.append(Collective(
                    facts.collective, tuple(str(r) for r in fine.coarse(axes)), nbytes, text,
                    op_id=ids[0] if len(ids) == 1 else -1, dtype=str(np.dtype(aval.dtype)), shape=tuple(aval.shape),
                    reduce=facts.collective_reduce, tensors=max(1, len(ids)), group_size=group, in_loop=in_loop))
            for inner in sub_jaxprs(eqn):
                walk(inner, in_loop or facts.region == F.LOOP, ids, text)

    walk(jaxpr, False, (), "boundary")
    return out


def _scope_of(stack: str, outer_ids: tuple[int, ...], outer: str, label) -> tuple[tuple[int, ...], str]:
    """The op ids and label an equation's name stack points at (innermost scope wins)."""
    found = None
    for m in _SCOPE.finditer(stack):
        found = m
    if found is None:
        return outer_ids, outer
    if found.group(2):
        i = int(found.group(2))
        return (i,), label(i)
    if found.group(3):
        ids = tuple(int(t) for t in found.group(3).split(","))
        return ids, "combined: " + "; ".join(label(i) for i in ids)
    return (), "boundary"
