"""Collectives counted from compiled HLO text (XLA's own partitioner, or our program).

One instruction is one op, whatever the number of operands (XLA's combiners make
tuple-shaped all-reduces: ``(f32[8], f32[4]) all-reduce(f32[8] %a, f32[4] %b)`` counts
once, with the bytes of both operands). Async pairs count their ``-start`` only.
Bytes are the operands' (what each device sends), as ``gp.Collective.bytes_per_device``;
compiled HLO names operands without their shapes, so shapes come from their definitions.

    >>> text = ["%a = f32[8]{0} parameter(0)", "%b = f32[4]{0} parameter(1)",
    ...         "%ar = (f32[8]{0}, f32[4]{0}) all-reduce(%a, %b), to_apply=%add"]
    >>> hlo_collectives(chr(10).join(text))
    [('all-reduce', 48)]
    >>> summarize([('all-reduce', 48), ('all-gather', 16), ('all-reduce', 8)])
    (3, 72, 'AR 2, AG 1')
"""
from __future__ import annotations

import re
from collections import Counter

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_SHORT = {"all-reduce": "AR", "all-gather": "AG", "reduce-scatter": "RS", "all-to-all": "A2A",
          "collective-permute": "CP"}
_OP = re.compile(r"=\s.*?\s(" + "|".join(_KINDS) + r")(-start)?\(")
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s+[\w\-]+\(")
_NAME = re.compile(r"%([\w.\-]+)")
_SHAPE = re.compile(r"\b(pred|s4|s8|s16|s32|s64|u4|u8|u16|u32|u64|f8e4m3fn|f8e5m2|f16|bf16|f32|f64|c64|c128)"
                    r"\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s4": 1, "s8": 1, "s16": 2, "s32": 4, "s64": 8, "u4": 1, "u8": 1, "u16": 2, "u32": 4,
          "u64": 8, "f8e4m3fn": 1, "f8e5m2": 1, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16}


def _operands(line: str, start: int) -> str:
    depth, i = 1, start
    while i < len(line) and depth:
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        i += 1
    return line[start:i - 1]


def _nbytes(shape_text: str) -> int:
    total = 0
    for dt, dims in _SHAPE.findall(shape_text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES[dt]
    return total


def hlo_collectives(text: str) -> list[tuple[str, int]]:
    """(kind, operand bytes) of every collective instruction in HLO text."""
    lines = text.splitlines()
    shapes = {}
    for line in lines:
        d = _DEF.match(line)
        if d:
            shapes[d.group(1)] = d.group(2)
    out = []
    for line in lines:
        m = _OP.search(line)
        if not m:
            continue
        ops = _operands(line, m.end())
        named = _NAME.findall(ops)
        nbytes = sum(_nbytes(shapes.get(n, "")) for n in named) if named else _nbytes(ops)
        out.append((m.group(1), nbytes))
    return out


def summarize(colls: list[tuple[str, int]]) -> tuple[int, int, str]:
    """(count, bytes, 'AR 2, AG 1') of a list of (kind, bytes)."""
    c = Counter(k for k, _ in colls)
    kinds = ", ".join(f"{_SHORT[k]} {c[k]}" for k in _KINDS if c[k])
    return len(colls), sum(b for _, b in colls), kinds or "none"


# -- XLA's own view of a compiled program: opcode counts, cost analysis -------------------------
_COMP = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*.*?\s([a-z][\w\-]*)\(")
_CALLED = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")


def op_counts(text: str) -> Counter:
    """Opcode -> number of instructions in the computations XLA runs as such (the entry and the
    computations it calls or loops over), not inside fusions or reducers: ``fusion`` counts the
    fused kernels, ``copy`` / ``transpose`` the ones left standing alone.

    >>> t = ["%fused (p: f32[8]) -> f32[8] {", "  %p = f32[8]{0} parameter(0)", "  ROOT %c = f32[8]{0} copy(%p)", "}",
    ...      "ENTRY %main (a: f32[8]) -> f32[8] {", "  %a = f32[8]{0} parameter(0)",
    ...      "  %f = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused", "  ROOT %t = f32[8]{0} copy(%f)", "}"]
    >>> sorted(op_counts(chr(10).join(t)).items())
    [('copy', 1), ('fusion', 1), ('parameter', 1)]
    """
    comps: dict[str, list[str]] = {}
    fused: set[str] = set()
    current = None
    for line in text.splitlines():
        c = _COMP.match(line)
        if c:
            current = comps.setdefault(c.group(1), [])
            continue
        m = _INSTR.match(line)
        if m and current is not None:
            current.append(m.group(1))
            if m.group(1) in ("fusion", "all-reduce", "all-reduce-start", "reduce-scatter", "reduce", "reduce-window",
                              "scatter", "sort", "select-and-scatter", "map"):
                fused.update(_CALLED.findall(line))
    return Counter(op for name, ops in comps.items() if name not in fused for op in ops)


def cost_analysis(compiled) -> dict[str, float]:
    """XLA's cost analysis of a ``jax.stages.Compiled`` (per device): flops, bytes accessed."""
    ca = compiled.cost_analysis()
    if isinstance(ca, (list, tuple)):  # older jax: one dict per program
        ca = ca[0] if ca else {}
    ca = ca or {}
    return {"flops": float(ca.get("flops", 0.0)), "bytes accessed": float(ca.get("bytes accessed", 0.0))}


#: opcodes an HLO diff names (what moves or rearranges data, and the kernels)
DIFF_OPS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute", "copy", "transpose",
            "fusion", "dynamic-slice", "dynamic-update-slice", "pad", "slice", "concatenate", "select", "dot",
            "convolution", "sort", "gather", "scatter", "custom-call", "while", "conditional")


def count_diff(ours: Counter, xla: Counter) -> str:
    """The opcodes whose counts differ, ours against XLA's: ``'+1 copy, -2 fusion'`` ('' when none).

    >>> count_diff(Counter({"copy": 2, "fusion": 3}), Counter({"copy": 1, "fusion": 5, "transpose": 1}))
    '+1 copy, -1 transpose, -2 fusion'
    """
    def norm(c):
        out = Counter()
        for k, v in c.items():
            out[k[:-6] if k.endswith("-start") else k] += v
        return out

    a, b = norm(ours), norm(xla)
    parts = [f"{a[k] - b[k]:+d} {k}" for k in DIFF_OPS if a[k] != b[k]]
    return ", ".join(parts)


def profile(text: str) -> dict:
    """Collectives (count, bytes, kinds), fusions, copies and transposes outside fusions, and the
    instruction count of an optimized HLO module: the deterministic side of a per-call race."""
    c = op_counts(text)
    n, nbytes, kinds = summarize(hlo_collectives(text))
    return {"collectives": n, "collective_bytes": nbytes, "kinds": kinds, "fusions": c["fusion"],
            "copies": c["copy"] + c["copy-start"], "transposes": c["transpose"], "instructions": sum(c.values())}
