"""The correct last resort: compute the op whole on every device.

The op's rule makes every factor need replication, so its operands arrive fully
replicated; the original primitive runs with its original parameters and the driver
slices the results to the wanted sharding locally. When this moves or recomputes a
sharded tensor it is reported, like XLA's "involuntary full rematerialization" but loud:
a PartitionWarning and a line in ``plan.report()``.
"""
from __future__ import annotations

from ..ops.registry import has_rule
from .context import Ctx
from .registry import handler


def say_if_sharded(ctx: Ctx, op, how: str) -> None:
    """Report the op as a replicated fallback when it moves or recomputes a sharded tensor."""
    sharded_in = any(any(a.dims) or a.partial is not None for a in ctx.op.incoming)
    sharded_out = any(any(ctx.want.get(v.id, ())) for v in op.outputs)
    if sharded_in or sharded_out:
        ctx.fallback(f"{op.prim} has no partitioned form: {how}")


@handler("replicated")
def replicated(ctx: Ctx, op, rule, plan, args, how: str = "computed replicated"):
    if not has_rule(op.prim):  # a pure primitive gspmd_py has no rule for (ops/registry.py)
        by = f" (emitted by {op.scope.split('/')[0]!r})" if getattr(op, "scope", "") else ""
        how = f"gspmd_py has no sharding rule for this primitive{by}: computed whole on every device"
    say_if_sharded(ctx, op, how)
    outs = op.primitive.bind(*[a.x for a in args], **op.params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    return [ctx.pv(o, v.shape, ((),) * v.rank) for o, v in zip(outs, op.outputs)]


@handler("batched")
def batched(ctx: Ctx, op, rule, plan, args):
    """Batched linear algebra / FFT (ops/linalg.py): each device solves the problems of its
    block of the batch dims; the core dims arrive whole. Reported as a replicated fallback
    when no batch dim is sharded but a tensor is (every device then solves every problem)."""
    if not plan.factors:
        say_if_sharded(ctx, op, "computed replicated (no batch dim carries the sharding)")
    if op.prim == "fft":
        return [ctx.pv(_fft(op, args[0].x), op.outputs[0].shape, plan.results[0])]
    outs = op.primitive.bind(*[a.x for a in args], **op.params)
    outs = list(outs) if op.primitive.multiple_results else [outs]
    return [ctx.pv(o, v.shape, t) for o, v, t in zip(outs, op.outputs, plan.results)]


def _fft(op, x):
    """The fft on its local block with the size-1 batch dims dropped around it: XLA's CPU layout
    assignment may give a ``[1,n,m]`` operand a layout that is not dim-0 major (the size-1 dim
    lets it) when the result is then gathered, and its FFT then fails a RET_CHECK (also under
    jax.jit with the same shardings)."""
    n = len(op.params["fft_lengths"])
    lead = x.shape[:x.ndim - n]
    kept = tuple(s for s in lead if s != 1)
    if len(kept) == len(lead):
        return op.primitive.bind(x, **op.params)
    y = op.primitive.bind(x.reshape(kept + x.shape[len(lead):]), **op.params)
    return y.reshape(lead + y.shape[len(kept):])
