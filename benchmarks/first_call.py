"""First calls in fresh processes: gspmd_py against jax.jit, phase by phase (issues 27 and 38).

Each sample is one fresh Python process (gspmd_py and jax imported before the clock starts)
that builds the function and makes its first call through the stages, with numpy inputs:

* ours: ``plan = f.plan(*args)`` (trace + propagation + partition: "plan"), ``plan.lower()``
  (the shard_map program traced and lowered to StableHLO: "lower"), ``.compile()`` (XLA),
  the call;
* jax.jit: ``jf.trace(*args).lower()`` ("trace + lower"), ``.compile()``, the call.

"front" is plan + lower for ours and trace + lower for jax.jit: what each does before XLA.
Two modes: ``warm`` (each side first runs a throwaway program of its own, a small sharded
jit / gp.spmd: the first call of a user's second model in a process) and ``cold`` (the first
thing the process runs). Times are process CPU time (less disturbed by other users' jobs on a
shared machine) and wall time; beside them the deterministic sizes: the StableHLO module's
bytes, the operands of the manual region (ours: the shard_map's inputs), the optimized HLO's
instructions.

The programs:

* ``blocks96``: 96 unrolled transformer blocks (benchmarks/scaling.py's size sweep, 770
  inputs), data parallel on x, Megatron on y of a (2, 4) mesh;
* ``uneven``: one transformer block whose batch (7 over x) and heads (6 over y) do not
  divide: gspmd_py pads at the boundary, jax.jit gets the nearest even shardings.

Samples are interleaved (ours, jit, [ours from ``--base DIR``], then reversed) so the load of
a shared machine hits every side alike; medians go to ``benchmarks/results/first_call.md``::

    python -m benchmarks.first_call [--reps 3] [--programs blocks96,uneven] [--modes warm,cold] [--base DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PHASES = ("front", "plan", "compile", "run", "total")


def _program(program: str):
    """(fn, numpy args, gp specs, jax spec tuples) of a program."""
    import numpy as np

    import gspmd_py as gp

    rng = np.random.default_rng(0)
    if program == "blocks96":
        sys.path.append(REPO)  # gspmd_py comes from PYTHONPATH (the checkout measured)
        from benchmarks.scaling import stacked_blocks

        fn, avals, specs = stacked_blocks(96)
        shapes = [a.shape for a in avals]
        jspecs = [None if s is None else tuple(s) for s in specs]
    else:
        from gspmd_py.demo import transformer_block as fn

        B, L, M, H, K, F = 7, 32, 96, 6, 16, 200
        shapes = [(B, L, M), (M, H, K), (M, H, K), (M, H, K), (H, K, M), (M, F), (F, M), (M,), (M,)]
        jspecs = [("x", None, None), (None, "y", None), (None, "y", None), (None, "y", None), ("y", None, None),
                  (None, "y"), ("y", None), None, None]
        specs = tuple(None if s is None else gp.P(*s) for s in jspecs)
    args = [rng.standard_normal(s).astype(np.float32) * 0.05 for s in shapes]
    return fn, args, specs, jspecs


def _jit(fn, mesh, jspecs, args):
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    sizes = dict(zip(mesh.axis_names, mesh.shape))
    jm = jax.sharding.Mesh(mesh.jax_devices(), tuple(mesh.axis_names))

    def even(spec, shape):  # jax.jit refuses uneven shardings: the axes that divide
        spec = tuple(spec) + (None,) * (len(shape) - len(spec))
        return PartitionSpec(*[e if e is None or n % sizes[e] == 0 else None for e, n in zip(spec, shape)])

    return jax.jit(fn, in_shardings=tuple(NamedSharding(jm, PartitionSpec() if s is None else even(s, a.shape))
                                          for s, a in zip(jspecs, args)))


def _warm_up(who: str, mesh) -> None:
    """A throwaway program of the side's own kind (sharded, with a matmul and a reduction)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import gspmd_py as gp

    def toy(a, b):
        return jnp.tanh(a @ b).sum(axis=1)

    a, b = np.ones((8, 16), np.float32), np.ones((16, 4), np.float32)
    if who == "jit":
        jax.block_until_ready(_jit(toy, mesh, [("x", None), (None, "y")], [a, b])(a, b))
    else:
        jax.block_until_ready(gp.spmd(toy, mesh, in_shardings=(gp.P("x", None), gp.P(None, "y")))(a, b))


_MANUAL = re.compile(r"sdy\.manual_computation\(([^)]*)\)")


