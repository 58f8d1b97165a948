"""Op by op: every op family of the rule registry against ``jax.jit`` with the same shardings.

For each case of ``ops_cases.py`` (one small program per rule function), on the (2, 4) and
(8,) meshes, with its first argument replicated, batch-sharded, sharded on each other dim,
uneven, and the case's extra layouts: per-call time of gspmd_py over jax.jit's (placed
inputs, medians of interleaved calls), and the collective bytes per device (ours:
``plan.collectives``, the boundary included; XLA's: its compiled HLO's collectives,
``hlo.py``). A row over 1.10x or over XLA's bytes gets a line saying why, read from the two
programs' collectives and the plan's notes. Nothing here asserts a number.

    python -m benchmarks --only ops [--quick]      -> benchmarks/results/ops.md

``--quick``: the (2, 4) mesh, one layout per case (batch), small shapes, few repeats (the
test suite runs it: tests/programs/test_ops_benchmark.py).
"""
from __future__ import annotations

import json
import os
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

SLOW, MESHES = 1.10, (((2, 4), ("x", "y")), ((8,), ("x",)))


@attrs.frozen
class Row:
    mesh: str
    family: str
    case: str
    layout: str
    ours_s: float
    jit_s: float
    ours_bytes: int
    xla_bytes: int
    ours_colls: str
    xla_colls: str
    max_err: float
    why: str = ""

    @property
    def ratio(self) -> float:
        return self.ours_s / self.jit_s if self.jit_s > 0 else float("nan")


def _why(plan, ours: tuple, xla: tuple, ratio: float) -> str:
    over_bytes = ours[1] > xla[1]
    if ratio <= SLOW and not over_bytes:
        return ""
    notes = [f"fallback: {f.reason}" for f in plan.fallbacks] + [n.split("): ", 1)[-1] for n in plan.ctx.notes]
    boundary = sum(c.bytes_per_device for c in plan.collectives if c.op == "boundary")
    parts = []
    if over_bytes:
        parts.append(f"moves {ours[1]:,} B ({ours[2]}) vs XLA's {xla[1]:,} B ({xla[2]})")
        if boundary:
            parts.append(f"{boundary:,} B of it at the program boundary (uneven input re-laid out)")
    elif ours[0] > xla[0]:
        parts.append(f"more collectives than XLA ({ours[2]} vs {xla[2]}) for no more bytes")
    else:
        parts.append(f"collectives no worse than XLA's ({ours[2]} vs {xla[2]}): the gap is the per-device "
                     "program's local work or per-call overhead, not communication (not diagnosed per row)")
    if notes:
        parts.append(notes[0][:160])
    return "; ".join(parts)


def race(case: Case, mesh_shape, names, quick: bool) -> list[Row]:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as JP

    import gspmd_py as gp

    mesh = gp.Mesh(mesh_shape, names)
    jm = jax.sharding.Mesh(mesh.jax_devices(), names)
    sizes = dict(zip(names, mesh_shape))
    rows = []
    for layout, specs, args in variants(case, mesh, quick):
        ours = gp.spmd(case.fn, mesh, in_shardings=specs)
        plan = ours.plan(*args)

        def constrained(*xs, _specs=specs):
            xs = [x if s is None else jax.lax.with_sharding_constraint(x, NamedSharding(jm, JP(*s)))
                  for x, s in zip(xs, _specs)]
            return case.fn(*xs)

        jit_in = tuple(NamedSharding(jm, JP() if s is None else even_spec(s, a.shape, sizes)) for s, a in zip(specs, args))
        jitted = jax.jit(constrained, in_shardings=jit_in)
        compiled = jitted.lower(*args).compile()
        placed_ours = [jax.device_put(a, NamedSharding(plan.jax_mesh, even_spec(s, a.shape, plan.fine.size_of)))
                       for a, s in zip(args, plan.in_specs)]
        placed_jit = [jax.device_put(a, s) for a, s in zip(args, compiled.input_shardings[0])]
        got = jax.block_until_ready(ours(*placed_ours))
        want = jax.block_until_ready(jitted(*placed_jit))
        err = max((float(np.max(np.abs(np.asarray(u, np.float64) - np.asarray(v, np.float64)), initial=0.0))
                   for u, v in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want))), default=0.0)
        t = interleaved({"ours": lambda: jax.block_until_ready(ours(*placed_ours)),
                         "jit": lambda: jax.block_until_ready(jitted(*placed_jit))},
                        repeats=3 if quick else 7, warmup=1, min_sample_s=0.001 if quick else 0.01)
        oc = hlo.summarize([(c.kind, c.bytes_per_device) for c in plan.collectives])
        xc = hlo.summarize(hlo.hlo_collectives(compiled.as_text()))
        ratio = t["ours"] / t["jit"]
        rows.append(Row("x".join(map(str, mesh_shape)), case.family, case.name, layout, t["ours"], t["jit"],
                        oc[1], xc[1], oc[2], xc[2], err, _why(plan, oc, xc, ratio)))
    return rows


