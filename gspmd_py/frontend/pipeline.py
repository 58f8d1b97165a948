"""gp.pipeline: pipeline parallelism the GSPMD way (paper §3.3), written for the user.

No new primitive and no manual code: the schedule is an ordinary JAX loop over
stage-stacked arrays, annotated so that the stage dim lies on the pipe axis, and the
partitioner turns it into one SPMD program (Praxis's ``LayerwiseShardablePipelined``,
MaxText's pipeline module)::

    layers    L = S * R stacked layers: layer l runs on stage l % S in repeat l // S
    x [B,..]  -> M microbatches of B / M rows (microbatch m holds rows m, m + M, m + 2M, ...,
              so a batch dim sharded over a data axis stays sharded in every microbatch)
    loop      T = M * R + S - 1 iterations; at iteration t stage s works on item k = t - s
              (repeat k // M, microbatch k % M) when 0 <= k < M * R, else it idles (bubble)
    per t     state [S, mb, ..] (pipe-sharded) shifted one stage by jnp.roll: ONE
              collective-permute of one microbatch shard (stage s-1 -> s, S-1 -> 0);
              stage 0 takes microbatch t % M (repeat 0) or its loop-back buffer (repeat > 0:
              the last stage's output of the previous repeat, arrived by the same shift);
              every stage runs stage_fn on its own layer (vmapped over S) and files its
              output in its slot of a pipe-sharded buffer (a local row update)
    after     the last stage's buffer is the result: one extraction outside the loop

    bubble = (S - 1) / (M * R + S - 1)

Weight layouts: with R = 1 the stacked weights given as P(axis) (stage s holds layer s) are
what the schedule reads: nothing moves. With R > 1 stage s runs layers s, s + S, s + 2S, ...
(the circular order), which no tiling of the flat layer dim holds: given as P(axis) (the
natural layout, R consecutive layers per stage) they are re-laid out once per call, before
the loop, by ONE all-to-all per leaf (each stage sends S * ceil(R / S) layer slots; plan.report()
says so); under jax.grad their gradients come back the same way, laid out as given.

With circular_repeats R > 1 the loop-back needs M >= S (a microbatch's output of one repeat
must reach stage 0 before its next repeat starts there). ``stage_fn(params_of_one_layer,
microbatch) -> microbatch`` of the same shape and dtype; it may annotate its values over
other mesh axes (tensor parallelism inside a stage). jax.grad differentiates the loop: the
backward pass is a pipelined loop too (the transposed scan shifts the other way).

An open pipeline (``axis=None, microbatches=None``: the schedule left to the planner) is a
stack of layers the plan may pipeline. With no schedule decided it is the layers in sequence,
one ``lax.scan`` over the layer dim (the ordinary stack, which data parallel / FSDP / Megatron
plans apply to). ``gp.tactics.pipeline(axis, microbatches)`` decides a schedule: gp.spmd
traces its function inside ``scheduled(...)`` (a context variable set only during that trace),
and every open pipeline traced there runs the schedule above with S = the size of ``axis``,
R = L / S. ``gp.auto_shard`` finds the open pipelines (``scheduled(None)`` records them) and
prices schedules against no pipeline (api/auto_pipeline.py).
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator, Optional

import attrs
import jax
import numpy as np
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .annotate import OPEN, annotate
from ..core.dtypes import short_name
from ..core.errors import ArgumentError, short_repr

# the identity on a pipeline's result, carrying its schedule (plan.report() prints it)
pipeline_p = Primitive("gspmd_pipeline")
pipeline_p.def_impl(lambda x, **_: x)
pipeline_p.def_abstract_eval(lambda x, **_: x)
mlir.register_lowering(pipeline_p, lambda ctx, x, **_: [x])
batching.primitive_batchers[pipeline_p] = lambda args, dims, **kw: (pipeline_p.bind(args[0], **kw), dims[0])
ad.deflinear2(pipeline_p, lambda ct, x, **kw: [pipeline_p.bind(ad.instantiate_zeros(ct), **kw)])


@attrs.frozen
class Schedule:
    """The shape of a pipeline: ``stages`` S, ``microbatches`` M, circular ``repeats`` R."""

    stages: int
    microbatches: int
    repeats: int = 1

    @property
    def iterations(self) -> int:
        """Loop iterations of the schedule: ``microbatches * repeats + stages - 1``."""
        return self.microbatches * self.repeats + self.stages - 1

    @property
    def bubble(self) -> float:
        """The fraction of iterations a stage idles: ``(stages - 1) / iterations``."""
        return (self.stages - 1) / self.iterations

    def __str__(self) -> str:
        text = (f"pipeline: {self.stages} stages x {self.microbatches} microbatches x {self.repeats} repeats, "
                f"{self.iterations} iterations, bubble {self.bubble:.1%}")
        if self.repeats > 1:
            text += (f"; stage s runs layers s, s + {self.stages}, ...: the stacked weights are re-laid out once per "
                     f"call, before the loop, by one all-to-all per leaf")
        return text


@attrs.frozen
class Decision:
    """A schedule decided for the open pipelines of one trace (gp.tactics.pipeline): stage
    dim on ``axis`` of size ``stages``, ``microbatches`` microbatches (R = layers / stages)."""

    axis: str
    stages: int
    microbatches: int


@attrs.frozen
class OpenPipeline:
    """An open gp.pipeline met while tracing: its layers L, the batch size of x, x's type."""

    layers: int
    batch: int
    x_type: str


