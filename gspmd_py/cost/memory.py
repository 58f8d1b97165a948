"""Peak live memory of the per-device program: a liveness walk over its buffers.

Buffers are the materialized values of fusion.py (a fused intermediate never takes memory;
a reshape shares its operand's buffer). The walk reads the program index's bodies
(program/program_index.py), never the program itself. Walking the equations in
program order:

* arguments are live from the start; a non-donated argument stays live to the end (the
  caller holds it), a donated one is freed after its last use; constants stay live;
* each equation allocates its results, then frees every buffer whose last use it was
  (results nobody uses are freed at once); outputs stay live to the end;
* a result may reuse, in place, an operand buffer of the same size that dies at this
  equation when the op is elementwise-like (a fusion) or ``OpFacts.inplace``
  (dynamic_update_slice, scatter, a while loop's carry): how a donated parameter becomes
  the updated parameter;
* a loop or branch adds its body's own peak (the body's temporaries; its parameters are
  the loop's operands, already counted).

The peak is the largest ``live + allocated + body`` seen. Worked example (f32, no donation)::

    y = x @ w      # x: 4 KiB, w: 4 KiB, y: 4 KiB -> live 8 KiB + 4 KiB = 12 KiB
    z = y @ w      # + z 4 KiB = 16 KiB, then y is freed                 -> peak 16 KiB
"""
from __future__ import annotations

from typing import Optional, Sequence

import attrs
from jax.extend.core import Literal

from ..program.program_index import Body, ProgramIndex
from ..ops import facts_of
from .counting import fusible_producer, nbytes
from .fusion import Fusion, fusion_of


@attrs.frozen
class Memory:
    peak: int
    arguments: int
    outputs: int


def peak_memory(index: ProgramIndex, donated: Sequence[bool], fusions: Optional[dict] = None) -> Memory:
    """The peak of the program ``index`` indexes (its flat inputs ``donated`` or not);
    ``fusions``: a ``fusion_of`` cache shared with the cost walk."""
    body = index.root
    jaxpr = body.jaxpr
    args = sum(nbytes(v.aval) for v in jaxpr.invars)
    outs = {}
    fusion = fusion_of(body, fusions)
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            outs[fusion.root(v)] = nbytes(v.aval)
    peak = _peak(index, body, fusion, top=True, donated=donated, fusions=fusions)
    return Memory(peak, args, sum(outs.values()))


def _peak(index: ProgramIndex, body: Body, fusion: Fusion, top: bool, donated: Sequence[bool] = (),
          fusions: Optional[dict] = None) -> int:
    """Peak bytes of one execution of ``body``; for a body (top=False) its parameters are
    counted as 0 (they are the enclosing loop's operands)."""
    jaxpr, eqns = body.jaxpr, body.equations
    n = len(eqns)
    last: dict = {}
    size: dict = {}
    held = set()  # buffers that are never freed
    live = 0
    for k, v in enumerate(jaxpr.invars):
        size[v] = nbytes(v.aval) if top else 0
        live += size[v]
        if top and not (k < len(donated) and donated[k]):
            held.add(v)
    for v in jaxpr.constvars:
        size[v] = nbytes(v.aval)
        live += size[v]
        held.add(v)
    # a fused equation runs inside the kernel of the materialized result it feeds: its operands
    # stay live until that kernel (the last consumer of its fused results) has run
    position = {id(e): i for i, e in enumerate(eqns)}
    end = list(range(n))
    for i in range(n - 1, -1, -1):
        eqn = eqns[i]
        fused = [v for v in eqn.outvars if fusion.root(v) is v and not fusion.materialized(v)]
        for v in fused:
            for c in fusion.consumers.get(v, ()):
                end[i] = max(end[i], end[position[id(c)]])
    for i, eqn in enumerate(eqns):
        for v in eqn.invars:
            if not isinstance(v, Literal):
                r = fusion.root(v)
                last[r] = max(last.get(r, -1), end[i])
    for v in jaxpr.outvars:
        if not isinstance(v, Literal):
            held.add(fusion.root(v))
    free_at: dict = {}
    for r, i in last.items():
        free_at.setdefault(i, []).append(r)
    peak = live
    for i, eqn in enumerate(eqns):
        new = []
        for v in eqn.outvars:
            r = fusion.root(v)
            if r is v and fusion.materialized(v):
                size[v] = nbytes(v.aval)
                new.append(v)
        dying = [r for r in free_at.get(i, ()) if r not in held and r in size]
        alloc = sum(size[v] for v in new)
        if (fusible_producer(eqn) or facts_of(eqn.primitive.name).inplace) and new:
            free_sizes = sorted((size[r] for r in dying), reverse=True)
            for v in sorted(new, key=lambda v: -size[v]):  # results written over dying operands
                if size[v] in free_sizes:
                    free_sizes.remove(size[v])
                    alloc -= size[v]
                    dying.remove(next(r for r in dying if size[r] == size[v]))  # its buffer is v's now
        extra = max((_body_peak(index, b, fusions) for b in index.subs(body.entries[i])), default=0)
        peak = max(peak, live + alloc + extra)
        live += alloc
        for r in dying:
            live -= size[r]
        for v in new:
            if v not in last and v not in held:  # dead result
                live -= size[v]
    return peak


def _body_peak(index: ProgramIndex, body: Body, fusions: Optional[dict] = None) -> int:
    return _peak(index, body, fusion_of(body, fusions), top=False, fusions=fusions)
