"""Op by op: every op family of the rule registry against ``jax.jit`` with the same shardings.

For each case of ``ops_cases.py`` (one small program per rule function), on the (2, 4) and
(8,) meshes, with its first argument replicated, batch-sharded, sharded on each other dim,
uneven, and the case's extra layouts, the deterministic part of a row is XLA's own view of
both compiled per-device programs:

* collectives (kind, bytes per device): ours from ``plan.collectives`` (the boundary
  included), XLA's from its compiled HLO (``hlo.py``);
* ``compiled.cost_analysis()`` of each: flops and bytes accessed per device;
* the optimized HLO's fusions, and the copies and transposes left standing alone
  (``hlo.op_counts``).

A row is flagged by its counts (``D``) when ours moves more collective bytes, does more flops,
or leaves more copies / transposes than XLA's program; its cause is the HLO diff (the opcodes
whose counts differ, and the collectives of each side). Per-call time is measured only where
one call takes at least ``TIMED_S`` (1 ms; below that a row is call overhead): interleaved
rounds, the ratio per round, its median and interquartile spread; a row is flagged by time
(``T``) only when the whole spread is over ``SLOW`` (1.10x).

    python -m benchmarks --only ops [--quick]      -> benchmarks/results/ops.md

``--quick``: the (2, 4) mesh, one layout per case (batch), small shapes, few repeats (the
test suite runs it: tests/programs/test_ops_benchmark.py; ``deterministic`` alone runs there
on a few rows).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from typing import Optional

import attrs
import numpy as np

from . import hlo
from .ops_cases import NOT_RACED, Case, cases, missing_families, variants
from .programs import even_spec
from .report import md_table
from .timing import fmt_s, interleaved

SLOW, TIMED_S, MESHES = 1.10, 1e-3, (((2, 4), ("x", "y")), ((8,), ("x",)))
#: flops over XLA's that flag a row: 1% and 64 flops (a program's index arithmetic, a few scalars, is not a cause)
FLOPS_REL, FLOPS_ABS = 0.01, 64.0
NAN = float("nan")


@attrs.frozen
class Counts:
    """One compiled per-device program, as XLA sees it."""

    colls: int
    coll_bytes: int
    coll_kinds: str
    flops: float
    bytes_accessed: float
    fusions: int
    copies: int
    transposes: int

    @classmethod
    def of(cls, compiled, collectives: Optional[list] = None) -> "Counts":
        """``collectives``: (kind, bytes) pairs when the caller has them (ours: plan.collectives),
        else counted in the HLO."""
        text = compiled.as_text()
        ops = hlo.op_counts(text)
        n, b, kinds = hlo.summarize(collectives if collectives is not None else hlo.hlo_collectives(text))
        ca = hlo.cost_analysis(compiled)
        return cls(n, b, kinds, ca["flops"], ca["bytes accessed"], ops["fusion"], ops["copy"] + ops["copy-start"],
                   ops["transpose"])


@attrs.frozen
class Row:
    mesh: str
    family: str
    case: str
    layout: str
    ours: Optional[Counts]  # None: the case did not run (``failed`` says why)
    xla: Optional[Counts]
    max_err: float
    ours_s: float = NAN  # per call (median); nan: under TIMED_S, not timed
    jit_s: float = NAN
    spread: tuple = (NAN, NAN)  # the per-round ratio's quartiles
    diff: str = ""  # hlo.count_diff of the two optimized programs
    notes: str = ""  # the plan's fallbacks and notes
    failed: str = ""

    @classmethod
    def from_json(cls, d: dict) -> "Row":
        d = dict(d, spread=tuple(d["spread"]))
        for k in ("ours", "xla"):
            d[k] = None if d[k] is None else Counts(**d[k])
        return cls(**d)

    @property
    def ratio(self) -> float:
        return self.ours_s / self.jit_s if self.jit_s > 0 else NAN

    @property
    def flags(self) -> str:
        """'D' when the counts say ours does more than XLA's, 'T' when the timing spread is over SLOW."""
        o, x = self.ours, self.xla
        if o is None:
            return "F"
        if x is None:
            return "X"
        det = (o.coll_bytes > x.coll_bytes or _more_flops(o, x) or o.copies > x.copies
               or o.transposes > x.transposes)
        return ("D" if det else "") + ("T" if self.spread[0] > SLOW else "")

    def cause(self) -> str:
        """Why the row is flagged, from the HLO diff and the collectives of both programs."""
        o, x = self.ours, self.xla
        if o is None or x is None:
            return self.failed
        parts = []
        if o.coll_bytes != x.coll_bytes or o.coll_kinds != x.coll_kinds:
            parts.append(f"collectives {o.coll_kinds} ({o.coll_bytes:,} B) vs XLA's {x.coll_kinds} ({x.coll_bytes:,} B)")
        if _more_flops(o, x):
            parts.append(f"flops {o.flops:,.0f} vs {x.flops:,.0f}")
        parts.append(f"HLO diff: {self.diff}" if self.diff else "the same opcode counts (the difference is in "
                     "the kernels' shapes or layouts, or per-call overhead)")
        if self.notes:
            parts.append(self.notes)
        return "; ".join(parts)


