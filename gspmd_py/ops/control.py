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

from .registry import register
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
    ins: list = [None] * len(op.inputs)
    outs: list = [None] * len(op.outputs)
    region: dict[int, list] = {}  # (region index, position in region_values of that region) -> dims

    def share(shape) -> list[int]:
        return b.factors(shape)

    if op.prim == "scan":
        (body,) = op.regions
        nc, ncar = op.params["num_consts"], op.params["num_carry"]
        nb_in = len(body.inputs)
        for i in range(nc):
            ins[i] = region[i] = share(op.inputs[i].shape)
        for i in range(ncar):
            fs = share(op.inputs[nc + i].shape)
            ins[nc + i] = outs[i] = region[nc + i] = region[nb_in + i] = fs
        for j, v in enumerate(body.inputs[nc + ncar:]):
            fs = share(v.shape)
            region[nc + ncar + j] = fs
            ins[nc + ncar + j] = [b.factor(op.inputs[nc + ncar + j].shape[0], NEED_REPLICATION)] + fs
        for j, v in enumerate(body.outputs[ncar:]):
            fs = share(v.shape)
            region[nb_in + ncar + j] = fs
            outs[ncar + j] = [b.factor(op.outputs[ncar + j].shape[0], NEED_REPLICATION)] + fs
    elif op.prim == "while":
        cond, body = op.regions
        cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
        c_in, b_in = len(cond.inputs), len(body.inputs)
        base_b = c_in + len(cond.outputs)  # body values start after cond's params and predicate
        for i in range(cn):
            ins[i] = region[i] = share(op.inputs[i].shape)
        for i in range(bn):
            ins[cn + i] = region[base_b + i] = share(op.inputs[cn + i].shape)
        for i in range(len(op.outputs)):
            fs = share(op.inputs[cn + bn + i].shape)
            ins[cn + bn + i] = outs[i] = fs
            region[cn + i] = region[base_b + bn + i] = region[base_b + b_in + i] = fs
        region[c_in] = [b.factor(s, NEED_REPLICATION) for s in cond.outputs[0].shape]
    else:  # cond
        ins[0] = [b.factor(s, NEED_REPLICATION) for s in op.inputs[0].shape]
        arg = [share(v.shape) for v in op.inputs[1:]]
        res = [share(v.shape) for v in op.outputs]
        for i, fs in enumerate(arg):
            ins[1 + i] = fs
        for i, fs in enumerate(res):
            outs[i] = fs
        base = 0
        for g in op.regions:
            for i in range(len(g.inputs)):
                region[base + i] = arg[i]
            for i in range(len(g.outputs)):
                region[base + len(g.inputs) + i] = res[i]
            base += len(g.inputs) + len(g.outputs)
    for d in ins:
        b.operand(d)
    for d in outs:
        b.result(d)
    for i in range(len(region_values(op))):
        b.result(region[i])
    return b.build(OTHER)
