"""dot_general: batch-matched local dots, partial sums over sharded contracting dims.

    x [B,D]{x,-} @ W1 [D,H]{-,y} -> [B,H]{x,y}     local dot, no collective
    h [B,H]{x,y} @ W2 [H,D]{y,-} -> [B,D]{x,-}     local dot, partial over y (one all-reduce
                                                    when a consumer needs the sum)
    [M,K]{-,y} @ [K,N]{y,-} -> [M,N]{-,y}          local dot + reduce-scatter over y

The contracting factor keeps the operands' sharding when both already agree on it (no
operand moves); otherwise the output's wanted sharding decides and the operands follow.
Padding of uneven contracting dims is zeroed on both sides.
"""
from __future__ import annotations


from ..ops.rule import PASS, REDUCTION
from .context import Ctx
from .factors import choose, targets
from .registry import handler
from .reshard import reshard


@handler("dot")
def dot(ctx: Ctx, op, rule, args, want):
    lhs, rhs = args
    (lc, rc), _ = op.params["dimension_numbers"]
    contracting = [f for f, fac in enumerate(rule.factors) if fac.kind == REDUCTION]
    agree = all(lhs.dims[i] and lhs.dims[i] == rhs.dims[j] for i, j in zip(lc, rc)) and contracting
    fa = choose(ctx.sizes, rule, [a for a in args], want, kinds=(PASS, REDUCTION),
                operand_first=contracting if agree else ())
    tl, tr = targets(ctx.sizes, rule, fa, rule.operands)
    (to,) = targets(ctx.sizes, rule, fa, rule.results)
    # a partial operand may stay partial (the dot is linear in it) unless the other uses its axes
    keep_l = bool(lhs.partial) and not rhs.partial and not (set(lhs.partial) & {a for d in tr for a in d})
    keep_r = bool(rhs.partial) and not lhs.partial and not (set(rhs.partial) & {a for d in tl for a in d})
    L = reshard(ctx, lhs, tl, keep_partial=keep_l)
    R = reshard(ctx, rhs, tr, keep_partial=keep_r)
    red = [a for f in contracting for a in fa.get(f, ())]
    xl, xr = L.x, R.x
    if red:
        xl = ctx.mask(L, lc, 0)
        xr = ctx.mask(R, rc, 0)
    y = op.primitive.bind(xl, xr, **op.params)
    partial = tuple(L.partial) + tuple(R.partial) + tuple(red)
    return [ctx.pv(y, op.outputs[0].shape, to, partial)]
