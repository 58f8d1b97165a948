"""Reductions, arg-reductions, scans along a dim, sort and top_k.

    reduce_sum  [m,n] axes=(1,) -> [m]        "[i,j] -> [i]"      j: reduction(sum): partial sums
    reduce_max  [m,n] axes=(0,) -> [n]        "[i,j] -> [j]"      i: reduction(max): all-reduce max
    argmax      [m,n] axes=(1,) -> [m]        "[i,j] -> [i]"      j: reduction(argmax): (value, index)
                                                                  candidates of every shard combined
    cumsum      [m,n] axis=0    -> [m,n]      "[i,j] -> [i,j]"    i: prefix (local scan + the carried
                                                                  totals of the shards before)
    sort        [m,n] dimension=1 -> [m,n]    "[i,j] -> [i,j]"    j: need_replication, carried (the
                                                                  result keeps the operand's sharding;
                                                                  the sort runs with j's axes moved to i)
    top_k       [m,n] k         -> [m,k],[m,k] "[i,j] -> [i,l], [i,l]"   j, l: need_replication
                (approx_top_k: the same along its reduction_dimension)
"""
from __future__ import annotations

from ..core import dtypes
from . import facts as F
from .registry import declare, register
from .rule import NEED_REPLICATION, OTHER, PASS, PREFIX, REDUCTION, OpRule, RuleBuilder

REDUCERS = {"reduce_sum": "sum", "reduce_max": "max", "reduce_min": "min", "reduce_prod": "prod",
            "reduce_and": "and", "reduce_or": "or", "reduce_xor": "xor"}
SCANS = ("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")


def _reduction(op, how: str) -> OpRule:
    axes = set(op.params["axes"])
    src = op.inputs[0].shape
    b = RuleBuilder()
    # a complex max/min has no all-reduce (XLA's orders no complex numbers): reduce it whole
    whole = how in ("max", "min") and dtypes.is_complex(op.inputs[0].dtype)
    fs = [(b.factor(s, NEED_REPLICATION) if whole else b.factor(s, REDUCTION, how)) if d in axes else b.factor(s)
          for d, s in enumerate(src)]
    b.operand(fs)
    return b.result([f for d, f in enumerate(fs) if d not in axes]).build(OTHER)


@register(*REDUCERS, handler="reduce")
def reduce(op) -> OpRule:
    return _reduction(op, REDUCERS[op.prim])


@register("argmax", "argmin", handler="argreduce")
def argreduce(op) -> OpRule:
    return _reduction(op, op.prim)


@register(*SCANS, handler="cumulative")
def scan_along(op) -> OpRule:
    axis = op.params["axis"]
    b = RuleBuilder()
    fs = [b.factor(s, PREFIX if d == axis else PASS) for d, s in enumerate(op.inputs[0].shape)]
    return b.operand(fs).result(fs).build(OTHER)


@register("sort", handler="along_dim")
def sort(op) -> OpRule:
    dim = op.params["dimension"]
    b = RuleBuilder()
    fs = [b.factor(s, NEED_REPLICATION, carried=True) if d == dim else b.factor(s)
          for d, s in enumerate(op.inputs[0].shape)]
    for _ in op.inputs:
        b.operand(fs)
    for _ in op.outputs:
        b.result(fs)
    return b.build(OTHER)


@register("top_k", "approx_top_k", handler="along_dim")
def top_k(op) -> OpRule:
    src = op.inputs[0].shape
    last = op.params["reduction_dimension"] % len(src) if op.prim == "approx_top_k" else len(src) - 1
    b = RuleBuilder()
    # (carried: its axes may move onto another sharded dim for the local top_k, as a sort's)
    fs = [b.factor(s, NEED_REPLICATION, carried=True) if d == last else b.factor(s) for d, s in enumerate(src)]
    k = b.factor(op.outputs[0].shape[last], NEED_REPLICATION)
    b.operand(fs)
    for _ in op.outputs:
        b.result(fs[:last] + [k] + fs[last + 1:])
    return b.build(OTHER)


declare("reduce_sum", facts=F.OpFacts(F.REDUCTION_FLOPS, fusion=F.FUSED_CONSUMER, linearity=F.MOVE))
declare(*(r for r in REDUCERS if r != "reduce_sum"), "argmax", "argmin",
        facts=F.OpFacts(F.REDUCTION_FLOPS, fusion=F.FUSED_CONSUMER))
declare(*(s for s in SCANS if s != "cumlogsumexp"), facts=F.OpFacts(F.CUMULATIVE_FLOPS))
declare("cumlogsumexp", facts=F.OpFacts(F.CUMULATIVE_FLOPS, transcendental=True))
declare("sort", facts=F.OpFacts(F.SORT_FLOPS))
declare("top_k", facts=F.OpFacts(F.TOP_K_FLOPS))
declare("approx_top_k", facts=F.OpFacts(F.PER_OUTPUT))
