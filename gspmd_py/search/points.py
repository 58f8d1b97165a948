"""Where the search may place a sharding, grouped so that repetition is decided once.

A decision point is a value the search may annotate: every input the user left open (with
the top-level values derived from it elementwise at its shape: a parameter's gradient,
optimizer state, update and new value follow its decision, so "shard this weight" keeps
the weight, its gradient and its update sharded: FSDP / ZeRO), and the result of every
top-level dot/conv (an intermediate annotation). Points are grouped
into classes of equal shape and equal role: inputs by their key path with the numbers
taken out (``params/layers/3/w1`` -> ``params/layers/#/w1``), intermediates by their op,
source line and operand shapes. The layers of a block unrolled in a Python loop share a
class, so one action ("shard dim d of this class on axis a") decides every layer at once;
a scanned stack of layers is one input already, and so one point.
"""
from __future__ import annotations

import re
from typing import Optional

import attrs

from ..core.ir import Graph, Value
from ..ops import facts_of
from ..ops.elementwise import IDENTITY, NARY, UNARY
from .context import TacticContext, returned_state

ELEMENTWISE = frozenset(UNARY) | frozenset(NARY) | frozenset(IDENTITY)
MAX_INTERMEDIATE_CLASSES = 12


@attrs.frozen
class PointClass:
    """Values decided together: equal shapes, one role (``what``)."""

    what: str
    shape: tuple[int, ...]
    values: tuple[int, ...]  # value ids
    is_input: bool
    nbytes: int
    roots: int = 0  # the points themselves (repeated layers); the other values follow them (0: all)


def _norm(path: str) -> str:
    return re.sub(r"\d+", "#", path)


def point_classes(ctx: TacticContext) -> list[PointClass]:
    """The decision points of ``ctx``'s graph, grouped (inputs first, then intermediates by size)."""
    groups: dict = {}
    order: list = []

    def put(key, v: Value, what: str, is_input: bool):
        if key not in groups:
            groups[key] = (what, v.shape, [], is_input, v.nbytes, [0])
            order.append(key)
        groups[key][2].append(v.id)
        groups[key][5][0] += 1

    inputs = {v.id for v in ctx.graph.inputs}
    taken = set(inputs)
    users = users_of(ctx.graph, top_only=True)
    for v, lf in zip(ctx.graph.inputs, ctx.leaves):
        if ctx.fixed(v) or v.is_const or v.rank == 0 or v.size <= 1:
            continue
        path = f"arg{lf.argnum}/{_norm(lf.path)}" if lf.argnum is not None else _norm(lf.name)
        key = ("in", path, v.shape, str(v.dtype))
        put(key, v, lf.name if len(lf.name) < 60 else lf.name[:57] + "...", True)
        for x in elementwise_family(ctx.graph, v, top_only=True, users=users):  # gradient, optimizer state, update, new value
            if x.id not in taken and not ctx.fixed(x) and x.shape == v.shape and not _is_matmul(x):
                taken.add(x.id)
                groups[key][2].append(x.id)
    _join_returned_state(ctx, groups, taken)
    inter = []
    for op in ctx.graph.ops:  # top level: loop bodies follow their (stacked) inputs
        if not facts_of(op.prim).matmul:
            continue
        for v in op.outputs:
            if ctx.fixed(v) or v.rank == 0:
                continue
            key = ("op", op.prim, op.source, v.shape, tuple(x.shape for x in op.inputs))
            inter.append((key, v, f"{op.prim} {v.type_str}" + (f" at {op.source}" if op.source else "")))
    classes = [PointClass(groups[k][0], groups[k][1], tuple(groups[k][2]), True, groups[k][4], groups[k][5][0])
               for k in order]
    ig: dict = {}
    iorder = []
    for key, v, what in inter:
        if key not in ig:
            ig[key] = (what, v.shape, [], v.nbytes)
            iorder.append(key)
        ig[key][2].append(v.id)
    icl = [PointClass(ig[k][0], ig[k][1], tuple(ig[k][2]), False, ig[k][3]) for k in iorder]
    icl.sort(key=lambda c: -c.nbytes * len(c.values))  # stable: program order among equals
    return classes + icl[:MAX_INTERMEDIATE_CLASSES]


def _join_returned_state(ctx: TacticContext, groups: dict, taken: set) -> None:
    """A training step's returned state (an output at an input's pytree position and path,
    exact.returned_state) joins its input's class: the next step gets it in the layout it
    was given (a training loop's fixed point, issue 37)."""
    class_of = {vid: key for key, g in groups.items() for vid in g[2]}
    for vin, vout in returned_state(ctx):
        key = class_of.get(vin)
        if key is not None and vout not in taken:
            taken.add(vout)
            groups[key][2].append(vout)


def _is_matmul(v: Value) -> bool:
    return v.producer is not None and facts_of(v.producer.prim).matmul


def users_of(graph: Graph, top_only: bool = False) -> dict[int, list]:
    """value id -> the ops that read it, in program order (``top_only``: top-level ops only)."""
    users: dict[int, list] = {}
    for op in (graph.ops if top_only else graph.walk()):
        for x in op.inputs:
            users.setdefault(x.id, []).append(op)
    return users


def elementwise_family(graph: Graph, start: Value, top_only: bool = False,
                       users: Optional[dict] = None) -> list[Value]:
    """``start`` and every value connected to it through elementwise ops (either direction):
    a parameter, its optimizer state, gradient, update and new value (``top_only``: through
    the top-level ops only, not loop bodies). ``users``: ``users_of(graph, top_only)`` when
    the caller asks for many starts (made once)."""
    users = users_of(graph, top_only) if users is None else users
    seen = {start.id: start}
    todo = [start]
    while todo:
        v = todo.pop()
        near = []
        if v.producer is not None and v.producer.prim in ELEMENTWISE:
            near += v.producer.inputs
        for op in users.get(v.id, ()):
            if op.prim in ELEMENTWISE:
                near += op.outputs + op.inputs
        for x in near:
            if x.id not in seen and not x.is_const and x.shape == start.shape:
                seen[x.id] = x
                todo.append(x)
    return sorted(seen.values(), key=lambda x: x.id)
