"""shard_map (a manual SPMD region, Shardy's ``sdy.manual_computation``) inside a gp.spmd function.

The region's boundary shardings are fixed by its specs: the tracer puts a ``gp.annotate`` of
each ``in_specs`` entry on each operand and of each ``out_specs`` entry on each result
(frontend/manual.py), so propagation flows across the boundary from those fixed shardings. The
op itself relates nothing: every operand and result dim is a factor of its own, each tensor
an edge of its own (its shardings are the annotations'), so the rule never moves a sharding
through the region::

    shard_map  a [8,4] in P("x", None), b [4] in P()  ->  c [4,16] out P(None, "y")
               "[i,j], [k] -> [l,m]"   (every tensor its own edge)

Its body runs per device as the user wrote it (partitioner/manual_handler.py).
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import OTHER, OpRule, RuleBuilder

MANUAL = "shard_map"


@register(MANUAL, handler="manual")
def manual(op) -> OpRule:
    b = RuleBuilder()
    for v in op.inputs:
        b.operand(b.factors(v.shape))
    for v in op.outputs:
        b.result(b.factors(v.shape))
    return b.build(OTHER, edges=True)


declare(MANUAL, facts=F.OpFacts(F.PER_OUTPUT))
