"""The hand-written plans, said as search states: starting points and the report's yardsticks.

* replicated: nothing decided over the searched axes;
* data parallel: the leading dim of every data input over every searched axis;
* Megatron (where the program has matmuls): walking the program in order, a weight's first
  matmul splits it on its output columns when the activation it meets is not split yet
  (column parallel: the result is split), else on its contracting dim (row parallel: the
  result is a partial sum, one all-reduce); over the last searched axis;
* data parallel + Megatron on 2+ axes: data over the first axes, Megatron over the last;
* 2D (GSPMD paper's 2D weight sharding, its DenseLm plan) on 2+ axes: Megatron over the
  last axis, every such weight's largest other dim over the first axis, and the data's
  leading dim over the first axis and its last (model) dim over the last axis
  (``wi [M, H]: P("x", "y")``, ``wo [H, M]: P("y", "x")``, ``x [B, L, M]: P("x", None, "y")``).

Data inputs are those whose leading dim is the batch (the leading dim most data bytes
share). Weights are inputs met, possibly through a cast (``w.astype(bf16)``) or a scan (a stacked
``[L, ...]`` weight sliced per iteration: the decision goes to the stacked input, one dim
further), as the right operand of a matmul; data are the other inputs (but not the leaves of a first argument that holds
weights: ``fn(params, *batch)``).
"""
from __future__ import annotations

from typing import Sequence

from ..jax_compat import scan_counts
from .context import TacticContext
from .points import PointClass


CASTS = frozenset(("convert_element_type", "copy", "copy_p", "reduce_precision"))


def scan_aliases(graph) -> dict:
    """body input id -> (the scan's operand, dims the body's view drops in front): a scanned
    ``xs`` operand is seen one leading dim shorter inside the body, consts and carries whole."""
    out: dict = {}
    for op in graph.walk():
        if op.prim != "scan" or not op.regions:
            continue
        body = op.regions[0]
        first_xs = sum(scan_counts(op.params))
        for i, (outer, inner) in enumerate(zip(op.inputs, body.inputs)):
            off = 1 if i >= first_xs else 0
            if outer.id in out:  # nested: resolve to the outermost operand
                src, o = out[outer.id]
                out[inner.id] = (src, o + off)
            else:
                out[inner.id] = (outer, off)
    return out


def source(v, aliases=None):
    """``v`` seen through casts and scans: the weight behind ``w.astype(bf16)`` or behind a
    scan body's slice of a stacked weight; returns (value, leading dims the view drops)."""
    off = 0
    while True:
        if aliases and v.id in aliases:
            v, o = aliases[v.id]
            off += o
        elif v.producer is not None and v.producer.prim in CASTS and len(v.producer.inputs) == 1:
            v = v.producer.inputs[0]
        else:
            return v, off


def _roles(ctx: TacticContext, classes: Sequence[PointClass]):
    cls_of = {vid: i for i, c in enumerate(classes) if c.is_input for vid in c.values}
    weights: list[int] = []  # value ids, in first-use order
    al = scan_aliases(ctx.graph)
    for op in ctx.graph.walk():
        if op.prim == "dot_general" and len(op.inputs) == 2:
            lhs, rhs = source(op.inputs[0], al)[0], source(op.inputs[1], al)[0]
            if rhs.id in cls_of and rhs.id not in weights and lhs.id not in weights:
                weights.append(rhs.id)
    wset = set(weights)
    weight_args = {lf.argnum for v, lf in zip(ctx.graph.inputs, ctx.leaves) if v.id in wset}
    data = [vid for v, lf in zip(ctx.graph.inputs, ctx.leaves) if (vid := v.id) in cls_of and vid not in wset
            and not (lf.argnum == 0 and 0 in weight_args and len(ctx.leaves) > 1)]
    return cls_of, weights, _batched(ctx, data)


