"""The driver: walk the IR once and emit ONE per-device program from the recorded projections.

For every op, propagation recorded a projection (propagation/projection.py): per factor
the mesh axes, hence each operand's and result's sharding. The driver

1. reshards each operand to its projected sharding (an operand held whole on a windowed
   dim stays whole: the handler slices its window locally), keeping a partial operand
   partial where ``partial.carry_modes`` allows;
2. runs the handler the rule names, which computes locally (plus halo exchanges) and
   returns results in the projected sharding, partial over sharded reduction factors;
3. reshards each result to the sharding propagation chose for the value (a partial may
   stay partial until a consumer needs the reduced value).

With ``collective_matmul_bytes`` or a hardware (shaping.py), a dot whose operand would be
all-gathered runs as a ring of permutes and partial dots instead (collective_matmul.py).

Each op's emission runs under ``jax.named_scope("op<id>")``, so every equation of the
program, collectives included, names the op that caused it (the program index, program/program_index.py, reads that).
At the boundary, uneven inputs arrive padded to whole shards and uneven outputs leave with
the axes of their non-dividing dims dropped (the nearest sharding a jax.Array can hold).
"""
from __future__ import annotations

import warnings
from typing import Callable, Mapping, Optional, Sequence

import attrs
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..core import dtypes
from ..core.errors import PartitionWarning
from ..core.ir import Graph, Op, user_name
from ..ops import facts as F
from ..ops import facts_of
from ..ops.rule import NEED_REPLICATION, OpRule
from ..propagation.projection import Projection
from . import collective_matmul, fork, registry
from .context import Ctx
from .diagnostics import Diagnostics
from ..core.fine_mesh import FineMesh
from .partial import KEEP, REDUCE, TO_PARTIAL, accumulate, carry_modes, join, settle_kept, zero_everywhere
from .pvalue import FineDims, Partial, PValue, shards
from .reshard import reshard


@attrs.frozen
class OpPlan:
    """An op's projection in fine mesh axes (what the handler executes)."""

    factors: dict  # factor id -> fine axes
    operands: tuple[FineDims, ...]
    results: tuple[FineDims, ...]
    partial_axes: tuple[str, ...] = ()  # the projection's partial results: fine axes ...
    partial_op: str = "sum"  # ... and how they combine

    def axes(self, f: int) -> tuple[str, ...]:
        return self.factors.get(f, ())

    @property
    def partial(self) -> Optional[Partial]:
        """The partial the op's results carry, as the projection recorded it (None: none)."""
        return Partial(self.partial_axes, self.partial_op) if self.partial_axes else None


def fine_plan(fine: FineMesh, proj: Projection) -> OpPlan:
    p = proj.partial
    return OpPlan({f: tuple(n for r in axes for n in fine.fine(r)) for f, axes in proj.factors.items()},
                  tuple(fine.fine_dims(d) for d in proj.operand_dims),
                  tuple(fine.fine_dims(d) for d in proj.result_dims),
                  tuple(n for r in p.axes for n in fine.fine(r)) if p else (), p.op if p else "sum")


def op_label(op: Op) -> str:
    """How reports and collectives name ``op``: its user name (ir.user_name: ``gp.annotate``,
    ``with_sharding_constraint``, ``output boundary`` for an output's port), its id and its source line."""
    return f"{user_name(op)} #{op.id}" + (f" ({op.source})" if op.source else "")


def op_scope(op: Op) -> str:
    return f"op{op.id}"


def boundary_out_dims(sizes: Mapping[str, int], shape, dims: FineDims) -> FineDims:
    """Drop the axes of dims whose size they do not divide (jax.Arrays must divide evenly);
    a zero-size output leaves replicated (it holds no data: runtime/stages.py's jit_program).
    ``sizes``: fine axis -> size."""
    if 0 in shape:
        return ((),) * len(shape)
    return tuple(axes if not axes or n % shards(sizes, axes) == 0 else () for n, axes in zip(shape, dims))


def operand_target(rule: OpRule, i: int, arg: PValue, projected: FineDims) -> FineDims:
    """The projected sharding of operand i, except that a windowed dim held whole stays whole."""
    return tuple(() if (not arg.dims[d] and rule.windowed(i, d)) else t for d, t in enumerate(projected))


def empty_results(ctx: Ctx, op: Op, plan: OpPlan) -> list[PValue] | None:
    """An op whose results all have zero elements computes nothing: each device holds empty
    arrays of the local shapes (decided at plan time, whatever the op; e.g. ``x[9:9:2]`` of
    a sharded dim, whose window geometry would otherwise ask for negative halo widths)."""
    if op.regions or not op.outputs or any(v.size for v in op.outputs):
        return None
    return [ctx.pv(jnp.zeros(ctx.local_shape(v.shape, d), v.dtype), v.shape, d, dtype=v.dtype)
            for v, d in zip(op.outputs, plan.results)]


