"""Each compiler pass's output as text: what ``GSPMD_PY_DUMP=dir`` writes and the golden
tests (tests/golden/) compare.

The text is gspmd_py's own, not JAX's: a graph prints its ops with their value ids, types
and plain parameters (ints, strings, tuples of them); a propagation adds each value's
sharding in Shardy's notation (``[{x}, {y}]``); a per-device program prints one line per
equation (loop and branch bodies indented under theirs) with its output types, the op that
caused it and its collective::

    %5<hidden> f32[8,32] [{x}, {y}] = max %4 %c
    f32[4,16] = dot_general f32[4,8] f32[8,16]   <- dot_general #6
      all-reduce(y) 256B

So it reads the same under every supported JAX version except where JAX's own primitive
set differs (``PRIM_ALIASES`` names the renames it evens out).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional

from ..core.jax_compat import scan_counts
from ..core.ir import Graph, Op, Value
from ..program.program_index import ProgramIndex

#: primitive names JAX versions spell differently, to one spelling
PRIM_ALIASES = {"pjit": "jit", "closed_call": "call", "core_call": "call"}


def _plain(v: Any) -> bool:
    if isinstance(v, (bool, int, str)):
        return True
    return isinstance(v, (tuple, list)) and all(_plain(x) for x in v)


def _params(op: Op) -> str:
    params = dict(op.params)
    if op.prim == "scan":  # one spelling of the loop's operand counts, whatever the JAX version's
        params.pop("ft_in", None), params.pop("ft_out", None)
        params["num_consts"], params["num_carry"] = scan_counts(op.params)
    shown = [f"{k}={tuple(v) if isinstance(v, list) else v}" for k, v in sorted(params.items())
             if _plain(v) and not k.startswith("_")]  # private parameters differ between JAX versions
    return "[" + " ".join(shown) + "]" if shown else ""


def _value(v: Value, sharding: Optional[Callable[[Value], str]]) -> str:
    name = f"%{v.id}" + (f"<{v.name}>" if v.name else "")
    s = f" {sharding(v)}" if sharding is not None else ""
    return f"{name} {v.type_str}{s}"


def _operand(v: Value) -> str:
    return f"%{v.id}" if not v.is_const else f"%{v.id}:const"


def graph_text(graph: Graph, sharding: Optional[Callable[[Value], str]] = None, indent: str = "") -> str:
    """``graph`` one op per line, regions indented under their op; ``sharding(v)``: text
    added after each value's type (a propagation's, see ``propagation_text``)."""
    lines = []
    if not indent:
        lines.append("inputs " + ", ".join(_value(v, sharding) for v in graph.inputs))
    for op in graph.ops:
        outs = ", ".join(_value(v, sharding) for v in op.outputs)
        ins = " ".join(_operand(v) for v in op.inputs)
        lines.append(f"{indent}{outs} = {PRIM_ALIASES.get(op.prim, op.prim)}{_params(op)} {ins}".rstrip())
        for k, r in enumerate(op.regions):
            lines.append(f"{indent}  region {k}: inputs " + ", ".join(_value(v, sharding) for v in r.inputs))
            lines.append(graph_text(r, sharding, indent + "    "))
            lines.append(f"{indent}    return " + " ".join(_operand(v) for v in r.outputs))
    if not indent:
        lines.append("return " + " ".join(_operand(v) for v in graph.outputs))
    return "\n".join(line for line in lines if line)


def seeds_text(seeds) -> str:
    """One line per seed: the value, its dims (``?``: left open), priority and origin."""
    lines = []
    for s in seeds:
        dims = ", ".join("?" if d is None else "{" + ",".join(str(a) for a in d) + "}" for d in s.dims)
        lines.append(f"%{s.value.id} [{dims}] p{s.priority}  <- {s.origin}")
    return "\n".join(lines)


def propagation_text(graph: Graph, mesh, prop) -> str:
    """The graph with every value's sharding (Shardy's notation), as propagation left it."""
    from ..core.sharding import Sharding

    return graph_text(graph, lambda v: Sharding.of(mesh, prop.dims_of(v)).shardy())


def _aval(v) -> str:
    a = getattr(v, "aval", None)
    shape = getattr(a, "shape", None)
    if shape is None:
        return "?"
    from ..core.dtypes import short_name

    return f"{short_name(a.dtype)}[{','.join(str(int(s)) for s in shape)}]"


_SOURCE = re.compile(r" \(.*\)$")


def program_text(idx: ProgramIndex, sources: bool = True) -> str:
    """The per-device program ``idx`` indexes: one line per equation in program order (bodies
    indented under their equation), its output and operand types, the op that caused it, and
    its collective (kind, fine mesh axes, bytes per device, tensors). ``sources=False``: the
    ops named without their source lines (the golden tests' text)."""
    lines = []
    for e in idx.entries:
        pad = "    " * ((len(e.path) - 1) // 2)  # (i,) top level; (i, k, j) inside body k of i
        outs = " ".join(_aval(v) for v in e.eqn.outvars) if e.eqn is not None else ""
        ins = " ".join(_aval(v) for v in e.eqn.invars) if e.eqn is not None else ""
        prim = PRIM_ALIASES.get(e.prim, e.prim)
        label = e.label if sources else _SOURCE.sub("", e.label)
        lines.append(f"{pad}{outs} = {prim}{' ' + ins if ins else ''}   <- {label}")
        for c in e.collectives:
            more = f" x{c.tensors}" if c.tensors > 1 else ""
            red = f" {c.reduce}" if c.reduce else ""
            lines.append(f"{pad}  {c.kind}({','.join(c.axes)}){red} {c.bytes_per_device}B{more}")
    return "\n".join(lines)


def collectives_text(idx: ProgramIndex) -> str:
    """The collective records, in program order (``plan.collectives``)."""
    return "\n".join(str(c) for c in idx.collectives) or "(no collectives)"
