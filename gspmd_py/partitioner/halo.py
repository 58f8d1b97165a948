"""Halo exchange: give every device a contiguous run of rows of a sharded dim.

The one primitive the windowed handlers share. Device ``i`` wants the global rows
``[a[i], a[i] + S)`` of a dim (``S`` static, ``a`` a per-device table computed at plan
time); rows outside the real range read as ``fill`` (the op's padding value: 0 for a
conv, the init value of a reduce_window, the pad value of a pad).

    conv 3x3 SAME, H=32 sharded 4 ways (c=8): a = [-1, 7, 15, 23], S = 10
        own rows (local) + 1 row from the left neighbour + 1 row from the right neighbour
        -> 2 collective-permutes of one row each, no all-gather

The rows a device needs live on a few shards; every piece that is not the device's own
is one transfer ``src -> dst``. Transfers are grouped by shift (source shard minus
destination): one ``collective-permute`` per shift, of the group's largest piece (the
halo width); left and right halos are the shifts -1 and +1. Halos wider than a shard
simply take more shifts (shards i-1, i-2, ...); when they would move as much as an
all-gather (or need more permutes than an all-gather has steps), the dim is all-gathered
instead (noted in ``ctx.notes``) and each device slices its rows locally: the correct
last resort.

:class:`FetchPlan` is pure plan-time data (small numpy tables); ``gather`` runs it
inside the SPMD program and ``scatter_add`` runs its transpose (each device sends the
rows of its segment back to their owners, which add them: select_and_scatter_add).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import attrs
import jax.numpy as jnp
import numpy as np
from jax import lax

from . import halo_tables, index_math
from .context import Ctx, on_words
from .pvalue import ceil_div


def device_table(values: np.ndarray, idx):
    """Element ``idx`` (a traced device position) of a small int table, as int32."""
    v = np.asarray(values, dtype=np.int64)
    if v.size and np.all(v == v.flat[0]):
        return jnp.int32(int(v.flat[0]))
    return jnp.asarray(v.astype(np.int32))[idx]


def _bshape(ndim: int, d: int, n: int) -> list[int]:
    s = [1] * ndim
    s[d] = n
    return s


def pad_rows(x, d: int, lo: int, hi: int, fill=0):
    if lo == 0 and hi == 0:
        return x
    return on_words(lambda w: lax.pad(w, jnp.asarray(fill if w is x else 0, w.dtype),
                                      [(lo, hi, 0) if i == d else (0, 0, 0) for i in range(w.ndim)]), x)


def row_mask(ndim: int, d: int, n: int, lo, hi, start=0):
    """Bool array broadcastable along dim d: row r is True iff lo <= start + r < hi."""
    r = lax.iota(jnp.int32, n) + start
    return ((r >= lo) & (r < hi)).reshape(_bshape(ndim, d, n))


def full_like_rows(x, d: int, n: int, fill):
    shape = list(x.shape)
    shape[d] = n
    return jnp.full(shape, fill, dtype=x.dtype)


@attrs.frozen
class Round:
    pairs: tuple[tuple[int, int], ...]  # (src device, dst device) over the linear index of the axes
    src_off: np.ndarray  # per device: first local row it sends (as a source)
    dst_off: np.ndarray  # per device: where the received rows go in its segment
    length: np.ndarray  # per device: rows received (0: receives nothing)
    width: int  # static rows per transfer (max over the round)


@attrs.frozen
class FetchPlan:
    axes: tuple[str, ...]  # the dim's mesh axes (tables are indexed by the position over them)
    k: int
    c: int  # local rows of the dim on each device (whole: n)
    S: int  # segment rows
    a: np.ndarray  # per device: global row of segment row 0
    need_lo: np.ndarray  # per device: real rows fetched are [need_lo, need_hi)
    need_hi: np.ndarray
    whole: bool  # the data is held whole on every device: no communication
    own: Optional[Round]  # the device's own rows (no communication; pairs unused)
    rounds: tuple[Round, ...]

    @property
    def moved_rows(self) -> int:
        return sum(r.width for r in self.rounds)


def plan_fetch(ctx: Ctx, axes: Sequence[str], *, n: int, c: int, a: np.ndarray, S: int, whole: bool,
               need_lo: Optional[np.ndarray] = None, need_hi: Optional[np.ndarray] = None,
               holder: Optional[np.ndarray] = None, real: Optional[tuple[int, int]] = None) -> FetchPlan:
    """Plan the transfers that give device i the rows [a[i], a[i]+S) of a dim.

    The dim's data is either held whole (``whole``: each device has all ``n`` rows) or in
    canonical shards of ``c`` rows over ``axes``; shard m is held by device ``holder[m]``
    (identity unless the data was permuted, e.g. rev). Only rows in ``real`` (default
    [0, n)) and in [need_lo[i], need_hi[i]) (default: the whole segment) are fetched.
    """
    axes = tuple(axes)
    k = ctx.k(axes) if axes else 1
    a = np.asarray(a, dtype=np.int64).reshape(-1)
    if a.size == 1 and k > 1:
        a = np.full(k, int(a[0]), np.int64)
    r_lo, r_hi = real if real is not None else (0, n)
    lo = np.maximum(a, r_lo)
    hi = np.minimum(a + S, r_hi)
    if need_lo is not None:
        lo = np.maximum(lo, np.asarray(need_lo, np.int64))
    if need_hi is not None:
        hi = np.minimum(hi, np.asarray(need_hi, np.int64))
    hi = np.maximum(hi, lo)
    if whole or k == 1:
        return FetchPlan(axes, k, c, S, a, lo, hi, True, None, ())
    if not np.any(hi > lo):  # nothing to move (a zero-size source: c == 0)
        return FetchPlan(axes, k, c, S, a, lo, hi, False, None, ())
    # every piece, grouped in rounds by shift (source shard - destination): device i gets its
    # piece from shard i+shift, a permutation since holder is one (left halo: shift -1,
    # right halo: +1); vectorised over devices (halo_tables.fetch_rounds)
    fr = halo_tables.fetch_rounds(lo, hi, a, c, holder)
    rounds = []
    for r in range(fr.shift.size):
        dst = np.flatnonzero(fr.source[r] >= 0)
        pairs = tuple(zip(fr.source[r, dst].tolist(), dst.tolist()))
        rounds.append(Round(pairs, fr.src_off[r], fr.dst_off[r], fr.length[r], int(fr.length[r].max())))
    own = Round((), fr.own_src, fr.own_dst, fr.own_len, int(fr.own_len.max())) if fr.own_len.max() > 0 else None
    return FetchPlan(axes, k, c, S, a, lo, hi, False, own, tuple(rounds))


def _place(seg, piece, d: int, dst_off, length, S: int):
    """seg with rows [dst_off, dst_off+length) replaced by piece's first rows."""
    big = pad_rows(piece, d, S, S)
    shifted = lax.dynamic_slice_in_dim(big, jnp.int32(S) - dst_off, S, axis=d)
    return jnp.where(row_mask(seg.ndim, d, S, dst_off, dst_off + length), shifted, seg)


