"""gather / scatter.

    gather   operand [V,D], indices [B,1] -> [B,D]   (embedding lookup)
             "[i,j], [k,1] -> [k,j]"   i: reduction(pick) (indexed dim, one-row slices),
                                       k: pass (batch), j: pass (whole slice dim)
    scatter-add operand [V,D], indices [B,1], updates [B,D] -> [V,D]
             "[i,j], [k,1], [k,j] -> [i,j]"   i: pass (each device adds the rows it owns),
                                              k: reduction(sum), j: pass

Operand dims taken whole by every slice pass through to the output's offset dims, indexed
or not (a whole window's only start in bounds is 0: each device's block is then its whole
window too, and the mode treats any other start on every device as on one); index batch
dims pass to the output batch dims, and to the operand's batching dims (``jax.vmap`` of a
dynamic_slice / dynamic_update_slice: a decode step's KV-cache read / write per row, its
batch and head dims kept sharded, as jax.jit keeps them). An indexed dim read one row at a time (an
embedding's vocab dim, ``take_along_axis``'s axis) is a "pick" reduction, XLA's strategy
for a table sharded on it: each device looks the indices up in the rows it holds (indices
shifted by its first row), rows it does not own are zero bits, and exactly one device
holds each looked-up row, so the result is partial over the dim's axes, reduced bit-exactly
by an all-reduce or a reduce-scatter where the consumer wants it sharded
(partitioner/gather_handler.py). Only the looked-up rows move, never the table. Other
indexed dims (windows wider than one row) must be replicated.

scatter-add (the gather's transpose): a one-row indexed dim passes (each device adds the
updates of the rows it owns, the rest dropped: no table gradient all-reduced), and the
updates' scatter dims are a sum reduction: each device adds its own updates, the table
gradient is partial over their axes (reduce-scattered where it is wanted sharded).
"""
from __future__ import annotations

from ..core.dtypes import is_bool
from . import facts as F
from .registry import declare, register
from .rule import NEED_REPLICATION, OTHER, PASS, REDUCTION, OpRule, RuleBuilder


def _one_row(d: int, dn, sizes) -> bool:
    """Is operand dim ``d`` indexed one row at a time (so a device may look up its own rows)?"""
    return d in dn.start_index_map and d not in dn.operand_batching_dims and sizes[d] == 1


@register("gather", handler="gather")
def gather(op) -> OpRule:
    dn = op.params["dimension_numbers"]
    slice_sizes = op.params["slice_sizes"]
    operand, indices, out = op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape
    b = RuleBuilder()
    op_f: list = [None] * len(operand)
    idx_f: list = [None] * len(indices)
    out_f: list = [None] * len(out)
    offset_src = [d for d in range(len(operand))
                  if d not in dn.collapsed_slice_dims and d not in dn.operand_batching_dims]
    for od, d in zip(dn.offset_dims, offset_src):
        whole = slice_sizes[d] == operand[d]  # (indexed too: any start but 0 is out of bounds)
        f = b.factor(out[od], PASS if whole else NEED_REPLICATION)
        out_f[od] = f
        op_f[d] = f if whole else _indexed(b, d, dn, slice_sizes, operand)
    batch_out = [d for d in range(len(out)) if d not in dn.offset_dims]
    idx_batch = list(range(len(indices) - 1))  # jax puts the index vector last
    idx_f[len(indices) - 1] = b.factor(indices[-1], NEED_REPLICATION) if indices else None
    for od, idd in zip(batch_out, idx_batch):
        f = b.factor(out[od])
        out_f[od] = idx_f[idd] = f
    for od_op, id_b in zip(dn.operand_batching_dims, dn.start_indices_batching_dims):
        op_f[od_op] = idx_f[id_b]
    for d in range(len(operand)):
        if op_f[d] is None:
            op_f[d] = _indexed(b, d, dn, slice_sizes, operand)
    return b.operand(op_f).operand(idx_f).result(out_f).build(OTHER)


def _indexed(b: RuleBuilder, d: int, dn, sizes, operand) -> int:
    if _one_row(d, dn, sizes) and operand[d] > 1:
        return b.factor(operand[d], REDUCTION, "pick")
    return b.factor(operand[d], NEED_REPLICATION)


