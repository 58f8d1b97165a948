"""The correct last resort: compute the op whole on every device.

Every operand is resharded to fully replicated, the original primitive runs with its
original parameters (region ops included: scan/while/cond bodies run unpartitioned),
and the driver slices the results to the wanted sharding locally. When this moves or
recomputes a sharded tensor it is reported, like XLA's "involuntary full
rematerialization" but loud: a PartitionWarning and a line in ``plan.report()``.
"""
from __future__ import annotations

from .context import Ctx
from .registry import handler
from .reshard import reshard


def replicate_all(ctx: Ctx, op, args, want, reason: str):
    sharded = any(a.dims and any(a.dims) or a.partial for a in args) or any(any(w) for w in want)
    if sharded:
        ctx.fallback(reason)
    xs = [reshard(ctx, a, ((),) * a.rank).x for a in args]
    outs = op.primitive.bind(*xs, **op.params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    return [ctx.pv(o, v.shape, ((),) * v.rank) for o, v in zip(outs, op.outputs)]


@handler("replicated")
def replicated(ctx: Ctx, op, rule, args, want):
    return replicate_all(ctx, op, args, want, f"{op.prim} has no partitioned form: computed replicated")

