"""Convolution and windowed reductions.

    conv_general_dilated  lhs [N,H,C] (NHC), rhs [KH,C,O] (HIO) -> [N,H',O]

Features, by grouping:
    plain             "[n,h,c], [kh,c,o] -> [n,h',o]"       c: reduction(sum), o: pass
    depthwise         lhs features = groups g, rhs in-features 1, out features (g m):
                      g passes from the lhs features to the output features (local
                      feature_group_count = g / shards)
    grouped (g > 1)   lhs features (g c'), rhs in-features c', rhs/out features (g o'):
                      g pass, c' reduction(sum), o' pass
    batch-grouped     (the weight gradient of a grouped conv) batch and output features
                      need replication; plain input features still contract: reduction(sum)

Spatial dims, by form (chosen per dim from the shapes, so every pass sees the same choice):
    forward form      the output is at least as large as the kernel: input and output
                      spatial dims share a window factor (halo exchange); the kernel's
                      spatial dim needs replication
                      "[n,h,c], [k,c,o] -> [n,h,o]"  h: window, k: need_replication
    kernel form       the output is smaller than the kernel (the weight-gradient conv, whose
                      "kernel" is the output cotangent): the kernel's spatial factor also
                      indexes the input rows it meets; sharded, each device convolves the
                      kernel rows it holds and the output is a partial sum
                      "[n,r,c], [r,c,o] -> [n,s,o]"  r: reduction(sum), s: need_replication
"""
from __future__ import annotations

from . import facts as F
from .registry import declare, register
from .rule import DOT, NEED_REPLICATION, OTHER, PASS, REDUCTION, WINDOW, OpRule, RuleBuilder


def kernel_form(n_out: int, kernel: int) -> bool:
    """Does a spatial dim of this size use the kernel form (see the module docstring)?"""
    return n_out < kernel


