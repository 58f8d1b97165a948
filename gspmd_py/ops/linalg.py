"""Batched linear algebra (and FFT): the leading batch dims are independent problems, the
matrix (core) dims are one problem each.

    cholesky  f32[b,n,n] -> [b,n,n]                  "[i,j,k] -> [i,l,m]"  j,k,l,m: need_replication
    eigh      f32[b,n,n] -> [b,n,n], [b,n]           batch i passes, every core dim whole
    triangular_solve  [b,m,m], [b,m,n] -> [b,m,n]    batch i shared by every operand and result
    fft       c64[b,h,w] fft_lengths=(h,w) -> [b,h,w]   (core = the transformed dims)

Every tensor of the op starts with the same batch dims (pass factors, shared by all of
them); the rest of each tensor is its core, whole on every device. A device holding a block
of the batch factors every matrix of its block: no communication, as XLA partitions them.
An op whose tensors do not all start with the batch shape, or with no batch dims, is
computed whole (ops/replicated.py's rule, reported when that moves a sharded tensor).
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .replicated import whole
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder

# primitive -> rank of its first operand's core (the dims after the batch dims)
CORE_RANK = {"cholesky": 2, "eigh": 2, "svd": 2, "qr": 2, "geqrf": 2, "geqp3": 2, "lu": 2, "eig": 2, "schur": 2,
             "hessenberg": 2, "tridiagonal": 2, "triangular_solve": 2, "householder_product": 2,
             "lu_pivots_to_permutation": 1, "tridiagonal_solve": 1}
BATCHED = tuple(CORE_RANK) + ("fft",)


def batch_rank(op) -> int:
    """How many leading dims of every tensor are the op's batch dims (0: none, or not all alike)."""
    core = len(op.params["fft_lengths"]) if op.prim == "fft" else CORE_RANK[op.prim]
    nb = op.inputs[0].rank - core
    if nb <= 0:
        return 0
    batch = tuple(op.inputs[0].shape[:nb])
    if any(tuple(v.shape[:nb]) != batch for v in (*op.inputs, *op.outputs)):
        return 0
    return nb


@register(*BATCHED, handler="batched")
def batched(op) -> OpRule:
    nb = batch_rank(op)
    if not nb:
        return whole(op)
    b = RuleBuilder()
    fs = b.factors(op.inputs[0].shape[:nb])
    for v in op.inputs:
        b.operand(fs + [b.factor(s, NEED_REPLICATION) for s in v.shape[nb:]])
    for v in op.outputs:
        b.result(fs + [b.factor(s, NEED_REPLICATION) for s in v.shape[nb:]])
    return b.build(OTHER)


declare(*(p for p in BATCHED if p not in ("fft", "lu_pivots_to_permutation")), facts=F.OpFacts(F.FACTOR_FLOPS))
declare("fft", facts=F.OpFacts(F.FFT_FLOPS))
declare("lu_pivots_to_permutation", facts=F.OpFacts(F.PER_OUTPUT))