def neighbour_halos(plan: FetchPlan) -> Optional[tuple[int, int]]:
    """(L, R) when the plan is the plain halo exchange, else None.

    Plain: every device holds a full shard (n == k*c), its segment is its own rows with L
    rows of the left neighbour before and R rows of the right neighbour after (L, R <= c),
    and every real row of the segment is wanted. Then the segment is one concatenate of
    (edge rows of the left neighbour, own rows, edge rows of the right neighbour), as XLA's
    partitioner emits it, instead of table-driven pieces placed by masks::

        conv 3x3 SAME, H=32 over 4 (c=8): a = [-1, 7, 15, 23], S = 10  ->  L = R = 1
    """
    if plan.whole or plan.k < 2 or plan.c < 1:
        return None
    k, c, S = plan.k, plan.c, plan.S
    a = np.asarray(plan.a, np.int64)
    L = -int(a[0])
    R = S - L - c
    if not (0 <= L <= c and 0 <= R <= c) or not np.array_equal(a, np.arange(k, dtype=np.int64) * c - L):
        return None
    if not (np.array_equal(plan.need_lo, np.maximum(a, 0)) and np.array_equal(plan.need_hi, np.minimum(a + S, k * c))):
        return None
    want = {_from_neighbour(k, s) for s, rows in ((-1, L), (1, R)) if rows}
    if len(plan.rounds) != len(want) or {tuple(sorted(r.pairs, key=lambda p: p[1])) for r in plan.rounds} != want:
        return None
    return L, R


def _from_neighbour(k: int, shift: int) -> tuple[tuple[int, int], ...]:
    """(src, dst) pairs: device j receives from device j + shift (where it exists)."""
    return tuple((j + shift, j) for j in range(k) if 0 <= j + shift < k)


def _is_zero(fill) -> bool:
    """fill is a concrete +0 (what a collective-permute gives a device nothing is sent to)."""
    try:
        v = np.asarray(fill)
        return v.size == 1 and v.dtype != object and not np.signbit(v) and v == 0
    except Exception:  # noqa: BLE001 - a traced fill (pad's padding value) is not known to be 0
        return False


