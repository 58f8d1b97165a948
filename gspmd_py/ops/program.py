"""Facts of the primitives that only the partitioner emits into the per-device program (no
sharding rule: they are not user ops): collectives, ``axis_index``, ``device_put`` and the
call primitives the cost model inlines.

    psum f32[8,16] axes=("y",)   ->  an all-reduce (sum) record; the combiner may merge it
"""
from __future__ import annotations

from . import facts as F
from .collectives import ALL_GATHER, ALL_REDUCE, ALL_TO_ALL, COLLECTIVE_PERMUTE, REDUCE_SCATTER
from .registry import declare

declare("psum", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="sum", combinable=True))
declare("pmax", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="max", combinable=True))
declare("pmin", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="min", combinable=True))
# the combiner's all-reduce of several operands (program/variadic.py): one collective
declare("psum_combined", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="sum"))
declare("pmax_combined", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="max"))
declare("pmin_combined", facts=F.OpFacts(F.ZERO, collective=ALL_REDUCE, collective_reduce="min"))
declare("all_gather", facts=F.OpFacts(F.ZERO, collective=ALL_GATHER, combinable=True))
declare("reduce_scatter", facts=F.OpFacts(F.ZERO, collective=REDUCE_SCATTER, collective_reduce="sum",
                                          combinable=True))
declare("psum_scatter", facts=F.OpFacts(F.ZERO, collective=REDUCE_SCATTER, collective_reduce="sum"))
declare("all_to_all", facts=F.OpFacts(F.ZERO, collective=ALL_TO_ALL))
# only inside a user's shard_map region (partitioner/manual_body.py): its operand moves, its output
# buffer and offsets do not (program_index.py counts the operand's bytes only)
declare("ragged_all_to_all", facts=F.OpFacts(F.ZERO, collective=ALL_TO_ALL, sends=F.FIRST_OPERAND))
declare("ppermute", facts=F.OpFacts(F.ZERO, collective=COLLECTIVE_PERMUTE))
declare("axis_index", facts=F.OpFacts(F.FREE))
declare("device_put", facts=F.OpFacts(F.ZERO))
# calls: the cost model walks their body once (custom_*: the primal body only)
declare("jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call", "custom_vjp_call_jaxpr",
        "remat", "checkpoint", "custom_lin", facts=F.OpFacts(F.PER_OUTPUT, region=F.CALL))
