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

from typing import Optional

import numpy as np
from jax import lax

from ..core import dtypes
from ..core.jax_compat import scan_counts
from ..ops import facts as F
from ..ops import facts_of
from .context import Ctx
from .partial import accumulate, join, reduce, zero_everywhere
from .pvalue import Partial, PValue
from .registry import handler
from .reshard import reshard


def _run(ctx: Ctx, graph, ins, keep: frozenset = frozenset()):
    from .program import run_graph  # the driver imports this module

    return run_graph(ctx, graph, ins, keep)


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
    nc, ncar = scan_counts(op.params)
    ((in_d, out_d),) = _region_dims(op, plan)
    consts = args[:nc]
    carry_dims = list(plan.results[:ncar])
    kept = [accumulated(ctx, body, nc + j, j, carry_dims[j]) for j in range(ncar)]
    keep = frozenset([body.outputs[j].id for j in range(ncar) if kept[j] is not None]
                     + [v.id for v in body.outputs[ncar:]])  # ys may leave each iteration partial

    def step(carry, x):
        with ctx.body_scope():
            params = body.inputs[nc:nc + ncar]
            ins = list(consts) + [ctx.pv(c, v.shape, d, p, v.dtype)
                                  for c, v, d, p in zip(carry, params, carry_dims, kept)]
            ins += _pvs(ctx, x, body.inputs[nc + ncar:], in_d[nc + ncar:])
            outs = _run(ctx, body, ins, keep)
            new = [_settle(ctx, o, d, p).x for o, d, p in zip(outs[:ncar], carry_dims, kept)]
            ys = [reshard(ctx, o, d, keep_partial=True) for o, d in zip(outs[ncar:], out_d[ncar:])]
            stacked[:] = [y.partial for y in ys]  # a ys slot partial in every iteration: reduced once, after
        return new, [y.x for y in ys]

    stacked: list = []  # the partial of each ys slot, as the body traced it
    init = [a.x if p is None else join(ctx, a.x, p, a.x.dtype, zero=zero_everywhere(v))
            for a, p, v in zip(args[nc:nc + ncar], kept, op.inputs[nc:nc + ncar])]
    carry, ys = lax.scan(step, init, [a.x for a in args[nc + ncar:]],
                         length=op.params["length"], reverse=op.params["reverse"], unroll=op.params.get("unroll", 1))
    return [ctx.pv(x, v.shape, d, p, v.dtype)
            for x, v, d, p in zip(list(carry) + list(ys), op.outputs, plan.results, kept + stacked)]


def accumulated(ctx: Ctx, body, i: int, j: int, dims) -> Optional[Partial]:
    """The partial sum a scan carry stays in across iterations, or None.

    A carry that only accumulates (its new value is ``carry + t``, the carry used nowhere
    else; jax.grad's transposed scan sums weight gradients so) of a ``t`` that arrives as a
    partial sum stays partial through the loop: the initial value joins as a partial (itself
    on the first device, -0.0 elsewhere), each iteration adds its partial term locally, and
    the sum is reduced once, where the loop's result is used, instead of once per iteration::

        scan carry g [{}], body g' = add_any(g, dot(x{x}, dy{x}))   ->  g partial-sum(x):
            no collective in the loop; one all-reduce over x after it

    ``t``'s partial is predicted from its projection (a reduction factor's axes that its
    sharding does not tile); the body checks it (``_settle``), so a wrong guess costs a
    reduction, never a wrong answer."""
    param, out = body.inputs[i], body.outputs[j]
    if sum(v is param for op in body.walk() for v in op.inputs) != 1 or param in body.outputs:
        return None
    if not dtypes.is_inexact(param.dtype) or accumulate(param.dtype, "sum") != np.dtype(param.dtype):
        return None
    terms = _sum_terms(out, param)
    if not terms or param not in terms:
        return None
    axes = set()
    for t in terms:
        if t is not param:
            axes |= set(_partial_axes(ctx, t))
    tiled = {a for d in dims for a in d}
    axes = tuple(a for a in ctx.fine.names if a in axes and a not in tiled)
    return Partial(axes, "sum") if axes else None


def _sum_terms(v, param, depth: int = 8) -> list:
    """The terms of ``v`` as a tree of add / add_any ops (``[v]`` itself when it is no sum)."""
    op = v.producer
    if v is param or op is None or op.prim not in ("add", "add_any") or depth <= 0:
        return [v]
    return [t for x in op.inputs for t in _sum_terms(x, param, depth - 1)]


def _partial_axes(ctx: Ctx, v, depth: int = 12) -> tuple[str, ...]:
    """The axes ``v`` will be a partial sum over, as the projections say: the sharded reduction
    factors of its producer and of what it carries a partial through (partial.py's moves,
    slices, zero pads; sums and selects of several partial terms), minus the axes ``v``'s
    own sharding tiles."""
    axes = _reduced_into(ctx, v, depth)
    want = {a for d in ctx.want.get(v.id, ()) for a in d}
    return tuple(a for a in ctx.fine.names if a in axes and a not in want)


_MOVES = (F.MOVE, F.ZERO_PAD)  # linearities carried through operand 0
_SUMS = (F.SUM, F.JOIN, F.SELECT)  # sums (and selects) of several partial terms


def _reduced_into(ctx: Ctx, v, depth: int) -> set[str]:
    op = v.producer
    if op is None or op.id not in ctx.plans or depth <= 0:
        return set()
    plan = ctx.plans[op.id]
    if plan.partial_axes and plan.partial_op != "sum":
        return set()
    axes = set(plan.partial_axes)
    lin = facts_of(op.prim).linearity
    if lin in _MOVES:
        axes |= _reduced_into(ctx, op.inputs[0], depth - 1) if op.inputs else set()
    elif lin in _SUMS:
        terms = op.inputs[1:] if op.prim == "select_n" else op.inputs
        for t in terms:
            axes |= _reduced_into(ctx, t, depth - 1)
    return axes


def _settle(ctx: Ctx, pv: PValue, dims, p: Optional[Partial]) -> PValue:
    """A body's carry output in the carry's layout, partial over exactly ``p`` (None: reduced)."""
    if p is None:
        return reshard(ctx, pv, dims)
    out = reshard(ctx, pv, dims, keep_partial=True)
    if out.partial == p:
        return out
    out = reduce(ctx, out)
    return ctx.pv(join(ctx, out.x, p, out.x.dtype), out.shape, out.dims, p, out.dtype)


def _while(ctx: Ctx, op, plan, args):
    cond_g, body_g = op.regions
    cn, bn = op.params["cond_nconsts"], op.params["body_nconsts"]
    (c_in, _), (b_in, _) = _region_dims(op, plan)
    cconsts, bconsts = args[:cn], args[cn:cn + bn]
    carry_dims = list(plan.results)

    def cond_fn(carry):
        with ctx.body_scope():
            ins = list(cconsts) + _pvs(ctx, carry, cond_g.inputs[cn:], c_in[cn:])
            (pred,) = _run(ctx, cond_g, ins)
            return reshard(ctx, pred, ()).x

    def body_fn(carry):
        with ctx.body_scope():
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
            with ctx.body_scope():
                outs = _run(ctx, g, _pvs(ctx, locals_, g.inputs, in_d))
                return [reshard(ctx, o, d).x for o, d in zip(outs, want)]
        return branch

    out = lax.switch(args[0].x, [make(g, in_d) for g, (in_d, _) in zip(op.regions, regions)], *[a.x for a in args[1:]])
    return _pvs(ctx, out, op.outputs, want)
