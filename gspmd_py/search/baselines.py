"""The hand-written plans, said as search states: starting points and the report's yardsticks.

* replicated: nothing decided over the searched axes;
* data parallel: the leading dim of every data input over every searched axis (and, when
  that split is uneven, over the axes that divide it evenly: pricing decides);
* Megatron (where the program has matmuls): walking the program in order, a weight's first
  matmul splits it on its output columns when the activation it meets is not split yet
  (column parallel: the result is split), else on its contracting dim (row parallel: the
  result is a partial sum, one all-reduce); over the last searched axis;
* data parallel + Megatron on 2+ axes: data over the first axes, Megatron over the last;
* FSDP / ZeRO-3 over every searched axis (each weight split on its largest dim, data
  parallel), and on 2+ axes data parallel over all with FSDP over the last;
* expert parallelism: weights with a batch dim in their dot (``[e, ...]``) split on it;
* sequence parallelism + Megatron on 2+ axes: data ``[b, t, ...]`` split on t over the last axis;
* spatial (rank-4 data): batch and H, or H and W (tiling over two dims) over the first and last axes;
  on one axis, H over it (offered beside data parallel: where the local batch is small, a conv's
  weight gradient runs slowly, cost/rates.py, and the whole batch on each device with a tile of
  the image may be faster; pricing decides);
* 2D (GSPMD paper's 2D weight sharding, its DenseLm plan) on 2+ axes: Megatron over the
  last axis, every such weight's largest other dim over the first axis, and the data's
  leading dim over the first axis and its last (model) dim over the last axis
  (``wi [M, H]: P("x", "y")``, ``wo [H, M]: P("y", "x")``, ``x [B, L, M]: P("x", None, "y")``).

Every split prefers dims the shards divide evenly; where none does (a vocab of 50257, 12
heads, a batch of 12 on 8 devices) the plan splits its natural dim unevenly (padded:
``splits``, context.fair_split), and the search's pricing sees the padded shards. Where that
changes Megatron, the even-only Megatron plans (and their DP / sequence / 2D combinations)
are start states too, named "... (even splits)": pricing decides.

Data inputs are those whose leading dim is the batch (the leading dim most data bytes
share). Weights are inputs met, possibly through a cast (``w.astype(bf16)``), a transpose (a tied
``wte.T``) or a scan (a stacked ``[L, ...]`` weight sliced per iteration: the decision goes to
the stacked input, one dim further), as an operand of a dot (``_roles``: the right one
when both are inputs, either when only one is); data are the other inputs (but not the leaves of a first argument that holds
weights: ``fn(params, *batch)``).
"""
from __future__ import annotations

from typing import Sequence

from ..core.jax_compat import scan_counts
from ..ops import facts as F
from ..ops import facts_of
from .context import TacticContext, fair_split
from .points import PointClass


def splits(shape, dims, k: int, uneven: bool = True) -> list[int]:
    """Of ``dims``, those that ``k`` shards divide evenly; when none does (and ``uneven``),
    those it splits unevenly but fairly (padded: context.fair_split), so that a vocab of 50257
    or a batch of 12 on 8 devices still gets the hand plan's natural split."""
    dims = list(dims)
    even = [d for d in dims if fair_split(shape[d], k)]
    return even or ([d for d in dims if fair_split(shape[d], k, even=False)] if uneven else [])


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


def view_of(v, aliases=None):
    """``v`` seen through casts, transposes and scans: (the value behind it, per dim of ``v``
    the dim of that value it is: ``wte.T``'s dim 0 is ``wte``'s dim 1, a scan body's slice
    of a stacked ``[L, ...]`` weight is one dim further)."""
    dmap = list(range(v.rank))
    while True:
        if aliases and v.id in aliases:
            v, o = aliases[v.id]
            dmap = [d + o for d in dmap]
        elif v.producer is not None and v.producer.prim in CASTS and len(v.producer.inputs) == 1:
            v = v.producer.inputs[0]
        elif v.producer is not None and v.producer.prim == "transpose" and len(v.producer.inputs) == 1:
            perm = v.producer.params["permutation"]
            dmap = [perm[d] for d in dmap]
            v = v.producer.inputs[0]
        else:
            return v, dmap


def weight_operand(op, wset, aliases):
    """The operand of a dot_general that is one of the weights ``wset`` (value ids, seen through
    casts, transposes, scans; the right one when both are): (index, source value, dim map) or None."""
    if op.prim != "dot_general" or len(op.inputs) != 2:
        return None
    for i in (1, 0):
        src, dmap = view_of(op.inputs[i], aliases)
        if src.id in wset:
            return i, src, dmap
    return None


