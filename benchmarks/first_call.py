"""First calls in fresh processes: gspmd_py against jax.jit (issue 27, item 3).

Each sample is one fresh Python process that builds the function and makes its first call
(plan or trace, lower, XLA compile, transfer, run, wait), with numpy inputs; the programs:

* ``blocks96``: 96 unrolled transformer blocks (benchmarks/scaling.py's size sweep, 770
  inputs), data parallel on x, Megatron on y of a (2, 4) mesh;
* ``uneven``: one transformer block whose batch (7 over x) and heads (6 over y) do not
  divide: gspmd_py pads at the boundary, jax.jit gets the nearest even shardings.

Samples are interleaved (ours, jit, [ours from ``--base DIR``], ours, jit...) so the load of
a shared machine hits every side alike; the medians go to ``benchmarks/results/first_call.md``
(wall and CPU time: CPU time of the process is less disturbed by other users' jobs)::

    python -m benchmarks.first_call [--reps 5] [--programs blocks96,uneven] [--base /path/to/old/checkout]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _child(program: str, who: str) -> dict:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    import gspmd_py as gp

    mesh = gp.Mesh((2, 4), ("x", "y"))
    sizes = {"x": 2, "y": 4}
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
    c0, t0 = time.process_time(), time.perf_counter()
    if who == "jit":
        jm = jax.sharding.Mesh(mesh.jax_devices(), ("x", "y"))

        def even(spec, shape):  # jax.jit refuses uneven shardings: the axes that divide
            spec = tuple(spec) + (None,) * (len(shape) - len(spec))
            return PartitionSpec(*[e if e is None or n % sizes[e] == 0 else None for e, n in zip(spec, shape)])

        f = jax.jit(fn, in_shardings=tuple(NamedSharding(jm, PartitionSpec() if s is None else even(s, a.shape))
                                           for s, a in zip(jspecs, args)))
    else:
        f = gp.spmd(fn, mesh, in_shardings=specs)
    jax.block_until_ready(f(*args))
    first_wall, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    t1 = time.perf_counter()
    jax.block_until_ready(f(*args))
    return {"wall": first_wall, "cpu": first_cpu, "later": time.perf_counter() - t1}


def _sample(program: str, who: str, cwd: str) -> dict:
    env = dict(os.environ, PYTHONPATH=cwd)
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", program, who],
                       cwd=cwd, env=env, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{program}/{who} failed:\n{p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(programs: list[str], reps: int, base: str | None) -> str:
    sides = [("ours", REPO), ("jit", REPO)] + ([("ours before", os.path.abspath(base))] if base else [])
    lines = ["| program | side | first call, wall | first call, CPU | ratio to jax.jit (wall / CPU) | later call |",
             "|---|---|---|---|---|---|"]
    for program in programs:
        got: dict[str, list[dict]] = {s: [] for s, _ in sides}
        for r in range(reps):
            for who, cwd in (sides if r % 2 == 0 else sides[::-1]):
                got[who].append(_sample(program, who.split()[0], cwd))
                print(f"  {program} {who}: {got[who][-1]}", flush=True)
        med = {w: {k: statistics.median(s[k] for s in v) for k in ("wall", "cpu", "later")} for w, v in got.items()}
        for who, _ in sides:
            m, j = med[who], med["jit"]
            lines.append(f"| {program} | {who} | {m['wall']:.3f} s | {m['cpu']:.3f} s | "
                         f"{m['wall'] / j['wall']:.2f}x / {m['cpu'] / j['cpu']:.2f}x | {m['later'] * 1e3:.1f} ms |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.first_call", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs=2, metavar=("PROGRAM", "WHO"), help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--programs", default="blocks96,uneven")
    ap.add_argument("--base", default=None, help="another checkout of gspmd_py, measured as 'ours before'")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "first_call.md"))
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(_child(*args.child)))
        return 0
    load = os.getloadavg()[0]
    table = run([p for p in args.programs.split(",") if p], args.reps, args.base)
    print(table)
    sys.path.append(HERE)
    from machine import describe  # noqa: E402  (runs as a script or as a module alike)

    with open(args.out, "w") as fh:
        fh.write(f"# First calls in fresh processes (medians of {args.reps} interleaved samples)\n\n{describe()}; "
                 f"load average {load:.1f} at the start.\n\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