def one_row_dims(op) -> list[int]:
    """The scatter's indexed operand dims written one row at a time: inserted window dims, and
    window dims of one row (``jax.vmap`` of a one-token ``dynamic_update_slice`` into a
    sequence-sharded cache); a device may scatter into its own rows of them."""
    dn = op.params["dimension_numbers"]
    operand, updates = op.inputs[0].shape, op.inputs[2].shape
    window_src = [d for d in range(len(operand)) if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    ones = {d for ud, d in zip(dn.update_window_dims, window_src) if updates[ud] == 1 and operand[d] > 1}
    return [d for d in dn.scatter_dims_to_operand_dims if d in dn.inserted_window_dims or d in ones]


def dropping(op) -> bool:
    """Does the scatter skip out-of-bounds updates (so a device may scatter into its own rows
    with indices shifted by its offset, the others' updates falling out of its bounds)?"""
    return str(op.params.get("mode", "")).rsplit(".", 1)[-1] in ("FILL_OR_DROP", "PROMISE_IN_BOUNDS")


def additive(op) -> bool:
    """A scatter-add / scatter-sub of numbers: the updates of each device may be added on
    their own and the partial results summed (the operand joins on one device)."""
    return op.prim.replace("_", "-") in ("scatter-add", "scatter-sub") and not is_bool(op.inputs[0].dtype)


def idempotent(op) -> str:
    """"max" / "min" for a scatter-max / -min of numbers (else ""): each device may scatter its
    own updates into the whole operand and the results be combined with that op (the operand
    itself, on every device, is combined with itself: max(a, a) = a)."""
    kind = op.prim.replace("_", "-")
    return kind[len("scatter-"):] if kind in ("scatter-max", "scatter-min") and not is_bool(op.inputs[0].dtype) else ""


@register("scatter", "scatter-add", "scatter_add", "scatter-sub", "scatter_sub", "scatter-mul", "scatter_mul", "scatter-min", "scatter_min",
          "scatter-max", "scatter_max", handler="scatter")
def scatter(op) -> OpRule:
    """Besides the whole window dims (pass), an indexed operand dim with a window of one row
    (an inserted window dim, e.g. ``state.at[0].set(x)``, an embedding gradient's vocab dim;
    a one-row window dim, a one-token write at a position of a sequence-sharded cache)
    may stay sharded: each device scatters into the rows it holds, indices shifted by its
    offset (partitioner/scatter_handler.py; clip mode clamps the global indices first). A
    scatter-add's update rows (the index batch dims) are a sum reduction: each device adds
    its own updates, the result partial over their axes; a scatter-max / -min's are a max / min
    reduction the same way (jax.ops.segment_max over sharded rows)."""
    dn = op.params["dimension_numbers"]
    operand, indices, updates = op.inputs[0].shape, op.inputs[1].shape, op.inputs[2].shape
    b = RuleBuilder()
    op_f: list = [None] * len(operand)
    upd_f: list = [None] * len(updates)
    for d in one_row_dims(op):  # clip mode: the handler clamps the global indices first
        op_f[d] = b.factor(operand[d])
    idx_f: list = [None] * len(indices)
    combine = "sum" if additive(op) else idempotent(op)
    if combine:
        upd_scatter = [d for d in range(len(updates)) if d not in dn.update_window_dims]
        for ud, idd in zip(upd_scatter, range(len(indices) - 1)):  # jax puts the index vector last
            if idd not in dn.scatter_indices_batching_dims:
                upd_f[ud] = idx_f[idd] = b.factor(updates[ud], REDUCTION, combine)
    window_src = [d for d in range(len(operand))
                  if d not in dn.inserted_window_dims and d not in dn.operand_batching_dims]
    for ud, d in zip(dn.update_window_dims, window_src):
        if updates[ud] == operand[d]:  # (indexed too: any start but 0 is out of bounds)
            f = b.factor(operand[d])
            op_f[d] = upd_f[ud] = f
    upd_rows = [d for d in range(len(updates)) if d not in dn.update_window_dims]
    for od, idd in zip(dn.operand_batching_dims, dn.scatter_indices_batching_dims):
        f = b.factor(operand[od])  # vmap's batch: row r of the updates goes into row r of the operand
        op_f[od] = idx_f[idd] = upd_f[upd_rows[idd]] = f
    for d in range(len(operand)):
        if op_f[d] is None:
            op_f[d] = b.factor(operand[d], NEED_REPLICATION)
    for d in range(len(updates)):
        if upd_f[d] is None:
            upd_f[d] = b.factor(updates[d], NEED_REPLICATION)
    idx_f = [f if f is not None else b.factor(s, NEED_REPLICATION) for f, s in zip(idx_f, indices)]
    return b.operand(op_f).operand(idx_f).operand(upd_f).result(op_f).build(OTHER)


def _local_gather(params: dict, shapes, local, out_local) -> dict:
    """A slice that takes an operand dim whole takes the local block whole."""
    sizes = tuple(l if s == ss else ss for s, ss, l in zip(shapes[0], params["slice_sizes"], local[0]))
    return {**params, "slice_sizes": sizes}


declare("gather", facts=F.OpFacts(F.ZERO, localize=_local_gather, access=F.WINDOW_READ))
declare("scatter", "scatter-add", "scatter_add", "scatter-mul", "scatter_mul", "scatter-min", "scatter_min",
        "scatter-max", "scatter_max", facts=F.OpFacts(F.SCATTER_FLOPS, inplace=True, access=F.SCATTER_UPDATE))
declare("scatter-sub", "scatter_sub", facts=F.OpFacts(F.SCATTER_FLOPS, access=F.SCATTER_UPDATE))
