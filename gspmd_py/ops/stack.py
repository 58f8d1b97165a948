"""stack, unstack, tile (jax >= 0.7 emits them as primitives: ``jnp.stack``, ``jnp.tile``,
the transpose of stack) and the operand-less ``empty`` / ``platform_index``.

    stack   [m,n], [m,n] axis=0 -> [2,m,n]    "[i,j], [i,j] -> [s,i,j]"   s: pass (a result-only
            factor: each device stacks its local blocks and keeps its rows of s, no communication)
    unstack [2,m,n] axis=0 -> [m,n], [m,n]    "[s,i,j] -> [i,j], [i,j]"   s: need_replication
    tile    [m,n] reps=(2,3) -> [2m,3n]       "[i,j] -> [(r i),(t j)]"    r, t: the repeats (result
            only); as a reshape's dim, a minor factor is sharded only once the major one is full,
            so every device tiles its local block ``reps / shards-of-the-repeat-factor`` times
    empty   -> [m,n] (contents unspecified)   "-> [i,j]"
    platform_index -> []                      "-> []"  (jnp.diag: picks a cond branch per platform)
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import NEED_REPLICATION, OTHER, OpRule, RuleBuilder


@register("stack", handler="stack")
def stack(op) -> OpRule:
    axis = op.params["axis"]
    b = RuleBuilder()
    fs = b.factors(op.inputs[0].shape)
    s = b.factor(len(op.inputs))
    for _ in op.inputs:
        b.operand(fs)
    return b.result(fs[:axis] + [s] + fs[axis:]).build(OTHER)


@register("unstack", handler="generic")
def unstack(op) -> OpRule:
    axis = op.params["axis"]
    src = op.inputs[0].shape
    b = RuleBuilder()
    fs = [b.factor(n, NEED_REPLICATION) if d == axis else b.factor(n) for d, n in enumerate(src)]
    b.operand(fs)
    for _ in op.outputs:
        b.result(fs[:axis] + fs[axis + 1:])
    return b.build(OTHER)


@register("tile", handler="generic")
def tile(op) -> OpRule:
    b = RuleBuilder()
    in_f, out_f = [], []
    for n, r in zip(op.inputs[0].shape, op.params["reps"]):
        f = b.factor(n)
        in_f.append(f)
        out_f.append([b.factor(r), f] if r != 1 else [f])
    return b.operand(in_f).result(out_f).build(OTHER)


@register("empty", "empty2", "platform_index", handler="generic")
def no_operands(op) -> OpRule:
    b = RuleBuilder()
    for v in op.inputs:
        b.operand([None] * v.rank)
    for v in op.outputs:
        b.result(b.factors(v.shape))
    return b.build(OTHER)


def _local_tile(params: dict, shapes, local, out_local) -> dict:
    """Each device tiles its block (reps / shards of the repeat factor) times."""
    return {**params, "reps": tuple(o // i if i else 1 for o, i in zip(out_local[0], local[0]))}


declare("stack", "unstack", "empty2", "platform_index", facts=F.OpFacts(F.PER_OUTPUT))
declare("tile", facts=F.OpFacts(F.PER_OUTPUT, localize=_local_tile))
declare("empty", facts=F.OpFacts(F.PER_OUTPUT, localize=F.local_shape))