@register("conv_general_dilated", handler="conv")
def conv(op) -> OpRule:
    dn = op.params["dimension_numbers"]
    lhs_spec, rhs_spec, out_spec = dn.lhs_spec, dn.rhs_spec, dn.out_spec
    lhs, rhs, out = op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape
    fgc = op.params["feature_group_count"]
    bgc = op.params["batch_group_count"]
    b = RuleBuilder()
    lhs_f: list = [None] * len(lhs)
    rhs_f: list = [None] * len(rhs)
    out_f: list = [None] * len(out)
    lb, lf = lhs_spec[0], lhs_spec[1]
    ro, ri = rhs_spec[0], rhs_spec[1]
    ob, of = out_spec[0], out_spec[1]
    if bgc == 1:
        lhs_f[lb] = out_f[ob] = b.factor(lhs[lb])
    else:
        lhs_f[lb] = b.factor(lhs[lb], NEED_REPLICATION)
        out_f[ob] = b.factor(out[ob], NEED_REPLICATION)
    c_in, o = lhs[lf], rhs[ro]
    if bgc > 1:
        lhs_f[lf] = rhs_f[ri] = b.factor(c_in, REDUCTION) if fgc == 1 else b.factor(c_in, NEED_REPLICATION)
        if fgc > 1:
            rhs_f[ri] = b.factor(rhs[ri], NEED_REPLICATION)
        rhs_f[ro] = out_f[of] = b.factor(o, NEED_REPLICATION)
    elif fgc == 1:
        lhs_f[lf] = rhs_f[ri] = b.factor(c_in, REDUCTION)
        rhs_f[ro] = out_f[of] = b.factor(o)
    elif c_in == fgc and rhs[ri] == 1:  # depthwise
        g = b.factor(fgc)
        lhs_f[lf] = g
        rhs_f[ri] = None
        rhs_f[ro] = out_f[of] = g if o == fgc else (g, b.factor(o // fgc))
    else:  # grouped
        g = b.factor(fgc)
        cg = b.factor(c_in // fgc, REDUCTION)
        og = b.factor(o // fgc)
        lhs_f[lf] = (g, cg)
        rhs_f[ri] = cg
        rhs_f[ro] = out_f[of] = (g, og)
    for li, ki, oi in zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:]):
        if kernel_form(out[oi], rhs[ki]):
            r = b.factor(rhs[ki], REDUCTION, window=True)
            lhs_f[li] = rhs_f[ki] = r
            out_f[oi] = b.factor(out[oi], NEED_REPLICATION)
        else:
            s = b.factor(out[oi], WINDOW)
            lhs_f[li] = out_f[oi] = s
            rhs_f[ki] = b.factor(rhs[ki], NEED_REPLICATION)
    return b.operand(lhs_f).operand(rhs_f).result(out_f).build(DOT)


@register("reduce_window_max", "reduce_window_min", "reduce_window_sum", "reduce_window", handler="reduce_window")
def reduce_window(op) -> OpRule:
    dims = op.params["window_dimensions"]
    strides = op.params["window_strides"]
    pads = op.params["padding"]
    dil = op.params.get("base_dilation", (1,) * len(dims))
    wdil = op.params.get("window_dilation", (1,) * len(dims))
    b = RuleBuilder()
    n_arr = len(op.outputs)
    fs = []
    for d, s in enumerate(op.outputs[0].shape):
        trivial = dims[d] == 1 and strides[d] == 1 and tuple(pads[d]) == (0, 0) and dil[d] == 1 and wdil[d] == 1
        fs.append(b.factor(s, PASS if trivial else WINDOW))
    for i, v in enumerate(op.inputs):
        b.operand(fs if i < n_arr else [None] * v.rank)
    for _ in op.outputs:
        b.result(fs)
    return b.build(OTHER)


@register("select_and_gather_add", handler="reduce_window")
def select_and_gather_add(op) -> OpRule:
    """The max pool's jvp: (tangents, operand) -> the tangent at each window's max, a
    windowed op on both operands: "[i,j], [i,j] -> [i',j']" (window factors as reduce_window)."""
    dims, strides, pads = op.params["window_dimensions"], op.params["window_strides"], op.params["padding"]
    dil, wdil = op.params["base_dilation"], op.params["window_dilation"]
    b = RuleBuilder()
    fs = []
    for d, s in enumerate(op.outputs[0].shape):
        trivial = dims[d] == 1 and strides[d] == 1 and tuple(pads[d]) == (0, 0) and dil[d] == 1 and wdil[d] == 1
        fs.append(b.factor(s, PASS if trivial else WINDOW))
    return b.operand(fs).operand(fs).result(fs).build(OTHER)


@register("select_and_scatter_add", handler="select_and_scatter_add")
def select_and_scatter_add(op) -> OpRule:
    # operands: source (window outputs' cotangent), operand (the pooled input); result like operand
    dims = op.params["window_dimensions"]
    strides = op.params["window_strides"]
    pads = op.params["padding"]
    b = RuleBuilder()
    fs = []
    for d, s in enumerate(op.outputs[0].shape):
        trivial = dims[d] == 1 and strides[d] == 1 and tuple(pads[d]) == (0, 0)
        fs.append(b.factor(s, PASS if trivial else WINDOW))
    b.operand(fs).operand(fs).result(fs)
    return b.build(OTHER)


declare("conv_general_dilated", facts=F.OpFacts(F.CONV_FLOPS))
declare("reduce_window_sum", facts=F.OpFacts(F.WINDOW_FLOPS, init="sum"))
declare("reduce_window_max", facts=F.OpFacts(F.WINDOW_FLOPS, init="max"))
declare("reduce_window_min", facts=F.OpFacts(F.WINDOW_FLOPS, init="min"))
declare("reduce_window", "select_and_gather_add", facts=F.OpFacts(F.WINDOW_FLOPS))
declare("select_and_scatter_add", facts=F.OpFacts(F.SELECT_SCATTER_FLOPS))
