"""scan / while / cond: the bodies are partitioned like the top level, inside one loop.

    scan  carry c [{x},{}], xs [T,{y}]:  lax.scan over local arrays; the body is the
          partitioned body graph; carries keep one sharding (propagation links the carry
          operand, body parameter, body result and loop result, REFERENCE 17); the scanned
          dim of xs/ys stays whole.
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


def _dims(ctx: Ctx, v):
    return ctx.want.get(v.id, ((),) * v.rank)


class _BodyTrace:
    """Isolates one body trace: a fresh reshard cache (inner tracers must not leak out),
    and records that a retrace (jax may trace a body twice) does not duplicate."""

    def __init__(self, ctx: Ctx):
        self.ctx = ctx
        self.marks = (len(ctx.collectives), len(ctx.fallbacks), len(ctx.notes))

    def __enter__(self):
        c = self.ctx
        del c.collectives[self.marks[0]:], c.fallbacks[self.marks[1]:], c.notes[self.marks[2]:]
        self.saved = c.reshard_cache
        c.reshard_cache = {}
        return self

    def __exit__(self, *exc):
        self.ctx.reshard_cache = self.saved
        return False


def _run(ctx: Ctx, graph, ins):
    from .program import run_graph  # the driver imports this module

    return run_graph(ctx, graph, ins)


@handler("control")
def control(ctx: Ctx, op, rule, args, want):
    return {"scan": _scan, "while": _while, "cond": _cond}[op.prim](ctx, op, args, want)


def _scan(ctx: Ctx, op, args, want):
    body = op.regions[0]
    nc, ncar = op.params["num_consts"], op.params["num_carry"]
    consts = [reshard(ctx, a, _dims(ctx, v)) for a, v in zip(args[:nc], body.inputs[:nc])]
    carry_dims = list(want[:ncar])
    xs_dims = [_dims(ctx, v) for v in body.inputs[nc + ncar:]]
    ys_dims = [tuple(w[1:]) for w in want[ncar:]]
    init = [reshard(ctx, a, d).x for a, d in zip(args[nc:nc + ncar], carry_dims)]
    xs = [reshard(ctx, a, ((),) + tuple(d)).x for a, d in zip(args[nc + ncar:], xs_dims)]
    guard = _BodyTrace(ctx)

    def step(carry, x):
        with guard:
            ins = list(consts)
            ins += [ctx.pv(c, v.shape, d) for c, v, d in zip(carry, body.inputs[nc:nc + ncar], carry_dims)]
            ins += [ctx.pv(xi, v.shape, d) for xi, v, d in zip(x, body.inputs[nc + ncar:], xs_dims)]
            outs = _run(ctx, body, ins)
            new = [reshard(ctx, o, d).x for o, d in zip(outs[:ncar], carry_dims)]
            ys = [reshard(ctx, o, d).x for o, d in zip(outs[ncar:], ys_dims)]
        return new, ys

    carry, ys = lax.scan(step, init, xs, length=op.params["length"], reverse=op.params["reverse"],
                         unroll=op.params.get("unroll", 1))
    res = [ctx.pv(c, v.shape, d) for c, v, d in zip(carry, op.outputs[:ncar], carry_dims)]
    res += [ctx.pv(y, v.shape, ((),) + d) for y, v, d in zip(ys, op.outputs[ncar:], ys_dims)]
    return res


def _while(ctx: Ctx, op, args, want):
    cond_g, body_g = op.regions
    cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
    cconsts = [reshard(ctx, a, _dims(ctx, v)) for a, v in zip(args[:cn], cond_g.inputs[:cn])]
    bconsts = [reshard(ctx, a, _dims(ctx, v)) for a, v in zip(args[cn:cn + bn], body_g.inputs[:bn])]
    carry_dims = list(want)
    init = [reshard(ctx, a, d).x for a, d in zip(args[cn + bn:], carry_dims)]
    cguard, bguard = _BodyTrace(ctx), None

    def cond_fn(carry):
        with cguard:
            ins = cconsts + [ctx.pv(c, v.shape, d) for c, v, d in zip(carry, cond_g.inputs[cn:], carry_dims)]
            (pred,) = _run(ctx, cond_g, ins)
            return reshard(ctx, pred, ()).x

    def body_fn(carry):
        nonlocal bguard
        bguard = bguard or _BodyTrace(ctx)
        with bguard:
            ins = bconsts + [ctx.pv(c, v.shape, d) for c, v, d in zip(carry, body_g.inputs[bn:], carry_dims)]
            outs = _run(ctx, body_g, ins)
            return [reshard(ctx, o, d).x for o, d in zip(outs, carry_dims)]

    out = lax.while_loop(cond_fn, body_fn, init)
    return [ctx.pv(c, v.shape, d) for c, v, d in zip(out, op.outputs, carry_dims)]


def _cond(ctx: Ctx, op, args, want):
    branches = op.regions
    index = reshard(ctx, args[0], ()).x
    in_dims = [_dims(ctx, v) for v in branches[0].inputs]
    xs = [reshard(ctx, a, d).x for a, d in zip(args[1:], in_dims)]
    guards = [_BodyTrace(ctx) for _ in branches]
    # each branch's records are kept: a later branch must not erase an earlier one's
    for i, g in enumerate(guards[1:], 1):
        g.marks = None

    def make(g, guard):
        def branch(*locals_):
            if guard.marks is None:
                guard.marks = (len(ctx.collectives), len(ctx.fallbacks), len(ctx.notes))
            with guard:
                ins = [ctx.pv(x, v.shape, d) for x, v, d in zip(locals_, g.inputs, in_dims)]
                outs = _run(ctx, g, ins)
                return [reshard(ctx, o, d).x for o, d in zip(outs, want)]
        return branch

    out = lax.switch(index, [make(g, gd) for g, gd in zip(branches, guards)], *xs)
    return [ctx.pv(o, v.shape, d) for o, v, d in zip(out, op.outputs, want)]
