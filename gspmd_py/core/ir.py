"""gspmd_py's IR: a small SSA graph of Values and Ops, built from a jaxpr by trace.py.

    Graph(inputs=[%0 f32[8,16], %1 f32[16,32]])
      %2 f32[8,32] = dot_general[((1,), (0,)), ((), ())] %0 %1
      %3 f32[8,32] = tanh %2
      return %3

Every Op keeps the JAX primitive it came from, so the partitioner can re-bind it on
local shards with adjusted shape parameters. Region ops (scan, while, cond) keep their
bodies as nested Graphs.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Optional, Sequence

import attrs
import numpy as np

from .dtypes import short_name


@attrs.define(eq=False, repr=False)
class Value:
    id: int
    shape: tuple[int, ...]
    dtype: Any
    producer: Optional["Op"] = None
    name: Optional[str] = None  # set by gp.tag, or "arg0"/"out0" at the boundary
    const: Any = None  # numpy data for constants (closed-over arrays and literals)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact for any size (no int64 wrap)

    @property
    def nbytes(self) -> int:
        try:
            return self.size * np.dtype(self.dtype).itemsize
        except TypeError:
            return self.size * 8

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def type_str(self) -> str:
        return f"{short_name(self.dtype)}[{','.join(str(s) for s in self.shape)}]"

    def __repr__(self) -> str:
        label = f"%{self.id}" + (f"<{self.name}>" if self.name else "")
        return f"{label} {self.type_str}"


@attrs.define(eq=False, repr=False)
class Op:
    id: int
    prim: str
    inputs: list[Value]
    outputs: list[Value]
    params: dict[str, Any]
    primitive: Any = None  # the jax Primitive, re-bound by the partitioner
    regions: list["Graph"] = attrs.field(factory=list)
    source: str = ""  # user source location, for messages
    effects: bool = False  # has side effects: never removed as dead code
    scope: str = ""  # the library calls it was inlined from, outermost first ("searchsorted/_searchsorted_scan_impl")

    def __repr__(self) -> str:
        outs = " ".join(repr(v) for v in self.outputs)
        ins = " ".join(f"%{v.id}" for v in self.inputs)
        shown = {k: v for k, v in self.params.items() if k not in ("jaxpr", "sharding", "out_sharding") and not _is_big(v)}
        p = "[" + " ".join(f"{k}={_short(v)}" for k, v in sorted(shown.items())) + "]" if shown else ""
        return f"{outs} = {self.prim}{p} {ins}"


def _is_big(v) -> bool:
    return hasattr(v, "eqns") or hasattr(v, "jaxpr")


def _short(v) -> str:
    s = str(v)
    return s if len(s) < 60 else s[:57] + "..."


@attrs.define(eq=False, repr=False)
class Graph:
    inputs: list[Value]
    outputs: list[Value]
    ops: list[Op]

    def walk(self) -> Iterator[Op]:
        for op in self.ops:
            yield op
            for r in op.regions:
                yield from r.walk()

    def values(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for v in self.inputs:
            seen[v.id] = v
        for op in self.ops:
            for v in list(op.inputs) + list(op.outputs):
                seen.setdefault(v.id, v)
        for v in self.outputs:
            seen.setdefault(v.id, v)
        return list(seen.values())

    def all_values(self) -> list[Value]:
        """Values of this graph and of every region inside it."""
        out = self.values()
        for op in self.ops:
            for r in op.regions:
                out.extend(r.all_values())
        return out

    def users(self) -> dict[int, list[Op]]:
        out: dict[int, list[Op]] = {}
        for op in self.ops:
            for v in op.inputs:
                out.setdefault(v.id, []).append(op)
        return out

    def __repr__(self) -> str:
        lines = [f"Graph(inputs=[{', '.join(repr(v) for v in self.inputs)}])"]
        for op in self.ops:
            lines.append("  " + repr(op))
            for r in op.regions:
                lines.extend("    " + l for l in repr(r).splitlines())
        lines.append("  return " + " ".join(f"%{v.id}" for v in self.outputs))
        return "\n".join(lines)


def is_output_port(op: "Op") -> bool:
    """Whether ``op`` is an output's port: the unspecified annotate the trace puts at each
    output of the program (no source line, no API of the user's behind it)."""
    return (op.prim == "gspmd_annotate" and bool(op.params.get("unspecified")) and not op.source
            and "origin" not in op.params)


def user_name(op: "Op") -> str:
    """The name a user knows ``op`` by: its primitive's, except gspmd_py's own ops, named by
    the API that made them (``gp.annotate``, ``with_sharding_constraint``, ``gp.mesh_split``,
    ``gp.tag``) or, for an output's port, ``output boundary``."""
    if op.prim == "gspmd_tag":
        return "gp.tag"
    if op.prim != "gspmd_annotate":
        return op.prim
    if is_output_port(op):
        return "output boundary"
    origin = op.params.get("origin", "gp.annotate")
    return origin.rsplit(".", 1)[-1] if origin.startswith("jax.") else origin


ROOTS = frozenset({"gspmd_tag", "gspmd_annotate"})  # kept even when unused: the user names or constrains them


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop ops whose results nothing uses (jax.grad's jaxpr still computes the primal output
    it discards; XLA would drop it, and so do we, before it costs a collective). Effectful
    ops, tags and annotations stay; region bodies keep their signatures.

        %1 = sin %0; %2 = mul %1 2.0; _ = reduce_sum %2; %3 = cos %0; return %3
        -> %3 = cos %0; return %3
    """
    live = {v.id for v in graph.outputs}
    kept: list[Op] = []
    for op in reversed(graph.ops):
        if op.effects or op.prim in ROOTS or any(o.id in live for o in op.outputs):
            kept.append(op)
            live.update(v.id for v in op.inputs)
            for r in op.regions:
                eliminate_dead_code(r)

    graph.ops = kept[::-1]
    return graph


class IdGen:
    """Sequential ids: value and op numbering is deterministic (no hash order anywhere)."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n - 1


def new_value(ids: IdGen, shape: Sequence[int], dtype, **kw) -> Value:
    return Value(ids(), tuple(int(s) for s in shape), dtype, **kw)
