"""``python -m benchmarks [--quick] [--only calls,cold,size,devices,profile,index,auto,...] [--out DIR]``

Runs gspmd_py against ``jax.jit`` with the same shardings and writes
``benchmarks/results/*.md`` (+ PNG plots when matplotlib is installed: ``.[bench]``):

* ``calls``: per-call time (numpy / placed inputs), first call, collectives, per program
* ``cold``: first call in a fresh process (subprocesses)
* ``size``: plan time against program size (1, 8, 32, 96 unrolled transformer blocks)
* ``devices``: plan time against device count (abstract meshes, 8 to 8,192 devices)
* ``profile``: cProfile of planning the largest program
* ``index``: index math, the NumPy definitions vs the Numba kernels they replaced (uncompiled,
  cold, warm), crossovers, plan time at 8,192-65,536 devices with either
* ``loops``: a scanned stack vs the same layers unrolled (collectives per iteration, per call);
  gp.pipeline vs data parallelism, predicted on a GPU preset
* ``auto``: gp.auto_shard's plan against hand-written ones (predicted, measured), DenseLm on TPU v3
* ``zoo``: gp.auto_shard on the held-out model zoo (benchmarks/zoo.py: GPT-2, T5, ViT, MoE, U-Net,
  wide MLP under a memory limit, DLRM, scanned stack) on (2, 4) and (8,), against every hand plan
  an expert writes, measured interleaved (``auto_zoo.md``; ``--quick``: 4 models, 7 samples)
* ``hw``: collectives shaped for the hardware: predicted gains on GPU/TPU presets, the
  DenseLm layer, mesh placements ranked, measured on 8 CPU devices (``hw.md``)
* ``cost``: the cost model's predicted vs measured step times of 15 shardings, Spearman and
  median error (``cost_validation.md``; also ``python benchmarks/cost_validation.py``)
* ``denselm``: the GSPMD paper's DenseLm128B costed on 128-2,048 TPU v3 cores
  (``cost_denselm.md``; also ``python benchmarks/cost_denselm.py``)
* ``ops``: op by op, every op family of the rule registry on the (2, 4) and (8,) meshes, its
  first argument replicated, batch-sharded, sharded on each other dim, uneven: collectives, XLA's
  cost analysis and HLO counts of both compiled programs, per-call ratio where a call takes
  1 ms or more, flagged rows with their HLO diff (``ops.md``; benchmarks/ops.py)
* ``modelgen``: ``--n`` models drawn from ``--seed`` (benchmarks/modelgen.py) on (2, 4) and (8,):
  gp.auto_shard against every hand plan, gp.spmd against jax.jit per call with the same
  shardings, interleaved, with both optimized HLOs' collectives (``modelgen.md``;
  benchmarks/modelgen_run.py; ``--quick``: fewer samples)

``python -m benchmarks.gpu_check [--tiny]``: the demo, the reference programs and zoo models on
this process's devices (a GPU: 1-device meshes), gp.spmd vs jax.jit (``gpu_check.md``).

Every section writes its own file in ``benchmarks/results/``; the README quotes them.

``--quick`` uses smaller inputs, fewer repeats and stops the size sweep at 32 blocks.
Targets (issue 9) are printed next to the numbers; nothing here asserts them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

SECTIONS = ("calls", "cold", "size", "devices", "profile", "index", "auto", "zoo", "loops", "hw", "cost", "denselm", "ops", "modelgen")


def _machine() -> str:
    import gspmd_py  # noqa: F401

    from .machine import describe

    return describe()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small inputs, few repeats, sizes up to 32 blocks")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}")
    ap.add_argument("--programs", default="", help="comma-separated program names (default: all)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--n", type=int, default=30, help="modelgen: how many generated models (each on both meshes)")
    ap.add_argument("--seed", type=int, default=0, help="modelgen: the first model's seed")
    args = ap.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = sorted(set(only) - set(SECTIONS))
    if bad:
        ap.error(f"unknown sections {bad}; choose from {SECTIONS}")
    os.makedirs(args.out, exist_ok=True)

    from . import calls, report, scaling
    from .programs import programs

    q = args.quick
    names = [n for n in args.programs.split(",") if n] or list(programs())
    header = f"# gspmd_py vs jax.jit{' (--quick)' if q else ''}\n\n{_machine()}\n\n"
    files: dict[str, str] = {}
    call_results, size_rows, device_rows = None, None, None
    t_start = time.perf_counter()

    if "calls" in only or "cold" in only:
        call_results = []
        if "calls" in only:
            for n in names:
                r = calls.run_program(programs()[n], q, repeats=7 if q else 21, first_repeats=3 if q else 7)
                print(f"  {n}: numpy {r.numpy_ours / r.numpy_jit:.2f}x, placed {r.placed_ours / r.placed_jit:.2f}x, "
                      f"first {r.first_ours / r.first_jit:.2f}x", flush=True)
                call_results.append(r)
        cold = calls.cold_first_calls(names, q, repeats=1 if q else 3) if "cold" in only else {}
        text = header + "## Per program: gspmd_py / jax.jit with the same shardings\n\n"
        text += ("Median of interleaved repeats after warm-up. Targets: per call <= 1.0x (never above 1.05x) with "
                 "numpy inputs, <= 1.0x with placed inputs; first call <= 1.2x.\n\n")
        if call_results:
            text += report.calls_table(call_results, cold) + "\n" + report.calls_detail(call_results)
        elif cold:
            text += report.md_table(["program", "first call, fresh process (ours / jit)"],
                                    [[n, f"{c['ours']:.3f} s / {c['jit']:.3f} s"] for n, c in cold.items()])
        files["calls.md"] = text

    if "size" in only:
        sizes = scaling.QUICK_SIZES if q else scaling.SIZES
        size_rows = scaling.plan_vs_size(sizes, repeats={1: 5, 8: 3, 32: 2, 96: 1} if not q else {1: 3},
                                         compile_up_to=8 if q else 96)
        files["plan_vs_size.md"] = (header + "## Plan time against program size\n\n"
                                    "Unrolled transformer blocks, (2, 4) mesh. Targets: 96 blocks planned in <= 0.4 s "
                                    "(150 us per eqn), flat per eqn, 10,000 eqns in < 2 s.\n\n"
                                    + report.size_table(size_rows))
        for r in size_rows:
            print(f"  {r.blocks} blocks: {r.eqns} eqns, plan {r.plan_s:.3f} s ({r.us_per_eqn:.0f} us/eqn)", flush=True)

    if "devices" in only:
        meshes = scaling.MESHES[::] if not q else scaling.MESHES[::5]
        device_rows = scaling.plan_vs_devices(meshes, repeats=2 if q else 7)
        files["plan_vs_devices.md"] = (header + "## Plan time against device count\n\n"
                                       "Abstract meshes. Target: plan at 8,192 devices <= 1.2x plan at 8.\n\n"
                                       + report.devices_table(device_rows))
        for r in device_rows:
            print(f"  {r.program} {r.mesh}: plan {r.plan_s:.3f} s", flush=True)

    if "profile" in only:
        blocks = 32 if q else 96
        text = scaling.profile_plan(blocks)
        files[f"profile_plan_{blocks}_blocks.txt"] = text
        print(text[:3000])

    if "index" in only:
        from . import index_math

        text = index_math.run(q)
        files["index_math.md"] = header + text

    if "loops" in only:
        from . import loops

        files["loops.md"] = header + loops.run(q)

    if "auto" in only:
        from . import auto

        files["auto.md"] = header + auto.run(q)

    if "zoo" in only:
        from . import zoo

        files["auto_zoo.md"] = header + zoo.run(q)

    if "hw" in only:
        from . import hardware

        files["hw.md"] = header + hardware.run(q)

    if "cost" in only:
        from . import cost_validation

        files["cost_validation.md"] = header + cost_validation.run(q)

    if "denselm" in only:
        from . import cost_denselm

        files["cost_denselm.md"] = header + cost_denselm.run(q)

    if "ops" in only:
        from . import ops

        files["ops.md"] = header + ops.run(q)

    if "modelgen" in only:
        from . import modelgen_run
        from .machine import write

        files["modelgen.md"] = modelgen_run.run(args.n, args.seed, q, header=header,
                                                write=lambda text: write("modelgen.md", text, args.out))

    for name, text in files.items():
        with open(os.path.join(args.out, name), "w") as fh:
            fh.write(text)
    if not args.no_plots:
        written = report.plots(args.out, call_results, size_rows, device_rows)
        if not written and (call_results or size_rows or device_rows):
            print("(matplotlib not installed: no plots; pip install -e .[bench])")
    for name in files:
        if name.endswith(".md"):
            print()
            print(open(os.path.join(args.out, name)).read())
    print(f"wrote {', '.join(sorted(files))} to {args.out} in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
