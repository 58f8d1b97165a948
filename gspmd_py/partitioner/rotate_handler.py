"""gspmd_rotate: a rotation of a sharded dim as collective-permutes of whole row blocks.

Dim of n rows in k shards of c rows (n = k*c), shift s = q*c + r (0 <= r < c): device i's
result rows are the last r rows of shard i-q-1 followed by the first c-r rows of shard i-q
(indices mod k)::

    pipeline state [S=4, mb] over pipe (c = 1), jnp.roll(state, 1, 0): q = 1, r = 0
        -> ONE collective-permute of the whole shard, pairs j -> j+1 mod 4
    [8] over 4 (c = 2), shift 1: q = 0, r = 1
        -> one permute of the last row (j -> j+1 mod 4) before the device's own first row

An uneven dim (n not a multiple of k) is gathered whole, rotated and re-sliced (noted).
"""
from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from .context import Ctx
from .registry import handler
from .reshard import reshard


@handler("rotate")
def partition_rotate(ctx: Ctx, op, rule, plan, args):
    (a,) = args
    v = op.outputs[0]
    d = op.params["axis"]
    n = v.shape[d]
    s = op.params["shift"] % n if n else 0
    axes = a.dims[d]
    if s == 0:
        return [ctx.pv(a.x, v.shape, a.dims, dtype=v.dtype)]
    if not axes:
        return [ctx.pv(jnp.roll(a.x, s, d), v.shape, a.dims, dtype=v.dtype)]
    k = ctx.k(axes)
    if n % k:
        ctx.note(f"uneven dim of size {n} over {ctx.fine.label(axes)} rotated whole "
                 f"(gathered, rotated, re-sliced)")
        # (a partial operand stays partial: gathering, rolling and re-slicing are linear)
        whole = reshard(ctx, a, tuple(() if i == d else t for i, t in enumerate(a.dims)), keep_partial=True)
        rotated = ctx.pv(jnp.roll(whole.x, s, d), v.shape, whole.dims, dtype=v.dtype)
        return [reshard(ctx, rotated, a.dims)]
    c = n // k
    q, r = divmod(s, c)
    x = a.x
    parts = []
    if r:
        parts.append(_from(ctx, lax.slice_in_dim(x, c - r, c, axis=d), axes, k, q + 1))
    if c - r:
        parts.append(_from(ctx, lax.slice_in_dim(x, 0, c - r, axis=d), axes, k, q))
    y = lax.concatenate(parts, d) if len(parts) > 1 else parts[0]
    return [ctx.pv(y, v.shape, a.dims, dtype=v.dtype)]


def _from(ctx: Ctx, piece, axes, k: int, step: int):
    """Shard j's ``piece`` on shard j + step (mod k): a collective-permute unless it stays put."""
    if step % k == 0:
        return piece
    return ctx.permute(piece, axes, tuple((j, (j + step) % k) for j in range(k)))
