"""shard_map regions (ops/manual.py): the operands resharded to the in_specs, the body run
per device as the user wrote it (manual_body.py), the results in the out_specs' layouts.

The tracer annotated the region's operands with its in_specs and its results with its
out_specs (frontend/manual.py), so the driver usually hands the operands over in those
layouts already; the reshard here goes through the one cached reshard, a no-op then::

    shard_map(a [8,4] P("x", None)) -> c [4,16] P(None, "y"), body psum over "x"
        a_local [4,4] (reshard to P("x", None)); body: psum(a_local, "x"), ...;
        c_local [4,4] held as P(None, "y")

A user axis the plan splits into fine sub-axes ("y" as "y:0", "y:1") is their tuple in the
body's collectives. The body's collectives are the program's own equations, under the
region op's scope: ``plan.collectives`` and the cost model read them as any other.
"""
from __future__ import annotations

from ..frontend import manual as spec
from ..core.jax_compat import open_jaxpr
from .context import Ctx
from .manual_body import run_body
from .registry import handler
from .reshard import reshard


def axis_map(ctx: Ctx) -> dict[str, tuple[str, ...]]:
    """Each mesh axis -> its fine axes, major first."""
    return {a: tuple(n for n in ctx.fine.names if ctx.fine.owner[n][0] == a) for a in ctx.fine.mesh.axis_names}


def _fine(amap, dims) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(f for a in axes for f in amap[a]) for axes in dims)


@handler("manual")
def manual(ctx: Ctx, op, rule, plan, args):
    spec.check(op.params, ctx.fine.mesh, op.source)
    amap = axis_map(ctx)
    ins = [_fine(amap, d) for d in spec.in_dims(op.params, [v.rank for v in op.inputs])]
    outs = [_fine(amap, d) for d in spec.out_dims(op.params, [v.rank for v in op.outputs])]
    xs = [reshard(ctx, a, d).x for a, d in zip(args, ins)]
    body, consts = open_jaxpr(spec.body(op.params))
    ys = run_body(body, consts, xs, amap, op.source)
    return [ctx.pv(y, v.shape, d, dtype=v.dtype) for y, v, d in zip(ys, op.outputs, outs)]