def _batched(ctx: TacticContext, data: list[int]) -> list[int]:
    """The data inputs that carry the batch: those whose leading dim is the one most data
    bytes share (a layer norm's scale [d] passed beside x [b, t, d] is no batch)."""
    if not data:
        return data
    by_lead: dict[int, int] = {}
    for vid in data:
        v = ctx.value(vid)
        by_lead[v.shape[0]] = by_lead.get(v.shape[0], 0) + v.nbytes
    lead = max(by_lead, key=lambda n: (by_lead[n], -n))
    return [vid for vid in data if ctx.value(vid).shape[0] == lead]


def _data_parallel(ctx, classes, cls_of, data, axes) -> tuple:
    state = []
    for vid in data:
        c = cls_of[vid]
        for a in axes:
            if (c, 0, a) not in state:
                state.append((c, 0, a))
    return tuple(state)


def _megatron(ctx, classes, cls_of, weights, axis) -> tuple:
    wset = set(weights)
    decided: dict[int, tuple] = {}  # class -> action
    tainted: set[int] = set()
    al = scan_aliases(ctx.graph)
    for op in ctx.graph.walk():
        ins_tainted = any(x.id in tainted for x in op.inputs)
        if op.prim == "dot_general" and len(op.inputs) == 2 and source(op.inputs[1], al)[0].id in wset:
            lhs, rhs = op.inputs[0], op.inputs[1]
            src, off = source(rhs, al)
            c = cls_of[src.id]
            (lc, rc), (lb, rb) = op.params["dimension_numbers"]
            if c not in decided:
                k = ctx.mesh.axis_size(axis)
                if lhs.id in tainted:  # row parallel: split the contracting dim
                    dims = [d for d in rc if rhs.shape[d] % k == 0]
                    if dims:
                        decided[c] = (c, dims[0] + off, axis)
                    continue  # the result is a partial sum: reduced, not split
                dims = [d for d in range(rhs.rank) if d not in rc and d not in rb and rhs.shape[d] % k == 0]
                if dims:
                    decided[c] = (c, dims[0] + off, axis)
                    tainted.update(o.id for o in op.outputs)
                continue
        if ins_tainted:
            tainted.update(o.id for o in op.outputs)
    return tuple(decided.values())


def _two_d(ctx, classes, cls_of, data, meg, first: str, last: str) -> tuple:
    """Megatron over ``last`` plus each weight's largest other dim over ``first``; the data's
    leading dim over ``first`` and its last dim over ``last``."""
    k = ctx.mesh.axis_size(first)
    state = list(meg)
    for c, d, _ in meg:
        shape = classes[c].shape
        other = [e for e in range(len(shape)) if e != d and shape[e] % k == 0 and shape[e] >= k]
        if other:
            state.append((c, max(other, key=lambda e: (shape[e], -e)), first))
    kl = ctx.mesh.axis_size(last)
    for vid in data:
        c = cls_of[vid]
        shape = classes[c].shape
        if shape[0] % k == 0 and (c, 0, first) not in state:
            state.append((c, 0, first))
        if len(shape) > 1 and shape[-1] % kl == 0 and (c, len(shape) - 1, last) not in state:
            state.append((c, len(shape) - 1, last))
    return tuple(state)


def baseline_states(ctx: TacticContext, classes: Sequence[PointClass], axes: tuple[str, ...]) -> list:
    """(name, state) of each hand-written plan that applies to this program."""
    cls_of, weights, data = _roles(ctx, classes)
    out = [("replicated", ())]
    if data:
        out.append((f"data parallel ({','.join(axes)})", _data_parallel(ctx, classes, cls_of, data, axes)))
    if weights:
        meg = _megatron(ctx, classes, cls_of, weights, axes[-1])
        if meg:
            out.append((f"Megatron ({axes[-1]})", meg))
            if len(axes) > 1 and data:
                dp = _data_parallel(ctx, classes, cls_of, data, axes[:-1])
                out.append((f"data parallel ({','.join(axes[:-1])}) + Megatron ({axes[-1]})", dp + meg))
            if len(axes) > 1:
                out.append((f"2D ({axes[0]},{axes[-1]})", _two_d(ctx, classes, cls_of, data, meg, axes[0], axes[-1])))
    return [(n, s) for n, s in out if n == "replicated" or s]