def partition_op(ctx: Ctx, op: Op, rule: OpRule, plan: OpPlan, args: Sequence[PValue]) -> list[PValue]:
    empty = empty_results(ctx, op, plan)
    if empty is not None:
        return empty
    if ctx.shaping.active and rule.handler == "dot":  # an all-gather feeding the dot, as a ring
        targets = [operand_target(rule, i, a, plan.operands[i]) for i, a in enumerate(args)]
        looped = collective_matmul.all_gather_dot(ctx, op, rule, plan, args, targets, reshard)
        if looped is not None:
            ctx.hand_over(op.id, args, targets)
            return looped
    modes, carried = carry_modes(op, args)
    xs = []
    for i, (a, mode) in enumerate(zip(args, modes)):
        target = operand_target(rule, i, a, plan.operands[i])
        _note_forced_gathers(ctx, rule, i, a, target)
        fresh = _regenerated(ctx, op.inputs[i], a, target)
        xs.append(fresh if fresh is not None else reshard(ctx, a, target, keep_partial=(mode == KEEP)))
    # the partial the results carry is what the reshards returned, never the operands'
    # partial before them: a reshard onto a partial axis IS that axis's reduction
    modes, carried = settle_kept(ctx, xs, modes)
    for i, mode in enumerate(modes):
        if mode == TO_PARTIAL:
            r = xs[i]
            acc = accumulate(r.dtype, carried.op)
            xs[i] = ctx.pv(join(ctx, r.x, carried, acc, zero=zero_everywhere(op.inputs[i])), r.shape, r.dims,
                           carried, r.dtype)
    if carried is not None:
        xs, done = _held_wide(ctx, op, plan, xs, modes, carried)
        if done is not None:
            return done
    ctx.hand_over(op.id, args, [x.dims for x in xs])
    results = registry.HANDLERS[rule.handler](ctx, op, rule, plan, xs)
    if carried is None:
        return results
    out = []
    for r in results:
        own = r.partial_axes
        p = Partial(tuple(sorted(set(carried.axes) | set(own), key=ctx.fine.names.index)), carried.op)
        out.append(ctx.pv(r.x, r.shape, r.dims, p, r.dtype))
    return out


def _regenerated(ctx: Ctx, v, a: PValue, target: FineDims) -> PValue | None:
    """An iota wanted in another layout than it was made in is made again in that one (its
    local block costs what a reshard's copy does, and moves nothing): ``jnp.argsort``'s index
    operand follows the values to the dim their sort moved its axes to, without an all-to-all."""
    src = v.producer
    if src is None or src.prim != "iota" or a.partial is not None or tuple(a.dims) == tuple(target):
        return None
    return registry.HANDLERS["iota"](ctx, src, ctx.rules[src.id], OpPlan({}, (), (tuple(target),)), [])[0]


def _held_wide(ctx: Ctx, op: Op, plan: OpPlan, xs: list[PValue], modes, carried: Partial):
    """A partial kept through ``op`` may be held in a wider accumulation dtype than its own
    (float16 sums in float32, partial.py): the op then runs in that dtype, its other float
    operands cast up (a float16 partial divided by a float16 constant divides in float32),
    and a convert keeps the wide form (converting the partial back to float16 would
    overflow before the all-reduce). Returns (operands, None), or (_, results) of a convert."""
    wide = next((x.x.dtype for x, m in zip(xs, modes) if m == KEEP and x.x.dtype != np.dtype(x.dtype)), None)
    if wide is None:
        return xs, None
    if facts_of(op.prim).linearity == F.CONVERT:  # (convert_element_type)
        v = op.outputs[0]
        x = xs[0].x.astype(accumulate(v.dtype, carried.op))
        return xs, [ctx.pv(x, v.shape, plan.results[0], carried, v.dtype)]
    return [ctx.pv(x.x.astype(wide), x.shape, x.dims, x.partial, x.dtype)
            if m == REDUCE and dtypes.is_float(x.x.dtype) and x.x.dtype != wide else x
            for x, m in zip(xs, modes)], None