def _neighbour_gather(ctx: Ctx, plan: FetchPlan, x, d: int, fill, L: int, R: int):
    k, c = plan.k, plan.c
    parts = []
    edge = None if _is_zero(fill) else ctx.index(plan.axes)
    if L:
        left = ctx.permute(lax.slice_in_dim(x, c - L, c, axis=d), plan.axes, _from_neighbour(k, -1))
        parts.append(left if edge is None else jnp.where(edge == 0, jnp.asarray(fill, x.dtype), left))
    parts.append(x)
    if R:
        right = ctx.permute(lax.slice_in_dim(x, 0, R, axis=d), plan.axes, _from_neighbour(k, 1))
        parts.append(right if edge is None else jnp.where(edge == k - 1, jnp.asarray(fill, x.dtype), right))
    return lax.concatenate(parts, d) if len(parts) > 1 else x


def gather(ctx: Ctx, plan: FetchPlan, x, d: int, fill) -> Any:
    """Run a fetch plan: the device's segment (S rows along d) of x."""
    lr = neighbour_halos(plan)
    if lr is not None:
        return _neighbour_gather(ctx, plan, x, d, fill, *lr)
    idx = ctx.index(plan.axes) if plan.axes else jnp.int32(0)
    S = plan.S
    a = device_table(plan.a, idx)
    lo, hi = device_table(plan.need_lo, idx), device_table(plan.need_hi, idx)
    if plan.whole:
        n = x.shape[d]
        big = pad_rows(x, d, S, S)
        start = jnp.clip(a + jnp.int32(S), 0, n + S)
        seg = lax.dynamic_slice_in_dim(big, start, S, axis=d)
        return jnp.where(row_mask(x.ndim, d, S, lo, hi, a), seg, jnp.asarray(fill, x.dtype))
    seg = full_like_rows(x, d, S, fill)
    pieces = ([plan.own] if plan.own is not None else []) + list(plan.rounds)
    for rnd in pieces:
        W = rnd.width
        src = pad_rows(x, d, 0, W)
        buf = lax.dynamic_slice_in_dim(src, device_table(rnd.src_off, idx), W, axis=d)
        if rnd is not plan.own:
            buf = ctx.permute(buf, plan.axes, rnd.pairs)
        seg = _place(seg, buf, d, device_table(rnd.dst_off, idx), device_table(rnd.length, idx), S)
    return seg


def scatter_add(ctx: Ctx, plan: FetchPlan, seg, d: int):
    """Transpose of :func:`gather` (sharded plans): every segment row goes back to the
    device that holds it and is added there. Rows of the segment outside the fetched
    range are dropped. Returns the local dim-d block (c rows)."""
    assert not plan.whole
    idx = ctx.index(plan.axes)
    c = plan.c
    shape = list(seg.shape)
    shape[d] = c
    out = jnp.zeros(shape, seg.dtype)
    pieces = ([plan.own] if plan.own is not None else []) + list(plan.rounds)
    for rnd in pieces:
        W = rnd.width
        dst_off, length = device_table(rnd.dst_off, idx), device_table(rnd.length, idx)
        buf = lax.dynamic_slice_in_dim(pad_rows(seg, d, 0, W), dst_off, W, axis=d)
        buf = jnp.where(row_mask(seg.ndim, d, W, 0, length), buf, jnp.zeros((), seg.dtype))
        if rnd is not plan.own:
            buf = ctx.permute(buf, plan.axes, tuple((b, a) for a, b in rnd.pairs))
            # the receiver is the original source: place at its src_off
        src_off = device_table(rnd.src_off, idx)
        big = pad_rows(buf, d, c, c)
        shifted = lax.dynamic_slice_in_dim(big, jnp.int32(c) - src_off, c, axis=d)
        out = out + shifted
    return out


# ---------------------------------------------------------------------------------------
# windows: a 1-D window geometry on one dim, partitioned
# ---------------------------------------------------------------------------------------

@attrs.frozen
class Segment:
    x: Any  # the local operand with dim d replaced by the segment
    lo: int  # local padding of the windowed op on this dim
    hi: int
    ld: int  # local lhs/base dilation


def too_costly(plan: FetchPlan) -> bool:
    """Would the halo rounds move as much as an all-gather of the dim (or need more steps)?"""
    return not plan.whole and (plan.moved_rows > (plan.k - 1) * plan.c or len(plan.rounds) > max(2, plan.k - 1))