def manual_operands(stablehlo: str) -> int:
    """Operands of the module's manual computations (Shardy's ``sdy.manual_computation``; 0: none).

    >>> manual_operands('%0 = sdy.manual_computation(%arg0, %arg1) in_shardings=[...]')
    2
    """
    return sum(len([x for x in m.split(",") if x.strip()]) for m in _MANUAL.findall(stablehlo))


def _child(program: str, who: str, mode: str) -> dict:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    import gspmd_py as gp

    mesh = gp.Mesh((2, 4), ("x", "y"))
    if mode == "warm":
        _warm_up(who, mesh)
    fn, args, specs, jspecs = _program(program)
    cpu, wall = time.process_time, time.perf_counter
    out: dict[str, float] = {}
    c0, w0 = cpu(), wall()
    if who == "jit":
        lowered = _jit(fn, mesh, jspecs, args).trace(*args).lower()
        out["plan"] = float("nan")
        text = lowered.as_text()
    else:
        plan = gp.spmd(fn, mesh, in_shardings=specs).plan(*args)
        out["plan"] = cpu() - c0
        lowered = plan.lower()
        text = lowered.as_text()
    c1 = cpu()
    out["front"] = c1 - c0
    compiled = lowered.compile()
    c2 = cpu()
    out["compile"] = c2 - c1
    jax.block_until_ready(compiled(*args))
    out["run"] = cpu() - c2
    out["total"] = cpu() - c0
    out["wall"] = wall() - w0
    hlo = compiled.as_text()
    out["module_bytes"] = len(text)
    out["manual_operands"] = manual_operands(text)
    out["hlo_instructions"] = sum(1 for ln in hlo.splitlines() if " = " in ln)
    return out


def _sample(program: str, who: str, mode: str, cwd: str) -> dict:
    env = dict(os.environ, PYTHONPATH=cwd)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", program, who, mode],
                       cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{program}/{who}/{mode} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _fmt(v: float) -> str:
    return "-" if v != v else f"{v:.3f} s"


def run(programs: list[str], modes: list[str], reps: int, base: str | None, log=print) -> str:
    sides = [("ours", REPO), ("jit", REPO)] + ([("ours before", os.path.abspath(base))] if base else [])
    lines = ["| program | mode | side | front (plan + lower / trace + lower) | of which plan | XLA compile | "
             "first run | first call, CPU | first call, wall | ratio to jax.jit: front / compile / call (CPU) | "
             "StableHLO bytes | manual-region operands | optimized HLO instructions |",
             "|" + "---|" * 13]
    for program in programs:
        for mode in modes:
            got: dict[str, list[dict]] = {s: [] for s, _ in sides}
            for r in range(reps):
                for who, cwd in (sides if r % 2 == 0 else sides[::-1]):
                    got[who].append(_sample(program, who.split()[0], mode, cwd))
                    log(f"  {program} {mode} {who}: {got[who][-1]}")
            med = {w: {k: statistics.median(s[k] for s in v) for k in v[0]} for w, v in got.items()}
            j = med["jit"]
            for who, _ in sides:
                m = med[who]
                lines.append(
                    f"| {program} | {mode} | {who} | {_fmt(m['front'])} | {_fmt(m['plan'])} | {_fmt(m['compile'])} | "
                    f"{_fmt(m['run'])} | {_fmt(m['total'])} | {_fmt(m['wall'])} | "
                    f"{m['front'] / j['front']:.2f}x / {m['compile'] / j['compile']:.2f}x / {m['total'] / j['total']:.2f}x | "
                    f"{int(m['module_bytes']):,} | {int(m['manual_operands'])} | {int(m['hlo_instructions']):,} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_call", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=3, metavar=("PROGRAM", "WHO", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--programs", default="blocks96,uneven")
    ap.add_argument("--modes", default="warm,cold")
    ap.add_argument("--base", default=None, help="another checkout of gspmd_py, measured as 'ours before'")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "first_call.md"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    load = os.getloadavg()[0]
    table = run([p for p in args.programs.split(",") if p], [m for m in args.modes.split(",") if m], args.reps,
                args.base)
    print(table)
    sys.path.append(HERE)
    from machine import describe  # noqa: E402  (runs as a script or as a module alike)

    with open(args.out, "w") as fh:
        fh.write(f"# First calls in fresh processes, phase by phase (medians of {args.reps} interleaved samples)\n\n"
                 f"{describe()}; load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end. "
                 "Times are process CPU seconds (XLA's compile threads included) unless the column says wall. "
                 "`warm`: each side ran a throwaway program of its own first (a user's second model); `cold`: "
                 "the first thing the process runs (imports not timed). See `notes-2026-11-28-first-call.md`.\n\n"
                 + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
