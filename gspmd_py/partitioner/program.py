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

from ..errors import PartitionWarning
from ..ir import Graph, Op
from ..ops import rule_for
from . import dot_handler, fallback, generic, reduce_handler  # noqa: F401  (register handlers)
from .context import Ctx
from .pvalue import FineDims, PValue
from .registry import HANDLERS
from .reshard import reshard


def op_label(op: Op) -> str:
    return f"{op.prim} #{op.id}" + (f" ({op.source})" if op.source else "")


def boundary_out_dims(ctx: Ctx, shape, dims: FineDims) -> FineDims:
    """Drop the axes of dims whose size they do not divide (jax.Arrays must divide evenly)."""
    return tuple(axes if not axes or n % ctx.k(axes) == 0 else () for n, axes in zip(shape, dims))


def build_body(graph: Graph, ctx: Ctx, in_dims: Sequence[FineDims], out_dims: Sequence[FineDims],
               want: dict[int, FineDims]) -> Callable:
    """The per-device function: local (padded) inputs -> local outputs."""

    def body(*xs):
        env: dict[int, PValue] = {}
        ctx.current_op = "boundary"
        for v, x, d in zip(graph.inputs, xs, in_dims):
            env[v.id] = ctx.pv(x, v.shape, d)

        def get(v) -> PValue:
            pv = env.get(v.id)
            if pv is None:  # constants: each device takes its shard when a consumer asks
                if v.const is None:
                    raise KeyError(f"value %{v.id} used before definition")
                pv = ctx.pv(jnp.asarray(v.const), v.shape, ((),) * v.rank)
                env[v.id] = pv
            return pv

        for op in graph.ops:
            ctx.current_op = op_label(op)
            rule = rule_for(op)
            args = [get(v) for v in op.inputs]
            w = [want.get(v.id, ((),) * v.rank) for v in op.outputs]
            results = HANDLERS[rule.handler](ctx, op, rule, args, w)
            for v, r, wd in zip(op.outputs, results, w):
                env[v.id] = reshard(ctx, r, wd, keep_partial=True)
        ctx.current_op = "boundary"
        outs = []
        for v, d in zip(graph.outputs, out_dims):
            pv = reshard(ctx, get(v), boundary_out_dims(ctx, v.shape, d))
            x = pv.x
            # cut the padding of dims that leave unsharded
            for i, (n, axes) in enumerate(zip(v.shape, pv.dims)):
                if not axes and x.shape[i] != n:
                    x = jnp.take(x, jnp.arange(n), axis=i)
            outs.append(x)
        return tuple(outs)

    return body


def warn_fallbacks(ctx: Ctx) -> None:
    for fb in ctx.fallbacks:
        warnings.warn(f"gspmd_py: involuntary full rematerialization at {fb.op}: {fb.reason}", PartitionWarning,
                      stacklevel=4)
