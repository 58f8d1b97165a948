"""Ops computed whole on every device (key manipulation, unbatched linear algebra): every
factor needs replication; and generic reductions (``lax.reduce`` with a body of its own,
which no all-reduce can combine), whole along the reduced dims only:

    random_seed  i32[] -> key[]      "[] -> []"
    reduce       [m,n], [] dimensions=(1,) -> [m]     "[i,j], [] -> [i]"   j: need_replication
                 (the kept dims stay sharded: each device reduces its own rows, as XLA's
                 partitioner does for a reduce whose reduced dims are unsharded)

The partitioner runs them on replicated operands and slices the result locally; when that
moves or recomputes a sharded tensor it reports a replicated fallback.
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder, whole

# (key arrays' own ops over their batch dims: ops/keys.py)
RANDOM = ("random_seed", "threefry2x32", "rng_bit_generator", "rng_uniform", "random_gamma")
# (batched linear algebra and FFT: ops/linalg.py)
LINALG = ("custom_linear_solve", "linear_solve", "cholesky_update", "ormqr", "symmetric_product")


__all__ = ["whole", "replicated", "generic_reduce"]


@register(*RANDOM, *LINALG, "argsort", "optimization_barrier", handler="replicated")
def replicated(op) -> OpRule:
    return whole(op)


@register("reduce", handler="generic")
def generic_reduce(op) -> OpRule:
    """``lax.reduce(operands, init_values, computation, dimensions)``: operands then one
    scalar init value each; one result per operand, the kept dims in order."""
    n = len(op.outputs)
    reduced = set(op.params["dimensions"])
    b = RuleBuilder()
    fs = [b.factor(s, NEED_REPLICATION) if d in reduced else b.factor(s) for d, s in enumerate(op.inputs[0].shape)]
    for _ in range(n):
        b.operand(fs)
    for _ in range(n):
        b.operand([])
    kept = [f for d, f in enumerate(fs) if d not in reduced]
    for _ in range(n):
        b.result(kept)
    return b.build(OTHER)


declare("threefry2x32", facts=F.OpFacts(F.PER_OUTPUT, fusion=F.FUSIBLE))
declare(*(r for r in RANDOM if r != "threefry2x32"), *LINALG, "reduce", "argsort",
        facts=F.OpFacts(F.PER_OUTPUT))
declare("optimization_barrier", facts=F.OpFacts(F.ZERO, alias=F.ALWAYS))