def _roles(ctx: TacticContext, classes: Sequence[PointClass]):
    """Weights: open inputs met (through casts, transposes, scans) as an operand of a dot: the
    right one when both operands are inputs (``x @ w``; the left is then data), either one when
    only it is an input and it was never the data side (``einsum`` may put the weight first:
    ``dot_general(w, h)``; a tied ``wte.T``; but not ``x`` in a gradient's ``x.T @ g``)."""
    roots = {v.id for v in ctx.graph.inputs}  # a class's other values (a weight's gradient...) follow it
    cls_of = {vid: i for i, c in enumerate(classes) if c.is_input for vid in c.values if vid in roots}
    al = scan_aliases(ctx.graph)
    dots = [(op, [view_of(x, al)[0].id for x in op.inputs]) for op in ctx.graph.walk()
            if facts_of(op.prim).flops == F.DOT_FLOPS and len(op.inputs) == 2]  # (a ragged dot has 3)
    weights: list[int] = []  # value ids, in first-use order
    acts: set = set()
    for op, (lhs, rhs) in dots:
        if lhs in cls_of and rhs in cls_of and lhs not in weights:
            acts.add(lhs)
            if rhs not in weights:
                weights.append(rhs)
    for op, (lhs, rhs) in dots:
        for me, other in ((rhs, lhs), (lhs, rhs)):
            if me in cls_of and other not in cls_of and me not in acts and me not in weights:
                weights.append(me)
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


def _even_axes(ctx, data, axes) -> tuple:
    """The axes (in order, greedily) whose shards divide every data input's batch evenly."""
    out, k = [], 1
    for a in axes:
        n = k * ctx.mesh.axis_size(a)
        if all(fair_split(ctx.value(vid).shape[0], n) for vid in data):
            out.append(a)
            k = n
    return tuple(out)


def _megatron(ctx, classes, cls_of, weights, axis, uneven: bool = True) -> tuple:
    wset = set(weights)
    decided: dict[int, tuple] = {}  # class -> action
    tainted: set[int] = set()
    al = scan_aliases(ctx.graph)
    k = ctx.mesh.axis_size(axis)
    for op in ctx.graph.walk():
        ins_tainted = any(x.id in tainted for x in op.inputs)
        got = weight_operand(op, wset, al)
        if got is not None:
            i, src, dmap = got
            w, act = op.inputs[i], op.inputs[1 - i]
            c = cls_of[src.id]
            (lc, rc), (lb, rb) = op.params["dimension_numbers"]
            wc, wb = (rc, rb) if i == 1 else (lc, lb)
            if c not in decided:
                if act.id in tainted:  # row parallel: split the contracting dim
                    dims = splits(w.shape, wc, k, uneven)
                    if dims:
                        decided[c] = (c, dmap[dims[0]], axis)
                    continue  # the result is a partial sum: reduced, not split
                dims = splits(w.shape, [d for d in range(w.rank) if d not in wc and d not in wb], k, uneven)
                if dims:
                    decided[c] = (c, dmap[dims[0]], axis)
                    tainted.update(o.id for o in op.outputs)
                continue
        if ins_tainted:
            tainted.update(o.id for o in op.outputs)
    return tuple(decided.values())


def _fsdp(ctx, classes, cls_of, weights, data, axes) -> tuple:
    """FSDP / ZeRO-3: every weight (and every other open input that is no data) split on its
    largest dim the searched axes divide together (kept sharded, gathered before use; its
    gradient, optimizer state and update follow: points.py groups them), data parallel."""
    state = list(_data_parallel(ctx, classes, cls_of, data, axes))
    k = 1
    for a in axes:
        k *= ctx.mesh.axis_size(a)
    done = {cls_of[v] for v in data}
    for vid in list(weights) + [v for v in cls_of if v not in weights]:
        c = cls_of[vid]
        if c in done:
            continue
        done.add(c)
        shape = classes[c].shape
        dims = splits(shape, range(len(shape)), k)
        if not dims:
            continue
        d = max(dims, key=lambda e: (shape[e], -e))
        state.extend((c, d, a) for a in axes)
    return tuple(state)


def _expert(ctx, classes, cls_of, weights, data, axis) -> tuple:
    """Expert parallelism: weights with a batch dim in their dot (``[e, d, f]`` in
    ``einsum("egcm,emh->egch")``) split on it over ``axis``."""
    al = scan_aliases(ctx.graph)
    k = ctx.mesh.axis_size(axis)
    out = {}
    wset = set(weights)
    for op in ctx.graph.walk():
        got = weight_operand(op, wset, al)
        if got is None:
            continue
        i, src, dmap = got
        (lc, rc), (lb, rb) = op.params["dimension_numbers"]
        wb = rb if i == 1 else lb
        c = cls_of[src.id]
        dims = splits(op.inputs[i].shape, wb, k)
        if dims and c not in out:
            out[c] = (c, dmap[dims[0]], axis)
    return tuple(out.values())


def _spatial(ctx, classes, cls_of, data, plan) -> tuple:
    """Rank-4 data (NHWC) split as ``plan``, (dim, axis) pairs: batch over x and H over y
    ``((0, x), (1, y))``, H x W tiling ``((1, x), (2, y))``, H alone ``((1, x),)``."""
    state = []
    for vid in data:
        c = cls_of[vid]
        shape = classes[c].shape
        if len(shape) != 4:
            continue
        for d, a in plan:
            if splits(shape, [d], ctx.mesh.axis_size(a)):
                state.append((c, d, a))
    return tuple(state)


