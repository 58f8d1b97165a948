"""Convolutions with sharded spatial dims: halo exchange instead of gathering the image.

Per spatial dim, one of three local forms (dims are independent, so an H-and-W sharded
conv exchanges halos along H, then along W on the H-extended block, which carries the
corners):

* whole: the dim is unsharded; the local conv keeps the op's padding.
* output-sharded (the forward conv, and the input-gradient conv): the output dim is
  sharded canonically over the axes A of the input dim; device i computes outputs
  [i*c_out, (i+1)*c_out), which read the input positions [w_i, w_i+T). The device fetches
  those rows (own rows + left/right halos by collective-permute, per-shard offsets from
  plan-time tables), rows outside the image read as the conv's zero padding, and the
  local conv runs with padding (0, 0) (or a static local padding for lhs dilation):

      conv 7x7 stride 2 pad 3, H=224 over 2: device 0 needs rows [-3, 114) -> 2-row right
      halo; device 1 needs [109, 224) -> 3-row left halo.

* kernel-sharded (the weight-gradient conv: the "kernel" is the output cotangent, its
  spatial dim sharded like the activations, the output is the small kernel): device i
  holds kernel rows [i*c_r, (i+1)*c_r); it fetches the input rows those kernel rows
  meet and produces a partial sum of the whole output (partial over A).

Batch and output-feature dims pass through; input-feature sharding gives partial sums
(the rule's reduction factor); depthwise convs shard their group factor (local
feature_group_count). A kernel whose spatial dims are sharded in the forward form (a
large kernel and a larger output) is gathered whole (noted).
"""
from __future__ import annotations

import numpy as np

from ..ops.rule import PASS, REDUCTION, WINDOW
from .context import Ctx
from .factors import choose, targets
from .halo import window_geometry, window_segment
from .pvalue import ceil_div
from .registry import handler
from .reshard import reshard


