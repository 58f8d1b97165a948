"""Ops computed whole on every device (random number generation, control flow bodies,
anything whose result depends on every element in an order-sensitive way).

    random_bits  key[] -> u32[m,n]      "-> i j"   i, j: need_replication

The partitioner runs them on replicated operands and slices the result locally; it
reports each as a replicated fallback.
"""
from __future__ import annotations

from .registry import register
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder

RANDOM = ("random_seed", "random_bits", "random_wrap", "random_unwrap", "random_fold_in", "random_split",
          "threefry2x32", "random_clone")
CONTROL = ("scan", "while", "cond")


@register(*RANDOM, "custom_linear_solve", "linear_solve", "fft", "cholesky", "triangular_solve", "eig", "eigh",
          "lu", "qr", "svd", "reduce", "argsort", "optimization_barrier")
def replicated(op) -> OpRule:
    b = RuleBuilder()
    for v in op.inputs:
        b.operand([b.factor(s, NEED_REPLICATION) for s in v.shape])
    for v in op.outputs:
        b.result([b.factor(s, NEED_REPLICATION) for s in v.shape])
    return b.build(OTHER, handler="replicated")


@register(*CONTROL)
def control(op) -> OpRule:
    """Loop carries: operand carry i and result carry i share factors (GSPMD: carry, body
    parameter and body result have one sharding); other dims need replication."""
    b = RuleBuilder()
    ins = [[b.factor(s, NEED_REPLICATION) for s in v.shape] for v in op.inputs]
    outs = [[b.factor(s, NEED_REPLICATION) for s in v.shape] for v in op.outputs]
    if op.prim == "scan":
        nc, ncar = op.params["num_consts"], op.params["num_carry"]
        for i in range(ncar):
            shared = [b.factor(s) for s in op.inputs[nc + i].shape]
            ins[nc + i] = outs[i] = shared
    elif op.prim == "while":
        nc = op.params["cond_nconsts"] + op.params["body_nconsts"]
        for i in range(len(op.outputs)):
            shared = [b.factor(s) for s in op.inputs[nc + i].shape]
            ins[nc + i] = outs[i] = shared
    for d in ins:
        b.operand(d)
    for d in outs:
        b.result(d)
    return b.build(OTHER, handler="control")
