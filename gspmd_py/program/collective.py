"""One collective of the SPMD program, as data (``gp.Collective``; ``plan.collectives`` lists
them): what the program index reads back from the program (program_index.py), the combiner
merges (combine.py) and the cost model prices (cost/model.py)."""
from __future__ import annotations

import attrs


@attrs.frozen
class Collective:
    """One collective of the SPMD program, in program order.

    ``kind``: "all-gather", "all-reduce", "reduce-scatter", "all-to-all" or
    "collective-permute". ``axes``: the mesh axes it runs over. ``in_loop``: True when it runs
    once per iteration of a loop (scan / while) rather than once per call.
    ``bytes_per_device``: size of the buffer each device sends into the collective
    (all-gather: its shard; reduce-scatter, all-reduce, all-to-all, permute: its buffer).
    ``op``: the label of the op that caused it ("dot_general #12 (model.py:40)", or
    "boundary"); ``op_id`` its IR op id (-1 at the boundary). ``reduce``: the reduction of an
    all-reduce / reduce-scatter. ``tensors``: how many tensors a combined collective carries.
    ``group_size``: devices in each group. ``shape``/``dtype``: the local buffer sent.
    """

    kind: str
    axes: tuple[str, ...]
    bytes_per_device: int
    op: str
    op_id: int = attrs.field(default=-1, eq=False)
    dtype: str = attrs.field(default="", eq=False)
    shape: tuple[int, ...] = attrs.field(default=(), eq=False)
    reduce: str = attrs.field(default="", eq=False)
    tensors: int = attrs.field(default=1, eq=False)
    group_size: int = attrs.field(default=1, eq=False)
    in_loop: bool = attrs.field(default=False, eq=False)

    def __str__(self) -> str:
        extra = f" x{self.tensors}" if self.tensors > 1 else ""
        return f"{self.kind}({','.join(self.axes)}) {self.bytes_per_device}B{extra}  <- {self.op}"
