"""Ops computed whole on every device (key manipulation, unbatched linear algebra, generic
reductions): every factor needs replication.

    random_seed  i32[] -> key[]      "[] -> []"

The partitioner runs them on replicated operands and slices the result locally; when that
moves or recomputes a sharded tensor it reports a replicated fallback.
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import OpRule, whole

# (key arrays' own ops over their batch dims: ops/keys.py)
RANDOM = ("random_seed", "threefry2x32", "rng_bit_generator", "rng_uniform", "random_gamma")
# (batched linear algebra and FFT: ops/linalg.py)
LINALG = ("custom_linear_solve", "linear_solve", "cholesky_update", "ormqr", "symmetric_product")


__all__ = ["whole", "replicated"]


@register(*RANDOM, *LINALG, "reduce", "argsort", "optimization_barrier", handler="replicated")
def replicated(op) -> OpRule:
    return whole(op)


declare("threefry2x32", facts=F.OpFacts(F.PER_OUTPUT, fusion=F.FUSIBLE))
declare(*(r for r in RANDOM if r != "threefry2x32"), *LINALG, "reduce", "argsort",
        facts=F.OpFacts(F.PER_OUTPUT))
declare("optimization_barrier", facts=F.OpFacts(F.ZERO, alias=F.ALWAYS))
