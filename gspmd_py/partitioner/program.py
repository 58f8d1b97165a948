"""The driver: walk the IR once and emit ONE per-device program.

``build_body(graph, fine, shardings)`` returns the function that ``jax.shard_map`` runs
on every device (all mesh axes manual). Each op goes to the handler its rule names;
results are resharded to the sharding propagation chose for them (partial sums may stay
partial until a consumer needs the reduced value). At the boundary, uneven inputs
arrive padded to whole shards and uneven outputs leave with the axes of their
non-dividing dims dropped (the nearest sharding a jax.Array can hold).
"""
from __future__ import annotations

import warnings
from typing import Callable, Sequence

import jax.numpy as jnp
from jax import lax

from ..errors import PartitionWarning
from ..ir import Graph, Op
from ..ops import rule_for
from . import (control_handler, conv_handler, dot_handler, fallback, generic, reduce_handler,  # noqa: F401
               windowed_handler)  # (register handlers)
from .context import Ctx
from .pvalue import FineDims, PValue
from .registry import HANDLERS
from .reshard import reshard


def op_label(op: Op) -> str:
    return f"{op.prim} #{op.id}" + (f" ({op.source})" if op.source else "")


def boundary_out_dims(ctx: Ctx, shape, dims: FineDims) -> FineDims:
    """Drop the axes of dims whose size they do not divide (jax.Arrays must divide evenly)."""
    return tuple(axes if not axes or n % ctx.k(axes) == 0 else () for n, axes in zip(shape, dims))


def run_graph(ctx: Ctx, graph: Graph, inputs: Sequence[PValue]) -> list[PValue]:
    """Partition ``graph``'s ops in order; returns its outputs as partitioned values.

    Region handlers (scan/while/cond) call this recursively on their bodies.
    """
    env: dict[int, PValue] = {v.id: pv for v, pv in zip(graph.inputs, inputs)}
    want = ctx.want

    def get(v) -> PValue:
        pv = env.get(v.id)
        if pv is None:  # constants: each device takes its shard when a consumer asks
            if v.const is None:
                raise KeyError(f"value %{v.id} used before definition")
            pv = ctx.pv(jnp.asarray(v.const), v.shape, ((),) * v.rank)
            env[v.id] = pv
        return pv

    outer = ctx.current_op
    for op in graph.ops:
        ctx.current_op = op_label(op)
        rule = rule_for(op)
        args = [get(v) for v in op.inputs]
        w = [want.get(v.id, ((),) * v.rank) for v in op.outputs]
        results = HANDLERS[rule.handler](ctx, op, rule, args, w)
        for v, r, wd in zip(op.outputs, results, w):
            env[v.id] = reshard(ctx, r, wd, keep_partial=True)
    ctx.current_op = outer
    return [get(v) for v in graph.outputs]


def build_body(graph: Graph, ctx: Ctx, in_dims: Sequence[FineDims], out_dims: Sequence[FineDims],
               want: dict[int, FineDims]) -> Callable:
    """The per-device function: local (padded) inputs -> local outputs."""
    ctx.want = want

    def body(*xs):
        ctx.current_op = "boundary"
        results = run_graph(ctx, graph, [ctx.pv(x, v.shape, d) for v, x, d in zip(graph.inputs, xs, in_dims)])
        ctx.current_op = "boundary"
        outs = []
        for v, pv, d in zip(graph.outputs, results, out_dims):
            pv = reshard(ctx, pv, boundary_out_dims(ctx, v.shape, d))
            x = pv.x
            # cut the padding of dims that leave unsharded
            for i, (n, axes) in enumerate(zip(v.shape, pv.dims)):
                if not axes and x.shape[i] != n:
                    x = lax.slice_in_dim(x, 0, n, axis=i)
            outs.append(x)
        return tuple(outs)

    return body


def warn_fallbacks(ctx: Ctx) -> None:
    for fb in ctx.fallbacks:
        warnings.warn(f"gspmd_py: involuntary full rematerialization at {fb.op}: {fb.reason}", PartitionWarning,
                      stacklevel=4)