def _sequence(ctx, classes, cls_of, data, axes) -> tuple:
    """Sequence parallelism: data ``[b, t, ...]`` split on t over the last axis, batch over the others."""
    state = list(_data_parallel(ctx, classes, cls_of, data, axes[:-1]))
    k = ctx.mesh.axis_size(axes[-1])
    for vid in data:
        c = cls_of[vid]
        shape = classes[c].shape
        if len(shape) >= 3 and splits(shape, [1], k):
            state.append((c, 1, axes[-1]))
    return tuple(state)


def _two_d(ctx, classes, cls_of, data, meg, first: str, last: str) -> tuple:
    """Megatron over ``last`` plus each weight's largest other dim over ``first``; the data's
    leading dim over ``first`` and its last dim over ``last``."""
    k = ctx.mesh.axis_size(first)
    state = list(meg)
    for c, d, _ in meg:
        shape = classes[c].shape
        other = splits(shape, [e for e in range(len(shape)) if e != d], k)
        if other:
            state.append((c, max(other, key=lambda e: (shape[e], -e)), first))
    kl = ctx.mesh.axis_size(last)
    for vid in data:
        c = cls_of[vid]
        shape = classes[c].shape
        if splits(shape, [0], k) and (c, 0, first) not in state:
            state.append((c, 0, first))
        if len(shape) > 1 and splits(shape, [len(shape) - 1], kl) and (c, len(shape) - 1, last) not in state:
            state.append((c, len(shape) - 1, last))
    return tuple(state)


def baseline_states(ctx: TacticContext, classes: Sequence[PointClass], axes: tuple[str, ...]) -> list:
    """(name, state) of each hand-written plan that applies to this program."""
    cls_of, weights, data = _roles(ctx, classes)
    out = [("replicated", ())]
    if data:
        out.append((f"data parallel ({','.join(axes)})", _data_parallel(ctx, classes, cls_of, data, axes)))
        ev = _even_axes(ctx, data, axes)
        if ev != axes and ev:  # the batch splits unevenly over all: the even alternative too (pricing decides)
            out.append((f"data parallel ({','.join(ev)})", _data_parallel(ctx, classes, cls_of, data, ev)))
    if weights or len(cls_of) > len(data):
        out.append((f"FSDP ({','.join(axes)})", _fsdp(ctx, classes, cls_of, weights, data, axes)))
        if len(axes) > 1 and data:
            fs = _fsdp(ctx, classes, cls_of, weights, [], axes[-1:])
            out.append((f"data parallel ({','.join(axes[:-1])}) + FSDP ({axes[-1]})",
                        _data_parallel(ctx, classes, cls_of, data, axes) + fs))
    megs = []
    if weights:
        megs.append(("", _megatron(ctx, classes, cls_of, weights, axes[-1])))
        even = _megatron(ctx, classes, cls_of, weights, axes[-1], uneven=False)
        if even != megs[0][1]:  # an uneven split where the even-only plan differs: both (pricing decides)
            megs.append((" (even splits)", even))
    for tag, meg in megs:
        if meg:
            out.append((f"Megatron ({axes[-1]}){tag}", meg))
            if len(axes) > 1 and data:
                dp = _data_parallel(ctx, classes, cls_of, data, axes[:-1])
                out.append((f"data parallel ({','.join(axes[:-1])}) + Megatron ({axes[-1]}){tag}", dp + meg))
                seq = _sequence(ctx, classes, cls_of, data, axes)
                if any(d == 1 for _, d, _ in seq):
                    out.append((f"Megatron + sequence parallel ({axes[-1]}){tag}", seq + meg))
            if len(axes) > 1:
                out.append((f"2D ({axes[0]},{axes[-1]}){tag}",
                            _two_d(ctx, classes, cls_of, data, meg, axes[0], axes[-1])))
    if weights:
        ex = _expert(ctx, classes, cls_of, weights, data, axes[-1])
        if ex:
            dp = _data_parallel(ctx, classes, cls_of, data, axes[-1:])
            out.append((f"expert parallel ({axes[-1]})", dp + ex))
    if data and any(len(classes[cls_of[v]].shape) == 4 for v in data):
        first, last = axes[0], axes[-1]
        plans = ({f"spatial (H {first})": ((1, first),)} if len(axes) == 1 else
                 {f"spatial (batch {first}, H {last})": ((0, first), (1, last)),
                  f"spatial (H {first}, W {last})": ((1, first), (2, last))})
        out.extend((name, _spatial(ctx, classes, cls_of, data, plan)) for name, plan in plans.items())
    seen, uniq = set(), []
    for n, st in out:
        key = tuple(sorted(set(st)))
        if (n == "replicated" or st) and key not in seen:
            seen.add(key)
            uniq.append((n, tuple(dict.fromkeys(st))))
    return uniq
