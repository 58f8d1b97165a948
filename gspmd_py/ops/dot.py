"""dot_general: batch, free and contracting factors.

    [b,m,k] x [b,k,n] -> [b,m,n]     "[i,j,k], [i,k,l] -> [i,j,l]"   k: reduction(sum)
    bool operands: the contraction is an OR of ANDs, so k is reduction(or)

A sharded contracting factor yields partial sums (kept partial until a consumer needs the
reduced value). Propagation prefers batch factors, then the larger operand's factors.
"""
from __future__ import annotations

from ..core.dtypes import is_bool
from . import facts as F
from .registry import declare, register
from .rule import DOT, REDUCTION, OpRule, RuleBuilder


@register("dot_general", handler="dot")
def dot_general(op) -> OpRule:
    (lc, rc), (lb, rb) = op.params["dimension_numbers"]
    lhs, rhs = op.inputs[0].shape, op.inputs[1].shape
    b = RuleBuilder()
    lhs_f: list = [None] * len(lhs)
    rhs_f: list = [None] * len(rhs)
    out: list = []
    for i, j in zip(lb, rb):
        f = b.factor(lhs[i])
        lhs_f[i] = rhs_f[j] = f
        out.append(f)
    reduce = "or" if is_bool(op.outputs[0].dtype) else "sum"
    for i, j in zip(lc, rc):
        f = b.factor(lhs[i], REDUCTION, reduce)
        lhs_f[i] = rhs_f[j] = f
    for i in range(len(lhs)):
        if lhs_f[i] is None:
            lhs_f[i] = b.factor(lhs[i])
            out.append(lhs_f[i])
    for j in range(len(rhs)):
        if rhs_f[j] is None:
            rhs_f[j] = b.factor(rhs[j])
            out.append(rhs_f[j])
    return b.operand(lhs_f).operand(rhs_f).result(out).build(DOT)


declare("dot_general", facts=F.OpFacts(F.DOT_FLOPS))