@handler("conv")
def partition_conv(ctx: Ctx, op, rule, args, want):
    p = op.params
    dn = p["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs_v, rhs_v, out_v = op.inputs[0], op.inputs[1], op.outputs[0]
    fgc, bgc = p["feature_group_count"], p["batch_group_count"]
    nsp = len(lhs_spec) - 2
    strides = tuple(p["window_strides"])
    pads = [tuple(int(v) for v in pp) for pp in p["padding"]]
    ld = tuple(p["lhs_dilation"] or (1,) * nsp)
    rd = tuple(p["rhs_dilation"] or (1,) * nsp)
    lhs, rhs = args

    reduction = [f for f, fac in enumerate(rule.factors) if fac.kind == REDUCTION]
    fa = choose(ctx.sizes, rule, args, want, kinds=(PASS, REDUCTION, WINDOW), operand_first=reduction)

    # factors whose sharding the local conv cannot express
    depthwise = fgc > 1 and lhs_v.shape[lhs_spec[1]] == fgc and rhs_v.shape[rhs_spec[1]] == 1
    if bgc > 1 or (fgc > 1 and not depthwise):
        keep = {rule.results[0][out_spec[2 + s]][0] for s in range(nsp) if rule.results[0][out_spec[2 + s]]}
        dropped = [f for f in list(fa) if f not in keep]
        for f in dropped:
            fa.pop(f)
        if dropped:
            ctx.notes.append(f"{ctx.current_op}: grouped conv (feature_group_count={fgc}, batch_group_count={bgc}) "
                             f"keeps its batch/feature dims whole")
    if depthwise:
        gf = rule.operands[0][lhs_spec[1]]
        g = gf[0] if gf else None
        m = rhs_v.shape[rhs_spec[0]] // fgc
        if g is not None and g in fa and m > 1 and fgc % ctx.k(fa[g]):
            fa.pop(g)  # (g, m) out features: an uneven g would not be a canonical tiling of g*m

    used = {a for f, axes in fa.items() for a in axes}
    # batch-grouped convs (the weight gradient of a grouped/depthwise conv) still contract the
    # input features with the kernel's input features: sharded alike, they give partial sums
    # (the rule keeps them whole; here they stay where they are instead of being gathered)
    bg_axes: tuple[str, ...] = ()
    if bgc > 1 and fgc == 1:
        a_f = tuple(lhs.dims[lhs_spec[1]])
        if a_f and tuple(rhs.dims[rhs_spec[1]]) == a_f and not set(a_f) & used:
            bg_axes = a_f
            used |= set(a_f)

    # spatial dims: choose output-sharded / kernel-sharded / whole
    modes = []  # per spatial dim: ("A", axes) | ("B", axes) | ("W", ())
    for s in range(nsp):
        li, ri, oi = lhs_spec[2 + s], rhs_spec[2 + s], out_spec[2 + s]
        sf = rule.operands[0][li][0] if rule.operands[0][li] else None
        a_axes = fa.get(sf, ()) if sf is not None else ()
        r_axes = tuple(rhs.dims[ri])
        n_out, wr = out_v.shape[oi], rhs_v.shape[ri]
        if r_axes and n_out < wr and not (set(r_axes) & (used - set(a_axes))):
            if sf is not None and sf in fa:
                used -= set(fa.pop(sf))
            used |= set(r_axes)
            modes.append(("B", r_axes))
        elif a_axes:
            modes.append(("A", a_axes))
        elif min(pads[s]) < 0:
            # XLA:CPU miscomputes some convs with negative padding: crop by a local slice instead
            modes.append(("A", ()))
        else:
            modes.append(("W", ()))
        if r_axes and modes[-1][0] != "B":
            ctx.notes.append(f"{ctx.current_op}: kernel spatial dim {ri} (size {wr}) sharded over "
                             f"{ctx.fine.label(r_axes)}: gathered whole (large-kernel case)")

    tin = [list(t) for t in targets(ctx.sizes, rule, fa, rule.operands)]
    tout = list(targets(ctx.sizes, rule, fa, rule.results)[0])
    for s, (mode, axes) in enumerate(modes):
        li, ri, oi = lhs_spec[2 + s], rhs_spec[2 + s], out_spec[2 + s]
        if mode == "A":
            tin[0][li] = axes if lhs.dims[li] else ()
            tout[oi] = axes
        elif mode == "B":
            tin[0][li] = axes if lhs.dims[li] else ()
            tin[1][ri] = axes
            tout[oi] = ()
        else:
            tin[0][li] = ()
            tout[oi] = ()
        tin[1][ri] = tin[1][ri] if mode == "B" else ()
    if bg_axes:
        tin[0][lhs_spec[1]] = bg_axes
        tin[1][rhs_spec[1]] = bg_axes
    lhs_r = reshard(ctx, lhs, tuple(tin[0]))
    rhs_r = reshard(ctx, rhs, tuple(tin[1]))

    # padding rows of contracted dims read as zero
    red_axes: list[str] = []
    for f in reduction:
        if f in fa:
            red_axes.extend(fa[f])
    x = lhs_r.x
    kx = rhs_r.x
    red_axes.extend(bg_axes)
    if red_axes:
        x = ctx.mask(lhs_r, [lhs_spec[1]], 0)
        kx = ctx.mask(rhs_r, [rhs_spec[1]], 0)
    # kernel-sharded dims: padding kernel rows are zero
    kb = [rhs_spec[2 + s] for s, (mode, _) in enumerate(modes) if mode == "B"]
    if kb:
        kx = ctx.mask(ctx.pv(kx, rhs_r.shape, rhs_r.dims), kb, 0)

    # XLA's conv operand swapper (taken when the kernel outgrows the input, as it may on a small
    # local block) miscompiles convs with lhs dilation: then dilate explicitly, here.
    explicit = False
    if any(v > 1 for v in ld):
        for s, (mode, axes) in enumerate(modes):
            li, ri, oi = lhs_spec[2 + s], rhs_spec[2 + s], out_spec[2 + s]
            k = ctx.k(axes) if axes else 1
            wr = rhs_v.shape[ri] if mode != "B" else ceil_div(rhs_v.shape[ri], k)
            if mode == "W":
                rows = lhs_v.shape[li]
            elif mode == "A":
                c_out = ceil_div(out_v.shape[oi], k)
                rows = ((c_out - 1) * strides[s] + (wr - 1) * rd[s]) // ld[s] + 1
            else:
                rows = ((out_v.shape[oi] - 1) * strides[s] + (wr - 1) * rd[s]) // ld[s] + 1
            explicit |= wr >= rows
        if explicit:
            modes = [("A", ()) if (mode == "W" and ld[s] > 1) else (mode, axes) for s, (mode, axes) in enumerate(modes)]

    new_pad, new_ld = list(pads), list(ld)
    for s, (mode, axes) in enumerate(modes):
        if mode == "W":
            continue
        li, ri, oi = lhs_spec[2 + s], rhs_spec[2 + s], out_spec[2 + s]
        n_in, n_out, wr = lhs_v.shape[li], out_v.shape[oi], rhs_v.shape[ri]
        k = ctx.k(axes) if axes else 1
        if mode == "A":
            w, T, need_lo, need_hi = window_geometry(n_in, n_out, k, wr, strides[s], rd[s], pads[s][0], pads[s][1],
                                                     ld[s])
        else:
            c_r = ceil_div(wr, k)
            i = np.arange(k, dtype=np.int64)
            w = i * c_r * rd[s] - pads[s][0]
            T = (n_out - 1) * strides[s] + (c_r - 1) * rd[s] + 1
            # input rows met by the device's real kernel rows
            j_hi = np.minimum(wr, (i + 1) * c_r) - 1
            q_lo, q_hi = w, (n_out - 1) * strides[s] + j_hi * rd[s] - pads[s][0]
            need_lo = -((-q_lo) // ld[s])
            need_hi = q_hi // ld[s] + 1
            need_hi = np.where(i * c_r < wr, need_hi, need_lo)
        seg = window_segment(ctx, x, li, n_in, tin[0][li], axes, w, T, ld[s], 0, need_lo, need_hi,
                             what=f"conv spatial dim {li}", explicit=explicit)
        x = seg.x
        new_pad[s] = (seg.lo, seg.hi)
        new_ld[s] = seg.ld

    params = dict(p)
    params["padding"] = tuple(new_pad)
    params["lhs_dilation"] = tuple(new_ld)
    if depthwise:
        params["feature_group_count"] = x.shape[lhs_spec[1]]
    y = op.primitive.bind(x, kx, **params)
    partial = tuple(red_axes) + tuple(a for mode, axes in modes if mode == "B" for a in axes)
    expect = ctx.local_shape(out_v.shape, tuple(tout))
    assert tuple(y.shape) == tuple(expect), (y.shape, expect, modes, tout)
    return [ctx.pv(y, out_v.shape, tuple(tout), partial)]