def table(rows: list[Row]) -> str:
    body = []
    for r in rows:
        if r.ours_s != r.ours_s:  # did not run
            body.append([r.mesh, r.family, r.case, r.layout, "- **", "-", "-", "-", "-", "-"])
            continue
        flag = " **" if (r.ratio > SLOW or r.ours_bytes > r.xla_bytes) else ""
        body.append([r.mesh, r.family, r.case, r.layout, f"{r.ratio:.2f}x{flag}", fmt_s(r.ours_s), fmt_s(r.jit_s),
                     f"{r.ours_bytes:,} ({r.ours_colls})", f"{r.xla_bytes:,} ({r.xla_colls})",
                     f"{r.max_err:.1e}"])
    head = ["mesh", "family", "case", "layout (first argument)", "ours / jit", "ours", "jit",
            "bytes/device ours", "bytes/device XLA", "max |diff|"]
    return md_table(head, body)


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
        return [Row("x".join(map(str, shape)), c.family, c.name, "(all layouts)", float("nan"), float("nan"), 0, 0,
                    "-", "-", float("nan"), f"did not finish in {timeout_s:.0f} s (a hang or an overloaded machine)")]
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode or not lines:
        err = (done.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return [Row("x".join(map(str, shape)), c.family, c.name, "(all layouts)", float("nan"), float("nan"), 0, 0,
                    "-", "-", float("nan"), f"failed: {err}")]
    return [Row(**json.loads(ln)) for ln in lines]


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
                log(f"  {r.mesh} {r.family:22s} {r.layout:28s} {r.ratio:5.2f}x  {r.ours_bytes:>10,} B vs {r.xla_bytes:>10,} B")
    over = [r for r in rows if r.why]
    text = ["## Op by op: gspmd_py / jax.jit with the same input shardings\n",
            f"{len(rows)} rows, {len({r.family for r in rows})} op families of the registry's "
            f"{len(registered)} rule functions ({len(NOT_RACED)} not raced: "
            + ", ".join(f"{k}: {v}" for k, v in sorted(NOT_RACED.items())) + "). Per call: placed inputs, "
            f"median of interleaved calls. Bytes: per device, ours from plan.collectives (the boundary included), "
            f"XLA's from its compiled HLO. ** marks rows over {SLOW:.2f}x or over XLA's bytes; each has a line below. "
            "The machine is shared with other jobs (2 cores, 8 host devices): small per-call times are noisy, "
            "ratios of tiny ops are mostly call overhead.\n"]
    missing = missing_families(registered)
    if missing:
        text.append(f"Rule functions with no case: {', '.join(missing)}\n")
    text.append(table(rows))
    text.append(f"\n### Why ({len(over)} rows over {SLOW:.2f}x or over XLA's bytes)\n")
    text.extend(f"- {r.mesh} {r.family} `{r.case}` {r.layout}: {r.ratio:.2f}x, {r.why}" for r in over)
    text.append(f"\n(ran in {time.perf_counter() - t0:.0f} s{', --quick' if quick else ''})\n")
    return "\n".join(text)


if __name__ == "__main__":  # one case on one mesh, rows as JSON lines (run() isolates cases this way)
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    _i, _m = int(sys.argv[1]), int(sys.argv[2])
    for _r in race(cases()[_i], *MESHES[_m], quick="--quick" in sys.argv):
        print(json.dumps(attrs.asdict(_r)), flush=True)
