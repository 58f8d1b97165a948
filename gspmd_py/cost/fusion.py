"""Which values of a jaxpr reach memory, under XLA-style loop fusion.

XLA fuses chains of elementwise and layout ops (and the producers of a reduction) into
one kernel: their intermediates live in registers, not in memory. The per-device program
is a jaxpr, so the cost model decides it the same way for every equation:

* a value *aliases* its operand when its op is an identity or a reshape (the same buffer);
* a buffer is *materialized* unless it is produced by a fusible op and every consumer (of
  it or of its aliases) is a fusible op or a reduction, and it is not an output.

It reads one body of the program index (program/program_index.py): its equations in
order and its jaxpr's inputs and outputs.

    >>> import jax, jax.numpy as jnp
    >>> from gspmd_py.program.program_index import ProgramIndex
    >>> closed = jax.make_jaxpr(lambda a, b: jnp.tanh(a @ b).sum())(jnp.ones((8, 16)), jnp.ones((16, 4)))
    >>> body = ProgramIndex.build(closed, None, str).root
    >>> f = Fusion(body)
    >>> [f.materialized(e.eqn.outvars[0]) for e in body.entries]     # dot, tanh (fused into the sum), sum
    [True, False, True]
"""
from __future__ import annotations

from typing import Optional

from jax.extend.core import Literal

from ..ops import facts as F
from ..ops import facts_of
from .counting import fusible_consumer, fusible_producer, is_alias, nbytes


def fusion_of(body, cache: Optional[dict] = None) -> "Fusion":
    """``Fusion(body)``, made once per body for one ``cache`` (a Fusion is never changed once
    made: the cost walk and the peak-memory walk of one program share it)."""
    if cache is None:
        return Fusion(body)
    got = cache.get(id(body))
    if got is None or got[0] is not body:
        got = cache[id(body)] = (body, Fusion(body))
    return got[1]


class Fusion:
    """Buffers of one body of the program index: ``root(v)`` (the buffer v lives in),
    ``materialized(v)``."""

    def __init__(self, body):
        jaxpr, eqns = body.jaxpr, body.equations
        self._root: dict = {}
        self._producer: dict = {}
        consumers: dict = {}
        for eqn in eqns:
            alias = is_alias(eqn) and len(eqn.invars) >= 1 and not isinstance(eqn.invars[0], Literal)
            for k, v in enumerate(eqn.outvars):
                self._producer[v] = eqn
                if alias and k < len(eqn.invars):
                    self._root[v] = self.root(eqn.invars[k])
            if not alias:
                for v in eqn.invars:
                    if not isinstance(v, Literal):
                        consumers.setdefault(self.root(v), []).append(eqn)
        self._mat: dict = {}
        boundary = {self.root(v) for v in jaxpr.outvars if not isinstance(v, Literal)}
        boundary |= set(jaxpr.invars) | set(jaxpr.constvars)
        for eqn in eqns:
            for v in eqn.outvars:
                r = self.root(v)
                if r is not v:
                    continue
                fused = (fusible_producer(eqn) and r not in boundary
                         and all(fusible_consumer(c) for c in consumers.get(r, ())))
                self._mat[r] = not fused
        self.consumers = consumers

    def root(self, v):
        return self._root.get(v, v)

    def producer(self, v):
        return self._producer.get(v)

    def materialized(self, v) -> bool:
        if isinstance(v, Literal):
            return False
        return self._mat.get(self.root(v), True)

    def read_bytes(self, eqn) -> int:
        """Bytes an equation reads from memory (its materialized operands; ``OpFacts.access``)."""
        access = facts_of(eqn.primitive.name).access
        if access == F.UPDATE:
            return nbytes(eqn.invars[1].aval)
        if access == F.SCATTER_UPDATE:
            return sum(nbytes(v.aval) for v in eqn.invars[1:]) + nbytes(eqn.invars[2].aval)
        out = sum(nbytes(v.aval) for v in eqn.outvars)
        total = 0
        for k, v in enumerate(eqn.invars):
            if not self.materialized(v):
                continue
            b = nbytes(v.aval)
            if access == F.WINDOW_READ and k == 0:
                b = min(b, out)  # reads only the window it takes
            total += b
        return total

    def write_bytes(self, eqn) -> int:
        access = facts_of(eqn.primitive.name).access
        if access in (F.UPDATE, F.SCATTER_UPDATE):
            upd = eqn.invars[1] if access == F.UPDATE else eqn.invars[2]
            return nbytes(upd.aval)  # in place
        return sum(nbytes(v.aval) for v in eqn.outvars if self.materialized(v) and self.root(v) is v)

    def launches(self, eqn) -> int:
        """Kernels this equation launches: one per materialized result (a fusion's root)."""
        return int(any(self.materialized(v) and self.root(v) is v for v in eqn.outvars))