@attrs.frozen
class _Scope:
    decision: Optional[Decision]
    found: list  # OpenPipeline per open call traced in this scope (this scope's own list)


_SCOPE: contextvars.ContextVar = contextvars.ContextVar("gspmd_pipeline_scope", default=None)


@contextlib.contextmanager
def scheduled(decision: Optional[Decision]) -> Iterator[list]:
    """While a gp.spmd function traces: open pipelines run ``decision`` (None: in sequence);
    yields the list of the OpenPipeline records met (filled as the trace goes)."""
    found: list = []
    token = _SCOPE.set(_Scope(decision, found))
    try:
        yield found
    finally:
        _SCOPE.reset(token)


def pipeline(stage_fn: Callable, stage_params: Any, x, *, axis: Optional[str] = None,
             microbatches: Optional[int] = None, circular_repeats: Optional[int] = None):
    """Run ``stage_fn`` layer after layer over ``x`` as a pipeline over mesh axis ``axis``.

    ``stage_params``: a pytree whose leaves have a leading dim of ``stages * circular_repeats``
    layers (stages = the size of ``axis`` in the mesh the function is partitioned over;
    ``circular_repeats`` default 1).
    Equal to applying the layers in sequence to every row of ``x``::

        for l in range(L): x = stage_fn(params[l], x)

    ``axis=None, microbatches=None`` (and no ``circular_repeats``): an open pipeline, the
    schedule left to the planner. It runs the layers in sequence (one ``lax.scan`` over the
    layer dim) unless the gp.spmd function being traced has ``gp.tactics.pipeline(axis,
    microbatches)`` in its tactics: then the schedule above with S = the size of that axis
    and R = L / S. ``gp.auto_shard`` prices such schedules against no pipeline and keeps the
    cheapest (``res.report()`` says which and why).
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ArgumentError(f"gp.pipeline: x must be an array (the batch the layers run over), got "
                            f"{type(x).__name__} {short_repr(x, 40)}")
    if not callable(stage_fn):
        got = (f"an array of shape {tuple(jnp.shape(stage_fn))}" if hasattr(stage_fn, "shape")
               else f"{type(stage_fn).__name__} {short_repr(stage_fn, 40)}")
        raise ArgumentError(f"gp.pipeline: stage_fn must be a function (one layer's params, one microbatch) -> "
                            f"microbatch, got {got}; the arguments are gp.pipeline(stage_fn, stage_params, x, ...)")
    if axis is None and microbatches is None:
        if circular_repeats is not None:
            raise ArgumentError(f"gp.pipeline: circular_repeats={circular_repeats!r} given without axis and "
                                f"microbatches; an open pipeline (no schedule) takes its repeats from the schedule "
                                f"decided for it (R = layers / stages): give axis and microbatches too, or neither")
        scope = _SCOPE.get()
        n_layers = _layers(stage_params, scheduled=False)
        if jnp.ndim(x) < 1:
            raise ArgumentError(f"gp.pipeline: x needs a leading batch dim, got shape {tuple(jnp.shape(x))}")
        decision = scope.decision if scope is not None else None
        if decision is None:
            if scope is not None:
                scope.found.append(OpenPipeline(n_layers, int(x.shape[0]), _type_str(x)))
            return _sequential(stage_fn, stage_params, x)
        axis, microbatches = decision.axis, decision.microbatches
        circular_repeats = _decided_repeats(stage_params, x, decision)
    elif axis is None or microbatches is None:
        raise ArgumentError(f"gp.pipeline: give both axis and microbatches (a fixed schedule) or neither (an open "
                            f"pipeline, scheduled by gp.tactics.pipeline / gp.auto_shard); got axis={axis!r}, "
                            f"microbatches={microbatches!r}")
    circular_repeats = 1 if circular_repeats is None else circular_repeats
    sched = _schedule(stage_params, x, axis, microbatches, circular_repeats)
    S, M, R = sched.stages, sched.microbatches, sched.repeats
    mb = x.shape[0] // M
    _check_stage_fn(stage_fn, stage_params, jax.ShapeDtypeStruct((mb,) + tuple(x.shape[1:]), x.dtype))
    # rows m, m + M, ... form microbatch m: a reshape whose major dim keeps x's batch sharding
    xs = jnp.swapaxes(x.reshape((mb, M) + x.shape[1:]), 0, 1)  # [M, mb, ...]
    params = jax.tree_util.tree_map(lambda p: _circular(p, S, R, axis), stage_params)
    stage = _on_stages(lax.iota(jnp.int32, S), axis, 0)
    state = _on_stages(jnp.zeros((S,) + xs.shape[1:], x.dtype), axis, 0)
    outs = _on_stages(jnp.zeros((S, M) + xs.shape[1:], x.dtype), axis, 0)
    loop_back = _on_stages(jnp.zeros((S, M) + xs.shape[1:], x.dtype), axis, 0) if R > 1 else None

    def body(carry, t):
        state, outs, loop_back = carry
        recv = _on_stages(jnp.roll(state, 1, axis=0), axis, 0)  # stage s-1 -> s; S-1 -> 0
        k = t - stage  # the item each stage works on (bubble slots compute on stale rows, unread)
        first = jnp.broadcast_to(lax.dynamic_index_in_dim(xs, t % M, 0, keepdims=False), recv.shape)
        if loop_back is not None:
            # stage 0 files what the shift brought from the last stage (item t - S), then reads
            # the loop-back slot of the microbatch it starts now
            # (every stage files into its own slot: only stage 0's are read, and each slot is
            # rewritten by its valid item before it is read, so no select over the buffer)
            filed = lax.dynamic_update_index_in_dim(loop_back, recv, (t - S) % M, 1)
            loop_back = _on_stages(filed, axis, 0)
            again = lax.dynamic_index_in_dim(loop_back, t % M, 1, keepdims=False)
            first = jnp.where(_rows(k >= M, recv.ndim), again, first)
        inputs = _on_stages(jnp.where(_rows(stage == 0, recv.ndim), first, recv), axis, 0)
        layer = jax.tree_util.tree_map(lambda p: _layer_of(p, k // M, R, axis), params)
        y = _on_stages(jax.vmap(stage_fn)(layer, inputs), axis, 0)
        # every stage files its output in its own slot (only the last stage's are read; the last
        # write of each slot is its final repeat's): one row block written, no select
        outs = _on_stages(lax.dynamic_update_index_in_dim(outs, y, (t - (S - 1)) % M, 1), axis, 0)
        return (y, outs, loop_back), None

    ts = jnp.arange(sched.iterations, dtype=jnp.int32)
    (_, outs, _), _ = lax.scan(body, (state, outs, loop_back), ts)
    # [M, mb, ...]: the last stage's rows, extracted once after the loop by a dynamic index on
    # the pipe-sharded dim: the owner contributes its rows, one bit-exact "pick" all-reduce
    out = lax.dynamic_index_in_dim(outs, jnp.int32(S - 1), 0, keepdims=False)
    out = jnp.swapaxes(out, 0, 1).reshape(x.shape)
    return pipeline_p.bind(out, axis=axis, stages=S, microbatches=M, repeats=R)


def schedules(graph) -> list[tuple[str, Schedule]]:
    """The pipelines of a planned graph: (axis, schedule), in program order."""
    return [(op.params["axis"], Schedule(op.params["stages"], op.params["microbatches"], op.params["repeats"]))
            for op in graph.walk() if op.prim == "gspmd_pipeline"]


def _sequential(stage_fn: Callable, stage_params, x):
    """The open pipeline without a schedule: the layers in sequence, one scan over the layer dim."""
    _check_stage_fn(stage_fn, stage_params, jax.ShapeDtypeStruct(tuple(x.shape), x.dtype))

    def body(h, p):
        return stage_fn(p, h), None

    out, _ = lax.scan(body, x, stage_params)
    return out


def _type_str(x) -> str:
    return f"{short_name(x.dtype)}{list(x.shape)}"


def _layers(stage_params, scheduled: bool = True) -> int:
    """The common leading (layer) dim of the stage_params leaves (ArgumentError otherwise; 0
    layers too where a schedule puts them on stages: the open pipeline's scan of none is x)."""
    leaves = jax.tree_util.tree_leaves(stage_params)
    if not leaves:
        raise ArgumentError("gp.pipeline: stage_params has no arrays (it needs one leaf per stacked layer weight)")
    layers = {jnp.shape(p)[0] if jnp.ndim(p) else None for p in leaves}
    if len(layers) != 1 or None in layers:
        shapes = [tuple(jnp.shape(p)) for p in leaves]
        raise ArgumentError(f"gp.pipeline: every stage_params leaf needs the same leading (layer) dim; got shapes "
                            f"{shapes}")
    n = int(next(iter(layers)))
    if n == 0 and scheduled:
        raise ArgumentError(f"gp.pipeline: stage_params have 0 stacked layers (leaf shapes "
                            f"{[tuple(jnp.shape(p)) for p in leaves][:4]}): a pipeline needs at least one layer")
    return n


def _decided_repeats(stage_params, x, d: Decision) -> int:
    """R = L / S for a decided schedule, or an ArgumentError naming the tensor, dim and axis
    that the schedule cannot apply to."""
    what = f"gp.tactics.pipeline({d.axis!r}, microbatches={d.microbatches})"
    n_layers = _layers(stage_params)
    if n_layers % d.stages:
        path, leaf = jax.tree_util.tree_flatten_with_path(stage_params)[0][0]
        name = jax.tree_util.keystr(path) or "stage_params"
        raise ArgumentError(f"{what}: stage_params leaf {name} ({_type_str(leaf)}) has {n_layers} stacked layers on "
                            f"dim 0, which mesh axis {d.axis!r} of size {d.stages} does not split into equal "
                            f"stages (layers must be a multiple of the stages)")
    repeats = n_layers // d.stages
    if x.shape[0] % d.microbatches:
        raise ArgumentError(f"{what}: dim 0 (batch) of x ({_type_str(x)}) does not split into {d.microbatches} equal "
                            f"microbatches for the stages on mesh axis {d.axis!r}")
    if repeats > 1 and d.microbatches < d.stages:
        raise ArgumentError(f"{what}: {n_layers} layers on the {d.stages} stages of mesh axis {d.axis!r} are "
                            f"{repeats} circular repeats, which need microbatches >= stages ({d.microbatches} < "
                            f"{d.stages}) for dim 0 (batch) of x ({_type_str(x)})")
    return repeats


def _schedule(stage_params, x, axis: str, microbatches: int, repeats: int) -> Schedule:
    n_layers = _layers(stage_params)
    if not isinstance(axis, str) or not axis:
        raise ArgumentError(f"gp.pipeline: axis must be a mesh axis name, got {axis!r}")
    for name, v in (("microbatches", microbatches), ("circular_repeats", repeats)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ArgumentError(f"gp.pipeline: {name} must be a positive int, got {v!r}")
    if n_layers % repeats:
        raise ArgumentError(f"gp.pipeline: {n_layers} stacked layers do not split into circular_repeats={repeats} "
                            f"repeats of equal stages")
    stages = n_layers // repeats
    if jnp.ndim(x) < 1 or x.shape[0] % microbatches:
        raise ArgumentError(f"gp.pipeline: the batch dim of x (shape {tuple(jnp.shape(x))}) does not split into "
                            f"microbatches={microbatches} equal microbatches")
    if repeats > 1 and microbatches < stages:
        raise ArgumentError(f"gp.pipeline: circular_repeats={repeats} needs microbatches >= stages ({microbatches} < "
                            f"{stages}): a microbatch's output must come back to stage 0 before its next repeat")
    return Schedule(stages, microbatches, repeats)


def _check_stage_fn(stage_fn: Callable, stage_params, micro: jax.ShapeDtypeStruct) -> None:
    """``stage_fn(one layer, one microbatch)`` returns one array of the microbatch's shape and
    dtype (the schedule feeds each stage's output to the next): said here, naming stage_fn,
    rather than as a JAX error from inside the loop."""
    layer = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(jnp.shape(p)[1:], jnp.result_type(p)),
                                   stage_params)
    got = jax.eval_shape(stage_fn, layer, micro)
    name = getattr(stage_fn, "__name__", None) or type(stage_fn).__name__
    want = f"{short_name(micro.dtype)}{list(micro.shape)}"
    if not isinstance(got, jax.ShapeDtypeStruct):
        leaves = jax.tree_util.tree_leaves(got)
        raise ArgumentError(f"gp.pipeline: stage_fn {name} returns a {type(got).__name__} of {len(leaves)} "
                            f"arrays; it must return one array like its microbatch input ({want}): each "
                            f"stage's output is the next stage's input")
    if tuple(got.shape) != tuple(micro.shape) or got.dtype != micro.dtype:
        raise ArgumentError(f"gp.pipeline: stage_fn {name} maps a microbatch {want} to "
                            f"{short_name(got.dtype)}{list(got.shape)}; it must keep the shape and dtype "
                            f"(each stage's output is the next stage's input): cast or project inside stage_fn, "
                            f"or change the width outside the pipeline")


def _on_stages(v, axis: str, dim: int):
    """``v`` with dim ``dim`` (the stage dim) over ``axis``, its other dims left open."""
    spec = [OPEN] * v.ndim
    spec[dim] = axis
    for d in range(dim):
        spec[d] = None
    return annotate(v, tuple(spec))


def _rows(mask, ndim: int = 1):
    """A per-stage [S] mask broadcast against [S, ...] values of rank ``ndim``."""
    return mask.reshape(mask.shape + (1,) * (ndim - 1))


def _circular(p, S: int, R: int, axis: str):
    """The layer stack ``p`` [L = R*S, ...] as the schedule reads it: [R, S, ...], layer
    r*S + s at [r, s], the stage dim on ``axis`` (stage s holds layers s, s + S, ...).

    R = 1: a reshape. R > 1: the natural layout P(axis) holds R consecutive layers per stage
    (blocks), which the circular schedule does not read; each stage packs the layers it holds
    by destination stage into [S, K] slots (K = ceil(R / S), a select per layer, local), ONE
    all-to-all over ``axis`` sends them, and each stage files what it received by repeat (a
    select per slot, local). Padding slots carry zeros. A replicated stack moves nothing (the
    all-to-all becomes a local slice)."""
    rest = p.shape[1:]
    if R == 1:
        return _on_stages(p.reshape((R, S) + rest), axis, 1)
    K = -(-R // S)
    d, sd, k = np.meshgrid(np.arange(S), np.arange(S), np.arange(K), indexing="ij")
    j = (sd - d * R) % S + k * S  # the row of block d that goes to slot [d, s, k]
    valid = j < R
    open_rest = (OPEN,) * len(rest)
    blk = annotate(p.reshape((S, R) + rest), (axis, None) + open_rest)  # block d: layers d*R .. d*R + R - 1
    packed = jnp.zeros((S, S, K) + rest, p.dtype)
    for row in range(R):
        hit = jnp.asarray((valid & (j == row)).reshape(valid.shape + (1,) * len(rest)))
        packed = jnp.where(hit, blk[:, row][:, None, None], packed)
    packed = annotate(packed, (axis, None, None) + open_rest)  # packed where the blocks are
    moved = annotate(packed, (None, axis, None) + open_rest)  # the one all-to-all
    # slot [d, s, k] holds layer d*R + j: its repeat r = (d*R + j) // S on stage s
    r_of = np.where(valid, (d * R + j) // S, -1)
    out = jnp.zeros((R, S) + rest, p.dtype)
    for dd in range(S):
        for kk in range(K):
            r_at = r_of[dd, :, kk]  # per stage s: the repeat this slot fills (-1: padding)
            if (r_at < 0).all():
                continue
            hit = (np.arange(R)[:, None] == r_at[None, :]).reshape((R, S) + (1,) * len(rest))
            out = jnp.where(jnp.asarray(hit), moved[dd, :, kk][None], out)
    return _on_stages(out, axis, 1)


def _layer_of(p, repeat, repeats: int, axis: str):
    """Each stage's layer of its current repeat from [R, S, ...] stacked weights: a chain of
    selects over the R repeats (local on the pipe-sharded stage dim; no gather, exact)."""
    out = p[0]
    for r in range(1, repeats):
        out = jnp.where(_rows(repeat == r, out.ndim), p[r], out)
    return _on_stages(out, axis, 0)

