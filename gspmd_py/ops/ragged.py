"""ragged_dot_general (``jax.lax.ragged_dot``: MoE grouped GEMMs): a dot whose lhs rows fall
into contiguous groups (``group_sizes``, rows [start_j, start_j + size_j)), each group
multiplied by its own rhs slice. Three modes, by where the lhs ragged dim sits:

    non-contracting  [m,k] x [g,k,n], [g] -> [m,n]     "[j,i], [k,i,l], [m] -> [j,l]"
                     m (the ragged rows): pass; k: reduction(sum); n: pass;
                     g (the rhs group dim): reduction(sum): a device holding groups
                     [g0, g1) multiplies only their rows, zeros elsewhere (rows of no
                     group are zeros in JAX too), so the result is a partial sum over g's axes
    contracting      [m,k] x [m,n], [g] -> [g,k,n]     "[i,j], [i,k], [m] -> [l,j,k]"
                     (the rhs gradient of the above) m: reduction(sum); g: pass (a device
                     computes its own groups)
    batch            [b,m,k] x [b,k,n], [g] -> [b,m,n]   b (ragged): need_replication

``group_sizes`` is read whole (its group dim: need_replication), since a device needs every
group's start to place its rows: a device holding rows [r0, r1) gives each group its overlap
with them (padding rows of uneven shards get none). Group sizes with batch dims (rank > 1)
keep the ragged and group factors whole (the other factors shard as a dot's do), and a
``group_offset`` keeps the whole op replicated (a reported fallback).
"""
from __future__ import annotations

from ..core.dtypes import is_bool
from . import facts as F
from .registry import declare, register
from .replicated import whole
from .rule import DOT, NEED_REPLICATION, PASS, REDUCTION, OpRule, RuleBuilder

NONCONTRACTING, CONTRACTING, BATCH = "noncontracting", "contracting", "batch"


def mode(params) -> tuple[str, int]:
    """(mode, lhs ragged dim) of a ragged_dot_general's params."""
    rdn = params["ragged_dot_dimension_numbers"]
    (lc, _), (lb, _) = rdn.dot_dimension_numbers
    r = rdn.lhs_ragged_dimensions[0]
    return (CONTRACTING if r in lc else BATCH if r in lb else NONCONTRACTING), r


def shardable(op) -> bool:
    """Can the ragged rows and the groups be split (rank-1 group sizes, no group offset)?"""
    return op.params.get("group_offset") is None and op.inputs[2].rank == 1


@register("ragged_dot_general", handler="ragged_dot")
def ragged_dot_general(op) -> OpRule:
    rdn = op.params["ragged_dot_dimension_numbers"]
    (lc, rc), (lb, rb) = rdn.dot_dimension_numbers
    kind, ragged = mode(op.params)
    gdims = tuple(rdn.rhs_group_dimensions)
    lhs, rhs, gs = (v.shape for v in op.inputs)
    split = shardable(op)
    if op.params.get("group_offset") is not None:
        return _whole(op)
    prefix = _prefix_dims(kind, len(lhs), ragged, lb, lc)[:len(gs) - 1]
    # lhs dims held whole: the ragged one unless it splits, contracting dims indexing the group sizes
    whole = {ragged} if not split or kind == BATCH else set()
    whole |= {d for d in prefix if d in lc}
    reduce = "or" if is_bool(op.outputs[0].dtype) else "sum"
    b = RuleBuilder()
    sizes: list[int] = []

    def factor(size: int, kind_: str = PASS) -> int:
        sizes.append(size)
        return b.factor(size, kind_, reduce if kind_ == REDUCTION else "")

    lhs_f: list = [None] * len(lhs)
    rhs_f: list = [None] * len(rhs)
    out: list = []
    for i, j in zip(lb, rb):
        lhs_f[i] = rhs_f[j] = factor(lhs[i], NEED_REPLICATION if i in whole else PASS)
        out.append(lhs_f[i])
    for i, j in zip(lc, rc):
        lhs_f[i] = rhs_f[j] = factor(lhs[i], NEED_REPLICATION if i in whole else REDUCTION)
    for i in range(len(lhs)):
        if lhs_f[i] is None:
            lhs_f[i] = factor(lhs[i], NEED_REPLICATION if i in whole else PASS)
            out.append(lhs_f[i])
    for j in range(len(rhs)):
        if rhs_f[j] is None and j in gdims:
            rhs_f[j] = factor(rhs[j], REDUCTION if split else NEED_REPLICATION)
        elif rhs_f[j] is None:
            rhs_f[j] = factor(rhs[j])
            out.append(rhs_f[j])
    if kind == CONTRACTING:
        out.insert(0, factor(gs[-1], PASS if split else NEED_REPLICATION))
    gs_f = [lhs_f[d] for d in prefix] + [factor(gs[-1], NEED_REPLICATION)]
    if tuple(sizes[f] for f in out) != tuple(op.outputs[0].shape):  # a form this rule does not know
        return _whole(op)
    return b.operand(lhs_f).operand(rhs_f).operand(gs_f).result(out).build(DOT)


def _prefix_dims(kind: str, rank: int, ragged: int, lb, lc) -> list[int]:
    """The lhs dims that group sizes of rank > 1 are indexed by, before their group dim (JAX's)."""
    free = [d for d in range(rank) if d not in lc and d not in lb]
    if kind == NONCONTRACTING:
        return list(lb) + free[:free.index(ragged)]
    if kind == CONTRACTING:
        return list(lb) + list(lc)[:list(lc).index(ragged)]
    return list(lb)[:list(lb).index(ragged)]


def _whole(op) -> OpRule:
    """Every dim whole (the handler computes the op replicated and reports it)."""
    return whole(op, DOT)


declare("ragged_dot_general", facts=F.OpFacts(F.DOT_FLOPS))
