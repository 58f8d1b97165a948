"""``plan.save_html(path)``: one self-contained HTML page for a Plan (no network: inline CSS and
SVG only, no scripts).

The page has the plan's summary and mesh, any replicated fallbacks and notes, the collectives
in program order with their bytes, a card per input, annotated, tagged and output value (its
sharding, tile grid and ``explain`` chain), the per-op table, and the per-device program::

    plan = gp.spmd(mlp, mesh, in_shardings=...).plan(x, w1, w2)
    plan.save_html("plan.html")      # open it in any browser
"""
from __future__ import annotations

import html
import os
from typing import Optional

from . import report as rep
from ..core.errors import ArgumentError
from ..core.ir import Value
from .visualize import Cell, TileGrid, color_of, tile_grid

_CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Arial,sans-serif;margin:24px 32px;color:#1d2330;
background:#fafbfc;font-size:14px;line-height:1.4}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:2px solid #dde3ea;padding-bottom:4px}
h3{font-size:14px;margin:0 0 6px;word-break:break-all}
.meta{color:#4a5568;margin:2px 0}.mono,code,pre,td.m{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
nav a{margin-right:14px;color:#2b6cb0;text-decoration:none}
table{border-collapse:collapse;background:#fff;box-shadow:0 1px 2px rgba(0,0,0,.08)}
th,td{border:1px solid #e2e8f0;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#edf2f7;font-weight:600;position:sticky;top:0}
tr:nth-child(even) td{background:#f9fafb}
td.num{text-align:right;font-variant-numeric:tabular-nums}
.coll{color:#9b2c2c;font-weight:600}
.warn{background:#fff5f5;border-left:4px solid #e53e3e;padding:6px 10px;margin:6px 0}
.note{background:#fffff0;border-left:4px solid #d69e2e;padding:6px 10px;margin:6px 0}
.cards{display:flex;flex-wrap:wrap;gap:14px;align-items:flex-start}
.card{background:#fff;border:1px solid #e2e8f0;border-radius:6px;padding:10px 12px;box-shadow:0 1px 2px rgba(0,0,0,.06);
max-width:600px}
.card .kind{font-size:11px;font-weight:600;letter-spacing:.03em;color:#718096}
.card .kind .src{font-weight:400;font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;word-break:break-all}
.card pre{background:#f7fafc;border:1px solid #edf2f7;padding:6px;margin:6px 0 0;white-space:pre-wrap;
word-break:break-all;max-height:220px;overflow:auto}
details pre{background:#fff;border:1px solid #e2e8f0;padding:8px;overflow:auto;max-height:600px}
.badge{display:inline-block;border-radius:10px;padding:0 8px;margin-right:6px;background:#edf2f7;font-size:12px}
"""


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def svg_grid(grid: TileGrid, *, max_w: int = 360, max_h: int = 180) -> str:
    """The tile grid as an inline SVG: column widths and row heights follow the tile sizes."""
    if not grid.cells:
        return ""
    ncol = len(grid.cells[0])
    texts = [[("…", "") if c is None else (c.device_text(), c.range_text()) for c in row] for row in grid.cells]
    need_w = [max(max(len(t[0]), len(t[1])) for t in (row[j] for row in texts)) * 7 + 12 for j in range(ncol)]
    need_h = 34

    # one scale for both directions (the value's aspect ratio), at least legible cells
    f = min(max_w / max(sum(grid.col_sizes), 1), max_h / max(sum(grid.row_sizes), 1))
    cw = [max(n, int(s * f)) for s, n in zip(grid.col_sizes, need_w)]
    rh = [max(need_h, int(s * f)) for s in grid.row_sizes]
    w, h = sum(cw) + 2, sum(rh) + 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img">']
    y = 1
    for i, row in enumerate(grid.cells):
        x = 1
        for j, cell in enumerate(row):
            fill = color_of(cell)
            out.append(f'<rect x="{x}" y="{y}" width="{cw[j]}" height="{rh[i]}" fill="{fill}" stroke="#4a5568" '
                       f'stroke-width="1"/>')
            t1, t2 = texts[i][j]
            cx, cy = x + cw[j] / 2, y + rh[i] / 2
            out.append(f'<text x="{cx:g}" y="{cy - 2:g}" text-anchor="middle" font-size="12" '
                       f'font-family="DejaVu Sans Mono,monospace" fill="#1a202c">{_e(t1)}</text>')
            if t2:
                out.append(f'<text x="{cx:g}" y="{cy + 12:g}" text-anchor="middle" font-size="10" '
                           f'font-family="DejaVu Sans Mono,monospace" fill="#4a5568">{_e(t2)}</text>')
            x += cw[j]
        y += rh[i]
    out.append("</svg>")
    return "".join(out)


def _mesh_svg(plan) -> str:
    """The mesh itself: device ids in mesh order (first axis down, the others across)."""
    mesh = plan.mesh
    ids = mesh.device_ids
    if mesh.size > 256:
        return ""
    rows = ids.reshape(mesh.shape[0], -1) if len(mesh.shape) > 1 else ids.reshape(1, -1)
    cells = tuple(tuple(Cell((int(d),), ()) for d in r) for r in rows)
    grid = TileGrid(cells, (1,) * rows.shape[0], (1,) * rows.shape[1])
    return svg_grid(grid, max_w=min(60 * rows.shape[1], 600), max_h=min(40 * rows.shape[0], 400))


def shown_values(plan) -> list[tuple[str, str, Value, str]]:
    """(label, kind, value, source line) for every input, annotated, tagged and output value, in program order."""
    out: list[tuple[str, str, Value, str]] = []
    seen: set[int] = set()

    def add(label, kind, v, source=""):
        if v.id not in seen:
            seen.add(v.id)
            out.append((label, kind, v, source))

    for name, v in zip(plan.in_names, plan.graph.inputs):
        add(name, "input", v)
    for op in plan.graph.walk():
        if op.prim == "gspmd_annotate" and not op.params.get("unspecified"):
            v = op.outputs[0]
            origin = op.params.get("origin", "gp.annotate")
            add(v.name or f"%{v.id}", origin, v, op.source)
        elif op.prim == "gspmd_tag":
            add(op.outputs[0].name or f"%{op.outputs[0].id}", "gp.tag", op.outputs[0], op.source)
    for name, v in zip(plan.out_names, plan.graph.outputs):
        add(name, "output", v)
    return out


def page(plan) -> str:
    """The HTML text of the page."""
    title = rep.title(plan)
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             f"<title>{_e(title)}</title>", f"<style>{_CSS}</style></head><body>",
             f"<h1>{_e(title)}</h1>", f'<p class="meta">{_e(rep.summary(plan))}</p>',
             '<nav><a href="#collectives">collectives</a><a href="#values">annotated values</a>'
             '<a href="#boundary">inputs and outputs</a>'
             '<a href="#ops">per-op table</a><a href="#program">per-device program</a></nav>']
    mesh_pic = _mesh_svg(plan)
    if mesh_pic:
        axes = ", ".join(f"{n}={s}" for n, s in zip(plan.mesh.axis_names, plan.mesh.shape))
        parts.append(f'<h2 id="mesh">Mesh</h2><p class="meta">{_e(axes)}: device ids in mesh order '
                     f'({_e(plan.mesh.axis_names[0])} down{", the others across" if len(plan.mesh.shape) > 1 else ""})'
                     f'</p>{mesh_pic}')
    notes = rep.notes(plan)
    if notes:
        parts.append('<h2 id="notes">Fallbacks and notes</h2>')
        for n in notes:
            parts.append(f'<div class="{"warn" if n.startswith("REPLICATED") else "note"}">{_e(n)}</div>')
    parts.append(_collectives(plan))
    parts.append(_values(plan))
    parts.append(_ops(plan))
    parts.append('<h2 id="program">Per-device program</h2><details><summary>the body of the shard_map '
                 f'(jaxpr)</summary><pre>{_e(plan.spmd_text())}</pre></details>')
    parts.append("</body></html>")
    return "\n".join(parts)


def _collectives(plan) -> str:
    cs = plan.collectives
    out = [f'<h2 id="collectives">Collectives in program order ({len(cs)})</h2>']
    if not cs:
        out.append('<p class="meta">none: the program moves no data between devices</p>')
        return "\n".join(out)
    out.append('<table class="collectives"><thead><tr><th>#</th><th>kind</th><th>mesh axes</th>'
               '<th>bytes per device</th><th>buffer</th><th>tensors</th><th>op</th></tr></thead><tbody>')
    for i, c in enumerate(cs):
        out.append(f'<tr><td class="num">{i}</td><td class="coll">{_e(c.kind)}</td><td class="m">'
                   f'{_e(",".join(c.axes))}</td><td class="num">{c.bytes_per_device:,}</td>'
                   f'<td class="m">{_e(_buffer(c))}</td><td class="num">{getattr(c, "tensors", 1)}</td>'
                   f'<td class="m">{_e(c.op)}</td></tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


MAX_BOUNDARY_CARDS = 16  # more inputs + outputs than this (a model's parameters): a table for them


def _card(plan, label, kind, v, source) -> str:
    s = plan.sharding(v)
    explain = plan.prop.explain(v, label)
    src = f' <span class="src">at {_e(source)}</span>' if source else ""
    return (f'<div class="card value"><div class="kind">{_e(kind)}{src}</div><h3 class="mono">{_e(label)}</h3>'
            f'<div><span class="badge mono">{_e(v.type_str)}</span><span class="badge mono">'
            f'{_e(repr(s.spec))}</span><span class="badge mono">local {_e(rep.local_text(plan, v))}</span></div>'
            f'<div class="mono meta">{_e(str(s))}</div>'
            f'{svg_grid(tile_grid(s, v.shape))}<pre class="explain">{_e(explain)}</pre></div>')


def _buffer(c) -> str:
    """``f32[4,16]`` (+ `` in a loop``): the local buffer a collective sends, when recorded."""
    dtype, shape = getattr(c, "dtype", ""), getattr(c, "shape", ())
    text = f"{Value(0, tuple(shape), dtype).type_str}" if dtype else ""
    return text + (" in a loop" if getattr(c, "in_loop", False) else "")


def _values(plan) -> str:
    shown = shown_values(plan)
    inner = [x for x in shown if x[1] not in ("input", "output")]
    edge = [x for x in shown if x[1] in ("input", "output")]
    out = [f'<h2 id="values">Annotated and tagged values ({len(inner)})</h2>']
    if inner:
        out.append('<div class="cards">' + "".join(_card(plan, *x) for x in inner) + "</div>")
    else:
        out.append('<p class="meta">none: no gp.annotate, with_sharding_constraint or gp.tag in the function</p>')
    out.append(f'<h2 id="boundary">Inputs and outputs ({len(edge)})</h2>')
    if len(edge) <= MAX_BOUNDARY_CARDS:
        out.append('<div class="cards">' + "".join(_card(plan, *x) for x in edge) + "</div>")
        return "\n".join(out)
    out.append('<table class="boundary"><thead><tr><th>value</th><th>global</th><th>sharding</th><th>local</th>'
               '<th>GSPMD</th><th>why</th></tr></thead><tbody>')
    for label, kind, v, _ in edge:
        s = plan.sharding(v)
        out.append(f'<tr><td class="m">{_e(label)}</td><td class="m">{_e(v.type_str)}</td><td class="m">'
                   f'{_e(repr(s.spec))}</td><td class="m">{_e(rep.local_text(plan, v))}</td><td class="m">{_e(str(s))}</td>'
                   f'<td><details><summary>explain</summary><pre class="explain">{_e(plan.prop.explain(v, label))}'
                   f'</pre></details></td></tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


def _ops(plan) -> str:
    out = ['<h2 id="ops">Per-op table</h2><table class="ops"><thead><tr><th>op</th><th>global</th>'
           '<th>sharding</th><th>local</th><th>collectives</th><th>source</th></tr></thead><tbody>']
    for r in rep.rows(plan):
        pad = f' style="padding-left:{8 + 16 * r.depth}px"' if r.depth else ""
        colls = "<br>".join(f'<span class="coll">{_e(rep.coll_text(c))}</span>' for c in r.collectives)
        out.append(f'<tr><td class="m"{pad}>{_e(r.label)}</td><td class="m">{_e(r.global_type)}</td>'
                   f'<td class="m">{_e(r.sharding)}</td><td class="m">{_e(r.local)}</td><td class="m">{colls}</td>'
                   f'<td class="m">{_e(r.source)}</td></tr>')
    out.append("</tbody></table>")
    return "\n".join(out)


def save_html(plan, path: Optional[str] = None) -> str:
    """Write the page to ``path`` (when given) and return its text."""
    if path is not None and not isinstance(path, (str, os.PathLike)):  # open(3) would write to file descriptor 3
        raise ArgumentError(f"plan.save_html: path must be a file name (str or os.PathLike), got "
                            f"{type(path).__name__} {path!r:.40}")
    text = page(plan)
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text
