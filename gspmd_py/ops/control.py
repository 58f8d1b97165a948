"""scan / while / cond: one rule ties each region op to its bodies' boundary values.

A region op's rule has, besides its own operands and results, *region tensors*: the
parameters and results of its bodies (``region_values(op)``, in that order), so that
propagation, the partitioner and the cost model see one contract for a loop::

    scan  consts c, carry h, xs [T,m]  ->  carry h', ys [T,n]
          body (c, h, x [m]) -> (h'', y [n])
          "[i], [j], [t,k] -> [j], [u,l] | [i], [j], [k] -> [j], [l]"
          c ~ body c (i); carry, body carry in/out, result carry share j (GSPMD: one sharding
          for the loop state); xs' rows ~ body x (k); ys' rows ~ body y (l); the scanned
          dims t, u: need_replication (the loop walks them)
    while cond consts ~ cond params; body consts ~ body params; carries ~ cond/body carry
          params ~ body results ~ results
    cond  operands ~ every branch's params; results ~ every branch's results; the branch
          index needs replication
"""
from __future__ import annotations

from ..core.jax_compat import scan_counts
from . import facts as F
from .registry import declare, register
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder

CONTROL = ("scan", "while", "cond")


def region_values(op) -> list:
    """The body boundary values a region op's rule covers after its operands and results."""
    out = []
    for g in op.regions:
        out.extend(g.inputs)
        out.extend(g.outputs)
    return out


@register(*CONTROL, handler="control")
def control(op) -> OpRule:
    b = RuleBuilder()
    known: dict[int, list[int]] = {}  # value id -> its factors: a value that appears twice (a body
    # result that is a body parameter, e.g. a carry saved as a residual) has ONE set of factors

    def tie(*vals) -> list[int]:
        fs = next((known[v.id] for v in vals if v.id in known), None)
        if fs is None:
            fs = b.factors(vals[0].shape)
        for v in vals:
            known.setdefault(v.id, fs)
        return fs

    def loop_dim(v) -> list[int]:
        return [b.factor(v.shape[0], NEED_REPLICATION)]

    ins: list = [None] * len(op.inputs)
    outs: list = [None] * len(op.outputs)
    if op.prim == "scan":
        (body,) = op.regions
        nc, ncar = scan_counts(op.params)
        for i in range(nc):
            ins[i] = tie(op.inputs[i], body.inputs[i])
        for i in range(ncar):
            ins[nc + i] = outs[i] = tie(op.inputs[nc + i], body.inputs[nc + i], body.outputs[i], op.outputs[i])
        for j, v in enumerate(body.inputs[nc + ncar:]):
            ins[nc + ncar + j] = loop_dim(op.inputs[nc + ncar + j]) + tie(v)
        for j, v in enumerate(body.outputs[ncar:]):
            outs[ncar + j] = loop_dim(op.outputs[ncar + j]) + tie(v)
    elif op.prim == "while":
        cond, body = op.regions
        cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
        for i in range(cn):
            ins[i] = tie(op.inputs[i], cond.inputs[i])
        for i in range(bn):
            ins[cn + i] = tie(op.inputs[cn + i], body.inputs[i])
        for i in range(len(op.outputs)):
            ins[cn + bn + i] = outs[i] = tie(op.inputs[cn + bn + i], cond.inputs[cn + i], body.inputs[bn + i],
                                             body.outputs[i], op.outputs[i])
        known.setdefault(cond.outputs[0].id, [b.factor(s, NEED_REPLICATION) for s in cond.outputs[0].shape])
    else:  # cond
        ins[0] = [b.factor(s, NEED_REPLICATION) for s in op.inputs[0].shape]
        for i, v in enumerate(op.inputs[1:]):
            ins[1 + i] = tie(v, *(g.inputs[i] for g in op.regions))
        for i, v in enumerate(op.outputs):
            outs[i] = tie(v, *(g.outputs[i] for g in op.regions))
    for d in ins:
        b.operand(d)
    for d in outs:
        b.result(d)
    for v in region_values(op):
        b.result(known[v.id] if v.id in known else tie(v))
    return b.build(OTHER, edges=True)  # positions are independent: an axis may shard each of them


declare("scan", facts=F.OpFacts(F.PER_OUTPUT, region=F.LOOP))
declare("while", facts=F.OpFacts(F.PER_OUTPUT, region=F.LOOP, inplace=True))  # a loop's carry is updated in place
declare("cond", facts=F.OpFacts(F.PER_OUTPUT))
