"""Human-readable views of a Plan: the per-op table of ``plan.report()``."""
from __future__ import annotations

from .partitioner.context import Collective


def report(plan) -> str:
    """The text of ``plan.report()``."""
    ctx, lines = plan.ctx, []
    lines.append(f"gspmd_py plan for {plan.fn_name} on {plan.mesh}"
                 + (f" (executed on {dict(zip(plan.fine.names, plan.fine.sizes))})"
                    if plan.fine.names != plan.mesh.axis_names else ""))
    collectives = plan.collectives
    by_op: dict[int, list[Collective]] = {}
    for c in collectives:
        by_op.setdefault(c.op_id, []).append(c)
    rows = [("op", "global", "sharding", "local", "collectives")]
    for i, v in enumerate(plan.graph.inputs):
        s = plan._shardings[v.id]
        rows.append((f"input {plan._in_names[i]}", v.type_str, s.shardy(), _local(plan, v), ""))
    def walk(graph, depth):
        for op in graph.ops:
            colls = "; ".join(f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device}B" for c in by_op.get(op.id, []))
            for v in op.outputs:
                s = plan._shardings[v.id]
                nm = f" <{v.name}>" if v.name else ""
                rows.append(("  " * depth + f"{op.prim} #{op.id}{nm}", v.type_str, s.shardy(), _local(plan, v),
                             colls))
                colls = ""
            for r in op.regions:
                walk(r, depth + 1)

    walk(plan.graph, 0)
    for c in by_op.get(-1, []):
        rows.append(("boundary", "", "", "", f"{c.kind}({','.join(c.axes)}) {c.bytes_per_device}B"))
    widths = [min(max(len(r[i]) for r in rows), 48) for i in range(5)]
    for r in rows:
        lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    total = sum(c.bytes_per_device for c in collectives)
    lines.append(f"collectives: {len(collectives)} ({_count(collectives)}), {total} bytes per device")
    for fb in ctx.fallbacks:
        lines.append(f"REPLICATED FALLBACK at {fb.op}: {fb.reason}")
    for note in ctx.notes:
        lines.append(f"note: {note}")
    for v, d, s in zip(plan.graph.outputs, plan._out_fdims, plan.out_specs):
        if plan._fdims(v) != d:
            lines.append(f"note: output %{v.id} {v.type_str} is uneven on {plan._shardings[v.id].shardy()}; "
                         f"returned as {s} (jax.Arrays must divide evenly)")
    return "\n".join(lines)


def _local(plan, v) -> str:
    d = plan._fdims(v)
    shape = plan.ctx.local_shape(v.shape, d)
    return "[" + ",".join(str(s) for s in shape) + "]"


def _count(cs) -> str:
    kinds: dict[str, int] = {}
    for c in cs:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "none"


