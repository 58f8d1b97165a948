"""``python benchmarks/conv_rates.py [ROUNDS]``: benchmarks/programs.py conv_net on (2, 4), data parallel vs
spatial plans, measured (interleaved with the calibration probes) vs predicted with one conv
efficiency (no per-shape-class rates) and with them (gspmd_py/cost/rates.py)."""
import os
import sys
import time
import warnings

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attrs  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

import gspmd_py as gp  # noqa: E402
from benchmarks.programs import gp_constrain, programs  # noqa: E402
from gspmd_py.cost.calibrate import Calibrator  # noqa: E402

warnings.simplefilter("ignore")
P = gp.P
prog = programs()["conv_net"]
mesh = gp.Mesh((2, 4), ("x", "y"))
args = prog.args(quick=False)
plain = prog.make(lambda x, s: x)
plans = {
    "data parallel (x,y)": gp.spmd(plain, mesh, in_shardings=(P(("x", "y")), None, None, None)),
    "spatial (batch x, H y) [own]": gp.spmd(prog.make(gp_constrain), mesh, in_shardings=prog.in_specs, out_shardings=prog.out_specs),
    "spatial (H x, W y)": gp.spmd(plain, mesh, in_shardings=(P(None, "x", "y"), None, None, None)),
    "spatial (H x,y)": gp.spmd(plain, mesh, in_shardings=(P(None, ("x", "y")), None, None, None)),
    "replicated": gp.spmd(plain, mesh, in_shardings=(None,) * 4),
}
runs = []
for name, f in plans.items():
    plan = f.plan(*args)
    exe = plan.lower().compile().compiled; placed = plan.place(args); jax.block_until_ready(exe(*placed))
    runs.append((name, plan, exe, placed, []))
cal = Calibrator(mesh); cal.sample(); [p.times.clear() for p in cal.probes]
R = int(sys.argv[1]) if len(sys.argv) > 1 else 9
for r in range(R):
    cal.sample()
    for k in range(len(runs)):
        name, plan, exe, placed, times = runs[(k + r) % len(runs)]
        t0 = time.perf_counter(); jax.block_until_ready(exe(*placed)); times.append(time.perf_counter() - t0)
new = gp.Hardware.from_measured(cal.fit("host"))
old = attrs.evolve(new, matmul_classes=(), conv_classes=(), reduce_bandwidth=0.0)
print("conv classes", [(c, round(e, 2)) for c, e in new.conv_classes], "one efficiency (old):", round(old.conv_efficiency, 2))
m = {n: float(np.median(t)) for n, _, _, _, t in runs}
po = {n: p.cost(old).step_s for n, p, *_ in runs}
pn = {n: p.cost(new).step_s for n, p, *_ in runs}
for n in m:
    print(f"{n:30s} measured {m[n]*1e3:7.1f} ms   predicted one-constant {po[n]*1e3:7.1f}   per-class {pn[n]*1e3:7.1f}")
print("measured order :", sorted(m, key=m.get))
print("one-constant   :", sorted(po, key=po.get))
print("per-class      :", sorted(pn, key=pn.get))
