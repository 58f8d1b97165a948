"""reshard(value, target): move a partitioned value to another sharding by the cheapest path.

Paths, in the order tried (XLA's partitioner and Shardy's reshard_to_collectives):

    partial -> tiled on a partial axis        reduce-scatter (partial.py: with the partial's op)
    partial -> otherwise                      all-reduce
    [{x},{y}] -> [{y},{x}]                     collective-permute (same shard counts, same axes)
    [{x},{}]  -> [{},{x}]                      all-to-all (an axis moves from one dim to another)
    [{x,y},{}] -> [{x},{}]                     all-gather within sub-groups (over y)
    [{},{}]   -> [{x},{y}]                     local dynamic slice, no communication

Uneven dims keep the canonical layout (shards of ceil(n/k)); where a collective would
leave a non-canonical one, the dim is gathered whole and re-sliced, and that is reported.
Results are cached per (value, target), so resharding one value twice costs once.
"""
from __future__ import annotations

from typing import Sequence

import jax.numpy as jnp
import numpy as np

from .context import Ctx, dyn_slice_dim, pad_dim
from .partial import all_reduce, reduce, reduce_scatter
from .pvalue import FineDims, Partial, PValue, ceil_div


def reshard(ctx: Ctx, pv: PValue, target: FineDims, keep_partial: bool = False) -> PValue:
    if pv.partial is None and pv.dims == target and 0 not in pv.shape:
        return pv  # already there (most operands and results of a planned program): nothing to emit
    target = tuple(tuple(t) for t in target)
    key = (pv.key, target, keep_partial)
    hit = ctx.cache.reshards.get(key)
    if hit is not None:
        return hit
    if 0 in pv.shape:  # no data: any layout is an empty local array (XLA refuses empty collectives)
        out = ctx.pv(jnp.zeros(ctx.local_shape(pv.shape, target), pv.dtype), pv.shape, target, dtype=pv.dtype)
    else:
        out = _reshard(ctx, pv, target, keep_partial)
    ctx.cache.reshards[key] = out
    return out


def _reshard(ctx: Ctx, pv: PValue, target: FineDims, keep_partial: bool) -> PValue:
    x, dims = pv.x, [tuple(d) for d in pv.dims]
    shape = pv.shape
    target_axes = {a for t in target for a in t}
    p = pv.partial
    partial = list(p.axes) if p is not None else []
    # 1. partial results: reduce-scatter onto a dim that wants the axes next, else all-reduce
    if partial and (not keep_partial or target_axes & set(partial)):
        for d in range(len(shape)):
            if not partial:
                break
            t = target[d]
            if t[: len(dims[d])] != dims[d]:
                continue
            run = []
            for a in t[len(dims[d]):]:
                if a in partial:
                    run.append(a)
                else:
                    break
            if not run:
                continue
            ok, x = _fit_split(ctx, x, shape[d], dims[d], run, d)
            if not ok:
                continue
            rest = [a for a in partial if a not in run]
            x = reduce_scatter(ctx, x, run, p.op, x.dtype if rest else pv.dtype, d)
            dims[d] = dims[d] + tuple(run)
            partial = rest
        if partial and not keep_partial:
            if list(partial) == list(p.axes) and tuple(dims) == pv.dims:
                # the whole value is reduced: one all-reduce serves every consumer
                reduced = _all_reduced(ctx, pv)
                return reshard(ctx, reduced, target) if reduced.dims != target else reduced
            x = all_reduce(ctx, x, partial, p.op, pv.dtype)
            partial = []
        elif partial and target_axes & set(partial):
            clash = [a for a in partial if a in target_axes]
            rest = [a for a in partial if a not in clash]
            x = all_reduce(ctx, x, clash, p.op, x.dtype if rest else pv.dtype)
            partial = rest
    left = Partial(tuple(partial), p.op) if partial else None
    if tuple(dims) == target:
        return ctx.pv(x, shape, target, left, pv.dtype)
    # 2. collective-permute: same shard count per dim over the same set of axes
    moved = _try_permute(ctx, x, dims, target)
    if moved is not None:
        return ctx.pv(moved, shape, target, left, pv.dtype)
    # 3. all-to-all moves, 4. gathers, 5. slices
    x = _all_to_all_moves(ctx, x, shape, dims, target)
    # a dim that must lose axes anyway but is wanted by another dim's axes: gather it first
    # (on the smaller, still-sharded buffer), then the move is an all-to-all, e.g.
    # [{x},{y}] -> [{y},{}]: all-gather(x), all-to-all(y) rather than two all-gathers + slice
    blocked = False
    for j in range(len(shape)):
        keep_j = _common(dims[j], target[j])
        if keep_j == dims[j]:
            continue
        add_j = target[j][len(keep_j):]
        if any(_longest_suffix_prefix(dims[i][len(_common(dims[i], target[i])):], add_j)
               for i in range(len(shape)) if i != j):
            x, dims[j] = _gather(ctx, x, shape[j], dims[j], keep_j, j)
            blocked = True
    if blocked:
        x = _all_to_all_moves(ctx, x, shape, dims, target)
    for i in range(len(shape)):
        keep_i = _common(dims[i], target[i])
        remove = dims[i][len(keep_i):]
        if remove:
            x, dims[i] = _gather(ctx, x, shape[i], dims[i], keep_i, i)
    for i in range(len(shape)):
        add = target[i][len(dims[i]):]
        if add:
            x = _slice(ctx, x, shape[i], dims[i], add, i)
            dims[i] = target[i]
    return ctx.pv(x, shape, target, left, pv.dtype)


