"""Convolution and windowed reductions: spatial dims are window factors.

    conv_general_dilated  lhs [N,H,W,C] (NHWC), rhs [KH,KW,C,O] (HWIO) -> [N,H',W',O]
        "n h w c, kh kw c o -> n h w o"     h, w: window; c: reduction; kh, kw: need_replication*
    reduce_window_max     [N,H,W,C] window (1,3,3,1) -> [N,H',W',C]   "n h w c -> n h w c"  h, w: window

* a kernel sharded on its spatial dims is resharded by the partitioner (large-kernel case).
With feature_group_count > 1 the input feature dim is split into (groups, c/groups); the
group factor passes through to the output feature dim (depthwise convs shard on it).
"""
from __future__ import annotations

from .registry import register
from .rule import DOT, NEED_REPLICATION, OTHER, PASS, REDUCTION, WINDOW, OpRule, RuleBuilder


@register("conv_general_dilated")
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
    # batch
    if bgc == 1:
        n = b.factor(lhs[lhs_spec[0]])
        lhs_f[lhs_spec[0]] = out_f[out_spec[0]] = n
    else:
        lhs_f[lhs_spec[0]] = b.factor(lhs[lhs_spec[0]], NEED_REPLICATION)
        out_f[out_spec[0]] = b.factor(out[out_spec[0]])
    # features
    if fgc == 1 and bgc == 1:
        c = b.factor(lhs[lhs_spec[1]], REDUCTION)
        lhs_f[lhs_spec[1]] = rhs_f[rhs_spec[1]] = c
        o = b.factor(rhs[rhs_spec[0]])
        rhs_f[rhs_spec[0]] = out_f[out_spec[1]] = o
    elif fgc > 1 and lhs[lhs_spec[1]] == fgc and rhs[rhs_spec[1]] == 1:
        # depthwise: each group has one input feature; the group factor passes to the output features
        g = b.factor(fgc)
        lhs_f[lhs_spec[1]] = g
        rhs_f[rhs_spec[1]] = None
        o = rhs[rhs_spec[0]]
        if o == fgc:
            rhs_f[rhs_spec[0]] = out_f[out_spec[1]] = g
        else:  # channel multiplier m: out features = g * m, major g
            m = b.factor(o // fgc)
            rhs_f[rhs_spec[0]] = out_f[out_spec[1]] = (g, m)
    else:
        lhs_f[lhs_spec[1]] = b.factor(lhs[lhs_spec[1]], NEED_REPLICATION)
        rhs_f[rhs_spec[1]] = b.factor(rhs[rhs_spec[1]], NEED_REPLICATION)
        o = b.factor(rhs[rhs_spec[0]])
        rhs_f[rhs_spec[0]] = out_f[out_spec[1]] = o
    for li, ri, oi in zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:]):
        s = b.factor(out[oi], WINDOW)
        lhs_f[li] = out_f[oi] = s
        rhs_f[ri] = b.factor(rhs[ri], NEED_REPLICATION)
    return b.operand(lhs_f).operand(rhs_f).result(out_f).build(DOT, handler="conv")


@register("reduce_window_max", "reduce_window_min", "reduce_window_sum", "reduce_window")
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
    return b.build(OTHER, handler="reduce_window")


@register("select_and_scatter_add")
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
    return b.build(OTHER, handler="select_and_scatter_add")
