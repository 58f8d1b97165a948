"""gspmd_rotate: ``jnp.roll`` by a static shift along one dim (shifts.py folds the forms that
write it as slices and a concatenate).

    gspmd_rotate[axis=0, shift=1] [S,m] -> [S,m]     "i,j -> i,j"   i: window (rows come from
                                                                    the shard(s) s rows before)

The rotated dim may stay sharded: each device's rows come from at most two shards (one when
the shift is a multiple of the shard size, or smaller than it), so the partitioned form is
one or two collective-permutes (partitioner/rotate_handler.py).
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import OTHER, PASS, WINDOW, OpRule, RuleBuilder


@register("gspmd_rotate", handler="rotate")
def rotate(op) -> OpRule:
    axis = op.params["axis"]
    b = RuleBuilder()
    fs = [b.factor(s, WINDOW if d == axis else PASS) for d, s in enumerate(op.inputs[0].shape)]
    return b.operand(fs).result(fs).build(OTHER)


declare("gspmd_rotate", facts=F.OpFacts(F.ZERO, linearity=F.MOVE))  # data movement: a partial passes