def _all_reduced(ctx: Ctx, pv: PValue) -> PValue:
    hit = ctx.cache.reduced.get(pv.key)
    if hit is None:
        hit = ctx.cache.reduced[pv.key] = reduce(ctx, pv)
    return hit


def _all_to_all_moves(ctx: Ctx, x, shape, dims: list, target: FineDims):
    """Move axes from the minor end of a dim that must lose them to the minor end of a dim
    that wants them (one all-to-all each), while such a move exists; updates ``dims``."""
    while True:
        moved = False
        for i in range(len(shape)):
            keep_i = _common(dims[i], target[i])
            remove = dims[i][len(keep_i):]
            if not remove:
                continue
            for j in range(len(shape)):
                if j == i or _common(dims[j], target[j]) != dims[j]:
                    continue
                add = target[j][len(dims[j]):]
                s = _longest_suffix_prefix(remove, add)
                if not s:
                    continue
                new_i = dims[i][: len(dims[i]) - len(s)]
                ok_j, xj = _fit_split(ctx, x, shape[j], dims[j], s, j)
                if not ok_j or not _concat_canonical(ctx, shape[i], dims[i], new_i):
                    continue
                x = ctx.all_to_all(xj, s, j, i)
                x = _trim(ctx, x, i, shape[i], new_i)
                dims[i], dims[j] = new_i, dims[j] + tuple(s)
                moved = True
                break
            if moved:
                break
        if not moved:
            return x


def _common(a: Sequence[str], b: Sequence[str]) -> tuple[str, ...]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return tuple(a[:n])


def _longest_suffix_prefix(remove: Sequence[str], add: Sequence[str]) -> tuple[str, ...]:
    for n in range(len(remove), 0, -1):
        if tuple(remove[-n:]) == tuple(add[:n]):
            return tuple(remove[-n:])
    return ()


def _fit_split(ctx: Ctx, x, n: int, have: Sequence[str], new: Sequence[str], d: int):
    """Can local dim d (sharded over ``have``) be split further over ``new`` canonically?

    Returns (ok, x) with x padded when the dim was unsharded.
    """
    k_new = ctx.k(have) * ctx.k(new)
    c_new = ceil_div(n, k_new)
    if not have:
        return True, pad_dim(x, d, c_new * ctx.k(new))
    return x.shape[d] == c_new * ctx.k(new), x


def _concat_canonical(ctx: Ctx, n: int, have: Sequence[str], keep: Sequence[str]) -> bool:
    if not keep:
        return True
    return ceil_div(n, ctx.k(have)) * (ctx.k(have) // ctx.k(keep)) == ceil_div(n, ctx.k(keep))


def _trim(ctx: Ctx, x, d: int, n: int, keep: Sequence[str]):
    """After gathering dim d down to ``keep``: cut the padding when it is now whole."""
    if not keep:
        return pad_dim(x, d, n)
    return x


def _gather(ctx: Ctx, x, n: int, have: Sequence[str], keep: Sequence[str], d: int):
    remove = tuple(have[len(keep):])
    if _concat_canonical(ctx, n, have, keep):
        x = ctx.all_gather(x, remove, d)
        return _trim(ctx, x, d, n, keep), tuple(keep)
    # non-canonical: gather the whole dim, then re-slice to `keep`
    ctx.note(f"uneven dim of size {n} regathered whole to re-tile over {keep}")
    x = ctx.all_gather(x, tuple(have), d)
    x = pad_dim(x, d, n)
    x = _slice(ctx, x, n, (), keep, d)
    return x, tuple(keep)


def _slice(ctx: Ctx, x, n: int, have: Sequence[str], add: Sequence[str], d: int):
    ok, x2 = _fit_split(ctx, x, n, have, add, d)
    if not ok:
        # re-tile from the whole dim
        x, _ = _gather(ctx, x, n, have, (), d)
        have_all = tuple(have) + tuple(add)
        c = ceil_div(n, ctx.k(have_all))
        x = pad_dim(x, d, c * ctx.k(have_all))
        return dyn_slice_dim(x, d, ctx.index(have_all) * c, c)
    c = ceil_div(n, ctx.k(tuple(have) + tuple(add)))
    return dyn_slice_dim(x2, d, ctx.index(add) * c, c)


def _try_permute(ctx: Ctx, x, dims, target: FineDims):
    src_axes = [a for d in dims for a in d]
    dst_axes = [a for d in target for a in d]
    if set(src_axes) != set(dst_axes) or len(src_axes) != len(dst_axes):
        return None
    if any(ctx.k(a) != ctx.k(b) for a, b in zip(dims, target)):
        return None
    involved = tuple(a for a in ctx.fine.names if a in set(src_axes))
    sizes = [ctx.sizes[a] for a in involved]
    coords = np.indices(sizes).reshape(len(sizes), -1).T  # linear order over `involved`
    pos = {a: i for i, a in enumerate(involved)}

    def shard_ids(dims):
        idx = np.zeros((len(coords), len(dims)), np.int64)
        for d, axes in enumerate(dims):
            for a in axes:
                idx[:, d] = idx[:, d] * ctx.sizes[a] + coords[:, pos[a]]
        return [tuple(r) for r in idx]

    have, need = shard_ids(dims), shard_ids(target)
    holder = {h: s for s, h in enumerate(have)}
    perm = [(holder[need[d]], d) for d in range(len(coords))]
    return ctx.permute(x, involved, perm)
