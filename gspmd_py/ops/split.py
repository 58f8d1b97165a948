"""split: the transpose of concatenate (jax >= 0.6 emits it in gradients of concatenate).

    split [m] sizes=(3, 5) -> [3], [5]      "i -> i, i"   i: window (each piece is an offset slice)
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import OTHER, PASS, WINDOW, OpRule, RuleBuilder


@register("split", handler="split")
def split(op) -> OpRule:
    axis = op.params["axis"]
    src = op.inputs[0].shape
    b = RuleBuilder()
    fs = [b.factor(s, WINDOW if d == axis else PASS) for d, s in enumerate(src)]
    b.operand(fs)
    for _ in op.outputs:
        b.result(fs)
    return b.build(OTHER)


declare("split", facts=F.OpFacts(F.PER_OUTPUT))
