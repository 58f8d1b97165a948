"""Convolutions with sharded spatial dims: halo exchange instead of gathering the image.

The rule (ops/conv.py) fixes each spatial dim's form; the projection fixes its axes.
Per spatial dim, one of three local forms (dims are independent, so an H-and-W sharded
conv exchanges halos along H, then along W on the H-extended block, which carries the
corners):

* whole ("W"): the dim is unsharded; the local conv keeps the op's padding.
* output-sharded ("A", the forward form's window factor sharded): device i computes
  outputs [i*c_out, (i+1)*c_out), which read the input positions [w_i, w_i+T). The device
  fetches those rows (own rows + left/right halos by collective-permute, per-shard offsets
  from plan-time tables), rows outside the image read as the conv's zero padding, and the
  local conv runs with padding (0, 0) (or a static local padding for lhs dilation):

      conv 7x7 stride 2 pad 3, H=224 over 2: device 0 needs rows [-3, 114) -> 2-row right
      halo; device 1 needs [109, 224) -> 3-row left halo.

* kernel-sharded ("B", the kernel form's reduction factor sharded: the weight-gradient
  conv, whose "kernel" is the output cotangent with its spatial dim sharded like the
  activations): device i holds kernel rows [i*c_r, (i+1)*c_r); it fetches the input rows
  those kernel rows meet and produces a partial sum of the whole (small) output.

Batch and output-feature dims pass through; input-feature sharding gives partial sums;
depthwise and grouped convs shard their group factor (local feature_group_count).
"""
from __future__ import annotations

import attrs
import numpy as np

from ..core import dtypes
from ..ops.rule import REDUCTION, WINDOW
from .context import Ctx
from .halo import window_geometry, window_segment
from .pvalue import ceil_div
from .registry import handler
from .reshard import reshard


@attrs.frozen
class ConvGeometry:
    lhs_spec: tuple
    rhs_spec: tuple
    out_spec: tuple
    strides: tuple
    pads: tuple
    ld: tuple
    rd: tuple
    lhs: tuple
    rhs: tuple
    out: tuple

    @classmethod
    def of(cls, op) -> "ConvGeometry":
        p = op.params
        dn = p["dimension_numbers"]
        nsp = len(dn.lhs_spec) - 2
        return cls(tuple(dn.lhs_spec), tuple(dn.rhs_spec), tuple(dn.out_spec), tuple(p["window_strides"]),
                   tuple(tuple(int(v) for v in pp) for pp in p["padding"]), tuple(p["lhs_dilation"] or (1,) * nsp),
                   tuple(p["rhs_dilation"] or (1,) * nsp), op.inputs[0].shape, op.inputs[1].shape,
                   op.outputs[0].shape)

    @property
    def nsp(self) -> int:
        return len(self.lhs_spec) - 2

    def dims(self, s: int) -> tuple[int, int, int]:
        """(lhs dim, kernel dim, output dim) of spatial dim s."""
        return self.lhs_spec[2 + s], self.rhs_spec[2 + s], self.out_spec[2 + s]


def _modes(rule, plan, g: ConvGeometry) -> list[tuple[str, tuple[str, ...]]]:
    modes = []
    for s in range(g.nsp):
        li, _, _ = g.dims(s)
        f = rule.operands[0][li][0] if rule.operands[0][li] else None
        kind = rule.factors[f].kind if f is not None else None
        axes = plan.axes(f) if f is not None else ()
        if kind == REDUCTION and axes:
            modes.append(("B", axes))
        elif kind == WINDOW and axes:
            modes.append(("A", axes))
        elif kind == WINDOW and min(g.pads[s]) < 0:
            modes.append(("A", ()))  # XLA:CPU miscomputes some convs with negative padding: crop locally
        else:
            modes.append(("W", ()))
    return modes


def _needs_explicit_dilation(ctx: Ctx, g: ConvGeometry, modes) -> bool:
    """XLA's conv operand swapper (taken when the kernel outgrows the input, as it may on a
    small local block) miscompiles convs with lhs dilation: then dilate explicitly."""
    if not any(v > 1 for v in g.ld):
        return False
    explicit = False
    for s, (mode, axes) in enumerate(modes):
        li, ri, oi = g.dims(s)
        k = ctx.k(axes) if axes else 1
        wr = g.rhs[ri] if mode != "B" else ceil_div(g.rhs[ri], k)
        if mode == "W":
            rows = g.lhs[li]
        elif mode == "A":
            c_out = ceil_div(g.out[oi], k)
            rows = ((c_out - 1) * g.strides[s] + (wr - 1) * g.rd[s]) // g.ld[s] + 1
        else:
            rows = ((g.out[oi] - 1) * g.strides[s] + (wr - 1) * g.rd[s]) // g.ld[s] + 1
        explicit |= wr >= rows
    return explicit


