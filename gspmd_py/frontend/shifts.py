"""Shifts and rotations written the long way, folded into one op before propagation.

Pipelines move a stage-stacked state one stage on each iteration, and the code in use
writes that move in several ways (Praxis, MaxText, the JAX docs). Op by op, each form
would be partitioned as slices and a concatenate or a pad of a sharded dim, which costs 2-3
collective-permutes where one suffices; folded, each is ONE op whose partitioned form is one
collective-permute per shift (XLA's partitioner finds the same)::

    concatenate(x[n-s:], x[:n-s])  along d   (jnp.roll(x, s, d), Praxis _rotate_right)
        -> gspmd_rotate[axis=d, shift=s] x
    pad(x, lo, hi)[a:b]            along d   (jnp.pad then a slice, Praxis _shift_right)
        -> pad(x, lo - a, hi - (N - b))       (negative padding crops; exact for stride 1,
                                               no interior padding; N the padded size)
    pad(x[:b], lo, 0)  /  pad(x[a:], 0, hi)  (a slice then a pad)
        -> pad(x, lo, -(n - b))  /  pad(x, -a, hi)

Only stride-1 slices that keep every other dim whole are folded; everything else is left
as it was. The pass runs on the traced graph, loop bodies included (``fold``).
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from ..core.ir import Graph, Op, Value

rotate_p = Primitive("gspmd_rotate")
rotate_p.def_impl(lambda x, *, axis, shift: jnp.roll(x, shift, axis))
rotate_p.def_abstract_eval(lambda x, **_: x)
mlir.register_lowering(rotate_p, mlir.lower_fun(lambda x, *, axis, shift: jnp.roll(x, shift, axis),
                                                multiple_results=False))
ad.deflinear2(rotate_p, lambda ct, x, *, axis, shift: [rotate_p.bind(ad.instantiate_zeros(ct), axis=axis,
                                                                      shift=-shift)])
batching.primitive_batchers[rotate_p] = lambda args, dims, *, axis, shift: (
    rotate_p.bind(args[0], axis=axis + (dims[0] is not None and dims[0] <= axis), shift=shift), dims[0])


def fold(graph: Graph) -> Graph:
    """Fold the shift and rotate forms above, in ``graph`` and its regions (in place)."""
    uses: dict[int, int] = {}
    for op in graph.ops:
        for v in op.inputs:
            uses[v.id] = uses.get(v.id, 0) + 1
    for v in graph.outputs:
        uses[v.id] = uses.get(v.id, 0) + 1
    for op in graph.ops:
        for r in op.regions:
            fold(r)
        if op.prim == "slice":
            _slice_of_pad(op, uses)
        elif op.prim == "pad":
            _pad_of_slice(op, uses)
        elif op.prim == "concatenate":
            _rotation(op)
    return graph


def _window(op: Op) -> Optional[tuple[int, int, int]]:
    """(dim, start, limit) of a stride-1 slice that cuts one dim and keeps the others whole."""
    if op.prim != "slice":
        return None
    strides = op.params.get("strides")
    if strides is not None and any(s != 1 for s in strides):
        return None
    shape = op.inputs[0].shape
    cut = [d for d, (a, b, n) in enumerate(zip(op.params["start_indices"], op.params["limit_indices"], shape))
           if (a, b) != (0, n)]
    if len(cut) != 1:
        return None
    d = cut[0]
    return d, int(op.params["start_indices"][d]), int(op.params["limit_indices"][d])


def _plain_pad(op: Op) -> bool:
    return op.prim == "pad" and all(int(i) == 0 for _, _, i in op.params["padding_config"])


def _as_pad(op: Op, x: Value, fill: Value, config, primitive) -> None:
    op.prim, op.primitive = "pad", primitive
    op.inputs = [x, fill]
    op.params = {"padding_config": tuple((int(lo), int(hi), 0) for lo, hi, _ in config)}


def _slice_of_pad(op: Op, uses: dict) -> None:
    src = op.inputs[0].producer
    w = _window(op)
    if w is None or src is None or not _plain_pad(src) or uses.get(op.inputs[0].id, 0) != 1:
        return
    d, a, b = w
    n_padded = op.inputs[0].shape[d]
    cfg = [tuple(c) for c in src.params["padding_config"]]
    lo, hi, _ = cfg[d]
    cfg[d] = (int(lo) - a, int(hi) - (n_padded - b), 0)
    _as_pad(op, src.inputs[0], src.inputs[1], cfg, src.primitive)


def _pad_of_slice(op: Op, uses: dict) -> None:
    src = op.inputs[0].producer
    if src is None or not _plain_pad(op) or uses.get(op.inputs[0].id, 0) != 1:
        return
    w = _window(src)
    if w is None:
        return
    d, a, b = w
    n = src.inputs[0].shape[d]
    cfg = [tuple(c) for c in op.params["padding_config"]]
    if any((int(lo), int(hi)) != (0, 0) for i, (lo, hi, _) in enumerate(cfg) if i != d):
        return
    lo, hi, _ = cfg[d]
    if a == 0 and int(hi) == 0:  # a prefix, padded before: a shift towards higher rows
        cfg[d] = (int(lo), -(n - b), 0)
    elif b == n and int(lo) == 0:  # a suffix, padded after: a shift towards lower rows
        cfg[d] = (-a, int(hi), 0)
    else:
        return
    _as_pad(op, src.inputs[0], op.inputs[1], cfg, op.primitive)


def _rotation(op: Op) -> None:
    if len(op.inputs) != 2:
        return
    first, second = (v.producer for v in op.inputs)
    if first is None or second is None:
        return
    w1, w2 = _window(first), _window(second)
    d = op.params["dimension"]
    if w1 is None or w2 is None or first.inputs[0] is not second.inputs[0] or w1[0] != d or w2[0] != d:
        return
    x = first.inputs[0]
    n = x.shape[d]
    (_, a, b), (_, a2, b2) = w1, w2
    if not (b == n and a2 == 0 and b2 == a and 0 < a < n):
        return
    op.prim, op.primitive = "gspmd_rotate", rotate_p
    op.inputs = [x]
    op.params = {"axis": int(d), "shift": int(n - a)}