def fetch_or_gather(ctx: Ctx, x, d: int, n: int, x_axes: Sequence[str], t_axes: Sequence[str], a: np.ndarray,
                    S: int, fill, need_lo=None, need_hi=None, what: str = "") -> Any:
    """Segment rows [a[i], a[i]+S) of dim d (size n) of x, held sharded over x_axes (== t_axes) or
    whole (x_axes == ()); halo exchange, or an all-gather when that moves less."""
    t_axes = tuple(t_axes)
    x_axes = tuple(x_axes)
    assert not x_axes or x_axes == t_axes, (x_axes, t_axes)
    c = x.shape[d]
    plan = plan_fetch(ctx, t_axes, n=n, c=c, a=a, S=S, whole=not x_axes, need_lo=need_lo, need_hi=need_hi)
    if not plan.whole:
        if too_costly(plan):
            ctx.note(f"{what or 'windowed dim'} of size {n} over {','.join(t_axes)}: "
                     f"halo of {plan.moved_rows} rows in {len(plan.rounds)} permutes would move as much as "
                     f"an all-gather; dim gathered whole, each device slices its window locally")
            x = ctx.all_gather(x, t_axes, d)
            x = lax.slice_in_dim(x, 0, n, axis=d)
            plan = plan_fetch(ctx, t_axes, n=n, c=n, a=a, S=S, whole=True, need_lo=need_lo, need_hi=need_hi)
    return gather(ctx, plan, x, d, fill)


def window_segment(ctx: Ctx, x, d: int, n: int, x_axes: Sequence[str], t_axes: Sequence[str], w: np.ndarray,
                   T: int, ld: int, fill, need_lo=None, need_hi=None, what: str = "",
                   explicit: bool = False) -> Segment:
    """The input a device needs to compute its outputs of a windowed op along dim d.

    ``w[i]``: position (lhs-dilated, unpadded coordinates: input row r at r*ld) of device i's
    first window element; ``T``: positions its windows span. The returned segment, with
    local padding (lo, hi) and dilation ld, spans exactly T positions, so running the op
    locally with padding (lo, hi) gives the device's outputs. Rows outside [0, n) read as fill.
    With ``explicit`` (or when the phase w mod ld differs between devices) the lhs dilation is
    applied here (holes = fill) and the local op gets none.
    """
    w = np.asarray(w, np.int64)
    if ld == 1:
        seg = fetch_or_gather(ctx, x, d, n, x_axes, t_axes, w, T, fill, need_lo, need_hi, what)
        return Segment(seg, 0, 0, 1)
    r = np.mod(w, ld)
    a_up = -((-w) // ld)  # first row at or after w
    b = (w + T - 1) // ld  # last row at or before the span's end
    if not explicit and np.all(r == r[0]) and np.all(b - a_up == b[0] - a_up[0]) and b[0] >= a_up[0]:
        S = int(b[0] - a_up[0] + 1)
        lo = int(a_up[0] * ld - w[0])
        hi = T - lo - ((S - 1) * ld + 1)
        seg = fetch_or_gather(ctx, x, d, n, x_axes, t_axes, a_up, S, fill, need_lo, need_hi, what)
        return Segment(seg, lo, hi, ld)
    # per-device phase: dilate explicitly, then slice the span
    a = w // ld
    S = int(np.max(b - a + 1))
    seg = fetch_or_gather(ctx, x, d, n, x_axes, t_axes, a, S, fill, need_lo, need_hi, what)
    cfg = [(0, 0, 0)] * seg.ndim
    off = w - a * ld
    D = (S - 1) * ld + 1
    cfg[d] = (0, max(0, int(np.max(off + T)) - D), ld - 1)
    dil = lax.pad(seg, jnp.asarray(fill, seg.dtype), cfg)
    idx = ctx.index(t_axes) if t_axes else jnp.int32(0)
    seg = lax.dynamic_slice_in_dim(dil, device_table(off, idx), T, axis=d)
    return Segment(seg, 0, 0, 1)


def window_geometry(n_in: int, n_out: int, k: int, window: int, stride: int, wdil: int, pad_lo: int,
                    pad_hi: int, ld: int):
    """Mode "output sharded": device i computes outputs [i*c_out, (i+1)*c_out).

    Returns (w, T, need_lo, need_hi): w[i] the first window position of the device, T the
    span of c_out windows, [need_lo, need_hi) the input rows its real outputs read
    (index_math.window_halos).
    """
    c_out = ceil_div(n_out, k)
    i = np.arange(k, dtype=np.int64)
    w = i * c_out * stride - pad_lo
    T = (c_out - 1) * stride + (window - 1) * wdil + 1
    h = index_math.window_halos(n_in, k, window, stride, wdil, pad_lo, pad_hi, ld)
    assert h["n_out"] == n_out, (h["n_out"], n_out)
    return w, T, h["in_lo"], h["in_hi"]