def _kernel_rows(g: ConvGeometry, s: int, k: int):
    """Kernel-sharded dim s over k shards: (w, T, need_lo, need_hi) of the input rows each
    device's kernel rows meet."""
    li, ri, oi = g.dims(s)
    wr, n_out = g.rhs[ri], g.out[oi]
    c_r = ceil_div(wr, k)
    i = np.arange(k, dtype=np.int64)
    w = i * c_r * g.rd[s] - g.pads[s][0]
    T = (n_out - 1) * g.strides[s] + (c_r - 1) * g.rd[s] + 1
    j_hi = np.minimum(wr, (i + 1) * c_r) - 1
    q_lo, q_hi = w, (n_out - 1) * g.strides[s] + j_hi * g.rd[s] - g.pads[s][0]
    need_lo = -((-q_lo) // g.ld[s])
    need_hi = q_hi // g.ld[s] + 1
    need_hi = np.where(i * c_r < wr, need_hi, need_lo)
    return w, T, need_lo, need_hi


def _segments(ctx: Ctx, g: ConvGeometry, modes, x, lhs_dims, explicit: bool):
    """The local input block each device convolves, with the local padding and dilation."""
    new_pad, new_ld = list(g.pads), list(g.ld)
    for s, (mode, axes) in enumerate(modes):
        if mode == "W":
            continue
        li, ri, oi = g.dims(s)
        k = ctx.k(axes) if axes else 1
        if mode == "A":
            w, T, need_lo, need_hi = window_geometry(g.lhs[li], g.out[oi], k, g.rhs[ri], g.strides[s], g.rd[s],
                                                     g.pads[s][0], g.pads[s][1], g.ld[s])
        else:
            w, T, need_lo, need_hi = _kernel_rows(g, s, k)
        seg = window_segment(ctx, x, li, g.lhs[li], lhs_dims[li], axes, w, T, g.ld[s], 0, need_lo, need_hi,
                             what=f"conv spatial dim {li}", explicit=explicit)
        x = seg.x
        new_pad[s] = (seg.lo, seg.hi)
        new_ld[s] = seg.ld
    return x, tuple(new_pad), tuple(new_ld)


def _kernel_rows_local(ctx: Ctx, g: ConvGeometry, modes, rhs, projected):
    """A kernel-sharded dim's kernel rows as the projection splits them. The driver leaves a
    windowed dim held whole as it is (the input's rows are fetched by halo), but the kernel
    form reads the kernel rows each device holds: slice them locally (no collective)."""
    target = list(rhs.dims)
    for s, (mode, _) in enumerate(modes):
        ki = g.dims(s)[1]
        if mode == "B" and not rhs.dims[ki]:
            target[ki] = tuple(projected[ki])
    return rhs if tuple(target) == tuple(rhs.dims) else reshard(ctx, rhs, tuple(target))


@handler("conv")
def partition_conv(ctx: Ctx, op, rule, plan, args):
    g = ConvGeometry.of(op)
    lhs, rhs = args
    modes = _modes(rule, plan, g)
    rhs = _kernel_rows_local(ctx, g, modes, rhs, plan.operands[1])
    red = plan.partial_axes  # the projection's partial results (sum)
    x, kx = lhs.x, rhs.x
    if red:  # padding rows of contracted dims (features, sharded kernel rows) read as zero
        x = ctx.mask(lhs, [g.lhs_spec[1]], 0)
        kx = ctx.mask(rhs, [g.rhs_spec[1]] + [g.dims(s)[1] for s, (m, _) in enumerate(modes) if m == "B"], 0)
    explicit = _needs_explicit_dilation(ctx, g, modes)
    if explicit:
        modes = [("A", ()) if (m == "W" and g.ld[s] > 1) else (m, a) for s, (m, a) in enumerate(modes)]
    x, pads, lds = _segments(ctx, g, modes, x, lhs.dims, explicit)
    params = dict(op.params)
    params["padding"] = pads
    params["lhs_dilation"] = lds
    fgc = op.params["feature_group_count"]
    if fgc > 1 and g.lhs[g.lhs_spec[1]] == fgc:  # depthwise: one feature per group (maybe uneven)
        params["feature_group_count"] = x.shape[g.lhs_spec[1]]
    elif fgc > 1:
        gf = rule.operands[0][g.lhs_spec[1]][0]
        params["feature_group_count"] = fgc // ctx.k(plan.axes(gf))
    out = op.outputs[0]
    acc = dtypes.accumulation_dtype("sum", out.dtype)
    if red and acc != np.dtype(out.dtype):
        params["preferred_element_type"] = acc
    y = op.primitive.bind(x, kx, **params)
    expect = ctx.local_shape(out.shape, plan.results[0])
    assert tuple(y.shape) == tuple(expect), (y.shape, expect, modes, plan.results[0])
    return [ctx.pv(y, out.shape, plan.results[0], plan.partial, out.dtype)]
