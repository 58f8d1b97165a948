"""What the package knows about an op besides its sharding rule, declared next to the rule.

Each primitive's ``OpFacts`` is registered by the module that registers its rule
(``registry.declare``); primitives that only the partitioner emits into the per-device
program (collectives, ``axis_index``, calls) declare theirs in ``program.py``. Every ruled
primitive must declare its facts (checked at import, as the handler names are)::

    declare("exp", "log", facts=OpFacts(ELEMENTWISE_FLOPS, transcendental=True, fusion=FUSIBLE))

The passes read them: ``partitioner/partial.py`` (``linearity``: which partial values pass
through the op unreduced), ``partitioner/generic.py`` (``localize``: how its shape parameters
become local), ``cost/counting.py`` and ``cost/fusion.py`` (``flops``, ``transcendental``,
``fusion``, ``alias``, ``access``), ``cost/memory.py`` (``inplace``), the windowed handler (``init``: the
reduce op whose identity is the op's init value), ``program/program_index.py`` and
``program/combine.py`` (``collective``: a kind of ops/collectives.py, ``collective_reduce``,
``combinable``, ``sends``) and the cost
model's walk (``region``).
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import attrs

from .collectives import KINDS

# -- linearity: which partial values pass through the op unreduced (partitioner/partial.py) --
NONLINEAR = ""  # every partial operand is reduced first
MOVE = "move"  # data movement / identity, linear in operand 0 (others are shapes / scalars): transpose, reshape, slice, reduce_sum
ZERO_PAD = "zero_pad"  # pad: linear in operand 0 when the padding value is a plan-time zero
CONVERT = "convert"  # convert_element_type: linear when the dtype stays or widens (float to float)
NEGATE = "negate"  # unary and exactly linear (neg, real, imag, conj): its operand partial
SUM = "sum"  # add / sub: linear when all operands are partial alike
JOIN = "join"  # add_any: a non-partial operand joins the partial sum
SCALE = "scale"  # mul: linear in one operand when the other is a finite plan-time constant
DIVIDE = "divide"  # div: linear in the numerator when the divisor is a finite nonzero constant
SELECT = "select"  # select_n: linear in its value operands (the predicate reduced)
LINEARITIES = (NONLINEAR, MOVE, ZERO_PAD, CONVERT, NEGATE, SUM, JOIN, SCALE, DIVIDE, SELECT)

# -- FLOPs: how cost/counting.py counts one equation of the per-device program --------------
ELEMENTWISE_FLOPS = "elementwise"  # 1 per output element (+1 transcendental if ``transcendental``)
PER_OUTPUT = "per_output"  # 1 per output element (ops with no better count)
DOT_FLOPS = "dot"  # 2 * batch * lhs free * rhs free * contracting
CONV_FLOPS = "conv"  # 2 * N_out * C_out * C_in per group * taps on real input
REDUCTION_FLOPS = "reduction"  # 1 per input element
CUMULATIVE_FLOPS = "cumulative"  # 1 per operand element (+1 transcendental if ``transcendental``)
SORT_FLOPS = "sort"  # n log2(len) per operand
TOP_K_FLOPS = "top_k"  # n log2(k)
FACTOR_FLOPS = "factor"  # matrix factorizations and solves: per matrix m * n * min(m, n) of operand 0
FFT_FLOPS = "fft"  # 5 n log2(transform length) (the radix-2 count)
SCATTER_FLOPS = "scatter"  # 1 per update element
WINDOW_FLOPS = "window"  # output elements x window size
SELECT_SCATTER_FLOPS = "select_and_scatter"  # operand elements x window size
ZERO = "zero"  # data movement: no FLOPs (its bytes still count)
FREE = "free"  # nothing runs (axis_index): no FLOPs, no bytes, no time
FLOPS_KINDS = (ELEMENTWISE_FLOPS, PER_OUTPUT, DOT_FLOPS, CONV_FLOPS, REDUCTION_FLOPS, CUMULATIVE_FLOPS, SORT_FLOPS,
               TOP_K_FLOPS, FACTOR_FLOPS, FFT_FLOPS, SCATTER_FLOPS, WINDOW_FLOPS, SELECT_SCATTER_FLOPS, ZERO, FREE)

# -- fusion (cost/fusion.py: XLA-style loop fusion) -------------------------------------------
FUSIBLE = "fusible"  # fuses into its consumers and its producers fuse into it (elementwise, layout)
FUSED_CONSUMER = "consumer"  # its fusible producers fuse into it (reductions); its result is materialized
OPAQUE = "opaque"  # a kernel of its own
FUSIONS = (FUSIBLE, FUSED_CONSUMER, OPAQUE)

# -- alias: the result is the operand's buffer (no bytes, no new buffer) ---------------------
NO_ALIAS, ALWAYS, SAME_DTYPE = "", "always", "same_dtype"
ALIASES = (NO_ALIAS, ALWAYS, SAME_DTYPE)

# -- memory access: what the op reads and writes (cost/fusion.py) ---------------------------
WHOLE = ""  # reads its materialized operands, writes its materialized results
WINDOW_READ = "window"  # reads of operand 0 only the window it takes (at most its result's bytes)
UPDATE = "update"  # dynamic_update_slice: reads and writes its update (operand 1) in place
SCATTER_UPDATE = "scatter"  # scatter: reads indices and updates (+ the updates again), writes the updates
ACCESSES = (WHOLE, WINDOW_READ, UPDATE, SCATTER_UPDATE)

# -- region: how the cost model walks an op's sub-programs -----------------------------------
NO_REGION, LOOP, CALL = "", "loop", "call"  # LOOP: runs its body per iteration; CALL: inlined once
REGIONS = (NO_REGION, LOOP, CALL)

COLLECTIVE_KINDS = ("",) + tuple(KINDS)  # "": not a collective; else a kind of ops/collectives.py's table

# -- what a collective sends (program/program_index.py counts its bytes) ----------------------
ALL_OPERANDS = ""  # every operand (a combined all-reduce: all of them)
FIRST_OPERAND = "first"  # operand 0 only (ragged_all_to_all: its output buffer and offsets stay)
SENDS = (ALL_OPERANDS, FIRST_OPERAND)

# (params, global operand shapes, local operand shapes, local result shapes) -> local params
Localize = Callable[[dict, Sequence[tuple], Sequence[tuple], Sequence[tuple]], dict]


def _one_of(options: tuple):
    def check(inst, attribute, value) -> None:
        if value not in options:
            raise ValueError(f"OpFacts.{attribute.name}={value!r}: expected one of {options}")
    return check


@attrs.frozen
class OpFacts:
    """What one primitive is, for the passes that are not propagation (see the module docstring)."""

    flops: str = attrs.field(validator=_one_of(FLOPS_KINDS))
    transcendental: bool = False
    fusion: str = attrs.field(default=OPAQUE, validator=_one_of(FUSIONS))
    alias: str = attrs.field(default=NO_ALIAS, validator=_one_of(ALIASES))
    inplace: bool = False  # a result may be written over a dying operand of its size (memory.py)
    access: str = attrs.field(default=WHOLE, validator=_one_of(ACCESSES))  # bytes read/written (fusion.py)
    linearity: str = attrs.field(default=NONLINEAR, validator=_one_of(LINEARITIES))
    localize: Optional[Localize] = None  # its shape parameters made local (None: kept as they are)
    init: str = ""  # the reduce op whose identity is its init value (reduce_window_sum: "sum")
    collective: str = attrs.field(default="", validator=_one_of(COLLECTIVE_KINDS))
    collective_reduce: str = ""  # for a reducing collective: sum, max, min
    sends: str = attrs.field(default=ALL_OPERANDS, validator=_one_of(SENDS))  # a collective's operands that move
    combinable: bool = False  # the combiner may merge independent ones (program/combine.py)
    region: str = attrs.field(default=NO_REGION, validator=_one_of(REGIONS))

    def aliases(self, src_dtype, dst_dtype) -> bool:
        """Is the result the operand's buffer, for an operand of ``src_dtype`` and a result of ``dst_dtype``?"""
        if self.alias == SAME_DTYPE:
            return src_dtype == dst_dtype
        return self.alias == ALWAYS

    @property
    def fusible(self) -> bool:
        return self.fusion == FUSIBLE

    @property
    def fused_consumer(self) -> bool:
        return self.fusion in (FUSIBLE, FUSED_CONSUMER)

    @property
    def matmul(self) -> bool:
        """A dot or a convolution: runs at the matmul rate, and is what the search shards."""
        return self.flops in (DOT_FLOPS, CONV_FLOPS)


#: the facts of a primitive nobody declared (an op the program holds that no module knows)
UNKNOWN = OpFacts(PER_OUTPUT)


# -- how parameters become local (generic.py's bind_local) ------------------------------------
def local_shape(params: dict, shapes, local, out_local) -> dict:
    """``shape``: the local result's (broadcast_in_dim, iota, empty)."""
    return {**params, "shape": tuple(out_local[0])}