def _more_flops(o: Counts, x: Counts) -> bool:
    return o.flops > x.flops * (1 + FLOPS_REL) + FLOPS_ABS


def _notes(plan) -> str:
    notes = [f"fallback: {f.reason}" for f in plan.fallbacks] + [n.split("): ", 1)[-1] for n in plan.diagnostics.notes]
    boundary = sum(c.bytes_per_device for c in plan.collectives if c.op == "boundary")
    if boundary:
        notes.insert(0, f"{boundary:,} B at the program boundary (uneven input re-laid out)")
    return "; ".join(n[:160] for n in notes[:2])


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return (xs[0], xs[0]) if xs else (NAN, NAN)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def _err(got, want) -> float:
    import jax

    return max((float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)), initial=0.0))
                for u, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))), default=0.0)


def race(case: Case, mesh_shape, names, quick: bool, timing: bool = True,
         layouts: Optional[set] = None) -> list[Row]:
    """The rows of one case on one mesh (``layouts``: only these variants; ``timing``: False
    for the deterministic part alone)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    import gspmd_py as gp

    mesh = gp.Mesh(mesh_shape, names)
    jm = jax.sharding.Mesh(mesh.jax_devices(), names)
    sizes = dict(zip(names, mesh_shape))
    rows = []
    for layout, specs, args in variants(case, mesh, quick, all_layouts=layouts is not None):
        if layouts is not None and layout not in layouts:
            continue
        ours = gp.spmd(case.fn, mesh, in_shardings=specs)
        plan = ours.plan(*args)

        def constrained(*xs, _specs=specs):
            xs = [x if s is None else jax.lax.with_sharding_constraint(x, NamedSharding(jm, JP(*s)))
                  for x, s in zip(xs, _specs)]
            return case.fn(*xs)

        jit_in = tuple(NamedSharding(jm, JP() if s is None else even_spec(s, a.shape, sizes)) for s, a in zip(specs, args))
        jitted = jax.jit(constrained, in_shardings=jit_in)
        stage = plan.lower().compile()  # the stages' Compiled: counted, then called (one compile per side)
        ours_c = stage.compiled
        oc = Counts.of(ours_c, [(c.kind, c.bytes_per_device) for c in plan.collectives])
        mesh_name = "x".join(map(str, mesh_shape))
        try:
            compiled = jitted.lower(*args).compile()
        except Exception as e:  # XLA's own partitioner refuses the program: ours alone
            first = str(e).strip().splitlines()[0][:200]
            rows.append(Row(mesh_name, case.family, case.name, layout, oc, None, NAN, notes=_notes(plan),
                            failed=f"jax.jit's program does not compile ({type(e).__name__}: {first})"))
            continue
        xc = Counts.of(compiled)
        diff = hlo.count_diff(hlo.op_counts(ours_c.as_text()), hlo.op_counts(compiled.as_text()))
        placed_ours = [jax.device_put(a, NamedSharding(plan.jax_mesh, even_spec(s, a.shape, plan.fine.size_of)))
                       for a, s in zip(args, plan.in_specs)]
        placed_jit = [jax.device_put(a, s) for a, s in zip(args, compiled.input_shardings[0])]
        err = _err(jax.block_until_ready(stage(*placed_ours)), jax.block_until_ready(compiled(*placed_jit)))
        row = Row(mesh_name, case.family, case.name, layout, oc, xc, err, diff=diff, notes=_notes(plan))
        if timing:
            fns = {"ours": lambda: jax.block_until_ready(stage(*placed_ours)),
                   "jit": lambda: jax.block_until_ready(compiled(*placed_jit))}
            probe = interleaved(fns, repeats=1, warmup=1, min_sample_s=0.0)
            if max(probe.values()) >= TIMED_S:
                got: dict[str, list[float]] = {}
                t = interleaved(fns, repeats=5 if quick else 9, warmup=0, min_sample_s=0.0, samples_out=got)
                ratios = [a / b for a, b in zip(got["ours"], got["jit"])]
                row = attrs.evolve(row, ours_s=t["ours"], jit_s=t["jit"], spread=_quartiles(ratios))
        rows.append(row)
    return rows


def deterministic(case: Case, mesh_index: int = 0, layouts: Optional[set] = None) -> list[Row]:
    """The rows of ``case`` at --quick size without timing (what the test suite checks);
    ``layouts``: these variants (default: the batch layout)."""
    return race(case, *MESHES[mesh_index], quick=True, timing=False, layouts=layouts)


def _pair(a, b, fmt=str) -> str:
    return fmt(a) if a == b else f"{fmt(a)} / {fmt(b)}"


def table(rows: list[Row]) -> str:
    body = []
    for r in rows:
        if r.ours is None or r.xla is None:  # did not run, or jax.jit's side did not compile
            o = r.ours
            body.append([r.mesh, r.family, r.case, r.layout] + (
                ["-"] * 8 if o is None else [f"{o.coll_bytes:,} ({o.coll_kinds}) / -", f"{o.flops:,.0f} / -",
                                             f"{o.bytes_accessed:,.0f} / -", f"{o.fusions} / -", f"{o.copies} / -",
                                             f"{o.transposes} / -", "-", "-"]) + [f"**{r.flags}**"])
            continue
        o, x = r.ours, r.xla
        timed = (f"{r.ratio:.2f}x [{r.spread[0]:.2f}-{r.spread[1]:.2f}] ({fmt_s(r.ours_s)} / {fmt_s(r.jit_s)})"
                 if r.ours_s == r.ours_s else "-")
        body.append([r.mesh, r.family, r.case, r.layout,
                     _pair(f"{o.coll_bytes:,} ({o.coll_kinds})", f"{x.coll_bytes:,} ({x.coll_kinds})"),
                     _pair(o.flops, x.flops, lambda v: f"{v:,.0f}"),
                     _pair(o.bytes_accessed, x.bytes_accessed, lambda v: f"{v:,.0f}"),
                     _pair(o.fusions, x.fusions), _pair(o.copies, x.copies), _pair(o.transposes, x.transposes),
                     timed, f"{r.max_err:.1e}", f"**{r.flags}**" if r.flags else ""])
    head = ["mesh", "family", "case", "layout (first argument)", "collective B/device (ours / XLA)",
            "flops (ours / XLA)", "bytes accessed (ours / XLA)", "fusions", "copies", "transposes",
            "per call ours / jit [quartiles] (ours / jit)", "max |diff|", "flag"]
    return md_table(head, body)


def _failed(c: Case, shape, why: str) -> Row:
    return Row("x".join(map(str, shape)), c.family, c.name, "(all layouts)", None, None, NAN, failed=why)


def _isolated(index: int, mesh: int, quick: bool, timeout_s: float) -> list[Row]:
    """One case on one mesh in a fresh process (a program that hangs in XLA's CPU runtime
    cannot stall the table: its case gets one row saying so)."""
    cmd = [sys.executable, "-m", "benchmarks.ops", str(index), str(mesh)] + (["--quick"] if quick else [])
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    c = cases()[index]
    shape = MESHES[mesh][0]
    try:
        done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [_failed(c, shape, f"did not finish in {timeout_s:.0f} s (a hang or an overloaded machine)")]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        err = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [_failed(c, shape, f"failed: {err}")]
    return [Row.from_json(json.loads(ln)) for ln in lines]


def run(quick: bool, only_families: Optional[set] = None, log=lambda s: print(s, flush=True),
        isolate: Optional[bool] = None, timeout_s: float = 300) -> str:
    """The table; ``isolate`` (default: not quick) runs each case in a fresh process."""
    from gspmd_py.ops.registry import rule_functions

    t0 = time.perf_counter()
    registered = [fn.__name__ for fn in rule_functions()]
    isolate = (not quick) if isolate is None else isolate
    todo = [(i, c) for i, c in enumerate(cases()) if only_families is None or c.family in only_families]
    rows: list[Row] = []
    for m, (shape, names) in enumerate(MESHES[:1] if quick else MESHES):
        for i, c in todo:
            got = _isolated(i, m, quick, timeout_s) if isolate else race(c, shape, names, quick)
            rows.extend(got)
            for r in got:
                log(f"  {r.mesh} {r.family:22s} {r.layout:28s} {r.flags or '-':3s} {r.diff or r.failed}")
    flagged = [r for r in rows if r.flags]
    timed = [r for r in rows if r.ours_s == r.ours_s]
    text = ["## Op by op: gspmd_py / jax.jit with the same input shardings\n",
            f"{len(rows)} rows, {len({r.family for r in rows})} op families of the registry's "
            f"{len(registered)} rule functions ({len(NOT_RACED)} not raced: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(NOT_RACED.items())) + ").\n",
            "Deterministic columns (XLA's own view of both compiled per-device programs): collective bytes per "
            "device (ours from plan.collectives, the boundary included; XLA's from its compiled HLO), "
            "`compiled.cost_analysis()` flops and bytes accessed per device, and the optimized HLO's fusions and "
            "stand-alone copies and transposes; one value where both sides agree, `ours / XLA` where they differ. "
            f"Per call: only where a call takes at least {TIMED_S * 1e3:.0f} ms (placed inputs, each side's compiled stage called, interleaved rounds; "
            "the ratio's median and its quartiles over the rounds); below that a row is call overhead and is not "
            f"timed ({len(timed)} of {len(rows)} rows timed). Flags: **D** ours moves more collective bytes, does "
            "more flops (over 1% and 64) or leaves more copies / transposes than XLA's program; **T** the whole quartile spread of "
            f"the ratio is over {SLOW:.2f}x; **X** jax.jit's program does not compile (ours alone); **F** the case did not run. The machine is shared with other jobs "
            "(2 cores, 8 host devices).\n"]
    missing = missing_families(registered)
    if missing:
        text.append(f"Rule functions with no case: {', '.join(missing)}\n")
    text.append(table(rows))
    text.append(f"\n### Flagged rows ({len(flagged)}), each with its cause (the HLO diff: opcode counts ours - XLA's)\n")
    text.extend(f"- {r.mesh} {r.family} `{r.case}` {r.layout} [{r.flags}]"
                + (f" {r.ratio:.2f}x [{r.spread[0]:.2f}-{r.spread[1]:.2f}]" if r.ours_s == r.ours_s else "")
                + f": {r.cause()}" for r in flagged)
    text.append(f"\n(ran in {time.perf_counter() - t0:.0f} s{', --quick' if quick else ''})\n")
    return "\n".join(text)


if __name__ == "__main__":  # one case on one mesh, rows as JSON lines (run() isolates cases this way)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _i, _m = int(sys.argv[1]), int(sys.argv[2])
    for _r in race(cases()[_i], *MESHES[_m], quick="--quick" in sys.argv):
        print(json.dumps(attrs.asdict(_r)), flush=True)
