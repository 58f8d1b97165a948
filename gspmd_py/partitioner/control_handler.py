"""scan / while / cond: the bodies are partitioned like the top level, inside one loop.

The control rule (ops/control.py) ties each operand to the body parameter it feeds and
each body result to the op result it makes, so the projection gives one sharding to a
loop's carry, body parameter, body result and loop result (GSPMD's rule for loops)::

    scan  carry c [{x},{}], xs [T,{y}]:  lax.scan over local arrays; the body is the
          partitioned body graph; the scanned dim of xs/ys stays whole.
    while carries as scan; the predicate is computed replicated.
    cond  every branch is partitioned to the same result shardings; lax.switch picks one.

Collectives inside a body run once per iteration; ``plan.collectives`` lists each once,
with the op inside the body that caused it.
"""
from __future__ import annotations

from jax import lax

from .context import Ctx
from .registry import handler
from .reshard import reshard


class _BodyTrace:
    """A fresh reshard cache while a body is traced: the body's tracers must not leak out."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx

    def __enter__(self):
        self.saved = self.ctx.reshard_cache
        self.ctx.reshard_cache = {}
        return self

    def __exit__(self, *exc):
        self.ctx.reshard_cache = self.saved
        return False


def _run(ctx: Ctx, graph, ins):
    from .program import run_graph  # the driver imports this module

    return run_graph(ctx, graph, ins)


def _region_dims(op, plan):
    """Per region: (parameter dims, result dims) from the projection's region tensors."""
    dims = list(plan.results[len(op.outputs):])
    out = []
    for g in op.regions:
        ins, dims = dims[:len(g.inputs)], dims[len(g.inputs):]
        outs, dims = dims[:len(g.outputs)], dims[len(g.outputs):]
        out.append((ins, outs))
    return out


def _pvs(ctx: Ctx, xs, values, dims):
    return [ctx.pv(x, v.shape, d, dtype=v.dtype) for x, v, d in zip(xs, values, dims)]


@handler("control")
def control(ctx: Ctx, op, rule, plan, args):
    return {"scan": _scan, "while": _while, "cond": _cond}[op.prim](ctx, op, plan, args)


def _scan(ctx: Ctx, op, plan, args):
    body = op.regions[0]
    nc, ncar = op.params["num_consts"], op.params["num_carry"]
    ((in_d, out_d),) = _region_dims(op, plan)
    consts = args[:nc]
    carry_dims = list(plan.results[:ncar])

    def step(carry, x):
        with _BodyTrace(ctx):
            ins = list(consts) + _pvs(ctx, carry, body.inputs[nc:nc + ncar], carry_dims)
            ins += _pvs(ctx, x, body.inputs[nc + ncar:], in_d[nc + ncar:])
            outs = _run(ctx, body, ins)
            new = [reshard(ctx, o, d).x for o, d in zip(outs[:ncar], carry_dims)]
            ys = [reshard(ctx, o, d).x for o, d in zip(outs[ncar:], out_d[ncar:])]
        return new, ys

    carry, ys = lax.scan(step, [a.x for a in args[nc:nc + ncar]], [a.x for a in args[nc + ncar:]],
                         length=op.params["length"], reverse=op.params["reverse"], unroll=op.params.get("unroll", 1))
    return _pvs(ctx, list(carry) + list(ys), op.outputs, plan.results)


def _while(ctx: Ctx, op, plan, args):
    cond_g, body_g = op.regions
    cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
    (c_in, _), (b_in, _) = _region_dims(op, plan)
    cconsts, bconsts = args[:cn], args[cn:cn + bn]
    carry_dims = list(plan.results)

    def cond_fn(carry):
        with _BodyTrace(ctx):
            ins = list(cconsts) + _pvs(ctx, carry, cond_g.inputs[cn:], c_in[cn:])
            (pred,) = _run(ctx, cond_g, ins)
            return reshard(ctx, pred, ()).x

    def body_fn(carry):
        with _BodyTrace(ctx):
            ins = list(bconsts) + _pvs(ctx, carry, body_g.inputs[bn:], b_in[bn:])
            outs = _run(ctx, body_g, ins)
            return [reshard(ctx, o, d).x for o, d in zip(outs, carry_dims)]

    out = lax.while_loop(cond_fn, body_fn, [a.x for a in args[cn + bn:]])
    return _pvs(ctx, out, op.outputs, carry_dims)


def _cond(ctx: Ctx, op, plan, args):
    regions = _region_dims(op, plan)
    want = list(plan.results)

    def make(g, in_d):
        def branch(*locals_):
            with _BodyTrace(ctx):
                outs = _run(ctx, g, _pvs(ctx, locals_, g.inputs, in_d))
                return [reshard(ctx, o, d).x for o, d in zip(outs, want)]
        return branch

    out = lax.switch(args[0].x, [make(g, in_d) for g, (in_d, _) in zip(op.regions, regions)], *[a.x for a in args[1:]])
    return _pvs(ctx, out, op.outputs, want)
