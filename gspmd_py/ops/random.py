"""random_bits: every output element is a function of the key and the element's index alone
(JAX's partitionable threefry, the default since jax 0.5), so each device draws just its
block of the result.

    random_bits  key[K] -> u32[K, m, n]     "[i] -> [i,j,k]"   key batch dims pass; j, k pass
                                             (result only: any sharding, computed locally)
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import OTHER, OpRule, RuleBuilder


@register("random_bits", handler="random_bits")
def random_bits(op) -> OpRule:
    key, out = op.inputs[0], op.outputs[0]
    b = RuleBuilder()
    fs = b.factors(out.shape)
    return b.operand(fs[:key.rank]).result(fs).build(OTHER)


declare("random_bits", facts=F.OpFacts(F.PER_OUTPUT, fusion=F.FUSIBLE))
