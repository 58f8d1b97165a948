"""Human-readable views of a Plan: the per-op table of ``plan.report()``.

``rows(plan)`` is the table as data (html.py draws the same rows); ``report(plan)`` its text::

    gspmd_py plan for mlp on Mesh(x=2, y=4)
      op                  global     sharding      local    collectives
      input arg0          f32[8,16]  P('x', None)  [4,16]
      dot_general #3      f32[8,32]  P('x', 'y')   [4,8]
      ...
      output out          f32[8,16]  P('x', None)  [4,16]   all-reduce(y) 256B
    collectives: 1 (1 all-reduce), 256 bytes per device

Shardings print as JAX writes them (``P('x', None)``: a mesh axis name, a tuple of names or
None per dim); ops by the names the user knows (``gp.annotate``, ``with_sharding_constraint``,
``gp.tag``), each output by its pytree path (``out['loss']``).
"""
from __future__ import annotations

import os
import re

import attrs

from ..core.ir import is_output_port, user_name
from ..program.collective import Collective
from ..frontend.pipeline import schedules


SOURCE = re.compile(r"(.+?):(\d+)(?::\d+)?(?: |$)")  # an op's source: "path/model.py:40:8 (fn)"


@attrs.frozen
class Row:
    """One line of the per-op table: an input, an op result, or a boundary collective."""

    kind: str  # "input" | "op" | "boundary" | "combined" (a collective carrying several ops' tensors)
    label: str  # "input arg0", "dot_general #3 <hidden>"
    global_type: str
    sharding: str
    local: str
    collectives: tuple[Collective, ...]
    depth: int = 0  # nesting inside scan/while/cond bodies
    source: str = ""
    value_id: int = -1  # the IR value an input/op row shows


def sharding_text(plan, v) -> str:
    """The value's recorded sharding, and the partial the program still holds it as (a sum
    over some axes deferred to a consumer: each device's buffer is not yet the value)::

        P('x', None) partial-sum(y)
    """
    text = repr(plan.sharding(v).spec)
    held = plan.diagnostics.held.get(v.id)
    if held is not None and held.partial is not None:
        text += f" partial-{held.partial.op}({plan.fine.label(held.partial.axes)})"
    return text


def coll_text(c: Collective) -> str:
    n = getattr(c, "tensors", 1)
    return f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device}B" + (f" x{n}" if n > 1 else "")


def rows(plan) -> list[Row]:
    """The per-op table as data, in program order."""
    by_op: dict[int, list[Collective]] = {}
    for c in plan.collectives:
        by_op.setdefault(c.op_id, []).append(c)
    out: list[Row] = []
    for i, v in enumerate(plan.graph.inputs):
        out.append(Row("input", f"input {plan.in_names[i]}", v.type_str, sharding_text(plan, v), local_text(plan, v), (),
                       value_id=v.id))

    ports = {v.id: name for v, name in zip(plan.graph.outputs, plan.out_names)}

    def walk(graph, depth):
        for op in graph.ops:
            colls = tuple(by_op.get(op.id, []))
            for v in op.outputs:
                nm = f" <{v.name}>" if v.name else ""
                label = (f"output {ports[v.id]}" if depth == 0 and v.id in ports and is_output_port(op)
                         else f"{user_name(op)} #{op.id}{nm}" + _where(op))
                out.append(Row("op", label, v.type_str, sharding_text(plan, v), local_text(plan, v),
                               colls, depth, op.source, v.id))
                colls = ()
            for r in op.regions:
                walk(r, depth + 1)

    walk(plan.graph, 0)
    for c in by_op.get(-1, []):  # at the program boundary, or combined from several ops
        combined = c.op.startswith("combined")
        out.append(Row("combined" if combined else "boundary", "combined" if combined else "boundary",
                       "", "", "", (c,), 0, c.op if combined else ""))
    return out


def notes(plan) -> list[str]:
    """Fallbacks and notes, as report() prints them after the table."""
    found, lines = plan.diagnostics, []
    for axis, sched in schedules(plan.graph):
        lines.append(f"{sched} over mesh axis {axis!r}")
    for fb in found.fallbacks:
        lines.append(f"REPLICATED FALLBACK at {fb.op}: {fb.reason}")
    for note in found.notes:
        lines.append(f"note: {note}")
    for shaped in found.shaped:
        lines.append(f"shaped for {plan.shaping.hardware.name if plan.shaping.hardware else 'collective_matmul_bytes'}: "
                     f"{shaped}")
    for c in plan.collectives:
        if c.op.startswith("combined:"):
            lines.append(f"combined {coll_text(c)}: {c.op[len('combined: '):]}")
    for v, d, s in zip(plan.graph.outputs, plan.out_fine_dims, plan.out_specs):
        if plan.fine_dims(v) != d:
            lines.append(f"note: output %{v.id} {v.type_str} is uneven on {plan.sharding(v).spec!r}; "
                         f"returned as {s} (jax.Arrays must divide evenly)")
    return lines


def title(plan) -> str:
    return (f"gspmd_py plan for {plan.fn_name} on {plan.mesh}"
            + (f" (executed on {dict(zip(plan.fine.names, plan.fine.sizes))})"
               if plan.fine.names != plan.mesh.axis_names else ""))


def summary(plan) -> str:
    cs = plan.collectives
    total = sum(c.bytes_per_device for c in cs)
    return f"collectives: {len(cs)} ({_count(cs)}), {total} bytes per device"


def report(plan) -> str:
    """The text of ``plan.report()``."""
    lines = [title(plan)]
    table = [("op", "global", "sharding", "local", "collectives")]
    for r in rows(plan):
        if r.kind == "boundary":
            table.append(("boundary", "", "", "", "; ".join(coll_text(c) for c in r.collectives)))
        else:
            table.append(("  " * r.depth + r.label, r.global_type, r.sharding, r.local,
                          "; ".join(coll_text(c) for c in r.collectives)))
    widths = [min(max(len(r[i]) for r in table), 48) for i in range(5)]
    for r in table:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    lines.append(summary(plan))
    lines.extend(notes(plan))
    return "\n".join(lines)


def _where(op) -> str:
    """`` (model.py:40)`` for an op the user wrote to shard or name a value (gp.annotate,
    with_sharding_constraint, gp.tag): the file and line it is at."""
    m = SOURCE.match(op.source) if op.prim in ("gspmd_annotate", "gspmd_tag") else None
    return f" ({os.path.basename(m.group(1))}:{m.group(2)})" if m else ""


def local_text(plan, v) -> str:
    """The local (per-device) shape of value ``v`` under the plan, as ``[4,8]``."""
    d = plan.fine_dims(v)
    shape = plan.local_shape(v.shape, d)
    return "[" + ",".join(str(s) for s in shape) + "]"


def _count(cs) -> str:
    kinds: dict[str, int] = {}
    for c in cs:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"