def _note_forced_gathers(ctx: Ctx, rule: OpRule, i: int, a: PValue, target: FineDims) -> None:
    """Say so when the rule makes a sharded operand dim whole (the report shows it)."""
    for d, (have, fs) in enumerate(zip(a.dims, rule.operands[i])):
        lost = [x for x in have if x not in target[d]]
        if lost and fs and all(rule.factors[f].kind == NEED_REPLICATION for f in fs):
            moved = [e for e, t in enumerate(target) if e != d and any(x in t for x in lost)]
            how = f"moved to dim {moved[0]}" if moved else "gathered whole"
            ctx.note(f"operand {i} dim {d} (size {a.shape[d]}) needs replication for "
                     f"this op: sharded over {ctx.fine.label(lost)}, {how}")


def run_graph(ctx: Ctx, graph: Graph, inputs: Sequence[PValue], keep: frozenset = frozenset()) -> list[PValue]:
    """Partition ``graph``'s ops in order; returns its outputs as partitioned values.

    Region handlers (scan/while/cond) call this recursively on their bodies. Outputs leave
    reduced, except the values in ``keep`` (ids), which may stay partial (a scan's carried
    accumulator, control_handler.py); a partial input stays partial.
    """
    want = ctx.want
    # a body's parameters take the sharding recorded for them (a no-op unless a loop's projection
    # chose another layout for the position than propagation gave the parameter)
    env: dict[int, PValue] = {v.id: ctx.hold(v.id, reshard(ctx, pv, want.get(v.id, pv.dims), keep_partial=True))
                              for v, pv in zip(graph.inputs, inputs)}

    def get(v) -> PValue:
        pv = env.get(v.id)
        if pv is None:  # constants: each device takes its shard when a consumer asks
            if v.const is None:
                raise KeyError(f"value %{v.id} used before definition")
            pv = ctx.pv(_constant(v.const, v.dtype), v.shape, ((),) * v.rank)
            env[v.id] = pv
        return pv

    final = {v.id for v in graph.outputs} - keep  # a graph's outputs leave reduced, in their op's scope
    # a partial that forks into several reductions is reduced once, where it is made (fork.py)
    final |= fork.reduce_at_fork(ctx, graph, inputs, keep)
    for op in graph.ops:
        with ctx.visit(op_label(op)), jax.named_scope(op_scope(op)):
            results = partition_op(ctx, op, ctx.rules[op.id], ctx.plans[op.id], [get(v) for v in op.inputs])
            for v, r in zip(op.outputs, results):
                env[v.id] = ctx.hold(v.id, reshard(ctx, r, want.get(v.id, ((),) * v.rank),
                                                   keep_partial=v.id not in final))
    return [get(v) for v in graph.outputs]


def _constant(value, dtype):
    """A plan-time constant as the program's operand: a scalar as a NumPy scalar (JAX stages it
    as a literal of the equation, as it was in the user's jaxpr; ``jnp.asarray`` would first
    place it on a device, ~0.1 ms each), anything else as a jax array. A float0 (the tangent of an
    integer) holds no data: NumPy zeros of its shape, as JAX itself passes float0 values; a typed PRNG
    key constant is kept as the jax array it is (it has no NumPy form)."""
    if dtypes.is_float0(dtype):
        return np.zeros(np.shape(value), dtype=dtype)
    if dtypes.is_key(dtype):
        return value
    if np.ndim(value) == 0:
        return np.asarray(value, dtype=dtype)[()]
    return jnp.asarray(value, dtype=dtype)


def build_body(graph: Graph, ctx: Ctx, in_dims: Sequence[FineDims], out_dims: Sequence[FineDims]) -> Callable:
    """The per-device function: local (padded) inputs -> local outputs."""

    def body(*xs):
        ins = [ctx.pv(x, v.shape, d, dtype=v.dtype) for v, x, d in zip(graph.inputs, xs, in_dims)]
        results = run_graph(ctx, graph, ins)
        outs = []
        with jax.named_scope("boundary"):
            for v, pv, d in zip(graph.outputs, results, out_dims):
                pv = reshard(ctx, pv, boundary_out_dims(ctx.sizes, v.shape, d))
                x = pv.x
                # cut the padding of dims that leave unsharded
                for i, (n, axes) in enumerate(zip(v.shape, pv.dims)):
                    if not axes and x.shape[i] != n:
                        x = lax.slice_in_dim(x, 0, n, axis=i)
                outs.append(x)
        return tuple(outs)

    return body


def warn_fallbacks(diagnostics: Diagnostics) -> None:
    """A PartitionWarning per op that fell back replicated (attributed to the caller)."""
    for fb in diagnostics.fallbacks:
        warnings.warn(f"gspmd_py: involuntary full rematerialization at {fb.op}: {fb.reason}", PartitionWarning,
                      stacklevel=2)
